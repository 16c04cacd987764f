//! The sandbox's init: pid 1 of the sandbox's pid namespace, root of its user namespace (an
//! unprivileged id range on the host). It assembles the root file system, enters it, locks the
//! sandbox down (no new privileges, a bounded capability set, the seccomp filter), starts the
//! agent (envd) as pid 2 and then only reaps: orphans of the sandbox end up here, and when the
//! agent ends, so does the sandbox.

use std::io::{self, Read};
use std::os::fd::OwnedFd;

use nix::unistd::{Gid, Uid, setgroups, setresgid, setresuid};

use super::spec::{BootSpec, Net};
use super::{mounts, net, seccomp};

/// Never returns: the process exits with the agent's status.
pub fn run(spec: &BootSpec, sync: OwnedFd) -> ! {
    let code = match setup(spec, sync) {
        Ok(agent) => reap(agent),
        Err(e) => {
            eprintln!("sandbox init: {e}");
            1
        }
    };
    // SAFETY: leaving the process without unwinding into the supervisor's stack frames.
    unsafe { libc::_exit(code) }
}

fn ctx(what: &'static str) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn setup(spec: &BootSpec, sync: OwnedFd) -> io::Result<i32> {
    // Whatever ends the supervisor ends the sandbox: it is the only host-side process that
    // knows about it. (It is single-threaded, so "the parent thread" is the process.)
    // SAFETY: plain prctl.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    // The supervisor writes our id mapping, then one byte; end of file means it died.
    let mut byte = [0u8; 1];
    std::fs::File::from(sync)
        .read_exact(&mut byte)
        .map_err(ctx("waiting for the id mapping"))?;
    let root_gid = Gid::from_raw(0);
    setresgid(root_gid, root_gid, root_gid)
        .and_then(|_| setgroups(&[root_gid]))
        .and_then(|_| {
            let root = Uid::from_raw(0);
            setresuid(root, root, root)
        })
        .map_err(|e| io::Error::other(format!("becoming the sandbox's root: {e}")))?;

    mounts::assemble_root(
        spec.root_kind,
        spec.template_layers.len(),
        spec.memory_bytes,
    )
    .map_err(ctx("assembling the root"))?;
    let pivoted = mounts::enter_root().map_err(ctx("entering the root"))?;
    nix::unistd::sethostname(&spec.hostname)
        .map_err(|e| io::Error::other(format!("setting the hostname: {e}")))?;
    let resolver = (spec.net == Net::Egress).then_some(net::SLIRP_DNS);
    mounts::write_identity(&spec.hostname, resolver).map_err(ctx("writing /etc identity"))?;

    close_inherited_fds();
    let filters = seccomp::filters()?;
    // No NO_NEW_PRIVS: `sudo` and other setuid programs work inside, as on e2b. They reach
    // only the sandbox's root, which any caller of the API has anyway (`user="root"`), and
    // the filter and the capability bound below hold for them too (the init is root in its
    // user namespace, which lets it install the filter without the flag).
    let withheld: &[u32] = if pivoted {
        &[]
    } else {
        // Without pivot_root the host's mounts are still below this root; a second chroot is
        // the classic way out, so nobody here may chroot.
        &[seccomp::CAP_SYS_CHROOT]
    };
    seccomp::bound_capabilities(withheld)?;
    seccomp::install(&filters)?;

    // SAFETY: this process is single-threaded; the child becomes the agent.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error()).map_err(ctx("starting the agent"));
    }
    if pid == 0 {
        let code = crate::agent::serve_in_sandbox(spec);
        // SAFETY: the agent's process ends here.
        unsafe { libc::_exit(code) };
    }
    super::services::start(
        &spec.services,
        super::services::Exposure::Port,
        spec.memory_bytes,
    );
    Ok(pid)
}

/// Closes every descriptor but stdin, stdout and stderr: nothing of the host (the lifeline,
/// the loop device, directories) may stay reachable from inside.
fn close_inherited_fds() {
    // SAFETY: close_range over descriptors this process owns.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if rc != 0 {
        for fd in 3..1024 {
            // SAFETY: closing a descriptor that may or may not be open.
            unsafe { libc::close(fd) };
        }
    }
}

/// Reaps every child; returns when the agent has ended.
fn reap(agent: i32) -> i32 {
    loop {
        let mut status = 0;
        // SAFETY: waiting for any child of pid 1.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return 1;
        }
        if pid == agent {
            return if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            };
        }
    }
}
