//! The gvisor runtime on a real node with real runsc sandboxes: memory that survives pause,
//! resume, forks and snapshots (a counter and a server's state held only in a process's
//! memory), the boundary probed from inside, refusals that leave the sandbox running, a node
//! killed during a checkpoint, a fork whose checkpoint fails, and no leaks. Skips, saying why, only where runsc is absent.

mod common;

use std::net::TcpListener;
use std::time::Duration;

use common::*;
use sandbox_gateway::dispatch::Dispatcher;
use sandbox_gateway::model::SandboxRecord;

/// runsc on PATH, or why the tests here cannot run.
fn runsc() -> Option<String> {
    let found = std::process::Command::new("runsc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        println!("skipped: runsc is not installed (apt-get install runsc); CI installs it");
        return None;
    }
    Some("runsc".into())
}

/// Whether the installed runsc checkpoints what bookworm's cannot (connections, epoll-watched
/// sockets): trixie's 20240729, which .ci/run installs.
fn runsc_saves_more() -> bool {
    use sandbox_gateway::node::runtime::gvisor::runsc::{build_date, version_on_path};
    version_on_path()
        .and_then(|v| build_date(&v))
        .is_some_and(|d| d >= 20240729)
}

async fn claim(d: &Dispatcher, name: &str, net: &str) -> (SandboxRecord, SandboxClient) {
    claim_small(d, "gv", name, net).await
}

fn node(tmp: &tempfile::TempDir, token: &std::path::Path, pools: &[&str]) -> NodeProc {
    node_with(tmp, token, pools, &[])
}

/// `node`, with more of the node's flags.
fn node_with(
    tmp: &tempfile::TempDir,
    token: &std::path::Path,
    pools: &[&str],
    extra: &[&str],
) -> NodeProc {
    let mut args = vec!["--runtime", "gvisor"];
    for p in pools {
        args.extend(["--pool", p]);
    }
    args.extend(extra);
    NodeProc::start("gv", &tmp.path().join("node"), token, "127.0.0.1:0", &args)
}

/// A process whose only state is in its memory: a counter it increments every 20 ms and
/// reports with its pid in /tmp/counter, and a one-threaded HTTP server on port 8000 (poll,
/// not epoll, so this gVisor build can checkpoint it) whose value lives in a variable.
const MEMORY_HOLDER: &str = r#"
import http.server, os, threading, time
state = {"value": "initial", "count": 0}
def count():
    while True:
        state["count"] += 1
        with open("/tmp/counter.tmp", "w") as f:
            f.write("%d %d" % (state["count"], os.getpid()))
        os.replace("/tmp/counter.tmp", "/tmp/counter")
        time.sleep(0.02)
threading.Thread(target=count, daemon=True).start()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/set/"):
            state["value"] = self.path[5:]
        body = ("%s %d %d" % (state["value"], state["count"], os.getpid())).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
"#;

fn start_holder(c: &SandboxClient) {
    let w = c.write("/tmp/holder.py", MEMORY_HOLDER.as_bytes());
    assert_eq!(w.status, 200, "{}", w.text());
    let r = c
        .run("setsid nohup python3 /tmp/holder.py >/tmp/holder.log 2>&1 & sleep 0.5; echo started");
    assert!(r.stdout.contains("started"), "{r:?}");
}

/// (count, pid) from the counter file.
fn counter(c: &SandboxClient) -> (u64, u32) {
    let text = c.read("/tmp/counter").text();
    let mut f = text.split_whitespace();
    let n = f.next().and_then(|v| v.parse().ok());
    let p = f.next().and_then(|v| v.parse().ok());
    match (n, p) {
        (Some(n), Some(p)) => (n, p),
        _ => panic!("unreadable counter: {text:?}"),
    }
}

/// The server's (value, count, pid).
fn server(c: &SandboxClient, path: &str) -> (String, u64, u32) {
    let a = c
        .request(8000, "GET", path, &[], b"")
        .unwrap_or_else(|e| panic!("the server in the sandbox: {e:?}"));
    assert_eq!(a.status, 200, "{}", a.text());
    let text = a.text();
    let f: Vec<&str> = text.split_whitespace().collect();
    (
        f[0].to_string(),
        f[1].parse().unwrap(),
        f[2].parse().unwrap(),
    )
}

