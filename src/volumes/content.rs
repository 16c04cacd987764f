//! A volume's files, as the volume content API reads and changes them. Sandboxes write into a
//! volume too, so anything in it is hostile: every path is resolved with `openat2` inside the
//! volume's directory (`RESOLVE_IN_ROOT`: `..` stops at its top and absolute symbolic links
//! start there; no `/proc` magic links), and entries are made, changed or removed relative to
//! a directory opened that way, never by a path the host resolves. Owners are sandbox ids; on
//! disk they are the node's shifted ids, so that mounted volumes show them to sandboxes.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use chrono::{DateTime, TimeZone, Utc};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{Mode, SFlag};
use nix::unistd::{Gid, Uid, UnlinkatFlags};
use serde::Serialize;

use crate::model::{Error, Result};
use crate::sandbox::spec::IdMap;

/// The sandbox user files belong to when the caller names nobody (`user`, as in sandboxes).
pub const DEFAULT_OWNER: u32 = 1000;
/// Deepest listing asked for at once.
pub const MAX_DEPTH: u32 = 16;
/// Most entries one listing returns.
const MAX_ENTRIES: usize = 10_000;

/// e2b's `VolumeEntryStat`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct EntryStat {
    pub name: String,
    /// `file`, `directory`, `symlink` or `unknown`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// From the volume's top, starting with `/`.
    pub path: String,
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: DateTime<Utc>,
    pub mtime: DateTime<Utc>,
    pub ctime: DateTime<Utc>,
    /// A symbolic link's target, as written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// Owner and permissions a caller asks for (sandbox ids).
#[derive(Debug, Clone, Copy, Default)]
pub struct Meta {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mode: Option<u32>,
}

/// One volume's directory, opened.
pub struct Root {
    dir: OwnedFd,
    ids: IdMap,
}

fn errno(what: &str, path: &str, e: Errno) -> Error {
    match e {
        Errno::ENOENT => Error::not_found(format!("path {path:?} not found")),
        Errno::EEXIST => Error::conflict(format!("path {path:?} already exists")),
        Errno::EISDIR => Error::conflict(format!("path {path:?} is a directory")),
        Errno::ENOTDIR => Error::conflict(format!("a parent of {path:?} is not a directory")),
        Errno::ELOOP => Error::invalid(format!("path {path:?} is a symbolic link")),
        Errno::ENOTEMPTY => Error::conflict(format!("directory {path:?} is not empty")),
        Errno::ENOSPC | Errno::EDQUOT => {
            Error::unavailable(format!("{what} {path:?}: no space left"))
        }
        e => Error::io(format!("{what} {path:?}"), io::Error::from(e)),
    }
}

/// The components of `path` below the volume's top (`/` and `""` are the top itself).
fn parts(path: &str) -> Result<Vec<&str>> {
    if path.contains('\0') {
        return Err(Error::invalid("path must not contain NUL"));
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(Error::invalid(format!(
            "path {path:?} must not contain \"..\""
        )));
    }
    Ok(parts)
}

fn shown(parts: &[&str]) -> String {
    format!("/{}", parts.join("/"))
}

fn time(secs: i64, nanos: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(secs, nanos.clamp(0, 999_999_999) as u32)
        .single()
        .unwrap_or_default()
}

impl Root {
    /// Opens the volume directory `dir`.
    pub fn open(dir: &Path, ids: IdMap) -> Result<Root> {
        let dir = nix::fcntl::open(
            dir,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::io(format!("opening volume {}", dir.display()), e.into()))?;
        Ok(Root { dir, ids })
    }

    fn host_id(&self, id: Option<u32>) -> Result<u32> {
        let id = id.unwrap_or(DEFAULT_OWNER);
        self.ids.host(id).ok_or_else(|| {
            Error::invalid(format!("id {id} is not a sandbox id (0..{})", IdMap::COUNT))
        })
    }

    fn sandbox_id(&self, host: u32) -> u32 {
        host.checked_sub(self.ids.base)
            .filter(|id| *id < IdMap::COUNT)
            .unwrap_or(65534)
    }

