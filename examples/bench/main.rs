//! The benchmark driver: measures the figures in PERFORMANCE.md and writes the file.
//!
//!     cargo build --release && cargo run --release --example bench -- --out PERFORMANCE.md
//!
//! It starts real `sandbox-gateway` processes (nodes and gateways, found next to this
//! example's binary or at $SANDBOX_GATEWAY_BIN) whose sandboxes run in the built-in runtime
//! on the templates in $SANDBOX_GATEWAY_TEMPLATES_DIR (default `target/test-templates`, where
//! `base` is built if missing), drives them over loopback gRPC, HTTP and the data plane, and
//! measures the dispatcher's resolution structures in process with a counting allocator. It
//! runs as root (the built-in runtime needs it, and the direct paths into sandboxes create
//! sockets in their network namespaces).
//!
//! `--samples N` scales the sampled sections (default 2000); `--only a,b` runs some sections
//! and prints them (see `SECTIONS`).

mod boundary;
mod claims;
mod cluster;
mod commands;
mod common;
mod envd;
mod gvisor;
mod gvisor_pool;
mod interpreter;
mod kube;
mod lists;
mod template_builds;
mod transfers;

#[allow(dead_code)]
#[path = "../../tests/common/certs.rs"]
mod certs;
#[allow(dead_code)]
#[path = "../../tests/common/fake_kube.rs"]
mod fake_kube;

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Res, mib, ms};

struct Counting;
pub static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// Bytes allocated now, and the most seen since the last `reset_peak`.
static LIVE: AtomicU64 = AtomicU64::new(0);
pub static PEAK: AtomicU64 = AtomicU64::new(0);

fn grew(by: u64) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

/// Starts a peak measurement; returns the bytes live now.
pub fn reset_peak() -> u64 {
    let now = LIVE.load(Ordering::Relaxed);
    PEAK.store(now, Ordering::Relaxed);
    now
}

