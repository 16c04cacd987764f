//! Test harness: starts real `sandbox-gateway` processes (nodes, the gateway), talks to them
//! over real sockets, and checks that nothing is left behind.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sandbox_gateway::dispatch::{Dispatcher, DispatcherConfig};

pub mod certs;
pub mod domain;
pub mod fake_kube;
pub mod gateway;
pub mod images;
pub mod kube_gateway;
pub mod sandbox;
pub mod scenarios;

#[allow(unused_imports)]
pub use domain::DomainGateway;
#[allow(unused_imports)]
pub use gateway::{Gateway, KEY_A, KEY_B, Kubectl, Reply, api_keys_file, metrics_at};
#[allow(unused_imports)]
pub use sandbox::{Ran, SandboxClient};

pub const BIN: &str = env!("CARGO_BIN_EXE_sandbox-gateway");

/// A port that was free a moment ago (for processes that must come back on the same address).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// `serve` on free loopback ports with its data in `data`, then `extra`.
pub fn serve_args(data: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "serve",
        "--e2b-listen",
        "127.0.0.1:0",
        "--kube-listen",
        "127.0.0.1:0",
        "--data-dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(data.display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// A child process whose stdout lines are collected in the background. Its stderr (the logs)
/// still reaches the test's stderr, and is also kept for `stderr_lines`.
pub struct Proc {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
    errs: std::sync::Arc<Mutex<Vec<String>>>,
}

/// At most this many stderr lines are kept per process (a soak's logs stay bounded).
const KEPT_STDERR_LINES: usize = 100_000;

/// The templates every node of the tests uses: built once (with mmdebstrap) under `target/`
/// and shared, since building `base` takes a minute.
pub fn templates_dir() -> PathBuf {
    static READY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    READY
        .get_or_init(|| {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-templates");
            // Serialized across test binaries by the templates directory's own lock.
            let status = Command::new(BIN)
                .args(["template", "build", "base", "--if-missing", "--templates-dir"])
                .arg(&dir)
                .stdin(Stdio::null())
                .status()
                .expect("run `sandbox-gateway template build`");
            assert!(
                status.success(),
                "building the test template failed; the tests need mmdebstrap (apt-get install mmdebstrap), which .ci/run installs"
            );
            dir
        })
        .clone()
}

/// `templates_dir()` with the `code-interpreter` template too (built once, a minute or two on
/// top of `base`; rebuilt when its recipe changed).
pub fn code_interpreter_templates() -> PathBuf {
    recipe_templates("code-interpreter", "it needs PyPI, npm and a Debian mirror")
}

/// `templates_dir()` with the `desktop` template too (built once, under a minute on top of
/// `base`; rebuilt when its recipe changed).
pub fn desktop_templates() -> PathBuf {
    recipe_templates("desktop", "it needs a Debian mirror")
}

/// `templates_dir()` with the built-in recipe `name` built there (once per test binary; the
/// build itself is skipped while the template is current).
fn recipe_templates(name: &str, needs: &str) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let dir = templates_dir();
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if !built.iter().any(|b| b == name) {
        let status = Command::new(BIN)
            .args(["template", "build", name, "--if-missing", "--templates-dir"])
            .arg(&dir)
            .stdin(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("run `sandbox-gateway template build {name}`: {e}"));
        assert!(
            status.success(),
            "building the {name} template failed ({needs})"
        );
        built.push(name.to_string());
    }
    dir
}

