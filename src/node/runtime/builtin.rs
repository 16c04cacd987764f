//! The built-in runtime, node side: every instance is a sandbox built with the kernel's own
//! mechanisms (user, mount, pid, network, IPC, UTS and cgroup namespaces; an overlay of its
//! template and its own ext4 disk; cgroup limits; seccomp; no capabilities on the host). The
//! node prepares the instance directory, disk and cgroups, then starts the sandbox's
//! supervisor (`sandbox-gateway agent --boot`, see `crate::sandbox`) inside the cgroups and
//! waits for the agent's "ready". Pause freezes the cgroup; a checkpoint or fork copies the
//! sandbox's disk (its writable layer), not its memory.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::cgroup::{CgroupSet, Cgroups, Limits};
use super::dial::Dialer;
use super::disk::{self, Disks};
use super::reaper::{LIFELINE_FD, Reaper};
use super::{BootSpec, Conn, Instance, Runtime, Usage, sys};
use crate::model::network::{self, Egress};
use crate::model::{Error, Result, ids};
use crate::node::egress::policy::Rules;
use crate::node::egress::proxy::Proxies;
use crate::sandbox::egress;
use crate::sandbox::net::ALWAYS_BLOCKED;
use crate::sandbox::spec::{self as boot, ENVD_ABSTRACT_SOCKET, ENVD_PORT, IdMap, Net, layout};

/// How the node starts a supervisor: the program and the arguments that come before `agent`.
#[derive(Debug, Clone)]
pub struct AgentCommand {
    pub program: PathBuf,
    pub leading_args: Vec<String>,
}

impl AgentCommand {
    /// This very binary, which carries the `agent` subcommand.
    pub fn current_exe() -> std::io::Result<Self> {
        Ok(AgentCommand {
            program: std::env::current_exe()?,
            leading_args: Vec::new(),
        })
    }
}

#[derive(Debug, Clone)]
pub struct BuiltinConfig {
    pub agent: AgentCommand,
    /// Directory under which instance directories live (used to find orphans).
    pub state_root: PathBuf,
    /// Where blank disk images are kept.
    pub disks: PathBuf,
    /// Keeps cgroups of nodes that share a machine apart.
    pub tag: String,
    pub ids: IdMap,
    pub boot_timeout: Duration,
    /// Every sandbox's disk size instead of its tier's (for small machines and tests).
    pub disk_bytes: Option<u64>,
    /// The node's data-directory lock (see `Reaper`).
    pub node_lock: PathBuf,
    /// Blocked ranges sandboxes may reach all the same (`--sandbox-reachable`).
    pub reachable: Vec<String>,
    /// Names the egress proxy resolves itself (`--egress-host`).
    pub egress_hosts: Vec<(String, std::net::Ipv4Addr)>,
    /// Where the egress proxy fills `${e2b.secrets.NAME}` from.
    pub secrets: Option<std::sync::Arc<crate::secrets::SecretStore>>,
    /// CA certificates (PEM) the egress proxy trusts besides the node's (`--egress-ca-file`).
    pub egress_trust: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuiltinHandle {
    /// The supervisor (host pid); it sits in the sandbox's network namespace.
    pub pid: i32,
    pub start_ticks: u64,
    pub cgroup: CgroupSet,
    /// What the agent's /init requires.
    pub init_token: String,
}

pub struct BuiltinRuntime {
    cfg: BuiltinConfig,
    cgroups: Cgroups,
    disks: Disks,
    dialer: Dialer,
    slirp4netns: Option<PathBuf>,
    /// For sandboxes' own egress policies (`crate::sandbox::egress`).
    nft: Option<PathBuf>,
    blocked: Vec<String>,
    /// Sandboxes whose policies allow names (`crate::node::egress`).
    proxies: Proxies,
    /// Every supervisor inherits the lifeline's read end; when the node exits for any reason
    /// supervisors end their sandboxes, and the reaper ends what they could not.
    reaper: Reaper,
}

fn io_err(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::internal(format!("runtime task failed: {e}")))?
}

