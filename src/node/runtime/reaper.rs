//! The reaper ends a dead node's sandboxes. It is a small process of its own, outside every
//! sandbox cgroup and in a session of its own, that holds the read end of the node's lifeline.
//! When the node exits for any reason (SIGKILL included) the write end closes, and the reaper
//! kills everything left in the node's cgroups and removes them. Per-sandbox supervisors watch
//! the same lifeline, but a paused (frozen) supervisor cannot act, and gVisor's processes have
//! no supervisor of ours at all: the reaper covers both.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::{Deserialize, Serialize};

use super::builtin::AgentCommand;
use super::cgroup::{Cgroups, Hierarchy};
use super::sys;
use crate::model::{Error, Result};

/// The descriptor number the lifeline has in a reaper or a supervisor.
pub const LIFELINE_FD: RawFd = 4;

const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// What the reaper is told, as one command-line argument.
#[derive(Serialize, Deserialize)]
struct ReapSpec {
    /// The node's data-directory lock: the reaper takes it while it works, so a node
    /// restarting on the same directory waits instead of racing it.
    lock: PathBuf,
    hierarchies: Vec<Hierarchy>,
}

/// The node's end of the lifeline; dropping it (or the node's death) wakes the reaper.
pub struct Reaper {
    read: OwnedFd,
    _write: OwnedFd,
}

impl Reaper {
    /// Starts the reaper for `cgroups`.
    pub fn spawn(agent: &AgentCommand, cgroups: &Cgroups, lock: &Path) -> Result<Reaper> {
        let (r, w) = sys::pipe().map_err(|e| Error::io("creating the node lifeline", e))?;
        let read = sys::dup_high(&r).map_err(|e| Error::io("creating the node lifeline", e))?;
        drop(r);
        let spec = serde_json::to_string(&ReapSpec {
            lock: lock.to_path_buf(),
            hierarchies: cgroups.hierarchies.clone(),
        })
        .map_err(|e| Error::internal(format!("describing the node cgroups: {e}")))?;
        let mut cmd = std::process::Command::new(&agent.program);
        cmd.args(&agent.leading_args)
            .arg("agent")
            .arg("--reap")
            .arg(spec)
            .arg("--lifeline-fd")
            .arg(LIFELINE_FD.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let from = read.as_raw_fd();
        // SAFETY: runs in the forked child before exec; setsid and dup2 are async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                // Its own session: a ^C meant for the node must not end the reaper first.
                if libc::setsid() < 0 || libc::dup2(from, LIFELINE_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.spawn().map_err(|e| {
            Error::io(
                format!("starting the reaper {}", agent.program.display()),
                e,
            )
        })?;
        Ok(Reaper { read, _write: w })
    }

    /// The lifeline's read end, for supervisors to inherit too.
    pub fn lifeline(&self) -> RawFd {
        self.read.as_raw_fd()
    }
}

/// The reaper process: waits for the lifeline to close, then empties and removes the node's
/// cgroups. Returns the exit code.
pub fn run(spec: &str, lifeline: RawFd) -> i32 {
    let spec: ReapSpec = match serde_json::from_str(spec) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("reaper: bad cgroup description: {e}");
            return 2;
        }
    };
    let mut buf = [0u8; 16];
    loop {
        // SAFETY: reading into a valid buffer; the node never writes.
        let n = unsafe { libc::read(lifeline, buf.as_mut_ptr().cast(), buf.len()) };
        if n == 0 {
            break;
        }
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break;
        }
    }
    // Hold the node's lock while cleaning up. A node that is shutting down lets go of it
    // soon; one that still holds it after LOCK_PATIENCE is a new node on the same directory,
    // which cleans up after its predecessor itself.
    let started = std::time::Instant::now();
    let _lock = loop {
        match sys::lock_file(&spec.lock) {
            Ok(l) => break Some(l),
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                if started.elapsed() > LOCK_PATIENCE {
                    return 0;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(_) => break None,
        }
    };
    let cgroups = Cgroups {
        hierarchies: spec.hierarchies,
    };
    let mut code = 0;
    for set in cgroups.leftovers() {
        if let Err(e) = cgroups.destroy(&set) {
            eprintln!("reaper: ending a sandbox of the dead node: {e}");
            code = 1;
        }
    }
    cgroups.remove_parents();
    code
}
