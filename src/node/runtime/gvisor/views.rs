//! Id-mapped views of host trees for runsc. The node stores files under its shifted ids
//! (base + id), while runsc's gofer hands a gVisor sandbox host files with their ids as they
//! are; so what runsc serves besides the sandbox's own root (a build's layers, a tenant's
//! volumes) is shown to it through an id-mapped clone of its mount, where a file stored as
//! base + 1000 is 1000 and a file the sandbox makes as 1000 is stored as base + 1000, as the
//! built-in runtime stores it. The views are attached in a mount namespace of runsc's own
//! between fork and exec (`ChildMounts::apply`): they vanish with the sandbox's processes,
//! and nothing of them is left mounted on the node.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::Arc;

use crate::sandbox::detached;
use crate::sandbox::spec::IdMap;

/// A user namespace whose ids base..base+count are the host's 0..count, held by a descriptor
/// for the node's life: the id map of every view.
#[derive(Debug)]
pub struct IdViews {
    userns: OwnedFd,
}

pub fn c_path(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other)
}

impl IdViews {
    /// Makes the namespace: a child unshares it and waits while its maps are written and the
    /// namespace is opened, then goes. A view maps a file's id as an id inside the namespace.
    pub fn new(ids: IdMap) -> io::Result<IdViews> {
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // SAFETY: runs in the forked child before exec and makes one system call.
        unsafe {
            cmd.pre_exec(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).map_err(io::Error::from)
            })
        };
        let mut child = cmd.spawn()?;
        let pid = child.id();
        let opened = (|| {
            let line = format!("{} 0 {}\n", ids.base, ids.count);
            std::fs::write(format!("/proc/{pid}/uid_map"), &line)?;
            std::fs::write(format!("/proc/{pid}/gid_map"), &line)?;
            Ok::<_, io::Error>(OwnedFd::from(std::fs::File::open(format!(
                "/proc/{pid}/ns/user"
            ))?))
        })();
        let _ = child.kill();
        let _ = child.wait();
        Ok(IdViews { userns: opened? })
    }

    /// Ok when the file system of `path` takes id-mapped views (one is made and dropped).
    pub fn check(&self, path: &Path, writable: bool) -> io::Result<()> {
        view(&c_path(path)?, self.userns.as_raw_fd(), writable)
            .map(drop)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "{} cannot be shown through an id-mapped mount here: {e}",
                        path.display()
                    ),
                )
            })
    }
}

/// A detached, id-mapped clone of the mount at `path`, without devices or set-id programs
/// (allocation-free: it runs between fork and exec).
fn view(path: &CString, userns: libc::c_int, writable: bool) -> io::Result<OwnedFd> {
    let fd = detached::clone_tree(path)?;
    let mut attrs =
        detached::MOUNT_ATTR_IDMAP | detached::MOUNT_ATTR_NODEV | detached::MOUNT_ATTR_NOSUID;
    if !writable {
        attrs |= detached::MOUNT_ATTR_RDONLY;
    }
    detached::set_attrs(&fd, attrs, Some(userns))?;
    Ok(fd)
}

/// One view: what is shown, where, and whether it may be written.
#[derive(Debug, Clone)]
struct View {
    source: CString,
    target: CString,
    writable: bool,
}

/// What runsc's child mounts in its own mount namespace: everything allocated beforehand, as
/// nothing may allocate between fork and exec.
#[derive(Debug, Clone)]
pub struct ChildMounts {
    ids: Arc<IdViews>,
    /// Top first for a build's layers; the overlay needs them in place before it.
    views: Vec<View>,
    /// A build's root: the overlay's directory (holding `root`, its mount point) and options.
    overlay: Option<(CString, CString)>,
}

impl ChildMounts {
    pub fn new(ids: Arc<IdViews>) -> ChildMounts {
        ChildMounts {
            ids,
            views: Vec::new(),
            overlay: None,
        }
    }

    /// Shows `source` at the existing directory `target`.
    pub fn view(&mut self, source: &Path, target: &Path, writable: bool) -> io::Result<()> {
        self.views.push(View {
            source: c_path(source)?,
            target: c_path(target)?,
            writable,
        });
        Ok(())
    }

    /// Mounts an overlay at `dir/root` with `opts` (relative to `dir`) after the views.
    pub fn overlay(&mut self, dir: &Path, opts: &str) -> io::Result<()> {
        self.overlay = Some((c_path(dir)?, CString::new(opts).map_err(io::Error::other)?));
        Ok(())
    }

    /// Whether the sandbox's root is the overlay here (runsc then writes through to it).
    pub fn own_root(&self) -> bool {
        self.overlay.is_some()
    }

    /// Mounts the views, then the overlay. Runs in the forked child, after it made its mount
    /// namespace private; only system calls.
    pub fn apply(&self) -> io::Result<()> {
        for v in &self.views {
            let fd = view(&v.source, self.ids.userns.as_raw_fd(), v.writable)?;
            detached::attach(&fd, &v.target)?;
        }
        let Some((dir, opts)) = &self.overlay else {
            return Ok(());
        };
        // SAFETY: chdir, mount and chdir with NUL-terminated strings we own.
        unsafe {
            if libc::chdir(dir.as_ptr()) != 0 {
                return Err(io::Error::last_os_error());
            }
            let rc = libc::mount(
                c"overlay".as_ptr(),
                c"root".as_ptr(),
                c"overlay".as_ptr(),
                libc::MS_NODEV,
                opts.as_ptr().cast(),
            );
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::chdir(c"/".as_ptr()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}