/// Runs `f`, blocking work that borrows from the caller (files, cgroups, a fork), without
/// holding up the async tasks queued on this worker thread: on a multi-threaded runtime they
/// move to another thread meanwhile, so a claim is never queued behind a refill's boot.
fn in_place<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Puts `egress` in force in the network namespace `netns` with the rules for `hook`.
pub(super) async fn enforce_egress(
    nft: Option<&Path>,
    netns: PathBuf,
    egress: Option<&Egress>,
    hook: egress::Hook,
    proxy: Option<u16>,
) -> Result<()> {
    let nft = nft
        .ok_or_else(|| Error::invalid("network policies need nftables (apt-get install nftables)"))?
        .to_path_buf();
    let script = egress::ruleset(egress, hook, proxy);
    blocking(move || {
        egress::apply(&nft, &netns, &script).map_err(io_err("applying the sandbox's egress rules"))
    })
    .await
}

/// A program on PATH (or in the usual system directories).
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// What no sandbox may reach: the always-blocked ranges and the host's own networks, except
/// the ranges the operator made `reachable` (an internal mirror, say).
pub fn blocked_ranges(reachable: &[String]) -> Result<Vec<String>> {
    let mut blocked: Vec<String> = ALWAYS_BLOCKED.iter().map(|s| s.to_string()).collect();
    blocked.extend(host_networks());
    without(blocked, reachable)
}

fn without(blocked: Vec<String>, reachable: &[String]) -> Result<Vec<String>> {
    if reachable.is_empty() {
        return Ok(blocked);
    }
    let reachable = network::parse_cidrs("--sandbox-reachable", reachable)?;
    let blocked = network::merge(
        blocked
            .iter()
            .filter_map(|c| network::parse_cidr(c))
            .collect(),
    );
    Ok(network::prefixes(&network::subtract(&blocked, &reachable)))
}

/// slirp4netns, when it and `ip` (which sets up its routes) are both installed.
pub fn find_slirp4netns() -> Option<PathBuf> {
    which("slirp4netns").filter(|_| which("ip").is_some())
}