async fn wait_holder(c: &SandboxClient) {
    for _ in 0..200 {
        if c.read("/tmp/counter").status == 200 && c.tunnel(8000).is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the memory holder did not start: {}",
        c.read("/tmp/holder.log").text()
    );
}

/// The counter advances from at least `from` in the process `pid`: the process kept running
/// with its memory, it was not started again.
async fn keeps_counting(c: &SandboxClient, from: u64, pid: u32, what: &str) -> u64 {
    let (n1, p1) = counter(c);
    assert_eq!(p1, pid, "{what}: the same process (pid) goes on");
    assert!(
        n1 >= from,
        "{what}: the count goes on from {from}, not from zero: {n1}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (n2, _) = counter(c);
    assert!(n2 > n1, "{what}: still counting ({n1} then {n2})");
    n2
}

/// The node's runsc containers whose names start with `prefix`, each with its status.
fn runsc_statuses(data_dir: &std::path::Path, prefix: &str) -> Vec<(String, String)> {
    let out = std::process::Command::new("runsc")
        .arg("--root")
        .arg(data_dir.join("runsc"))
        .arg("list")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    out.lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.len() >= 3 && cols[0].starts_with(prefix))
                .then(|| (cols[0].to_string(), cols[2].to_string()))
        })
        .collect()
}

