//! The soak and chaos driver: churn across a 3-node fleet behind 2 gateway replicas with e2b
//! and Kubernetes clients mixed, then a fault matrix (a gateway or a node killed mid-operation,
//! a node restarted with state). Loopback only, bounded in count and time. Its figures go into
//! RELIABILITY.md between the `soak` markers (the rest of the file is left alone) by
//! `tests/reliability.sh soak`, which builds the release binaries, runs
//! `target/release/examples/soak --cycles 10000 --concurrency 32` and splices the section it
//! prints into the file only if the run passed. `--out FILE` writes the section into FILE
//! itself, also when the run failed. `--replica-1-arg ARG` (repeatable) starts the second
//! gateway replica with ARG as well, so that one run measures a setting against the default
//! side by side (e.g. `--replica-1-arg --stalled-client-seconds=0`).
//!
//! `tests/soak.rs` runs a short variant (a few hundred cycles, then the whole fault matrix) in CI.

#[allow(dead_code)]
#[path = "../bench/common.rs"]
mod common;
#[allow(dead_code)]
#[path = "../bench/envd.rs"]
mod envd;

mod churn;
mod faults;
mod fleet;
mod midway;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use common::{Res, ms};

/// Any key: the gateways run with `--allow-anonymous`.
pub const KEY: &str = "e2b_soak";

/// A created e2b sandbox: id, envdAccessToken, node.
pub struct Created(pub String, pub String, pub String);

pub async fn create_e2b(http: &reqwest::Client, url: &str) -> Res<Created> {
    create_tagged(http, url, "fault").await
}

/// Creates an e2b sandbox whose metadata names what made it (`soak: tag`), so that one left
/// behind can be traced to its cycle.
pub async fn create_tagged(http: &reqwest::Client, url: &str, tag: &str) -> Res<Created> {
    let res = http
        .post(format!("{url}/v2/sandboxes"))
        .header("X-API-KEY", KEY)
        .json(&serde_json::json!({"templateID": "base", "timeout": 600, "metadata": {"soak": tag}}))
        .send()
        .await?;
    let status = res.status();
    let body: serde_json::Value = res.json().await.unwrap_or_default();
    if status != 201 {
        return Err(format!("create answered {status}: {}", body["message"]).into());
    }
    let field = |k: &str| body[k].as_str().unwrap_or_default().to_string();
    Ok(Created(
        field("sandboxID"),
        field("envdAccessToken"),
        field("clientID"),
    ))
}

const BEGIN: &str = "<!-- soak:begin -->";
const END: &str = "<!-- soak:end -->";

fn render(command: &str, run: &churn::ChurnRun, cases: &[faults::Case]) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{BEGIN}\n## Churn and faults\n");
    let _ = writeln!(
        o,
        "Measured {} on {} with `{command}`: {} nodes (`base/egress` warm pools of {}) behind {} gateway replicas, all on loopback. Each cycle alternates the replicas; pairs of cycles alternate the surfaces: an e2b cycle creates a sandbox, runs `echo N` through the gateway's data plane and checks the output, then kills it; a Kubernetes cycle creates a Sandbox object, reads it and deletes it. Memory is sampled every 0.5 s; a slope is a least-squares fit of RSS against cycles done, over the run's second half, and for a gateway also over the part of the run in which its read view already held its full window of {} changes (each change keeps its sandbox's record for resuming watches, so a gateway grows until then; its revision, read from a list every 0.5 s, counts the changes).\n",
        chrono::Utc::now().format("%Y-%m-%d"),
        common::machine(),
        fleet::NODES,
        fleet::POOL,
        fleet::GATEWAYS,
        sandbox_gateway::dispatch::read_view::HISTORY,
    );
    let failed: usize = run.errors.values().sum();
    let _ = writeln!(
        o,
        "### Churn\n\n| | |\n|---|---|\n| cycles | {} at concurrency {} in {:.1} s ({:.0} per second) |\n| failed cycles | {failed}{} |\n| cycle latency | p50 {} · p90 {} · p99 {} · max {} |",
        run.cycles,
        run.concurrency,
        run.took.as_secs_f64(),
        run.cycles as f64 / run.took.as_secs_f64().max(1e-9),
        if failed == 0 {
            String::new()
        } else {
            format!(" ({:?})", run.errors)
        },
        ms(run.latency.p50),
        ms(run.latency.p90),
        ms(run.latency.p99),
        ms(run.latency.max),
    );
    if let Some(why) = &run.unsettled {
        let _ = writeln!(o, "| after the churn | {} |", why.replace('|', "/"));
    }
    for (cycle, e) in &run.failures {
        let _ = writeln!(
            o,
            "| failure in cycle {cycle} | {} |",
            e.replace('|', "/").replace('\n', " ")
        );
    }
    let (b, a) = (run.before, run.after);
    let _ = writeln!(
        o,
        "| left behind (after − before) | instance directories {:+}, sandbox processes {:+}, mounts {:+}, loop devices {:+}, checkpoints {:+}, fleet file descriptors {:+} (not counting the fleet's ends of the driver's own keep-alive connections: {} before, {} after) |\n",
        a.instance_dirs as i64 - b.instance_dirs as i64,
        a.sandbox_processes as i64 - b.sandbox_processes as i64,
        a.mounts as i64 - b.mounts as i64,
        a.loop_devices as i64 - b.loop_devices as i64,
        a.checkpoints as i64 - b.checkpoints as i64,
        a.own_fds() - b.own_fds(),
        b.driver_connections,
        a.driver_connections,
    );
    let _ = writeln!(
        o,
        "| process | RSS before | RSS after | slope (second half) | slope once the view's change window is full |\n|---|---|---|---|---|"
    );
    for (i, (label, before, after, slope)) in run.memory.iter().enumerate() {
        let windowed = match run.windowed.get(i) {
            Some(Some((from, s))) => format!("{s:+.1} KiB per 1000 cycles (from cycle {from})"),
            Some(None) => "not reached in this run".to_string(),
            None => "—".to_string(),
        };
        let _ = writeln!(
            o,
            "| {label} | {:.1} MiB | {:.1} MiB | {slope:+.1} KiB per 1000 cycles | {windowed} |",
            *before as f64 / 1024.0,
            *after as f64 / 1024.0
        );
    }
    if !cases.is_empty() {
        let _ = writeln!(
            o,
            "\n### Fault matrix\n\n| fault | what the client saw | what was lost | left behind |\n|---|---|---|---|"
        );
        for c in cases {
            let _ = writeln!(o, "| {} | {} | {} | {} |", c.name, c.saw, c.lost, c.left);
        }
        let _ = writeln!(
            o,
            "\nA call whose connection to a node broke is 504 (`idempotency_outcome_unknown`, not to be replayed blindly) while the node still runs (a stalled node, a lost answer); when the node's port then refuses or resets a new connection, its process is gone with whatever it did, so a create goes to another node and other calls answer 503. Data-plane requests whose tunnel broke answer 502. A full data directory and kube-apiserver unavailable in cluster mode have their own tests (see below)."
        );
    }
    let _ = writeln!(o, "{END}");
    o
}

