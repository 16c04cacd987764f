//! Thin, safe wrappers over the few system calls and /proc reads the process runtime needs.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Sends `sig` to a process group; a group that no longer exists is not an error.
pub fn kill_group(pgid: i32, sig: i32) {
    if pgid > 1 {
        // SAFETY: plain syscall; a negative pid addresses the group.
        unsafe { libc::kill(-pgid, sig) };
    }
}

pub fn kill_pid(pid: i32, sig: i32) {
    if pid > 1 {
        // SAFETY: plain syscall.
        unsafe { libc::kill(pid, sig) };
    }
}

/// A close-on-exec pipe: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds is a valid array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, both fds are fresh and owned by us.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Duplicates `fd` to a close-on-exec descriptor numbered 10 or above, so that a child can
/// later move it onto a low, fixed number without clobbering another descriptor it needs.
pub fn dup_high(fd: &impl AsRawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on a valid fd returns a new fd or -1.
    let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the fd was just created and is ours.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// The fields of /proc/<pid>/stat the runtime reads.
#[derive(Debug, Clone, Copy)]
pub struct ProcStat {
    pub state: u8,
    pub pgrp: i32,
    /// The kernel's per-process flags (`PF_*`).
    pub flags: u64,
    pub utime: u64,
    pub stime: u64,
    pub start_ticks: u64,
    pub rss_pages: u64,
}

pub fn proc_stat(pid: i32) -> Option<ProcStat> {
    let raw = fs::read(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses; the fields start after the last ')'.
    let close = raw.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&raw[close + 1..]).ok()?;
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    // f[0] is field 3 (state) of proc(5).
    Some(ProcStat {
        state: *f.first()?.as_bytes().first()?,
        pgrp: f.get(2)?.parse().ok()?,
        flags: f.get(6)?.parse().ok()?,
        utime: f.get(11)?.parse().ok()?,
        stime: f.get(12)?.parse().ok()?,
        start_ticks: f.get(19)?.parse().ok()?,
        rss_pages: f.get(21)?.parse().ok()?,
    })
}

/// Whether `pid` is still the process that was started at `start_ticks` and has not exited.
///
/// A process that is exiting counts as gone: a pid namespace's init that was killed stays in
/// `S` or `D` while the kernel tears its namespace down, and is no longer serving anything.
pub fn is_same_live_process(pid: i32, start_ticks: u64) -> bool {
    const PF_EXITING: u64 = 0x4;
    proc_stat(pid).is_some_and(|s| {
        s.start_ticks == start_ticks
            && s.state != b'Z'
            && s.state != b'X'
            && s.flags & PF_EXITING == 0
    })
}

pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as u64 } else { 4096 }
}

fn all_pids() -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Members of a process group.
pub fn pids_in_group(pgid: i32) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|&p| proc_stat(p).is_some_and(|s| s.pgrp == pgid && s.state != b'Z'))
        .collect()
}

/// Processes whose command line contains `needle` (arguments are NUL-separated in /proc).
pub fn pids_with_cmdline(needle: &[u8]) -> Vec<i32> {
    let me = std::process::id() as i32;
    all_pids()
        .into_iter()
        .filter(|&p| p != me)
        .filter(|&p| {
            fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle))
        })
        .collect()
}

/// Holds an exclusive advisory lock on a file for as long as the value lives.
pub struct DirLock {
    _file: fs::File,
}

pub fn lock_file(path: &std::path::Path) -> io::Result<DirLock> {
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    // SAFETY: flock on a valid fd.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(DirLock { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_stat() {
        let me = std::process::id() as i32;
        let s = proc_stat(me).expect("own stat");
        assert!(s.start_ticks > 0);
        assert!(is_same_live_process(me, s.start_ticks));
        assert!(!is_same_live_process(me, s.start_ticks + 1));
    }
}
