//! The Code Interpreter (port 49999 of `code-interpreter` sandboxes): `Sandbox.create()` and
//! the first `run_code`; the round trip of `run_code("1+1")` through the gateway, straight to
//! the sandbox's server, and from a Jupyter client beside the same kernel; sixteen sandboxes
//! running code at once; a 10 MB stdout stream; and what an idle sandbox costs beyond its
//! kernels.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use sandbox_gateway::dispatch::client::NodeConn;
use sandbox_gateway::model::PoolKey;
use sandbox_gateway::node::runtime::dial::Dialer;

use crate::claims::{e2b_kill, wait_pool_warm};
use crate::commands::{SPACING, e2b_create_of, host_port};
use crate::common::*;
use crate::envd::{Envd, Via, check, full, node_record};

const PORT: u16 = 49999;
/// The pool the SDKs' `code-interpreter-v1` creates are served from (its template's size).
const POOL: &str = "code-interpreter/egress/medium";
const TEMPLATE: &str = "code-interpreter-v1";
/// Warm sandboxes, and how many run code at once in the concurrency part.
const WARM: u32 = 16;
/// Plain `base` sandboxes beside them, the idle figure's baseline.
const BASE: u32 = 4;
/// Each line 99 characters and a newline: 10^7 bytes of stdout.
const STREAM_LINES: usize = 100_000;
const STREAM_CODE: &str = "for _ in range(100000): print('x' * 99)";
const BUSY_CODE: &str = "sum(i * i for i in range(100000))";
/// Round trips per way in one block of the round-trip part.
const ROUND_TRIP_BLOCK: usize = 50;

/// A Jupyter client (jupyter_client's `BlockingKernelClient`, as notebooks and nbclient use
/// it) on the connection file of the sandbox's default Python kernel: times `n` runs of `code`
/// (`execute_interactive`, which waits for the reply and the kernel's idle status, as the
/// server does), `pause` seconds apart, after `warm` uncounted ones, and prints the seconds.
const JUPYTER_PY: &str = r#"import glob, json, os, sys, time
from jupyter_client import BlockingKernelClient
n, warm, pause, code = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
files = [f for f in glob.glob("/run/sandbox-gateway/kernels/kernel-*.json")
         if json.load(open(f)).get("kernel_name") == "python3"]
files.sort(key=os.path.getmtime)
kc = BlockingKernelClient(connection_file=files[0])
kc.load_connection_file()
kc.start_channels()
kc.wait_for_ready(timeout=60)
out = []
for i in range(n + warm):
    time.sleep(pause)
    t = time.perf_counter()
    reply = kc.execute_interactive(code, output_hook=lambda m: None, timeout=120)
    d = time.perf_counter() - t
    if reply["content"]["status"] != "ok":
        sys.exit("the run failed: %r" % (reply["content"],))
    if i >= warm:
        out.append(d)
kc.stop_channels()
print(" ".join("%.9f" % d for d in out))
"#;

pub const WAYS: [&str; 3] = [
    "(a) through the gateway",
    "(b) straight to the sandbox's server (netns socket)",
    "(c) a Jupyter client beside the same kernel",
];

pub struct InterpreterBench {
    pub measured: chrono::DateTime<chrono::Utc>,
    /// `POST /v2/sandboxes` answered, and then the first `run_code("1+1")` answered.
    pub create: Summary,
    pub create_and_run: Summary,
    /// Pool refill after each claim: from the kill until the pool was full again.
    pub refill: Summary,
    /// `run_code("1+1")`, spaced, the three ways.
    pub round_trip: [Summary; 3],
    /// 10^7 bytes of stdout, the three ways (median of runs).
    pub stream: [Duration; 3],
    pub stream_runs: usize,
    pub concurrent: Concurrent,
    pub idle: Idle,
}

pub struct Concurrent {
    pub sandboxes: usize,
    /// Create + first `run_code`, all sandboxes started at once.
    pub first: Summary,
    /// `run_code(BUSY_CODE)` with every sandbox running it in a loop.
    pub busy: Summary,
    /// The same code alone in one sandbox.
    pub alone: Summary,
    pub errors: usize,
    pub wall: Duration,
}

