//! What the sandbox boundary costs: lifecycle verbs against the size of a sandbox's writable
//! layer (data written inside, through envd), memory of idle sandboxes (every process of each
//! sandbox), and cold start with the boundary against the agent alone.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_gateway::dispatch::client::NodeConn;
use sandbox_gateway::dispatch::{ClaimRequest, Dispatcher, DispatcherConfig};
use sandbox_gateway::model::{PoolKey, ids};
use sandbox_gateway::proto;

use crate::claims::ClaimBench;
use crate::common::*;
use crate::envd::{Envd, Via, check};

pub struct VerbCosts {
    pub mib: u64,
    pub pause: Duration,
    pub resume: Duration,
    pub snapshot: Duration,
    pub fork: Duration,
    /// What the last checkpoint captured (the disk image's allocated bytes).
    pub captured: u64,
    /// The sandbox's disk use as the node measured it.
    pub disk_used: u64,
}

/// Median of `runs` pause, resume, snapshot and fork calls through the dispatcher on a
/// sandbox that wrote `mib` MiB inside (through envd, over the node's data plane), per size.
pub async fn bench_verbs(sizes: &[u64], runs: usize) -> Res<Vec<VerbCosts>> {
    let token = ids::random_hex(16);
    let node = Daemon::named_node(&token, "verbs", 4, &[])?;
    let d = Dispatcher::new(DispatcherConfig::default(), &token);
    d.add_node(&node.address)?;
    d.wait_for_nodes(1, Duration::from_secs(30)).await?;
    let mut out = Vec::new();
    for &mib in sizes {
        let sb = d
            .claim(ClaimRequest {
                namespace: "bench".into(),
                name: format!("verbs-{mib}"),
                key: PoolKey::base(),
                ttl_seconds: 3600,
                metadata: Default::default(),
                env_vars: Default::default(),
                lifecycle: Default::default(),
                network: Default::default(),
                volume_mounts: Vec::new(),
            })
            .await?
            .record;
        {
            // Data that does not compress or dedupe away, written and flushed inside.
            let mut envd = Envd::new(Via::Node {
                data: sb.address.clone(),
                id: sb.id.clone(),
                token: sb.token.clone(),
            });
            let write = if mib == 0 {
                "sync".to_string()
            } else {
                format!(
                    "head -c {} /dev/urandom > /home/user/data.bin && sync",
                    mib << 20
                )
            };
            check(&mut envd, &write).await?;
        }
        let disk_used = d.stats(None, &sb.id).await?.disk_used_bytes;
        let (mut pause, mut resume, mut snapshot, mut fork) = (vec![], vec![], vec![], vec![]);
        let mut captured = 0;
        for _ in 0..runs {
            let t = Instant::now();
            d.set_paused(None, &sb.id, true).await?;
            pause.push(t.elapsed());
            let t = Instant::now();
            d.set_paused(None, &sb.id, false).await?;
            resume.push(t.elapsed());
            let t = Instant::now();
            let ck = d.create_checkpoint(None, &sb.id, "", false).await?;
            snapshot.push(t.elapsed());
            captured = ck.size_bytes;
            d.delete_checkpoint(&ck.id, "").await?;
            let t = Instant::now();
            let kids = d.fork(None, &sb.id, 1, 600).await?;
            fork.push(t.elapsed());
            for k in kids {
                // Released once it serves, so that no release races the child's /init.
                Envd::new(Via::Node {
                    data: k.address.clone(),
                    id: k.id.clone(),
                    token: k.token.clone(),
                })
                .health()
                .await?;
                d.release(None, &k.id).await?;
            }
        }
        d.release(None, &sb.id).await?;
        out.push(VerbCosts {
            mib,
            pause: median(pause),
            resume: median(resume),
            snapshot: median(snapshot),
            fork: median(fork),
            captured,
            disk_used,
        });
    }
    d.shutdown().await;
    node.stop();
    Ok(out)
}

/// Average memory of one idle sandbox of one net, by process role.
pub struct IdleNet {
    pub net: String,
    pub sandboxes: usize,
    pub processes: usize,
    /// Per sandbox: (role, RSS, PSS).
    pub roles: Vec<(Role, u64, u64)>,
    pub rss: u64,
    pub pss: u64,
}

pub struct IdleMemory {
    pub per_pool: u32,
    pub nets: Vec<IdleNet>,
}

impl IdleMemory {
    pub fn net(&self, net: &str) -> Option<&IdleNet> {
        self.nets.iter().find(|n| n.net == net)
    }
}