/// The host's own addresses and the networks it is attached to: a sandbox must not reach
/// services the host (or its neighbours) expose on them.
fn host_networks() -> Vec<String> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for a in addrs {
        let Some(ip) = a
            .address
            .as_ref()
            .and_then(|s| s.as_sockaddr_in())
            .map(|s| s.ip())
        else {
            continue;
        };
        out.push(format!("{ip}/32"));
        if let Some(mask) = a
            .netmask
            .as_ref()
            .and_then(|s| s.as_sockaddr_in())
            .map(|s| s.ip())
        {
            let bits = u32::from(mask).count_ones();
            let net = std::net::Ipv4Addr::from(u32::from(ip) & u32::from(mask));
            if bits > 0 {
                out.push(format!("{net}/{bits}"));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

impl BuiltinRuntime {
    pub fn new(cfg: BuiltinConfig) -> Result<Self> {
        if !sys::is_root() {
            return Err(Error::invalid(
                "the built-in runtime needs root: it creates namespaces, mounts and cgroups for every sandbox",
            ));
        }
        let cgroups = Cgroups::detect(&cfg.tag).ok_or_else(|| {
            Error::invalid(
                "no cgroup file system is mounted; sandboxes need cgroups for their limits",
            )
        })?;
        if !cgroups.enforces_limits() {
            return Err(Error::invalid(format!(
                "the cgroups here ({}) cannot limit memory, CPU and processes",
                cgroups.describe()
            )));
        }
        let disks = Disks::find(cfg.disks.clone()).map_err(io_err("preparing sandbox disks"))?;
        let slirp4netns = find_slirp4netns();
        let blocked = blocked_ranges(&cfg.reachable)?;
        let reaper = Reaper::spawn(&cfg.agent, &cgroups, &cfg.node_lock)?;
        let dialer = Dialer::new().map_err(io_err("starting the dial thread"))?;
        let proxies = Proxies::new(
            &blocked,
            &cfg.egress_hosts,
            cfg.secrets.clone(),
            &cfg.egress_trust,
        )?;
        Ok(BuiltinRuntime {
            cfg,
            cgroups,
            disks,
            dialer,
            slirp4netns,
            nft: which("nft"),
            blocked,
            proxies,
            reaper,
        })
    }

    /// Whether sandboxes with net `egress` can be made here.
    pub fn offers_egress(&self) -> bool {
        self.slirp4netns.is_some()
    }

    fn disk_path(h: &BuiltinHandle, dir: &Path) -> PathBuf {
        // The disk is mounted only inside the supervisor's mount namespace; its root there is
        // the host's root.
        PathBuf::from(format!("/proc/{}/root", h.pid))
            .join(dir.strip_prefix("/").unwrap_or(dir))
            .join(layout::DISK_MOUNT)
    }

    fn prepare(&self, spec: &BootSpec<'_>, init_token: &str) -> Result<CgroupSet> {
        use std::os::unix::fs::PermissionsExt;
        let dir = spec.dir;
        std::fs::create_dir(dir).map_err(io_err(format!("creating {}", dir.display())))?;
        // Searchable but not listable by others: the sandbox's root (an unprivileged host id)
        // resolves its mount sources relative to this directory and nothing above it.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
            .map_err(io_err("preparing the instance directory"))?;
        for d in [
            layout::LOWER,
            layout::ROOT,
            layout::DISK_MOUNT,
            layout::HOST_USR,
        ] {
            std::fs::create_dir(dir.join(d)).map_err(io_err("preparing the instance directory"))?;
        }
        let tier = spec.key.tier();
        let seed = match spec.seed {
            Some(s) => s.join(layout::DISK_IMAGE),
            None => self
                .disks
                .blank(self.cfg.disk_bytes.unwrap_or(tier.disk_bytes))
                .map_err(io_err("making a blank disk"))?,
        };
        disk::copy_sparse(&seed, &dir.join(layout::DISK_IMAGE))
            .map_err(io_err(format!("copying the disk {}", seed.display())))?;
        let net = Net::parse(&spec.key.net)?;
        if net == Net::Egress && self.slirp4netns.is_none() {
            return Err(Error::invalid(
                "net egress needs slirp4netns and iproute2 on the node (apt-get install slirp4netns iproute2)",
            ));
        }
        boot::BootSpec {
            instance_id: spec.instance_id.to_string(),
            dir: dir.to_path_buf(),
            template_root: spec.template.root.clone(),
            template_layers: spec.template.layers.clone(),
            root_kind: spec.template.meta.root_kind,
            ids: self.cfg.ids,
            net,
            hostname: ids::dns_safe(spec.instance_id),
            init_token: init_token.to_string(),
            cpu_count: tier.cpu_count,
            memory_bytes: tier.memory_bytes,
            slirp4netns: self.slirp4netns.clone(),
            blocked: self.blocked.clone(),
            services: spec.template.meta.services.clone(),
        }
        .save()?;
        let cg = self
            .cgroups
            .create(spec.instance_id)
            .map_err(io_err("creating the instance cgroups"))?;
        let limits = Limits {
            memory_bytes: tier.memory_bytes,
            cpus: tier.cpu_count,
            pids: tier.pids,
        };
        if let Err(e) = self.cgroups.limit(&cg, limits) {
            let _ = self.cgroups.destroy(&cg);
            return Err(Error::io("limiting the instance", e));
        }
        Ok(cg)
    }

    async fn start(
        &self,
        spec: &BootSpec<'_>,
        cg: &CgroupSet,
        logs: &crate::node::logs::Logs,
    ) -> Result<(i32, u64)> {
        let mut cmd = tokio::process::Command::new(&self.cfg.agent.program);
        cmd.args(&self.cfg.agent.leading_args)
            .arg("agent")
            .arg("--boot")
            .arg(boot::BootSpec::path(spec.dir))
            .arg("--lifeline-fd")
            .arg(LIFELINE_FD.to_string())
            .current_dir(spec.dir)
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // The sandbox's log: the supervisor's, init's and envd's lines.
            .stderr(Stdio::piped());
        // The spawn forks this whole process: in place, like the preparation.
        let mut child = in_place(|| {
            let procs =
                Cgroups::start_in(&mut cmd, cg, Some((self.reaper.lifeline(), LIFELINE_FD)))
                    .map_err(io_err("opening the instance cgroups"))?;
            let child = cmd.spawn().map_err(io_err(format!(
                "starting the supervisor {}",
                self.cfg.agent.program.display()
            )));
            drop(procs);
            child
        })?;
        if let Some(stderr) = child.stderr.take() {
            let echo = std::env::var_os("SANDBOX_GATEWAY_AGENT_STDERR").is_some();
            logs.collect(stderr, echo);
        }
        let pid = child.id().map(|p| p as i32).unwrap_or(0);
        let start_ticks = sys::proc_stat(pid).map(|s| s.start_ticks).unwrap_or(0);
        let stdout = child.stdout.take();
        let ready = async {
            let mut lines = BufReader::new(stdout?).lines();
            lines.next_line().await.ok().flatten()
        };
        match tokio::time::timeout(self.cfg.boot_timeout, ready).await {
            Ok(Some(line)) if line.trim() == "ready" && pid > 0 => {
                // tokio reaps the supervisor in the background once it exits.
                drop(child);
                Ok((pid, start_ticks))
            }
            outcome => {
                let _ = child.start_kill();
                let status = child.wait().await.ok();
                Err(match outcome {
                    Err(_) => super::boot_too_slow(
                        format!("sandbox {}", spec.instance_id),
                        self.cfg.boot_timeout,
                    ),
                    Ok(_) => Error::internal(format!(
                        "sandbox {}: exited before it was ready ({status:?}); set SANDBOX_GATEWAY_AGENT_STDERR=1 to see why",
                        spec.instance_id
                    )),
                })
            }
        }
    }
}

impl Runtime for BuiltinRuntime {
    type Handle = BuiltinHandle;

    fn name(&self) -> &'static str {
        "builtin"
    }

    fn describe(&self) -> String {
        format!(
            "builtin: Linux namespaces (user, mount, pid, network, IPC, UTS, cgroup), overlay root, ext4 disk quota, cgroups {} for memory/CPU/pids, seccomp, no host capabilities; sandbox root is host uid {}; egress {}; shares the host kernel",
            self.cgroups.describe(),
            self.cfg.ids.base,
            if self.offers_egress() {
                "through slirp4netns"
            } else {
                "unavailable (apt-get install slirp4netns)"
            }
        )
    }

    async fn boot(&self, spec: BootSpec<'_>) -> Result<Instance<BuiltinHandle>> {
        let init_token = ids::random_hex(24);
        let cg = match in_place(|| self.prepare(&spec, &init_token)) {
            Ok(cg) => cg,
            Err(e) => {
                let _ = std::fs::remove_dir_all(spec.dir);
                return Err(e);
            }
        };
        let logs = crate::node::logs::Logs::default();
        match self.start(&spec, &cg, &logs).await {
            Ok((pid, start_ticks)) => {
                let inst = Instance {
                    id: spec.instance_id.to_string(),
                    dir: spec.dir.to_path_buf(),
                    address: String::new(),
                    handle: BuiltinHandle {
                        pid,
                        start_ticks,
                        cgroup: cg,
                        init_token,
                    },
                    logs,
                    agent: Default::default(),
                };
                // Only the agent runs before a claim hands the sandbox out, so rules set
                // now are in force before anything of the caller's runs.
                let egress = spec
                    .egress
                    .filter(|_| Net::parse(&spec.key.net).ok() == Some(Net::Egress));
                if let Some(e) = egress
                    && let Err(err) = self.set_egress(&inst, Some(e)).await
                {
                    let _ = self.destroy(&inst).await;
                    return Err(err);
                }
                Ok(inst)
            }
            Err(e) => {
                let cgroups = self.cgroups.clone();
                let dir = spec.dir.to_path_buf();
                let _ = blocking(move || {
                    let _ = cgroups.destroy(&cg);
                    let _ = std::fs::remove_dir_all(&dir);
                    Ok(())
                })
                .await;
                Err(e)
            }
        }
    }

    async fn destroy(&self, inst: &Instance<BuiltinHandle>) -> Result<()> {
        self.proxies.forget_instance(&inst.id);
        let cgroups = self.cgroups.clone();
        let cg = inst.handle.cgroup.clone();
        let dir = inst.dir.clone();
        blocking(move || {
            cgroups
                .destroy(&cg)
                .map_err(io_err(format!("destroying sandbox {}", dir.display())))?;
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(Error::io(format!("removing {}", dir.display()), e)),
            }
        })
        .await
    }

    async fn pause(&self, inst: &Instance<BuiltinHandle>) -> Result<()> {
        let (c, cg) = (self.cgroups.clone(), inst.handle.cgroup.clone());
        blocking(move || c.freeze(&cg).map_err(io_err("freezing the sandbox"))).await
    }

    async fn resume(&self, inst: &Instance<BuiltinHandle>) -> Result<()> {
        let (c, cg) = (self.cgroups.clone(), inst.handle.cgroup.clone());
        blocking(move || c.thaw(&cg).map_err(io_err("thawing the sandbox"))).await
    }

    async fn capture(
        &self,
        inst: &Instance<BuiltinHandle>,
        paused: bool,
        dest: &Path,
    ) -> Result<u64> {
        if !paused {
            self.pause(inst).await?;
        }
        let disk_mount = Self::disk_path(&inst.handle, &inst.dir);
        let src = inst.dir.join(layout::DISK_IMAGE);
        let dst_dir = dest.to_path_buf();
        let copied = blocking(move || {
            // Frozen and flushed: the image on the host is the layer as of this moment.
            disk::sync_disk(&disk_mount, &src).map_err(io_err("flushing the sandbox's disk"))?;
            std::fs::create_dir(&dst_dir)
                .map_err(io_err(format!("creating {}", dst_dir.display())))?;
            disk::copy_sparse(&src, &dst_dir.join(layout::DISK_IMAGE))
                .map_err(io_err("copying the sandbox's disk"))
        })
        .await;
        // Thawed whatever the copy did: a full disk fails the snapshot, not the sandbox.
        let resumed = if paused {
            Ok(())
        } else {
            self.resume(inst).await
        };
        if let (Err(copy), Err(thaw)) = (&copied, &resumed) {
            tracing::error!(instance = %inst.id, error = %thaw, copy = %copy, "a failed capture could not thaw the sandbox");
        }
        let outcome = copied.and_then(|n| resumed.map(|_| n));
        if outcome.is_err() {
            // A half-copied image (the disk filled up) must not be left to look like a capture.
            let _ = std::fs::remove_dir_all(dest);
        }
        outcome
    }

    fn captures_files(&self) -> Result<()> {
        // A capture is the disk holding the overlay's upper directory; a boot from it is a
        // fresh supervisor, init and agent over those files.
        Ok(())
    }

    async fn commit(
        &self,
        inst: &Instance<BuiltinHandle>,
        dest: &Path,
        skip: &'static [&'static str],
    ) -> Result<Option<u64>> {
        // Frozen, so the tree holds still while it is read; the instance is destroyed next.
        self.pause(inst).await?;
        let upper = Self::disk_path(&inst.handle, &inst.dir).join("upper");
        let dest = dest.to_path_buf();
        blocking(move || {
            // Read through the supervisor's mount namespace as host root; the walk never
            // follows the sandbox's links.
            if crate::templates::layers::is_empty(&upper, skip)
                .map_err(io_err("reading the sandbox's writes"))?
            {
                return Ok(None);
            }
            crate::templates::layers::commit(&upper, &dest, skip)
                .map(Some)
                .map_err(io_err("committing the sandbox's writes"))
        })
        .await
    }

    fn commits(&self) -> bool {
        true
    }

    async fn usage(&self, inst: &Instance<BuiltinHandle>) -> Result<Usage> {
        let cg = inst.handle.cgroup.clone();
        let disk_mount = Self::disk_path(&inst.handle, &inst.dir);
        blocking(move || {
            let m = Cgroups::measure(&cg);
            let (disk_used, disk_total) = disk::usage(&disk_mount).unwrap_or((0, 0));
            Ok(Usage {
                cpu_ns: m.cpu_ns.unwrap_or(0),
                mem_bytes: m.memory_bytes.unwrap_or(0),
                processes: m.pids.unwrap_or_else(|| Cgroups::pids(&cg).len() as u32),
                measured: m.memory_bytes.is_some(),
                disk_used,
                disk_total,
                oom_kills: m.oom_kills.unwrap_or(0),
            })
        })
        .await
    }

    fn enforces_egress(&self) -> bool {
        self.nft.is_some()
    }

    async fn set_egress(
        &self,
        inst: &Instance<BuiltinHandle>,
        egress: Option<&Egress>,
    ) -> Result<()> {
        if !self.is_alive(inst) {
            return Err(Error::unavailable(format!(
                "sandbox {} is not running",
                inst.id
            )));
        }
        // A frozen sandbox's namespace is the host's to change like any other.
        let netns = PathBuf::from(format!("/proc/{}/ns/net", inst.handle.pid));
        // Names need the proxy: it is started (or given the new rules) before the redirect
        // sends anything to it, and stopped after the redirect is gone.
        let proxy = match egress.filter(|e| e.needs_proxy()) {
            Some(e) => Some(
                self.proxies
                    .ensure(
                        &inst.id,
                        netns.clone(),
                        std::net::Ipv4Addr::LOCALHOST,
                        Rules::from_egress(e)?,
                    )
                    .await?,
            ),
            None => None,
        };
        enforce_egress(
            self.nft.as_deref(),
            netns,
            egress,
            egress::Hook::KernelStack,
            proxy,
        )
        .await?;
        if proxy.is_none() {
            self.proxies.forget(&inst.id);
        }
        Ok(())
    }

    fn mounts_volumes_live(&self) -> bool {
        true
    }

    async fn mount_volume(
        &self,
        inst: &Instance<BuiltinHandle>,
        source: &Path,
        target: &str,
    ) -> Result<()> {
        let sup = inst.handle.pid;
        let owner = self.cfg.ids.base;
        let (source, target) = (source.to_path_buf(), target.to_string());
        blocking(move || {
            let mount = || -> std::io::Result<()> {
                // The sandbox's init is the supervisor's child in a user namespace of its own
                // (slirp4netns, its other child, is in the host's).
                let children = std::fs::read_to_string(format!("/proc/{sup}/task/{sup}/children"))?;
                let own = std::fs::read_link(format!("/proc/{sup}/ns/user"))?;
                let init = children
                    .split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok())
                    .find(|p| {
                        std::fs::read_link(format!("/proc/{p}/ns/user")).is_ok_and(|ns| ns != own)
                    })
                    .ok_or_else(|| std::io::Error::other("the sandbox's init is gone"))?;
                super::mount_in::mount_into(init, &source, &target, owner)
            };
            mount().map_err(|e| {
                if e.kind() == std::io::ErrorKind::InvalidInput {
                    Error::invalid(format!("volume mount path: {e}"))
                } else {
                    Error::internal(format!("mounting a volume at {target:?}: {e}"))
                }
            })
        })
        .await
    }

    fn egress_ca(&self, inst: &Instance<BuiltinHandle>) -> Result<String> {
        Ok(self.proxies.ca(&inst.id)?.pem())
    }

    fn proxies_egress(&self) -> bool {
        self.nft.is_some()
    }

    fn is_alive(&self, inst: &Instance<BuiltinHandle>) -> bool {
        sys::is_same_live_process(inst.handle.pid, inst.handle.start_ticks)
    }

    async fn dial(&self, inst: &Instance<BuiltinHandle>, port: u16) -> Result<Conn> {
        if !self.is_alive(inst) {
            return Err(Error::unavailable(format!(
                "sandbox {} is not running",
                inst.id
            )));
        }
        let netns = PathBuf::from(format!("/proc/{}/ns/net", inst.handle.pid));
        if port == ENVD_PORT {
            // The agent's Unix socket first: half the kernel's work of loopback TCP per byte,
            // which every file transfer pays twice (PERFORMANCE.md, "Transfers"). The port
            // stays the way in when the socket cannot be reached.
            match self
                .dialer
                .connect_abstract(netns.clone(), ENVD_ABSTRACT_SOCKET)
                .await
            {
                Ok(stream) => return Ok(Box::new(stream)),
                Err(e) => {
                    tracing::debug!(id = %inst.id, error = %e, "envd's socket not reached; its port instead")
                }
            }
        }
        let stream =
            self.dialer.connect(netns, port).await.map_err(|e| {
                Error::unavailable(format!("port {port} of sandbox {}: {e}", inst.id))
            })?;
        Ok(Box::new(stream))
    }

    fn init_token(&self, inst: &Instance<BuiltinHandle>) -> String {
        inst.handle.init_token.clone()
    }

    async fn reclaim_orphans(&self) {
        let cgroups = self.cgroups.clone();
        let mut needle = b"--boot\0".to_vec();
        needle.extend_from_slice(self.cfg.state_root.as_os_str().as_bytes());
        needle.push(b'/');
        let _ = blocking(move || {
            for pid in sys::pids_with_cmdline(&needle) {
                tracing::warn!(pid, "killing a sandbox supervisor left by an earlier run");
                sys::kill_pid(pid, libc::SIGKILL);
            }
            for set in cgroups.leftovers() {
                tracing::warn!(cgroup = ?set.dirs.first(), "removing sandbox cgroups left by an earlier run");
                if let Err(e) = cgroups.destroy(&set) {
                    tracing::error!(error = %e, "could not remove orphaned cgroups");
                }
            }
            Ok(())
        })
        .await;
    }
}

impl Drop for BuiltinRuntime {
    fn drop(&mut self) {
        // The node's cgroup directories are empty once every instance is destroyed.
        self.cgroups.remove_parents();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covered(list: &[String], ip: &str) -> bool {
        let ip = u32::from(ip.parse::<std::net::Ipv4Addr>().expect("address"));
        list.iter()
            .filter_map(|p| network::parse_cidr(p))
            .any(|(a, b)| a <= ip && ip <= b)
    }

    #[test]
    fn reachable_ranges_are_cut_out_of_the_blocked_ones() {
        let blocked: Vec<String> = ["10.0.0.0/8", "198.51.100.7/32", "127.0.0.0/8"]
            .map(String::from)
            .to_vec();
        assert_eq!(without(blocked.clone(), &[]).unwrap(), blocked);
        let left = without(
            blocked.clone(),
            &["198.51.100.0/24".into(), "10.1.0.0/16".into()],
        )
        .unwrap();
        assert!(!covered(&left, "198.51.100.7"));
        assert!(!covered(&left, "10.1.2.3"));
        assert!(covered(&left, "10.2.0.1") && covered(&left, "127.0.0.1"));
        assert!(without(blocked, &["a mirror".into()]).is_err());
    }
}
