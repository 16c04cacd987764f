//! A gVisor sandbox's memory guard. The host's memory limit sees one process, the Sentry, so
//! when code inside allocates past the sandbox's memory the host kernel would end the Sentry,
//! and with it every process, envd and the sandbox. The guard acts first, as the kernel's OOM
//! killer does for a built-in sandbox: when the sandbox's cgroup uses more than the sandbox's
//! memory, it asks the sandbox's init through its door to kill the largest process inside
//! (`RECLAIM`); the sandbox and its other processes go on.
//!
//! gVisor fills memory faster than the guard is woken and the victim dies, so on cgroup v1 the
//! host's limit sits above the sandbox's memory (`host_limit`), and the kernel's OOM killer is
//! held back there. Held back is not safe: at the limit gVisor's own allocations fail (the
//! allocating process dies inside) or, from a page fault, the kernel may still end the Sentry
//! (seen on 6.18 with the guard stopped on purpose), so the margin is what lets the guard act
//! first. Waiting at the limit must never become a hang: the guard is woken by a usage
//! threshold's eventfd and also looks every `LOOK`, and whenever the sandbox waits at its
//! limit and the guard cannot free memory (no process large enough, no answer, or a kill that
//! frees nothing within `ANSWER` because gVisor's own threads wait), it lets the kernel's OOM
//! killer act, which ends the sandbox as a whole, as without the guard. On cgroup v2
//! `memory.high` slows the allocator instead and the guard looks every `POLL`.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::unix::AsyncFd;

use super::super::cgroup::{CgroupSet, Cgroups, Kind};

/// How often a cgroup v2 sandbox's use is looked at (its allocator is slowed past
/// `memory.high`, so this is not a race against it).
const POLL: Duration = Duration::from_millis(20);
/// How often a v1 sandbox's use is looked at besides its threshold's notifications (one can
/// be missed while the guard is busy, and a sandbox must not wait at its limit for long).
const LOOK: Duration = Duration::from_millis(100);
/// How long a sandbox is given to answer (a frozen one never does), and a kill to free memory.
const ANSWER: Duration = Duration::from_secs(2);
/// After a kill, the time the Sentry has to give the memory back before the guard acts again.
const SETTLE: Duration = Duration::from_millis(300);
/// After finding nothing large enough to end, how long the guard watches for the sandbox
/// reaching its limit before it looks again.
const QUIET: Duration = Duration::from_secs(2);

/// The host's memory limit for a sandbox of `memory` bytes: a quarter more, at least 128 MiB,
/// for gVisor's own use and for what is allocated while the guard is woken and asks. The
/// guard acts at `memory`. An eighth was too little: code inside gVisor touches new memory at
/// about 350 MiB/s here, and a 1 GiB sandbox reached 1,063 of its 1,152 MiB before the
/// guard's kill on a quiet machine, 1,103 on a loaded one (`memory.max_usage_in_bytes`),
/// where the guard's ask took up to 450 ms.
pub fn host_limit(memory: u64) -> u64 {
    memory.saturating_add((memory / 4).max(128 << 20))
}

/// Whether the guard must act: the sandbox uses more than its memory, or it waits at the
/// host's limit whatever it uses (page cache the kernel cannot drop counts there, not in
/// `used`, and a sandbox left waiting would hang).
fn must_act(used: u64, at: u64, waiting: bool) -> bool {
    used > at || waiting
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

/// Starts guarding the sandbox in `cg` (memory `limit`, its host limit `host_limit(limit)`,
/// door `door`); counts kills in `kills`. None when its cgroups have no memory controller to
/// watch.
pub fn start(
    id: &str,
    cg: &CgroupSet,
    limit: u64,
    door: PathBuf,
    kills: Arc<AtomicU64>,
) -> Option<Guard> {
    let at = limit;
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
                    tokio::select! {
                        ready = fd.readable() => {
                            let Ok(mut ready) = ready else {
                                return;
                            };
                            let mut count = [0u8; 8];
                            // SAFETY: reads 8 bytes into a buffer of 8 from the eventfd we own.
                            let n = unsafe {
                                libc::read(fd.get_ref().as_raw_fd(), count.as_mut_ptr().cast(), 8)
                            };
                            if n < 0 {
                                ready.clear_ready();
                            }
                        }
                        () = tokio::time::sleep(LOOK) => {}
                    }
                }
                Wake::Poll => tokio::time::sleep(POLL).await,
            }
            // Page cache (the template's files the gofer reads, a checkpoint image being
            // written or read back) is dropped by the kernel before it would act: not counted.
            let used = Cgroups::unreclaimable(&cg).unwrap_or(0);
            if !must_act(used, at, v1_memory(&cg).is_some_and(waiting)) {
                continue;
            }
            let asked = std::time::Instant::now();
            let answer = reclaim(&door, victim_floor(limit)).await;
            tracing::debug!(instance = %id, used, ms = asked.elapsed().as_secs_f64() * 1e3, ?answer, "the memory guard asked the sandbox to end its largest process");
            match answer {
                Ok(Some(what)) => {
                    kills.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(instance = %id, used, threshold = at, killed = %what, "a sandbox ran out of memory; its largest process was killed");
                    if !freed(&cg).await {
                        tracing::warn!(instance = %id, "the kill freed no memory; the sandbox is ended as a whole");
                        let_the_kernel_act(&cg).await;
                    }
                    tokio::time::sleep(SETTLE).await;
                }
                Ok(None) => {
                    // Its memory is files in its in-memory overlay, or many small processes:
                    // the host's limit decides.
                    tracing::debug!(instance = %id, used, threshold = at, "a sandbox is past its memory with no process large enough to end");
                    if reaches_its_limit(&cg, QUIET).await {
                        let_the_kernel_act(&cg).await;
                    }
                }
                Err(e) => {
                    // Paused in place (not allocating either), or its Sentry is stuck.
                    tracing::debug!(instance = %id, error = %e, "the memory guard could not reach the sandbox");
                    let_the_kernel_act(&cg).await;
                    tokio::time::sleep(SETTLE).await;
                }
            }
        }
    });
    Some(Guard { task })
}

