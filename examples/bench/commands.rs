//! Commands in sandboxes: the round trip of `commands.run("true")` through the gateway, through
//! the node's data plane and directly against the agent, against the bare spawn measured
//! inside; and many streaming commands at once through a gateway over a fleet of two nodes.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_gateway::dispatch::client::NodeConn;
use sandbox_gateway::model::ids;
use sandbox_gateway::node::runtime::dial::Dialer;

use crate::claims::wait_gateway_warm;
use crate::common::*;
use crate::envd::{Envd, Via, check, full, node_record};

/// A sandbox created through the gateway's e2b API: its published id, envdAccessToken and node.
pub struct Created {
    pub id: String,
    pub jwt: String,
    pub node: String,
}

pub async fn e2b_create_sandbox(http: &reqwest::Client, url: &str) -> Res<Created> {
    e2b_create_of(http, url, "base").await
}

/// `POST /v2/sandboxes` of `template`, as the SDKs send it.
pub async fn e2b_create_of(http: &reqwest::Client, url: &str, template: &str) -> Res<Created> {
    let res = http
        .post(format!("{url}/v2/sandboxes"))
        .header("X-API-KEY", "e2b_bench")
        .json(&serde_json::json!({"templateID": template, "timeout": 3600, "metadata": {}, "envVars": {}}))
        .send()
        .await?;
    let status = res.status();
    let body: serde_json::Value = res.json().await?;
    if status != 201 {
        return Err(format!("create answered {status}: {body}").into());
    }
    let field = |k: &str| -> Res<String> {
        Ok(body[k]
            .as_str()
            .ok_or_else(|| format!("the create response has no {k}: {body}"))?
            .to_string())
    };
    Ok(Created {
        id: field("sandboxID")?,
        jwt: field("envdAccessToken")?,
        node: body["clientID"].as_str().unwrap_or_default().to_string(),
    })
}

/// `host:port` of a gateway URL.
pub fn host_port(url: &str) -> String {
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string()
}

pub struct RoundTrip {
    /// Gateway, node data plane, direct; each command 50 ms after the previous one.
    pub spaced: [Summary; 3],
    /// The same three, each a block of commands sent one after the other on its connection.
    pub back_to_back: [Summary; 3],
    /// The bare spawn, each 50 ms after the previous one (as the spaced commands), and back
    /// to back.
    pub bare: Summary,
    pub bare_back_to_back: Summary,
}

pub const WAYS: [&str; 3] = [
    "(a) through the gateway",
    "(b) through the node's data plane",
    "(c) direct to the agent (netns socket)",
];

/// Times N spawns of `bash -l -c true` from inside the sandbox, the way envd spawns a command
/// (pipes for its output, no stdin), and prints the durations in seconds.
const SPAWN_PY: &str = r#"import subprocess, sys, time
n, warm, gap = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
out = []
for i in range(n + warm):
    time.sleep(gap)
    t = time.perf_counter()
    subprocess.run(["/bin/bash", "-l", "-c", "true"], stdin=subprocess.DEVNULL,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True)
    d = time.perf_counter() - t
    if i >= warm:
        out.append(d)
print(" ".join("%.9f" % d for d in out))
"#;

/// The pause between spaced commands: longer than the 40 ms a Linux receiver may hold back an
/// ACK, so every command starts on connections with nothing outstanding.
pub const SPACING: Duration = Duration::from_millis(50);

async fn timed_true(envd: &mut Envd) -> Res<Duration> {
    let t = Instant::now();
    let ran = envd.run("true").await?;
    let took = t.elapsed();
    if ran.exit_code != 0 {
        return Err(format!(
            "`true` exited {} via the {}",
            ran.exit_code,
            envd.via.name()
        )
        .into());
    }
    Ok(took)
}

