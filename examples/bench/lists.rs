//! Lists at scale: 50,000 sandboxes listed through the facade's HTTP routes (JSON and Table,
//! whole and in `limit=500` pages), today's buffered body side by side with the streamed body
//! made from cached object forms; latency, gateway memory growth, and the e2b listing.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use actix_web::{HttpRequest, HttpResponse, web};
use sandbox_gateway::dispatch::{Dispatcher, DispatcherConfig};
use sandbox_gateway::facade::list_body::{Chunks, Shape};
use sandbox_gateway::facade::selectors::{FieldSelector, LabelSelector};
use sandbox_gateway::facade::{self, Facade, objects};

use crate::common::*;
use crate::kube::synthetic_view;
use crate::{PEAK, reset_peak};

const KEY: &str = "e2b_bench";
const TABLE: &str = "application/json;as=Table;g=meta.k8s.io;v=v1,application/json";

/// One way of listing, measured.
pub struct Way {
    pub name: &'static str,
    /// The facade's route as it is (the others are the paths it replaced).
    pub current: bool,
    pub cold: Duration,
    /// The gateway's resident growth during the cold list (the streamed path keeps what it
    /// rendered).
    pub cold_growth: u64,
    pub warm: Summary,
    pub bytes: usize,
    /// Most the gateway's resident memory grew during one list (VmHWM after − VmRSS before).
    pub rss_growth: u64,
    /// Most heap bytes the list held at once beyond what was live before it.
    pub heap_peak: u64,
}

pub struct Pages {
    pub name: &'static str,
    pub first: Summary,
    pub continued: Summary,
    pub rss_growth: u64,
    pub pages: usize,
}

/// The e2b listing of the same view.
pub struct E2bLists {
    pub all: Summary,
    pub all_cold: Duration,
    pub all_bytes: usize,
    pub all_growth: u64,
    pub pages: Summary,
}

pub struct ListBench {
    pub e2b: E2bLists,
    pub sandboxes: usize,
    pub nodes: usize,
    pub runs: usize,
    pub ways: Vec<Way>,
    pub pages: Vec<Pages>,
    pub in_process: Vec<(&'static str, Summary, u64)>,
    /// The JSON list's byte count over a bare loopback TCP connection (no HTTP), and what
    /// that took: the floor under any HTTP server on this machine.
    pub floor: (usize, Summary),
}

/// `bytes` bytes written to a loopback TCP connection in one call and read by a task of this
/// process in 256 KiB reads, `runs` times (a fresh connection each).
async fn tcp_floor(bytes: usize, runs: usize) -> Res<Summary> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let body = bytes::Bytes::from(vec![b'x'; bytes]);
    let writer = tokio::spawn(async move {
        for _ in 0..runs {
            let (mut s, _) = listener.accept().await?;
            s.set_nodelay(true)?;
            s.write_all(&body).await?;
        }
        std::io::Result::Ok(())
    });
    let mut times = Vec::new();
    let mut buf = vec![0u8; 256 << 10];
    for _ in 0..runs {
        let t = Instant::now();
        let mut c = tokio::net::TcpStream::connect(addr).await?;
        let mut n = 0;
        while n < bytes {
            let k = c.read(&mut buf).await?;
            if k == 0 {
                return Err("the floor's writer closed early".into());
            }
            n += k;
        }
        times.push(t.elapsed());
    }
    writer.await??;
    Ok(summarize(times))
}

fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Resets the process's peak resident memory to what it holds now (`clear_refs` 5) and
/// returns what it holds, in bytes.
fn rss_mark() -> u64 {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    status_kib("VmRSS:") * 1024
}

fn rss_peak() -> u64 {
    status_kib("VmHWM:") * 1024
}

/// Today's path, for the side by side: the page serialized whole into one buffer and sent as
/// one body (what the facade's list route did before bodies were streamed).
async fn buffered(f: web::Data<Facade>, req: HttpRequest) -> HttpResponse {
    let table = asks_table(&req);
    let Some(snap) = whole_view(&f).await else {
        return HttpResponse::InternalServerError().finish();
    };
    let body = if table {
        objects::table(&snap.entries, snap.revision, None, None)
    } else {
        objects::list(&snap.entries, snap.revision, None, None)
    };
    HttpResponse::Ok()
        .content_type("application/json")
        .body(body)
}

