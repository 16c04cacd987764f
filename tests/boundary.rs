//! The built-in runtime's boundary, probed from inside: real sandboxes on a real node, with
//! commands run by their envd through the node's data plane. Every probe tries to cross a
//! boundary and fails the test if it can.

mod common;

use std::net::TcpListener;
use std::time::Duration;

use common::*;
use sandbox_gateway::dispatch::Dispatcher;
use sandbox_gateway::model::SandboxRecord;

async fn claim(d: &Dispatcher, name: &str, net: &str) -> (SandboxRecord, SandboxClient) {
    claim_small(d, "probe", name, net).await
}

async fn stop(tmp: &tempfile::TempDir, d: Dispatcher, mut node: NodeProc) {
    d.shutdown().await;
    let dir = node.sandboxes_dir();
    node.proc.terminate();
    assert_no_leaks(tmp.path(), &[dir]).await;
}

fn root(c: &SandboxClient, cmd: &str) -> Ran {
    c.run_as(Some("root"), cmd)
        .unwrap_or_else(|e| panic!("running {cmd:?} as root: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nothing_of_the_host_or_other_sandboxes_is_reachable() {
    let (tmp, token) = workspace();
    let secret = tmp.path().join("host-secret.txt");
    std::fs::write(&secret, "host only").unwrap();
    let node = NodeProc::start(
        "probe",
        &tmp.path().join("node"),
        &token,
        "127.0.0.1:0",
        &["--pool", "base=2", "--pool", "base/egress=1"],
    );
    let d = dispatcher(TOKEN, &[&node]);
    d.wait_for_nodes(1, Duration::from_secs(30)).await.unwrap();
    let (a_rec, a) = claim(&d, "a", "none").await;
    let (_, b) = claim(&d, "b", "none").await;
    let (_, e) = claim(&d, "e", "egress").await;

    // Who and where: the e2b user by default, in a home of its own, named after the sandbox.
    let who = a.run("id -un; id -u; pwd; hostname");
    let lines: Vec<&str> = who.stdout.lines().collect();
    assert_eq!(lines[..3], ["user", "1000", "/home/user"], "{who:?}");
    assert_eq!(lines[3], sandbox_gateway::model::ids::dns_safe(&a_rec.id));
    // Sandbox root is an unprivileged host id.
    let init_pid = processes_under(&node.sandboxes_dir())
        .into_iter()
        .find(|&p| {
            let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
            status
                .lines()
                .any(|l| l.starts_with("Uid:") && l.contains("1000000000"))
        });
    assert!(
        init_pid.is_some(),
        "sandbox root maps to host uid 1000000000"
    );

    // The agent's socket: an abstract name of the sandbox's own network namespace, which the
    // node dialled for the command that looks (a connected entry beside the listener), and
    // which nothing in the host's namespace reaches.
    let unix = a.run("grep sandbox-gateway-envd /proc/net/unix");
    let states: Vec<&str> = unix
        .stdout
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .collect();
    assert!(
        states.contains(&"01"),
        "envd listens on its socket: {unix:?}"
    );
    assert!(
        states.contains(&"03"),
        "the node reached envd on its socket: {unix:?}"
    );
    {
        use std::os::linux::net::SocketAddrExt;
        let name = std::os::unix::net::SocketAddr::from_abstract_name(
            sandbox_gateway::sandbox::spec::ENVD_ABSTRACT_SOCKET,
        )
        .unwrap();
        let from_host = std::os::unix::net::UnixStream::connect_addr(&name);
        assert!(
            from_host.is_err(),
            "a sandbox's agent socket is reachable from the host's namespace"
        );
    }

    // Host files.
    let host = a.run(&format!(
        "cat {} 2>&1; ls /work /root/.cargo 2>&1; cat /proc/1/cmdline | tr '\\0' ' '",
        secret.display()
    ));
    assert!(!host.stdout.contains("host only"), "{host:?}");
    assert!(host.stdout.contains("No such file"), "{host:?}");
    // Host processes: only the sandbox's own are visible, and the host's cannot be signalled.
    let me = std::process::id();
    let procs = a.run(&format!("ps -e -o pid=,comm= ; kill -0 {me} 2>&1; echo $?"));
    let count = procs
        .stdout
        .lines()
        .filter(|l| l.trim().chars().next().is_some_and(|c| c.is_ascii_digit()))
        .count();
    assert!(count < 10, "only the sandbox's processes: {procs:?}");
    assert!(
        !procs.stdout.contains("cargo") && !procs.stdout.contains("boundary-"),
        "{procs:?}"
    );
    assert!(
        procs.stdout.trim_end().ends_with('1'),
        "kill -0 of a host pid fails: {procs:?}"
    );

    // Another sandbox's files and processes.
    a.run("echo mine > /tmp/a-secret");
    let _sleeper = a.run("nohup sleep 300 >/dev/null 2>&1 & echo started");
    let other = b.run("cat /tmp/a-secret 2>&1; pgrep -f 'sleep [3]00' || echo none");
    assert!(!other.stdout.contains("mine"), "{other:?}");
    assert!(other.stdout.contains("none"), "{other:?}");

    // The host's loopback ports (a listener of the test, the node's own ports) and its
    // addresses, from a sandbox without a network and from one with egress.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let node_port = node.addr.rsplit(':').next().unwrap().to_string();
    for (c, label) in [(&a, "none"), (&e, "egress")] {
        let probe = c.run(&format!(
            "for t in 127.0.0.1/{port} 127.0.0.1/{node_port} 10.0.2.2/{port} 10.0.2.2/{node_port}; do \
               timeout 3 bash -c \"echo > /dev/tcp/${{t%/*}}/${{t#*/}}\" 2>/dev/null && echo OPEN $t; done; \
             for ip in $(cat /host-ips 2>/dev/null); do :; done; echo probed"
        ));
        assert!(!probe.stdout.contains("OPEN"), "{label}: {probe:?}");
    }
    // Host interface addresses are unroutable from egress sandboxes.
    let addrs: Vec<String> = nix_host_ipv4();
    for ip in addrs {
        let l = TcpListener::bind(format!("{ip}:0"));
        let Ok(l) = l else { continue };
        let p = l.local_addr().unwrap().port();
        let probe = e.run(&format!(
            "timeout 3 bash -c 'echo > /dev/tcp/{ip}/{p}' 2>&1 && echo OPEN"
        ));
        assert!(
            !probe.stdout.contains("OPEN"),
            "host address {ip}: {probe:?}"
        );
    }
    drop(listener);

    // Root inside is root of nothing else: no namespaces, mounts, keyrings or module loading,
    // a seccomp filter, a bounded capability set, nothing of /sys. setuid programs may gain
    // privileges (sudo works, as on e2b), and what they gain is this same root.
    let locked = root(
        &a,
        "id -u; unshare -U true 2>/dev/null && echo CROSSED unshare-user; \
         unshare -m true 2>/dev/null && echo CROSSED unshare-mount; \
         mount -t tmpfs x /mnt 2>/dev/null && echo CROSSED mount; \
         (echo b > /proc/sysrq-trigger) 2>/dev/null && echo CROSSED sysrq; \
         grep -E '^(NoNewPrivs|Seccomp|CapBnd)' /proc/self/status; \
         python3 -c 'import ctypes; l=ctypes.CDLL(None, use_errno=True); print(\"keyctl\", l.syscall(250,0,0,0,0,0), ctypes.get_errno())'; \
         echo sys=$(ls /sys | wc -l); ls /dev | tr '\\n' ' '",
    );
    let out = &locked.stdout;
    assert!(out.starts_with("0\n"), "{locked:?}");
    let sudo = a.run(
        "sudo -n id -u; sudo -n unshare -U true 2>/dev/null && echo CROSSED sudo-unshare; \
         sudo -n mount -t tmpfs x /mnt 2>/dev/null && echo CROSSED sudo-mount; \
         sudo -n grep -E '^(Seccomp|CapBnd)' /proc/self/status",
    );
    assert!(
        sudo.stdout.starts_with("0\n"),
        "passwordless sudo to root: {sudo:?}"
    );
    assert!(!sudo.stdout.contains("CROSSED"), "{sudo:?}");
    assert!(
        sudo.stdout.contains("Seccomp:\t2") && sudo.stdout.contains("CapBnd:\t00000000a80425fb"),
        "{sudo:?}"
    );
    assert!(!out.contains("CROSSED"), "{locked:?}");
    assert!(
        out.contains("Seccomp:\t2") && out.contains("NoNewPrivs:\t0"),
        "{locked:?}"
    );
    assert!(out.contains("CapBnd:\t00000000a80425fb"), "{locked:?}");
    assert!(
        out.contains("keyctl -1 1"),
        "keyctl refused with EPERM: {locked:?}"
    );
    assert!(out.contains("sys=0"), "an empty /sys: {locked:?}");
    let dev: Vec<&str> = out
        .lines()
        .last()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    for d in &dev {
        assert!(
            [
                "null", "zero", "full", "random", "urandom", "tty", "pts", "shm", "mqueue", "fd",
                "stdin", "stdout", "stderr", "ptmx"
            ]
            .contains(d),
            "unexpected device {d}: {dev:?}"
        );
    }
    // The classic chroot escape lands back in the sandbox.
    let escape = root(
        &a,
        "mkdir -p /x && python3 -c \"import os; os.chroot('/x'); [os.chdir('..') for _ in range(64)]; os.chroot('.'); print(sorted(os.listdir('/')))\" 2>&1",
    );
    assert!(
        !escape.stdout.contains("'work'") && !escape.stdout.contains("sgw-test"),
        "{escape:?}"
    );

    stop(&tmp, d, node).await;
}

/// The host's IPv4 interface addresses other than loopback.
fn nix_host_ipv4() -> Vec<String> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    out.lines()
        .filter_map(|l| l.split_whitespace().skip_while(|w| *w != "inet").nth(1))
        .filter_map(|a| a.split('/').next())
        .filter(|a| !a.starts_with("127."))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_size_tier_is_enforced() {
    let (tmp, token) = workspace();
    let node = NodeProc::start(
        "limits",
        &tmp.path().join("node"),
        &token,
        "127.0.0.1:0",
        &["--pool", "base=1", "--sandbox-disk-mib", "96"],
    );
    let d = dispatcher(TOKEN, &[&node]);
    d.wait_for_nodes(1, Duration::from_secs(30)).await.unwrap();
    let (rec, c) = claim(&d, "limits", "none").await;

    // Memory: a 3 GiB allocation in a 512 MiB sandbox is killed; the sandbox keeps serving.
    let big = c.run("python3 -c 'b = bytearray(3 << 30); print(\"survived\")'; echo exit=$?");
    assert!(!big.stdout.contains("survived"), "{big:?}");
    assert!(
        big.stdout.contains("exit=137"),
        "killed by SIGKILL: {big:?}"
    );
    assert_eq!(c.health(), 204);
    assert_eq!(c.run("echo still here").stdout, "still here\n");

    // Processes: a fork flood stops at the pid limit, envd answers through it, and the
    // sandbox runs commands again once the flood is over.
    let flood = c.run(
        "python3 -c '\nimport os, time\nn = 0\nwhile True:\n    try:\n        if os.fork() == 0:\n            time.sleep(4)\n            os._exit(0)\n        n += 1\n    except OSError:\n        print(n)\n        break\n'",
    );
    let forks: u32 = flood.stdout.trim().parse().unwrap_or(u32::MAX);
    assert!(
        (100..1024).contains(&forks),
        "forks refused below the 1024 limit: {flood:?}"
    );
    assert_eq!(c.health(), 204, "envd serves during the flood");
    let mut again = None;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if let Ok(r) = c.run_as(None, "echo recovered")
            && r.stdout == "recovered\n"
        {
            again = Some(r);
            break;
        }
    }
    assert!(again.is_some(), "commands run again after the flood");

    // CPU: two busy processes in a 1-CPU sandbox get about one CPU between them.
    let cpu = c.run(
        "python3 -c '\nimport os, time\nfor _ in range(2):\n    if os.fork() == 0:\n        end = time.time() + 2\n        while time.time() < end: pass\n        os._exit(0)\nos.wait(); os.wait()\nt = os.times()\nprint(t.children_user + t.children_system)\n'",
    );
    let used: f64 = cpu.stdout.trim().parse().unwrap_or(99.0);
    assert!(
        used < 3.0,
        "2 s of wall time on one CPU, used {used} s: {cpu:?}"
    );

    // Disk: the writer gets ENOSPC at the quota, an upload gets 507, and deleting frees it.
    let fill = c.run("dd if=/dev/zero of=/home/user/fill bs=1M count=200 2>&1");
    assert!(fill.stdout.contains("No space left on device"), "{fill:?}");
    let upload = c.write("/home/user/more.bin", &vec![7u8; 8 << 20]);
    assert_eq!(upload.status, 507, "{}", upload.text());
    c.run("rm -f /home/user/fill");
    assert_eq!(
        c.write("/home/user/more.bin", &vec![7u8; 8 << 20]).status,
        200
    );
    let stats = d.stats(None, &rec.id).await.unwrap();
    assert!(stats.disk_total_bytes <= 100 << 20, "{stats:?}");
    assert!(stats.disk_used_bytes >= 8 << 20, "{stats:?}");

    stop(&tmp, d, node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_node_leaves_nothing_and_the_next_start_reclaims() {
    let (tmp, token) = workspace();
    let data = tmp.path().join("node");
    let mut node = NodeProc::start(
        "crash",
        &data,
        &token,
        "127.0.0.1:0",
        &["--pool", "base=2", "--pool", "base/egress=1"],
    );
    let d = dispatcher(TOKEN, &[&node]);
    d.wait_for_nodes(1, Duration::from_secs(30)).await.unwrap();
    let (_, c) = claim(&d, "crash", "none").await;
    c.run("echo data > /home/user/x; nohup sleep 600 >/dev/null 2>&1 &");
    eventually(Duration::from_secs(30), "warm sandboxes running", || {
        sandboxes_running(&node.sandboxes_dir()) >= 3
    })
    .await;
    let cgroups_before = cgroup_instances(&data);
    assert!(cgroups_before >= 3, "{cgroups_before} instance cgroups");

    node.proc.kill();
    eventually(
        Duration::from_secs(15),
        "every sandbox process ends with its node",
        || processes_under(tmp.path()).is_empty(),
    )
    .await;
    eventually(
        Duration::from_secs(15),
        "no loop device or mount is left",
        || kernel_leftovers(tmp.path()).is_empty(),
    )
    .await;
    node.restart();
    eventually(
        Duration::from_secs(30),
        "the restarted node reclaims the old instances",
        || {
            let running = sandboxes_running(&node.sandboxes_dir());
            running >= 1
                && cgroup_instances(&data) == running
                && dir_entries(&node.sandboxes_dir()).len() == running
        },
    )
    .await;
    stop(&tmp, d, node).await;
    assert_eq!(
        cgroup_instances(&data),
        0,
        "instance cgroups removed at a clean stop"
    );
}
