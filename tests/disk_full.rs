//! A full data directory on the node, through the real gateway binary and its embedded node:
//! the node's data directory is a small tmpfs that the test fills up. A snapshot answers 507
//! and leaves nothing listed or on disk, a create that needs a boot answers 503 (nothing was
//! claimed; come back later) and leaves no instance directory, running sandboxes keep
//! running, and once space is freed snapshots work and the pool refills. Each test ends by
//! printing its `disk-full-figure` lines (what the client got, how long it took, what was
//! left on disk), which `tests/reliability.sh disk-full` turns into RELIABILITY.md's table.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// Room for the blank disk image, two warm boots and what their sandboxes write.
const TMPFS_BYTES: u64 = 192 << 20;
/// What the filler leaves free: less than any sandbox disk image or snapshot needs.
const LEFT_FREE: u64 = 8 << 10;

/// A tmpfs mounted for the test, unmounted when dropped (also when the test panics).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, bytes: u64) -> std::io::Result<Tmpfs> {
        let target = CString::new(at.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
        let opts =
            CString::new(format!("size={bytes},mode=0755")).map_err(std::io::Error::other)?;
        // SAFETY: valid NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"sgw-disk-full".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                opts.as_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let Ok(target) = CString::new(self.0.as_os_str().as_bytes()) else {
            return;
        };
        // SAFETY: a valid path; MNT_DETACH so that a process still holding a file there
        // (after a failed assertion) cannot keep the mount, and its memory, alive.
        if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
            eprintln!(
                "unmounting the test tmpfs {} failed: {}",
                self.0.display(),
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Bytes an unprivileged writer may still write under `path`.
fn free_bytes(path: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(path).expect("statvfs");
    st.blocks_available() * st.fragment_size()
}

/// Fills the file system holding `dir` until `LEFT_FREE` bytes are left; returns the filler
/// and the bytes then free.
fn fill(dir: &Path) -> (PathBuf, u64) {
    let path = dir.join("filler");
    let f = std::fs::File::create(&path).expect("create filler");
    let len = free_bytes(dir).saturating_sub(LEFT_FREE);
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on a descriptor we own; tmpfs allocates the pages now.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) };
    assert_eq!(rc, 0, "fallocate: {}", std::io::Error::last_os_error());
    let free = free_bytes(dir);
    assert!(free <= LEFT_FREE + (64 << 10), "the tmpfs is full");
    (path, free)
}

/// An error reply: JSON `{code, message}` with the code equal to the status.
fn assert_error(r: &Reply, status: u16, needles: &[&str]) {
    assert_eq!(r.status.as_u16(), status, "{:?}", r.body);
    assert_eq!(r.body["code"], json!(status), "{:?}", r.body);
    let msg = r.body["message"]
        .as_str()
        .unwrap_or_default()
        .to_lowercase();
    assert!(
        needles.iter().any(|n| msg.contains(n)),
        "{msg:?} should mention one of {needles:?}"
    );
}

/// A header of a reply as the figures give it: its value, or `none`.
fn header(r: &Reply, name: &str) -> String {
    r.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none")
        .to_string()
}

/// The `message` of an error reply, for the figures.
fn message(r: &Reply) -> String {
    r.body["message"].as_str().unwrap_or_default().to_string()
}

async fn snapshot(gw: &Gateway, id: &str) -> Reply {
    gw.call(
        Method::POST,
        &format!("/sandboxes/{id}/snapshots"),
        Some(KEY_A),
        Some(json!({})),
    )
    .await
}