/// The streamed path as it was before chunks were made off the writing thread, for the side
/// by side: the same chunks, made on the connection's own thread as it takes each one.
async fn on_the_writer(f: web::Data<Facade>, req: HttpRequest) -> HttpResponse {
    let shape = if asks_table(&req) {
        Shape::Table {
            now: chrono::Utc::now(),
        }
    } else {
        Shape::Objects
    };
    let Some(snap) = whole_view(&f).await else {
        return HttpResponse::InternalServerError().finish();
    };
    let n = snap.entries.len();
    let chunks = Chunks::new(Arc::new(snap), 0..n, shape, None, None);
    HttpResponse::Ok()
        .content_type("application/json")
        .streaming(futures::stream::iter(chunks.map(Ok::<_, std::io::Error>)))
}

/// The unfiltered snapshot both side-by-side routes list.
async fn whole_view(f: &Facade) -> Option<facade::ListSnapshot> {
    f.snapshot(None, &LabelSelector::default(), &FieldSelector::default())
        .await
        .ok()
}

fn asks_table(req: &HttpRequest) -> bool {
    req.headers()
        .get("Accept")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

struct Got {
    took: Duration,
    bytes: usize,
    rss_growth: u64,
    heap_peak: u64,
    next: Option<String>,
}

/// One GET read to the end; the body is counted and dropped as it arrives (kept only for a
/// page, to read its continue token), so the client adds little to the process's memory.
async fn get(c: &reqwest::Client, url: &str, table: bool) -> Res<Got> {
    let paged = url.contains("limit=");
    let rss = rss_mark();
    let heap = reset_peak();
    let t = Instant::now();
    let mut req = c.get(url).bearer_auth(KEY);
    if table {
        req = req.header("Accept", TABLE);
    }
    let mut res = req.send().await?;
    if !res.status().is_success() {
        return Err(format!("{url}: {}", res.status()).into());
    }
    let (mut bytes, mut kept) = (0, Vec::new());
    while let Some(ch) = res.chunk().await? {
        bytes += ch.len();
        if paged {
            kept.extend_from_slice(&ch);
        }
    }
    let took = t.elapsed();
    let heap_peak = PEAK.load(Ordering::Relaxed).saturating_sub(heap);
    let rss_growth = rss_peak().saturating_sub(rss);
    let next = if paged {
        let v: serde_json::Value = serde_json::from_slice(&kept)?;
        v["metadata"]["continue"].as_str().map(str::to_string)
    } else {
        None
    };
    Ok(Got {
        took,
        bytes,
        rss_growth,
        heap_peak,
        next,
    })
}

/// 50,000 sandboxes (`nodes` × `per_node`) in a read view behind an in-process HTTP server
/// that serves the facade's routes, plus today's buffered path on `/buffered`.
pub async fn bench_lists(nodes: usize, per_node: usize, runs: usize) -> Res<ListBench> {
    let d = Dispatcher::new(DispatcherConfig::default(), "bench");
    synthetic_view(d.view(), nodes, per_node);
    let dir = tempfile::tempdir()?;
    let keyfile = dir.path().join("keys");
    std::fs::write(&keyfile, format!("{KEY} *\n"))?;
    let keys = web::Data::new(sandbox_gateway::e2b::auth::ApiKeys::new(
        Some(keyfile),
        false,
    )?);
    let f = web::Data::new(Facade::new(
        d.clone(),
        facade::auth::Auth::local(keys.clone()),
    ));
    let served = f.clone();
    let server = actix_web::HttpServer::new(move || {
        actix_web::App::new()
            .app_data(served.clone())
            .route("/buffered", web::get().to(buffered))
            .route("/on-the-writer", web::get().to(on_the_writer))
            .configure(facade::configure)
    })
    .workers(1)
    // As the gateway's listeners are.
    .tcp_nodelay(true)
    .bind("127.0.0.1:0")?;
    let addr = server.addrs()[0];
    let handle = server.run();
    let stop = handle.handle();
    tokio::spawn(handle);
    let c = reqwest::Client::new();
    let streamed = format!("http://{addr}/apis/agents.x-k8s.io/v1beta1/sandboxes");
    let old = format!("http://{addr}/buffered");
    let writer = format!("http://{addr}/on-the-writer");

    // Streamed first, so that its cold list is the first to render each object; then the
    // warm lists take turns, one of each way per round, so that a busy moment of this shared
    // machine falls on every way alike.
    let listed = [
        ("streamed JSON `SandboxList`", &streamed, false),
        ("streamed `Table`", &streamed, true),
        (
            "streamed JSON, chunks made on the writing thread",
            &writer,
            false,
        ),
        (
            "streamed `Table`, chunks made on the writing thread",
            &writer,
            true,
        ),
        ("today's buffered JSON `SandboxList`", &old, false),
        ("today's buffered `Table`", &old, true),
    ];
    let mut cold = Vec::new();
    for (_, url, table) in listed {
        cold.push(get(&c, url, table).await?);
    }
    let mut warm: Vec<(Vec<Duration>, u64, u64)> = vec![(Vec::new(), 0, 0); listed.len()];
    for _ in 0..runs {
        for ((_, url, table), (times, growth, heap)) in listed.iter().zip(&mut warm) {
            let g = get(&c, url, *table).await?;
            times.push(g.took);
            *growth = (*growth).max(g.rss_growth);
            *heap = (*heap).max(g.heap_peak);
        }
    }
    let ways: Vec<Way> = listed
        .iter()
        .zip(cold)
        .zip(warm)
        .map(|(((name, url, _), cold), (times, growth, heap))| Way {
            name,
            current: *url == &streamed,
            cold: cold.took,
            cold_growth: cold.rss_growth,
            warm: summarize(times),
            bytes: cold.bytes,
            rss_growth: growth,
            heap_peak: heap,
        })
        .collect();

    let mut pages = Vec::new();
    for (name, table) in [("JSON", false), ("Table", true)] {
        let (mut first, mut continued, mut growth, mut count) = (Vec::new(), Vec::new(), 0, 0);
        for _ in 0..3 {
            let mut url = format!("{streamed}?limit=500");
            count = 0;
            loop {
                let g = get(&c, &url, table).await?;
                growth = growth.max(g.rss_growth);
                if count == 0 {
                    first.push(g.took);
                } else {
                    continued.push(g.took);
                }
                count += 1;
                match g.next {
                    Some(t) => url = format!("{streamed}?limit=500&continue={t}"),
                    None => break,
                }
            }
        }
        pages.push(Pages {
            name,
            first: summarize(first),
            continued: summarize(continued),
            rss_growth: growth,
            pages: count,
        });
    }
    stop.stop(true).await;
    let e2b = bench_e2b(&d, keys, runs).await?;

    // In process, no HTTP: the same snapshot serialized whole, and streamed chunk by chunk
    // (each chunk dropped once made, as the connection would).
    let mut in_process = Vec::new();
    let (labels, fields) = (LabelSelector::default(), FieldSelector::default());
    for (name, shape, whole) in [
        ("JSON, one buffer (today)", Shape::Objects, true),
        ("JSON, streamed chunks", Shape::Objects, false),
        (
            "Table, one buffer (today)",
            Shape::Table {
                now: chrono::Utc::now(),
            },
            true,
        ),
        (
            "Table, streamed chunks",
            Shape::Table {
                now: chrono::Utc::now(),
            },
            false,
        ),
    ] {
        let (mut times, mut peak) = (Vec::new(), 0);
        for _ in 0..runs {
            let base = reset_peak();
            let t = Instant::now();
            let snap = Arc::new(f.snapshot(None, &labels, &fields).await?);
            let n = snap.entries.len();
            let bytes = match (whole, shape) {
                (true, Shape::Objects) => {
                    objects::list(&snap.entries, snap.revision, None, None).len()
                }
                (true, Shape::Table { .. }) => {
                    objects::table(&snap.entries, snap.revision, None, None).len()
                }
                (false, _) => Chunks::new(snap.clone(), 0..n, shape, None, None)
                    .map(|c| c.len())
                    .sum(),
            };
            times.push(t.elapsed());
            std::hint::black_box(bytes);
            peak = peak.max(PEAK.load(Ordering::Relaxed).saturating_sub(base));
        }
        in_process.push((name, summarize(times), peak));
    }
    let json_bytes = ways.first().map_or(0, |w| w.bytes);
    let floor = (json_bytes, tcp_floor(json_bytes, runs).await?);
    d.shutdown().await;
    Ok(ListBench {
        e2b,
        sandboxes: nodes * per_node,
        nodes,
        runs,
        ways,
        pages,
        in_process,
        floor,
    })
}

/// `GET /sandboxes` (every running sandbox, newest first) and `GET /v2/sandboxes` pages of
/// 100 through `X-Next-Token`, on an e2b server over the same view.
async fn bench_e2b(
    d: &Dispatcher,
    keys: web::Data<sandbox_gateway::e2b::auth::ApiKeys>,
    runs: usize,
) -> Res<E2bLists> {
    // The lists never touch secrets; the state needs a store all the same.
    let secrets_dir = tempfile::tempdir()?;
    let state = web::Data::new(sandbox_gateway::e2b::E2b {
        dispatcher: d.clone(),
        tokens: sandbox_gateway::e2b::tokens::EnvdTokens::new(&[7u8; 32])?,
        domain: None,
        idempotency: Default::default(),
        proxy: Default::default(),
        upload_max_bytes: 1 << 30,
        secrets: std::sync::Arc::new(
            sandbox_gateway::secrets::SecretStore::open(
                &secrets_dir.path().join("secrets"),
                &secrets_dir.path().join("secrets-key"),
            )?
            .0,
        ),
        volumes: None,
    });
    let server = actix_web::HttpServer::new(move || {
        actix_web::App::new()
            .app_data(state.clone())
            .app_data(keys.clone())
            .configure(sandbox_gateway::e2b::configure)
    })
    .workers(1)
    // As the gateway's listeners are.
    .tcp_nodelay(true)
    .bind("127.0.0.1:0")?;
    let addr = server.addrs()[0];
    let handle = server.run();
    let stop = handle.handle();
    tokio::spawn(handle);
    let c = reqwest::Client::new();
    let read = |url: String| {
        let c = c.clone();
        async move {
            let rss = rss_mark();
            let t = Instant::now();
            let mut res = c.get(&url).header("X-API-KEY", KEY).send().await?;
            if !res.status().is_success() {
                return Err(format!("{url}: {}", res.status()).into());
            }
            let next = res
                .headers()
                .get("X-Next-Token")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let mut bytes = 0;
            while let Some(ch) = res.chunk().await? {
                bytes += ch.len();
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((
                t.elapsed(),
                bytes,
                rss_peak().saturating_sub(rss),
                next,
            ))
        }
    };
    let all = format!("http://{addr}/sandboxes");
    let (all_cold, all_bytes, _, _) = read(all.clone()).await?;
    let (mut times, mut growth) = (Vec::new(), 0);
    for _ in 0..runs {
        let (t, _, g, _) = read(all.clone()).await?;
        times.push(t);
        growth = growth.max(g);
    }
    let mut pages = Vec::new();
    for _ in 0..2 {
        let mut url = format!("http://{addr}/v2/sandboxes?limit=100");
        // Fifty pages (5,000 sandboxes) per walk: each page filters and orders the whole view.
        for _ in 0..50 {
            let (t, _, _, next) = read(url.clone()).await?;
            pages.push(t);
            match next {
                Some(tok) => url = format!("http://{addr}/v2/sandboxes?limit=100&nextToken={tok}"),
                None => break,
            }
        }
    }
    stop.stop(true).await;
    Ok(E2bLists {
        all: summarize(times),
        all_cold,
        all_bytes,
        all_growth: growth,
        pages: summarize(pages),
    })
}

/// "Lists at scale".
pub fn render_lists(o: &mut String, b: &ListBench) {
    let _ = writeln!(o, "## Lists at scale (Kubernetes facade)\n");
    let _ = writeln!(
        o,
        "Method: a read view of {} nodes × {} sandboxes = {} (built by applying node inventory \
         events, as node streams do) behind an HTTP server in the bench's own process (one \
         actix worker, `TCP_NODELAY` as in the gateway, plain HTTP on loopback, an admin bearer \
         key) serving the facade's routes. \
         `GET /apis/agents.x-k8s.io/v1beta1/sandboxes` (all namespaces) is read to the end by a \
         keep-alive client that counts and drops the body as it arrives; `Table` is asked with \
         `Accept: {TABLE}`. \"Today's buffered\" is the path lists took before (the page \
         serialized whole into one buffer, sent as one body), served side by side on another \
         route over the same view; \"streamed\" is the facade's route now: each entry's object is \
         serialized once per revision and kept with the view entry, and the body is written in \
         chunks of {} KiB, each made on a blocking-pool thread while the connection writes the \
         one before (one such maker per core; with all of them busy, a body is made on its \
         connection's thread; a Table row's age is written per request); \"chunks made on the writing \
         thread\" is the same body made as the connection takes each chunk, as the route did \
         before, on a third route. \
         Cold is the first list after the view was built (nothing rendered yet); then {} warm \
         lists each, taking turns (one of each way per round, so that a busy moment of this \
         shared machine falls on every way alike). Memory: the gateway is this process, so its growth is VmHWM after the list \
         minus VmRSS before (peak reset with `/proc/self/clear_refs`); heap is the most bytes \
         held at once beyond what was live before, by the counting allocator. Pages: \
         `limit=500` then `continue` until the end, three walks (so three first pages).\n",
        b.nodes,
        b.sandboxes / b.nodes.max(1),
        b.sandboxes,
        sandbox_gateway::httpx::BODY_CHUNK / 1024,
        b.runs
    );
    let _ = writeln!(
        o,
        "| list of {} over HTTP | cold (RSS growth) | p50 | p90 | body | RSS growth | heap peak |",
        b.sandboxes
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|");
    for w in &b.ways {
        let _ = writeln!(
            o,
            "| {} | {} ({:.1} MiB) | {} | {} | {:.1} MiB | {:.1} MiB | {:.1} MiB |",
            w.name,
            ms(w.cold),
            mib(w.cold_growth),
            ms(w.warm.p50),
            ms(w.warm.p90),
            mib(w.bytes as u64),
            mib(w.rss_growth),
            mib(w.heap_peak)
        );
    }
    let _ = writeln!(
        o,
        "\n| `limit=500` pages ({} per walk) | first page p50 | p90 | continued page p50 | p90 | RSS growth |",
        b.pages.first().map_or(0, |p| p.pages)
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|");
    for p in &b.pages {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {:.1} MiB |",
            p.name,
            ms(p.first.p50),
            ms(p.first.p90),
            ms(p.continued.p50),
            ms(p.continued.p90),
            mib(p.rss_growth)
        );
    }
    let _ = writeln!(
        o,
        "\nIn process (no HTTP; the read-view snapshot, then the body):\n"
    );
    let _ = writeln!(o, "| list of {} | p50 | p90 | heap peak |", b.sandboxes);
    let _ = writeln!(o, "|---|---|---|---|");
    for (name, s, peak) in &b.in_process {
        let _ = writeln!(
            o,
            "| {name} | {} | {} | {:.1} MiB |",
            ms(s.p50),
            ms(s.p90),
            mib(*peak)
        );
    }
    let _ = writeln!(
        o,
        "\nThe floor under any HTTP server here, in the same run: the JSON list's {:.1} MiB \
         written to a bare loopback TCP connection in one call and read in 256 KiB reads by \
         this process, p50 {} (p90 {}) over {} connections.",
        mib(b.floor.0 as u64),
        ms(b.floor.1.p50),
        ms(b.floor.1.p90),
        b.runs
    );
    let e = &b.e2b;
    let _ = writeln!(
        o,
        "\ne2b over the same view (an e2b server in the same process, `X-API-KEY` admin key): \
         `GET /sandboxes` lists every running sandbox newest first, each listed sandbox \
         serialized once per revision and streamed like the facade's; `GET /v2/sandboxes` pages \
         of 100 follow `X-Next-Token` (50 pages per walk, two walks).\n"
    );
    let _ = writeln!(
        o,
        "| e2b listing of {} | cold | p50 | p90 | body | RSS growth |",
        b.sandboxes
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|");
    let _ = writeln!(
        o,
        "| `GET /sandboxes` | {} | {} | {} | {:.1} MiB | {:.1} MiB |",
        ms(e.all_cold),
        ms(e.all.p50),
        ms(e.all.p90),
        mib(e.all_bytes as u64),
        mib(e.all_growth)
    );
    let _ = writeln!(
        o,
        "| `GET /v2/sandboxes?limit=100`, per page | — | {} | {} | — | — |",
        ms(e.pages.p50),
        ms(e.pages.p90)
    );
    let _ = writeln!(o);
}
