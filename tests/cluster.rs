//! Several nodes and several gateway replicas behaving as one system: claims spread over the
//! nodes, any replica serves any sandbox, a dead node fails fast with 503 while the rest keep
//! working, and a node that comes back serves its checkpoints again. Everything here is real
//! processes on loopback.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn wait_nodes_up(gw: &Gateway, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while gw.metric("sandbox_gateway_nodes_up").await != n as i64 {
        assert!(Instant::now() < deadline, "gateway never saw {n} nodes up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn id_of(v: &Value) -> String {
    v["sandboxID"].as_str().expect("sandboxID").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_two_replicas_one_system() {
    let (tmp, token) = workspace();
    let mut nodes: Vec<NodeProc> = (1..=3)
        .map(|i| {
            let name = format!("n{i}");
            NodeProc::start(
                &name,
                &tmp.path().join(&name),
                &token,
                &format!("127.0.0.1:{}", free_port()),
                &["--pool", "base/egress=3", "--pool", "base=0"],
            )
        })
        .collect();
    let token_arg = token.display().to_string();
    let mut flags: Vec<&str> = vec!["--node-token-file", &token_arg];
    for n in &nodes {
        flags.extend(["--node", n.addr.as_str()]);
    }
    let mut gw1 = Gateway::start_named(tmp.path(), "gw1", &flags);
    let mut gw2 = Gateway::start_named(tmp.path(), "gw2", &flags);
    wait_nodes_up(&gw1, 3).await;
    wait_nodes_up(&gw2, 3).await;
    // The test's own view of who owns what, asked from the nodes directly.
    let owners = dispatcher(TOKEN, &nodes.iter().collect::<Vec<_>>());
    owners
        .wait_for_nodes(3, Duration::from_secs(10))
        .await
        .unwrap();
    let node_of = |id: String| {
        let owners = owners.clone();
        async move { owners.get(None, &id).await.expect("owner").node }
    };

    // 300 creates through both replicas, 20 at a time; each batch is placed, then deleted.
    let mut placed: HashMap<String, usize> = HashMap::new();
    for batch in 0..15 {
        let creates = (0..20).map(|i| {
            let gw = if i % 2 == 0 { &gw1 } else { &gw2 };
            async move { id_of(&gw.create(KEY_A, json!({"templateID": "base"})).await) }
        });
        let ids = futures::future::join_all(creates).await;
        for id in &ids {
            *placed.entry(node_of(id.clone()).await).or_default() += 1;
        }
        let deletes = ids.iter().enumerate().map(|(i, id)| {
            let gw = if (i + batch) % 2 == 0 { &gw2 } else { &gw1 };
            async move { gw.kill(KEY_A, id).await }
        });
        for status in futures::future::join_all(deletes).await {
            assert_eq!(status, StatusCode::NO_CONTENT);
        }
    }
    assert_eq!(placed.values().sum::<usize>(), 300);
    assert_eq!(placed.len(), 3, "every node took claims: {placed:?}");
    assert!(
        placed.values().all(|&n| n <= 180),
        "no node above 60%: {placed:?}"
    );

    // A sandbox created through replica 1 is at once gettable, pausable and deletable
    // through replica 2.
    let made = gw1
        .create(
            KEY_A,
            json!({"templateID": "base", "metadata": {"via": "gw1"}}),
        )
        .await;
    let id = id_of(&made);
    let got = gw2.get(KEY_A, &id).await;
    assert_eq!(got.status, StatusCode::OK, "{:?}", got.body);
    assert_eq!(got.body["metadata"]["via"], "gw1");
    let other_tenant = gw2.get(KEY_B, &id).await;
    assert_eq!(other_tenant.status, StatusCode::NOT_FOUND);
    let paused = gw2
        .call(
            Method::POST,
            &format!("/sandboxes/{id}/pause"),
            Some(KEY_A),
            None,
        )
        .await;
    assert_eq!(paused.status, StatusCode::NO_CONTENT, "{:?}", paused.body);
    let got = gw1.get(KEY_A, &id).await;
    assert_eq!(got.body["state"], "paused", "{:?}", got.body);
    assert_eq!(gw2.kill(KEY_A, &id).await, StatusCode::NO_CONTENT);
    let gone = gw1.get(KEY_A, &id).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);

    // A sandbox on n3 with a snapshot, then n3 dies without warning.
    let mut victim = None;
    // Sandboxes to delete at the end; those on n3 die with it.
    let mut others = Vec::new();
    let mut died = Vec::new();
    for _ in 0..30 {
        let id = id_of(&gw1.create(KEY_A, json!({"templateID": "base"})).await);
        if node_of(id.clone()).await != "n3" {
            others.push(id);
        } else if victim.is_none() {
            victim = Some(id);
        } else {
            died.push(id);
        }
    }
    let victim = victim.expect("one of 30 claims landed on n3");
    let snap = gw1
        .call(
            Method::POST,
            &format!("/sandboxes/{victim}/snapshots"),
            Some(KEY_A),
            Some(json!({"name": "keep"})),
        )
        .await;
    assert_eq!(snap.status, StatusCode::CREATED, "{:?}", snap.body);
    let snap = snap.body["snapshotID"].as_str().unwrap().to_string();
    nodes[2].proc.kill();

    // Creates keep succeeding on the nodes that are left.
    for i in 0..20 {
        let gw = if i % 2 == 0 { &gw1 } else { &gw2 };
        let id = id_of(&gw.create(KEY_A, json!({"templateID": "base"})).await);
        assert_ne!(node_of(id.clone()).await, "n3");
        others.push(id);
    }
    // Verbs on the dead node's sandbox fail fast with 503, on both replicas.
    for gw in [&gw1, &gw2] {
        for (method, path) in [
            (Method::GET, format!("/sandboxes/{victim}")),
            (Method::POST, format!("/sandboxes/{victim}/pause")),
            (Method::DELETE, format!("/sandboxes/{victim}")),
        ] {
            let started = Instant::now();
            let r = gw.call(method.clone(), &path, Some(KEY_A), None).await;
            let took = started.elapsed();
            assert_eq!(
                r.status,
                StatusCode::SERVICE_UNAVAILABLE,
                "{method} {path}: {:?}",
                r.body
            );
            assert!(
                r.body["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("n3"),
                "the message names the node: {:?}",
                r.body
            );
            assert!(
                took < Duration::from_secs(2),
                "{method} {path} took {took:?}"
            );
        }
    }

    // n3 comes back on its address and data: its checkpoint is listed and branchable, and
    // the sandbox that died with it is reported gone (not unavailable).
    nodes[2].restart();
    wait_nodes_up(&gw1, 3).await;
    wait_nodes_up(&gw2, 3).await;
    let listed = gw2
        .call(
            Method::GET,
            &format!("/snapshots?sandboxID={victim}"),
            Some(KEY_A),
            None,
        )
        .await;
    assert_eq!(
        listed.body,
        json!([{"snapshotID": snap.as_str(), "names": ["keep"]}])
    );
    let branch = gw2.create(KEY_A, json!({"templateID": snap})).await;
    let branch_id = id_of(&branch);
    assert_eq!(node_of(branch_id.clone()).await, "n3");
    others.push(branch_id);
    let dead = gw1.get(KEY_A, &victim).await;
    assert_eq!(dead.status, StatusCode::NOT_FOUND, "{:?}", dead.body);
    for id in &died {
        assert_eq!(
            gw2.kill(KEY_A, id).await,
            StatusCode::NOT_FOUND,
            "{id} died with n3"
        );
    }

    for id in &others {
        assert_eq!(gw1.kill(KEY_A, id).await, StatusCode::NO_CONTENT, "{id}");
    }
    owners.shutdown().await;
    gw1.proc.terminate();
    gw2.proc.terminate();
    let dirs: Vec<_> = nodes.iter().map(|n| n.sandboxes_dir()).collect();
    for n in &mut nodes {
        n.proc.terminate();
    }
    assert_no_leaks(tmp.path(), &dirs).await;
}

// ----- cluster mode against a fake kube-apiserver -----
//
// There is no kube-apiserver on these machines, so `common::fake_kube` fakes one at the wire
// (see there). The nodes and the gateway are the real binary using the kube crate.

async fn until(what: &str, timeout: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every replica lists every id in `kept`.
async fn all_listed(gws: &[Gateway], kept: &[String], what: &str, within: Duration) {
    for gw in gws {
        until(what, within, async || {
            let listed = listed_ids(gw).await;
            kept.iter().all(|id| listed.contains(id))
        })
        .await;
    }
}

async fn listed_ids(gw: &Gateway) -> Vec<String> {
    let r = gw
        .call(Method::GET, "/v2/sandboxes", Some(KEY_A), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    r.body
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sandboxID"].as_str().unwrap().to_string())
        .collect()
}

/// A node with one warm `base/egress` sandbox that publishes its NodeInventory every
/// `interval` seconds.
fn publishing_node(
    kubeconfig: &std::path::Path,
    tmp: &std::path::Path,
    token: &std::path::Path,
    name: &str,
    interval: &str,
) -> NodeProc {
    let kubeconfig = kubeconfig.display().to_string();
    NodeProc::start(
        name,
        &tmp.join(name),
        token,
        "127.0.0.1:0",
        &[
            "--pool",
            "base/egress=1",
            "--pool",
            "base=0",
            "--publish-inventory",
            "--publish-interval-seconds",
            interval,
            "--kubeconfig",
            &kubeconfig,
        ],
    )
}

/// A gateway in cluster mode that finds its nodes from their published objects.
fn discovering_gateway(
    kubeconfig: &std::path::Path,
    tmp: &std::path::Path,
    token: &std::path::Path,
    name: &str,
    extra: &[&str],
) -> Gateway {
    let kubeconfig = kubeconfig.display().to_string();
    let token = token.display().to_string();
    let mut flags = vec![
        "--discover-nodes",
        "--kubeconfig",
        &kubeconfig,
        "--node-token-file",
        &token,
    ];
    flags.extend_from_slice(extra);
    Gateway::start_named(tmp, name, &flags)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_publish_inventory_and_gateways_discover_them() {
    let (tmp, token) = workspace();
    let cluster = fake_kube::start(tmp.path());
    let mut n1 = publishing_node(&cluster.node_kubeconfig, tmp.path(), &token, "n1", "1");

    // The node's apply: its object, as server-side apply with its own field manager.
    until("n1's first publish", Duration::from_secs(10), async || {
        cluster.kube.object("n1").is_some()
    })
    .await;
    let first = cluster.kube.applies()[0].clone();
    assert_eq!(first.content_type, "application/apply-patch+yaml");
    assert_eq!(
        first.query.get("fieldManager").map(String::as_str),
        Some("sandbox-gateway-node")
    );
    assert_eq!(first.query.get("force").map(String::as_str), Some("true"));
    let body = &first.body;
    assert_eq!(body["apiVersion"], "extensions.agents.x-k8s.io/v1beta1");
    assert_eq!(body["kind"], "NodeInventory");
    assert_eq!(body["metadata"]["name"], "n1");
    assert_eq!(body["node"], "n1");
    assert_eq!(body["address"], n1.addr.as_str());
    let pools = body["pools"].as_array().unwrap();
    assert!(
        pools
            .iter()
            .any(|p| p["template"] == "base" && p["net"] == "egress" && p["target"] == 1),
        "{pools:?}"
    );
    let published =
        chrono::DateTime::parse_from_rfc3339(body["publishedAt"].as_str().unwrap()).unwrap();
    assert!(
        (chrono::Utc::now() - published.to_utc())
            .num_seconds()
            .abs()
            < 30
    );

    // A gateway in cluster mode with no --node: it finds n1 from the list, n2 from the watch.
    let gw = discovering_gateway(
        &cluster.gateway_kubeconfig,
        tmp.path(),
        &token,
        "gw",
        &["--inventory-stale-seconds", "3"],
    );
    until("n1 discovered", Duration::from_secs(10), async || {
        gw.metric("sandbox_gateway_nodes_up").await == 1
    })
    .await;
    let mut n2 = publishing_node(&cluster.node_kubeconfig, tmp.path(), &token, "n2", "1");
    until(
        "n2 discovered through the watch",
        Duration::from_secs(10),
        async || gw.metric("sandbox_gateway_nodes_up").await == 2,
    )
    .await;

    // A node object nobody refreshes is never used: it is older than the staleness bound.
    cluster.kube.put(json!({
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "NodeInventory",
        "metadata": {"name": "ghost"}, "node": "ghost", "address": "127.0.0.1:9",
        "entries": [{"name": "team-a/haunt", "id": "sb_00000000000000ff", "phase": "Running",
                     "claimRef": "team-a/haunt", "deadline": "2099-01-01T00:00:00Z",
                     "template": "base", "claimedAt": "2026-01-01T00:00:00Z"}],
        "publishedAt": (chrono::Utc::now() - chrono::TimeDelta::minutes(10)).to_rfc3339(),
    }));

    // Lists come from the published objects: a claim made on n2 directly (not through this
    // gateway) shows up after n2's next publish.
    let direct = dispatcher(TOKEN, &[&n2]);
    direct
        .wait_for_nodes(1, Duration::from_secs(10))
        .await
        .unwrap();
    let claimed = direct
        .claim(sandbox_gateway::dispatch::ClaimRequest {
            namespace: "team-a".into(),
            name: "direct".into(),
            key: sandbox_gateway::model::PoolKey::new("base", "egress", "small").unwrap(),
            ttl_seconds: 600,
            metadata: Default::default(),
            env_vars: Default::default(),
            lifecycle: Default::default(),
            network: Default::default(),
            volume_mounts: Vec::new(),
        })
        .await
        .unwrap();
    let direct_id = claimed.record.id.clone();
    // The e2b surface spells claim ids with a dash.
    let direct_e2b = direct_id.replace('_', "-");
    until(
        "the direct claim in the gateway's list",
        Duration::from_secs(10),
        async || listed_ids(&gw).await.contains(&direct_e2b),
    )
    .await;
    assert_eq!(
        gw.metric("sandbox_gateway_nodes_known").await,
        2,
        "the ghost is not used"
    );
    assert!(
        !listed_ids(&gw)
            .await
            .contains(&"sb-00000000000000ff".to_string())
    );
    let entries = cluster.kube.object("n2").unwrap()["entries"].clone();
    assert!(
        entries
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["id"] == direct_id.as_str()
                && e["name"] == "team-a/direct"
                && e["claimRef"] == "team-a/direct"
                && e["phase"] == "Running"),
        "{entries:?}"
    );
    assert!(
        !entries.to_string().contains(&claimed.record.token),
        "tokens are never published"
    );

    // A create through the gateway is in its list at once (before any publish).
    let made = id_of(&gw.create(KEY_A, json!({"templateID": "base"})).await);
    assert!(listed_ids(&gw).await.contains(&made));

    // A lost object is rebuilt by the next publish.
    cluster.kube.delete("n1");
    until("n1's object rebuilt", Duration::from_secs(10), async || {
        cluster.kube.object("n1").is_some()
    })
    .await;
    until(
        "n1 back in the fleet",
        Duration::from_secs(10),
        async || gw.metric("sandbox_gateway_nodes_known").await == 2,
    )
    .await;

    // n2 dies without a word: its object goes stale, so it leaves claims and lists.
    n2.proc.kill();
    until("n2 dropped as stale", Duration::from_secs(15), async || {
        gw.metric("sandbox_gateway_nodes_known").await == 1
    })
    .await;
    assert!(!listed_ids(&gw).await.contains(&direct_e2b));
    for _ in 0..3 {
        let id = id_of(&gw.create(KEY_A, json!({"templateID": "base"})).await);
        assert_eq!(gw.kill(KEY_A, &id).await, StatusCode::NO_CONTENT);
    }

    // A node that stops cleanly publishes once more, with nothing in it.
    let status = gw.kill(KEY_A, &made).await;
    assert!(status == StatusCode::NO_CONTENT || status == StatusCode::SERVICE_UNAVAILABLE);
    let before = cluster.kube.applies().len();
    n1.proc.terminate();
    let last = cluster.kube.applies();
    assert!(last.len() > before, "a publish at shutdown");
    let final_object = cluster.kube.object("n1").unwrap();
    assert!(final_object.get("entries").is_none(), "{final_object}");
    assert!(
        final_object["pools"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|p| p["warm"] == 0),
        "{final_object}"
    );

    // What each used is what deploy/ grants it.
    let granted = |v: &[&str]| {
        v.iter()
            .map(|s| s.to_string())
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(
        cluster.kube.verbs_of("gateway-sa"),
        granted(sandbox_gateway::cluster::GATEWAY_VERBS)
    );
    assert_eq!(
        cluster.kube.verbs_of("node-sa"),
        granted(sandbox_gateway::cluster::NODE_VERBS)
    );

    let mut gw = gw;
    gw.proc.terminate();
    direct.shutdown().await;
    // n2 cleans up after its crash when it starts again.
    n2.restart();
    n2.proc.terminate();
    cluster.handle.stop(true).await;
    assert_no_leaks(tmp.path(), &[n1.sandboxes_dir(), n2.sandboxes_dir()]).await;
}

/// A sandbox that ends without this gateway's doing (here another client releases it on its
/// node) stays in the published inventory until the node publishes again; once a get on this
/// gateway has heard from the node that it is gone, its lists stop showing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_get_that_finds_a_sandbox_gone_drops_it_from_lists() {
    let (tmp, token) = workspace();
    let cluster = fake_kube::start(tmp.path());
    // Far longer than the test: what the node publishes does not change while it runs.
    let mut n1 = publishing_node(&cluster.node_kubeconfig, tmp.path(), &token, "n1", "600");
    let mut gw = discovering_gateway(&cluster.gateway_kubeconfig, tmp.path(), &token, "gw", &[]);
    until("n1 discovered", Duration::from_secs(10), async || {
        gw.metric("sandbox_gateway_nodes_up").await == 1
    })
    .await;
    let kept = id_of(&gw.create(KEY_A, json!({"templateID": "base"})).await);
    let ended = id_of(&gw.create(KEY_A, json!({"templateID": "base"})).await);
    let listed = listed_ids(&gw).await;
    assert!(
        listed.contains(&kept) && listed.contains(&ended),
        "{listed:?}"
    );

    let direct = dispatcher(TOKEN, &[&n1]);
    direct
        .wait_for_nodes(1, Duration::from_secs(10))
        .await
        .unwrap();
    direct.release(None, &ended).await.unwrap();
    // The inventory still says otherwise: the gateway's list is as it was.
    assert!(listed_ids(&gw).await.contains(&ended));

    let r = gw.get(KEY_A, &ended).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{:?}", r.body);
    let listed = listed_ids(&gw).await;
    assert!(!listed.contains(&ended), "{listed:?}");
    assert!(listed.contains(&kept), "{listed:?}");
    assert_eq!(gw.kill(KEY_A, &kept).await, StatusCode::NO_CONTENT);
    gw.proc.terminate();
    direct.shutdown().await;
    n1.proc.terminate();
    cluster.handle.stop(true).await;
    assert_no_leaks(tmp.path(), &[n1.sandboxes_dir()]).await;
}

// ----- kube-apiserver unavailable (the reliability issue's fault matrix) -----

/// The e2b create the outage test makes: a lifetime well past the test's.
async fn create_for(gw: &Gateway) -> (StatusCode, Option<String>, Duration) {
    let started = Instant::now();
    let r = gw
        .call(
            Method::POST,
            "/v2/sandboxes",
            Some(KEY_A),
            Some(json!({"templateID": "base", "timeout": 1800})),
        )
        .await;
    let id = r.body["sandboxID"].as_str().map(str::to_string);
    (r.status, id, started.elapsed())
}

fn published_at(obj: &Value) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339(obj["publishedAt"].as_str().expect("publishedAt"))
        .expect("an RFC 3339 publishedAt")
        .to_utc()
}

fn resource_version(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .expect("a resourceVersion")
}

/// Log lines of `proc` containing `needle`.
fn log_count(proc: &Proc, needle: &str) -> usize {
    proc.stderr_lines()
        .iter()
        .filter(|l| l.contains(needle))
        .count()
}

/// What the client saw: answers by operation and status, with the slowest of each.
#[derive(Default)]
struct Seen {
    by_op: std::collections::BTreeMap<(&'static str, u16), (usize, Duration)>,
}

impl Seen {
    fn note(&mut self, op: &'static str, status: StatusCode, took: Duration) {
        let e = self.by_op.entry((op, status.as_u16())).or_default();
        e.0 += 1;
        e.1 = e.1.max(took);
    }

    /// One `answers` figure line per operation and status.
    fn figures(&self, figures: &mut Figures, phase: &str) {
        for ((op, status), (n, max)) in &self.by_op {
            figures.add(&[
                ("what", "answers".into()),
                ("phase", phase.into()),
                ("op", op.to_string()),
                ("status", status.to_string()),
                ("count", n.to_string()),
                ("max_ms", ms(*max)),
            ]);
        }
    }
}

/// How long the apiserver answers 503: `APISERVER_OUTAGE_SECONDS`, 60 by default (what CI
/// runs), so three times the gateways' 20 s staleness bound.
fn outage_length() -> Duration {
    let secs = std::env::var("APISERVER_OUTAGE_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|s| *s > 0)
        .unwrap_or(60);
    Duration::from_secs(secs)
}

/// kube-apiserver is unavailable for a minute (503 to everything, watches cut), then
/// refuses connections for a while: sandboxes keep working through both gateways, neither
/// drops a node it knew, nodes and gateways retry with backoff, and once it is back the
/// nodes' objects are fresh again, the watches resume (a node started during the outage and
/// one started after it are discovered) and every sandbox is listed. It ends by printing its
/// `apiserver-outage-figure` lines, which `tests/reliability.sh apiserver-outage` turns into
/// RELIABILITY.md's table.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apiserver_unavailable_for_a_minute() {
    let outage = outage_length();
    const REFUSED: Duration = Duration::from_secs(20);
    const STALE_SECONDS: &str = "20";
    let (tmp, token) = workspace();
    let mut cluster = fake_kube::start(tmp.path());
    let node_kubeconfig = cluster.node_kubeconfig.clone();
    let node = |name: &str| publishing_node(&node_kubeconfig, tmp.path(), &token, name, "1");
    let mut nodes = vec![node("n1"), node("n2")];
    // A staleness bound well below the outage: without the fix both gateways would drop
    // every node 20 s in.
    let gw_flags = ["--inventory-stale-seconds", STALE_SECONDS];
    let mut gws = [
        discovering_gateway(
            &cluster.gateway_kubeconfig,
            tmp.path(),
            &token,
            "gw1",
            &gw_flags,
        ),
        discovering_gateway(
            &cluster.gateway_kubeconfig,
            tmp.path(),
            &token,
            "gw2",
            &gw_flags,
        ),
    ];
    let known = async |gw: &Gateway| gw.metric("sandbox_gateway_nodes_known").await;
    let up = async |gw: &Gateway| gw.metric("sandbox_gateway_nodes_up").await;
    for gw in &gws {
        until(
            "n1 and n2 discovered",
            Duration::from_secs(20),
            async || known(gw).await == 2 && up(gw).await == 2,
        )
        .await;
    }

    // Sandboxes before the outage; the other replica lists them from the inventories.
    let mut kept: Vec<String> = Vec::new();
    for i in 0..4 {
        let (status, id, _) = create_for(&gws[i % 2]).await;
        assert_eq!(status, StatusCode::CREATED);
        kept.push(id.unwrap());
    }
    all_listed(
        &gws,
        &kept,
        "the first sandboxes listed",
        Duration::from_secs(20),
    )
    .await;

    // ----- 503 to everything for a minute -----
    let rv_before = cluster.kube.resource_version();
    let requests_before = cluster.kube.requests().len();
    let logs_before: Vec<usize> = nodes
        .iter()
        .map(|n| log_count(&n.proc, "publishing the node inventory failed"))
        .collect();
    let mut figures = Figures::new("apiserver-outage");
    figures.add(&[
        ("what", "run".into()),
        ("outage_secs", outage.as_secs().to_string()),
        ("refused_secs", REFUSED.as_secs().to_string()),
        ("stale_secs", STALE_SECONDS.into()),
        ("nodes", nodes.len().to_string()),
        ("gateways", gws.len().to_string()),
        ("sandboxes_before", kept.len().to_string()),
    ]);
    cluster.outage(true);
    let down_at = Instant::now();
    let mut seen = Seen::default();
    // The fewest nodes either replica knew and counted up at any round of the outage.
    let (mut known_min, mut up_min) = (i64::MAX, i64::MAX);
    // Made by each replica during the outage (it lists its own at once).
    let mut made_by: [Vec<String>; 2] = [Vec::new(), Vec::new()];
    let mut round = 0usize;
    while down_at.elapsed() < outage {
        if round == 3 {
            // A node that starts while the apiserver is down: it serves, and publishes
            // once it can.
            nodes.push(node("n3"));
        }
        let (a, b) = (round % 2, (round + 1) % 2);
        // Create through one replica, get it through both; create another and delete it
        // through the other replica.
        let (status, id, took) = create_for(&gws[a]).await;
        seen.note("create", status, took);
        assert_eq!(
            status,
            StatusCode::CREATED,
            "create {:?} into the outage",
            down_at.elapsed()
        );
        let id = id.unwrap();
        for gw in &gws {
            let started = Instant::now();
            let got = gw.get(KEY_A, &id).await;
            seen.note("get", got.status, started.elapsed());
            assert_eq!(got.status, StatusCode::OK, "{:?}", got.body);
        }
        made_by[a].push(id.clone());
        kept.push(id);
        let (status, doomed, took) = create_for(&gws[a]).await;
        seen.note("create", status, took);
        assert_eq!(status, StatusCode::CREATED);
        let started = Instant::now();
        let status = gws[b].kill(KEY_A, &doomed.unwrap()).await;
        seen.note("delete", status, started.elapsed());
        assert_eq!(status, StatusCode::NO_CONTENT);
        // Neither replica drops a node because it cannot refresh its object.
        for gw in &gws {
            let (k, u) = (known(gw).await, up(gw).await);
            (known_min, up_min) = (known_min.min(k), up_min.min(u));
            assert_eq!(k, 2, "nodes known {:?} into the outage", down_at.elapsed());
            assert_eq!(u, 2, "nodes up {:?} into the outage", down_at.elapsed());
        }
        round += 1;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // Each replica lists what it knew and what it made meanwhile.
    for (i, gw) in gws.iter().enumerate() {
        let started = Instant::now();
        let listed = listed_ids(gw).await;
        seen.note("list", StatusCode::OK, started.elapsed());
        for id in kept[..4].iter().chain(&made_by[i]) {
            assert!(
                listed.contains(id),
                "gw{} lists {id} during the outage",
                i + 1
            );
        }
    }
    let outage_requests: Vec<fake_kube::Request> = cluster.kube.requests()[requests_before..]
        .iter()
        .filter(|r| r.at >= down_at)
        .cloned()
        .collect();
    cluster.outage(false);
    let up_at = Instant::now();
    let back = chrono::Utc::now();
    let rv_back = cluster.kube.resource_version();
    assert_eq!(rv_back, rv_before, "nothing was written during the outage");
    let by_token = |token: &str| outage_requests.iter().filter(|r| r.token == token).count();
    assert!(
        outage_requests.iter().all(|r| r.status == 503),
        "every request in the outage was refused"
    );
    // Everyone kept retrying, and with backoff: about one attempt per 10 s per process (the
    // kube client's own retries make each attempt a short burst of requests).
    let (node_requests, gateway_requests) = (by_token("node-sa"), by_token("gateway-sa"));
    assert!(node_requests > 0 && gateway_requests > 0);
    seen.figures(&mut figures, "outage");
    figures.add(&[
        ("what", "nodes-seen".into()),
        ("phase", "outage".into()),
        ("known_min", known_min.to_string()),
        ("up_min", up_min.to_string()),
    ]);
    for (token, n) in [("node-sa", node_requests), ("gateway-sa", gateway_requests)] {
        figures.add(&[
            ("what", "apiserver-requests".into()),
            ("phase", "outage".into()),
            ("token", token.into()),
            ("count", n.to_string()),
            (
                "answered_503",
                outage_requests
                    .iter()
                    .filter(|r| r.token == token && r.status == 503)
                    .count()
                    .to_string(),
            ),
        ]);
    }
    // At most 15 warnings a minute (the bound for the 60 s outage CI runs).
    let most = 15 * outage.as_secs().div_ceil(60) as usize;
    for (i, n) in nodes.iter().enumerate().take(2) {
        let lines = log_count(&n.proc, "publishing the node inventory failed") - logs_before[i];
        assert!(
            (1..=most).contains(&lines),
            "{}: {lines} publish failures logged in {outage:?}",
            n.name
        );
        figures.add(&[
            ("what", "warnings".into()),
            ("phase", "outage".into()),
            ("process", n.name.clone()),
            ("lines", lines.to_string()),
        ]);
    }
    for (i, gw) in gws.iter().enumerate() {
        let lines = log_count(&gw.proc, "NodeInventory list+watch failed");
        assert!((1..=most).contains(&lines), "{lines} watch failures logged");
        figures.add(&[
            ("what", "warnings".into()),
            ("phase", "outage".into()),
            ("process", format!("gw{}", i + 1)),
            ("lines", lines.to_string()),
        ]);
    }

    // ----- back: the objects are fresh again, the watches resume -----
    until(
        "every node republished",
        Duration::from_secs(30),
        async || {
            ["n1", "n2", "n3"].iter().all(|n| {
                cluster
                    .kube
                    .object(n)
                    .is_some_and(|o| resource_version(&o) > rv_back && published_at(&o) >= back)
            })
        },
    )
    .await;
    let republished = up_at.elapsed();
    for gw in &gws {
        // n3 started during the outage: the first the gateways hear of it is after it.
        until(
            "n3 discovered after the outage",
            Duration::from_secs(30),
            async || known(gw).await == 3 && up(gw).await == 3,
        )
        .await;
    }
    let rediscovered = up_at.elapsed();
    // A node started after the outage is discovered too.
    nodes.push(node("n4"));
    let n4_started = Instant::now();
    for gw in &gws {
        until("n4 discovered", Duration::from_secs(30), async || {
            known(gw).await == 4
        })
        .await;
    }
    let n4_discovered = n4_started.elapsed();
    // Nothing is lost: each replica lists every sandbox, also those the other made during
    // the outage (which it learns only from the republished inventories).
    all_listed(
        &gws,
        &kept,
        "every sandbox listed after the outage",
        Duration::from_secs(20),
    )
    .await;
    figures.add(&[
        ("what", "recovery".into()),
        ("phase", "outage".into()),
        ("republished_secs", secs(republished)),
        ("n3_discovered_secs", secs(rediscovered)),
        ("n4_discovered_secs", secs(n4_discovered)),
        ("all_listed_secs", secs(up_at.elapsed())),
        ("sandboxes_listed", kept.len().to_string()),
    ]);

    // ----- connections refused for a while (the apiserver process gone) -----
    let before_refused = cluster.kube.resource_version();
    cluster.refuse_connections().await;
    let refused_at = Instant::now();
    let mut refused_seen = Seen::default();
    let mut known_min = i64::MAX;
    while refused_at.elapsed() < REFUSED {
        let (status, id, took) = create_for(&gws[0]).await;
        refused_seen.note("create", status, took);
        assert_eq!(status, StatusCode::CREATED);
        let id = id.unwrap();
        let started = Instant::now();
        let got = gws[1].get(KEY_A, &id).await;
        refused_seen.note("get", got.status, started.elapsed());
        assert_eq!(got.status, StatusCode::OK);
        kept.push(id);
        for gw in &gws {
            let k = known(gw).await;
            known_min = known_min.min(k);
            assert_eq!(k, 4, "nodes known {:?} into refusals", refused_at.elapsed());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    cluster.accept_connections().await;
    let accepted_at = Instant::now();
    until(
        "every node republished after refusals",
        Duration::from_secs(30),
        async || {
            ["n1", "n2", "n3", "n4"].iter().all(|n| {
                cluster
                    .kube
                    .object(n)
                    .is_some_and(|o| resource_version(&o) > before_refused)
            })
        },
    )
    .await;
    all_listed(
        &gws,
        &kept,
        "every sandbox listed after refusals",
        Duration::from_secs(30),
    )
    .await;
    let refused_recovered = accepted_at.elapsed();
    refused_seen.figures(&mut figures, "refused");
    figures.add(&[
        ("what", "nodes-seen".into()),
        ("phase", "refused".into()),
        ("known_min", known_min.to_string()),
    ]);
    figures.add(&[
        ("what", "recovery".into()),
        ("phase", "refused".into()),
        ("all_listed_secs", secs(refused_recovered)),
        ("sandboxes_listed", kept.len().to_string()),
    ]);

    // No node ever left either replica's fleet, nobody exited or panicked.
    let (mut left_lines, mut panics) = (0, 0);
    for gw in &mut gws {
        assert!(gw.proc.running(), "the gateway is still up");
        let logs = gw.proc.stderr_lines();
        left_lines += logs
            .iter()
            .filter(|l| l.contains("node left the fleet"))
            .count();
        assert!(
            !logs.iter().any(|l| l.contains("node left the fleet")),
            "{:?}",
            logs.iter()
                .filter(|l| l.contains("left"))
                .collect::<Vec<_>>()
        );
        panics += logs.iter().filter(|l| l.contains("panicked")).count();
        assert!(!logs.iter().any(|l| l.contains("panicked")));
    }
    for n in &mut nodes {
        assert!(n.proc.running(), "{} is still up", n.name);
        let logs = n.proc.stderr_lines();
        panics += logs.iter().filter(|l| l.contains("panicked")).count();
        assert!(!logs.iter().any(|l| l.contains("panicked")));
    }
    let mut answered_200 = 0;
    for id in &kept {
        let got = gws[1].get(KEY_A, id).await;
        assert_eq!(got.status, StatusCode::OK, "{id}: {:?}", got.body);
        answered_200 += 1;
    }

    for id in &kept {
        assert_eq!(gws[0].kill(KEY_A, id).await, StatusCode::NO_CONTENT, "{id}");
    }
    for gw in &mut gws {
        gw.proc.terminate();
    }
    let dirs: Vec<_> = nodes.iter().map(|n| n.sandboxes_dir()).collect();
    for n in &mut nodes {
        n.proc.terminate();
    }
    cluster.handle.stop(true).await;
    assert_no_leaks(tmp.path(), &dirs).await;
    // Counted after the assertions, so these are what the run left, not what it expected.
    figures.add(&[
        ("what", "end".into()),
        ("sandboxes", kept.len().to_string()),
        ("get_200", answered_200.to_string()),
        ("node_left_lines", left_lines.to_string()),
        ("panics", panics.to_string()),
        ("nodes", nodes.len().to_string()),
        ("processes", processes_under(tmp.path()).len().to_string()),
        (
            "instance_dirs",
            dirs.iter()
                .map(|d| dir_entries(d).len())
                .sum::<usize>()
                .to_string(),
        ),
    ]);
    figures.print();
}