fn runsc_containers(data_dir: &std::path::Path) -> Vec<String> {
    let out = std::process::Command::new("runsc")
        .arg("--root")
        .arg(data_dir.join("runsc"))
        .args(["list", "-quiet"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

async fn stop(tmp: &tempfile::TempDir, d: Dispatcher, mut node: NodeProc) {
    d.shutdown().await;
    let dir = node.sandboxes_dir();
    let data = node.data_dir.clone();
    node.proc.terminate();
    assert_no_leaks(tmp.path(), &[dir]).await;
    assert_eq!(cgroup_instances(&data), 0, "sandbox cgroups left behind");
    assert!(
        runsc_containers(&data).is_empty(),
        "runsc containers left behind"
    );
    // Nor a held restore's FIFO, nor a runsc command's error file.
    let left: Vec<String> = dir_entries(&data.join("runsc"))
        .into_iter()
        .filter(|f| f.ends_with(".hold") || f.ends_with(".stderr"))
        .collect();
    assert!(left.is_empty(), "runsc files left behind: {left:?}");
    assert!(
        dir_entries(&data.join("checkpoints")).is_empty(),
        "checkpoint data left behind"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_survives_pause_resume_forks_and_snapshots() {
    if runsc().is_none() {
        return;
    }
    let (tmp, token) = workspace();
    let node = node(&tmp, &token, &["base=1"]);
    let d = dispatcher(TOKEN, &[&node]);
    d.wait_for_nodes(1, Duration::from_secs(30)).await.unwrap();
    // A gVisor node lets its sandboxes' memory have huge pages where the host gave shared
    // memory none (restores fault it back far faster; see runtime/gvisor/hostmem.rs).
    let shmem = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
        .unwrap_or_default();
    assert!(!shmem.contains("[never]"), "shmem_enabled: {shmem}");
    let (a_rec, a) = claim(&d, "a", "none").await;
    start_holder(&a);
    wait_holder(&a).await;
    server(&a, "/set/before-pause");
    let (n0, pid) = counter(&a);

    // Pause writes the memory to the node's disk and stops the sandbox; resume restores it.
    let sentries = |instance: &str| -> Vec<i32> {
        processes_under(&node.sandboxes_dir())
            .into_iter()
            .filter(|p| {
                std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                    let c = String::from_utf8_lossy(&c);
                    c.starts_with("runsc-sandbox") && c.contains(instance)
                })
            })
            .collect()
    };
    let instance = std::path::Path::new(&a_rec.state_dir)
        .file_name()
        .map(|i| i.to_string_lossy().into_owned())
        .unwrap_or_default();
    let running = sentries(&instance);
    assert!(!running.is_empty(), "the sandbox's Sentry runs");
    let (rec, changed) = d.set_paused(None, &a_rec.id, true).await.unwrap();
    assert!(changed, "{rec:?}");
    let images: Vec<_> = dir_entries(&node.sandboxes_dir())
        .into_iter()
        .map(|i| node.sandboxes_dir().join(i).join("paused"))
        .filter(|p| p.join("checkpoint.img").exists())
        .collect();
    assert_eq!(
        images.len(),
        1,
        "a checkpoint on the node's disk while paused"
    );
    let image = &images[0];
    assert!(image.starts_with(&a_rec.state_dir), "{}", image.display());
    // The paused sandbox's own Sentry ends, with its memory (the node finishes its teardown
    // after it answers), and, where runsc can restore into one, a standby is made for its
    // resume: a new container, created and not started, whose Sentry holds no memory of the
    // sandbox's yet.
    eventually(
        Duration::from_secs(10),
        "the paused sandbox's Sentry ends",
        || sentries(&instance).iter().all(|p| !running.contains(p)),
    )
    .await;
    assert!(
        image.join("checkpoint.img").exists(),
        "runsc's image in {}",
        image.display()
    );
    if runsc_saves_more() {
        eventually(
            Duration::from_secs(10),
            "a standby container for the resume",
            || {
                let s = runsc_statuses(&node.data_dir, &instance);
                s.len() == 1 && s[0].1 == "created"
            },
        )
        .await;
        let standby = runsc_statuses(&node.data_dir, &instance)[0].0.clone();
        // The standby's restore is started and held before it reads anything: one waits, and
        // keeps waiting (the container stays created) until the resume comes.
        eventually(
            Duration::from_secs(10),
            "a held restore for the standby",
            || held_restores(&node.data_dir, &standby).len() == 1,
        )
        .await;
        let held = held_restores(&node.data_dir, &standby);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            held_restores(&node.data_dir, &standby),
            held,
            "the held restore waits"
        );
        assert_eq!(
            runsc_statuses(&node.data_dir, &instance),
            [(standby.clone(), "created".to_string())],
            "a held restore loads nothing"
        );
        d.set_paused(None, &a_rec.id, false).await.unwrap();
        assert_eq!(
            runsc_statuses(&node.data_dir, &instance),
            [(standby.clone(), "running".to_string())],
            "the resume restored into the standby"
        );
        assert!(
            held_restores(&node.data_dir, &standby).is_empty(),
            "the held restore went on and ended"
        );
    } else {
        // This runsc cannot restore into a container made ahead: no standby is made, and the
        // resume restores into a new container.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            runsc_statuses(&node.data_dir, &instance).is_empty(),
            "no standby where runsc cannot restore into one"
        );
        d.set_paused(None, &a_rec.id, false).await.unwrap();
        let s = runsc_statuses(&node.data_dir, &instance);
        assert!(
            s.len() == 1 && s[0].1 == "running",
            "the resume restored into a new container: {s:?}"
        );
    }
    let n1 = keeps_counting(&a, n0, pid, "after resume").await;
    let (value, _, server_pid) = server(&a, "/");
    assert_eq!(value, "before-pause", "the server's memory survived");
    assert_eq!(server_pid, pid);

    // Fork: two children continue from the source's memory and then diverge; the source
    // keeps running.
    let children = d.fork(None, &a_rec.id, 2, 300).await.unwrap();
    assert_eq!(children.len(), 2);
    let kids: Vec<SandboxClient> = children.iter().map(SandboxClient::of).collect();
    for (i, k) in kids.iter().enumerate() {
        keeps_counting(k, n1, pid, &format!("fork child {i}")).await;
        assert_eq!(
            server(k, "/").0,
            "before-pause",
            "child {i} starts from the source's memory"
        );
        server(k, &format!("/set/child-{i}"));
    }
    assert!(
        held_restores(&node.data_dir, "").is_empty(),
        "the children's restores, made while the source's checkpoint ran, went on"
    );
    assert_eq!(server(&kids[0], "/").0, "child-0");
    assert_eq!(server(&kids[1], "/").0, "child-1");
    assert_eq!(
        server(&a, "/").0,
        "before-pause",
        "the source is unaffected"
    );
    keeps_counting(&a, n1, pid, "the source after the fork").await;

    // A memory snapshot, and a sandbox started from it.
    server(&a, "/set/in-snapshot");
    let ck = d
        .create_checkpoint(None, &a_rec.id, "gv/memory", true)
        .await
        .unwrap();
    assert!(ck.size_bytes > 0);
    server(&a, "/set/after-snapshot");
    let from = d
        .claim_from_checkpoint(&ck.id, "", small_claim("gv", "from-snapshot", "none"))
        .await
        .unwrap()
        .record;
    assert_ne!(from.id, a_rec.id);
    assert_ne!(
        from.token, a_rec.token,
        "a sandbox of its own, with its own token"
    );
    let s = SandboxClient::of(&from);
    keeps_counting(&s, 1, pid, "a sandbox from the snapshot").await;
    assert_eq!(server(&s, "/").0, "in-snapshot");
    assert_eq!(server(&a, "/").0, "after-snapshot");

    // The snapshot's data goes with it.
    d.delete_checkpoint(&ck.id, "").await.unwrap();
    assert!(!node.data_dir.join("checkpoints").join(&ck.id).exists());

    // Released while paused, with its standby: nothing of either is left (see `stop`).
    d.set_paused(None, &a_rec.id, true).await.unwrap();
    if runsc_saves_more() {
        eventually(
            Duration::from_secs(10),
            "a standby for the second pause",
            || {
                runsc_statuses(&node.data_dir, &instance)
                    .iter()
                    .any(|(_, status)| status == "created")
            },
        )
        .await;
    }
    for r in children.iter().chain([&from, &a_rec]) {
        d.release(None, &r.id).await.unwrap();
    }
    stop(&tmp, d, node).await;
}

/// The `runsc restore` processes a node (of `data_dir`) holds for containers whose names
/// start with `prefix` (their log is the node's FIFO `<container>.hold` in its runsc root).
fn held_restores(data_dir: &std::path::Path, prefix: &str) -> Vec<i32> {
    let log = format!("--log={}/", data_dir.join("runsc").display());
    let mut pids: Vec<i32> = dir_entries(std::path::Path::new("/proc"))
        .into_iter()
        .filter_map(|p| p.parse::<i32>().ok())
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                let args: Vec<_> = c.split(|b| *b == 0).collect();
                args.contains(&&b"restore"[..])
                    && args.iter().any(|a| {
                        let a = String::from_utf8_lossy(a);
                        a.strip_prefix(&log)
                            .is_some_and(|c| c.starts_with(prefix) && c.ends_with(".hold"))
                    })
            })
        })
        .collect();
    pids.sort();
    pids
}

