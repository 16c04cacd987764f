//! The sandbox's root, assembled by its init inside its own user and mount namespaces, working
//! relative to the instance directory (its current directory): an overlay of the template
//! (read-only, shared) and the sandbox's disk (writable), a minimal /dev, a fresh /proc with
//! the host-revealing files masked, then `pivot_root` so that nothing of the host stays
//! mounted in the sandbox's namespace.
//!
//! Mounts made here belong to the sandbox's user namespace and are therefore not locked,
//! which is what lets `pivot_root` take the overlay as the new root.

use std::io;
use std::os::unix::fs::symlink;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use super::spec::{RootKind, layout};

fn err(what: impl std::fmt::Display) -> impl FnOnce(nix::Error) -> io::Error {
    move |e| io::Error::other(format!("{what}: {e}"))
}

fn bind(src: &Path, dst: &Path, flags: MsFlags) -> io::Result<()> {
    mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(err(format!(
        "binding {} on {}",
        src.display(),
        dst.display()
    )))?;
    if !flags.is_empty() {
        // A bind mount takes new flags only on a remount.
        mount(
            None::<&str>,
            dst,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | flags,
            None::<&str>,
        )
        .map_err(err(format!("restricting {}", dst.display())))?;
    }
    Ok(())
}

/// Stops mount events from propagating between this mount namespace and the one it was
/// copied from.
pub fn make_private() -> io::Result<()> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(err("making the mount namespace private"))
}

/// The overlay's lower directories, top first: a built template's layers over its root.
/// Relative names keep the options within the page `mount(2)` takes for hundreds of layers.
fn lowerdirs(layers: usize) -> String {
    let mut dirs: Vec<String> = (0..layers)
        .map(|i| format!("{}/{i}", layout::LAYERS))
        .collect();
    dirs.push(layout::LOWER.to_string());
    dirs.join(":")
}

/// Mounts the sandbox's root at `root` (relative to the current directory), with `layers`
/// layers of a built template over the template's root.
pub fn assemble_root(kind: RootKind, layers: usize, memory_bytes: u64) -> io::Result<()> {
    let root = Path::new(layout::ROOT);
    make_private()?;
    let disk = layout::DISK_MOUNT;
    // userxattr: overlay's bookkeeping lives in user.* attributes, which an unprivileged
    // (user-namespace) mount may write; layers committed from such an upper read the same way.
    let opts = format!(
        "lowerdir={},upperdir={disk}/upper,workdir={disk}/work,userxattr",
        lowerdirs(layers)
    );
    mount(
        Some("overlay"),
        root,
        Some("overlay"),
        MsFlags::MS_NODEV,
        Some(opts.as_str()),
    )
    .map_err(err("mounting the overlay root"))?;
    if kind == RootKind::HostUsr {
        std::fs::create_dir_all(root.join("usr"))?;
        bind(
            Path::new(layout::HOST_USR),
            &root.join("usr"),
            MsFlags::MS_RDONLY | MsFlags::MS_NODEV,
        )?;
    }
    dev(root)?;
    proc_fs(root)?;
    let shm = root.join("dev/shm");
    let shm_opts = format!("mode=1777,size={memory_bytes}");
    mount(
        Some("shm"),
        &shm,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(shm_opts.as_str()),
    )
    .map_err(err("mounting /dev/shm"))?;
    let sys = root.join("sys");
    std::fs::create_dir_all(&sys)?;
    // An empty, read-only /sys: the host's devices and cgroups are none of the sandbox's
    // business.
    mount(
        Some("sysfs-empty"),
        &sys,
        Some("tmpfs"),
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=555,size=4k"),
    )
    .map_err(err("mounting /sys"))?;
    Ok(())
}

const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

