//! Warm claims straight to one node, and e2b create/kill over HTTP against the gateway.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sandbox_gateway::dispatch::client::NodeConn;
use sandbox_gateway::model::ids;
use sandbox_gateway::proto;

use crate::common::*;

pub struct ClaimBench {
    pub sequential: Summary,
    pub release: Summary,
    pub concurrent: Summary,
    pub per_second: f64,
    pub rounds: usize,
}

/// Warm claims straight to one node: rounds of up to `per_round` claims drawn from a full
/// pool (cold starts are not counted), each round released and the pool refilled.
pub async fn bench_node_claims(samples: usize, pool: u32, per_round: usize) -> Res<ClaimBench> {
    let token = ids::random_hex(16);
    let node = Daemon::node(&token, pool)?;
    let conn = NodeConn::new(&node.address, &token)?;
    wait_full(&conn, pool).await?;
    // Warm the connection.
    conn.info(Duration::from_secs(5)).await?;

    let mut claims = Vec::new();
    let mut releases = Vec::new();
    let mut rounds = 0;
    while claims.len() < samples {
        rounds += 1;
        let mut ids = Vec::new();
        for _ in 0..per_round {
            let mut c = conn.client();
            let t = Instant::now();
            let reply = c.claim(claim_request()).await?.into_inner();
            let took = t.elapsed();
            let id = reply.sandbox.map(|s| s.id).unwrap_or_default();
            if reply.warm {
                claims.push(took);
            }
            ids.push(id);
        }
        for id in ids {
            let mut c = conn.client();
            let t = Instant::now();
            c.release(proto::SandboxRef { id }).await?;
            releases.push(t.elapsed());
        }
        wait_full(&conn, pool).await?;
    }

    let mut concurrent = Vec::new();
    let mut rate = Vec::new();
    while concurrent.len() < samples {
        let taken = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..16 {
            let conn = conn.clone();
            let taken = taken.clone();
            tasks.spawn(async move {
                let mut out = Vec::new();
                while taken.fetch_add(1, Ordering::Relaxed) < per_round {
                    let mut c = conn.client();
                    let t = Instant::now();
                    let reply = c.claim(claim_request()).await.map(|r| r.into_inner());
                    if let Ok(reply) = reply {
                        out.push((
                            t.elapsed(),
                            reply.warm,
                            reply.sandbox.map(|s| s.id).unwrap_or_default(),
                        ));
                    }
                }
                out
            });
        }
        let mut ids = Vec::new();
        let mut warm = 0;
        while let Some(Ok(out)) = tasks.join_next().await {
            for (took, was_warm, id) in out {
                if was_warm {
                    concurrent.push(took);
                    warm += 1;
                }
                ids.push(id);
            }
        }
        rate.push(warm as f64 / start.elapsed().as_secs_f64());
        for id in ids {
            conn.client().release(proto::SandboxRef { id }).await?;
        }
        wait_full(&conn, pool).await?;
    }
    node.stop();
    rate.sort_by(f64::total_cmp);
    Ok(ClaimBench {
        sequential: summarize(claims),
        release: summarize(releases),
        concurrent: summarize(concurrent),
        per_second: rate[rate.len() / 2],
        rounds,
    })
}

/// Waits until the embedded node of the gateway `gw` holds `pool` warm `base/egress/small`
/// sandboxes. Asked of the node itself: the gateway's gauge lags by up to its info interval
/// (a second), and a round started on a stale "full" would boot most of its sandboxes cold.
pub async fn wait_gateway_warm(gw: &Daemon, pool: u32) -> Res<()> {
    let (addr, token) = gw.embedded_node()?;
    let conn = NodeConn::new(&addr, &token)?;
    let key: sandbox_gateway::model::PoolKey = "base/egress/small".parse()?;
    wait_pool(&conn, &key, pool).await
}

