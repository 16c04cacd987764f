//! The dispatcher's resolution structures and the Kubernetes facade: lists and watches over a
//! synthetic fleet in process, creates over HTTPS against the gateway.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sandbox_gateway::dispatch::client::NodeConn;
use sandbox_gateway::dispatch::owner_index::OwnerIndex;
use sandbox_gateway::dispatch::read_view::ReadView;
use sandbox_gateway::dispatch::registry::NodeHandle;
use sandbox_gateway::dispatch::{ClaimRequest, Dispatcher, DispatcherConfig};
use sandbox_gateway::model::{InventoryChange, InventoryEvent, Phase, PoolKey, SandboxRecord, ids};

use crate::claims::{e2b_create, e2b_kill, wait_gateway_warm};
use crate::common::*;
use crate::{ALLOCATIONS, PEAK, reset_peak};

pub struct FacadeBench {
    pub sandboxes: usize,
    pub nodes: usize,
    pub json: Summary,
    pub json_bytes: usize,
    pub json_peak: u64,
    pub table: Summary,
    pub table_bytes: usize,
    pub table_peak: u64,
    pub change_ns: f64,
    pub resync: Summary,
    pub create: Summary,
    e2b_create: Summary,
}

/// A read view of `nodes` × `per_node` synthetic sandboxes, fed the way node streams feed it.
pub fn synthetic_view(view: &ReadView, nodes: usize, per_node: usize) {
    for n in 0..nodes {
        let name = format!("node-{n}");
        view.stream_started(&name);
        for i in 0..per_node {
            let id = ids::new_claim_id();
            view.apply(
                &name,
                InventoryEvent {
                    change: InventoryChange::Added(record(&id, &name, i)),
                    revision: 0,
                },
            );
        }
        view.apply(
            &name,
            InventoryEvent {
                change: InventoryChange::Synced,
                revision: 0,
            },
        );
    }
}

