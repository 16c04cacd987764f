//! Mounting a host directory (a volume's data) into a running built-in sandbox: a clone of the
//! directory's mount is taken in the host's mount namespace, then a thread of the node that
//! owns its file-system attributes makes the mount point as the sandbox's root (resolved with
//! `openat2` inside the sandbox's root, so no link there leads out), enters the sandbox's mount
//! namespace and attaches the clone there. The sandbox sees it read-write, without devices or set-id
//! programs; its files keep their owners (the sandbox's user namespace maps them).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use crate::sandbox::detached;

/// The mount point's components: an absolute, clean path (no `.` or `..`), not `/` itself.
pub fn mount_point(target: &str) -> Option<Vec<String>> {
    let path = Path::new(target);
    let unclean = target.contains("//")
        || (target.len() > 1 && target.ends_with('/'))
        || target.split('/').any(|p| p == "." || p == "..");
    if !path.is_absolute() || unclean {
        return None;
    }
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(p) => parts.push(p.to_str()?.to_string()),
            _ => return None,
        }
    }
    (!parts.is_empty()).then_some(parts)
}

/// Mounts `source` at `target` inside the mount namespace of the process `pid` (the sandbox's
/// init); directories it makes belong to host id `owner` (the sandbox's root).
pub fn mount_into(pid: i32, source: &Path, target: &str, owner: u32) -> io::Result<()> {
    let parts = mount_point(target).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{target:?} is not an absolute, clean path"),
        )
    })?;
    let source = CString::new(source.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let ns = File::open(format!("/proc/{pid}/ns/mnt"))?;
    if std::fs::read_link(format!("/proc/{pid}/ns/mnt"))?
        == std::fs::read_link("/proc/self/ns/mnt")?
    {
        // Never the node's own mounts, whatever process was named.
        return Err(io::Error::other(
            "that process shares the node's mount namespace",
        ));
    }
    // The sandbox's root, where the mount point is found (resolved inside it only).
    let root: OwnedFd = File::open(format!("/proc/{pid}/root"))?.into();
    std::thread::spawn(move || -> io::Result<()> {
        let step = |what: &'static str| {
            move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"))
        };
        // SAFETY: unshare, setfsuid, setfsgid and setns act on this thread only (it no longer
        // shares its root and directory with the node's other threads), which ends right after.
        if unsafe { libc::unshare(libc::CLONE_FS) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let tree = detached::clone_tree(&source).map_err(step("cloning the volume's mount"))?;
        detached::set_attrs(
            &tree,
            detached::MOUNT_ATTR_NOSUID | detached::MOUNT_ATTR_NODEV,
            None,
        )
        .map_err(step("setting the volume's mount flags"))?;
        make_mount_point(&root, &parts, owner).map_err(step("making the mount point"))?;
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let at = openat2(root.as_fd(), parts.join("/").as_str(), how)
            .map_err(|e| step("opening the mount point")(e.into()))?;
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNS) } != 0 {
            return Err(step("entering the sandbox's mounts")(
                io::Error::last_os_error(),
            ));
        }
        detached::attach_to(&tree, &at).map_err(step("attaching the volume"))
    })
    .join()
    .map_err(|_| io::Error::other("the thread entering the sandbox's mounts panicked"))?
}

/// Makes the mount point (and missing parents) as the sandbox's root would: a child process
/// takes the sandbox's root as its own and the sandbox root's host id (no capabilities left),
/// and makes the directories with plain system calls (it runs nothing of the sandbox's).
fn make_mount_point(root: &OwnedFd, parts: &[String], owner: u32) -> io::Result<()> {
    let mut prefixes = Vec::with_capacity(parts.len());
    let mut path = String::new();
    for p in parts {
        path.push('/');
        path.push_str(p);
        prefixes.push(CString::new(path.as_bytes()).map_err(io::Error::other)?);
    }
    let root_fd = root.as_raw_fd();
    // SAFETY: the child only makes system calls on memory prepared above and then _exits; it
    // allocates nothing and touches no lock another thread might hold.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        unsafe {
            let fail = || libc::_exit(*libc::__errno_location());
            if libc::fchdir(root_fd) != 0 || libc::chroot(c".".as_ptr()) != 0 {
                fail();
            }
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(owner, owner, owner) != 0
                || libc::setresuid(owner, owner, owner) != 0
            {
                fail();
            }
            for p in &prefixes {
                if libc::mkdir(p.as_ptr(), 0o755) != 0 && *libc::__errno_location() != libc::EEXIST
                {
                    fail();
                }
            }
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
        (true, 0) => Ok(()),
        (true, errno) => Err(io::Error::from_raw_os_error(errno)),
        _ => Err(io::Error::other("the child making the mount point died")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process in user and mount namespaces of its own (as a sandbox's init is) gets the
    /// mount; the node's own namespace does not. Needs root (skipped otherwise).
    #[test]
    fn a_directory_shows_inside_another_mount_namespace_only() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("volume");
        std::fs::create_dir(&source).unwrap();
        std::fs::write(source.join("hello"), "hi").unwrap();
        let mut child = std::process::Command::new("unshare")
            .args([
                "--user",
                "--map-root-user",
                "--mount",
                "--propagation",
                "private",
                "sleep",
                "30",
            ])
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        // Until unshare has made the namespaces, the child is still in the node's.
        let own = std::fs::read_link("/proc/self/ns/mnt").unwrap();
        for _ in 0..200 {
            if std::fs::read_link(format!("/proc/{pid}/ns/mnt")).is_ok_and(|ns| ns != own) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let target = dir.path().join("made/here");
        let target = target.to_str().unwrap();
        let mounted = mount_into(pid, &source, target, 0);
        let inside = std::fs::read_to_string(format!("/proc/{pid}/root{target}/hello"));
        let outside = std::path::Path::new(target).join("hello").exists();
        let _ = child.kill();
        let _ = child.wait();
        mounted.unwrap();
        assert_eq!(inside.unwrap(), "hi");
        assert!(!outside, "the node's own namespace is untouched");
        assert!(mount_into(pid, &source, "/x/../y", 0).is_err());
    }

    #[test]
    fn mount_points_are_absolute_and_clean() {
        assert_eq!(
            mount_point("/mnt/data"),
            Some(vec!["mnt".into(), "data".into()])
        );
        for bad in [
            "",
            "/",
            "mnt/data",
            "/mnt/../etc",
            "/mnt/./x",
            "/mnt//x",
            "/mnt/",
        ] {
            assert_eq!(mount_point(bad), None, "{bad}");
        }
    }
}