/// Waits until the gateway's metrics show `count` warm sandboxes in `pool` (its label, e.g.
/// `code-interpreter/egress/medium`).
pub async fn wait_pool_warm(
    http: &reqwest::Client,
    url: &str,
    pool: &str,
    count: u32,
    within: Duration,
) -> Res<()> {
    // `pool` may be a whole key or its start (a built template's id and a dot).
    let head = format!("sandbox_gateway_warm_sandboxes{{pool=\"{pool}");
    let tail = format!(" {count}");
    let deadline = Instant::now() + within;
    loop {
        let text = http
            .get(format!("{url}/metrics"))
            .send()
            .await?
            .text()
            .await?;
        if text
            .lines()
            .any(|l| l.starts_with(&head) && l.ends_with(&tail))
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("the gateway's warm pool {pool} did not fill to {count}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub struct E2bBench {
    pub create: Summary,
    pub kill: Summary,
    /// Concurrent creates: (concurrency, latencies, creates per second).
    pub concurrent: Vec<(usize, Summary, f64)>,
}

/// The concurrencies the e2b create bench runs at besides one at a time.
pub const CONCURRENCIES: [usize; 2] = [16, 50];

pub async fn e2b_create(http: &reqwest::Client, url: &str) -> Res<(Duration, String)> {
    let t = Instant::now();
    let res = http
        .post(format!("{url}/v2/sandboxes"))
        .header("X-API-KEY", "e2b_bench")
        .json(&serde_json::json!({"templateID": "base", "metadata": {}, "envVars": {}}))
        .send()
        .await?;
    let status = res.status();
    let body: serde_json::Value = res.json().await?;
    let took = t.elapsed();
    if status != 201 {
        return Err(format!("create answered {status}: {body}").into());
    }
    Ok((
        took,
        body["sandboxID"].as_str().unwrap_or_default().to_string(),
    ))
}

pub async fn e2b_kill(http: &reqwest::Client, url: &str, id: &str) -> Res<Duration> {
    let t = Instant::now();
    let res = http
        .delete(format!("{url}/sandboxes/{id}"))
        .header("X-API-KEY", "e2b_bench")
        .send()
        .await?;
    let took = t.elapsed();
    if res.status() != 204 {
        return Err(format!("kill answered {}", res.status()).into());
    }
    Ok(took)
}

/// e2b create→kill over HTTP against `serve` with its embedded node: rounds of creates from
/// a full warm pool, as the SDK sends them (keep-alive HTTP/1.1, JSON bodies).
pub async fn bench_e2b(samples: usize, pool: u32, per_round: usize) -> Res<E2bBench> {
    let gw = Daemon::gateway(pool)?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(32)
        .build()?;
    wait_gateway_warm(&gw, pool).await?;
    let (mut creates, mut kills) = (Vec::new(), Vec::new());
    while creates.len() < samples {
        let mut ids = Vec::new();
        for _ in 0..per_round {
            let (took, id) = e2b_create(&http, &gw.address).await?;
            creates.push(took);
            ids.push(id);
        }
        for id in ids {
            kills.push(e2b_kill(&http, &gw.address, &id).await?);
        }
        wait_gateway_warm(&gw, pool).await?;
    }
    let mut concurrent = Vec::new();
    for level in CONCURRENCIES {
        let (latencies, per_second) =
            concurrent_creates(&http, &gw, samples, pool, per_round, level).await?;
        concurrent.push((level, latencies, per_second));
    }
    gw.stop();
    Ok(E2bBench {
        create: summarize(creates),
        kill: summarize(kills),
        concurrent,
    })
}

/// Rounds of `per_round` creates at concurrency `level` from a full pool, each round killed
/// and the pool refilled before the next: (latencies, median creates per second).
async fn concurrent_creates(
    http: &reqwest::Client,
    gw: &Daemon,
    samples: usize,
    pool: u32,
    per_round: usize,
    level: usize,
) -> Res<(Summary, f64)> {
    let url = gw.address.as_str();
    let mut latencies = Vec::new();
    let mut rate = Vec::new();
    while latencies.len() < samples {
        let taken = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..level {
            let (http, url, taken) = (http.clone(), url.to_string(), taken.clone());
            tasks.spawn(async move {
                let mut out = Vec::new();
                while taken.fetch_add(1, Ordering::Relaxed) < per_round {
                    if let Ok(r) = e2b_create(&http, &url).await {
                        out.push(r);
                    }
                }
                out
            });
        }
        let mut ids = Vec::new();
        while let Some(Ok(out)) = tasks.join_next().await {
            for (took, id) in out {
                latencies.push(took);
                ids.push(id);
            }
        }
        rate.push(ids.len() as f64 / start.elapsed().as_secs_f64());
        for id in ids {
            e2b_kill(http, url, &id).await?;
        }
        wait_gateway_warm(gw, pool).await?;
    }
    rate.sort_by(f64::total_cmp);
    Ok((summarize(latencies), rate[rate.len() / 2]))
}

fn row(o: &mut String, name: &str, s: &Summary, anchor: &str) {
    let _ = writeln!(
        o,
        "| {name} | {} | {} | {} | {} | {} | {anchor} |",
        s.n,
        ms(s.p50),
        ms(s.p90),
        ms(s.p99),
        ms(s.max)
    );
}

/// "Warm claim directly against one node".
pub fn render_claims(o: &mut String, c: &ClaimBench, pool: u32, per_round: usize) {
    let _ = writeln!(
        o,
        "## Warm claim directly against one node (loopback gRPC)\n"
    );
    let _ = writeln!(
        o,
        "Method: one `sandbox-gateway node` process with a warm pool of {pool} `base` sandboxes \
         (each a booted sandbox: supervisor, init and agent in their own namespaces). The driver sends `Claim` over one multiplexed loopback \
         gRPC connection with the fleet token and times each call from send to reply. A round \
         takes {per_round} claims from the full pool, then releases them and waits until the \
         pool has refilled, so every timed claim is a warm hand-over (nothing boots on that \
         path); claims that found the pool empty are not counted. Release is timed separately: \
         the node answers once the claim is gone from its index and destroys the instance \
         (processes, cgroups, disk image, instance directory) in the background.\n"
    );
    let _ = writeln!(
        o,
        "| measurement | samples | p50 | p90 | p99 | max | anchor |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|");
    row(
        o,
        "warm claim, sequential",
        &c.sequential,
        "sandboxd warm claim 0.2–0.7 ms; target p50 ≤ 0.3 ms",
    );
    row(o, "warm claim, 16 concurrent", &c.concurrent, "—");
    row(o, "release (sequential)", &c.release, "—");
    let _ = writeln!(
        o,
        "\nThroughput at concurrency 16: **{:.0} warm claims/s** (median over rounds of {per_round} claims; \
         a round ends when {per_round} claims are served, so this is the rate of draining a warm \
         pool, not a sustained rate, which is bounded by how fast the node boots replacements). \
         Sequential rounds: {}.\n\n\
         The tail (p99, max) includes moments when background work — booting replacements, \
         destroying the last round's sandboxes — competes with the claim path for the same \
         cores. The node holds its refill back while claims keep coming (20 ms after the last \
         one, 500 ms at most, and at once when a pool is nearly empty: below an eighth of its target \
         or one refill round), destroys \
         two sandboxes at a time, and writes claim records to its index in batches off the \
         claim path.\n",
        c.per_second, c.rounds
    );
}

/// "e2b create and kill over HTTP"; the ratio needs the direct claims of the same run.
pub fn render_e2b(
    o: &mut String,
    e: &E2bBench,
    c: Option<&ClaimBench>,
    pool: u32,
    per_round: usize,
) {
    let _ = writeln!(o, "## e2b create and kill over HTTP\n");
    let _ = writeln!(
        o,
        "Method: `sandbox-gateway serve` with its embedded node (warm pool of {pool}), driven \
         over loopback HTTP/1.1 with keep-alive the way the SDK calls it: \
         `POST /v2/sandboxes` with `{{\"templateID\":\"base\",\"metadata\":{{}},\"envVars\":{{}}}}` \
         and `X-API-KEY`, timed from send until the 201 body is read; then \
         `DELETE /sandboxes/{{id}}` (204). Rounds of {per_round} creates from a full pool, killed \
         afterwards, the pool refilled between rounds (as the node itself reports it: the \
         gateway's gauge lags by up to a second, and rounds started on it once booted most of \
         their sandboxes cold, which was the one-second tail earlier runs showed). The same \
         rounds run at concurrency 16 and 50. A create is API-key check, JSON decode, \
         claim routing, the node's gRPC claim, signing the envd access token, and the JSON reply.\n"
    );
    let _ = writeln!(
        o,
        "| measurement | samples | p50 | p90 | p99 | max | anchor |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|");
    row(
        o,
        "create, sequential",
        &e.create,
        "e2b ~150 ms start (vendor); cocoonstack warm claim through Kubernetes p50 33 ms; target p50 ≤ 1 ms",
    );
    for (level, latencies, _) in &e.concurrent {
        let target = match level {
            16 => "target p99 ≤ 50 ms",
            50 => "target p95 ≤ 100 ms; CubeSandbox p95 508 ms at 50 (published, booting microVMs)",
            _ => "—",
        };
        row(o, &format!("create, {level} concurrent"), latencies, target);
    }
    row(o, "kill, sequential", &e.kill, "—");
    let share = c
        .map(|c| {
            let ratio = e.create.p50.as_secs_f64() / c.sequential.p50.as_secs_f64().max(1e-9);
            format!(
                " The gateway's share: HTTP create p50 / direct node claim p50 = **{ratio:.2}×** (target ≤ 2×)."
            )
        })
        .unwrap_or_default();
    let rates = e
        .concurrent
        .iter()
        .map(|(level, _, r)| format!("**{r:.0} creates/s** at concurrency {level}"))
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(
        o,
        "\nThroughput: {rates} (medians over rounds, draining a warm pool).{share}\n"
    );
}
