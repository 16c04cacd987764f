//! What every section uses: percentiles, the daemons the bench starts (nodes and gateways,
//! each in its own temporary directory, with the shared templates directory), and /proc
//! readings of a sandbox's processes.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sandbox_gateway::dispatch::client::NodeConn;
use sandbox_gateway::model::PoolKey;
use sandbox_gateway::proto;

pub type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Adds what was being done to an error.
pub trait Context<T> {
    fn context(self, what: impl std::fmt::Display) -> Res<T>;
}

impl<T, E: std::fmt::Display> Context<T> for Result<T, E> {
    fn context(self, what: impl std::fmt::Display) -> Res<T> {
        self.map_err(|e| format!("{what}: {e}").into())
    }
}

/// Sorted-sample percentile, index floor((n-1)·p/100), the reference's convention.
pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = (((sorted.len() - 1) as f64) * p / 100.0).floor() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

pub struct Summary {
    pub n: usize,
    pub p50: Duration,
    pub p90: Duration,
    /// Kept for the targets stated as p95; the tables show p90 and p99.
    pub p95: Duration,
    pub p99: Duration,
    pub max: Duration,
}

pub fn summarize(mut v: Vec<Duration>) -> Summary {
    v.sort();
    Summary {
        n: v.len(),
        p50: pct(&v, 50.0),
        p90: pct(&v, 90.0),
        p95: pct(&v, 95.0),
        p99: pct(&v, 99.0),
        max: v.last().copied().unwrap_or_default(),
    }
}

/// The median of some runs (zero when there are none).
pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// A `| name | samples | p50 | p90 | p99 |` table row.
pub fn summary_row(o: &mut String, name: &str, s: &Summary) {
    let _ = writeln!(
        o,
        "| {name} | {} | {} | {} | {} |",
        s.n,
        ms(s.p50),
        ms(s.p90),
        ms(s.p99)
    );
}

pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let rustc = Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let profile = if cfg!(debug_assertions) {
        "debug (numbers not representative)"
    } else {
        "release"
    };
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map(|kib| format!(", {:.0} GiB RAM", kib as f64 / 1048576.0))
        .unwrap_or_default();
    format!(
        "{cores} cores ({cpu}){mem}, Linux {}, {rustc}, `{profile}` build",
        kernel.trim()
    )
}

pub fn node_binary() -> Res<PathBuf> {
    if let Some(p) = std::env::var_os("SANDBOX_GATEWAY_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let bin = exe
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("sandbox-gateway"))
        .ok_or("cannot locate the target directory")?;
    if !bin.exists() {
        return Err(format!(
            "{} not found: run `cargo build --release` first",
            bin.display()
        )
        .into());
    }
    Ok(bin)
}

/// The templates every node of the bench uses: $SANDBOX_GATEWAY_TEMPLATES_DIR, or
/// `target/test-templates` (the tests' directory), where `base` is built once if missing.
pub fn templates_dir() -> Res<PathBuf> {
    static READY: OnceLock<PathBuf> = OnceLock::new();
    if let Some(d) = READY.get() {
        return Ok(d.clone());
    }
    let dir = match std::env::var_os("SANDBOX_GATEWAY_TEMPLATES_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-templates"),
    };
    build_template("base", &dir)?;
    Ok(READY.get_or_init(|| dir).clone())
}