/// `commands.run("true")` three ways on one sandbox: spaced (interleaved sample by sample, so
/// that drift hits all three alike), then back to back; then the bare spawn measured inside.
pub async fn bench_round_trip(samples: usize) -> Res<RoundTrip> {
    let gw = Daemon::gateway_with(&["base/egress=2".to_string()], &[])?;
    let http = reqwest::Client::new();
    wait_gateway_warm(&gw, 2).await?;
    let sb = e2b_create_sandbox(&http, &gw.address).await?;
    let (node, fleet) = gw.embedded_node()?;
    let rec = node_record(&node, &fleet, &sb.id).await?;
    let procs = processes_of(Path::new(&rec.state_dir))?;
    let supervisor = procs
        .supervisor()
        .ok_or("the sandbox's supervisor was not found")?;
    let dialer = Arc::new(Dialer::new()?);
    let mut ways = [
        Envd::new(Via::Gateway {
            addr: host_port(&gw.address),
            id: sb.id.clone(),
            token: sb.jwt.clone(),
        }),
        Envd::new(Via::Node {
            data: rec.address.clone(),
            id: rec.id.clone(),
            token: rec.token.clone(),
        }),
        Envd::new(Via::Netns {
            pid: supervisor,
            token: rec.token.clone(),
            dialer,
        }),
    ];
    for w in ways.iter_mut() {
        w.connect().await?;
        for _ in 0..20 {
            timed_true(w).await?;
        }
    }
    let mut spaced: [Vec<Duration>; 3] = Default::default();
    for _ in 0..samples {
        for (w, t) in ways.iter_mut().zip(spaced.iter_mut()) {
            tokio::time::sleep(SPACING).await;
            t.push(timed_true(w).await?);
        }
    }
    let mut back_to_back: [Vec<Duration>; 3] = Default::default();
    for (w, t) in ways.iter_mut().zip(back_to_back.iter_mut()) {
        tokio::time::sleep(SPACING).await;
        for _ in 0..samples {
            t.push(timed_true(w).await?);
        }
    }
    // The bare spawn, from inside: the script is uploaded through envd's /files.
    let direct = &mut ways[2];
    direct
        .upload(
            "/home/user/spawn.py",
            SPAWN_PY.len() as u64,
            full(SPAWN_PY.as_bytes().to_vec()),
        )
        .await?;
    let mut bare = Vec::new();
    for gap in [SPACING.as_secs_f64(), 0.0] {
        let out = check(
            direct,
            &format!("python3 /home/user/spawn.py {samples} 20 {gap}"),
        )
        .await?;
        let times: Vec<Duration> = out
            .split_whitespace()
            .map(|s| s.parse::<f64>().map(Duration::from_secs_f64))
            .collect::<Result<_, _>>()
            .context("parsing the spawn timings")?;
        if times.len() != samples {
            return Err(format!("the spawn script printed {} timings", times.len()).into());
        }
        bare.push(summarize(times));
    }
    drop(ways);
    gw.stop();
    let bare_back_to_back = bare.pop().ok_or("no back-to-back spawns")?;
    Ok(RoundTrip {
        spaced: spaced.map(summarize),
        back_to_back: back_to_back.map(summarize),
        bare: bare.pop().ok_or("no spaced spawns")?,
        bare_back_to_back,
    })
}

impl RoundTrip {
    pub fn gateway(&self) -> &Summary {
        &self.spaced[0]
    }
    pub fn direct(&self) -> &Summary {
        &self.spaced[2]
    }
    /// Whether back-to-back commands stall (cost 20 ms or more over spaced ones at p50).
    pub fn stalls(&self) -> bool {
        self.spaced
            .iter()
            .zip(&self.back_to_back)
            .any(|(s, b)| b.p50.saturating_sub(s.p50) >= Duration::from_millis(20))
    }
}

