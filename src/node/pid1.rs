//! A node (or a gateway with its embedded node) started as PID 1, as a container's entrypoint
//! is, inherits every process orphaned beneath it: `runsc run --detach` leaves each gVisor
//! sandbox's Sentry and gofer to whoever reaps orphans, and `runsc delete` waits (up to two
//! minutes) until the Sentry it killed is reaped. The async runtime reaps only the children it
//! started, so PID 1 forks first: the child runs the daemon, and PID 1 stays as a small init
//! that reaps whatever ends, passes signals on to the daemon and ends with it.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};

/// What PID 1 passes on to the daemon.
const FORWARDED: [Signal; 6] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// How long PID 1 goes on reaping once the daemon has ended, so that what the daemon left to
/// finish (its reaper emptying the sandboxes' cgroups) is not cut short: when PID 1 ends, the
/// kernel kills everything else in its namespace.
const AFTER_THE_DAEMON: Duration = Duration::from_secs(10);

/// When this process is PID 1, forks: answers None in the child, which goes on to run the
/// daemon, and in PID 1 the daemon's exit code once it has ended. Answers None when this is not
/// PID 1. Call it before any thread starts: a fork copies only the calling thread.
pub fn stand_in() -> Option<ExitCode> {
    if std::process::id() != 1 {
        return None;
    }
    let mut mask = SigSet::empty();
    for s in FORWARDED {
        mask.add(s);
    }
    mask.add(Signal::SIGCHLD);
    // Blocked before the fork, so that none is lost before PID 1 waits for them; the child
    // puts its mask back.
    let before = mask.thread_swap_mask(SigmaskHow::SIG_BLOCK).ok()?;
    // SAFETY: called first thing in main, when no other thread exists.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let _ = before.thread_set_mask();
            None
        }
        Ok(ForkResult::Parent { child }) => Some(init(child, &mask)),
        Err(e) => {
            let _ = before.thread_set_mask();
            eprintln!(
                "running as PID 1 without a reaper (fork failed: {e}): processes orphaned beneath it are not reaped"
            );
            None
        }
    }
}

/// PID 1's loop: reaps, passes signals on, and answers the daemon's exit code once the daemon
/// has ended and nothing else is left (or `AFTER_THE_DAEMON` has passed).
fn init(daemon: Pid, mask: &SigSet) -> ExitCode {
    let mut ended: Option<(u8, Instant)> = None;
    loop {
        match reap(daemon) {
            Reaped::Daemon(code) => ended = Some((code, Instant::now())),
            Reaped::Nothing => {}
            Reaped::NoneLeft => {
                if let Some((code, _)) = ended {
                    return ExitCode::from(code);
                }
            }
        }
        if let Some((code, at)) = ended
            && at.elapsed() >= AFTER_THE_DAEMON
        {
            return ExitCode::from(code);
        }
        match wait_signal(mask, Duration::from_secs(1)) {
            Some(Signal::SIGCHLD) | None => {}
            Some(sig) if ended.is_none() => {
                let _ = kill(daemon, sig);
            }
            Some(_) => {}
        }
    }
}

enum Reaped {
    /// The daemon ended, with this exit code (128 + the signal that ended it).
    Daemon(u8),
    /// Children are left, none ended.
    Nothing,
    /// No children are left.
    NoneLeft,
}

/// Reaps every child that has ended; says whether the daemon was among them.
fn reap(daemon: Pid) -> Reaped {
    let mut daemon_code = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == daemon => {
                daemon_code = Some(u8::try_from(code).unwrap_or(1));
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == daemon => {
                daemon_code = Some(128u8.saturating_add(sig as i32 as u8));
            }
            Ok(WaitStatus::StillAlive) => break,
            Err(nix::errno::Errno::ECHILD) => {
                return match daemon_code {
                    Some(code) => Reaped::Daemon(code),
                    None => Reaped::NoneLeft,
                };
            }
            Err(_) => break,
            Ok(_) => {}
        }
    }
    match daemon_code {
        Some(code) => Reaped::Daemon(code),
        None => Reaped::Nothing,
    }
}

/// Waits up to `timeout` for one of the blocked signals in `mask`.
fn wait_signal(mask: &SigSet, timeout: Duration) -> Option<Signal> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: the set and the timespec outlive the call; no siginfo is asked for.
    let sig = unsafe { libc::sigtimedwait(mask.as_ref(), std::ptr::null_mut(), &ts) };
    Signal::try_from(sig).ok()
}
