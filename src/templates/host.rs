//! The fallback `base` when mmdebstrap is missing: a root of its own (`/etc` with its own
//! users, `/home/user`, `/tmp`, `/root`, `/var`) whose `/usr` is the host's, bound read-only
//! at boot. Programs come from the host; nothing else of the host is visible, and nothing a
//! sandbox writes reaches it.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use super::shift::{Shift, shift_tree};
use super::{Kind, TemplateMeta, new_meta};
use crate::model::{Error, Result};
use crate::sandbox::spec::{IdMap, RootKind};

/// Host files under /etc that programs from /usr expect, copied as they are.
const ETC_COPIED: &[&str] = &[
    "alternatives",
    "bash.bashrc",
    "ca-certificates.conf",
    "debian_version",
    "environment",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "login.defs",
    "mime.types",
    "os-release",
    "profile",
    "profile.d",
    "skel",
    "ssl",
];

const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
user:x:1000:1000::/home/user:/bin/bash\n\
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
const GROUP: &str = "root:x:0:\ntty:x:5:\nusers:x:100:user\nuser:x:1000:\nnogroup:x:65534:\n";
const SHADOW: &str =
    "root:*:19000:0:99999:7:::\nuser:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n";
const NSSWITCH: &str = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n";

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

/// Copies a file, directory tree or symlink as it is (symlinks are not followed).
fn copy_entry(src: &Path, dst: &Path) -> std::io::Result<()> {
    let meta = fs::symlink_metadata(src)?;
    if meta.file_type().is_symlink() {
        symlink(fs::read_link(src)?, dst)
    } else if meta.is_dir() {
        crate::fsx::copy_tree(src, dst).map(|_| ())
    } else {
        fs::copy(src, dst).map(|_| ())
    }
}

pub fn compose(staging: &Path, ids: IdMap) -> Result<TemplateMeta> {
    let root = staging.join(super::ROOTFS);
    for d in [
        "",
        "etc",
        "home",
        "root",
        "tmp",
        "var",
        "var/tmp",
        "var/lib",
        "var/cache",
        "var/log",
        "run",
        "proc",
        "dev",
        "sys",
        "opt",
        "mnt",
        "srv",
        "usr",
    ] {
        fs::create_dir_all(root.join(d)).map_err(io("composing the host template"))?;
    }
    for d in ["tmp", "var/tmp"] {
        fs::set_permissions(root.join(d), fs::Permissions::from_mode(0o1777))
            .map_err(io("composing the host template"))?;
    }
    fs::set_permissions(root.join("root"), fs::Permissions::from_mode(0o700))
        .map_err(io("composing the host template"))?;
    // Merged /usr: the top-level program and library directories point into it.
    for d in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
        if Path::new("/usr").join(d).is_dir() {
            symlink(format!("usr/{d}"), root.join(d)).map_err(io("composing the host template"))?;
        }
    }
    let etc = root.join("etc");
    for name in ETC_COPIED {
        let src = Path::new("/etc").join(name);
        if src.exists() || src.is_symlink() {
            copy_entry(&src, &etc.join(name)).map_err(io("copying host configuration"))?;
        }
    }
    for (name, text, mode) in [
        ("passwd", PASSWD, 0o644),
        ("group", GROUP, 0o644),
        ("shadow", SHADOW, 0o640),
        ("nsswitch.conf", NSSWITCH, 0o644),
        ("hostname", "sandbox\n", 0o644),
    ] {
        fs::write(etc.join(name), text).map_err(io("writing /etc"))?;
        fs::set_permissions(etc.join(name), fs::Permissions::from_mode(mode))
            .map_err(io("writing /etc"))?;
    }
    let home = root.join("home/user");
    if Path::new("/etc/skel").is_dir() {
        crate::fsx::copy_tree(Path::new("/etc/skel"), &home).map_err(io("creating /home/user"))?;
    } else {
        fs::create_dir_all(&home).map_err(io("creating /home/user"))?;
    }
    fs::set_permissions(&home, fs::Permissions::from_mode(0o755))
        .map_err(io("creating /home/user"))?;
    // Everything belongs to the sandbox's root, except the user's home.
    shift_tree(&root, ids, Shift::In)
        .map_err(io("moving the template into the sandbox id range"))?;
    let user = ids.host(1000).unwrap_or(ids.base);
    chown_tree(&home, user).map_err(io("giving /home/user to user"))?;
    Ok(new_meta(
        "base",
        Kind::Host,
        RootKind::HostUsr,
        ids,
        "this machine's /usr (read-only) with its own /etc, /home and /tmp".into(),
    ))
}

fn chown_tree(path: &Path, id: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(id), Some(id))?;
    if fs::symlink_metadata(path)?.is_dir() {
        for e in fs::read_dir(path)? {
            chown_tree(&e?.path(), id)?;
        }
    }
    Ok(())
}