pub fn render_round_trip(o: &mut String, r: &RoundTrip) {
    let _ = writeln!(o, "## Command round trip\n");
    let _ = writeln!(
        o,
        "Method: `sandbox-gateway serve` with its embedded node; one sandbox created through \
         e2b (`POST /v2/sandboxes`, net egress). The equivalent of `commands.run(\"true\")`: \
         Connect `process.Process/Start` (`application/connect+json`) of `/bin/bash -l -c \
         true` without stdin, timed from sending the request until the stream's end-of-stream \
         envelope (after the end event with exit code 0) is read. Each way keeps one HTTP/1.1 \
         keep-alive connection (opened and warmed with 20 commands first): (a) through the \
         gateway: the e2b listener with `E2b-Sandbox-Id`/`E2b-Sandbox-Port: 49983` headers and \
         the create response's `envdAccessToken` (the gateway checks it, swaps in the agent's \
         token and streams through a tunnel to the node's data plane); (b) through the node's \
         data plane: one `CONNECT <id>:49983` tunnel with the sandbox's own token; (c) direct: \
         a socket the bench creates in the sandbox's network namespace (`/proc/<supervisor \
         pid>/ns/net`, with `sandbox_gateway::node::runtime::dial::Dialer`, as the node does) \
         to the agent on 127.0.0.1:49983. Spaced: {} rounds of (a), (b), (c), each command \
         {} ms after the previous one. Back to back: then {} commands on each connection in \
         turn, each sent as soon as the previous one ended (what a loop of `commands.run` \
         does). The bare spawn: a Python script uploaded with `POST /files` and run in the \
         sandbox times {} spawns of the same `bash -l -c true` with `time.perf_counter` \
         (`subprocess.run` with piped output, as envd spawns commands; 20 warm-ups first), as \
         the same default user, spaced ({} ms before each, as the spaced commands) and back to \
         back; the agent's overhead compares like with like.\n",
        r.spaced[0].n,
        SPACING.as_millis(),
        r.back_to_back[0].n,
        r.bare.n,
        SPACING.as_millis()
    );
    let _ = writeln!(
        o,
        "| `commands.run(\"true\")` | samples | p50 | p90 | p99 |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|");
    for (name, s) in WAYS.iter().zip(&r.spaced) {
        summary_row(o, &format!("{name}, spaced"), s);
    }
    for (name, s) in WAYS.iter().zip(&r.back_to_back) {
        summary_row(o, &format!("{name}, back to back"), s);
    }
    summary_row(o, "bare spawn inside the sandbox, spaced", &r.bare);
    summary_row(
        o,
        "bare spawn inside the sandbox, back to back",
        &r.bare_back_to_back,
    );
    let ratio = |a: &Summary, b: &Summary, p: fn(&Summary) -> Duration| {
        p(a).as_secs_f64() / p(b).as_secs_f64().max(1e-9)
    };
    let less = |a: Duration, b: Duration| {
        format!("{:.3} ms", (a.as_secs_f64() - b.as_secs_f64()) * 1000.0)
    };
    let [g, n, d] = &r.spaced;
    let _ = writeln!(
        o,
        "\nSpaced, gateway / direct: **{:.2}×** at p50 (target ≤ 1.3×), {:.2}× at p90, {:.2}× at \
         p99; node data plane / direct {:.2}× at p50. The agent's own overhead, direct − bare \
         spawn: **{}** at p50 (target ≤ 1 ms), {} at p90.\n",
        ratio(g, d, |s| s.p50),
        ratio(g, d, |s| s.p90),
        ratio(g, d, |s| s.p99),
        ratio(n, d, |s| s.p50),
        less(d.p50, r.bare.p50),
        less(d.p90, r.bare.p90)
    );
    let [bg, bn, bd] = &r.back_to_back;
    let _ = write!(
        o,
        "Back to back, each command costs more than spaced by {} (gateway), {} (node data \
         plane) and {} (direct) at p50; the agent's overhead back to back, direct − bare \
         spawn: {} at p50, {} at p90.",
        less(bg.p50, g.p50),
        less(bn.p50, n.p50),
        less(bd.p50, d.p50),
        less(bd.p50, r.bare_back_to_back.p50),
        less(bd.p90, r.bare_back_to_back.p90)
    );
    if r.stalls() {
        let _ = write!(
            o,
            " A stall near 40 ms is the signature of Nagle's algorithm meeting a delayed ACK: \
             envd serves its connections with `axum::serve`, which does not set `TCP_NODELAY`, \
             so after a Start stream's first write (the response head and the start event) its \
             next small write (the end event) waits until the receiver acknowledges the first, \
             and a receiver that just answered a request (the bench for (c), the node for (a) \
             and (b)) delays that ACK by up to 40 ms. Spaced commands do not meet it because \
             an idle connection acknowledges at once. Setting `TCP_NODELAY` on envd's accepted \
             sockets should remove it."
        );
    }
    let _ = writeln!(o, "\n");
}

pub struct StreamRound {
    pub errors: usize,
    pub first_error: Option<String>,
    pub ttfb: Summary,
    pub wall: Duration,
}

pub struct Streaming {
    pub sandboxes: usize,
    pub placed: Vec<(String, usize)>,
    pub rounds: Vec<StreamRound>,
}

const STREAM_CMD: &str = "echo start; sleep 1; echo end";

