//! The process runtime: each instance is `sandbox-gateway agent` in its own session (process
//! group), in its own cgroup when one is available, and in its own UTS/IPC (and, for net
//! `none`, network) namespaces when the node runs as root. Its state is a directory seeded
//! from a template or checkpoint. It captures files, not memory: pausing freezes the processes
//! in place, and a checkpoint or fork copies the state directory only.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::cgroup::Cgroups;
use super::{BootSpec, Instance, Runtime, Usage, sys};
use crate::fsx;
use crate::model::{Error, Result};

/// How the node starts an agent: the program and the arguments that come before `agent`.
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
pub struct ProcessConfig {
    pub agent: AgentCommand,
    /// Directory under which instance state directories live (used to find orphans).
    pub state_root: PathBuf,
    /// Keeps cgroups of nodes that share a machine apart.
    pub tag: String,
    /// Use namespaces when running as root.
    pub isolate: bool,
    pub boot_timeout: Duration,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessHandle {
    pub pid: i32,
    pub start_ticks: u64,
    pub cgroup: Option<PathBuf>,
}

impl ProcessHandle {
    /// Signals the instance's process group, but only while its leader is still the process
    /// this handle was made for: after a reboot or a long outage the number may belong to
    /// someone else.
    fn signal_group(&self, sig: i32) {
        if sys::is_same_live_process(self.pid, self.start_ticks) {
            sys::kill_group(self.pid, sig);
        }
    }
}

pub struct ProcessRuntime {
    cfg: ProcessConfig,
    cgroups: Option<Cgroups>,
    isolate: bool,
    /// Every agent inherits the read end; when the node exits for any reason the write end
    /// closes and agents take their process groups down with them.
    lifeline_read: OwnedFd,
    _lifeline_write: OwnedFd,
    ticks_per_second: u64,
    page_size: u64,
}

const LISTEN_FD: i32 = 3;
const LIFELINE_FD: i32 = 4;

fn io_err(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::internal(format!("runtime task failed: {e}")))?
}

impl ProcessRuntime {
    pub fn new(cfg: ProcessConfig) -> Result<Self> {
        // Operators (and tests of the fallback path) can turn cgroups off.
        let cgroups = match std::env::var("SANDBOX_GATEWAY_CGROUPS").as_deref() {
            Ok("off") => None,
            _ => Cgroups::detect(&cfg.tag),
        };
        let isolate = cfg.isolate && sys::is_root();
        let (r, w) = sys::pipe().map_err(io_err("creating the agent lifeline"))?;
        let lifeline_read = sys::dup_high(&r).map_err(io_err("creating the agent lifeline"))?;
        tracing::info!(
            cgroups = ?cgroups.as_ref().map(|c| (c.flavor, c.parent.display().to_string())),
            namespaces = isolate,
            "process runtime ready"
        );
        Ok(ProcessRuntime {
            cfg,
            cgroups,
            isolate,
            lifeline_read,
            _lifeline_write: w,
            ticks_per_second: sys::clock_ticks_per_second(),
            page_size: sys::page_size(),
        })
    }

    pub fn uses_cgroups(&self) -> bool {
        self.cgroups.is_some()
    }

    fn member_pids(&self, h: &ProcessHandle) -> Vec<i32> {
        match &h.cgroup {
            Some(cg) if self.cgroups.is_some() => Cgroups::pids(cg),
            _ => sys::pids_in_group(h.pid),
        }
    }

    async fn spawn(
        &self,
        spec: &BootSpec<'_>,
        cgroup: Option<&Path>,
    ) -> Result<(ProcessHandle, String)> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(io_err("binding the agent listener"))?;
        let address = listener
            .local_addr()
            .map_err(io_err("reading the agent listener address"))?;
        let listen_fd = sys::dup_high(&listener).map_err(io_err("preparing the agent listener"))?;
        drop(listener);
        let cg_procs = match cgroup {
            Some(cg) => Some(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(Cgroups::procs_file(cg))
                    .map_err(io_err("opening the instance cgroup"))?,
            ),
            None => None,
        };

        let mut cmd = tokio::process::Command::new(&self.cfg.agent.program);
        cmd.args(&self.cfg.agent.leading_args)
            .arg("agent")
            .arg("--listen-fd")
            .arg(LISTEN_FD.to_string())
            .arg("--lifeline-fd")
            .arg(LIFELINE_FD.to_string())
            .arg("--state-dir")
            .arg(spec.dir)
            .current_dir(spec.dir)
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("HOME", spec.dir)
            .env("SANDBOX_INSTANCE_ID", spec.instance_id)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(
                if std::env::var_os("SANDBOX_GATEWAY_AGENT_STDERR").is_some() {
                    Stdio::inherit()
                } else {
                    Stdio::null()
                },
            );

