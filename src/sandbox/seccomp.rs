//! The system calls a sandbox may not make, and the capabilities its programs may not hold.
//! The filter follows what container runtimes block by default: loading kernel code, keyrings,
//! BPF, mounting, new namespaces (a nested user namespace would hand back the capabilities
//! dropped here), the clock, swap, reboot, raw I/O ports, io_uring and file handles. Everything
//! else is allowed, so ordinary programs (compilers, package managers, debuggers of the
//! sandbox's own processes) work.

use std::collections::BTreeMap;
use std::io;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// Refused outright with EPERM.
const DENIED: &[i64] = &[
    libc::SYS_acct,
    libc::SYS_add_key,
    libc::SYS_bpf,
    libc::SYS_clock_adjtime,
    libc::SYS_clock_settime,
    libc::SYS_delete_module,
    libc::SYS_finit_module,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fsopen,
    libc::SYS_fspick,
    libc::SYS_init_module,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_io_uring_setup,
    libc::SYS_ioperm,
    libc::SYS_iopl,
    libc::SYS_kexec_file_load,
    libc::SYS_kexec_load,
    libc::SYS_keyctl,
    libc::SYS_lookup_dcookie,
    libc::SYS_mount,
    libc::SYS_mount_setattr,
    libc::SYS_move_mount,
    libc::SYS_name_to_handle_at,
    libc::SYS_nfsservctl,
    libc::SYS_open_by_handle_at,
    libc::SYS_open_tree,
    libc::SYS_perf_event_open,
    libc::SYS_pivot_root,
    libc::SYS_quotactl,
    libc::SYS_reboot,
    libc::SYS_request_key,
    libc::SYS_setns,
    libc::SYS_settimeofday,
    libc::SYS_swapoff,
    libc::SYS_swapon,
    libc::SYS_syslog,
    libc::SYS_umount2,
    libc::SYS_uselib,
    libc::SYS_userfaultfd,
    libc::SYS_vhangup,
];

/// Namespace flags refused on `clone` and `unshare`.
const NAMESPACE_FLAGS: &[i32] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
    0x80, // CLONE_NEWTIME
];

fn arch() -> io::Result<TargetArch> {
    TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| io::Error::other(format!("no seccomp filter for this architecture: {e}")))
}

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("building the seccomp filter: {e}"))
}

fn namespace_rules() -> io::Result<Vec<SeccompRule>> {
    NAMESPACE_FLAGS
        .iter()
        .map(|&flag| {
            let flag = flag as u64;
            let cond = SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )
            .map_err(other)?;
            SeccompRule::new(vec![cond]).map_err(other)
        })
        .collect()
}

/// The compiled filters, in the order they are installed.
pub fn filters() -> io::Result<Vec<BpfProgram>> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|&nr| (nr, Vec::new())).collect();
    rules.insert(libc::SYS_clone, namespace_rules()?);
    rules.insert(libc::SYS_unshare, namespace_rules()?);
    let deny: BpfProgram = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch()?,
    )
    .map_err(other)?
    .try_into()
    .map_err(other)?;
    // clone3 passes its flags in memory a filter cannot read; ENOSYS makes libc fall back to
    // clone, whose flags the rules above check.
    let clone3: BpfProgram = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch()?,
    )
    .map_err(other)?
    .try_into()
    .map_err(other)?;
    Ok(vec![deny, clone3])
}

/// Installs the filters on the calling (single-threaded) process; every descendant inherits
/// them and cannot remove them.
pub fn install(filters: &[BpfProgram]) -> io::Result<()> {
    for f in filters {
        if f.is_empty() {
            return Err(io::Error::other("seccomp: an empty filter"));
        }
        let len = u16::try_from(f.len())
            .map_err(|_| io::Error::other("seccomp: a filter longer than the kernel takes"))?;
        let prog = libc::sock_fprog {
            len,
            filter: f.as_ptr() as *mut libc::sock_filter,
        };
        // seccompiler's own installer also sets NO_NEW_PRIVS, which would stop setuid programs
        // (sudo) for good; a caller holding CAP_SYS_ADMIN in its user namespace (the sandbox's
        // init) may install a filter without it.
        // SAFETY: the kernel copies the program from `prog`, which outlives the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0 as libc::c_ulong,
                &prog as *const libc::sock_fprog,
            )
        };
        if rc != 0 {
            return Err(io::Error::other(format!(
                "seccomp: {}",
                io::Error::last_os_error()
            )));
        }
    }
    Ok(())
}

/// What a sandbox's root may hold after exec: the default set of container runtimes. Without
/// SYS_ADMIN, SYS_PTRACE, SYS_MODULE, NET_ADMIN and the rest, root inside is an ordinary
/// administrator of its own files and processes.
const KEPT_CAPABILITIES: &[u32] = &[
    0,  // CHOWN
    1,  // DAC_OVERRIDE
    3,  // FOWNER
    4,  // FSETID
    5,  // KILL
    6,  // SETGID
    7,  // SETUID
    8,  // SETPCAP
    10, // NET_BIND_SERVICE
    13, // NET_RAW
    18, // SYS_CHROOT
    27, // MKNOD
    29, // AUDIT_WRITE
    31, // SETFCAP
];
pub const CAP_SYS_CHROOT: u32 = 18;

/// Drops every other capability from the bounding set (what programs started later can ever
/// gain); `also` drops more. The caller's own effective capabilities are unchanged.
pub fn bound_capabilities(also: &[u32]) -> io::Result<()> {
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    for cap in 0..=last {
        if KEPT_CAPABILITIES.contains(&cap) && !also.contains(&cap) {
            continue;
        }
        // SAFETY: PR_CAPBSET_DROP takes a capability number.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
            let e = io::Error::last_os_error();
            // EINVAL: a capability this kernel does not know.
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(e);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lets an unprivileged test child install the filter.
    fn no_new_privs() -> io::Result<()> {
        // SAFETY: plain prctl.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    #[test]
    fn filters_compile() {
        let f = filters().unwrap();
        assert_eq!(f.len(), 2);
        assert!(f.iter().all(|p| !p.is_empty()));
    }

    #[test]
    fn the_filter_refuses_what_it_lists_in_a_child() {
        // In a forked child, so the test process itself stays unfiltered; the child
        // allocates nothing (other test threads may hold the allocator's lock).
        let f = filters().unwrap();
        // SAFETY: the child only makes system calls and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = (|| {
                no_new_privs().ok()?;
                install(&f).ok()?;
                // SAFETY: plain syscalls whose failure is the point.
                let unshare = unsafe { libc::unshare(libc::CLONE_NEWUSER) };
                let errno = io::Error::last_os_error().raw_os_error();
                let keyctl = unsafe { libc::syscall(libc::SYS_keyctl, 0, 0, 0, 0, 0) };
                let getpid = unsafe { libc::getpid() };
                Some(unshare == -1 && errno == Some(libc::EPERM) && keyctl == -1 && getpid > 0)
            })();
            // SAFETY: leaving the forked child without running the parent's destructors.
            unsafe { libc::_exit(if code == Some(true) { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
}