/// The resident memory of a process, in bytes (0 once it is gone).
pub fn rss_bytes(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// The short name (`comm`) of a process.
pub fn process_name(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

impl Proc {
    pub fn spawn(args: &[String]) -> Proc {
        Self::spawn_via(&[], args)
    }

    /// `spawn`, with the binary started by `wrapper` (a program and its arguments, such as
    /// `unshare --pid --fork`) when it names one.
    pub fn spawn_via(wrapper: &[String], args: &[String]) -> Proc {
        let mut cmd = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        let mut child = cmd
            .args(args)
            .env("SANDBOX_GATEWAY_TEMPLATES_DIR", templates_dir())
            .env(
                "RUST_LOG",
                std::env::var("TEST_RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start sandbox-gateway");
        let err = child.stderr.take().expect("stderr");
        let errs = std::sync::Arc::new(Mutex::new(Vec::new()));
        let kept = errs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                // Straight to the test's stderr, as an inherited stderr would (not captured).
                let _ = writeln!(std::io::stderr(), "{line}");
                let mut kept = kept.lock().unwrap();
                if kept.len() < KEPT_STDERR_LINES {
                    kept.push(line);
                }
            }
        });
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            child,
            lines: rx,
            seen: Vec::new(),
            errs,
        }
    }

    /// The stderr lines (logs) so far.
    pub fn stderr_lines(&self) -> Vec<String> {
        self.errs.lock().unwrap().clone()
    }

    /// Waits for a stdout line containing `needle` and returns it.
    pub fn wait_line(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.seen.iter().find(|l| l.contains(needle)) {
                return l.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => panic!(
                    "no line containing {needle:?} within {timeout:?}; saw {:?}; status {:?}",
                    self.seen,
                    self.child.try_wait()
                ),
            }
        }
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "process did not exit within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM and a clean exit.
    pub fn terminate(&mut self) {
        self.signal(libc::SIGTERM);
        let status = self.wait_exit(Duration::from_secs(30));
        assert!(status.success(), "exit after SIGTERM: {status:?}");
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.running() {
            self.kill();
        }
    }
}

/// A node daemon process.
pub struct NodeProc {
    pub proc: Proc,
    pub name: String,
    pub addr: String,
    /// The data plane's address (CONNECT tunnels, `GET /metrics`).
    pub data_addr: String,
    pub data_dir: PathBuf,
    args: Vec<String>,
    /// What starts the binary (see `Proc::spawn_via`); empty for the binary itself.
    wrapper: Vec<String>,
}

impl NodeProc {
    /// Starts `sandbox-gateway node` on `listen` (use port 0 for any) with `extra` flags.
    pub fn start(
        name: &str,
        data_dir: &Path,
        token_file: &Path,
        listen: &str,
        extra: &[&str],
    ) -> NodeProc {
        Self::start_via(&[], name, data_dir, token_file, listen, extra)
    }

    /// `start`, with the binary started by `wrapper` (see `Proc::spawn_via`).
    pub fn start_via(
        wrapper: &[&str],
        name: &str,
        data_dir: &Path,
        token_file: &Path,
        listen: &str,
        extra: &[&str],
    ) -> NodeProc {
        let mut args: Vec<String> = vec![
            "node".into(),
            "--listen".into(),
            listen.into(),
            "--name".into(),
            name.into(),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--token-file".into(),
            token_file.display().to_string(),
            // Any free port: "the gRPC port + 1" may belong to another test's node.
            "--data-listen".into(),
            "127.0.0.1:0".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let wrapper: Vec<String> = wrapper.iter().map(|s| s.to_string()).collect();
        Self::from_args(name, data_dir, args, wrapper)
    }

    fn from_args(name: &str, data_dir: &Path, args: Vec<String>, wrapper: Vec<String>) -> NodeProc {
        let mut proc = Proc::spawn_via(&wrapper, &args);
        let line = proc.wait_line("listening on", Duration::from_secs(30));
        let addr = line
            .split("listening on ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .expect("address in the listening line")
            .to_string();
        let data_addr = line
            .split("data plane on ")
            .nth(1)
            .and_then(|r| r.split(';').next())
            .expect("the data plane's address in the listening line")
            .to_string();
        NodeProc {
            proc,
            name: name.into(),
            addr,
            data_addr,
            data_dir: data_dir.to_path_buf(),
            args,
            wrapper,
        }
    }

    /// Starts the same node again (same flags and data directory).
    pub fn restart(&mut self) {
        let args = self.args.clone();
        let fresh = Self::from_args(&self.name, &self.data_dir, args, self.wrapper.clone());
        *self = fresh;
    }

    pub fn sandboxes_dir(&self) -> PathBuf {
        self.data_dir.join("sandboxes")
    }
}

/// Processes whose command line mentions `dir` (agents started for sandboxes under it).
pub fn processes_under(dir: &Path) -> Vec<i32> {
    let needle = dir.display().to_string().into_bytes();
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| p != me)
        .filter(|&p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let zombie = stat
                .rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'));
            !zombie
                && std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle.as_slice()))
        })
        .collect()
}

