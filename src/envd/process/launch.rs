//! Starting a command without copying envd. A `fork` (what the standard library does once a
//! command needs work between fork and exec: a session, another user, a working directory
//! checked as that user) copies envd's page tables, and every page envd writes afterwards
//! faults once: a millisecond or two per command in a busy multi-threaded agent. So the child
//! is cloned sharing envd's memory (`CLONE_VM | CLONE_VFORK`, as `posix_spawn` does), on a
//! stack of its own, while the calling thread waits; it only makes system calls on what was
//! prepared before, then execs. Its exit is watched through a pidfd.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};

use tokio::io::unix::AsyncFd;

/// The child's stack: what its system calls need, and no more.
const STACK: usize = 64 * 1024;
/// The `oom_score_adj` of commands: well above envd's, so the OOM killer picks them first.
const OOM_SCORE_ADJ: &[u8] = b"500";

/// Who a command runs as.
#[derive(Debug, Clone)]
pub struct Identity {
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    pub groups: Vec<libc::gid_t>,
}

/// Everything the child needs, made before it exists (it may not allocate).
pub struct Plan {
    path: CString,
    _argv: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    _envp: Vec<CString>,
    envp: Vec<*const libc::c_char>,
    cwd: CString,
    /// What becomes the child's standard input, output and error.
    stdio: [RawFd; 3],
    /// Whether standard input is a terminal that becomes the session's controlling one.
    terminal: bool,
    identity: Option<Identity>,
    parent: libc::pid_t,
    /// The child's errno when it could not exec (0 while it could).
    failed: AtomicI32,
}

// SAFETY: the raw pointers point into the CStrings the plan owns.
unsafe impl Send for Plan {}

fn cstr(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))
}

/// `program` as `execvp` finds it with `path` (the command's own PATH): names with a slash
/// are taken as they are.
fn resolve(program: &str, path: &str) -> Option<std::path::PathBuf> {
    if program.contains('/') {
        return Some(program.into());
    }
    std::env::split_paths(path)
        .map(|d| d.join(program))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| {
                use std::os::unix::fs::PermissionsExt;
                m.is_file() && m.permissions().mode() & 0o111 != 0
            })
        })
}

impl Plan {
    pub fn new(
        program: &str,
        args: &[String],
        env: &[(String, String)],
        cwd: &std::path::Path,
        stdio: [RawFd; 3],
        terminal: bool,
        identity: Option<Identity>,
    ) -> io::Result<Plan> {
        let path_var = env
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map_or("", |(_, v)| v.as_str());
        let path =
            resolve(program, path_var).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let argv_c: Vec<CString> = std::iter::once(program)
            .chain(args.iter().map(String::as_str))
            .map(|a| cstr(a.as_bytes()))
            .collect::<io::Result<_>>()?;
        let envp_c: Vec<CString> = env
            .iter()
            .map(|(k, v)| cstr(format!("{k}={v}").as_bytes()))
            .collect::<io::Result<_>>()?;
        let ptrs = |v: &[CString]| {
            v.iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect::<Vec<_>>()
        };
        Ok(Plan {
            path: cstr(path.as_os_str().as_bytes())?,
            argv: ptrs(&argv_c),
            _argv: argv_c,
            envp: ptrs(&envp_c),
            _envp: envp_c,
            cwd: cstr(cwd.as_os_str().as_bytes())?,
            stdio,
            terminal,
            identity,
            // SAFETY: getpid has no preconditions.
            parent: unsafe { libc::getpid() },
            failed: AtomicI32::new(0),
        })
    }
}

/// A started command.
pub struct Child {
    pub pid: libc::pid_t,
    /// None where the kernel has no pidfds (older gVisor): a blocking thread waits then.
    pidfd: Option<AsyncFd<OwnedFd>>,
}

/// Starts the plan's command; answers once it has exec'd (or why it could not).
pub fn launch(plan: &Plan) -> io::Result<Child> {
    let mut stack = vec![0u8; STACK];
    // SAFETY: the stack grows down from its end, 16-byte aligned as the ABI wants.
    let top = unsafe { stack.as_mut_ptr().add(STACK) } as usize & !15;
    // No signal handler of envd may run in the child (it shares envd's memory): all are
    // blocked across the clone, and the child sets them to their defaults before unblocking.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: sigfillset and pthread_sigmask on sets we own.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    // SAFETY: the child runs `child` on its own stack with the plan, and this thread waits
    // (CLONE_VFORK) until it has exec'd or exited, so both outlive it.
    let pid = unsafe {
        libc::clone(
            child,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            plan as *const Plan as *mut libc::c_void,
        )
    };
    let cloned = io::Error::last_os_error();
    // SAFETY: restoring this thread's own mask.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    drop(stack);
    if pid < 0 {
        return Err(cloned);
    }
    let errno = plan.failed.load(Ordering::SeqCst);
    if errno != 0 {
        let mut status = 0;
        // SAFETY: reaping the child that could not exec.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        return Err(io::Error::from_raw_os_error(errno));
    }
    // SAFETY: pidfd_open of our own unreaped child.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
        return Ok(Child { pid, pidfd: None });
    }
    if fd < 0 {
        let e = io::Error::last_os_error();
        // SAFETY: the command runs, but could not be watched: end it.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        return Err(e);
    }
    // SAFETY: the descriptor was just made and is ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    // SAFETY: the AsyncFd owns the pidfd until dropped; its number does not change.
    let pidfd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| io::Error::other(format!("watching the command: {e}")))?;
    Ok(Child {
        pid,
        pidfd: Some(pidfd),
    })
}