/// `pid`'s state letter and its parent, from /proc.
fn state_and_parent(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = stat.rsplit_once(')')?.1.split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.next()?.parse().ok()?))
}

/// Zombies whose parent is one of `parents`.
fn zombies_of(parents: &[i32]) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| {
            state_and_parent(p)
                .is_some_and(|(state, parent)| state == 'Z' && parents.contains(&parent))
        })
        .collect()
}

/// The children of `pid`.
fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| state_and_parent(p).is_some_and(|(_, parent)| parent == pid))
        .collect()
}

/// A node started as PID 1 of its PID namespace (as a container's entrypoint is) inherits the
/// Sentry and gofer runsc leaves behind: it reaps them (a paused sandbox's Sentry is not left a
/// zombie, and `runsc delete`, which waits for that, returns), and stops cleanly on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_is_pid_1_reaps_what_runsc_leaves() {
    if runsc().is_none() {
        return;
    }
    let (tmp, token) = workspace();
    // --kill-child: if the test fails, its namespace goes with the unshare process.
    let mut node = NodeProc::start_via(
        &["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"],
        "gv",
        &tmp.path().join("node"),
        &token,
        "127.0.0.1:0",
        &["--runtime", "gvisor", "--pool", "base=1"],
    );
    let init = children_of(node.proc.child.id() as i32);
    assert_eq!(init.len(), 1, "unshare's one child: {init:?}");
    let init = init[0];
    let ns_pid = std::fs::read_to_string(format!("/proc/{init}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("NSpid:"))
        .and_then(|l| l.split_whitespace().last().map(str::to_string));
    assert_eq!(
        ns_pid.as_deref(),
        Some("1"),
        "the node is PID 1 of its namespace"
    );
    let d = dispatcher(TOKEN, &[&node]);
    d.wait_for_nodes(1, Duration::from_secs(30)).await.unwrap();
    let (rec, c) = claim(&d, "a", "none").await;
    start_holder(&c);
    wait_holder(&c).await;
    let (n0, pid) = counter(&c);
    // A pause ends the sandbox's Sentry, an orphan whose parent is now PID 1.
    d.set_paused(None, &rec.id, true).await.unwrap();
    let mut parents = vec![init];
    parents.extend(children_of(init));
    eventually(
        Duration::from_secs(10),
        "no zombie left beneath the node",
        || zombies_of(&parents).is_empty(),
    )
    .await;
    d.set_paused(None, &rec.id, false).await.unwrap();
    keeps_counting(&c, n0, pid, "after resume").await;
    d.release(None, &rec.id).await.unwrap();
    // SIGTERM to PID 1 reaches the node, which stops as usual; PID 1 ends with it.
    d.shutdown().await;
    // SAFETY: signalling a process this test started.
    unsafe { libc::kill(init, libc::SIGTERM) };
    let status = node.proc.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "exit after SIGTERM: {status:?}");
    let dir = node.sandboxes_dir();
    assert_no_leaks(tmp.path(), &[dir]).await;
    assert_eq!(
        cgroup_instances(&node.data_dir),
        0,
        "sandbox cgroups left behind"
    );
    assert!(
        runsc_containers(&node.data_dir).is_empty(),
        "runsc containers left behind"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_boundary_holds_and_refusals_lose_nothing() {
    if runsc().is_none() {
        return;
    }
    let (tmp, token) = workspace();
    let secret = tmp.path().join("host-secret.txt");
    std::fs::write(&secret, "host only").unwrap();
    let node = node(&tmp, &token, &["base=2", "base/egress=1"]);
    let d = dispatcher(TOKEN, &[&node]);
    d.wait_for_nodes(1, Duration::from_secs(30)).await.unwrap();
    let (a_rec, a) = claim(&d, "a", "none").await;
    let (_, b) = claim(&d, "b", "none").await;
    let (e_rec, e) = claim(&d, "e", "egress").await;

    // gVisor's own kernel, and none of the host.
    let who = a.run("id -un; uname -r; dmesg 2>/dev/null | head -1");
    assert!(who.stdout.starts_with("user\n"), "{who:?}");
    assert!(
        who.stdout.to_lowercase().contains("gvisor") || !who.stdout.contains(&host_kernel()),
        "not the host's kernel: {who:?}"
    );
    let host = a.run(&format!("cat {} 2>&1; ls /work 2>&1", secret.display()));
    assert!(
        !host.stdout.contains("host only") && host.stdout.contains("No such file"),
        "{host:?}"
    );
    let procs = a.run("ps -e -o comm= | sort -u | tr '\\n' ' '");
    assert!(
        !procs.stdout.contains("cargo") && !procs.stdout.contains("runsc"),
        "{procs:?}"
    );
    a.run("echo mine > /tmp/a-secret");
    let other = b.run("cat /tmp/a-secret 2>&1 || echo none");
    assert!(!other.stdout.contains("mine"), "{other:?}");

    // The host's loopback and addresses, link-local metadata, private ranges.
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let node_port = node.addr.rsplit(':').next().unwrap().to_string();
    let mut targets = vec![
        format!("127.0.0.1/{port}"),
        format!("127.0.0.1/{node_port}"),
        format!("10.0.2.2/{port}"),
        "169.254.169.254/80".to_string(),
        "192.168.1.1/80".to_string(),
    ];
    for ip in host_ipv4() {
        targets.push(format!("{ip}/{port}"));
    }
    for (c, label) in [(&a, "none"), (&e, "egress")] {
        let probe = c.run(&format!(
            "for t in {}; do timeout 3 bash -c \"echo > /dev/tcp/${{t%/*}}/${{t#*/}}\" 2>/dev/null && echo OPEN $t; done; echo probed",
            targets.join(" ")
        ));
        assert!(
            probe.stdout.contains("probed") && !probe.stdout.contains("OPEN"),
            "{label}: {probe:?}"
        );
    }
    drop(listener);

    // Root inside holds a bounded set of capabilities and cannot change its network.
    let locked = a
        .run_as(
            Some("root"),
            "grep -E '^(NoNewPrivs|CapBnd)' /proc/self/status; \
             ip route add default via 10.0.2.2 2>/dev/null && echo CROSSED route; \
             mount -t tmpfs x /mnt 2>/dev/null && echo CROSSED mount; echo done",
        )
        .unwrap();
    assert!(
        locked.stdout.contains("CapBnd:\t00000000a80405fb"),
        "{locked:?}"
    );
    assert!(
        !locked.stdout.contains("CROSSED") && locked.stdout.contains("done"),
        "{locked:?}"
    );
    // gVisor's kernel runs the sandbox's processes with no_new_privs whatever the bundle says,
    // so sudo refuses, clearly (README: use the SDKs' user="root" there).
    let sudo = a.run("sudo -n id -u");
    assert!(
        sudo.exit_code != 0 && sudo.stderr.contains("no new privileges"),
        "{sudo:?}"
    );

    // The template is not changed by what a sandbox writes to its root.
    a.run_as(
        Some("root"),
        "echo changed > /etc/motd; rm -f /usr/bin/jq /bin/ls",
    )
    .unwrap();
    let plain = templates_dir().join("base/rootfs-plain");
    assert!(
        !std::fs::read_to_string(plain.join("etc/motd"))
            .unwrap_or_default()
            .contains("changed"),
        "the template's files are untouched"
    );
    assert!(plain.join("bin/ls").exists() || plain.join("usr/bin/ls").exists());

    // A process watching a TCP socket with epoll: bookworm's runsc cannot checkpoint it (and a
    // failed checkpoint would end the sandbox), so there a memory snapshot is refused, a pause
    // keeps the sandbox in memory instead, and everything goes on; trixie's checkpoints it.
    let saves_more = runsc_saves_more();
    a.write(
        "/tmp/epoll.py",
        b"import asyncio\nasync def h(r, w):\n    w.write(b'hi'); await w.drain(); w.close()\nasync def m():\n    s = await asyncio.start_server(h, '127.0.0.1', 8001)\n    await s.serve_forever()\nasyncio.run(m())\n",
    );
    a.run("setsid nohup python3 /tmp/epoll.py >/dev/null 2>&1 & sleep 1");
    let epoll = d.create_checkpoint(None, &a_rec.id, "gv/epoll", true).await;
    if saves_more {
        let ck = epoll.expect("trixie's runsc checkpoints epoll-watched sockets");
        d.delete_checkpoint(&ck.id, "").await.unwrap();
    } else {
        let err = epoll.expect_err("a checkpoint gVisor cannot take is refused");
        assert!(err.to_string().contains("epoll"), "{err}");
    }
    d.set_paused(None, &a_rec.id, true).await.unwrap();
    d.set_paused(None, &a_rec.id, false).await.unwrap();
    let after = a.run("cat /tmp/a-secret; python3 -c \"import socket; s=socket.create_connection(('127.0.0.1',8001)); print(s.recv(2))\"");
    assert!(
        after.stdout.contains("mine") && after.stdout.contains("b'hi'"),
        "{after:?}"
    );

    // With internet access: on bookworm's runsc paused in memory (connections survive) and
    // snapshots refused; trixie's checkpoints it, dropping its connections.
    let egress = d
        .create_checkpoint(None, &e_rec.id, "gv/egress", false)
        .await;
    if saves_more {
        let ck = egress.expect("trixie's runsc snapshots a sandbox with internet access");
        d.delete_checkpoint(&ck.id, "").await.unwrap();
    } else {
        let err = egress.expect_err("an egress snapshot is refused on this runsc");
        assert!(err.to_string().contains("internet access"), "{err}");
    }
    e.run("setsid nohup sleep 600 >/dev/null 2>&1 &");
    d.set_paused(None, &e_rec.id, true).await.unwrap();
    d.set_paused(None, &e_rec.id, false).await.unwrap();
    let alive = e.run("pgrep -c -x sleep");
    assert_eq!(alive.stdout.trim(), "1", "{alive:?}");
    let memory = d
        .create_checkpoint(None, &e_rec.id, "gv/egress-memory", true)
        .await;
    if saves_more {
        let ck = memory.expect("a memory snapshot with internet access on trixie's runsc");
        d.delete_checkpoint(&ck.id, "").await.unwrap();
    } else {
        let err = memory.expect_err("memory snapshots need a sandbox without internet access");
        assert!(err.to_string().contains("memory"), "{err}");
    }
    assert!(
        d.list_checkpoints(&Default::default())
            .await
            .checkpoints
            .is_empty()
    );

    stop(&tmp, d, node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_killed_during_a_checkpoint_leaves_nothing_behind() {
    if runsc().is_none() {
        return;
    }
    let (tmp, token) = workspace();
    let mut node = node(&tmp, &token, &["base=1", "base/egress=1"]);
    let d = dispatcher(TOKEN, &[&node]);
    d.wait_for_nodes(1, Duration::from_secs(30)).await.unwrap();
    let (a_rec, a) = claim(&d, "a", "none").await;
    // Enough memory that the checkpoint takes a while.
    a.run("setsid nohup python3 -c \"b = bytearray(300 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nimport time; time.sleep(600)\" >/dev/null 2>&1 & sleep 3");
    let (_, _e) = claim(&d, "e", "egress").await;
    let d2 = d.clone();
    let id = a_rec.id.clone();
    let ck = tokio::spawn(async move { d2.create_checkpoint(None, &id, "gv/killed", true).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    node.proc.kill();
    assert!(
        ck.await.unwrap().is_err(),
        "the checkpoint cannot finish without its node"
    );

    // The dead node's reaper ends its sandboxes (runsc processes, network holders, slirp4netns).
    eventually(
        Duration::from_secs(20),
        "the dead node's sandboxes end",
        || sandboxes_running(&node.sandboxes_dir()) == 0,
    )
    .await;
    eventually(
        Duration::from_secs(20),
        "the dead node's cgroups are removed",
        || cgroup_instances(&node.data_dir) == 0,
    )
    .await;

    node.restart();
    let d = dispatcher(TOKEN, &[&node]);
    d.wait_for_nodes(1, Duration::from_secs(30)).await.unwrap();
    let listed = d.list_checkpoints(&Default::default()).await;
    assert!(
        listed.checkpoints.is_empty(),
        "no half checkpoint listed: {:?}",
        listed.checkpoints
    );
    assert!(
        d.get(None, &a_rec.id).await.is_err(),
        "the lost sandbox is gone"
    );
    stop(&tmp, d, node).await;
}

/// A fork whose checkpoint fails after its children have readied their restores (their
/// containers made and restores held while the checkpoint runs, see runtime/gvisor/pending.rs)
/// fails as a whole, leaves none of the children's containers, held restores or files, and
/// the source runs on. runsc here is a wrapper that refuses every checkpoint once it has seen
/// both children's restores held (so the test also shows the children start ahead of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_whose_checkpoint_fails_leaves_no_child_behind() {
    if runsc().is_none() {
        return;
    }
    if !runsc_saves_more() {
        println!("skipped: this runsc restarts what it checkpoints; children start after it");
        return;
    }
    let (tmp, token) = workspace();
    // The checkpoint first waits (10 s at most) to see both children's restores held in the
    // node's runsc root, and notes how many it saw: children that waited for the checkpoint
    // to end would never be seen.
    let wrapper = tmp.path().join("runsc-refusing-checkpoints");
    let seen = tmp.path().join("holds-seen-during-the-checkpoint");
    std::fs::write(
        &wrapper,
        format!(
            r#"#!/bin/sh
for a in "$@"; do
  if [ "$a" = checkpoint ]; then
    i=0
    while [ $i -lt 100 ]; do
      n=$(ls {root} 2>/dev/null | grep -c '\.hold$')
      if [ "$n" -ge 2 ]; then echo "$n" > {seen}; break; fi
      i=$((i+1)); sleep 0.1
    done
    echo 'checkpoint refused by the test' >&2; exit 1
  fi
done
exec runsc "$@"
"#,
            root = tmp.path().join("node/runsc").display(),
            seen = seen.display(),
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let wrapper = wrapper.to_string_lossy().into_owned();
    let node = node_with(&tmp, &token, &["base=1"], &["--runsc", &wrapper]);
    let d = dispatcher(TOKEN, &[&node]);
    d.wait_for_nodes(1, Duration::from_secs(30)).await.unwrap();
    let (a_rec, a) = claim(&d, "a", "none").await;
    a.run("echo kept > /tmp/state");
    let before = runsc_containers(&node.data_dir);

    let forked = d.fork(None, &a_rec.id, 2, 300).await;
    let err = forked.expect_err("a fork without its checkpoint fails");
    assert!(
        format!("{err}").contains("checkpoint refused by the test"),
        "the checkpoint's own error: {err}"
    );
    assert_eq!(
        std::fs::read_to_string(&seen).ok().as_deref(),
        Some("2\n"),
        "both children held their restores while the checkpoint ran"
    );
    eventually(
        Duration::from_secs(20),
        "the children's containers are deleted",
        || runsc_containers(&node.data_dir) == before,
    )
    .await;
    assert!(
        held_restores(&node.data_dir, "").is_empty(),
        "no child's restore is left held"
    );
    // The source runs on, its state and door intact.
    assert_eq!(a.run("cat /tmp/state").stdout.trim(), "kept");
    let ids: Vec<String> = d.list(None).0.iter().map(|r| r.id.clone()).collect();
    assert_eq!(
        ids,
        std::slice::from_ref(&a_rec.id),
        "only the source is claimed"
    );

    d.release(None, &a_rec.id).await.unwrap();
    stop(&tmp, d, node).await;
}

/// The unmodified Python SDK on a gateway whose embedded node runs gvisor: the envd and
/// data-plane scenarios the built-in runtime passes, memory across pause, connect and full
/// snapshots, and volumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_e2b_sdk_works_and_keeps_memory_on_gvisor() {
    if runsc().is_none() {
        return;
    }
    ensure_sdks();
    let (tmp, _) = workspace();
    let keys = api_keys_file(tmp.path());
    let data = tmp.path().join("gw");
    let mut gw = Proc::spawn(&serve_args(
        &data,
        &[
            "--runtime",
            "gvisor",
            "--pool",
            "base=2",
            "--pool",
            "base/egress=2",
            "--api-keys",
            &keys.display().to_string(),
        ],
    ));
    let line = gw.wait_line("export E2B_SANDBOX_URL=", Duration::from_secs(60));
    let url = line.rsplit('=').next().unwrap().trim().to_string();
    let env = vec![
        ("E2B_API_URL", url.clone()),
        ("E2B_SANDBOX_URL", url),
        ("SANDBOX_RUNTIME", "gvisor".to_string()),
        // Where the node keeps its index (a scenario kills a sandbox's Sentry by its instance).
        ("NODE_DIR", data.join("node").display().to_string()),
    ];
    tokio::task::block_in_place(|| {
        scenarios::pytest(
            "2.63.0",
            &[
                "test_envd.py",
                "test_dataplane.py",
                "gvisor_scenarios.py",
                "test_volumes.py",
            ],
            &[],
            &env,
            &[
                "the async client is built from the debug options",
                "signed URLs route by host name: domain mode only",
            ],
        );
    });
    gw.terminate();
    assert_no_leaks(tmp.path(), &[data.join("node/sandboxes")]).await;
    assert_eq!(cgroup_instances(&data.join("node")), 0);
}

fn host_kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The host's IPv4 interface addresses other than loopback.
fn host_ipv4() -> Vec<String> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    out.lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter_map(|a| a.split('/').next())
        .filter(|a| !a.starts_with("127."))
        .map(str::to_string)
        .collect()
}