/// Whether `pid` is gone or a zombie (a process still tearing down is neither).
pub fn has_exited(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with(['Z', 'X']))
    })
}

/// How many sandboxes under `dir` have live processes (each sandbox runs several: its
/// supervisor, its init, its agent and what the agent starts).
pub fn sandboxes_running(dir: &Path) -> usize {
    let prefix = format!("{}/", dir.display());
    let mut instances: Vec<String> = processes_under(dir)
        .into_iter()
        .filter_map(|p| std::fs::read(format!("/proc/{p}/cmdline")).ok())
        .filter_map(|c| {
            let text = String::from_utf8_lossy(&c).to_string();
            let rest = text.split(&prefix).nth(1)?;
            Some(rest.split('/').next()?.to_string())
        })
        .collect();
    instances.sort();
    instances.dedup();
    instances.len()
}

/// Loop devices whose backing file is under `dir`, and mounts of the test process's (the
/// host's) mount namespace under it: sandboxes must leave neither behind.
pub fn kernel_leftovers(dir: &Path) -> Vec<String> {
    let dir_s = dir.display().to_string();
    let mut left: Vec<String> = sandbox_gateway::sandbox::loopdev::attached_backing_files()
        .into_iter()
        .filter(|p| p.starts_with(dir))
        .map(|p| format!("loop device on {}", p.display()))
        .collect();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    left.extend(
        mounts
            .lines()
            .filter(|l| l.contains(&dir_s))
            .map(|l| format!("mount {l}")),
    );
    left
}

/// Instance cgroups (in any hierarchy) of the node whose data directory is `data_dir`.
pub fn cgroup_instances(data_dir: &Path) -> usize {
    let root = data_dir
        .canonicalize()
        .unwrap_or_else(|_| data_dir.to_path_buf());
    let leaf = format!(
        "sandbox-gateway.{}",
        sandbox_gateway::model::ids::stable_hash_hex(root.as_os_str().as_encoded_bytes())
    );
    let mut names: Vec<String> = Vec::new();
    let mut stack = vec![(PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if e.file_name().to_string_lossy() == leaf {
                names.extend(
                    dir_entries(&e.path())
                        .into_iter()
                        .filter(|n| n.starts_with("in_")),
                );
            } else if depth < 4 {
                stack.push((e.path(), depth + 1));
            }
        }
    }
    names.sort();
    names.dedup();
    names.len()
}

pub fn dir_entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// Polls `check` until it returns true or `timeout` passes.
pub async fn eventually(timeout: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Asserts that nothing runs under `dir` and no instance directory is left in `sandboxes`.
pub async fn assert_no_leaks(dir: &Path, sandboxes_dirs: &[PathBuf]) {
    eventually(
        Duration::from_secs(10),
        "no processes left under the test directory",
        || processes_under(dir).is_empty(),
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "no loop devices or mounts left under the test directory",
        || kernel_leftovers(dir).is_empty(),
    )
    .await;
    for d in sandboxes_dirs {
        let left = dir_entries(d);
        assert!(
            left.is_empty(),
            "instance directories left in {}: {left:?}",
            d.display()
        );
    }
}

/// A plain HTTP/1.1 GET; returns the status code, or None when no answer came in `timeout`.
pub fn http_get(addr: &str, path: &str, timeout: Duration) -> Option<u16> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    text.split_whitespace().nth(1)?.parse().ok()
}

/// A dispatcher that polls quickly, so tests do not wait on the default cadence.
pub fn dispatcher(token: &str, nodes: &[&NodeProc]) -> Dispatcher {
    let cfg = DispatcherConfig {
        info_interval: Duration::from_millis(100),
        ..DispatcherConfig::default()
    };
    let d = Dispatcher::new(cfg, token);
    for n in nodes {
        d.add_node(&n.addr).expect("add node");
    }
    d
}

pub const TOKEN: &str = "test-fleet-token-0123456789";