async fn snapshot_ids(gw: &Gateway) -> Vec<String> {
    let l = gw.call(Method::GET, "/snapshots", Some(KEY_A), None).await;
    assert_eq!(l.status, StatusCode::OK, "{:?}", l.body);
    l.body
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s["snapshotID"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_node_disk_answers_507_and_leaves_nothing_half_written() {
    let (tmp, _) = workspace();
    let node_dir = tmp.path().join("gw/node");
    std::fs::create_dir_all(&node_dir).unwrap();
    let _tmpfs = match Tmpfs::mount(&node_dir, TMPFS_BYTES) {
        Ok(m) => m,
        Err(e) => {
            eprintln!(
                "SKIPPED a_full_node_disk_answers_507_and_leaves_nothing_half_written: cannot mount a tmpfs at {} ({e}); the test needs root with CAP_SYS_ADMIN",
                node_dir.display()
            );
            return;
        }
    };
    let mut gw = Gateway::start(tmp.path(), &["--pool", "base=1"]);
    let sandboxes = node_dir.join("sandboxes");
    let checkpoints = node_dir.join("checkpoints");
    // Without internet access: the pool's key (`base`, net none), so the warm sandbox fits.
    let create = json!({
        "templateID": "base", "timeout": 600, "secure": true, "allow_internet_access": false
    });

    // A running sandbox, and the pool back at one warm sandbox.
    gw.wait_warm(1, "the warm pool").await;
    let a = gw.create(KEY_A, create.clone()).await;
    let a_id = a["sandboxID"].as_str().unwrap().to_string();
    // The refill has started once its directory is there; after one more poll of the node
    // (every second) the gateway's count is the refill's.
    eventually(Duration::from_secs(30), "the refill to start", || {
        dir_entries(&sandboxes).len() == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    gw.wait_warm(1, "the pool to refill").await;
    assert_eq!(gw.run(&a, "echo before").await, Ok((0, "before\n".into())));
    let booted = sorted(dir_entries(&sandboxes));
    assert_eq!(booted.len(), 2, "one claimed and one warm: {booted:?}");

    // The disk fills up.
    let (filler, free) = fill(&node_dir);
    let mut figures = Figures::new("disk-full");
    figures.add(&[
        ("case", "fill".into()),
        ("tmpfs_bytes", TMPFS_BYTES.to_string()),
        ("free_bytes", free.to_string()),
    ]);

    // A snapshot needs a copy of the sandbox's disk: 507, a message about space, not
    // listed, and nothing left under checkpoints/.
    let started = Instant::now();
    let r = snapshot(&gw, &a_id).await;
    let took = started.elapsed();
    assert_error(&r, 507, &["space", "full"]);
    assert!(r.headers.get("retry-after").is_none(), "{:?}", r.headers);
    let listed = snapshot_ids(&gw).await;
    assert!(listed.is_empty(), "a failed snapshot is not listed");
    let left = dir_entries(&checkpoints);
    assert!(left.is_empty(), "left under checkpoints/: {left:?}");
    figures.add(&[
        ("case", "snapshot".into()),
        ("status", r.status.as_u16().to_string()),
        ("ms", ms(took)),
        ("retry_after", header(&r, "retry-after")),
        ("listed", listed.len().to_string()),
        ("checkpoint_entries", left.len().to_string()),
        ("message", message(&r)),
    ]);

    // The warm sandbox needs no disk to be handed over.
    let started = Instant::now();
    let b = gw.create(KEY_A, create.clone()).await;
    figures.add(&[
        ("case", "create-warm".into()),
        ("status", "201".into()),
        ("ms", ms(started.elapsed())),
    ]);
    // The next create needs a boot, which has no room: no node could take it, so 503 with
    // Retry-After (like no capacity: nothing was claimed), naming the full disk.
    let started = Instant::now();
    let r = gw
        .call(
            Method::POST,
            "/v2/sandboxes",
            Some(KEY_A),
            Some(create.clone()),
        )
        .await;
    let took = started.elapsed();
    let refused_at = Instant::now();
    assert_error(&r, 503, &["data directory is full"]);
    assert!(r.headers.get("retry-after").is_some(), "{:?}", r.headers);
    // No instance directory outlives a failed boot (the pool's refills fail the same way;
    // one may be in flight for a moment).
    let extra_dirs = dir_entries(&sandboxes).len().saturating_sub(booted.len());
    eventually(
        Duration::from_secs(15),
        "only the two claimed sandboxes' directories",
        || sorted(dir_entries(&sandboxes)) == booted,
    )
    .await;
    let cleared = refused_at.elapsed();
    figures.add(&[
        ("case", "create-boot".into()),
        ("status", r.status.as_u16().to_string()),
        ("ms", ms(took)),
        ("retry_after", header(&r, "retry-after")),
        ("claimed_dirs", booted.len().to_string()),
        ("extra_dirs_at_answer", extra_dirs.to_string()),
        ("extra_dirs_gone_secs", secs(cleared)),
        // Counted, not asserted here: the claimed sandboxes' own cgroups are expected.
        ("cgroups", cgroup_instances(&node_dir).to_string()),
        ("message", message(&r)),
    ]);

    // The sandboxes that ran keep running, through a snapshot attempt (which froze and
    // thawed the source) and through a pause/resume round trip.
    assert_eq!(gw.run(&a, "echo still").await, Ok((0, "still\n".into())));
    assert_eq!(gw.run(&b, "echo b").await, Ok((0, "b\n".into())));
    let mut ran_on_full_disk = 2;
    let p = gw
        .call(
            Method::POST,
            &format!("/sandboxes/{a_id}/pause"),
            Some(KEY_A),
            None,
        )
        .await;
    assert_eq!(p.status, StatusCode::NO_CONTENT, "{:?}", p.body);
    let c = gw
        .call(
            Method::POST,
            &format!("/v2/sandboxes/{a_id}/connect"),
            Some(KEY_A),
            Some(json!({"timeout": 600})),
        )
        .await;
    assert_eq!(c.status, StatusCode::CREATED, "resumed: {:?}", c.body);
    assert_eq!(
        gw.run(&a, "echo resumed").await,
        Ok((0, "resumed\n".into()))
    );
    ran_on_full_disk += 1;
    figures.add(&[
        ("case", "running".into()),
        // Each exited 0 with its output (asserted above), one of them after the resume.
        ("commands_on_full_disk", ran_on_full_disk.to_string()),
        ("pause", p.status.as_u16().to_string()),
        ("resume", c.status.as_u16().to_string()),
    ]);

    // What a sandbox sees when it writes to its own disk while the host file system under
    // it is full (observed, not asserted: RELIABILITY.md, "A full data directory").
    let seen = gw.run(
        &b,
        "dd if=/dev/urandom of=/home/user/big bs=1M count=8 2>&1 | tail -1; sync; echo sync=$?; \
         cat /home/user/big >/dev/null 2>&1; echo read=$?",
    )
    .await;
    eprintln!("a sandbox writing 8 MiB on a full host disk: {seen:?}");
    let (exit, out) = seen.unwrap_or_else(|e| (-1, e));
    let field = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or("?")
            .to_string()
    };
    figures.add(&[
        ("case", "sandbox-write".into()),
        ("exit", exit.to_string()),
        ("dd", out.lines().next().unwrap_or_default().to_string()),
        ("sync", field("sync")),
        ("read", field("read")),
    ]);

    // Space comes back: the snapshot works and is listed, and the pool refills.
    let warm_while_full = gw.warm().await;
    std::fs::remove_file(&filler).unwrap();
    let freed_at = Instant::now();
    let s = snapshot(&gw, &a_id).await;
    let took = freed_at.elapsed();
    assert_eq!(s.status, StatusCode::CREATED, "{:?}", s.body);
    let snap = s.body["snapshotID"].as_str().unwrap().to_string();
    let listed = snapshot_ids(&gw).await;
    assert_eq!(listed, vec![snap.clone()]);
    assert_eq!(dir_entries(&checkpoints).len(), 1);
    gw.wait_warm(1, "the pool to refill once space is free")
        .await;
    let refilled = freed_at.elapsed();
    assert_eq!(gw.run(&a, "echo after").await, Ok((0, "after\n".into())));
    figures.add(&[
        ("case", "space-freed".into()),
        ("snapshot_status", s.status.as_u16().to_string()),
        ("snapshot_ms", ms(took)),
        ("listed", listed.len().to_string()),
        ("warm_while_full", warm_while_full.to_string()),
        ("refill_secs", secs(refilled)),
    ]);

    // Everything goes: the snapshot, the sandboxes, the gateway with its node.
    assert_eq!(
        gw.call(
            Method::DELETE,
            &format!("/templates/{snap}"),
            Some(KEY_A),
            None
        )
        .await
        .status,
        StatusCode::NO_CONTENT
    );
    assert!(dir_entries(&checkpoints).is_empty());
    for s in [&a, &b] {
        let id = s["sandboxID"].as_str().unwrap();
        assert_eq!(gw.kill(KEY_A, id).await, StatusCode::NO_CONTENT);
    }
    gw.proc.terminate();
    eventually(Duration::from_secs(10), "no process left", || {
        processes_under(tmp.path()).is_empty()
    })
    .await;
    // Under sandboxes/, not the whole test directory: the tmpfs is a mount of the test's own.
    assert_no_leaks(&sandboxes, &[sandboxes.clone(), node_dir.join("scratch")]).await;
    assert!(dir_entries(&checkpoints).is_empty());
    assert_eq!(cgroup_instances(&node_dir), 0, "instance cgroups left");
    // Counted after the assertions, so these are what the run left, not what it expected.
    figures.add(&[
        ("case", "end".into()),
        ("processes", processes_under(tmp.path()).len().to_string()),
        ("instance_dirs", dir_entries(&sandboxes).len().to_string()),
        (
            "checkpoint_entries",
            dir_entries(&checkpoints).len().to_string(),
        ),
        ("cgroups", cgroup_instances(&node_dir).to_string()),
        (
            "loop_devices_and_mounts",
            kernel_leftovers(&sandboxes).len().to_string(),
        ),
    ]);
    figures.print();
}

/// The node a sandbox of the e2b API runs on (its `clientID`).
fn node_of(sandbox: &Value) -> String {
    sandbox["clientID"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_with_a_full_disk_sends_boots_to_the_next_node() {
    let (tmp, token) = workspace();
    let full_dir = tmp.path().join("full");
    std::fs::create_dir_all(&full_dir).unwrap();
    let _tmpfs = match Tmpfs::mount(&full_dir, TMPFS_BYTES) {
        Ok(m) => m,
        Err(e) => {
            eprintln!(
                "SKIPPED a_node_with_a_full_disk_sends_boots_to_the_next_node: cannot mount a tmpfs at {} ({e}); the test needs root with CAP_SYS_ADMIN",
                full_dir.display()
            );
            return;
        }
    };
    // No warm pools: every create boots, on the node with fewer claims first.
    let flags = ["--pool", "base=0"];
    let mut full = NodeProc::start("full", &full_dir, &token, "127.0.0.1:0", &flags);
    let roomy_dir = tmp.path().join("roomy");
    let mut roomy = NodeProc::start("roomy", &roomy_dir, &token, "127.0.0.1:0", &flags);
    let token_arg = token.display().to_string();
    let mut gw = Gateway::start(
        tmp.path(),
        &[
            "--node",
            &full.addr,
            "--node",
            &roomy.addr,
            "--node-token-file",
            &token_arg,
        ],
    );
    for _ in 0..300 {
        if gw.metric("sandbox_gateway_nodes_up").await == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(gw.metric("sandbox_gateway_nodes_up").await, 2);
    let create = json!({
        "templateID": "base", "timeout": 600, "secure": true, "allow_internet_access": false
    });

    // A sandbox on each node (the second create goes to the node without one), so both have
    // booted once; then the full node's is killed: it has fewer claims and is tried first.
    let mut made: Vec<Value> = Vec::new();
    while !made.iter().any(|s| node_of(s) == "full") {
        assert!(made.len() < 6, "no create landed on node full: {made:?}");
        made.push(gw.create(KEY_A, create.clone()).await);
    }
    let (on_full, kept): (Vec<Value>, Vec<Value>) =
        made.into_iter().partition(|s| node_of(s) == "full");
    for s in &on_full {
        assert_eq!(
            gw.kill(KEY_A, s["sandboxID"].as_str().unwrap()).await,
            StatusCode::NO_CONTENT
        );
    }
    let full_sandboxes = full.sandboxes_dir();
    eventually(Duration::from_secs(15), "node full's sandbox gone", || {
        dir_entries(&full_sandboxes).is_empty()
    })
    .await;
    let kept = if kept.is_empty() {
        vec![gw.create(KEY_A, create.clone()).await]
    } else {
        kept
    };
    assert!(kept.iter().all(|s| node_of(s) == "roomy"), "{kept:?}");
    // The gateway's claim counts come from the nodes' reports (every second).
    tokio::time::sleep(Duration::from_millis(2500)).await;

    let (_filler, free) = fill(&full_dir);
    // Node full is preferred (no claims) and refuses with a full disk; roomy boots it.
    let mut landed = Vec::new();
    let mut slowest = Duration::ZERO;
    for _ in 0..2 {
        let started = Instant::now();
        let s = gw.create(KEY_A, create.clone()).await;
        slowest = slowest.max(started.elapsed());
        assert_eq!(node_of(&s), "roomy", "{s:?}");
        landed.push(s);
    }
    let left = dir_entries(&full_sandboxes);
    assert!(left.is_empty(), "the full node left {left:?}");
    let cgroups = cgroup_instances(&full_dir);
    assert_eq!(cgroups, 0, "the full node left cgroups");
    let mut figures = Figures::new("disk-full");
    figures.add(&[
        ("case", "next-node".into()),
        ("free_bytes", free.to_string()),
        ("creates", landed.len().to_string()),
        // Every create answered 201 (Gateway::create asserts it).
        (
            "created_on_roomy",
            landed
                .iter()
                .filter(|s| node_of(s) == "roomy")
                .count()
                .to_string(),
        ),
        ("max_ms", ms(slowest)),
        ("full_instance_dirs", left.len().to_string()),
        ("full_cgroups", cgroups.to_string()),
    ]);

    for s in kept.iter().chain(&landed) {
        assert_eq!(
            gw.kill(KEY_A, s["sandboxID"].as_str().unwrap()).await,
            StatusCode::NO_CONTENT
        );
    }
    gw.proc.terminate();
    full.proc.terminate();
    roomy.proc.terminate();
    eventually(Duration::from_secs(10), "no process left", || {
        processes_under(tmp.path()).is_empty()
    })
    .await;
    for dir in [&full_sandboxes, &roomy.sandboxes_dir()] {
        assert_no_leaks(dir, &[dir.to_path_buf()]).await;
    }
    assert_eq!(cgroup_instances(&roomy_dir), 0, "instance cgroups left");
    figures.print();
}
