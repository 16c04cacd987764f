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

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

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

// --- a raw Connect/HTTP client for the agent ---

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

pub fn envelope(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![flags];
    v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    v.extend_from_slice(payload);
    v
}

pub fn frames(mut b: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    while b.len() >= 5 {
        let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
        assert!(b.len() >= 5 + len, "truncated envelope");
        out.push((b[0], b[5..5 + len].to_vec()));
        b = &b[5 + len..];
    }
    assert!(b.is_empty(), "trailing bytes after the envelopes");
    out
}

pub struct Envd {
    pub agent: Agent,
    pub http: reqwest::Client,
    pub token: Option<String>,
}

impl Envd {
    pub fn start(extra: &[&str]) -> Envd {
        let token = extra
            .windows(2)
            .find(|w| w[0] == "--access-token")
            .map(|w| w[1].to_string());
        Envd {
            agent: Agent::start(free_port(), extra),
            http: client(),
            token,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.agent.base)
    }

    pub fn req(&self, m: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(m, self.url(path));
        match &self.token {
            Some(t) => r.header("X-Access-Token", t),
            None => r,
        }
    }

    pub async fn unary_as(
        &self,
        method: &str,
        body: Value,
        user: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut r = self
            .req(reqwest::Method::POST, &format!("/{method}"))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(u) = user {
            r = r.header(
                "authorization",
                format!("Basic {}", STANDARD.encode(format!("{u}:"))),
            );
        }
        let res = r.send().await.unwrap();
        let status = res.status();
        let text = res.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn unary(&self, method: &str, body: Value) -> (StatusCode, Value) {
        self.unary_as(method, body, None).await
    }

    /// A server-streaming call with the JSON codec: its messages and the end-of-stream body.
    pub async fn stream(
        &self,
        method: &str,
        body: Value,
        headers: &[(&str, &str)],
    ) -> (Vec<Value>, Value) {
        let mut r = self
            .req(reqwest::Method::POST, &format!("/{method}"))
            .header("content-type", "application/connect+json")
            .body(envelope(0, body.to_string().as_bytes()));
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        let res = r.send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let bytes = res.bytes().await.unwrap();
        let mut msgs = Vec::new();
        let mut end = Value::Null;
        for (flags, payload) in frames(&bytes) {
            let v: Value = serde_json::from_slice(&payload).unwrap();
            if flags & 2 != 0 {
                end = v;
            } else {
                msgs.push(v);
            }
        }
        (msgs, end)
    }

    pub async fn run(&self, cmd: &str) -> (Vec<Value>, Value) {
        self.stream(
            "process.Process/Start",
            json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd], "envs": {}, "cwd": "/tmp"}, "stdin": false}),
            &[],
        )
        .await
    }

    pub async fn healthy(&self) -> bool {
        // A fresh client: a pooled connection may be one the server closed after an early
        // answer to an unread upload.
        let http = client();
        let ok = http
            .get(self.url("/health"))
            .send()
            .await
            .map(|r| r.status() == StatusCode::NO_CONTENT)
            .unwrap_or(false);
        let mut r = http
            .post(self.url("/process.Process/List"))
            .header("content-type", "application/json")
            .body("{}");
        if let Some(t) = &self.token {
            r = r.header("X-Access-Token", t);
        }
        let listed = r
            .send()
            .await
            .map(|r| r.status() == StatusCode::OK)
            .unwrap_or(false);
        ok && listed
    }
}

pub fn stdout_of(msgs: &[Value]) -> String {
    let mut out = Vec::new();
    for m in msgs {
        if let Some(s) = m["event"]["data"]["stdout"].as_str() {
            out.extend(STANDARD.decode(s).unwrap());
        }
    }
    String::from_utf8(out).unwrap()
}

pub fn sign(path: &str, op: &str, user: &str, token: &str, exp: Option<i64>) -> String {
    let mut raw = format!("{path}:{op}:{user}:{token}");
    if let Some(e) = exp {
        raw.push_str(&format!(":{e}"));
    }
    format!(
        "v1_{}",
        STANDARD_NO_PAD.encode(Sha256::digest(raw.as_bytes()))
    )
}

pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}