/// `n` sandboxes over two node processes behind one gateway, each running one streaming
/// command at the same moment through the gateway; two rounds on the same connections.
pub async fn bench_streaming(n: usize) -> Res<Streaming> {
    let token = ids::random_hex(16);
    let per_node = n.div_ceil(2);
    let pools = [format!("base/egress={per_node}")];
    let nodes: Vec<Daemon> = ["fleet-a", "fleet-b"]
        .iter()
        .map(|name| {
            Daemon::node_with(&NodeSpec {
                token: &token,
                name,
                pools: &pools,
                extra: &[],
            })
        })
        .collect::<Res<_>>()?;
    for d in &nodes {
        wait_pool(
            &NodeConn::new(&d.address, &token)?,
            &egress(),
            per_node as u32,
        )
        .await?;
    }
    let token_file = nodes[0].dir.path().join("token");
    let mut extra = vec![
        "--node-token-file".to_string(),
        token_file.display().to_string(),
    ];
    for d in &nodes {
        extra.push("--node".into());
        extra.push(d.address.clone());
    }
    let gw = Daemon::gateway_with(&[], &extra)?;
    let http = reqwest::Client::new();
    // Let the gateway learn both nodes' pools before routing creates.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut clients = Vec::new();
    let mut placed: std::collections::BTreeMap<String, usize> = Default::default();
    for _ in 0..n {
        let sb = e2b_create_sandbox(&http, &gw.address).await?;
        *placed.entry(sb.node.clone()).or_default() += 1;
        let mut envd = Envd::new(Via::Gateway {
            addr: host_port(&gw.address),
            id: sb.id,
            token: sb.jwt,
        });
        envd.connect().await?;
        clients.push(envd);
    }
    let mut rounds = Vec::new();
    for _ in 0..2 {
        let barrier = Arc::new(tokio::sync::Barrier::new(clients.len()));
        let mut tasks = tokio::task::JoinSet::new();
        let start = Instant::now();
        for mut envd in clients.drain(..) {
            let barrier = barrier.clone();
            tasks.spawn(async move {
                barrier.wait().await;
                let t = Instant::now();
                let outcome = envd.run(STREAM_CMD).await.and_then(|ran| {
                    let out = String::from_utf8_lossy(&ran.stdout).to_string();
                    if ran.exit_code != 0 || out != "start\nend\n" {
                        return Err(format!(
                            "exit {} with stdout {out:?} stderr {:?}",
                            ran.exit_code,
                            String::from_utf8_lossy(&ran.stderr)
                        )
                        .into());
                    }
                    ran.first_stdout
                        .map(|f| f.duration_since(t))
                        .ok_or_else(|| "no stdout".into())
                });
                (envd, outcome)
            });
        }
        let (mut ttfb, mut errors, mut first_error) = (Vec::new(), 0, None);
        while let Some(joined) = tasks.join_next().await {
            let (envd, outcome) = joined.context("a streaming task")?;
            clients.push(envd);
            match outcome {
                Ok(d) => ttfb.push(d),
                Err(e) => {
                    errors += 1;
                    first_error.get_or_insert_with(|| e.to_string());
                }
            }
        }
        rounds.push(StreamRound {
            errors,
            first_error,
            ttfb: summarize(ttfb),
            wall: start.elapsed(),
        });
    }
    drop(clients);
    gw.stop();
    for d in nodes {
        d.stop();
    }
    Ok(Streaming {
        sandboxes: n,
        placed: placed.into_iter().collect(),
        rounds,
    })
}

pub fn render_streaming(o: &mut String, s: &Streaming) {
    let _ = writeln!(
        o,
        "## {} concurrent streaming commands across a fleet\n",
        s.sandboxes
    );
    let placed = s
        .placed
        .iter()
        .map(|(n, c)| format!("{c} on {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(
        o,
        "Method: two `sandbox-gateway node` processes (a fleet of two, both on this one \
         machine, so they share its {} cores) with warm pools of `base/egress`, behind one \
         `sandbox-gateway serve --node A --node B`. {} sandboxes are created through e2b (one \
         command per sandbox; placed {placed}), and each gets its own HTTP/1.1 connection to \
         the gateway, opened beforehand. Then all {} start `{STREAM_CMD}` at the same moment \
         (a barrier), each a Connect `process.Process/Start` with the `E2b-Sandbox-Id` headers \
         and its envdAccessToken, read as a stream. Time to first byte is from sending the \
         request to the first stdout event (`start`); an error is any failed request, broken \
         stream, non-zero exit or stdout other than `start\\nend\\n`. Round 1 is each \
         sandbox's first command (the gateway resolves its route and opens tunnels to the \
         nodes); round 2 repeats it on the same connections.\n",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        s.sandboxes,
        s.sandboxes
    );
    let _ = writeln!(
        o,
        "| round | commands | errors | first stdout p50 | p90 | p99 | all done after |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|");
    for (i, r) in s.rounds.iter().enumerate() {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} |",
            i + 1,
            r.ttfb.n + r.errors,
            r.errors,
            ms(r.ttfb.p50),
            ms(r.ttfb.p90),
            ms(r.ttfb.p99),
            ms(r.wall)
        );
    }
    for (i, r) in s.rounds.iter().enumerate() {
        if let Some(e) = &r.first_error {
            let _ = writeln!(o, "\nRound {} failed first with: `{e}`", i + 1);
        }
    }
    let _ = writeln!(
        o,
        "\nTarget: 0 errors. The command sleeps 1 s between its two lines, so \"all done \
         after\" is at least 1 s; the first-stdout times show how long {} `bash -l` spawns take \
         to get going on {} shared cores, plus the path through the gateway.\n",
        s.sandboxes,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
}