// SAFETY: forwards to the system allocator, only counting calls and bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        grew(layout.size() as u64);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        if new_size >= layout.size() {
            grew((new_size - layout.size()) as u64);
        } else {
            LIVE.fetch_sub((layout.size() - new_size) as u64, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The sections, in the order they run.
const SECTIONS: &[&str] = &[
    "claims",
    "e2b",
    "commands",
    "transfers",
    "streaming",
    "resolve",
    "facade",
    "lists",
    "verbs",
    "idle",
    "boundary",
    "cluster",
    "gvisor-verbs",
    "gvisor-pool",
    "interpreter",
    "template-builds",
];

const VERB_RUNS: usize = 7;

/// Everything one run measured (the sections it ran).
#[derive(Default)]
struct Run {
    claims: Option<claims::ClaimBench>,
    e2b: Option<claims::E2bBench>,
    round_trip: Option<commands::RoundTrip>,
    transfers: Option<transfers::Transfers>,
    streaming: Option<commands::Streaming>,
    resolve: Option<kube::ResolveBench>,
    facade: Option<kube::FacadeBench>,
    lists: Option<lists::ListBench>,
    verbs: Option<Vec<boundary::VerbCosts>>,
    idle: Option<boundary::IdleMemory>,
    cold: Option<boundary::ColdStart>,
    cluster: Option<cluster::ClusterBench>,
    gvisor: gvisor::GvisorRun,
    interpreter: Option<interpreter::InterpreterBench>,
    template_builds: Option<template_builds::TemplateBuildBench>,
}

const POOL: u32 = 128;
const PER_ROUND: usize = 100;

/// What the command line chose.
struct Options {
    samples: usize,
    /// Sandboxes (one streaming command each) in the fleet section.
    streaming: usize,
}

fn measure(rt: &tokio::runtime::Runtime, sections: &[&str], opts: &Options) -> Res<Run> {
    let samples = opts.samples;
    let mut run = Run::default();
    for &section in sections {
        let t = Instant::now();
        eprintln!("{section}...");
        match section {
            "claims" => {
                run.claims = Some(rt.block_on(claims::bench_node_claims(samples, POOL, PER_ROUND))?)
            }
            "e2b" => run.e2b = Some(rt.block_on(claims::bench_e2b(samples, POOL, PER_ROUND))?),
            "commands" => {
                run.round_trip = Some(rt.block_on(commands::bench_round_trip(samples.min(500)))?)
            }
            "transfers" => {
                run.transfers = Some(rt.block_on(transfers::bench_transfers(100, 5, 1024))?)
            }
            "streaming" => {
                run.streaming = Some(rt.block_on(commands::bench_streaming(opts.streaming))?)
            }
            "resolve" => {
                run.resolve = Some(rt.block_on(kube::bench_resolve(200, 2000, 1_000_000))?)
            }
            "facade" => {
                let (mut facade, fleet) = rt.block_on(kube::bench_facade_list(200, 250, 20))?;
                drop(fleet);
                rt.block_on(kube::bench_create_paths(
                    samples.min(500),
                    POOL,
                    &mut facade,
                ))?;
                run.facade = Some(facade);
            }
            "lists" => run.lists = Some(rt.block_on(lists::bench_lists(200, 250, 60))?),
            "verbs" => {
                run.verbs = Some(rt.block_on(boundary::bench_verbs(&[0, 1, 16, 128], VERB_RUNS))?)
            }
            "idle" => run.idle = Some(rt.block_on(boundary::bench_idle_memory(32))?),
            "boundary" => {
                let n = (samples / 10).clamp(10, 50);
                run.cold = Some(rt.block_on(boundary::bench_cold_start(n))?)
            }
            "cluster" => {
                let mut runs = Vec::new();
                for nodes in [1, 3] {
                    runs.push(rt.block_on(cluster::bench_fleet(nodes, 10, 64, 60))?);
                }
                eprintln!("  create-to-list visibility (about a minute)...");
                let visibility =
                    rt.block_on(cluster::bench_visibility(20, Duration::from_secs(30)))?;
                run.cluster = Some(cluster::ClusterBench { runs, visibility });
            }
            "interpreter" => run.interpreter = Some(rt.block_on(interpreter::bench(samples))?),
            "template-builds" => {
                run.template_builds = Some(rt.block_on(template_builds::bench(samples))?)
            }
            s @ ("gvisor-verbs" | "gvisor-pool") => {
                rt.block_on(gvisor::measure(s, samples, &mut run.gvisor))?
            }
            other => {
                return Err(
                    format!("unknown section {other:?} (one of {})", SECTIONS.join(", ")).into(),
                );
            }
        }
        eprintln!("  {section} took {:.0} s", t.elapsed().as_secs_f64());
    }
    Ok(run)
}

/// The sections' text, in reading order.
fn render_sections(run: &Run) -> String {
    let mut o = String::new();
    if let Some(c) = &run.claims {
        claims::render_claims(&mut o, c, POOL, PER_ROUND);
    }
    if let Some(e) = &run.e2b {
        claims::render_e2b(&mut o, e, run.claims.as_ref(), POOL, PER_ROUND);
    }
    if let Some(r) = &run.round_trip {
        commands::render_round_trip(&mut o, r);
    }
    if let Some(t) = &run.transfers {
        transfers::render(&mut o, t);
    }
    if let Some(s) = &run.streaming {
        commands::render_streaming(&mut o, s);
    }
    if let Some(r) = &run.resolve {
        kube::render_resolve(&mut o, r);
    }
    if let Some(f) = &run.facade {
        kube::render_facade(&mut o, f);
    }
    if let Some(l) = &run.lists {
        lists::render_lists(&mut o, l);
    }
    if let Some(v) = &run.verbs {
        boundary::render_verbs(&mut o, v, VERB_RUNS);
    }
    if let Some(i) = &run.idle {
        boundary::render_idle(&mut o, i);
    }
    if run.cold.is_some() {
        boundary::render_boundary(
            &mut o,
            run.cold.as_ref(),
            run.claims.as_ref(),
            run.idle.as_ref(),
            run.verbs.as_deref(),
        );
    }
    if let Some(c) = &run.cluster {
        cluster::render_cluster(&mut o, c);
    }
    gvisor::render(&mut o, &run.gvisor);
    if let Some(b) = &run.template_builds {
        template_builds::render(&mut o, b);
    }
    if let Some(i) = &run.interpreter {
        interpreter::render(&mut o, i);
    }
    o
}

/// The side-by-side table at the top: each headline figure, its anchor, and how it compares.
fn render_summary(run: &Run) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "## At a glance\n");
    let _ = writeln!(o, "| figure | ours | anchor | how it compares |");
    let _ = writeln!(o, "|---|---|---|---|");
    let row = |o: &mut String, fig: &str, ours: String, anchor: &str, verdict: &str| {
        let _ = writeln!(o, "| {fig} | {ours} | {anchor} | {verdict} |");
    };
    let ms_f = |d: Duration| d.as_secs_f64() * 1000.0;
    let meets = |ok: bool| {
        if ok {
            "meets the target"
        } else {
            "misses the target"
        }
    };
    if let Some(c) = &run.claims {
        row(
            &mut o,
            "warm claim, direct to a node (p50)",
            ms(c.sequential.p50),
            "sandboxd 0.2–0.7 ms; target ≤ 0.3 ms; must stay ≤ 0.5 ms with the boundary",
            match ms_f(c.sequential.p50) {
                p if p <= 0.3 => "meets the target",
                p if p <= 0.5 => {
                    "within sandboxd's range and the 0.5 ms bound; misses the 0.3 ms target"
                }
                _ => "misses the target",
            },
        );
    }
    if let Some(e) = &run.e2b {
        row(
            &mut o,
            "e2b create over HTTP (p50, concurrency 1)",
            ms(e.create.p50),
            "e2b ~150 ms start",
            "ahead, but not like for like: a booted sandbox is handed over; nothing boots",
        );
        for (level, c, _) in &e.concurrent {
            let (tail, target, met) = match level {
                16 => ("p99", 50.0, ms_f(c.p99) <= 50.0),
                _ => ("p95", 100.0, ms_f(c.p95) <= 100.0),
            };
            let tail_value = if *level == 16 { c.p99 } else { c.p95 };
            row(
                &mut o,
                &format!("e2b create, concurrency {level} (p50 / {tail})"),
                format!("{} / {}", ms(c.p50), ms(tail_value)),
                &format!(
                    "target {tail} ≤ {target:.0} ms{}",
                    if *level == 50 {
                        "; CubeSandbox p95 508 ms at 50 (published, booting microVMs)"
                    } else {
                        ""
                    }
                ),
                meets(met),
            );
        }
    }
    if let Some(r) = &run.round_trip {
        let ratio = r.gateway().p50.as_secs_f64() / r.direct().p50.as_secs_f64().max(1e-9);
        row(
            &mut o,
            "`commands.run(\"true\")` through the gateway / direct to the agent (p50, spaced)",
            format!(
                "{} / {} = {ratio:.2}×",
                ms(r.gateway().p50),
                ms(r.direct().p50)
            ),
            "target ≤ 1.3×",
            meets(ratio <= 1.3),
        );
        let overhead = r.direct().p50.as_secs_f64() - r.bare.p50.as_secs_f64();
        let back_to_back =
            r.back_to_back[2].p50.as_secs_f64() - r.bare_back_to_back.p50.as_secs_f64();
        row(
            &mut o,
            "agent overhead per command (direct − bare spawn, p50; spaced, each timed alike)",
            format!(
                "{:.3} ms (back to back {:.3} ms)",
                overhead * 1000.0,
                back_to_back * 1000.0
            ),
            "target ≤ 1 ms",
            meets(overhead <= 0.001),
        );
        let stall = r.back_to_back[0].p50.as_secs_f64() - r.gateway().p50.as_secs_f64();
        row(
            &mut o,
            "`commands.run(\"true\")` through the gateway, back to back (p50)",
            format!(
                "{} (+{:.3} ms over spaced)",
                ms(r.back_to_back[0].p50),
                stall * 1000.0
            ),
            "—",
            if r.stalls() {
                "behind: a stall near 40 ms per command (Nagle meets delayed ACK; see \"Command round trip\")"
            } else {
                "no stall"
            },
        );
    }
    if let Some(t) = &run.transfers {
        let raw = transfers::throughput(t.mib, t.raw);
        let (up, down) = (
            transfers::throughput(t.mib, t.gw_up),
            transfers::throughput(t.mib, t.gw_down),
        );
        let relay = (
            transfers::throughput(t.mib, t.relay_up),
            transfers::throughput(t.mib, t.relay_down),
        );
        row(
            &mut o,
            &format!(
                "{} MiB upload / download through the gateway, share of a raw loopback copy",
                t.mib
            ),
            format!(
                "{:.0} % / {:.0} % ({up:.0} / {down:.0} MiB/s); a bare relay of the bench's \
                 own: {:.0} % / {:.0} %",
                up * 100.0 / raw,
                down * 100.0 / raw,
                relay.0 * 100.0 / raw,
                relay.1 * 100.0 / raw
            ),
            "target ≥ 50 %",
            &match (
                up >= raw / 2.0 && down >= raw / 2.0,
                relay.0.min(relay.1) >= raw / 2.0,
            ) {
                (true, _) => meets(true).to_string(),
                (false, true) => meets(false).to_string(),
                // Said so, as the reason: no proxy reaches the target on this machine.
                (false, false) => format!(
                    "{}, as does a bare relay copying 1 MiB at a time (gateway: {:.0} % / \
                     {:.0} % of the relay)",
                    meets(false),
                    up * 100.0 / relay.0,
                    down * 100.0 / relay.1
                ),
            },
        );
        let growth = t.rss_peak.saturating_sub(t.rss_before);
        row(
            &mut o,
            &format!("gateway RSS growth during a {} MiB upload", t.big_mib),
            format!("{:.1} MiB", mib(growth)),
            "target < 32 MiB",
            meets(growth < 32 << 20),
        );
    }
    if let Some(s) = &run.streaming {
        let errors: usize = s.rounds.iter().map(|r| r.errors).sum();
        if let Some(first) = s.rounds.first() {
            row(
                &mut o,
                &format!(
                    "{} concurrent streaming commands over 2 nodes: errors, first stdout p50 / p99",
                    s.sandboxes
                ),
                format!(
                    "{errors} errors, {} / {}",
                    ms(first.ttfb.p50),
                    ms(first.ttfb.p99)
                ),
                "0 errors",
                if errors == 0 {
                    "meets the target (both nodes on this one machine)"
                } else {
                    "misses the target"
                },
            );
        }
    }
    if let Some(f) = &run.facade {
        row(
            &mut o,
            "create through the Kubernetes API (p50)",
            ms(f.create.p50),
            "33 ms warm claim through Kubernetes",
            if ms_f(f.create.p50) < 33.0 {
                "ahead"
            } else {
                "behind"
            },
        );
    }
    if let Some(r) = &run.resolve {
        row(
            &mut o,
            "claim id → owning node",
            format!("{:.1} µs", r.index_ns / 1000.0),
            "owner-index Get 39 µs",
            "ahead (routing decision only; the reference also builds the object)",
        );
    }
    if let Some(f) = &run.facade {
        row(
            &mut o,
            &format!("list of {} sandboxes (JSON, p50)", f.sandboxes),
            ms(f.json.p50),
            "124 ms for 50,000",
            if ms_f(f.json.p50) < 124.0 {
                "ahead"
            } else {
                "behind"
            },
        );
    }
    if let Some(l) = &run.lists {
        for w in l.ways.iter().filter(|w| w.current) {
            row(
                &mut o,
                &format!("list of {} over HTTP, {} (p50)", l.sandboxes, w.name),
                format!(
                    "{} (RSS growth {:.1} MiB)",
                    ms(w.warm.p50),
                    mib(w.rss_growth)
                ),
                "target ≤ 30 ms, memory a small multiple of one page",
                meets(ms_f(w.warm.p50) <= 30.0),
            );
        }
        for p in &l.pages {
            row(
                &mut o,
                &format!(
                    "`limit=500` page of {}, {} (p50 first / continued)",
                    l.sandboxes, p.name
                ),
                format!("{} / {}", ms(p.first.p50), ms(p.continued.p50)),
                "target ≤ 2 ms each",
                meets(ms_f(p.first.p50).max(ms_f(p.continued.p50)) <= 2.0),
            );
        }
    }
    if let Some(cl) = &run.cluster {
        row(
            &mut o,
            "create → another replica's list (p50), inventory objects at 30 s",
            ms(cl.visibility.inventory.p50),
            "p50 29 s",
            "ahead; both are bounded by the publish cadence",
        );
        row(
            &mut o,
            "create → another replica's list (p50), change streams",
            ms(cl.visibility.stream.p50),
            "target ≤ 1 s",
            meets(ms_f(cl.visibility.stream.p50) <= 1000.0),
        );
    }
    if let Some(verbs) = &run.verbs
        && let (Some(small), Some(large)) = (verbs.first(), verbs.last())
    {
        row(
            &mut o,
            "pause / resume (median)",
            format!("{} / {}", ms(small.pause), ms(small.resume)),
            "315 ms / 109 ms",
            "not comparable: ours freeze the sandbox's cgroup in place; theirs write and map back guest memory. Behind in capability: no memory is captured",
        );
        row(
            &mut o,
            &format!(
                "snapshot / fork with {} MiB written inside (median)",
                large.mib
            ),
            format!("{} / {}", ms(large.snapshot), ms(large.fork)),
            "—",
            "copies the disk image only; grows with what was written",
        );
    }
    if let Some(c) = &run.cold {
        row(
            &mut o,
            "cold start with the boundary / the agent alone (p50, net none)",
            format!(
                "{} / {} = {:.1}×",
                ms(c.none.p50),
                ms(c.agent.p50),
                c.none.p50.as_secs_f64() / c.agent.p50.as_secs_f64().max(1e-9)
            ),
            "e2b ~150 ms start",
            if ms_f(c.none.p50) < 150.0 {
                "ahead"
            } else {
                "behind"
            },
        );
    }
    if let Some(idle) = &run.idle {
        let cell = |net: &str| {
            idle.net(net)
                .map(|n| format!("{:.2} MiB", mib(n.pss)))
                .unwrap_or_else(|| "—".into())
        };
        row(
            &mut o,
            "memory per idle sandbox (PSS of all its processes), net none / egress",
            format!("{} / {}", cell("none"), cell("egress")),
            "a microVM's guest memory (512 MiB for 1 CPU)",
            "far smaller: namespaces and cgroups instead of a VM, sharing the host kernel",
        );
    }
    if let Some(cl) = &run.cluster
        && let (Some(one), Some(three)) = (
            cl.runs.iter().find(|r| r.nodes == 1),
            cl.runs.iter().find(|r| r.nodes == 3),
        )
    {
        row(
            &mut o,
            "warm claims/s, 3 nodes vs 1",
            format!("{:.2}×", three.per_second / one.per_second.max(1e-9)),
            "—",
            "all nodes on this one machine, where rounds that outlast the nodes' 20 ms refill delay compete with replacement boots: not fleet scaling",
        );
    }
    gvisor::summary_rows(&mut o, &run.gvisor);
    if let Some(i) = &run.interpreter {
        interpreter::summary_rows(&mut o, i);
    }
    let missed: Vec<String> = o
        .lines()
        .filter(|l| {
            l.trim_end_matches(" |")
                .rsplit(" | ")
                .next()
                .is_some_and(|verdict| verdict.contains("misses the"))
        })
        .filter_map(|l| l.split(" | ").next())
        .map(|f| f.trim_start_matches("| ").to_string())
        .collect();
    if !missed.is_empty() {
        let _ = writeln!(o, "\nTargets this run misses: {}.", missed.join("; "));
    }
    let _ = writeln!(
        o,
        "\nWhere we are behind: the built-in runtime captures no memory (pause freezes the \
         sandbox's cgroup; snapshot and fork copy its disk image) and shares the host kernel \
         (namespaces, cgroups and seccomp, not a VM); and fleet and cluster figures come from \
         several processes on one machine (with a fake kube-apiserver), not a real fleet.\n"
    );
    o
}

