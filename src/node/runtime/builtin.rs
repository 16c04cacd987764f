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
use crate::model::{Error, Result, ids};
use crate::sandbox::net::ALWAYS_BLOCKED;
use crate::sandbox::spec::{self as boot, IdMap, Net, layout};

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
    blocked: Vec<String>,
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

/// A program on PATH (or in the usual system directories).
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// What no sandbox may reach: the always-blocked ranges and the host's own networks.
pub fn blocked_ranges() -> Vec<String> {
    let mut blocked: Vec<String> = ALWAYS_BLOCKED.iter().map(|s| s.to_string()).collect();
    blocked.extend(host_networks());
    blocked
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
        let blocked = blocked_ranges();
        let reaper = Reaper::spawn(&cfg.agent, &cgroups, &cfg.node_lock)?;
        let dialer = Dialer::new().map_err(io_err("starting the dial thread"))?;
        Ok(BuiltinRuntime {
            cfg,
            cgroups,
            disks,
            dialer,
            slirp4netns,
            blocked,
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
            root_kind: spec.template.meta.root_kind,
            ids: self.cfg.ids,
            net,
            hostname: ids::dns_safe(spec.instance_id),
            init_token: init_token.to_string(),
            cpu_count: tier.cpu_count,
            memory_bytes: tier.memory_bytes,
            slirp4netns: self.slirp4netns.clone(),
            blocked: self.blocked.clone(),
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

    async fn start(&self, spec: &BootSpec<'_>, cg: &CgroupSet) -> Result<(i32, u64)> {
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
            .stderr(
                if std::env::var_os("SANDBOX_GATEWAY_AGENT_STDERR").is_some() {
                    Stdio::inherit()
                } else {
                    Stdio::null()
                },
            );
        let procs = Cgroups::start_in(&mut cmd, cg, Some((self.reaper.lifeline(), LIFELINE_FD)))
            .map_err(io_err("opening the instance cgroups"))?;
        let mut child = cmd.spawn().map_err(io_err(format!(
            "starting the supervisor {}",
            self.cfg.agent.program.display()
        )))?;
        drop(procs);
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
                let why = match outcome {
                    Err(_) => format!("did not report ready within {:?}", self.cfg.boot_timeout),
                    Ok(_) => format!(
                        "exited before it was ready ({status:?}); set SANDBOX_GATEWAY_AGENT_STDERR=1 to see why"
                    ),
                };
                Err(Error::internal(format!(
                    "sandbox {}: {why}",
                    spec.instance_id
                )))
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
        let cg = match self.prepare(&spec, &init_token) {
            Ok(cg) => cg,
            Err(e) => {
                let _ = std::fs::remove_dir_all(spec.dir);
                return Err(e);
            }
        };
        match self.start(&spec, &cg).await {
            Ok((pid, start_ticks)) => Ok(Instance {
                id: spec.instance_id.to_string(),
                dir: spec.dir.to_path_buf(),
                address: String::new(),
                handle: BuiltinHandle {
                    pid,
                    start_ticks,
                    cgroup: cg,
                    init_token,
                },
            }),
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
            disk::sync_fs(&disk_mount).map_err(io_err("flushing the sandbox's disk"))?;
            std::fs::create_dir(&dst_dir)
                .map_err(io_err(format!("creating {}", dst_dir.display())))?;
            disk::copy_sparse(&src, &dst_dir.join(layout::DISK_IMAGE))
                .map_err(io_err("copying the sandbox's disk"))
        })
        .await;
        if !paused {
            self.resume(inst).await?;
        }
        if copied.is_err() {
            let _ = std::fs::remove_dir_all(dest);
        }
        copied
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