        let mut ns_flags = 0;
        if self.isolate {
            ns_flags |= libc::CLONE_NEWUTS | libc::CLONE_NEWIPC;
            if spec.key.net == "none" {
                ns_flags |= libc::CLONE_NEWNET;
            }
        }
        let hostname = b"sandbox".to_vec();
        let listen_raw = listen_fd.as_raw_fd();
        let lifeline_raw = self.lifeline_read.as_raw_fd();
        let cg_raw = cg_procs.as_ref().map(|f| f.as_raw_fd());
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe system calls on values prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(fd) = cg_raw {
                    // "0" moves the writing process itself into the cgroup.
                    if libc::write(fd, b"0".as_ptr().cast(), 1) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if ns_flags != 0 {
                    if libc::unshare(ns_flags) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::sethostname(hostname.as_ptr().cast(), hostname.len());
                }
                // dup2 clears close-on-exec on the target, so these two survive the exec.
                if libc::dup2(listen_raw, LISTEN_FD) < 0
                    || libc::dup2(lifeline_raw, LIFELINE_FD) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(io_err(format!(
            "starting agent {}",
            self.cfg.agent.program.display()
        )))?;
        drop(listen_fd);
        drop(cg_procs);
        let pid = child.id().map(|p| p as i32).unwrap_or(0);
        let start_ticks = sys::proc_stat(pid).map(|s| s.start_ticks).unwrap_or(0);
        let handle = ProcessHandle {
            pid,
            start_ticks,
            cgroup: cgroup.map(Path::to_path_buf),
        };

        let stdout = child.stdout.take();
        let ready = async {
            let mut lines = BufReader::new(stdout?).lines();
            lines.next_line().await.ok().flatten()
        };
        match tokio::time::timeout(self.cfg.boot_timeout, ready).await {
            Ok(Some(line)) if line.trim() == "ready" && pid > 0 => {
                // The child is reaped by tokio in the background once it exits.
                drop(child);
                Ok((handle, address.to_string()))
            }
            outcome => {
                let _ = child.start_kill();
                let status = child.wait().await.ok();
                let why = match outcome {
                    Err(_) => format!("did not report ready within {:?}", self.cfg.boot_timeout),
                    Ok(_) => format!("exited before it was ready ({status:?})"),
                };
                Err(Error::internal(format!(
                    "agent for {}: {why}",
                    spec.instance_id
                )))
            }
        }
    }

    fn kill_ctx(&self) -> KillCtx {
        KillCtx {
            cgroups: self.cgroups.clone(),
        }
    }
}

impl Runtime for ProcessRuntime {
    type Handle = ProcessHandle;

