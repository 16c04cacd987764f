//! Acting as the selected user for file operations. When envd runs as root it switches the
//! calling thread's filesystem uid/gid and supplementary groups (all three are per-thread at the
//! system-call level on Linux) around one blocking operation, so the kernel checks permissions
//! as that user and new files and directories are owned by them, with no chown and no race.
//! When envd is not root it can act only as itself, and asking for anyone else is an error.
//! Kernels without filesystem ids (gVisor answers setfsuid with ENOSYS) get the thread's
//! effective ids switched instead, keeping root as the saved id to switch back to.

use std::sync::OnceLock;

use super::users::{User, euid};

/// Who an operation runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Identity {
    pub fn of(u: &User) -> Identity {
        Identity {
            uid: u.uid,
            gid: u.gid,
            groups: u.groups.clone(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CredsError {
    #[error(
        "envd runs as uid {envd_uid} without the privilege to act as user '{user}' (uid {uid})"
    )]
    CannotSwitch {
        envd_uid: u32,
        user: String,
        uid: u32,
    },
    #[error("could not take on the identity of uid {0}")]
    SwitchFailed(u32),
}

/// Whether envd can act as `u`: itself always, anyone when root.
pub fn check_can_act_as(u: &User) -> Result<(), CredsError> {
    let me = euid();
    if me == 0 || me == u.uid {
        return Ok(());
    }
    Err(CredsError::CannotSwitch {
        envd_uid: me,
        user: u.name.clone(),
        uid: u.uid,
    })
}

/// envd's own groups and gid, captured once, to restore after each switch.
fn own() -> &'static (u32, Vec<u32>) {
    static OWN: OnceLock<(u32, Vec<u32>)> = OnceLock::new();
    OWN.get_or_init(|| {
        // SAFETY: getegid cannot fail; getgroups writes at most `n` entries into the buffer.
        unsafe {
            let gid = libc::getegid();
            let n = libc::getgroups(0, std::ptr::null_mut());
            let mut g = vec![0 as libc::gid_t; n.max(0) as usize];
            let got = libc::getgroups(n.max(0), g.as_mut_ptr());
            g.truncate(got.max(0) as usize);
            (gid, g)
        }
    })
}

/// setgroups(2) through the raw system call: glibc's wrapper changes every thread of the
/// process, and only this thread may change.
fn thread_setgroups(groups: &[u32]) -> bool {
    // SAFETY: the pointer and length describe a live slice of gid_t-sized integers.
    unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) == 0 }
}

/// Whether this kernel has filesystem ids. Linux's setfsuid never fails and returns the
/// previous id (0 here, as root); a kernel without it returns -1.
fn has_fsids() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    // SAFETY: an impossible id only reads the current fsuid.
    *HAS.get_or_init(|| unsafe { libc::setfsuid(u32::MAX) } as u32 != u32::MAX)
}

/// setresuid/setresgid on this thread only (the raw system calls; glibc's wrappers change
/// every thread). -1 keeps an id.
fn thread_set_effective(uid: Option<u32>, gid: Option<u32>) -> bool {
    let keep = u32::MAX as libc::c_ulong;
    // SAFETY: plain system calls on integers.
    unsafe {
        if let Some(g) = gid
            && libc::syscall(libc::SYS_setresgid, keep, g as libc::c_ulong, keep) != 0
        {
            return false;
        }
        if let Some(u) = uid
            && libc::syscall(libc::SYS_setresuid, keep, u as libc::c_ulong, keep) != 0
        {
            return false;
        }
    }
    true
}

/// Restores envd's own identity on this thread when dropped, also on unwinding: its
/// filesystem ids, or (`effective`) its effective ids.
struct Restore {
    effective: bool,
}

impl Drop for Restore {
    fn drop(&mut self) {
        let (gid, groups) = own();
        if !self.effective {
            // SAFETY: setfsuid/setfsgid only change this thread's filesystem ids.
            unsafe {
                libc::setfsuid(0);
                libc::setfsgid(*gid);
            }
        } else {
            // Root first: it brings back the capabilities the gid and groups need.
            thread_set_effective(Some(0), None);
            thread_set_effective(None, Some(*gid));
        }
        thread_setgroups(groups);
    }
}