impl Child {
    /// Waits for the command to end and reaps it.
    pub async fn wait(self) -> io::Result<ExitStatus> {
        let Some(pidfd) = self.pidfd else {
            let pid = self.pid;
            return tokio::task::spawn_blocking(move || {
                let mut status = 0;
                // SAFETY: reaping our own child.
                match unsafe { libc::waitpid(pid, &mut status, 0) } {
                    rc if rc == pid => Ok(ExitStatus::from_raw(status)),
                    _ => Err(io::Error::last_os_error()),
                }
            })
            .await
            .map_err(io::Error::other)?;
        };
        loop {
            let mut status = 0;
            // SAFETY: reaping our own child, without blocking.
            let rc = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            if rc == self.pid {
                return Ok(ExitStatus::from_raw(status));
            }
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut ready = pidfd.readable().await?;
            ready.clear_ready();
        }
    }
}

/// Records the child's errno (it shares envd's memory) and ends it.
///
/// # Safety
/// Only in the child.
unsafe fn fail(plan: &Plan) -> ! {
    // SAFETY: errno is this thread's; _exit ends the child without running anything of envd.
    unsafe {
        let e = *libc::__errno_location();
        plan.failed
            .store(if e == 0 { libc::EINVAL } else { e }, Ordering::SeqCst);
        libc::_exit(127)
    }
}

/// The child: only system calls on the plan, then exec. Its errno goes to `failed`.
extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `launch` passes a live plan and waits for this child.
    let plan = unsafe { &*(arg as *const Plan) };
    // SAFETY: system calls on values prepared before the clone.
    unsafe {
        // Default dispositions for every signal (envd's handlers must not run here or be
        // inherited), then envd's mask as it was.
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for sig in 1..=libc::SIGRTMAX() {
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
        // An empty mask, as the standard library gives its children.
        let empty: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        for (target, &src) in plan.stdio.iter().enumerate() {
            let target = target as RawFd;
            let rc = if src == target {
                libc::fcntl(src, libc::F_SETFD, 0)
            } else {
                libc::dup2(src, target)
            };
            if rc < 0 {
                fail(plan);
            }
        }
        if libc::setsid() < 0 {
            fail(plan);
        }
        if plan.terminal && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
            fail(plan);
        }
        // Best effort: raising one's own score needs no privilege, but /proc may be absent.
        let fd = libc::open(
            c"/proc/self/oom_score_adj".as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        );
        if fd >= 0 {
            libc::write(fd, OOM_SCORE_ADJ.as_ptr().cast(), OOM_SCORE_ADJ.len());
            libc::close(fd);
        }
        if let Some(id) = &plan.identity
            && (libc::syscall(libc::SYS_setgroups, id.groups.len(), id.groups.as_ptr()) < 0
                || libc::syscall(libc::SYS_setresgid, id.gid, id.gid, id.gid) < 0
                || libc::syscall(libc::SYS_setresuid, id.uid, id.uid, id.uid) < 0)
        {
            fail(plan);
        }
        // After the switch (which clears it): the command dies with envd, even when envd is
        // killed outright. A parent already gone by now is one we will never serve.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) < 0
            || libc::getppid() != plan.parent
        {
            fail(plan);
        }
        // After the switch, so the user needs the right to enter it.
        if libc::chdir(plan.cwd.as_ptr()) < 0 {
            fail(plan);
        }
        libc::execve(plan.path.as_ptr(), plan.argv.as_ptr(), plan.envp.as_ptr());
        fail(plan)
    }
}

/// A pipe whose both ends close on exec (the child's end is duplicated onto 0, 1 or 2).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills two descriptors on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both were just made and are ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// /dev/null, for a command without input.
pub fn null() -> io::Result<OwnedFd> {
    let f = std::fs::OpenOptions::new().read(true).open("/dev/null")?;
    Ok(f.into())
}

/// The raw number of a descriptor.
pub fn raw(fd: &OwnedFd) -> RawFd {
    fd.as_raw_fd()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_on_the_commands_own_path() {
        assert_eq!(
            resolve("sh", "/nonexistent:/bin:/usr/bin").map(|p| p.is_absolute()),
            Some(true)
        );
        assert_eq!(
            resolve("./x", "/bin"),
            Some(std::path::PathBuf::from("./x"))
        );
        assert!(resolve("no-such-program-here", "/bin:/usr/bin").is_none());
    }

    #[tokio::test]
    async fn a_command_runs_with_its_stdio_env_and_directory_and_is_reaped() {
        let (r, w) = pipe().unwrap();
        let null = null().unwrap();
        let plan = Plan::new(
            "sh",
            &["-c".into(), "echo \"$GREETING $(pwd)\"; exit 3".into()],
            &[
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("GREETING".into(), "hello".into()),
            ],
            std::path::Path::new("/tmp"),
            [raw(&null), raw(&w), raw(&w)],
            false,
            None,
        )
        .unwrap();
        let child = launch(&plan).unwrap();
        drop(w);
        let status = child.wait().await.unwrap();
        assert_eq!(status.code(), Some(3));
        let mut out = String::new();
        use std::io::Read;
        std::fs::File::from(r).read_to_string(&mut out).unwrap();
        assert_eq!(out, "hello /tmp\n");
    }

    #[test]
    fn a_missing_directory_is_the_childs_error_and_nothing_is_left() {
        let null = null().unwrap();
        let plan = Plan::new(
            "true",
            &[],
            &[("PATH".into(), "/usr/bin:/bin".into())],
            std::path::Path::new("/no/such/dir"),
            [raw(&null), raw(&null), raw(&null)],
            false,
            None,
        )
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let e = rt.block_on(async { launch(&plan).err() }).unwrap();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    }
}