fn dev(root: &Path) -> io::Result<()> {
    let dev = root.join("dev");
    std::fs::create_dir_all(&dev)?;
    mount(
        Some("dev"),
        &dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=755,size=64k"),
    )
    .map_err(err("mounting /dev"))?;
    for name in DEVICES {
        let node = dev.join(name);
        std::fs::File::create(&node)?;
        // The host's device nodes, bound: a user namespace cannot create devices itself.
        bind(&Path::new("/dev").join(name), &node, MsFlags::empty())?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        symlink(target, dev.join(link))?;
    }
    for d in ["pts", "shm", "mqueue"] {
        std::fs::create_dir(dev.join(d))?;
    }
    mount(
        Some("devpts"),
        &dev.join("pts"),
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620,gid=5"),
    )
    .map_err(err("mounting /dev/pts"))?;
    // POSIX message queues of the sandbox's own IPC namespace; optional.
    let _ = mount(
        Some("mqueue"),
        &dev.join("mqueue"),
        Some("mqueue"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    );
    Ok(())
}

/// Files of /proc that describe the host rather than the sandbox.
const PROC_MASKED: &[&str] = &[
    "kcore",
    "keys",
    "key-users",
    "timer_list",
    "sched_debug",
    "latency_stats",
    "kallsyms",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
];
const PROC_MASKED_DIRS: &[&str] = &["acpi", "scsi", "asound"];
const PROC_READ_ONLY: &[&str] = &["bus", "fs", "irq", "sys", "sysrq-trigger"];

fn proc_fs(root: &Path) -> io::Result<()> {
    let proc_dir = root.join("proc");
    std::fs::create_dir_all(&proc_dir)?;
    // The sandbox's own pid namespace: this process is its pid 1.
    mount(
        Some("proc"),
        &proc_dir,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(err("mounting /proc"))?;
    let null = root.join("dev/null");
    for name in PROC_MASKED {
        let p = proc_dir.join(name);
        if p.exists() {
            bind(&null, &p, MsFlags::empty())?;
        }
    }
    for name in PROC_MASKED_DIRS {
        let p = proc_dir.join(name);
        if p.is_dir() {
            mount(
                Some("masked"),
                &p,
                Some("tmpfs"),
                MsFlags::MS_RDONLY,
                Some("size=4k"),
            )
            .map_err(err(format!("masking {}", p.display())))?;
        }
    }
    for name in PROC_READ_ONLY {
        let p = proc_dir.join(name);
        if p.exists() {
            bind(
                &p,
                &p,
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            )?;
        }
    }
    Ok(())
}

/// Makes the assembled root the process's root and detaches everything else. Answers whether
/// `pivot_root` worked; where the kernel refuses it, the root is entered with `chroot`, and the
/// caller must then withhold CAP_SYS_CHROOT from everything it starts.
pub fn enter_root() -> io::Result<bool> {
    std::env::set_current_dir(layout::ROOT)?;
    match nix::unistd::pivot_root(".", ".") {
        Ok(()) => {
            // The old root is stacked under the new one; detaching it leaves only the
            // sandbox's own mounts in this namespace.
            umount2(".", MntFlags::MNT_DETACH).map_err(err("detaching the host's root"))?;
            std::env::set_current_dir("/")?;
            Ok(true)
        }
        Err(e) => {
            tracing::warn!(error = %e, "pivot_root refused; entering the sandbox root with chroot");
            nix::unistd::chroot(".").map_err(err("chroot into the sandbox root"))?;
            std::env::set_current_dir("/")?;
            Ok(false)
        }
    }
}

/// The files every sandbox gets fresh: its names and its resolver.
pub fn write_identity(hostname: &str, resolver: Option<&str>) -> io::Result<()> {
    let etc = Path::new("/etc");
    std::fs::create_dir_all(etc)?;
    std::fs::write(etc.join("hostname"), format!("{hostname}\n"))?;
    std::fs::write(
        etc.join("hosts"),
        format!(
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n"
        ),
    )?;
    let resolv = etc.join("resolv.conf");
    // Images often ship resolv.conf as a symlink into a resolver daemon's state.
    if resolv.is_symlink() {
        std::fs::remove_file(&resolv)?;
    }
    match resolver {
        Some(ns) => std::fs::write(&resolv, format!("nameserver {ns}\noptions edns0\n"))?,
        None => std::fs::write(&resolv, "")?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_stack_over_the_root_top_first() {
        assert_eq!(lowerdirs(0), "lower");
        assert_eq!(lowerdirs(3), "layers/0:layers/1:layers/2:lower");
        // The most layers a template may stack (node builds' MAX_LAYERS) fit mount(2)'s page
        // with room for the other options.
        assert!(lowerdirs(120).len() < 2000);
    }
}