/// The facade's list path (snapshot of the read view, then serialization) over a synthetic
/// fleet, and what one change costs a watch.
pub async fn bench_facade_list(
    nodes: usize,
    per_node: usize,
    runs: usize,
) -> Res<(FacadeBench, Dispatcher)> {
    use sandbox_gateway::facade::list_body::{Chunks, Shape};
    use sandbox_gateway::facade::{self, objects, selectors};
    let d = Dispatcher::new(DispatcherConfig::default(), "bench");
    synthetic_view(d.view(), nodes, per_node);
    let keys = actix_web::web::Data::new(sandbox_gateway::e2b::auth::ApiKeys::new(None, true)?);
    let f = facade::Facade::new(d.clone(), facade::auth::Auth::local(keys));
    let (labels, fields) = (
        selectors::LabelSelector::default(),
        selectors::FieldSelector::default(),
    );
    let measure = |table: bool| {
        let f = &f;
        let (labels, fields) = (&labels, &fields);
        async move {
            let mut times = Vec::new();
            let (mut bytes, mut peak) = (0, 0);
            // The first run renders every object once (kept with the view's entries); the
            // others are what a list costs from then on.
            for run in 0..=runs {
                let base = reset_peak();
                let t = Instant::now();
                let snap = Arc::new(f.snapshot(None, labels, fields).await?);
                let n = snap.entries.len();
                let shape = if table {
                    Shape::Table {
                        now: chrono::Utc::now(),
                    }
                } else {
                    Shape::Objects
                };
                // Each chunk is dropped once made, as the connection would.
                let body: usize = Chunks::new(snap, 0..n, shape, None, None)
                    .map(|c| c.len())
                    .sum();
                if run == 0 {
                    continue;
                }
                times.push(t.elapsed());
                bytes = body;
                peak = peak.max(PEAK.load(Ordering::Relaxed).saturating_sub(base));
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((summarize(times), bytes, peak))
        }
    };
    let (json, json_bytes, json_peak) = measure(false).await?;
    let (table, table_bytes, table_peak) = measure(true).await?;

    // One sandbox on one node changes: the view applies it and a watcher turns it into a line.
    let (_, mut rx) = d.view().watch(d.view().revision()).map_err(|_| "watch")?;
    let sample = d.view().list(|_| true).0;
    let changes = 2000.min(sample.len());
    let t = Instant::now();
    for r in sample.iter().take(changes) {
        let mut m = (**r).clone();
        m.phase = Phase::Paused;
        d.view().apply(
            &m.node.clone(),
            InventoryEvent {
                change: InventoryChange::Modified(m),
                revision: 0,
            },
        );
        let ev = rx.try_recv().map_err(|_| "missing event")?;
        let line = serde_json::to_vec(&objects::sandbox(&ev.sandbox, ev.revision))?;
        std::hint::black_box(line);
    }
    let change_ns = t.elapsed().as_nanos() as f64 / changes as f64;
    // A node reconnects and resends its whole inventory, one entry changed.
    let mut resync = Vec::new();
    for round in 0..20 {
        let node = format!("node-{round}");
        let mine: Vec<SandboxRecord> = d
            .view()
            .list(|r| r.node == node)
            .0
            .iter()
            .map(|r| (**r).clone())
            .collect();
        let t = Instant::now();
        d.view().stream_started(&node);
        for (i, mut r) in mine.into_iter().enumerate() {
            if i == 0 {
                r.phase = Phase::Running;
                r.deadline += chrono::TimeDelta::seconds(1);
            }
            d.view().apply(
                &node,
                InventoryEvent {
                    change: InventoryChange::Added(r),
                    revision: 0,
                },
            );
        }
        d.view().apply(
            &node,
            InventoryEvent {
                change: InventoryChange::Synced,
                revision: 0,
            },
        );
        resync.push(t.elapsed());
    }
    Ok((
        FacadeBench {
            sandboxes: nodes * per_node,
            nodes,
            json,
            json_bytes,
            json_peak,
            table,
            table_bytes,
            table_peak,
            change_ns,
            resync: summarize(resync),
            create: summarize(Vec::new()),
            e2b_create: summarize(Vec::new()),
        },
        d,
    ))
}

/// Creates through the facade (HTTPS, bearer key) and through e2b on the same gateway.
pub async fn bench_create_paths(samples: usize, pool: u32, fb: &mut FacadeBench) -> Res<()> {
    let gw = Daemon::gateway(pool)?;
    let http = reqwest::Client::builder().build()?;
    let ca = std::fs::read_to_string(gw.dir.path().join("tls/ca.crt"))?;
    let https = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes())?)
        .build()?;
    let kube = gw.kube_address.clone().ok_or("no Kubernetes address")?;
    let (mut facade, mut e2b) = (Vec::new(), Vec::new());
    wait_gateway_warm(&gw, pool).await?;
    let per_round = 50usize;
    while facade.len() < samples {
        let mut names = Vec::new();
        for i in 0..per_round {
            let name = format!("bench-{}-{i}", facade.len());
            // The same pool the e2b creates use (base, with the node's network).
            let body = serde_json::json!({"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                "metadata": {"name": name, "annotations": {"sandbox.cocoonstack.io/net": "egress"}},
                "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "base"}]}}}});
            let t = Instant::now();
            let res = https
                .post(format!(
                    "{kube}/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes"
                ))
                .bearer_auth("e2b_bench")
                .json(&body)
                .send()
                .await?;
            let status = res.status();
            let _ = res.bytes().await?;
            if status != 201 {
                return Err(format!("facade create answered {status}").into());
            }
            facade.push(t.elapsed());
            names.push(name);
        }
        for name in names {
            https
                .delete(format!(
                    "{kube}/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes/{name}"
                ))
                .bearer_auth("e2b_bench")
                .send()
                .await?;
        }
        wait_gateway_warm(&gw, pool).await?;
        let mut ids = Vec::new();
        for _ in 0..per_round {
            let (took, id) = e2b_create(&http, &gw.address).await?;
            e2b.push(took);
            ids.push(id);
        }
        for id in ids {
            e2b_kill(&http, &gw.address, &id).await?;
        }
        wait_gateway_warm(&gw, pool).await?;
    }
    gw.stop();
    fb.create = summarize(facade);
    fb.e2b_create = summarize(e2b);
    Ok(())
}

pub fn record(id: &str, node: &str, i: usize) -> SandboxRecord {
    SandboxRecord {
        id: id.to_string(),
        token: String::new(),
        key: PoolKey::base(),
        claim_ref: format!("ns-{}/box-{i}", i % 50),
        claimed_at: chrono::Utc::now(),
        deadline: chrono::Utc::now(),
        phase: Phase::Running,
        address: "127.0.0.1:1".into(),
        metadata: Default::default(),
        env_vars: Default::default(),
        from_checkpoint: None,
        forked_from: None,
        node: node.to_string(),
        cpu_count: 1,
        memory_bytes: 512 << 20,
        state_dir: String::new(),
        disk_bytes: 0,
        lifecycle: Default::default(),
        network: Default::default(),
        volume_mounts: Vec::new(),
        lease_seconds: 0,
        paused: None,
    }
}

pub struct ResolveBench {
    pub nodes: usize,
    pub per_node: usize,
    pub index_ns: f64,
    pub index_allocs: f64,
    pub view_ns: f64,
    pub view_allocs: f64,
    pub lookups: usize,
    pub live: Summary,
}

/// Resolution by claim id: the owner index and the read view with a synthetic fleet, then
/// the full dispatcher path (index hit + live Get) against a real node.
pub async fn bench_resolve(nodes: usize, per_node: usize, lookups: usize) -> Res<ResolveBench> {
    let token = "bench";
    let handles: Vec<Arc<NodeHandle>> = (0..nodes)
        .map(|i| {
            NodeConn::new(&format!("10.0.{}.{}:7777", i / 250, i % 250), token)
                .map(|c| Arc::new(NodeHandle::new(c)))
        })
        .collect::<Result<_, _>>()?;
    let index = OwnerIndex::new((nodes * per_node * 2) as u64);
    let view = ReadView::new();
    let mut all_ids = Vec::with_capacity(nodes * per_node);
    for (n, h) in handles.iter().enumerate() {
        let name = format!("node-{n}");
        view.stream_started(&name);
        for i in 0..per_node {
            let id = ids::new_claim_id();
            let rec = record(&id, &name, i);
            index.remember(&id, &rec.claim_ref, h);
            view.apply(
                &name,
                InventoryEvent {
                    change: InventoryChange::Added(rec),
                    revision: 0,
                },
            );
            all_ids.push(id);
        }
        view.apply(
            &name,
            InventoryEvent {
                change: InventoryChange::Synced,
                revision: 0,
            },
        );
    }
    // Look up ids in an order unrelated to insertion; worst case is as fast as any for a hash.
    let picks: Vec<&str> = (0..lookups)
        .map(|i| all_ids[(i * 7919 + 13) % all_ids.len()].as_str())
        .collect();

    let a0 = ALLOCATIONS.load(Ordering::Relaxed);
    let t = Instant::now();
    let mut hits = 0usize;
    for id in &picks {
        if index.node_of_id(id).is_some() {
            hits += 1;
        }
    }
    let index_ns = t.elapsed().as_nanos() as f64 / lookups as f64;
    let index_allocs = (ALLOCATIONS.load(Ordering::Relaxed) - a0) as f64 / lookups as f64;
    if hits != lookups {
        return Err(format!("the owner index resolved {hits} of {lookups} ids").into());
    }

    let view_lookups = lookups / 10;
    let a0 = ALLOCATIONS.load(Ordering::Relaxed);
    let t = Instant::now();
    let mut found = 0usize;
    for id in picks.iter().take(view_lookups) {
        if view.find_id(id).is_some() {
            found += 1;
        }
    }
    let view_ns = t.elapsed().as_nanos() as f64 / view_lookups as f64;
    let view_allocs = (ALLOCATIONS.load(Ordering::Relaxed) - a0) as f64 / view_lookups as f64;
    if found != view_lookups {
        return Err(format!("the read view found {found} of {view_lookups} ids").into());
    }

    // The full path against a real node: owner index hit, then a live Get over gRPC.
    let token = ids::random_hex(16);
    let node = Daemon::node(&token, 8)?;
    let d = Dispatcher::new(DispatcherConfig::default(), &token);
    d.add_node(&node.address)?;
    d.wait_for_nodes(1, Duration::from_secs(30)).await?;
    let conn = NodeConn::new(&node.address, &token)?;
    wait_full(&conn, 8).await?;
    let claimed = d
        .claim(ClaimRequest {
            namespace: "bench".into(),
            name: "resolve".into(),
            key: PoolKey::base(),
            ttl_seconds: 600,
            metadata: Default::default(),
            env_vars: Default::default(),
            lifecycle: Default::default(),
            network: Default::default(),
            volume_mounts: Vec::new(),
        })
        .await?;
    let mut live = Vec::new();
    for _ in 0..2000 {
        let t = Instant::now();
        d.get(Some("bench"), &claimed.record.id).await?;
        live.push(t.elapsed());
    }
    d.shutdown().await;
    node.stop();
    Ok(ResolveBench {
        nodes,
        per_node,
        index_ns,
        index_allocs,
        view_ns,
        view_allocs,
        lookups,
        live: summarize(live),
    })
}

/// "Resolving a sandbox by claim id".
pub fn render_resolve(o: &mut String, r: &ResolveBench) {
    let _ = writeln!(o, "## Resolving a sandbox by claim id (dispatcher)\n");
    let _ = writeln!(
        o,
        "Method: a synthetic fleet of {} nodes × {} sandboxes = {} claims, held both in the \
         dispatcher's owner index (a bounded moka cache keyed by claim id) and in its read view \
         (per-node maps built from inventory streams). {} lookups of ids spread over the whole \
         fleet; time is the total divided by the count, allocations are counted by a global \
         allocator wrapper during the lookups. The live row is the full `Dispatcher::get` path \
         against a real node: owner index hit, then the node's `Get` over loopback gRPC \
         (2,000 calls).\n",
        r.nodes,
        r.per_node,
        r.nodes * r.per_node,
        r.lookups
    );
    let _ = writeln!(
        o,
        "| path | time per lookup | allocations per lookup | anchor |"
    );
    let _ = writeln!(o, "|---|---|---|---|");
    let _ = writeln!(
        o,
        "| owner index (claim id → node) | {:.0} ns | {:.2} | reference owner index 39 µs / 217 KB per Get; target ≤ 10 µs, O(1) allocation |",
        r.index_ns, r.index_allocs
    );
    let _ = writeln!(
        o,
        "| read view (claim id → record, scanning {} node maps) | {:.0} ns | {:.2} | reference pre-index List scan 2.49 ms / 36 MB |",
        r.nodes, r.view_ns, r.view_allocs
    );
    let _ = writeln!(
        o,
        "| live `Dispatcher::get` (index hit + node Get RPC) | p50 {} / p99 {} | — | — |",
        ms(r.live.p50),
        ms(r.live.p99)
    );
    let _ = writeln!(
        o,
        "\nThe reference's 39 µs includes synthesizing a Kubernetes object; ours is the routing \
         decision alone, so the comparison is of the structure that decides where a verb goes. \
         The live row shows what a verb actually pays on loopback: one gRPC round trip.\n"
    );
}

/// "Kubernetes facade".
pub fn render_facade(o: &mut String, f: &FacadeBench) {
    let _ = writeln!(o, "## Kubernetes facade\n");
    let _ = writeln!(
        o,
        "Method, lists: a read view of {} nodes × {} sandboxes = {} (built by applying node \
         inventory events, as node streams do), listed through the facade's list path — the \
         read-view snapshot for all namespaces, then the body of a `SandboxList` (JSON) or a \
         `meta.k8s.io/v1` `Table` (what `kubectl get` asks for), streamed in 64 KiB chunks from \
         each entry's serialized form (each chunk dropped once made) — {} times each after one \
         uncounted list that renders every form, in process (no HTTP). Peak memory is the most \
         bytes the list held at once beyond what was live before it, measured by the counting \
         allocator. The section below compares this with the body built whole, as before.\n",
        f.nodes,
        f.sandboxes / f.nodes.max(1),
        f.sandboxes,
        f.json.n
    );
    let _ = writeln!(
        o,
        "| list of {} | p50 | p99 | body | peak memory | anchor |",
        f.sandboxes
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|");
    let _ = writeln!(
        o,
        "| JSON `SandboxList` | {} | {} | {:.1} MiB | {:.1} MiB | reference re-derives 50,000 in 124 ms |",
        ms(f.json.p50),
        ms(f.json.p99),
        mib(f.json_bytes as u64),
        mib(f.json_peak)
    );
    let _ = writeln!(
        o,
        "| `Table` | {} | {} | {:.1} MiB | {:.1} MiB | — |",
        ms(f.table.p50),
        ms(f.table.p99),
        mib(f.table_bytes as u64),
        mib(f.table_peak)
    );
    let _ = writeln!(
        o,
        "\nWatch: the reference re-derives the whole fleet every tick (173 ms per tick at 200 nodes \
         × 50,000). Here a watch is fed changes, not ticks: one sandbox changing on one node costs \
         **{:.1} µs** (the view applies the node's event and a watcher turns it into a watch line; \
         mean over 2,000 changes). When a node's stream reconnects, its whole inventory is diffed \
         against the view: p50 **{}** for a node of {} sandboxes with one changed (20 nodes).\n",
        f.change_ns / 1000.0,
        ms(f.resync.p50),
        f.sandboxes / f.nodes.max(1)
    );
    let ratio = f.create.p50.as_secs_f64() / f.e2b_create.p50.as_secs_f64().max(1e-9);
    let _ = writeln!(
        o,
        "Create: `sandbox-gateway serve` with its embedded node; rounds of 50 creates through the \
         facade (`POST .../namespaces/default/sandboxes`, HTTPS with a bearer key, keep-alive) and \
         50 through e2b (`POST /v2/sandboxes`), each from a full warm pool of the same key, deleted \
         after each round.\n"
    );
    let _ = writeln!(o, "| create | samples | p50 | p90 | p99 |");
    let _ = writeln!(o, "|---|---|---|---|---|");
    for (name, s) in [("facade (HTTPS)", &f.create), ("e2b (HTTP)", &f.e2b_create)] {
        summary_row(o, name, s);
    }
    let _ = writeln!(
        o,
        "\nFacade create / e2b create at p50: **{ratio:.2}×** (anchor: a warm claim through the \
         reference's Kubernetes path, p50 33 ms).\n"
    );
}
