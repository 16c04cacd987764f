//! A sandbox's supervisor: the one process of the sandbox that keeps the host's privileges. It
//! runs single-threaded as `sandbox-gateway agent --boot DIR/boot.json`, started by the node
//! inside the sandbox's cgroups, and:
//! 1. gives itself a private mount namespace and the sandbox's network namespace (owned by the
//!    host's user namespace, so the sandbox cannot reconfigure it), with slirp4netns for egress;
//! 2. attaches the sandbox's disk image and binds the template, both visible only inside that
//!    mount namespace (nothing is ever mounted on the host);
//! 3. clones the sandbox's init into new user, mount, pid, IPC, UTS and cgroup namespaces and
//!    writes its id mapping;
//! 4. waits: when the node's lifeline closes it kills the init, which ends every process of the
//!    sandbox; when the init ends it exits. Either way the namespaces, the mounts and the loop
//!    device go with it.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::chown;
use std::path::Path;

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};

use super::spec::{BootSpec, RootKind, layout};
use super::{init, loopdev, mounts, net};

fn ctx(what: &'static str) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn nix_ctx(what: &'static str) -> impl FnOnce(nix::Error) -> io::Error {
    move |e| io::Error::other(format!("{what}: {e}"))
}

/// Runs the supervisor; returns the exit code for the process.
pub fn run(spec_path: &Path, lifeline: Option<RawFd>) -> i32 {
    match supervise(spec_path, lifeline) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sandbox supervisor: {e}");
            1
        }
    }
}

fn supervise(spec_path: &Path, lifeline: Option<RawFd>) -> io::Result<i32> {
    let spec = BootSpec::load(spec_path).map_err(|e| io::Error::other(e.to_string()))?;
    std::env::set_current_dir(&spec.dir).map_err(ctx("entering the instance directory"))?;
    let host_netns = File::open("/proc/self/ns/net").map_err(ctx("opening the host netns"))?;
    unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWNET)
        .map_err(nix_ctx("creating the mount and network namespaces"))?;
    mounts::make_private()?;

    let _slirp = net::equip(
        spec.net,
        spec.slirp4netns.as_deref(),
        &spec.blocked,
        &host_netns,
    )?;
    drop(host_netns);

    attach_disk(&spec)?;
    bind_read_only(&spec.template_root, Path::new(layout::LOWER))?;
    for (i, layer) in spec.template_layers.iter().enumerate() {
        let at = Path::new(layout::LAYERS).join(i.to_string());
        std::fs::create_dir_all(&at).map_err(ctx("preparing a layer's mount point"))?;
        bind_read_only(layer, &at)?;
    }
    if spec.root_kind == RootKind::HostUsr {
        bind_read_only(Path::new("/usr"), Path::new(layout::HOST_USR))?;
    }

    let (sync_read, sync_write) = pipe()?;
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWCGROUP;
    // SAFETY: a fork-like clone (no new stack) of this single-threaded process; the child runs
    // the init and never returns here.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return Err(io::Error::last_os_error()).map_err(ctx("cloning the sandbox init"));
    }
    if pid == 0 {
        drop(sync_write);
        init::run(&spec, sync_read);
    }
    let pid = pid as i32;
    drop(sync_read);
    if let Err(e) = map_ids(pid, &spec) {
        // SAFETY: killing our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        return Err(e);
    }
    File::from(sync_write)
        .write_all(b"m")
        .map_err(ctx("releasing the sandbox init"))?;
    Ok(wait(pid, lifeline))
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds is a valid array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Mounts the disk image (an ext4 file system) at `disk`, preparing the overlay's directories
/// on a fresh one. The loop device detaches itself once the mount is gone.
fn attach_disk(spec: &BootSpec) -> io::Result<()> {
    let dev = loopdev::attach(Path::new(layout::DISK_IMAGE)).map_err(ctx("attaching the disk"))?;
    mount(
        Some(dev.path.as_path()),
        layout::DISK_MOUNT,
        Some("ext4"),
        MsFlags::MS_NODEV | MsFlags::MS_NOATIME,
        // Without `noauto_da_alloc`, closing a file that was truncated and rewritten (every
        // upload over an existing file) starts its whole writeback in the closing call: the
        // upload then answered only after queueing its file's blocks. The disk is the
        // sandbox's scratch space, gone with the sandbox; programs that want their data on
        // the disk call fsync, as on any ext4.
        Some("noauto_da_alloc"),
    )
    .map_err(nix_ctx("mounting the disk"))?;
    drop(dev);
    let disk = Path::new(layout::DISK_MOUNT);
    for d in ["upper", "work"] {
        let p = disk.join(d);
        if !p.exists() {
            std::fs::create_dir(&p).map_err(ctx("preparing the disk"))?;
            chown(&p, Some(spec.ids.base), Some(spec.ids.base))
                .map_err(ctx("preparing the disk"))?;
        }
    }
    Ok(())
}

fn bind_read_only(src: &Path, dst: &Path) -> io::Result<()> {
    mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(nix_ctx("binding the template"))?;
    mount(
        None::<&str>,
        dst,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(nix_ctx("making the template read-only"))
}

/// Sandbox ids 0..65536 become the unprivileged host range; host root is not mapped at all.
fn map_ids(pid: i32, spec: &BootSpec) -> io::Result<()> {
    let line = spec.ids.proc_line();
    std::fs::write(format!("/proc/{pid}/uid_map"), &line).map_err(ctx("writing uid_map"))?;
    std::fs::write(format!("/proc/{pid}/gid_map"), &line).map_err(ctx("writing gid_map"))
}

/// Waits for the init to end, killing it first if the node's lifeline closes. Returns the
/// init's exit code.
fn wait(pid: i32, lifeline: Option<RawFd>) -> i32 {
    // SAFETY: pidfd_open on our own child.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as RawFd;
    let mut fds = vec![libc::pollfd {
        fd: pidfd,
        events: libc::POLLIN,
        revents: 0,
    }];
    if let Some(fd) = lifeline {
        fds.push(libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
    }
    if pidfd >= 0 {
        loop {
            // SAFETY: valid pollfd array.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            if n < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                break;
            }
            if fds[0].revents != 0 {
                break;
            }
            if fds.len() > 1 && fds[1].revents != 0 && lifeline_closed(fds[1].fd) {
                // The node is gone: end the sandbox. SIGKILL of a pid namespace's init kills
                // every process in it.
                // SAFETY: killing our own child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                fds.truncate(1);
            }
        }
    }
    let mut status = 0;
    // SAFETY: reaping our own child.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
        && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
    {}
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    }
}

fn lifeline_closed(fd: RawFd) -> bool {
    let mut buf = [0u8; 16];
    // SAFETY: reading into a valid buffer; the node never writes, so data is unexpected.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    n == 0 || (n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted)
}