/// `sandbox-gateway template build NAME --if-missing` into `dir` (minutes when it is not
/// there: mmdebstrap, and for recipes on top of `base` their packages).
pub fn build_template(name: &str, dir: &Path) -> Res<()> {
    let status = Command::new(node_binary()?)
        .args(["template", "build", name, "--if-missing", "--templates-dir"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .context(format!("running `sandbox-gateway template build {name}`"))?;
    if !status.success() {
        return Err(format!(
            "building the {name} template in {} failed ({status}); it needs mmdebstrap and, for \
             recipes, PyPI, npm and a Debian mirror",
            dir.display()
        )
        .into());
    }
    Ok(())
}

/// A `sandbox-gateway` process (node or gateway) in its own temporary directory; `address` is
/// what it printed after "listening on".
pub struct Daemon {
    pub child: std::process::Child,
    pub address: String,
    /// The gateway's second listener (the Kubernetes API).
    pub kube_address: Option<String>,
    /// What it printed before it was listening.
    pub lines: Vec<String>,
    pub dir: tempfile::TempDir,
    /// How it was started (for `restart`, which the soak driver uses).
    #[allow(dead_code)]
    args: Vec<std::ffi::OsString>,
    #[allow(dead_code)]
    listeners: usize,
}

/// Starts a node with a warm pool of `pools` (TEMPLATE[/NET[/SIZE]]=COUNT each).
pub struct NodeSpec<'a> {
    pub token: &'a str,
    pub name: &'a str,
    pub pools: &'a [String],
    pub extra: &'a [String],
}

impl Daemon {
    fn start(
        listeners: usize,
        args: impl FnOnce(&Path) -> Res<Vec<std::ffi::OsString>>,
    ) -> Res<Self> {
        let dir = tempfile::Builder::new().prefix("sgw-bench-").tempdir()?;
        let mut args = args(dir.path())?;
        args.push("--templates-dir".into());
        args.push(templates_dir()?.into());
        Self::spawn(dir, listeners, args)
    }

    /// SIGKILL, as a crash would, and waits for the process to be gone.
    #[allow(dead_code)]
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the same command again on the same directory (after `kill`, or a stop).
    #[allow(dead_code)]
    pub fn restart(&mut self) -> Res<()> {
        self.kill();
        // The directory moves to the new process; the old value keeps a throwaway one.
        let dir = std::mem::replace(&mut self.dir, tempfile::Builder::new().tempdir()?);
        let fresh = Self::spawn(dir, self.listeners, self.args.clone())?;
        drop(std::mem::replace(self, fresh));
        Ok(())
    }

    fn spawn(dir: tempfile::TempDir, listeners: usize, args: Vec<std::ffi::OsString>) -> Res<Self> {
        let mut child = Command::new(node_binary()?)
            .args(&args)
            // The claim benches release sandboxes at once, often before the node has given
            // the agent its identity; the node logs each of those as an error. BENCH_NODE_LOG
            // replaces the filter, to see where a figure's time goes.
            .env(
                "RUST_LOG",
                std::env::var("BENCH_NODE_LOG")
                    .unwrap_or_else(|_| "warn,sandbox_gateway::node::identify=off".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting sandbox-gateway")?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(out).lines();
        let mut addresses = Vec::new();
        let mut seen = Vec::new();
        while addresses.len() < listeners {
            let line = match lines.next() {
                Some(l) => l?,
                None => {
                    let status = child.wait().ok();
                    return Err(format!(
                        "sandbox-gateway {:?} exited before listening ({status:?}); it printed {seen:?}",
                        args.first()
                    )
                    .into());
                }
            };
            if let Some(rest) = line.split("listening on ").nth(1) {
                addresses.push(
                    rest.split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_string(),
                );
            }
            seen.push(line);
        }
        std::thread::spawn(move || for _ in lines.by_ref() {});
        Ok(Daemon {
            child,
            address: addresses[0].clone(),
            kube_address: addresses.get(1).cloned(),
            lines: seen,
            dir,
            args,
            listeners,
        })
    }

    /// A node with a warm pool of `pool` base sandboxes, reached with `token`.
    pub fn node(token: &str, pool: u32) -> Res<Self> {
        Self::named_node(token, "bench", pool, &[])
    }

    /// A node called `name` with a base pool of `pool`, with `extra` flags.
    pub fn named_node(token: &str, name: &str, pool: u32, extra: &[String]) -> Res<Self> {
        Self::node_with(&NodeSpec {
            token,
            name,
            pools: &[format!("base={pool}")],
            extra,
        })
    }

    pub fn node_with(spec: &NodeSpec<'_>) -> Res<Self> {
        Self::start(1, |dir| {
            let token_file = dir.join("token");
            std::fs::write(&token_file, spec.token)?;
            // A fixed port may come in `extra` (a node that is restarted keeps its address).
            let listen = if spec.extra.iter().any(|a| a == "--listen") {
                Vec::new()
            } else {
                vec!["--listen".into(), "127.0.0.1:0".into()]
            };
            let mut args: Vec<std::ffi::OsString> = vec!["node".into()];
            args.extend(listen);
            args.extend::<Vec<std::ffi::OsString>>(vec![
                // Any free port: "the gRPC port + 1" may be taken.
                "--data-listen".into(),
                "127.0.0.1:0".into(),
                "--name".into(),
                spec.name.into(),
                "--max-sandboxes".into(),
                "1000".into(),
                "--data-dir".into(),
                dir.join("node").into(),
                "--token-file".into(),
                token_file.into(),
            ]);
            for p in spec.pools {
                args.push("--pool".into());
                args.push(p.into());
            }
            args.extend(spec.extra.iter().map(Into::into));
            Ok(args)
        })
    }

    /// `serve` with its embedded node, anonymous e2b access, and a warm pool of `pool`
    /// sandboxes of the pool SDK creates use.
    pub fn gateway(pool: u32) -> Res<Self> {
        Self::gateway_with(&[format!("base/egress={pool}")], &[])
    }

    /// `serve` with `pools` on its embedded node (none when `extra` names `--node`s), the
    /// fleet token in DIR/node-token, and `extra` flags.
    pub fn gateway_with(pools: &[String], extra: &[String]) -> Res<Self> {
        Self::start(2, |dir| {
            let mut args: Vec<std::ffi::OsString> = vec![
                "serve".into(),
                "--e2b-listen".into(),
                "127.0.0.1:0".into(),
                "--kube-listen".into(),
                "127.0.0.1:0".into(),
                "--allow-anonymous".into(),
                "--data-dir".into(),
                dir.into(),
            ];
            for p in pools {
                args.push("--pool".into());
                args.push(p.into());
            }
            args.extend(extra.iter().map(Into::into));
            Ok(args)
        })
    }

    /// The embedded node's gRPC address and fleet token (a gateway without `--node`).
    pub fn embedded_node(&self) -> Res<(String, String)> {
        let addr = self
            .lines
            .iter()
            .find_map(|l| l.strip_prefix("embedded node "))
            .and_then(|rest| rest.split(" on ").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .ok_or("the gateway did not print its embedded node's address")?
            .to_string();
        let token = std::fs::read_to_string(self.dir.path().join("node-token"))
            .context("reading the gateway's fleet token")?;
        Ok((addr, token.trim().to_string()))
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGTERM, and waits until it has destroyed its sandboxes and exited.
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for Daemon {
    /// Also when a section fails half-way: no daemon (or sandbox) outlives the bench.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let _ = self.child.wait();
        }
    }
}

pub async fn wait_full(conn: &NodeConn, target: u32) -> Res<()> {
    wait_pool(conn, &PoolKey::base(), target).await
}

/// Waits until `key`'s warm pool on the node holds `target` sandboxes.
pub async fn wait_pool(conn: &NodeConn, key: &PoolKey, target: u32) -> Res<()> {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let info = conn.info(Duration::from_secs(5)).await?;
        if info.warm(key) >= target {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the warm pool {key} of {} did not refill (holds {}, wants {target})",
                conn.address(),
                info.warm(key)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn claim_request() -> proto::ClaimRequest {
    proto::ClaimRequest {
        key: Some((&PoolKey::base()).into()),
        ttl_seconds: 600,
        claim_ref: "bench/x".into(),
        ..Default::default()
    }
}

pub fn egress() -> PoolKey {
    PoolKey {
        net: "egress".into(),
        ..PoolKey::base()
    }
}

/// What a sandbox's process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Host side, keeps the host's privileges (`agent --boot`).
    Supervisor,
    /// pid 1 inside the sandbox's namespaces.
    Init,
    /// envd, pid 2.
    Agent,
    /// User-mode networking for net `egress`, a child of the supervisor on the host's network.
    Slirp,
    /// Anything else (what the agent started).
    Other,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Supervisor => "supervisor",
            Role::Init => "init",
            Role::Agent => "agent (envd)",
            Role::Slirp => "slirp4netns",
            Role::Other => "other",
        }
    }
}

/// A sandbox's processes as /proc shows them.
#[derive(Debug, Clone, Default)]
pub struct SandboxProcs {
    pub net: String,
    pub procs: Vec<(Role, i32)>,
}

impl SandboxProcs {
    pub fn supervisor(&self) -> Option<i32> {
        self.procs
            .iter()
            .find(|(r, _)| *r == Role::Supervisor)
            .map(|(_, p)| *p)
    }
}

pub fn parent_of(pid: i32) -> i32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("PPid:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

pub fn pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Every sandbox whose instance directory is under `root`, by instance directory: the
/// processes whose command line has `--boot <dir>/boot.json` (supervisor, init and agent share
/// it: init and agent are forks of the supervisor), and the slirp4netns attached to the
/// supervisor's network namespace. The net comes from the instance's boot.json.
pub fn sandbox_processes(root: &Path) -> BTreeMap<PathBuf, SandboxProcs> {
    let prefix = root.display().to_string();
    let mut by_dir: BTreeMap<PathBuf, SandboxProcs> = BTreeMap::new();
    let mut cmdlines = Vec::new();
    for pid in pids() {
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).to_string())
            .collect();
        cmdlines.push((pid, args));
    }
    for (pid, args) in &cmdlines {
        let boot = args
            .windows(2)
            .find(|w| w[0] == "--boot")
            .map(|w| PathBuf::from(&w[1]));
        let Some(boot) = boot.filter(|b| b.starts_with(&prefix)) else {
            continue;
        };
        let Some(dir) = boot.parent().map(Path::to_path_buf) else {
            continue;
        };
        let entry = by_dir.entry(dir).or_default();
        entry.procs.push((Role::Other, *pid));
    }
    for (dir, sb) in by_dir.iter_mut() {
        sb.net = std::fs::read_to_string(dir.join("boot.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["net"].as_str().map(str::to_string))
            .unwrap_or_default();
        let members: Vec<i32> = sb.procs.iter().map(|(_, p)| *p).collect();
        let parent: BTreeMap<i32, i32> = members.iter().map(|&p| (p, parent_of(p))).collect();
        for (role, pid) in sb.procs.iter_mut() {
            let pp = parent[pid];
            *role = if !members.contains(&pp) {
                Role::Supervisor
            } else if !members.contains(&parent[&pp]) {
                Role::Init
            } else if !members.contains(&parent[&parent[&pp]]) {
                Role::Agent
            } else {
                Role::Other
            };
        }
        if let Some(sup) = sb.supervisor() {
            let needle = format!("/proc/{sup}/ns/net");
            for (pid, args) in &cmdlines {
                if args.iter().any(|a| a == &needle) && parent_of(*pid) == sup {
                    sb.procs.push((Role::Slirp, *pid));
                }
            }
        }
        sb.procs.sort();
    }
    by_dir
}

/// The processes of the sandbox whose instance directory is `dir`.
pub fn processes_of(dir: &Path) -> Res<SandboxProcs> {
    let parent = dir.parent().ok_or("an instance directory has a parent")?;
    sandbox_processes(parent)
        .remove(dir)
        .ok_or_else(|| format!("no processes found for the sandbox in {}", dir.display()).into())
}

/// Resident set size and proportional set size of a process, in bytes (0 when it is gone).
pub fn rss_pss(pid: i32) -> (u64, u64) {
    let field = |text: &str, name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    (field(&status, "VmRSS:"), field(&smaps, "Pss:"))
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> Res<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
