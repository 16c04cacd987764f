//! Real node daemons (separate `sandbox-gateway node` processes) driven through the
//! dispatcher over real gRPC. Every test ends by stopping its nodes and checking that no
//! sandbox process or directory is left.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use chrono::Utc;
use common::*;
use sandbox_gateway::dispatch::client::NodeConn;
use sandbox_gateway::dispatch::{ClaimRequest, Dispatcher};
use sandbox_gateway::model::{CheckpointFilter, ErrorKind, Phase, PoolKey, ids};

fn claim_req(ns: &str, name: &str, ttl: u64) -> ClaimRequest {
    ClaimRequest {
        namespace: ns.into(),
        name: name.into(),
        key: PoolKey::base(),
        ttl_seconds: ttl,
        metadata: [("owner".to_string(), "tests".to_string())].into(),
        env_vars: [("GREETING".to_string(), "hello".to_string())].into(),
        lifecycle: Default::default(),
        network: Default::default(),
        volume_mounts: Vec::new(),
    }
}

async fn wait_warm(d: &Dispatcher, per_node: u32, nodes: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let full = d
            .nodes()
            .iter()
            .filter(|n| {
                n.info
                    .as_ref()
                    .is_some_and(|i| i.warm(&PoolKey::base()) >= per_node)
            })
            .count();
        if full >= nodes {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "warm pools did not fill"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn stop_all(tmp: &tempfile::TempDir, d: Dispatcher, nodes: &mut [NodeProc]) {
    d.shutdown().await;
    let dirs: Vec<_> = nodes.iter().map(|n| n.sandboxes_dir()).collect();
    for n in nodes.iter_mut() {
        if n.proc.running() {
            n.proc.terminate();
        }
    }
    assert_no_leaks(tmp.path(), &dirs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_spread_over_three_nodes_and_resolve_anywhere() {
    let (tmp, token) = workspace();
    let mut nodes: Vec<NodeProc> = ["node-a", "node-b", "node-c"]
        .iter()
        .map(|n| {
            NodeProc::start(
                n,
                &tmp.path().join(n),
                &token,
                "127.0.0.1:0",
                &["--pool", "base=24"],
            )
        })
        .collect();
    let d = dispatcher(TOKEN, &nodes.iter().collect::<Vec<_>>());
    d.wait_for_nodes(3, Duration::from_secs(30)).await.unwrap();
    wait_warm(&d, 24, 3).await;
    // Every instance that exists now is warm and unclaimed.
    let warm_before: Vec<String> = nodes
        .iter()
        .flat_map(|n| {
            dir_entries(&n.sandboxes_dir())
                .into_iter()
                .map(|e| n.sandboxes_dir().join(e).display().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(warm_before.len(), 72);

    let mut per_node: HashMap<String, usize> = HashMap::new();
    let mut claimed = Vec::new();
    for i in 0..60 {
        let c = d
            .claim(claim_req("team-a", &format!("box-{i}"), 600))
            .await
            .unwrap();
        assert!(c.warm, "claim {i} should come from a warm pool");
        assert!(
            warm_before.contains(&c.record.state_dir),
            "a warm claim hands over an instance that was already running, not a new boot"
        );
        assert!(ids::is_claim_id(&c.record.id), "{}", c.record.id);
        assert_eq!(c.record.token.len(), 32);
        assert_eq!(c.record.claim_ref, format!("team-a/box-{i}"));
        *per_node.entry(c.record.node.clone()).or_default() += 1;
        claimed.push(c.record);
    }
    assert_eq!(
        per_node.len(),
        3,
        "all three nodes take claims: {per_node:?}"
    );
    for (node, n) in &per_node {
        assert!(
            *n <= 36,
            "node {node} took {n} of 60 claims (over 60%): {per_node:?}"
        );
    }

    // A second dispatcher (another gateway replica) has an empty owner index and a read view
    // that may not have caught up: it still resolves every claim at once.
    let other = dispatcher(TOKEN, &nodes.iter().collect::<Vec<_>>());
    for r in claimed.iter().step_by(7) {
        let got = other
            .get(Some("team-a"), &ids::dns_safe(&r.id))
            .await
            .unwrap();
        assert_eq!(got.id, r.id);
        assert_eq!(got.node, r.node);
        assert_eq!(got.token, r.token, "get carries the sandbox token");
        assert_eq!(
            got.env_vars.get("GREETING").map(String::as_str),
            Some("hello")
        );
        let by_name = other.find_by_name("team-a", r.name()).await.unwrap();
        assert_eq!(by_name.len(), 1);
        assert_eq!(by_name[0].id, r.id);
        // Another tenant's namespace does not see it.
        let e = other.get(Some("team-b"), &r.id).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
    }
    let e = other.get(None, "sb_0000000000000000").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    let e = other.get(None, "not-an-id").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);

    // The read view converges on all 60 with a revision that only grows.
    let mut last_rev = 0;
    eventually(
        Duration::from_secs(10),
        "read view lists all claims",
        || {
            let (list, rev) = d.list(Some("team-a"));
            assert!(rev >= last_rev);
            last_rev = rev;
            list.len() == 60
        },
    )
    .await;
    let (_, before) = d.list(None);
    let mut deletions = Vec::new();
    let (backlog, mut rx) = d.view().watch(before).unwrap();
    assert!(backlog.is_empty());
    for r in &claimed {
        d.release(Some("team-a"), &r.id).await.unwrap();
    }
    while deletions.len() < 60 {
        let ev = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(ev.revision > before);
        deletions.push(ev);
    }
    assert!(
        deletions
            .iter()
            .all(|e| e.kind == sandbox_gateway::dispatch::read_view::ViewEventKind::Deleted)
    );
    assert!(deletions.windows(2).all(|w| w[0].revision < w[1].revision));
    let e = d.get(None, &claimed[0].id).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    other.shutdown().await;
    stop_all(&tmp, d, &mut nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refusing_and_dead_nodes_are_skipped() {
    let (tmp, token) = workspace();
    let empty = NodeProc::start(
        "empty",
        &tmp.path().join("empty"),
        &token,
        "127.0.0.1:0",
        &["--pool", "base=0", "--no-cold-start"],
    );
    let good = NodeProc::start(
        "good",
        &tmp.path().join("good"),
        &token,
        "127.0.0.1:0",
        &["--pool", "base=2"],
    );
    let doomed = NodeProc::start(
        "doomed",
        &tmp.path().join("doomed"),
        &token,
        "127.0.0.1:0",
        &["--pool", "base=2"],
    );
    let d = dispatcher(TOKEN, &[&empty, &good, &doomed]);
    d.wait_for_nodes(3, Duration::from_secs(30)).await.unwrap();

    // A node with an empty pool and no cold start answers "no capacity" itself.
    let conn = NodeConn::new(&empty.addr, TOKEN).unwrap();
    let mut c = conn.client();
    let status = c
        .claim(sandbox_gateway::proto::ClaimRequest {
            key: Some((&PoolKey::base()).into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);

    let mut nodes = vec![empty, good, doomed];
    // SIGKILL one node: its agents go down with it (their lifeline closes).
    let doomed_dir = nodes[2].sandboxes_dir();
    nodes[2].proc.kill();
    // Claims right away, while the dispatcher still counts the killed node up: one sent on
    // the connection the kill broke finds the node's port refusing connections, so it is
    // skipped like a refusal (the node's process took whatever it did with it) rather than
    // answered "outcome unknown" (that stays for a node that still listens:
    // `a_claim_with_an_unknown_outcome_…`).
    for i in 0..12 {
        let c = d
            .claim(claim_req("ns", &format!("s{i}"), 60))
            .await
            .unwrap();
        assert_eq!(
            c.record.node, "good",
            "claims go to the only node that can serve"
        );
    }
    eventually(
        Duration::from_secs(10),
        "agents of a killed node exit",
        || processes_under(&doomed_dir).is_empty(),
    )
    .await;
    // The node that can cold-start keeps serving past its warm pool.
    let info = d
        .nodes()
        .into_iter()
        .find(|n| n.info.as_ref().is_some_and(|i| i.name == "good"))
        .unwrap();
    assert!(info.up);

    // With only the refusing node left, the claim fails with no capacity, not an error that
    // looks like the request was wrong.
    nodes[1].proc.terminate();
    eventually(
        Duration::from_secs(5),
        "dispatcher notices the stopped node",
        || d.nodes().iter().filter(|n| n.up).count() == 1,
    )
    .await;
    let e = d.claim(claim_req("ns", "late", 60)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoCapacity, "{e}");
    // The killed node left instance directories behind; its next start removes them.
    let left = dir_entries(&doomed_dir);
    assert!(!left.is_empty());
    nodes[2].restart();
    let now = dir_entries(&doomed_dir);
    assert!(
        left.iter().all(|e| !now.contains(e)),
        "{left:?} still in {now:?}"
    );
    stop_all(&tmp, d, &mut nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_are_clamped_renewed_and_reaped() {
    let (tmp, token) = workspace();
    let node = NodeProc::start(
        "lease",
        &tmp.path().join("lease"),
        &token,
        "127.0.0.1:0",
        &[
            "--pool",
            "base=0",
            "--lease-default-seconds",
            "2",
            "--lease-max-seconds",
            "3",
            "--paused-retention-seconds",
            "6",
        ],
    );
    let d = dispatcher(TOKEN, &[&node]);
    d.wait_for_nodes(1, Duration::from_secs(30)).await.unwrap();

    let before = Utc::now();
    let huge = d
        .claim(claim_req("ns", "huge", 999_999))
        .await
        .unwrap()
        .record;
    let granted = (huge.deadline - before).num_milliseconds();
    assert!(
        (2_500..=3_600).contains(&granted),
        "clamped to the 3 s maximum, got {granted} ms"
    );
    let default = d.claim(claim_req("ns", "default", 0)).await.unwrap().record;
    let granted = (default.deadline - before).num_milliseconds();
    assert!(
        (1_500..=2_600).contains(&granted),
        "0 means the 2 s default, got {granted} ms"
    );

    // Renew: longer applies, shorter only when allowed.
    let (d1, changed) = d.renew(None, &huge.id, 3, false).await.unwrap();
    assert!(changed && d1 >= huge.deadline);
    let (d2, changed) = d.renew(None, &huge.id, 1, false).await.unwrap();
    assert!(
        !changed,
        "a shorter lease is not applied without allow_shorter"
    );
    assert_eq!(d2, d1);
    let (d3, changed) = d.renew(None, &huge.id, 2, true).await.unwrap();
    assert!(changed && d3 < d1, "allow_shorter shortens");
    let e = d
        .renew(None, "sb_0123456789abcdef", 10, false)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);

    // Pause one: its lease stops running. The running one is reaped at its deadline, the
    // paused one outlives its own deadline and is reaped when its paused retention ends.
    let (paused, changed) = d.set_paused(None, &default.id, true).await.unwrap();
    assert!(changed);
    let retained = paused
        .paused
        .expect("a paused record says until when it is kept");
    let kept = (retained.until - retained.at).num_seconds();
    assert!((5..=6).contains(&kept), "retention of 6 s, got {kept}");
    let e = d.renew(None, &default.id, 3, true).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Conflict, "a paused lease does not run");
    assert_eq!(SandboxClient::of(&huge).health(), 204);
    for r in [&huge, &default] {
        assert!(!processes_under(std::path::Path::new(&r.state_dir)).is_empty());
    }
    eventually(Duration::from_secs(15), "the running lease reaped", || {
        !std::path::Path::new(&huge.state_dir).exists()
    })
    .await;
    assert!(
        Utc::now() > default.deadline,
        "past the paused one's old deadline"
    );
    let still = d.get(None, &default.id).await.unwrap();
    assert_eq!(still.phase, Phase::Paused);
    assert!(!processes_under(std::path::Path::new(&default.state_dir)).is_empty());
    let sandboxes = node.sandboxes_dir();
    eventually(
        Duration::from_secs(15),
        "both reaped with processes and directories",
        || processes_under(&sandboxes).is_empty() && dir_entries(&sandboxes).is_empty(),
    )
    .await;
    for r in [&huge, &default] {
        let e = d.get(None, &r.id).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(!std::path::Path::new(&r.state_dir).exists());
    }
    stop_all(&tmp, d, &mut [node]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_resume_fork_and_checkpoint_names() {
    let (tmp, token) = workspace();
    let node = NodeProc::start(
        "verbs",
        &tmp.path().join("verbs"),
        &token,
        "127.0.0.1:0",
        &["--pool", "base=1"],
    );
    let d = dispatcher(TOKEN, &[&node]);
    d.wait_for_nodes(1, Duration::from_secs(30)).await.unwrap();
    let parent = d
        .claim(claim_req("team", "parent", 600))
        .await
        .unwrap()
        .record;
    let sandbox = SandboxClient::of(&parent);
    assert_eq!(sandbox.health(), 204);

    // Pause freezes the sandbox; pausing again reports no change.
    let (r, changed) = d.set_paused(Some("team"), &parent.id, true).await.unwrap();
    assert!(changed);
    assert_eq!(r.phase, Phase::Paused);
    assert_eq!(
        sandbox.health(),
        409,
        "the node opens no tunnel into a paused sandbox"
    );
    let (r, changed) = d.set_paused(Some("team"), &parent.id, true).await.unwrap();
    assert!(!changed);
    assert_eq!(r.phase, Phase::Paused);
    let (r, changed) = d.set_paused(Some("team"), &parent.id, false).await.unwrap();
    assert!(changed);
    assert_eq!(r.phase, Phase::Running);
    assert_eq!(sandbox.health(), 204);
    assert_eq!(
        sandbox.run("echo alive").stdout,
        "alive\n",
        "processes thawed"
    );
    let (_, changed) = d.set_paused(Some("team"), &parent.id, false).await.unwrap();
    assert!(!changed);

    // Fork count limits, with the range in the message.
    for bad in [0, 17] {
        let e = d.fork(Some("team"), &parent.id, bad, 30).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid);
        assert!(e.message.contains("1..16"), "{e}");
    }
    // Children copy the parent's state, get their own leases, keep request order and names.
    assert_eq!(
        sandbox.write("/home/user/notes.txt", b"from parent").status,
        200
    );
    let before = Utc::now();
    let children = d.fork(Some("team"), &parent.id, 3, 20).await.unwrap();
    assert_eq!(children.len(), 3);
    for c in &children {
        assert_eq!(c.node, parent.node);
        assert_eq!(c.claim_ref, format!("team/{}", c.id));
        assert_eq!(c.forked_from.as_deref(), Some(parent.id.as_str()));
        let lease = (c.deadline - before).num_seconds();
        assert!(
            (18..=21).contains(&lease),
            "child lease from its own ttl, got {lease} s"
        );
        assert_ne!(c.token, parent.token);
        let child = SandboxClient::of(c);
        assert_eq!(child.read("/home/user/notes.txt").body, b"from parent");
        assert_eq!(child.health(), 204);
        // Readable at once by id and by name in the parent's namespace.
        assert_eq!(d.get(Some("team"), &c.id).await.unwrap().id, c.id);
        assert_eq!(d.find_by_name("team", &c.id).await.unwrap()[0].id, c.id);
    }
    // The source keeps running after the fork.
    assert_eq!(d.get(None, &parent.id).await.unwrap().phase, Phase::Running);
    assert_eq!(sandbox.health(), 204);
    // A paused parent forks without waking and stays paused.
    d.set_paused(None, &parent.id, true).await.unwrap();
    let kid = d.fork(None, &parent.id, 1, 0).await.unwrap();
    let lease = (kid[0].deadline - Utc::now()).num_seconds();
    assert!(
        (290..=301).contains(&lease),
        "ttl 0 gives the node default, got {lease}"
    );
    assert_eq!(d.get(None, &parent.id).await.unwrap().phase, Phase::Paused);
    d.set_paused(None, &parent.id, false).await.unwrap();

    // Checkpoint names: 63 characters fit, 64 do not, odd characters are refused.
    let ok = "a".repeat(63);
    let ck = d
        .create_checkpoint(None, &parent.id, &ok, false)
        .await
        .unwrap();
    assert!(ids::is_checkpoint_id(&ck.id));
    assert_eq!(ck.name, ok);
    for bad in [
        "a".repeat(64),
        "-starts-badly".to_string(),
        "has space".to_string(),
    ] {
        let e = d
            .create_checkpoint(None, &parent.id, &bad, false)
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid, "{bad}");
    }
    // The node checks too, not only the dispatcher.
    let conn = NodeConn::new(&node.addr, TOKEN).unwrap();
    let status = conn
        .client()
        .create_checkpoint(sandbox_gateway::proto::CreateCheckpointRequest {
            id: parent.id.clone(),
            name: "b".repeat(64),
            memory: false,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("at most 63"),
        "{}",
        status.message()
    );

    // Stats are measurements of the sandbox's processes and files.
    assert_eq!(
        sandbox
            .write("/home/user/big.bin", &vec![1u8; 2 << 20])
            .status,
        200
    );
    let s = d.stats(None, &parent.id).await.unwrap();
    assert!(s.mem_used_measured && s.mem_used_bytes > 1 << 20, "{s:?}");
    assert!(s.disk_used_bytes >= 2 << 20, "{s:?}");
    assert!(s.process_count >= 1);
    assert_eq!(s.mem_total_bytes, 512 << 20);

    // Releasing removes processes and directories of every sandbox.
    for c in children
        .iter()
        .chain(kid.iter())
        .chain(std::iter::once(&parent))
    {
        d.release(None, &c.id).await.unwrap();
        let e = d.release(None, &c.id).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
    }
    for c in children.iter().chain(std::iter::once(&parent)) {
        let dir = std::path::PathBuf::from(&c.state_dir);
        eventually(Duration::from_secs(10), "released sandbox is gone", || {
            !dir.exists() && processes_under(&dir).is_empty()
        })
        .await;
    }
    d.delete_checkpoint(&ck.id, "").await.unwrap();
    assert_eq!(
        d.delete_checkpoint(&ck.id, "").await.unwrap_err().kind,
        ErrorKind::NotFound
    );
    assert!(dir_entries(&node.data_dir.join("checkpoints")).is_empty());
    stop_all(&tmp, d, &mut [node]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn checkpoints_survive_restarts_and_lost_claims_are_reported() {
    let (tmp, token) = workspace();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut node = NodeProc::start(
        "durable",
        &tmp.path().join("durable"),
        &token,
        &listen,
        &["--pool", "base=1"],
    );
    let d = dispatcher(TOKEN, &[&node]);
    d.wait_for_nodes(1, Duration::from_secs(30)).await.unwrap();

    let src = d.claim(claim_req("team", "src", 600)).await.unwrap().record;
    assert_eq!(
        SandboxClient::of(&src)
            .write("/home/user/data.txt", b"keep me")
            .status,
        200
    );
    let ck = d
        .create_checkpoint(None, &src.id, "team/before", false)
        .await
        .unwrap();
    let other = d
        .create_checkpoint(None, &src.id, "elsewhere/x", false)
        .await
        .unwrap();

    // Crash: SIGKILL. The agents follow their node down.
    node.proc.kill();
    eventually(
        Duration::from_secs(10),
        "agents exit with their node",
        || processes_under(&node.sandboxes_dir()).is_empty(),
    )
    .await;
    node.restart();
    let listing = {
        let mut l = d.list_checkpoints(&CheckpointFilter::default()).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !l.unreachable.is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            l = d.list_checkpoints(&CheckpointFilter::default()).await;
        }
        l
    };
    let ids_listed: Vec<_> = listing.checkpoints.iter().map(|c| c.id.clone()).collect();
    assert_eq!(
        ids_listed,
        vec![other.id.clone(), ck.id.clone()],
        "newest first, both kept"
    );

    // The claim whose instance died is reported, not forgotten.
    let e = d.get(None, &src.id).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(e.message.contains("is gone"), "{e}");
    d.wait_for_nodes(1, Duration::from_secs(10)).await.unwrap();
    let info = NodeConn::new(&node.addr, TOKEN)
        .unwrap()
        .info(Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        info.lost
            .iter()
            .any(|l| l.id == src.id && l.claim_ref == "team/src"),
        "{:?}",
        info.lost
    );

    // Branching from the checkpoint gives a fresh sandbox with the saved state.
    let branch = d
        .claim_from_checkpoint(&ck.id, "team/", claim_req("team", "branch", 60))
        .await
        .unwrap()
        .record;
    assert_ne!(branch.id, src.id);
    assert_eq!(branch.from_checkpoint.as_deref(), Some(ck.id.as_str()));
    assert_eq!(
        SandboxClient::of(&branch).read("/home/user/data.txt").body,
        b"keep me"
    );
    // Scoped by name prefix: another tenant cannot branch from or delete it.
    let e = d
        .claim_from_checkpoint(&ck.id, "intruder/", claim_req("intruder", "x", 60))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert_eq!(
        d.delete_checkpoint(&ck.id, "intruder/")
            .await
            .unwrap_err()
            .kind,
        ErrorKind::NotFound
    );

    // A graceful stop destroys sandboxes, keeps checkpoints, and reports the claims.
    node.proc.terminate();
    assert!(dir_entries(&node.sandboxes_dir()).is_empty());
    node.restart();
    let info = NodeConn::new(&node.addr, TOKEN)
        .unwrap()
        .info(Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(info.checkpoints, 2);
    assert!(
        info.lost
            .iter()
            .any(|l| l.id == branch.id && l.reason.contains("shut down")),
        "{:?}",
        info.lost
    );
    stop_all(&tmp, d, &mut [node]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_token_is_required() {
    let (tmp, token) = workspace();
    let node = NodeProc::start(
        "locked",
        &tmp.path().join("locked"),
        &token,
        "127.0.0.1:0",
        &["--pool", "base=0"],
    );
    let wrong = NodeConn::new(&node.addr, "not-the-token").unwrap();
    let e = wrong.info(Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unauthenticated, "{e}");
    // No token at all.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut bare = sandbox_gateway::proto::node_client::NodeClient::new(channel);
    let status = bare
        .info(sandbox_gateway::proto::InfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let status = bare
        .claim(sandbox_gateway::proto::ClaimRequest {
            key: Some((&PoolKey::base()).into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    // A dispatcher with the wrong token never counts the node as up.
    let d = dispatcher("not-the-token", &[&node]);
    assert!(
        d.wait_for_nodes(1, Duration::from_millis(800))
            .await
            .is_err()
    );
    let e = d.claim(claim_req("ns", "x", 10)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable);
    stop_all(&tmp, d, &mut [node]).await;
}

/// Waits until `n`'s warm pool of `base` holds `want`.
async fn wait_pool_full(n: &NodeProc, want: u32) {
    let conn = NodeConn::new(&n.addr, TOKEN).unwrap();
    let mut warm = 0;
    for _ in 0..600 {
        warm = conn
            .info(Duration::from_secs(5))
            .await
            .unwrap()
            .warm(&PoolKey::base());
        if warm == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(warm, want, "pool of {} did not fill", n.name);
}

/// SIGSTOPs `n` and waits until every thread of it has stopped (a group stop is asynchronous).
async fn stop_node(n: &mut NodeProc) {
    n.proc.signal(libc::SIGSTOP);
    let pid = n.proc.child.id();
    eventually(Duration::from_secs(10), "the node is stopped", || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .all(|t| {
                let stat =
                    std::fs::read_to_string(t.unwrap().path().join("stat")).unwrap_or_default();
                stat.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('T'))
            })
    })
    .await;
}

/// Two nodes with full pools of `base`: `fuller` (6 warm, which the dispatcher picks) and
/// `spare` (1), and a dispatcher that reads them once and does not poll again during the test,
/// so its choice does not depend on timing.
async fn fuller_and_spare(
    fuller: &str,
    claim_timeout: Duration,
) -> (tempfile::TempDir, [NodeProc; 2], Dispatcher) {
    let (tmp, token) = workspace();
    let nodes = [(fuller, 6), ("spare", 1)].map(|(name, warm)| {
        NodeProc::start(
            name,
            &tmp.path().join(name),
            &token,
            "127.0.0.1:0",
            &["--pool", &format!("base={warm}")],
        )
    });
    for (n, want) in nodes.iter().zip([6, 1]) {
        wait_pool_full(n, want).await;
    }
    let cfg = sandbox_gateway::dispatch::DispatcherConfig {
        info_interval: Duration::from_secs(600),
        claim_timeout,
        ..Default::default()
    };
    let d = Dispatcher::new(cfg, TOKEN);
    for n in &nodes {
        d.add_node(&n.addr).unwrap();
    }
    d.wait_for_nodes(2, Duration::from_secs(30)).await.unwrap();
    (tmp, nodes, d)
}

/// A node that dies with a claim on its socket (the connection the claim went out on breaks
/// under it) refuses connections afterwards: the claim is as good as refused and goes to
/// another node, where it once answered "outcome unknown" (504) under CI's load. The check
/// tries for up to two seconds: a kill on a loaded machine once took longer than one look.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_to_a_node_that_dies_under_it_goes_to_another() {
    let (tmp, [mut doomed, spare], d) = fuller_and_spare("doomed", Duration::from_secs(20)).await;
    stop_node(&mut doomed).await;
    let claiming = d.clone();
    let claim = tokio::spawn(async move { claiming.claim(claim_req("ns", "moved", 60)).await });
    // The claim sits in the stopped node's socket; the node dies without reading it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    doomed.proc.kill();
    let c = claim
        .await
        .unwrap()
        .expect("the claim is served by the node that is left");
    assert_eq!(c.record.node, "spare");
    // Its agents go down with it (their lifeline closes); its next start removes what it left.
    let doomed_dir = doomed.sandboxes_dir();
    eventually(
        Duration::from_secs(10),
        "agents of a killed node exit",
        || processes_under(&doomed_dir).is_empty(),
    )
    .await;
    doomed.restart();
    stop_all(&tmp, d, &mut [doomed, spare]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_with_an_unknown_outcome_is_not_sent_again() {
    let (tmp, [mut slow, spare], d) = fuller_and_spare("slow", Duration::from_millis(700)).await;

    // The node with more warm capacity wins both power-of-two samples; freeze it so that the
    // claim reaches its socket but gets no answer.
    stop_node(&mut slow).await;
    let e = match d.claim(claim_req("ns", "maybe", 60)).await {
        Ok(c) => panic!(
            "claim succeeded on {} (nodes {:?})",
            c.record.node,
            d.nodes()
        ),
        Err(e) => e,
    };
    assert_eq!(e.kind, ErrorKind::OutcomeUnknown, "{e}");
    let spare_conn = NodeConn::new(&spare.addr, TOKEN).unwrap();
    assert_eq!(
        spare_conn
            .info(Duration::from_secs(5))
            .await
            .unwrap()
            .claimed,
        0,
        "the claim was not re-sent elsewhere"
    );

    // Once the node runs again the claim it received takes effect: re-sending would have
    // claimed twice.
    slow.proc.signal(libc::SIGCONT);
    let slow_conn = NodeConn::new(&slow.addr, TOKEN).unwrap();
    let mut claimed = 0;
    for _ in 0..100 {
        claimed = slow_conn
            .info(Duration::from_secs(5))
            .await
            .unwrap()
            .claimed;
        if claimed == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(claimed, 1);
    stop_all(&tmp, d, &mut [slow, spare]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_that_does_not_fit_creates_nothing() {
    let (tmp, token) = workspace();
    let node = NodeProc::start(
        "small",
        &tmp.path().join("small"),
        &token,
        "127.0.0.1:0",
        &["--pool", "base=0", "--max-sandboxes", "3"],
    );
    let d = dispatcher(TOKEN, &[&node]);
    d.wait_for_nodes(1, Duration::from_secs(30)).await.unwrap();
    let parent = d.claim(claim_req("ns", "p", 60)).await.unwrap().record;
    let e = d.fork(None, &parent.id, 3, 60).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoCapacity, "{e}");
    let conn = NodeConn::new(&node.addr, TOKEN).unwrap();
    assert_eq!(
        conn.info(Duration::from_secs(5)).await.unwrap().claimed,
        1,
        "no child was left behind"
    );
    assert_eq!(dir_entries(&node.sandboxes_dir()).len(), 1);
    let kids = d.fork(None, &parent.id, 2, 60).await.unwrap();
    assert_eq!(kids.len(), 2);
    stop_all(&tmp, d, &mut [node]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_that_die_are_noticed() {
    let (tmp, token) = workspace();
    let node = NodeProc::start(
        "fragile",
        &tmp.path().join("fragile"),
        &token,
        "127.0.0.1:0",
        &["--pool", "base=2", "--no-cold-start"],
    );
    let d = dispatcher(TOKEN, &[&node]);
    d.wait_for_nodes(1, Duration::from_secs(30)).await.unwrap();
    wait_warm(&d, 2, 1).await;

    // Kill one warm agent from outside: the next claims still get running sandboxes.
    let warm = dir_entries(&node.sandboxes_dir());
    let victim = node.sandboxes_dir().join(&warm[0]);
    let killed = processes_under(&victim);
    for &pid in &killed {
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    // SIGKILL lands asynchronously, and a dying process loses its command line before it is a
    // zombie: the claim below is about an instance whose every process has finished exiting.
    eventually(Duration::from_secs(5), "the warm agent dies", || {
        processes_under(&victim).is_empty() && killed.iter().all(|&p| has_exited(p))
    })
    .await;
    let a = d.claim(claim_req("ns", "a", 600)).await.unwrap().record;
    assert_ne!(
        a.state_dir,
        victim.display().to_string(),
        "a dead warm instance is never handed out"
    );
    assert_eq!(SandboxClient::of(&a).health(), 204);

    // Kill a claimed sandbox's agent: the node releases the claim and says why.
    for pid in processes_under(std::path::Path::new(&a.state_dir)) {
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let mut reason = String::new();
    for _ in 0..200 {
        match d.get(None, &a.id).await {
            Err(e) if e.kind == ErrorKind::NotFound => {
                reason = e.message;
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert!(reason.contains("exited on its own"), "{reason:?}");
    eventually(
        Duration::from_secs(10),
        "dead sandbox's directory removed",
        || !std::path::Path::new(&a.state_dir).exists(),
    )
    .await;
    stop_all(&tmp, d, &mut [node]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_cannot_share_a_data_directory() {
    let (tmp, token) = workspace();
    let dir = tmp.path().join("shared");
    let first = NodeProc::start("first", &dir, &token, "127.0.0.1:0", &["--pool", "base=0"]);
    let mut second = Proc::spawn(&[
        "node".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--data-dir".into(),
        dir.display().to_string(),
        "--token-file".into(),
        token.display().to_string(),
    ]);
    let status = second.wait_exit(Duration::from_secs(30));
    assert!(
        !status.success(),
        "a second node on the same data directory must refuse to start"
    );
    let d = dispatcher(TOKEN, &[&first]);
    d.wait_for_nodes(1, Duration::from_secs(30)).await.unwrap();
    // The refused node touched nothing of the first one's: it still boots and pauses sandboxes.
    let r = d.claim(claim_req("ns", "after", 60)).await.unwrap().record;
    assert!(d.set_paused(None, &r.id, true).await.unwrap().1);
    assert_eq!(SandboxClient::of(&r).health(), 409, "paused");
    stop_all(&tmp, d, &mut [first]).await;
}