/// `text` with its soak section replaced by `section` (appended when there is none).
fn splice(text: &str, section: &str) -> String {
    match (text.find(BEGIN), text.find(END)) {
        (Some(b), Some(e)) if e > b => {
            format!(
                "{}{}{}",
                &text[..b],
                section.trim_end(),
                &text[e + END.len()..]
            )
        }
        _ => format!("{}\n\n{section}", text.trim_end()),
    }
}

fn main() -> Res<()> {
    let mut cycles = 10_000usize;
    let mut concurrency = 32usize;
    let mut out: Option<PathBuf> = None;
    let mut with_faults = true;
    let mut replica_1_args = Vec::new();
    let mut command = vec!["cargo run --release --example soak --".to_string()];
    command.extend(std::env::args().skip(1));
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut number = |what: &str| -> Res<usize> {
            let v = args.next().ok_or(format!("{what} needs a number"))?;
            v.parse()
                .map_err(|_| format!("{what} {v:?} is not a number").into())
        };
        match a.as_str() {
            "--cycles" => cycles = number("--cycles")?,
            "--concurrency" => concurrency = number("--concurrency")?.max(1),
            "--no-faults" => with_faults = false,
            "--replica-1-arg" => {
                replica_1_args.push(args.next().ok_or("--replica-1-arg needs a value")?)
            }
            "--out" => out = Some(PathBuf::from(args.next().ok_or("--out needs a file")?)),
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let fleet = Arc::new(fleet::Fleet::start(replica_1_args).await?);
        eprintln!("churn: {cycles} cycles at concurrency {concurrency}");
        let run = churn::churn(fleet.clone(), cycles, concurrency).await?;
        let mut fleet = Arc::try_unwrap(fleet).map_err(|_| "the fleet is still shared")?;
        // A fleet that did not settle is reported as it is; faults on top would blur it.
        let cases = if with_faults && run.unsettled.is_none() {
            eprintln!("fault matrix");
            faults::faults(&mut fleet).await?
        } else {
            Vec::new()
        };
        let section = render(&command.join(" "), &run, &cases);
        let failed: usize = run.errors.values().sum();
        // Descriptors are judged without the driver's own connections, whose pools grow with
        // the concurrency and close with the driver.
        let (b, a) = (run.before, run.after);
        let leaked = (
            a.instance_dirs,
            a.sandbox_processes,
            a.mounts,
            a.loop_devices,
            a.checkpoints,
            a.own_fds(),
        ) != (
            b.instance_dirs,
            b.sandbox_processes,
            b.mounts,
            b.loop_devices,
            b.checkpoints,
            b.own_fds(),
        );
        match &out {
            Some(p) => {
                let text = std::fs::read_to_string(p).unwrap_or_default();
                std::fs::write(p, splice(&text, &section))?;
            }
            None => print!("{section}"),
        }
        if failed > 0 || leaked || run.unsettled.is_some() {
            return Err(format!(
                "{failed} failed cycles ({:?}); {}footprint before {:?}, after {:?}",
                run.errors,
                run.unsettled
                    .as_ref()
                    .map(|u| format!("{u}; "))
                    .unwrap_or_default(),
                run.before,
                run.after
            )
            .into());
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_replaces_its_predecessor_and_nothing_else() {
        let old = format!("# R\n\nfuzz\n\n{BEGIN}\nold\n{END}\n\ntail\n");
        let new = splice(&old, &format!("{BEGIN}\nnew\n{END}\n"));
        assert_eq!(new, format!("# R\n\nfuzz\n\n{BEGIN}\nnew\n{END}\n\ntail\n"));
        let appended = splice("# R\n", &format!("{BEGIN}\nx\n{END}\n"));
        assert!(appended.starts_with("# R\n\n") && appended.contains("x"));
    }
}