/// Arms the controller of `cg` to wake the guard past `at`.
fn arm(cg: &CgroupSet, at: u64) -> std::io::Result<Option<Wake>> {
    if let Some(dir) = v1_memory(cg) {
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

/// The v1 memory cgroup of `cg`, if any.
fn v1_memory(cg: &CgroupSet) -> Option<&Path> {
    cg.dirs
        .iter()
        .find(|(k, _)| *k == Kind::V1Memory)
        .map(|(_, d)| d.as_path())
}

/// Whether the v1 sandbox in `dir` waits at its limit (its OOM killer held back).
fn waiting(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("memory.oom_control"))
        .is_ok_and(|t| t.lines().any(|l| l.trim() == "under_oom 1"))
}

/// After a kill: whether the sandbox stopped waiting at its limit within `ANSWER`.
async fn freed(cg: &CgroupSet) -> bool {
    let Some(dir) = v1_memory(cg) else {
        return true;
    };
    let deadline = tokio::time::Instant::now() + ANSWER;
    while waiting(dir) {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// Whether the v1 sandbox of `cg` comes to wait at its limit within `within`.
async fn reaches_its_limit(cg: &CgroupSet, within: Duration) -> bool {
    let Some(dir) = v1_memory(cg) else {
        tokio::time::sleep(within).await;
        return false;
    };
    let deadline = tokio::time::Instant::now() + within;
    while !waiting(dir) {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// When a v1 sandbox waits at its limit and the guard could not free anything, the kernel's
/// OOM killer is let end it (as it would have without the guard), rather than leave it
/// hanging; it is held back again once the sandbox no longer waits.
async fn let_the_kernel_act(cg: &CgroupSet) {
    let Some(dir) = v1_memory(cg) else {
        return;
    };
    if !waiting(dir) {
        return;
    }
    let control = dir.join("memory.oom_control");
    let _ = std::fs::write(&control, "0");
    let deadline = tokio::time::Instant::now() + ANSWER;
    while waiting(dir) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = std::fs::write(&control, "1");
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
    let line = tokio::time::timeout(
        ANSWER,
        super::door::ask_at(door, &format!("RECLAIM {floor}")),
    )
    .await
    .map_err(|_| std::io::Error::other("no answer"))??;
    Ok(line.trim().strip_prefix("KILLED ").map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_limit_is_a_quarter_more_and_at_least_128_mib_more() {
        assert_eq!(host_limit(256 << 20), 384 << 20);
        assert_eq!(host_limit(512 << 20), 640 << 20);
        assert_eq!(host_limit(1 << 30), (1 << 30) + (256 << 20));
        assert_eq!(host_limit(u64::MAX), u64::MAX);
        assert_eq!(victim_floor(512 << 20), 32 << 20);
    }

    #[test]
    fn the_guard_acts_past_the_memory_or_when_the_sandbox_waits_at_its_limit() {
        let at = 1 << 30;
        assert!(!must_act(at, at, false));
        assert!(must_act(at + 1, at, false));
        // At the host's limit with much of it page cache the kernel cannot drop.
        assert!(must_act(at - (200 << 20), at, true));
    }
}