    /// Opens `parts` (inside the volume only), following symbolic links there unless `nofollow`.
    fn resolve(&self, parts: &[&str], flags: OFlag) -> nix::Result<OwnedFd> {
        let rel = if parts.is_empty() {
            ".".to_string()
        } else {
            parts.join("/")
        };
        openat2(
            self.dir.as_fd(),
            rel.as_str(),
            OpenHow::new()
                .flags(flags | OFlag::O_CLOEXEC)
                .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS),
        )
    }

    /// The directory holding `parts`' last component, and that component.
    fn parent<'a>(&self, parts: &'a [&'a str], path: &str) -> Result<(OwnedFd, &'a str)> {
        let (name, up) = parts
            .split_last()
            .ok_or_else(|| Error::invalid("the volume's top cannot be changed this way"))?;
        let dir = self
            .resolve(up, OFlag::O_PATH | OFlag::O_DIRECTORY)
            .map_err(|e| errno("opening the parent of", path, e))?;
        Ok((dir, name))
    }

    fn stat_at(&self, dir: &OwnedFd, name: &str, shown_path: String) -> nix::Result<EntryStat> {
        let (at, flags) = if name.is_empty() {
            ("", AtFlags::AT_EMPTY_PATH | AtFlags::AT_SYMLINK_NOFOLLOW)
        } else {
            (name, AtFlags::AT_SYMLINK_NOFOLLOW)
        };
        let st = nix::sys::stat::fstatat(dir.as_fd(), at, flags)?;
        let kind = match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
            SFlag::S_IFREG => "file",
            SFlag::S_IFDIR => "directory",
            SFlag::S_IFLNK => "symlink",
            _ => "unknown",
        };
        let target = (kind == "symlink")
            .then(|| nix::fcntl::readlinkat(dir.as_fd(), at).ok())
            .flatten()
            .map(|t| t.to_string_lossy().into_owned());
        let base = shown_path
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        Ok(EntryStat {
            name: base,
            kind,
            path: shown_path,
            size: st.st_size as u64,
            mode: st.st_mode & 0o7777,
            uid: self.sandbox_id(st.st_uid),
            gid: self.sandbox_id(st.st_gid),
            atime: time(st.st_atime, st.st_atime_nsec),
            mtime: time(st.st_mtime, st.st_mtime_nsec),
            ctime: time(st.st_ctime, st.st_ctime_nsec),
            target,
        })
    }

    /// What is at `path` (a symbolic link itself, not what it names).
    pub fn stat(&self, path: &str) -> Result<EntryStat> {
        let parts = parts(path)?;
        let fd = self
            .resolve(&parts, OFlag::O_PATH | OFlag::O_NOFOLLOW)
            .map_err(|e| errno("reading", path, e))?;
        self.stat_at(&fd, "", shown(&parts))
            .map_err(|e| errno("reading", path, e))
    }

    /// The entries below the directory at `path`, `depth` levels down (1: its own entries).
    pub fn list(&self, path: &str, depth: u32) -> Result<Vec<EntryStat>> {
        let parts = parts(path)?;
        let depth = depth.clamp(1, MAX_DEPTH);
        let mut out = Vec::new();
        let mut stack = vec![(
            self.resolve(&parts, OFlag::O_RDONLY | OFlag::O_DIRECTORY)
                .map_err(|e| errno("listing", path, e))?,
            shown(&parts),
            1u32,
        )];
        while let Some((dir, at, level)) = stack.pop() {
            let dup = dir.try_clone().map_err(|e| Error::io("listing", e))?;
            let mut entries = nix::dir::Dir::from_fd(dup).map_err(|e| errno("listing", &at, e))?;
            let mut names: Vec<String> = entries
                .iter()
                .filter_map(|e| e.ok())
                .map(|e| String::from_utf8_lossy(e.file_name().to_bytes()).into_owned())
                .filter(|n| n != "." && n != "..")
                .collect();
            names.sort();
            for name in names {
                if out.len() >= MAX_ENTRIES {
                    return Ok(out);
                }
                let child = if at == "/" {
                    format!("/{name}")
                } else {
                    format!("{at}/{name}")
                };
                let Ok(stat) = self.stat_at(&dir, &name, child.clone()) else {
                    continue;
                };
                if stat.kind == "directory" && level < depth {
                    let sub = nix::fcntl::openat(
                        dir.as_fd(),
                        name.as_str(),
                        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                        Mode::empty(),
                    );
                    if let Ok(sub) = sub {
                        stack.push((sub, child, level + 1));
                    }
                }
                out.push(stat);
            }
        }
        Ok(out)
    }

    /// Gives `name` in `dir` (itself, never what a link names) the sandbox ids' owners.
    fn chown(&self, dir: &OwnedFd, name: &str, uid: Option<u32>, gid: Option<u32>) -> Result<()> {
        let (uid, gid) = (self.host_id(uid)?, self.host_id(gid.or(uid))?);
        nix::unistd::fchownat(
            dir.as_fd(),
            name,
            Some(Uid::from_raw(uid)),
            Some(Gid::from_raw(gid)),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| errno("changing the owner of", name, e))
    }

    /// Gives what was made at `name` in `dir` its owner and mode.
    fn own(&self, dir: &OwnedFd, name: &str, meta: Meta, default_mode: u32) -> Result<()> {
        self.chown(dir, name, meta.uid, meta.gid)?;
        let mode = Mode::from_bits_truncate(meta.mode.unwrap_or(default_mode) & 0o7777);
        nix::sys::stat::fchmodat(
            dir.as_fd(),
            name,
            mode,
            nix::sys::stat::FchmodatFlags::FollowSymlink,
        )
        .map_err(|e| errno("changing the mode of", name, e))
    }

    /// Makes the directory `path`; `force` makes missing parents too and takes one that exists.
    pub fn make_dir(&self, path: &str, meta: Meta, force: bool) -> Result<EntryStat> {
        let parts = parts(path)?;
        if parts.is_empty() {
            return Err(Error::conflict("the volume's top exists"));
        }
        // Parents one by one, each resolved inside the volume.
        let start = if force { 1 } else { parts.len() };
        for end in start..=parts.len() {
            let (dir, name) = self.parent(&parts[..end], path)?;
            match nix::sys::stat::mkdirat(dir.as_fd(), name, Mode::from_bits_truncate(0o700)) {
                Ok(()) => self.own(&dir, name, meta, 0o755)?,
                Err(Errno::EEXIST) if force || end < parts.len() => {}
                Err(e) => return Err(errno("making", path, e)),
            }
        }
        self.stat(path)
    }

    /// Opens `path` to be written: made (owned and moded as asked), or emptied when it exists
    /// and `force` says so (409 otherwise).
    pub fn create_file(&self, path: &str, meta: Meta, force: bool) -> Result<File> {
        let parts = parts(path)?;
        let (dir, name) = self.parent(&parts, path)?;
        let mut flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        flags |= if force { OFlag::O_TRUNC } else { OFlag::O_EXCL };
        let fd = nix::fcntl::openat(dir.as_fd(), name, flags, Mode::from_bits_truncate(0o600))
            .map_err(|e| errno("writing", path, e))?;
        self.own(&dir, name, meta, 0o644)?;
        Ok(File::from(fd))
    }

    /// Opens the file at `path` to be read.
    pub fn read_file(&self, path: &str) -> Result<File> {
        let parts = parts(path)?;
        let fd = self
            .resolve(&parts, OFlag::O_RDONLY)
            .map_err(|e| errno("reading", path, e))?;
        let file = File::from(fd);
        let is_file = file.metadata().map(|m| m.is_file()).unwrap_or(false);
        if !is_file {
            return Err(Error::conflict(format!("path {path:?} is not a file")));
        }
        Ok(file)
    }

    /// Changes the owner and mode of what is at `path`.
    pub fn set_meta(&self, path: &str, meta: Meta) -> Result<EntryStat> {
        let parts = parts(path)?;
        let current = self.stat(path)?;
        let (dir, name) = self.parent(&parts, path)?;
        let keep = Meta {
            uid: meta.uid.or(Some(current.uid)),
            gid: meta.gid.or(Some(current.gid)),
            mode: meta.mode.or(Some(current.mode)),
        };
        if current.kind == "symlink" {
            if meta.mode.is_some() {
                return Err(Error::invalid(format!(
                    "{path:?} is a symbolic link: it has no mode of its own"
                )));
            }
            self.chown(&dir, name, keep.uid, keep.gid)?;
        } else {
            self.own(&dir, name, keep, 0o644)?;
        }
        self.stat(path)
    }

    /// Removes what is at `path`, a directory with everything in it.
    pub fn remove(&self, path: &str) -> Result<()> {
        let parts = parts(path)?;
        let (dir, name) = self.parent(&parts, path)?;
        remove_at(&dir, OsStr::from_bytes(name.as_bytes()), 0)
            .map_err(|e| errno("removing", path, e))
    }
}