fn render(machine: &str, command: &str, run: &Run) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "# Performance\n");
    let _ = writeln!(
        o,
        "Every figure below was produced by one command on one machine; nothing here is typed in \
         by hand.\n\n```\ncargo build --release && {command}\n```\n\n\
         Machine: {machine} (line tables kept for profiling), run as root. Sandboxes run in the \
         built-in runtime (each a supervisor, an init and the agent in their own user, mount, \
         pid, network, IPC, UTS and cgroup namespaces, on an overlay of the `base` template and \
         their own ext4 disk image, with cgroup limits and seccomp), except in the gVisor sections, \
         which say so; every node and gateway the \
         bench starts gets `--templates-dir` (the tests' `target/test-templates`, with `base` \
         built once). `--samples` (default 2000) sets the sampled sections' sizes; each section \
         names its runs and samples. Percentiles sort the samples and take index \
         ⌊(n−1)·p/100⌋, the convention of the reference's harness. Anchors are the figures \
         quoted in `shared/contracts/reference-semantics.md` §7 (cocoonstack sandbox-operator \
         and sandboxd); targets are this project's own.\n"
    );
    o.push_str(&render_summary(run));
    o.push_str(&render_sections(run));
    o
}

fn main() -> Res<()> {
    let mut out: Option<PathBuf> = None;
    let mut samples = 2000;
    let mut streaming = 200;
    let mut only: Option<Vec<String>> = None;
    let mut args = std::env::args().skip(1);
    let mut command = vec!["cargo run --release --example bench --".to_string()];
    while let Some(a) = args.next() {
        match a.as_str() {
            "--out" => {
                let p = args.next().ok_or("--out needs a file")?;
                command.push(format!("--out {p}"));
                out = Some(PathBuf::from(p));
            }
            "--samples" => {
                let n = args.next().ok_or("--samples needs a number")?;
                samples = n
                    .parse()
                    .map_err(|_| format!("--samples {n:?} is not a number"))?;
                command.push(format!("--samples {samples}"));
            }
            "--streaming-sandboxes" => {
                let n = args.next().ok_or("--streaming-sandboxes needs a number")?;
                streaming = n
                    .parse()
                    .map_err(|_| format!("--streaming-sandboxes {n:?} is not a number"))?;
                command.push(format!("--streaming-sandboxes {streaming}"));
            }
            // For working on some sections: their text is printed (or written) alone.
            "--only" => {
                let list = args.next().ok_or("--only needs sections")?;
                command.push(format!("--only {list}"));
                only = Some(list.split(',').map(str::to_string).collect());
            }
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let machine = common::machine();
    let opts = Options { samples, streaming };
    let started = Instant::now();
    let text = match &only {
        Some(list) => {
            let sections: Vec<&str> = list.iter().map(String::as_str).collect();
            let run = measure(&rt, &sections, &opts)?;
            let mut text = render_summary(&run);
            text.push_str(&render_sections(&run));
            text
        }
        None => {
            let run = measure(&rt, SECTIONS, &opts)?;
            render(&machine, &command.join(" "), &run)
        }
    };
    eprintln!("done in {:.0} s", started.elapsed().as_secs_f64());
    match out {
        Some(p) => std::fs::write(&p, &text)?,
        None => print!("{text}"),
    }
    Ok(())
}
