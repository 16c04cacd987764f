//! A gVisor sandbox's files apart from its processes, for a filesystem-only pause: its writes
//! live in runsc's in-memory overlay, which only the sandbox itself can read. Its init (see
//! `gvisor_init`) saves them as a tar stream through the door: every entry changed after the
//! root was made (its ctime is later; files the sandbox never touched keep the template's),
//! then the names in every changed directory (a removal changes its directory). A fresh
//! sandbox of the same template loads that stream: it takes every saved entry and removes from
//! each changed directory what the list does not name, so its tree is the saved one. Mounts
//! are left out (`/proc`, `/dev`, the runtime's own paths, volumes), except gVisor's own
//! `/tmp`, whose files are the sandbox's like any others. A walk is the cost (gVisor's system
//! calls are dear), so each entry is looked at once when saved, and a load reads only the
//! changed directories.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::Metadata;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The stream's last entry: the entries of every changed directory (the root's always), each
/// as its kind's letter and its path relative to the root, NUL-terminated.
pub const PATHS: &str = ".sandbox-gateway-paths";
/// Paths never saved or removed: the runtime's own.
const OWN: &str = ".sandbox-gateway";
/// The only mount point below `/` whose files are saved.
const TMP: &str = "/tmp";

/// The letter `PATHS` gives an entry's kind.
fn kind(meta: &Metadata) -> u8 {
    let t = meta.file_type();
    if t.is_dir() {
        b'd'
    } else if t.is_symlink() {
        b'l'
    } else if t.is_file() {
        b'f'
    } else {
        b'o'
    }
}

fn key(kind: u8, rel: &Path) -> Vec<u8> {
    let mut k = vec![kind];
    k.extend_from_slice(rel.as_os_str().as_bytes());
    k
}

fn ctime_ns(meta: &Metadata) -> i128 {
    i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec())
}

/// The mount points under `/` whose trees are not the sandbox's files, from a mountinfo text.
fn foreign_mounts(mountinfo: &str) -> HashSet<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p != Path::new("/") && p != Path::new(TMP))
        .collect()
}

fn mounts_here() -> io::Result<HashSet<PathBuf>> {
    Ok(foreign_mounts(&std::fs::read_to_string(
        "/proc/self/mountinfo",
    )?))
}

/// The entries of the directory `rel` under `root` that are the sandbox's, with their
/// metadata.
fn children(root: &Path, rel: &Path, skip: &HashSet<PathBuf>) -> Vec<(PathBuf, PathBuf, Metadata)> {
    let Ok(dir) = std::fs::read_dir(root.join(rel)) else {
        // Gone, or not readable: nothing of it to save.
        return Vec::new();
    };
    let mut out: Vec<_> = dir
        .flatten()
        .filter_map(|e| {
            let child_rel = rel.join(e.file_name());
            let child = root.join(&child_rel);
            if child_rel == Path::new(OWN) || skip.contains(&child) {
                return None;
            }
            let meta = std::fs::symlink_metadata(&child).ok()?;
            Some((child, child_rel, meta))
        })
        .collect();
    out.sort_by(|a, b| a.1.cmp(&b.1));
    out
}

/// Writes the tar stream of the tree under `root` to `to`: entries whose ctime is after
/// `since_ns`, then `PATHS`.
pub fn save(root: &Path, since_ns: i64, to: impl Write) -> io::Result<()> {
    let since = i128::from(since_ns);
    let skip = mounts_here()?;
    let mut tar = tar::Builder::new(to);
    let mut paths = Vec::new();
    // Directories to read, each with whether it changed; parents are written before children.
    let mut stack = vec![(PathBuf::new(), true)];
    while let Some((rel, changed)) = stack.pop() {
        let kids = children(root, &rel, &skip);
        for (abs, child_rel, meta) in kids.iter().rev() {
            let k = kind(meta);
            if k == b'o' {
                // Sockets, fifos and devices are not files a sandbox keeps.
                continue;
            }
            if changed {
                paths.extend_from_slice(&key(k, child_rel));
                paths.push(0);
            }
            let child_changed = ctime_ns(meta) > since;
            if child_changed {
                append(&mut tar, abs, child_rel, meta)?;
            }
            if k == b'd' {
                stack.push((child_rel.clone(), child_changed));
            }
        }
    }
    let mut header = tar::Header::new_gnu();
    header.set_size(paths.len() as u64);
    header.set_mode(0o600);
    header.set_entry_type(tar::EntryType::Regular);
    tar.append_data(&mut header, PATHS, paths.as_slice())?;
    tar.into_inner()?.flush()
}