/// Removes `name` in `dir`, descending into directories by descriptor (never by path).
fn remove_at(dir: &OwnedFd, name: &OsStr, level: u32) -> nix::Result<()> {
    match nix::unistd::unlinkat(dir.as_fd(), name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) => return Ok(()),
        Err(Errno::EISDIR) | Err(Errno::EPERM) => {}
        Err(e) => return Err(e),
    }
    if level > 256 {
        return Err(Errno::ELOOP);
    }
    let sub = nix::fcntl::openat(
        dir.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let names: Vec<Vec<u8>> = {
        let mut d = nix::dir::Dir::from_fd(sub.try_clone().map_err(|_| Errno::EBADF)?)?;
        d.iter()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_bytes().to_vec())
            .filter(|n| n != b"." && n != b"..")
            .collect()
    };
    for n in names {
        remove_at(&sub, OsStr::from_bytes(&n), level + 1)?;
    }
    nix::unistd::unlinkat(dir.as_fd(), name, UnlinkatFlags::RemoveDir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> (tempfile::TempDir, Root) {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let root = Root::open(&data, IdMap::new(100_000).unwrap()).unwrap();
        (dir, root)
    }

    #[test]
    fn files_and_directories_are_made_read_listed_and_removed() {
        let (_d, r) = root();
        assert!(
            matches!(r.make_dir("/a/b", Meta::default(), false), Err(e) if e.message.contains("not found"))
        );
        let made = r.make_dir("/a/b", Meta::default(), true).unwrap();
        assert_eq!(
            (made.kind, made.path.as_str(), made.mode),
            ("directory", "/a/b", 0o755)
        );
        assert!(
            r.make_dir("/a/b", Meta::default(), false).is_err(),
            "exists"
        );
        r.make_dir("/a/b", Meta::default(), true).unwrap();
        use std::io::Write;
        r.create_file(
            "/a/b/f.txt",
            Meta {
                mode: Some(0o600),
                ..Default::default()
            },
            false,
        )
        .unwrap()
        .write_all(b"hello")
        .unwrap();
        assert!(
            r.create_file("/a/b/f.txt", Meta::default(), false).is_err(),
            "409 without force"
        );
        assert!(
            r.create_file("/a/b", Meta::default(), true).is_err(),
            "a directory"
        );
        let st = r.stat("a/b/f.txt").unwrap();
        assert_eq!(
            (st.kind, st.size, st.mode, st.name.as_str()),
            ("file", 5, 0o600, "f.txt")
        );
        let listed: Vec<String> = r
            .list("/", 3)
            .unwrap()
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(listed, ["/a", "/a/b", "/a/b/f.txt"]);
        assert_eq!(r.list("/", 1).unwrap().len(), 1);
        let changed = r
            .set_meta(
                "/a/b/f.txt",
                Meta {
                    mode: Some(0o640),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(changed.mode, 0o640);
        r.remove("/a").unwrap();
        assert!(r.stat("/a").unwrap_err().message.contains("not found"));
    }

    #[test]
    fn nothing_leads_out_of_the_volume() {
        let (d, r) = root();
        std::fs::write(d.path().join("secret"), "host file").unwrap();
        let data = d.path().join("data");
        std::os::unix::fs::symlink("/etc/passwd", data.join("abs")).unwrap();
        std::os::unix::fs::symlink("../secret", data.join("up")).unwrap();
        std::os::unix::fs::symlink("/", data.join("top")).unwrap();
        std::os::unix::fs::symlink("/proc/self/root/etc", data.join("magic")).unwrap();
        // Links are resolved as if the volume were the whole file system.
        for p in [
            "/abs",
            "/up",
            "/top/secret",
            "/magic/passwd",
            "/../secret",
            "../../etc/passwd",
        ] {
            let read = r.read_file(p);
            assert!(read.is_err(), "{p} must not open");
        }
        // A link itself is reported, not followed.
        let st = r.stat("/abs").unwrap();
        assert_eq!(
            (st.kind, st.target.as_deref()),
            ("symlink", Some("/etc/passwd"))
        );
        // Writes through a link to a directory outside land inside (or fail), never outside.
        std::os::unix::fs::symlink(d.path(), data.join("out")).unwrap();
        let _ = r.create_file("/out/planted", Meta::default(), true);
        assert!(!d.path().join("planted").exists());
        let _ = r.make_dir("/out/dir", Meta::default(), true);
        assert!(!d.path().join("dir").exists());
        // Removing a link to a directory removes the link, not what it names.
        std::fs::create_dir(d.path().join("keep")).unwrap();
        std::fs::write(d.path().join("keep/x"), "x").unwrap();
        std::os::unix::fs::symlink(d.path().join("keep"), data.join("keeplink")).unwrap();
        r.remove("/keeplink").unwrap();
        assert!(d.path().join("keep/x").exists());
        assert!(
            r.set_meta(
                "/abs",
                Meta {
                    mode: Some(0o777),
                    ..Default::default()
                }
            )
            .is_err()
        );
        assert_eq!(
            std::fs::read_to_string(d.path().join("secret")).unwrap(),
            "host file"
        );
    }

    #[test]
    fn owners_are_sandbox_ids() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let (d, r) = root();
        r.create_file("/f", Meta::default(), false).unwrap();
        use std::os::unix::fs::MetadataExt;
        let on_disk = std::fs::metadata(d.path().join("data/f")).unwrap();
        assert_eq!(
            on_disk.uid(),
            100_000 + DEFAULT_OWNER,
            "the sandbox user, shifted"
        );
        assert_eq!(r.stat("/f").unwrap().uid, DEFAULT_OWNER);
        let root_owned = r
            .set_meta(
                "/f",
                Meta {
                    uid: Some(0),
                    gid: Some(0),
                    mode: None,
                },
            )
            .unwrap();
        assert_eq!((root_owned.uid, root_owned.gid), (0, 0));
        assert!(
            r.set_meta(
                "/f",
                Meta {
                    uid: Some(70_000),
                    ..Default::default()
                }
            )
            .is_err()
        );
    }
}
