//! A gVisor sandbox's memory guard. The host's memory limit sees one process, the Sentry, so
//! when code inside allocates past the sandbox's memory the host kernel ends the Sentry, and
//! with it every process, envd and the sandbox. The guard acts first, as the kernel's OOM
//! killer does for a built-in sandbox: when the sandbox's cgroup uses more than its
//! threshold (the limit less a margin), it asks the sandbox's init through its door to kill
//! the largest process inside (`RECLAIM`); the sandbox and its other processes go on. It is
//! woken by the memory controller (a v1 usage threshold's eventfd) or, on cgroup v2, checks
//! every few milliseconds with `memory.high` slowing the allocator down meanwhile. gVisor
//! fills memory faster than the guard can be woken and the sandbox asked, so on v1 the
//! kernel's OOM killer is held back at the limit (the allocating thread waits instead) until
//! the guard has had its go; when the sandbox cannot answer or has nothing large enough to
//! end, the kernel is let act as before.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::super::cgroup::{CgroupSet, Cgroups, Kind};

/// How often a cgroup v2 sandbox's use is looked at (its allocator is slowed past
/// `memory.high`, so this is not a race against it).
const POLL: Duration = Duration::from_millis(20);
/// How long a sandbox is given to answer (a frozen one never does).
const ANSWER: Duration = Duration::from_secs(2);
/// After a kill, the time the Sentry has to give the memory back before the guard acts again.
const SETTLE: Duration = Duration::from_millis(300);

/// The use past which the guard acts: the limit less an eighth of it (at least 48 MiB), room
/// for the allocation that goes on while the guard is woken and the victim dies (gVisor
/// fills about a gigabyte a second here).
pub fn threshold(limit: u64) -> u64 {
    limit.saturating_sub((limit / 8).max(48 << 20))
}

/// The smallest process worth killing: below it the memory is files in the sandbox's
/// in-memory overlay, or many small processes, which one kill would not free.
fn victim_floor(limit: u64) -> u64 {
    limit / 16
}