    fn name(&self) -> &'static str {
        "process"
    }

    async fn boot(&self, spec: BootSpec<'_>) -> Result<Instance<ProcessHandle>> {
        let seed = spec.seed.to_path_buf();
        let dir = spec.dir.to_path_buf();
        blocking(move || {
            fsx::copy_tree(&seed, &dir)
                .map(|_| ())
                .map_err(io_err(format!(
                    "seeding {} from {}",
                    dir.display(),
                    seed.display()
                )))
        })
        .await?;
        let cgroup = match &self.cgroups {
            Some(c) => match c.create(spec.instance_id) {
                Ok(p) => Some(p),
                Err(e) => {
                    let _ = std::fs::remove_dir_all(spec.dir);
                    return Err(Error::io("creating the instance cgroup", e));
                }
            },
            None => None,
        };
        match self.spawn(&spec, cgroup.as_deref()).await {
            Ok((handle, address)) => Ok(Instance {
                id: spec.instance_id.to_string(),
                dir: spec.dir.to_path_buf(),
                address,
                handle,
            }),
            Err(e) => {
                let kill = self.kill_ctx();
                let dir = spec.dir.to_path_buf();
                let _ = blocking(move || {
                    if let (Some(c), Some(cg)) = (&kill.cgroups, &cgroup) {
                        let _ = c.destroy(cg);
                    }
                    let _ = std::fs::remove_dir_all(&dir);
                    Ok(())
                })
                .await;
                Err(e)
            }
        }
    }

    async fn destroy(&self, inst: &Instance<ProcessHandle>) -> Result<()> {
        let h = inst.handle.clone();
        let dir = inst.dir.clone();
        let kill = self.kill_ctx();
        blocking(move || {
            kill.kill(&h)?;
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(Error::io(format!("removing {}", dir.display()), e)),
            }
        })
        .await
    }

    async fn pause(&self, inst: &Instance<ProcessHandle>) -> Result<()> {
        match (&self.cgroups, &inst.handle.cgroup) {
            (Some(c), Some(cg)) => {
                let (c, cg) = (c.clone(), cg.clone());
                blocking(move || c.freeze(&cg).map_err(io_err("freezing the instance"))).await
            }
            _ => {
                inst.handle.signal_group(libc::SIGSTOP);
                Ok(())
            }
        }
    }

    async fn resume(&self, inst: &Instance<ProcessHandle>) -> Result<()> {
        match (&self.cgroups, &inst.handle.cgroup) {
            (Some(c), Some(cg)) => {
                let (c, cg) = (c.clone(), cg.clone());
                blocking(move || c.thaw(&cg).map_err(io_err("thawing the instance"))).await
            }
            _ => {
                inst.handle.signal_group(libc::SIGCONT);
                Ok(())
            }
        }
    }

    async fn capture(
        &self,
        inst: &Instance<ProcessHandle>,
        paused: bool,
        dest: &Path,
    ) -> Result<u64> {
        if !paused {
            self.pause(inst).await?;
        }
        let (src, dst) = (inst.dir.clone(), dest.to_path_buf());
        let copied = blocking(move || {
            fsx::copy_tree(&src, &dst).map_err(io_err(format!("copying {}", src.display())))
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

    async fn usage(&self, inst: &Instance<ProcessHandle>) -> Result<Usage> {
        let pids = self.member_pids(&inst.handle);
        let mut u = Usage::default();
        for pid in pids {
            if let Some(s) = sys::proc_stat(pid) {
                u.cpu_ns += (s.utime + s.stime) * 1_000_000_000 / self.ticks_per_second;
                u.mem_bytes += s.rss_pages * self.page_size;
                u.processes += 1;
            }
        }
        Ok(u)
    }

    fn is_alive(&self, inst: &Instance<ProcessHandle>) -> bool {
        sys::is_same_live_process(inst.handle.pid, inst.handle.start_ticks)
    }

    async fn reclaim_orphans(&self) {
        let cgroups = self.cgroups.clone();
        let mut needle = b"--state-dir\0".to_vec();
        needle.extend_from_slice(self.cfg.state_root.as_os_str().as_bytes());
        needle.push(b'/');
        let _ = blocking(move || {
            if let Some(c) = &cgroups {
                for cg in c.children() {
                    tracing::warn!(cgroup = %cg.display(), "removing an instance cgroup left by an earlier run");
                    if let Err(e) = c.destroy(&cg) {
                        tracing::error!(cgroup = %cg.display(), error = %e, "could not remove orphaned cgroup");
                    }
                }
            }
            for pid in sys::pids_with_cmdline(&needle) {
                tracing::warn!(pid, "killing an agent left by an earlier run");
                sys::kill_group(pid, libc::SIGKILL);
                sys::kill_pid(pid, libc::SIGKILL);
                sys::kill_pid(pid, libc::SIGCONT);
            }
            Ok(())
        })
        .await;
    }
}

impl Drop for ProcessRuntime {
    fn drop(&mut self) {
        // The node's cgroup directory is empty once every instance is destroyed.
        if let Some(c) = &self.cgroups {
            let _ = std::fs::remove_dir(&c.parent);
        }
    }
}

/// What destroying needs, detached from the runtime so it can move into a blocking task.
struct KillCtx {
    cgroups: Option<Cgroups>,
}

impl KillCtx {
    fn kill(&self, h: &ProcessHandle) -> Result<()> {
        if let (Some(cgs), Some(cg)) = (&self.cgroups, &h.cgroup) {
            cgs.destroy(cg)
                .map_err(io_err(format!("destroying cgroup {}", cg.display())))?;
        }
        h.signal_group(libc::SIGKILL);
        h.signal_group(libc::SIGCONT);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while sys::is_same_live_process(h.pid, h.start_ticks) {
            if std::time::Instant::now() > deadline {
                return Err(Error::internal(format!("agent {} did not exit", h.pid)));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
}