/// Memory of `n` idle warm sandboxes of each net, from /proc: every process of each sandbox
/// (supervisor, init, agent, and slirp4netns for egress), resident set size and proportional
/// set size (shared pages, such as the binary's, split among sharers).
pub async fn bench_idle_memory(n: u32) -> Res<IdleMemory> {
    let token = ids::random_hex(16);
    let node = Daemon::node_with(&NodeSpec {
        token: &token,
        name: "idle",
        pools: &[format!("base={n}"), format!("base/egress={n}")],
        extra: &[],
    })?;
    let conn = NodeConn::new(&node.address, &token)?;
    wait_pool(&conn, &PoolKey::base(), n).await?;
    wait_pool(&conn, &egress(), n).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = sandbox_processes(&node.dir.path().join("node/sandboxes"));
    let mut by_net: BTreeMap<String, Vec<&SandboxProcs>> = BTreeMap::new();
    for sb in all.values() {
        by_net.entry(sb.net.clone()).or_default().push(sb);
    }
    let mut nets = Vec::new();
    for (net, boxes) in by_net {
        let count = boxes.len().max(1) as u64;
        let mut roles: BTreeMap<Role, (u64, u64)> = BTreeMap::new();
        let mut processes = 0;
        for sb in &boxes {
            for (role, pid) in &sb.procs {
                let (rss, pss) = rss_pss(*pid);
                let e = roles.entry(*role).or_default();
                e.0 += rss;
                e.1 += pss;
                processes += 1;
            }
        }
        let roles: Vec<(Role, u64, u64)> = roles
            .into_iter()
            .map(|(r, (rss, pss))| (r, rss / count, pss / count))
            .collect();
        nets.push(IdleNet {
            net,
            sandboxes: boxes.len(),
            processes,
            rss: roles.iter().map(|r| r.1).sum(),
            pss: roles.iter().map(|r| r.2).sum(),
            roles,
        });
    }
    node.stop();
    Ok(IdleMemory { per_pool: n, nets })
}

pub struct ColdStart {
    /// Claim answered, and envd answering through the node's data plane, for net none.
    pub none: Summary,
    pub none_serving: Summary,
    pub egress: Summary,
    pub egress_serving: Summary,
    /// Spawn to `ready`, and to the first `/health` answered.
    pub agent: Summary,
    pub agent_serving: Summary,
}