/// One entry, from the metadata already read.
fn append<W: Write>(
    tar: &mut tar::Builder<W>,
    abs: &Path,
    rel: &Path,
    meta: &Metadata,
) -> io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_metadata_in_mode(meta, tar::HeaderMode::Complete);
    if meta.is_dir() {
        header.set_size(0);
        tar.append_data(&mut header, rel, io::empty())
    } else if meta.file_type().is_symlink() {
        header.set_size(0);
        tar.append_link(&mut header, rel, std::fs::read_link(abs)?)
    } else {
        match std::fs::File::open(abs) {
            Ok(f) => {
                // What is read is what the header says, even if the file changed size since.
                header.set_size(meta.len());
                tar.append_data(
                    &mut header,
                    rel,
                    f.take(meta.len()).chain(io::repeat(0)).take(meta.len()),
                )
            }
            // A file the sandbox's root may not open (mode 000 is no bar to it; this is
            // something stranger): left out rather than failing the pause.
            Err(_) => Ok(()),
        }
    }
}

/// Reads a stream `save` wrote into the tree under `root`: every entry is unpacked in place
/// (what is there of another kind goes first), then from the root and every changed directory
/// whatever the list does not name is removed.
pub fn load(root: &Path, from: impl Read) -> io::Result<()> {
    let mut archive = tar::Archive::new(from);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_preserve_mtime(true);
    archive.set_overwrite(true);
    let mut listed: Option<HashSet<Vec<u8>>> = None;
    let mut changed_dirs = vec![PathBuf::new()];
    for entry in archive.entries()? {
        let mut entry = entry?;
        let rel = entry.path()?.into_owned();
        if rel == Path::new(PATHS) {
            let mut all = Vec::new();
            entry.read_to_end(&mut all)?;
            listed = Some(
                all.split(|b| *b == 0)
                    .filter(|p| !p.is_empty())
                    .map(<[u8]>::to_vec)
                    .collect(),
            );
            continue;
        }
        if !is_clean(&rel) {
            return Err(io::Error::other(format!(
                "an unsafe path in the saved files: {}",
                rel.display()
            )));
        }
        let target = root.join(&rel);
        let wanted = match entry.header().entry_type() {
            tar::EntryType::Directory => b'd',
            tar::EntryType::Symlink => b'l',
            _ => b'f',
        };
        if let Ok(there) = std::fs::symlink_metadata(&target)
            && kind(&there) != wanted
        {
            remove(&target, &there)?;
        }
        entry.unpack(&target)?;
        if wanted == b'd' {
            changed_dirs.push(rel);
        }
    }
    let listed = listed.ok_or_else(|| io::Error::other("the saved files have no path list"))?;
    let skip = mounts_here()?;
    for dir in changed_dirs {
        for (abs, rel, meta) in children(root, &dir, &skip) {
            let k = kind(&meta);
            if k != b'o' && !listed.contains(&key(k, &rel)) {
                remove(&abs, &meta)?;
            }
        }
    }
    Ok(())
}

/// A relative path with plain names only.
fn is_clean(rel: &Path) -> bool {
    !rel.as_os_str().is_empty()
        && rel
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(n) if n != OsStr::new(OWN)))
}