/// Moves the calling thread (and every process it starts from now on) into a network namespace
/// of its own, with loopback up and `addrs` (IPv4, each a /32) on it: servers there are "this
/// machine's addresses" to a node started from this thread, and nothing leaves the machine.
/// Call it on a thread of its own (never a pool's), since the thread stays there.
pub fn private_network(addrs: &[&str]) {
    // SAFETY: unshare affects only the calling thread's namespaces.
    assert_eq!(
        unsafe { libc::unshare(libc::CLONE_NEWNET) },
        0,
        "unshare(CLONE_NEWNET): {}",
        std::io::Error::last_os_error()
    );
    let ip = |args: &[&str]| {
        let status = Command::new("ip").args(args).status().expect("run ip");
        assert!(status.success(), "ip {args:?} failed");
    };
    ip(&["link", "set", "dev", "lo", "up"]);
    for a in addrs {
        ip(&["addr", "add", &format!("{a}/32"), "dev", "lo"]);
    }
}

/// A temporary directory with a fleet token file.
pub fn workspace() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::Builder::new()
        .prefix("sgw-test-")
        .tempdir()
        .expect("tempdir");
    let token_file = tmp.path().join("fleet-token");
    std::fs::write(&token_file, TOKEN).unwrap();
    (tmp, token_file)
}

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub fn sdk_dir() -> PathBuf {
    std::env::var_os("E2B_SDK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/e2b-sdk"))
}

/// Installs the e2b SDKs and the Kubernetes Python client once (the script is idempotent and quick when they are present).
pub fn ensure_sdks() {
    static DONE: Mutex<bool> = Mutex::new(false);
    let mut done = DONE.lock().unwrap_or_else(|p| p.into_inner());
    if *done {
        return;
    }
    let status = Command::new("bash")
        .arg(repo().join("tests/e2b/setup.sh"))
        .env("E2B_SDK_DIR", sdk_dir())
        .status()
        .expect("run tests/e2b/setup.sh");
    assert!(
        status.success(),
        "installing the e2b SDKs failed (tests/e2b/setup.sh)"
    );
    *done = true;
}

/// A claim of a small `base` sandbox on `net` named `namespace/name`, with a 600 s lease.
pub fn small_claim(
    namespace: &str,
    name: &str,
    net: &str,
) -> sandbox_gateway::dispatch::ClaimRequest {
    sandbox_gateway::dispatch::ClaimRequest {
        namespace: namespace.into(),
        name: name.into(),
        key: sandbox_gateway::model::PoolKey::new("base", net, "small").unwrap(),
        ttl_seconds: 600,
        metadata: Default::default(),
        env_vars: Default::default(),
        lifecycle: Default::default(),
        network: Default::default(),
        volume_mounts: Vec::new(),
    }
}

/// Claims `small_claim(namespace, name, net)` and a client for its agent.
pub async fn claim_small(
    d: &sandbox_gateway::dispatch::Dispatcher,
    namespace: &str,
    name: &str,
    net: &str,
) -> (sandbox_gateway::model::SandboxRecord, SandboxClient) {
    let r = d
        .claim(small_claim(namespace, name, net))
        .await
        .unwrap()
        .record;
    let c = SandboxClient::of(&r);
    (r, c)
}

/// Figure lines for RELIABILITY.md: `{kind}-figure key=value …`, one per measured row, which
/// tests/reliability.sh collects from the test's output (the fuzz targets' `fuzz-figure`
/// lines are the same convention). They are kept until `print`, at the end of a test that
/// passed, so that a failed run prints no half-measured figures.
pub struct Figures {
    kind: &'static str,
    lines: Vec<String>,
}

impl Figures {
    pub fn new(kind: &'static str) -> Figures {
        Figures {
            kind,
            lines: Vec::new(),
        }
    }

    /// One line; a value with spaces, quotes or nothing in it is written as a quoted string
    /// (Rust's `{:?}`, which the collector reads with shell quoting rules).
    pub fn add(&mut self, fields: &[(&str, String)]) {
        let mut line = format!("{}-figure", self.kind);
        for (k, v) in fields {
            let plain = !v.is_empty()
                && v.chars()
                    .all(|c| c.is_ascii_graphic() && !matches!(c, '"' | '\'' | '\\'));
            if plain {
                line.push_str(&format!(" {k}={v}"));
            } else {
                line.push_str(&format!(" {k}={v:?}"));
            }
        }
        self.lines.push(line);
    }

    pub fn print(&self) {
        for l in &self.lines {
            println!("{l}");
        }
    }
}

/// Milliseconds with one decimal, as the figures give latencies.
pub fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

/// Seconds with one decimal, as the figures give recovery times.
pub fn secs(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64())
}