/// Cold starts: `Claim` on a node whose pools are empty (it boots the sandbox on the claim
/// path and answers once the agent inside reports ready), for both nets, then the first
/// `/health` through the node's data plane (which waits for the agent to take the sandbox's
/// identity); and the agent alone, `sandbox-gateway agent --listen`, from spawn to its `ready`
/// line and to its first `/health` answer.
pub async fn bench_cold_start(samples: usize) -> Res<ColdStart> {
    let token = ids::random_hex(16);
    let node = Daemon::node_with(&NodeSpec {
        token: &token,
        name: "cold",
        pools: &["base=0".to_string()],
        extra: &[],
    })?;
    let conn = NodeConn::new(&node.address, &token)?;
    conn.info(Duration::from_secs(5)).await?;
    let mut t: [Vec<Duration>; 4] = Default::default();
    for i in 0..samples + 2 {
        for (k, key) in [PoolKey::base(), egress()].into_iter().enumerate() {
            let mut c = conn.client();
            let start = Instant::now();
            let reply = c
                .claim(proto::ClaimRequest {
                    key: Some((&key).into()),
                    ttl_seconds: 600,
                    claim_ref: "bench/cold".into(),
                    ..Default::default()
                })
                .await
                .context(format!("cold claim of {key}"))?
                .into_inner();
            let claimed = start.elapsed();
            if reply.warm {
                return Err("a claim on an empty pool came warm".into());
            }
            let sb = reply.sandbox.ok_or("the claim carried no sandbox")?;
            let mut envd = Envd::new(Via::Node {
                data: sb.address.clone(),
                id: sb.id.clone(),
                token: sb.token.clone(),
            });
            envd.health().await?;
            let serving = start.elapsed();
            drop(envd);
            conn.client()
                .release(proto::SandboxRef { id: sb.id })
                .await?;
            // Two warm-up rounds (page cache, blank disk images) are not counted.
            if i >= 2 {
                t[2 * k].push(claimed);
                t[2 * k + 1].push(serving);
            }
            // Let the background destroy finish before the next boot.
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }
    node.stop();
    let bin = node_binary()?;
    let (mut agent, mut agent_serving) = (Vec::new(), Vec::new());
    for i in 0..samples + 2 {
        let addr = format!("127.0.0.1:{}", free_port()?);
        let start = Instant::now();
        let mut child = Command::new(&bin)
            .args(["agent", "--listen", &addr])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting `sandbox-gateway agent`")?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let line = BufReader::new(out).lines().next().transpose();
        let ready = start.elapsed();
        let answered = match line {
            Ok(Some(l)) if l.trim() == "ready" => {
                let mut envd = Envd::new(Via::Plain {
                    addr: addr.clone(),
                    token: String::new(),
                });
                envd.health().await
            }
            other => Err(format!("the agent printed {other:?} instead of ready").into()),
        };
        let serving = start.elapsed();
        let _ = child.kill();
        let _ = child.wait();
        answered?;
        if i >= 2 {
            agent.push(ready);
            agent_serving.push(serving);
        }
    }
    let [none, none_serving, egress_t, egress_serving] = t.map(summarize);
    Ok(ColdStart {
        none,
        none_serving,
        egress: egress_t,
        egress_serving,
        agent: summarize(agent),
        agent_serving: summarize(agent_serving),
    })
}

fn mib_cell(bytes: u64) -> String {
    format!("{:.1} MiB", mib(bytes))
}

/// "Lifecycle verbs against the size of a sandbox's writable layer".
pub fn render_verbs(o: &mut String, costs: &[VerbCosts], runs: usize) {
    let _ = writeln!(
        o,
        "## Lifecycle verbs against the size of a sandbox's writable layer\n"
    );
    let _ = writeln!(
        o,
        "Method: one `sandbox-gateway node` process, one claimed `base` sandbox per row that \
         first writes the given amount inside (`head -c N /dev/urandom > /home/user/data.bin && \
         sync`, run through envd over the node's data plane, so it lands on the sandbox's own \
         ext4 disk, its writable layer); then, through the dispatcher over loopback gRPC, \
         {runs} runs of pause, resume, snapshot (checkpoint, then deleted) and fork (one child, \
         then released); the median of each. \"disk used\" is the node's measurement of the \
         sandbox's disk after the write; \"captured\" is what the checkpoint copied.\n"
    );
    let _ = writeln!(
        o,
        "| written inside | disk used | captured | pause | resume | snapshot | fork (1 child) |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|");
    for c in costs {
        let _ = writeln!(
            o,
            "| {} MiB | {} | {} | {} | {} | {} | {} |",
            c.mib,
            mib_cell(c.disk_used),
            mib_cell(c.captured),
            ms(c.pause),
            ms(c.resume),
            ms(c.snapshot),
            ms(c.fork)
        );
    }
    let _ = writeln!(
        o,
        "\nAnchors: the reference's walk-through shows pause 315 ms and resume 109 ms for a \
         microVM, whose pause writes guest memory out and whose resume maps it back. Ours are \
         not the same operation: the built-in runtime freezes and thaws the sandbox's cgroup \
         (nothing is written), so their cost is not proportional to the data, and they are not \
         comparable to a memory snapshot. Snapshot and fork freeze the sandbox, flush its disk \
         and copy the disk image (sparsely), so they grow with what was written; a fork also \
         boots the child from the copy. Neither captures process memory.\n"
    );
}

/// "Memory per idle sandbox".
pub fn render_idle(o: &mut String, idle: &IdleMemory) {
    let _ = writeln!(o, "## Memory per idle sandbox\n");
    let total: usize = idle.nets.iter().map(|n| n.sandboxes).sum();
    let _ = writeln!(
        o,
        "Method: one node with warm pools of {} `base` sandboxes of each net (`none` and \
         `egress`), two seconds after both are full; {total} sandboxes found in /proc by the \
         `--boot <instance dir>/boot.json` on their processes' command lines (the supervisor, \
         and the init and agent it forks), plus, for `egress`, the slirp4netns the supervisor \
         started (found by the supervisor's network namespace on its command line). Every \
         process of every sandbox is counted; the figures are per sandbox (sum over the \
         sandboxes of a net divided by their count). RSS counts every page a process maps, \
         including the binary's pages every sandbox shares; PSS splits shared pages among their \
         sharers, so it is what each added sandbox costs.\n",
        idle.per_pool
    );
    let _ = writeln!(o, "| net | process | RSS | PSS |");
    let _ = writeln!(o, "|---|---|---|---|");
    for n in &idle.nets {
        for (role, rss, pss) in &n.roles {
            let _ = writeln!(
                o,
                "| {} | {} | {:.1} MiB | {:.2} MiB |",
                n.net,
                role.name(),
                mib(*rss),
                mib(*pss)
            );
        }
        let _ = writeln!(
            o,
            "| {} | **whole sandbox** ({} sandboxes, {:.1} processes each) | **{:.1} MiB** | **{:.2} MiB** |",
            n.net,
            n.sandboxes,
            n.processes as f64 / n.sandboxes.max(1) as f64,
            mib(n.rss),
            mib(n.pss)
        );
    }
    let _ = writeln!(
        o,
        "\nAnchor: a microVM reserves its guest memory (512 MiB for the `small` size in the \
         reference); a sandbox here holds only what its processes use. The page cache of its \
         files and its kernel objects (namespaces, mounts, the loop device) are not in these \
         figures.\n"
    );
}

/// "Boundary cost": cold start with and without the boundary, and what the boundary costs
/// elsewhere in this run.
pub fn render_boundary(
    o: &mut String,
    cold: Option<&ColdStart>,
    claims: Option<&ClaimBench>,
    idle: Option<&IdleMemory>,
    verbs: Option<&[VerbCosts]>,
) {
    let _ = writeln!(o, "## Boundary cost\n");
    if let Some(c) = cold {
        let _ = writeln!(
            o,
            "Method, cold start: one `sandbox-gateway node` whose pools are empty; `Claim` over \
             loopback gRPC boots the sandbox on the claim path (instance directory, a sparse copy \
             of the blank disk image, cgroups, the supervisor, its namespaces, mounts and \
             slirp4netns for `egress`, the init, seccomp, the agent) and answers once the agent \
             inside printed `ready`; then the bench asks envd's `/health` through the node's data \
             plane, and releases the sandbox before the next. Side by side, the agent alone \
             without any boundary: `sandbox-gateway agent --listen 127.0.0.1:PORT`, timed from \
             spawn to its `ready` line and to its first `/health` answer over plain TCP. {} samples each, after two uncounted \
             warm-ups.\n",
            c.agent.n
        );
        let _ = writeln!(o, "| cold start | samples | p50 | p90 | p99 |");
        let _ = writeln!(o, "|---|---|---|---|---|");
        summary_row(o, "sandbox, net none: `Claim` answered", &c.none);
        summary_row(
            o,
            "sandbox, net none: first `/health` through the node",
            &c.none_serving,
        );
        summary_row(o, "sandbox, net egress: `Claim` answered", &c.egress);
        summary_row(
            o,
            "sandbox, net egress: first `/health` through the node",
            &c.egress_serving,
        );
        summary_row(o, "agent alone: spawn → `ready`", &c.agent);
        summary_row(o, "agent alone: spawn → first `/health`", &c.agent_serving);
        let r = |a: &Summary, b: &Summary| a.p50.as_secs_f64() / b.p50.as_secs_f64().max(1e-9);
        let _ = writeln!(
            o,
            "\nWith the boundary / the agent alone at p50, until ready: **{:.1}×** for net none \
             (the boundary adds {}), **{:.1}×** for egress (adds {}); until the first answer: \
             {:.1}× and {:.1}× (the sandbox's also includes the node's `/init`, which gives the \
             agent the sandbox's identity, and the tunnel).\n",
            r(&c.none, &c.agent),
            ms(c.none.p50.saturating_sub(c.agent.p50)),
            r(&c.egress, &c.agent),
            ms(c.egress.p50.saturating_sub(c.agent.p50)),
            r(&c.none_serving, &c.agent_serving),
            r(&c.egress_serving, &c.agent_serving)
        );
    }
    let _ = writeln!(
        o,
        "With the boundary in place, from this run's other sections (same binaries, same \
         machine):\n"
    );
    let _ = writeln!(o, "| figure | ours | bound |");
    let _ = writeln!(o, "|---|---|---|");
    if let Some(c) = claims {
        let _ = writeln!(
            o,
            "| warm claim p50 (a booted sandbox handed over) | {} | must stay ≤ 0.5 ms |",
            ms(c.sequential.p50)
        );
    }
    if let Some(idle) = idle {
        for n in &idle.nets {
            let _ = writeln!(
                o,
                "| memory per idle sandbox, net {} (PSS / RSS, all its processes) | {:.2} MiB / {:.1} MiB | — |",
                n.net,
                mib(n.pss),
                mib(n.rss)
            );
        }
    }
    for v in verbs.unwrap_or_default() {
        let _ = writeln!(
            o,
            "| snapshot / fork with {} MiB written inside (median) | {} / {} | — |",
            v.mib,
            ms(v.snapshot),
            ms(v.fork)
        );
    }
    let _ = writeln!(o);
}
