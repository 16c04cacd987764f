//! Starts the real `sandbox-gateway agent` for the envd tests (included by tests/envd.rs and
//! tests/envd_sdk.rs). As root it runs in a private mount namespace whose /etc/passwd and
//! /etc/group are the test's own, with a `user` (uid 1000) beside root, as a sandbox has.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_sandbox-gateway");
pub const USER_UID: u32 = 1000;

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

pub struct Agent {
    child: Child,
    pub port: u16,
    pub base: String,
    pub dir: tempfile::TempDir,
    /// Whether the sandbox has the non-root `user` (root runs only).
    pub has_user: bool,
}

impl Agent {
    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home/user")
    }

    /// The agent on `127.0.0.1:port` with `extra` arguments; waits for its `ready` line.
    pub fn start(port: u16, extra: &[&str]) -> Agent {
        let dir = tempfile::Builder::new()
            .prefix("sgw-envd-")
            .tempdir()
            .expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut args: Vec<String> = vec![
            "agent".into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut has_user = false;
        let mut cmd = if is_root() && Path::new("/usr/bin/unshare").exists() {
            let home = dir.path().join("home/user");
            std::fs::create_dir_all(&home).unwrap();
            std::os::unix::fs::chown(&home, Some(USER_UID), Some(USER_UID)).unwrap();
            let passwd = dir.path().join("passwd");
            let group = dir.path().join("group");
            std::fs::write(
                &passwd,
                format!(
                    "root:x:0:0:root:/root:/bin/bash\nuser:x:{USER_UID}:{USER_UID}::{}:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
                    home.display()
                ),
            )
            .unwrap();
            std::fs::write(
                &group,
                format!("root:x:0:\nuser:x:{USER_UID}:\nnogroup:x:65534:\n"),
            )
            .unwrap();
            has_user = true;
            let mut c = Command::new("/usr/bin/unshare");
            c.args(["-m", "sh", "-c", r#"mount --bind "$1" /etc/passwd && mount --bind "$2" /etc/group && shift 2 && exec "$@""#, "sh"])
                .arg(&passwd)
                .arg(&group)
                .arg(BIN)
                .args(&args);
            c
        } else {
            let mut c = Command::new(BIN);
            c.args(&args);
            c
        };
        let mut child = cmd
            .env(
                "RUST_LOG",
                std::env::var("TEST_RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the agent");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(l) if l.trim() == "ready" => {}
            other => panic!(
                "the agent did not report ready: {other:?} (status {:?})",
                child.try_wait()
            ),
        }
        Agent {
            child,
            port,
            base: format!("http://127.0.0.1:{port}"),
            dir,
            has_user,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Holds an exclusive lock on a file for as long as it lives (the SDKs' debug mode needs the
/// fixed port 49983, so its users take turns, across test binaries too).
pub struct PortLock(std::fs::File);

pub fn lock_port(port: u16) -> PortLock {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(std::env::temp_dir().join(format!("sandbox-gateway-envd-{port}.lock")))
        .expect("open the port lock");
    // SAFETY: flock on a descriptor we own; blocks until the lock is ours.
    let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) };
    assert_eq!(rc, 0, "lock port {port}");
    PortLock(f)
}