/// Per idle sandbox (averages over the warm pool), PSS in bytes.
pub struct Idle {
    pub sandboxes: usize,
    /// The kernels the pool starts (processes exec'd by the server), by name.
    pub kernels: BTreeMap<String, u64>,
    /// Everything else of a code-interpreter sandbox: supervisor, init, envd, the server and
    /// its keeper, slirp4netns.
    pub rest: u64,
    /// The server and its keeper alone.
    pub server: u64,
    /// A plain `base` sandbox of the same net, all of its processes.
    pub base: u64,
}

impl Idle {
    fn kernels_total(&self) -> u64 {
        self.kernels.values().sum()
    }
}

/// `run_code(code)` on `c` (a client of port 49999): `POST /execute`, read to its end. Fails
/// unless the stream ended and carried no error (and, with `expect`, that main result).
async fn run_code(c: &mut Envd, code: &str, expect: Option<&str>) -> Res<usize> {
    let body = serde_json::to_vec(&serde_json::json!({ "code": code }))?;
    let resp = c
        .send(
            "POST",
            "/execute",
            &[("content-type", "application/json".into())],
            full(body),
        )
        .await?;
    let status = resp.status();
    let bytes = resp.into_body().collect().await?.to_bytes();
    let text = String::from_utf8_lossy(&bytes);
    let tail = || text.chars().rev().take(300).collect::<String>();
    if status != 200 {
        return Err(format!("/execute answered {status}: {text}").into());
    }
    if !text.contains(r#""type":"end_of_execution""#) || text.contains(r#""type":"error""#) {
        return Err(format!("run_code({code:?}) did not end well: …{}", tail()).into());
    }
    if let Some(want) = expect
        && !text.contains(&format!(r#""text":"{want}""#))
    {
        return Err(format!("run_code({code:?}) did not answer {want}: …{}", tail()).into());
    }
    Ok(bytes.len())
}

async fn timed(c: &mut Envd, code: &str, expect: Option<&str>) -> Res<Duration> {
    let t = Instant::now();
    run_code(c, code, expect).await?;
    Ok(t.elapsed())
}

fn gateway_way(gw: &Daemon, id: &str, token: &str) -> Envd {
    Envd::new(Via::Gateway {
        addr: host_port(&gw.address),
        id: id.to_string(),
        token: token.to_string(),
    })
    .on_port(PORT)
}

/// Runs JUPYTER_PY in the sandbox (as its root, who owns the kernels' directory) through
/// `envd`; the seconds it printed.
async fn jupyter_client(
    envd: &mut Envd,
    n: usize,
    warm: usize,
    pause: Duration,
    code: &str,
) -> Res<Vec<Duration>> {
    let quoted = format!("'{}'", code.replace('\'', r"'\''"));
    let out = check(
        envd,
        &format!(
            "python3 /tmp/jupyter_bench.py {n} {warm} {} {quoted}",
            pause.as_secs_f64()
        ),
    )
    .await?;
    let times: Vec<Duration> = out
        .split_whitespace()
        .map(|s| s.parse::<f64>().map(Duration::from_secs_f64))
        .collect::<Result<_, _>>()
        .context("parsing the Jupyter client's timings")?;
    if times.len() != n {
        return Err(format!("the Jupyter client printed {} timings", times.len()).into());
    }
    Ok(times)
}

/// All processes by pid, with their parent.
fn parents() -> BTreeMap<i32, i32> {
    pids().into_iter().map(|p| (p, parent_of(p))).collect()
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Memory of the idle sandboxes under `root`: kernels (the server's exec'd children and their
/// descendants), the rest, and the plain `base` sandboxes beside them.
fn idle_memory(root: &Path) -> Idle {
    let all = sandbox_processes(root);
    let parent = parents();
    let descends = |mut pid: i32, from: i32| {
        while pid > 1 {
            if pid == from {
                return true;
            }
            pid = parent.get(&pid).copied().unwrap_or(0);
        }
        false
    };
    let (mut kernels, mut rest, mut server, mut count) = (BTreeMap::new(), 0, 0, 0u64);
    let (mut base, mut bases) = (0, 0u64);
    for sb in all.values() {
        let ours: BTreeSet<i32> = sb.procs.iter().map(|(_, p)| *p).collect();
        let own: u64 = ours.iter().map(|p| rss_pss(*p).1).sum();
        let Some(sup) = sb.supervisor() else { continue };
        let exec: Vec<i32> = parent
            .keys()
            .copied()
            .filter(|p| !ours.contains(p) && descends(*p, sup))
            .collect();
        if exec.is_empty() {
            base += own;
            bases += 1;
            continue;
        }
        count += 1;
        rest += own;
        for p in &ours {
            if matches!(comm(*p).as_str(), "interpreter" | "keeper") {
                server += rss_pss(*p).1;
            }
        }
        for p in exec {
            // A kernel's own children (none when idle) count with it.
            let top = std::iter::successors(Some(p), |q| parent.get(q).copied())
                .take_while(|q| !ours.contains(q))
                .last()
                .unwrap_or(p);
            *kernels.entry(comm(top)).or_insert(0) += rss_pss(p).1;
        }
    }
    let per = |v: u64, n: u64| v / n.max(1);
    Idle {
        sandboxes: count as usize,
        kernels: kernels
            .into_iter()
            .map(|(k, v)| (k, per(v, count)))
            .collect(),
        rest: per(rest, count),
        server: per(server, count),
        base: per(base, bases),
    }
}

pub async fn bench(samples: usize) -> Res<InterpreterBench> {
    build_template("code-interpreter", &templates_dir()?)?;
    let gw = Daemon::gateway_with(
        &[format!("{POOL}={WARM}"), format!("base/egress={BASE}")],
        &[],
    )?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(32)
        .build()?;
    let url = gw.address.clone();
    let fill = Duration::from_secs(600);
    wait_pool_warm(&http, &url, POOL, WARM, fill).await?;
    wait_pool_warm(&http, &url, "base/egress/small", BASE, fill).await?;
    // The node's own count from here on: the gateway's metrics lag a claim by a poll.
    let (node, fleet) = gw.embedded_node()?;
    let conn = NodeConn::new(&node, &fleet)?;
    let key = PoolKey::new("code-interpreter", "egress", "medium")?;
    // Idle: the pool as it stands once its kernels have settled.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle = idle_memory(&gw.dir.path().join("node/sandboxes"));
    eprintln!("  idle memory measured");

    // Create, then the first run_code, each from a full pool.
    let (mut create, mut create_and_run, mut refill) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..samples.clamp(5, 40) {
        let t = Instant::now();
        let sb = e2b_create_of(&http, &url, TEMPLATE).await?;
        create.push(t.elapsed());
        let mut c = gateway_way(&gw, &sb.id, &sb.jwt);
        run_code(&mut c, "1+1", Some("2")).await?;
        create_and_run.push(t.elapsed());
        drop(c);
        let killed = Instant::now();
        e2b_kill(&http, &url, &sb.id).await?;
        wait_pool(&conn, &key, WARM).await?;
        refill.push(killed.elapsed());
    }
    eprintln!("  create + first run_code measured");

    // The round trip and the stream, three ways into one sandbox.
    let sb = e2b_create_of(&http, &url, TEMPLATE).await?;
    let rec = node_record(&node, &fleet, &sb.id).await?;
    let supervisor = processes_of(Path::new(&rec.state_dir))?
        .supervisor()
        .ok_or("the sandbox's supervisor was not found")?;
    let dialer = Arc::new(Dialer::new()?);
    let netns = Via::Netns {
        pid: supervisor,
        token: rec.token.clone(),
        dialer,
    };
    let mut ways = [
        gateway_way(&gw, &sb.id, &sb.jwt),
        Envd::new(netns.clone()).on_port(PORT),
    ];
    for w in ways.iter_mut() {
        w.connect().await?;
        for _ in 0..20 {
            timed(w, "1+1", Some("2")).await?;
        }
    }
    let n = samples.clamp(20, 300);
    let mut envd = Envd::new(netns).with_user("root");
    envd.upload(
        "/tmp/jupyter_bench.py",
        JUPYTER_PY.len() as u64,
        full(JUPYTER_PY.as_bytes().to_vec()),
    )
    .await?;
    // In blocks, so that the machine's drift over the minute this takes hits the three alike:
    // (a) and (b) alternate run by run, then the Jupyter client runs as many.
    let mut trips: [Vec<Duration>; 3] = Default::default();
    let block = ROUND_TRIP_BLOCK.min(n);
    while trips[2].len() < n {
        for _ in 0..block {
            for (w, t) in ways.iter_mut().zip(trips.iter_mut()) {
                tokio::time::sleep(SPACING).await;
                t.push(timed(w, "1+1", Some("2")).await?);
            }
        }
        let mut jc = jupyter_client(&mut envd, block, 5, SPACING, "1+1").await?;
        trips[2].append(&mut jc);
    }
    eprintln!("  round trips measured");

    let stream_runs = 5;
    let mut stream: [Vec<Duration>; 3] = Default::default();
    for (w, t) in ways.iter_mut().zip(stream.iter_mut()) {
        run_code(w, STREAM_CODE, None).await?;
        for _ in 0..stream_runs {
            let started = Instant::now();
            let bytes = run_code(w, STREAM_CODE, None).await?;
            t.push(started.elapsed());
            if bytes < STREAM_LINES * 100 {
                return Err(format!("the stream carried {bytes} bytes").into());
            }
        }
    }
    stream[2] = jupyter_client(&mut envd, stream_runs, 1, Duration::ZERO, STREAM_CODE).await?;
    let alone: Vec<Duration> = {
        let w = &mut ways[0];
        let mut v = Vec::new();
        for _ in 0..50 {
            v.push(timed(w, BUSY_CODE, None).await?);
        }
        v
    };
    drop(ways);
    drop(envd);
    e2b_kill(&http, &url, &sb.id).await?;
    eprintln!("  stream measured");

    // Sixteen sandboxes at once, from a full pool: create and first run_code, then each runs
    // BUSY_CODE in a loop.
    wait_pool(&conn, &key, WARM).await?;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..WARM {
        let (http, url) = (http.clone(), url.clone());
        let addr = host_port(&gw.address);
        tasks.spawn(async move {
            let t = Instant::now();
            let sb = e2b_create_of(&http, &url, TEMPLATE).await?;
            let mut c = Envd::new(Via::Gateway {
                addr,
                id: sb.id.clone(),
                token: sb.jwt.clone(),
            })
            .on_port(PORT);
            run_code(&mut c, "1+1", Some("2")).await?;
            let first = t.elapsed();
            let mut busy = Vec::new();
            let mut errors = 0;
            for _ in 0..20 {
                match timed(&mut c, BUSY_CODE, None).await {
                    Ok(d) => busy.push(d),
                    Err(_) => errors += 1,
                }
            }
            Res::Ok((sb.id, first, busy, errors))
        });
    }
    let (mut first, mut busy, mut errors, mut ids) = (Vec::new(), Vec::new(), 0, Vec::new());
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok((id, f, b, e))) => {
                ids.push(id);
                first.push(f);
                busy.extend(b);
                errors += e;
            }
            Ok(Err(e)) => {
                eprintln!("  a sandbox failed: {e}");
                errors += 1;
            }
            Err(e) => return Err(format!("a task failed: {e}").into()),
        }
    }
    let wall = started.elapsed();
    for id in ids {
        e2b_kill(&http, &url, &id).await?;
    }
    eprintln!("  concurrency measured");
    gw.stop();
    Ok(InterpreterBench {
        measured: chrono::Utc::now(),
        create: summarize(create),
        create_and_run: summarize(create_and_run),
        refill: summarize(refill),
        round_trip: trips.map(summarize),
        stream: stream.map(median),
        stream_runs,
        concurrent: Concurrent {
            sandboxes: WARM as usize,
            first: summarize(first),
            busy: summarize(busy),
            alone: summarize(alone),
            errors,
            wall,
        },
        idle,
    })
}

impl InterpreterBench {
    fn ratio(&self) -> f64 {
        self.round_trip[0].p50.as_secs_f64() / self.round_trip[2].p50.as_secs_f64().max(1e-9)
    }

    /// The server's own cost per run: straight to it − the Jupyter client, at p50 (ms).
    fn overhead_ms(&self) -> f64 {
        (self.round_trip[1].p50.as_secs_f64() - self.round_trip[2].p50.as_secs_f64()) * 1000.0
    }

    fn beyond_kernels(&self) -> u64 {
        self.idle.rest
    }
}

pub fn summary_rows(o: &mut String, b: &InterpreterBench) {
    let row = |o: &mut String, fig: &str, ours: String, anchor: &str, verdict: &str| {
        let _ = writeln!(o, "| {fig} | {ours} | {anchor} | {verdict} |");
    };
    let meets = |ok: bool| {
        if ok {
            "meets the target"
        } else {
            "misses the target"
        }
    };
    let c = &b.create_and_run;
    row(
        o,
        "Code Interpreter: create + first `run_code(\"1+1\")` (p50 / p99, warm pool)",
        format!("{} / {}", ms(c.p50), ms(c.p99)),
        "target p50 ≤ 50 ms; e2b ~150 ms start",
        meets(c.p50 <= Duration::from_millis(50)),
    );
    row(
        o,
        "`run_code(\"1+1\")` through the gateway / a Jupyter client beside the same kernel (p50)",
        format!(
            "{} / {} = {:.2}×",
            ms(b.round_trip[0].p50),
            ms(b.round_trip[2].p50),
            b.ratio()
        ),
        "target ≤ 1.3×",
        meets(b.ratio() <= 1.3),
    );
    row(
        o,
        "the interpreter server's own cost per run (straight to it − Jupyter client, p50)",
        format!("{:.3} ms", b.overhead_ms()),
        "target ≤ 1 ms",
        meets(b.overhead_ms() <= 1.0),
    );
    row(
        o,
        "idle code-interpreter sandbox beyond its kernels (PSS)",
        format!(
            "{:.1} MiB (kernels {:.1} MiB)",
            mib(b.beyond_kernels()),
            mib(b.idle.kernels_total())
        ),
        "target ≤ 10 MiB",
        meets(b.beyond_kernels() <= 10 << 20),
    );
}

pub fn render(o: &mut String, b: &InterpreterBench) {
    let _ = writeln!(o, "## Code Interpreter\n");
    let _ = writeln!(
        o,
        "Measured {} (`--only interpreter` adds this section to a file made before it).\n",
        b.measured.format("%Y-%m-%d %H:%M UTC")
    );
    let _ = writeln!(
        o,
        "Method: `sandbox-gateway serve` with its embedded node, a warm pool of {WARM} \
         `{POOL}` sandboxes (the pool `code-interpreter-v1` creates are served from; each has \
         its default Python and JavaScript kernels started) and {BASE} `base/egress` ones, all \
         in the built-in runtime. Requests go over loopback HTTP/1.1 keep-alive connections as \
         the SDKs send them: `POST /v2/sandboxes` with `templateID` `{TEMPLATE}`, then `POST \
         /execute` with `{{\"code\": …}}` to port {PORT} with the `E2b-Sandbox-Id`/`-Port` \
         headers; a run is timed from sending it until its NDJSON stream ended (checked: \
         `end_of_execution`, no `error`, the expected result).\n"
    );
    let _ = writeln!(
        o,
        "**Create + first run.** {} times from a full pool: the create, then `run_code(\"1+1\")` \
         on a new connection; the sandbox is killed and the pool refilled before the next.\n",
        b.create.n
    );
    let _ = writeln!(o, "| measurement | samples | p50 | p90 | p99 |");
    let _ = writeln!(o, "|---|---|---|---|---|");
    summary_row(o, "create (`POST /v2/sandboxes` answered)", &b.create);
    summary_row(o, "create + first `run_code(\"1+1\")`", &b.create_and_run);
    summary_row(
        o,
        "pool full again, from the kill (a replacement booted from the claim on, its kernels started and warmed)",
        &b.refill,
    );
    let _ = writeln!(
        o,
        "\n**Round trip.** One sandbox, `run_code(\"1+1\")` three ways, each on its own \
         connection warmed with 20 runs: (a) through the gateway; (b) straight to the \
         sandbox's interpreter server on 127.0.0.1:{PORT}, over a socket the bench creates in \
         the sandbox's network namespace; (c) a Jupyter client (`jupyter_client`'s \
         `BlockingKernelClient.execute_interactive`, which waits for the reply and the \
         kernel's idle status as the server does) run inside the sandbox on the connection \
         file of the very kernel the server runs the default context in, timing itself with \
         `time.perf_counter`. In blocks of {ROUND_TRIP_BLOCK}: (a) and (b) alternate run by \
         run, then (c) runs as many (after 5 uncounted), so that drift hits the three alike; \
         each run {} ms after the previous one.\n",
        SPACING.as_millis()
    );
    let _ = writeln!(o, "| `run_code(\"1+1\")` | samples | p50 | p90 | p99 |");
    let _ = writeln!(o, "|---|---|---|---|---|");
    for (name, s) in WAYS.iter().zip(&b.round_trip) {
        summary_row(o, name, s);
    }
    let _ = writeln!(
        o,
        "\nGateway / Jupyter client: **{:.2}×** at p50 (target ≤ 1.3×). The server's own cost, \
         (b) − (c): **{:.3} ms** at p50 (target ≤ 1 ms); the gateway's, (a) − (b): {:.3} ms. \
         (c) includes what jupyter_client itself does in Python (signing, parsing, polling its \
         sockets), which the server does in Rust; when (b) − (c) is below zero, that is the \
         larger part.\n",
        b.ratio(),
        b.overhead_ms(),
        (b.round_trip[0].p50.as_secs_f64() - b.round_trip[1].p50.as_secs_f64()) * 1000.0
    );
    let mb = STREAM_LINES as f64 * 100.0 / 1e6;
    let _ = writeln!(
        o,
        "**A 10 MB stdout stream.** `{STREAM_CODE}` ({STREAM_LINES} lines of 100 bytes), the \
         same three ways, median of {} runs after one uncounted.\n",
        b.stream_runs
    );
    let _ = writeln!(o, "| 10 MB of stdout | time (median) | throughput |");
    let _ = writeln!(o, "|---|---|---|");
    for (name, d) in WAYS.iter().zip(&b.stream) {
        let _ = writeln!(
            o,
            "| {name} | {} | {:.1} MB/s |",
            ms(*d),
            mb / d.as_secs_f64().max(1e-9)
        );
    }
    let c = &b.concurrent;
    let _ = writeln!(
        o,
        "\n**{} sandboxes at once.** From a full pool, {} tasks each create a sandbox, run \
         `run_code(\"1+1\")`, then `run_code(\"{BUSY_CODE}\")` 20 times in a row, all at the \
         same time on this machine's 2 cores; the same code alone, 50 times in one sandbox, \
         beside it. Errors: {}. All of it took {:.1} s.\n",
        c.sandboxes,
        c.sandboxes,
        c.errors,
        c.wall.as_secs_f64()
    );
    let _ = writeln!(o, "| measurement | samples | p50 | p90 | p99 |");
    let _ = writeln!(o, "|---|---|---|---|---|");
    summary_row(
        o,
        &format!("create + first `run_code`, {} at once", c.sandboxes),
        &c.first,
    );
    summary_row(
        o,
        &format!("`{BUSY_CODE}`, {} sandboxes at once", c.sandboxes),
        &c.busy,
    );
    summary_row(o, &format!("`{BUSY_CODE}`, alone"), &c.alone);
    let i = &b.idle;
    let kernels: Vec<String> = i
        .kernels
        .iter()
        .map(|(k, v)| format!("`{k}` {:.1} MiB", mib(*v)))
        .collect();
    let _ = writeln!(
        o,
        "\n**Memory per idle sandbox.** PSS of every process of each of the {} warm sandboxes \
         10 s after the pool was full, averaged: the kernels (processes the server executed: \
         {}) together **{:.1} MiB**; everything else (supervisor, init, envd, the interpreter \
         server and its keeper, slirp4netns) **{:.1} MiB** (target ≤ 10 MiB), of which the \
         server and keeper {:.1} MiB. A plain `base/egress` sandbox beside them: {:.1} MiB.\n",
        i.sandboxes,
        kernels.join(", "),
        mib(i.kernels_total()),
        mib(i.rest),
        mib(i.server),
        mib(i.base)
    );
}