/// Runs `f` on the current thread with `id`'s filesystem permissions. Call it from a blocking
/// thread only (never from an async worker, whose other tasks would run as the user too).
pub fn as_user<T>(id: &Identity, f: impl FnOnce() -> T) -> Result<T, CredsError> {
    let me = euid();
    if me == id.uid && (me != 0 || id.gid == own().0) {
        return Ok(f());
    }
    if me != 0 {
        return Err(CredsError::CannotSwitch {
            envd_uid: me,
            user: id.uid.to_string(),
            uid: id.uid,
        });
    }
    let _restore = Restore {
        effective: !has_fsids(),
    };
    // Groups and gid first: once the fsuid is not 0 the thread loses the capabilities that
    // would let it change them.
    if !thread_setgroups(&id.groups) {
        return Err(CredsError::SwitchFailed(id.uid));
    }
    if !has_fsids() {
        // The saved uid stays 0, so Restore can switch back.
        if !thread_set_effective(None, Some(id.gid)) || !thread_set_effective(Some(id.uid), None) {
            return Err(CredsError::SwitchFailed(id.uid));
        }
        return Ok(f());
    }
    // SAFETY: these only change this thread's filesystem ids; the previous value comes back
    // and a repeat call with an impossible id (-1) reads the current one.
    let ok = unsafe {
        libc::setfsgid(id.gid);
        libc::setfsuid(id.uid);
        libc::setfsgid(u32::MAX) as u32 == id.gid && libc::setfsuid(u32::MAX) as u32 == id.uid
    };
    if !ok {
        return Err(CredsError::SwitchFailed(id.uid));
    }
    Ok(f())
}

/// [`as_user`] on tokio's blocking pool.
pub async fn run_as<T: Send + 'static>(
    id: Identity,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, CredsError> {
    match tokio::task::spawn_blocking(move || as_user(&id, f)).await {
        Ok(r) => r,
        // The closure panicked; its thread restored the identity while unwinding.
        Err(_) => Err(CredsError::SwitchFailed(u32::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acts_as_itself_without_switching() {
        let me = Identity {
            uid: euid(),
            gid: own().0,
            groups: Vec::new(),
        };
        assert_eq!(as_user(&me, || 7).unwrap(), 7);
    }

    #[test]
    fn switches_and_restores_when_root() {
        if euid() != 0 {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let nobody = Identity {
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
        };
        let p = dir.path().join("made-by-nobody");
        // The temp dir is root's 0700: as nobody the kernel refuses.
        let denied = as_user(&nobody, || std::fs::write(&p, b"x")).unwrap();
        assert_eq!(
            denied.unwrap_err().kind(),
            std::io::ErrorKind::PermissionDenied
        );
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        as_user(&nobody, || std::fs::write(&p, b"x"))
            .unwrap()
            .unwrap();
        let meta = std::fs::metadata(&p).unwrap();
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 65534);
        // Back to root on this thread.
        std::fs::write(dir.path().join("root-again"), b"y").unwrap();
        let meta = std::fs::metadata(dir.path().join("root-again")).unwrap();
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 0);
    }

    #[test]
    fn the_effective_id_fallback_switches_and_restores_when_root() {
        if euid() != 0 {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let p = dir.path().join("made-by-nobody");
        // On a thread of its own: the switch is per thread and this one ends afterwards.
        std::thread::spawn(move || {
            let _restore = Restore { effective: true };
            assert!(thread_set_effective(None, Some(65534)));
            assert!(thread_set_effective(Some(65534), None));
            std::fs::write(&p, b"x").unwrap();
            let meta = std::fs::metadata(&p).unwrap();
            assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 65534);
            drop(_restore);
            // SAFETY: geteuid has no preconditions.
            assert_eq!(unsafe { libc::geteuid() }, 0);
            std::fs::write(p.with_extension("root"), b"y").unwrap();
        })
        .join()
        .unwrap();
    }
}