/// A running guard; dropping it stops it.
#[derive(Debug)]
pub struct Guard {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How the guard learns of the use.
enum Wake {
    /// A v1 memory controller's threshold notification.
    Event(AsyncFd<OwnedFd>),
    /// cgroup v2: `memory.high` is the threshold; the use is looked at every `POLL`.
    Poll,
}

/// Starts guarding the sandbox in `cg` (limit `limit`, door `door`); counts kills in `kills`.
/// None when its cgroups have no memory controller to watch.
pub fn start(
    id: &str,
    cg: &CgroupSet,
    limit: u64,
    door: PathBuf,
    kills: Arc<AtomicU64>,
) -> Option<Guard> {
    let at = threshold(limit);
    let wake = match arm(cg, at) {
        Ok(w) => w?,
        Err(e) => {
            tracing::warn!(instance = id, error = %e, "the sandbox's memory guard could not be armed; past its memory the sandbox ends as a whole");
            return None;
        }
    };
    let (id, cg) = (id.to_string(), cg.clone());
    let task = tokio::spawn(async move {
        let mut wake = wake;
        loop {
            match &mut wake {
                Wake::Event(fd) => {
                    let Ok(mut ready) = fd.readable().await else {
                        return;
                    };
                    let mut count = [0u8; 8];
                    // SAFETY: reads 8 bytes into a buffer of 8 from the eventfd we own.
                    let n = unsafe {
                        libc::read(fd.get_ref().as_raw_fd(), count.as_mut_ptr().cast(), 8)
                    };
                    if n < 0 {
                        ready.clear_ready();
                        continue;
                    }
                }
                Wake::Poll => tokio::time::sleep(POLL).await,
            }
            let used = Cgroups::measure(&cg).memory_bytes.unwrap_or(0);
            if used <= at {
                continue;
            }
            match reclaim(&door, victim_floor(limit)).await {
                Ok(Some(what)) => {
                    kills.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(instance = %id, used, threshold = at, killed = %what, "a sandbox ran out of memory; its largest process was killed");
                    tokio::time::sleep(SETTLE).await;
                }
                Ok(None) => {
                    tracing::warn!(instance = %id, used, threshold = at, "a sandbox is near its memory limit with no process large enough to end");
                    let_the_kernel_act(&cg).await;
                    tokio::time::sleep(SETTLE).await;
                }
                Err(e) => {
                    tracing::warn!(instance = %id, error = %e, "the memory guard could not reach the sandbox");
                    let_the_kernel_act(&cg).await;
                }
            }
        }
    });
    Some(Guard { task })
}

/// Arms the controller of `cg` to wake the guard past `at`.
fn arm(cg: &CgroupSet, at: u64) -> std::io::Result<Option<Wake>> {
    if let Some((_, dir)) = cg.dirs.iter().find(|(k, _)| *k == Kind::V1Memory) {
        return event(dir, at).map(|fd| Some(Wake::Event(fd)));
    }
    match cg.dirs.iter().find(|(k, _)| *k == Kind::V2) {
        Some((_, dir)) if dir.join("memory.high").exists() => {
            std::fs::write(dir.join("memory.high"), at.to_string())?;
            Ok(Some(Wake::Poll))
        }
        _ => Ok(None),
    }
}

/// When a v1 sandbox waits at its limit and the guard could not free anything, the kernel's
/// OOM killer is let end it (as it would have without the guard), rather than leave it
/// hanging; the guard holds it back again for the next time.
async fn let_the_kernel_act(cg: &CgroupSet) {
    let Some((_, dir)) = cg.dirs.iter().find(|(k, _)| *k == Kind::V1Memory) else {
        return;
    };
    let control = dir.join("memory.oom_control");
    let waiting = std::fs::read_to_string(&control)
        .is_ok_and(|t| t.lines().any(|l| l.trim() == "under_oom 1"));
    if waiting {
        let _ = std::fs::write(&control, "0");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = std::fs::write(&control, "1");
    }
}

/// A v1 usage threshold at `at` on the memory cgroup `dir`, as an eventfd; the kernel's OOM
/// killer waits at the limit.
fn event(dir: &Path, at: u64) -> std::io::Result<AsyncFd<OwnedFd>> {
    let usage = std::fs::File::open(dir.join("memory.usage_in_bytes"))?;
    // SAFETY: eventfd makes a new descriptor or answers -1.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just made and is ours.
    let efd = unsafe { OwnedFd::from_raw_fd(raw) };
    std::fs::write(
        dir.join("cgroup.event_control"),
        format!("{} {} {at}", efd.as_raw_fd(), usage.as_raw_fd()),
    )?;
    // The registration holds the usage file; it ends when the eventfd is closed.
    drop(usage);
    std::fs::write(dir.join("memory.oom_control"), "1")?;
    // SAFETY: the AsyncFd owns the eventfd until it is dropped, and its raw descriptor is
    // the same throughout.
    unsafe { AsyncFd::register_with_interest(efd, tokio::io::Interest::READABLE) }
        .map_err(|e| std::io::Error::other(format!("watching the memory threshold: {e}")))
}

/// Asks the sandbox behind `door` to kill its largest process if it holds at least `floor`
/// bytes; answers what was killed.
async fn reclaim(door: &Path, floor: u64) -> std::io::Result<Option<String>> {
    let ask = async {
        let mut s = tokio::net::UnixStream::connect(door).await?;
        s.write_all(format!("RECLAIM {floor}\n").as_bytes()).await?;
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).await?;
        Ok::<_, std::io::Error>(line)
    };
    let line = tokio::time::timeout(ANSWER, ask)
        .await
        .map_err(|_| std::io::Error::other("no answer"))??;
    Ok(line.trim().strip_prefix("KILLED ").map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_margin_is_an_eighth_of_the_limit_and_at_least_48_mib() {
        assert_eq!(threshold(512 << 20), 448 << 20);
        assert_eq!(threshold(2 << 30), (2 << 30) - (256 << 20));
        assert_eq!(threshold(256 << 20), 208 << 20);
        assert_eq!(threshold(16 << 20), 0);
        assert_eq!(victim_floor(512 << 20), 32 << 20);
    }
}