fn remove(path: &Path, meta: &Metadata) -> io::Result<()> {
    if meta.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn changed_at(p: &Path) -> i64 {
        let m = std::fs::symlink_metadata(p).unwrap();
        m.ctime() * 1_000_000_000 + m.ctime_nsec()
    }

    fn tree(root: &Path) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            for (abs, rel, m) in children(root, &rel, &HashSet::new()) {
                let what = if m.is_dir() {
                    stack.push(rel.clone());
                    format!("dir {:o}", m.mode() & 0o7777)
                } else if m.file_type().is_symlink() {
                    format!("-> {}", std::fs::read_link(&abs).unwrap().display())
                } else {
                    format!(
                        "{:o} {}",
                        m.mode() & 0o7777,
                        String::from_utf8_lossy(&std::fs::read(&abs).unwrap())
                    )
                };
                out.push((rel.display().to_string(), what));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn a_fresh_tree_loaded_with_the_saved_stream_becomes_the_saved_tree() {
        let make_template = |root: &Path| {
            for d in ["etc", "usr/bin", "gone-dir/sub", "kind"] {
                std::fs::create_dir_all(root.join(d)).unwrap();
            }
            std::fs::write(root.join("etc/kept"), "template").unwrap();
            std::fs::write(root.join("etc/changed"), "template").unwrap();
            std::fs::write(root.join("etc/removed"), "template").unwrap();
            std::fs::write(root.join("usr/bin/tool"), "binary").unwrap();
            std::fs::write(root.join("gone-dir/sub/f"), "x").unwrap();
            std::fs::write(root.join("kind/f"), "a dir that becomes a file").unwrap();
        };
        let base = tempfile::tempdir().unwrap();
        let sandbox = base.path().join("sandbox");
        make_template(&sandbox);
        // The root was "made" now: only what changes after this is saved.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let since =
            changed_at(&sandbox.join("usr/bin/tool")).max(changed_at(&sandbox.join("kind/f")));
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(sandbox.join("etc/changed"), "sandbox").unwrap();
        // A change of mode alone is a change.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            sandbox.join("usr/bin/tool"),
            std::fs::Permissions::from_mode(0o700),
        )
        .unwrap();
        std::fs::remove_file(sandbox.join("etc/removed")).unwrap();
        std::fs::remove_dir_all(sandbox.join("gone-dir")).unwrap();
        std::fs::remove_dir_all(sandbox.join("kind")).unwrap();
        std::fs::write(sandbox.join("kind"), "now a file").unwrap();
        std::fs::create_dir_all(sandbox.join("home/user")).unwrap();
        std::fs::write(sandbox.join("home/user/notes"), "mine").unwrap();
        symlink("../etc/kept", sandbox.join("home/user/link")).unwrap();
        std::fs::create_dir(sandbox.join(OWN)).unwrap();
        std::fs::write(sandbox.join(OWN).join("door"), "runtime's").unwrap();

        let mut stream = Vec::new();
        save(&sandbox, since, &mut stream).unwrap();
        // Unchanged files are not in the stream, only in its list.
        let names: Vec<String> = tar::Archive::new(stream.as_slice())
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert!(!names.contains(&"etc/kept".to_string()), "{names:?}");
        assert!(names.contains(&"usr/bin/tool".to_string()), "{names:?}");
        assert!(names.contains(&"etc/changed".to_string()), "{names:?}");
        assert!(
            !names.iter().any(|n| n.starts_with(OWN) && n != PATHS),
            "{names:?}"
        );

        let fresh = base.path().join("fresh");
        make_template(&fresh);
        load(&fresh, stream.as_slice()).unwrap();
        let mut want = tree(&sandbox);
        want.retain(|(p, _)| !p.starts_with(OWN));
        assert_eq!(tree(&fresh), want);
    }

    #[test]
    fn a_stream_cannot_write_outside_the_root() {
        let base = tempfile::tempdir().unwrap();
        let mut raw = Vec::new();
        {
            let mut tar = tar::Builder::new(&mut raw);
            let mut h = tar::Header::new_gnu();
            h.set_size(1);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            // Written byte by byte: the tar crate refuses to build such a name itself.
            let name = b"../escaped";
            h.as_old_mut().name[..name.len()].copy_from_slice(name);
            h.set_cksum();
            tar.append(&h, &b"x"[..]).unwrap();
            tar.finish().unwrap();
        }
        let root = base.path().join("root");
        std::fs::create_dir(&root).unwrap();
        assert!(load(&root, raw.as_slice()).is_err());
        assert!(!base.path().join("escaped").exists());
    }

    #[test]
    fn only_the_sandboxs_own_tmp_is_kept_among_mounts() {
        let info = "10 10 0:10 / / rw - overlay none rw\n\
                    11 10 0:6 / /dev rw - tmpfs none rw\n\
                    22 10 0:22 / /tmp rw - tmpfs none rw\n\
                    30 10 0:30 / /mnt/vol rw - 9p none rw\n";
        let skip = foreign_mounts(info);
        assert!(skip.contains(Path::new("/dev")) && skip.contains(Path::new("/mnt/vol")));
        assert!(!skip.contains(Path::new("/tmp")) && !skip.contains(Path::new("/")));
    }
}
