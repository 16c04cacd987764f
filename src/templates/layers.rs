//! Layers: immutable directories in overlay upper format that templates stack over a root.
//!
//! A build step runs over an overlay (mounted with `userxattr`) whose upper directory then
//! holds exactly what the step changed. Keeping that upper as a layer, instead of copying the
//! whole root again, makes a step cost what it wrote. Layers keep the overlay's own encoding
//! (whiteouts are character devices 0:0, opaque directories carry `user.overlay.opaque=y`) so
//! that they can be stacked again as overlay lower directories; [`flatten`] turns a stack into
//! one plain tree for runtimes that cannot mount an overlay (gVisor). With `userxattr` the
//! kernel writes neither directory redirects nor metadata-only copies, so whiteouts and opaque
//! directories are all the encoding there is to apply.
//!
//! An upper directory is written by a hostile sandbox, so nothing here follows a symlink in
//! it: entries are examined with `lstat`, files are opened with `O_NOFOLLOW` and checked to be
//! the regular file that was examined, symlinks are copied as symlinks. Paths are used, not
//! directory descriptors, so the upper must be quiescent (its sandbox stopped) while it is
//! read, and a tree deeper than `PATH_MAX` fails with an error instead of being copied. Walks
//! use an explicit stack: a hostile tree can be deep enough to overflow a thread's stack.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{self, Metadata};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{
    DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt, lchown, symlink,
};
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::sys::stat::{Mode, SFlag, UtimensatFlags, mknod, utimensat};
use nix::sys::time::TimeSpec;

/// Marks a directory whose lower contents the overlay hides.
const OPAQUE: &std::ffi::CStr = c"user.overlay.opaque";
/// The overlay's own attributes: meaningful in a layer, meaningless in a flattened tree.
const OVERLAY_PREFIX: &[u8] = b"user.overlay.";

/// Adds what was being done, and to which path, to an error that would otherwise name neither.
fn ctx(what: &'static str, p: &Path) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what} {}: {e}", p.display()))
}

/// `base/rel`, without the trailing slash `join("")` would add (which makes `lstat` follow a
/// symlink).
fn at(base: &Path, rel: &Path) -> PathBuf {
    if rel.as_os_str().is_empty() {
        base.to_path_buf()
    } else {
        base.join(rel)
    }
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

/// Whether `rel` is one of the skipped paths or lies below one (component-wise, so `etc/hosts`
/// does not skip `etc/hostsfoo`).
fn is_skipped(rel: &Path, skip: &[&str]) -> bool {
    !rel.as_os_str().is_empty() && skip_paths(skip).any(|s| rel.starts_with(s))
}

/// The skipped paths, relative even when written with a leading slash.
fn skip_paths<'a>(skip: &'a [&str]) -> impl Iterator<Item = &'a Path> {
    let paths = skip.iter().map(|s| Path::new(s.trim_matches('/')));
    paths.filter(|p| !p.as_os_str().is_empty())
}

fn is_whiteout(meta: &Metadata) -> bool {
    meta.file_type().is_char_device() && meta.rdev() == 0
}

/// Runs a size-query-then-fill xattr call, retrying when the value grew in between.
fn xattr_buf(mut call: impl FnMut(*mut libc::c_void, usize) -> isize) -> io::Result<Vec<u8>> {
    loop {
        let n = call(std::ptr::null_mut(), 0);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; n as usize];
        let got = call(buf.as_mut_ptr().cast(), buf.len());
        if got >= 0 {
            buf.truncate(got as usize);
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e);
        }
    }
}

/// The xattrs worth keeping on `p` (not following a symlink): the `user.` namespace (the
/// overlay's own ones only when `overlay` is set) and file capabilities. Host root reads a
/// sandbox's capabilities in their namespaced (v3) form, which names the sandbox's root id, so
/// the copy grants nothing on the host. A file system without xattrs has none to keep.
fn xattrs(p: &Path, overlay: bool) -> io::Result<Vec<(CString, Vec<u8>)>> {
    let c = cpath(p)?;
    // SAFETY: `c` is a NUL-terminated path; the buffer pointer and length come from xattr_buf.
    let names = match xattr_buf(|b, n| unsafe { libc::llistxattr(c.as_ptr(), b.cast(), n) }) {
        Ok(names) => names,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let wanted = (name.starts_with(b"user.") && (overlay || !name.starts_with(OVERLAY_PREFIX)))
            || name == b"security.capability";
        if !wanted {
            continue;
        }
        let name = CString::new(name).map_err(|_| io::Error::other("xattr name with NUL"))?;
        // SAFETY: as above; `name` is NUL-terminated.
        match xattr_buf(|b, n| unsafe { libc::lgetxattr(c.as_ptr(), name.as_ptr(), b, n) }) {
            Ok(v) => out.push((name, v)),
            // Removed since it was listed.
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

fn set_xattr(p: &Path, name: &std::ffi::CStr, value: &[u8]) -> io::Result<()> {
    let (c, v) = (cpath(p)?, value.as_ptr().cast());
    // SAFETY: both strings are NUL-terminated and `v` points to `value.len()` bytes.
    let rc = unsafe { libc::lsetxattr(c.as_ptr(), name.as_ptr(), v, value.len(), 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn is_opaque(p: &Path) -> io::Result<bool> {
    let c = cpath(p)?;
    // SAFETY: both strings are NUL-terminated; the buffer comes from xattr_buf. A missing
    // attribute (or none supported) reads as not opaque.
    let v = xattr_buf(|b, n| unsafe { libc::lgetxattr(c.as_ptr(), OPAQUE.as_ptr(), b, n) });
    Ok(v.is_ok_and(|v| v == b"y"))
}

/// Copies single entries; shared by [`commit`] and [`flatten`] so that both keep exactly the
/// same things.
struct Copier {
    /// Whether the overlay's own xattrs are kept (in a layer) or dropped (in a flat tree).
    overlay: bool,
    /// First copy of each source inode with several links, to link the others to it.
    links: HashMap<(u64, u64), PathBuf>,
    /// Bytes allocated for what was written.
    bytes: u64,
}

impl Copier {
    /// Creates `dst` like `src` (described by `meta`) and gives it its attributes; a
    /// directory is created empty and owner-writable, so that it can be filled even when its
    /// final mode is read-only, and gets its attributes from `finish` once filled.
    fn copy(&mut self, src: &Path, meta: &Metadata, dst: &Path) -> io::Result<()> {
        let ft = meta.file_type();
        if ft.is_dir() {
            return fs::DirBuilder::new()
                .mode(0o700)
                .create(dst)
                .map_err(ctx("creating", dst));
        }
        let inode = (meta.dev(), meta.ino());
        if ft.is_file() && meta.nlink() > 1 {
            if let Some(first) = self.links.get(&inode) {
                // One inode: its attributes were set with the first copy.
                return fs::hard_link(first, dst).map_err(ctx("linking", dst));
            }
            self.links.insert(inode, dst.to_path_buf());
        }
        if ft.is_file() {
            copy_content(src, meta, dst)?;
        } else if ft.is_symlink() {
            // readlink never follows: the target is copied as text, never resolved.
            let target = fs::read_link(src).map_err(ctx("reading", src))?;
            symlink(target, dst).map_err(ctx("creating", dst))?;
        } else if is_whiteout(meta) {
            mknod(dst, SFlag::S_IFCHR, Mode::empty(), 0)
                .map_err(io::Error::from)
                .map_err(ctx("creating a whiteout", dst))?;
        } else {
            // Sockets, fifos and devices are the running sandbox's, not part of what it made
            // (and a device node would be a way out of it).
            tracing::debug!(path = %src.display(), "not copying a special file");
            return Ok(());
        }
        self.finish(src, meta, dst)
    }

    /// Owner, mode, xattrs and times, in the order that keeps each: chown clears setuid,
    /// setgid and file capabilities, and writing contents changes a directory's mtime.
    fn finish(&mut self, src: &Path, meta: &Metadata, dst: &Path) -> io::Result<()> {
        lchown(dst, Some(meta.uid()), Some(meta.gid())).map_err(ctx("chowning", dst))?;
        if !meta.file_type().is_symlink() {
            // A symlink's mode means nothing on Linux, and chmod would follow it.
            fs::set_permissions(dst, fs::Permissions::from_mode(meta.mode() & 0o7777))
                .map_err(ctx("chmoding", dst))?;
        }
        for (name, value) in xattrs(src, self.overlay).map_err(ctx("reading xattrs of", src))? {
            set_xattr(dst, &name, &value).map_err(ctx("setting xattrs on", dst))?;
        }
        let atime = TimeSpec::new(meta.atime(), meta.atime_nsec());
        let mtime = TimeSpec::new(meta.mtime(), meta.mtime_nsec());
        let nofollow = UtimensatFlags::NoFollowSymlink;
        utimensat(nix::fcntl::AT_FDCWD, dst, &atime, &mtime, nofollow)
            .map_err(io::Error::from)
            .map_err(ctx("setting times of", dst))?;
        let written = fs::symlink_metadata(dst).map_err(ctx("examining", dst))?;
        self.bytes += written.blocks() * 512;
        Ok(())
    }
}

/// Copies a regular file's contents without following a symlink, and only if what was
/// opened is the file `meta` describes (not something swapped in since).
fn copy_content(src: &Path, meta: &Metadata, dst: &Path) -> io::Result<()> {
    // O_NONBLOCK: should a fifo have been swapped in, opening it must not hang.
    let mut from = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(src)
        .map_err(ctx("opening", src))?;
    let opened = from.metadata().map_err(ctx("examining", src))?;
    if !opened.is_file() || (opened.dev(), opened.ino()) != (meta.dev(), meta.ino()) {
        let msg = format!("{} changed while being copied", src.display());
        return Err(io::Error::other(msg));
    }
    let mut to = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dst)
        .map_err(ctx("creating", dst))?;
    // std::io::copy uses copy_file_range between files (a reflink where supported).
    io::copy(&mut from, &mut to).map_err(ctx("copying", src))?;
    Ok(())
}

/// A step of a walk: an entry to visit, or a directory whose contents are all done.
enum Step {
    Enter(PathBuf),
    Leave(PathBuf, Metadata),
}

/// Pushes the children of the directory `dir` (at `rel`), after the step that finishes it.
fn push_children(stack: &mut Vec<Step>, dir: &Path, rel: &Path, meta: Metadata) -> io::Result<()> {
    stack.push(Step::Leave(rel.to_path_buf(), meta));
    for e in fs::read_dir(dir).map_err(ctx("listing", dir))? {
        stack.push(Step::Enter(
            rel.join(e.map_err(ctx("listing", dir))?.file_name()),
        ));
    }
    Ok(())
}

/// Removes whatever is at `path` (a directory with its contents; a symlink, not its target).
/// Missing is not an error.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let mut stack = vec![(path.to_path_buf(), false)];
    while let Some((p, emptied)) = stack.pop() {
        if emptied {
            fs::remove_dir(&p).map_err(ctx("removing", &p))?;
            continue;
        }
        let meta = match fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(ctx("examining", &p)(e)),
        };
        if meta.is_dir() {
            stack.push((p.clone(), true));
            for e in fs::read_dir(&p).map_err(ctx("listing", &p))? {
                stack.push((e.map_err(ctx("listing", &p))?.path(), false));
            }
        } else {
            fs::remove_file(&p).map_err(ctx("removing", &p))?;
        }
    }
    Ok(())
}

/// Copies the upper directory `upper` into the new directory `dest` (which must not exist),
/// leaving out the `skip` paths (relative, like `etc/hostname`) and everything below them, and
/// returns the bytes the layer occupies. On an error, nothing of `dest` is left.
pub fn commit(upper: &Path, dest: &Path, skip: &[&str]) -> io::Result<u64> {
    let top = fs::symlink_metadata(upper).map_err(ctx("examining", upper))?;
    if !top.is_dir() {
        let msg = format!("{} is not a directory", upper.display());
        return Err(io::Error::new(io::ErrorKind::NotADirectory, msg));
    }
    // Fails if `dest` exists, which then is someone else's and stays as it is.
    fs::create_dir(dest).map_err(ctx("creating", dest))?;
    let copied = merge(upper, dest, skip, false);
    if copied.is_err()
        && let Err(e) = remove_tree(dest)
    {
        tracing::warn!(path = %dest.display(), "removing a partial layer: {e}");
    }
    copied
}

/// Whether `upper` holds nothing but the `skip` paths, and directories that are there only to
/// hold them (the overlay copies a file's parents up with it), so that a step that wrote
/// nothing adds no layer. Any other directory counts, even empty: `mkdir /data` is a change,
/// and so is an opaque directory.
pub fn is_empty(upper: &Path, skip: &[&str]) -> io::Result<bool> {
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        if is_skipped(&rel, skip) {
            continue;
        }
        let p = at(upper, &rel);
        let meta = fs::symlink_metadata(&p).map_err(ctx("examining", &p))?;
        let on_the_way =
            rel.as_os_str().is_empty() || skip_paths(skip).any(|s| s.starts_with(&rel));
        if !meta.is_dir() || !on_the_way || is_opaque(&p)? {
            return Ok(false);
        }
        for e in fs::read_dir(&p).map_err(ctx("listing", &p))? {
            stack.push(rel.join(e.map_err(ctx("listing", &p))?.file_name()));
        }
    }
    Ok(true)
}

/// Makes `dest` (which must not exist) the plain tree an overlay of `layers_bottom_up` (the
/// last on top) over `root` would show. On an error, nothing of `dest` is left.
pub fn flatten(root: &Path, layers_bottom_up: &[PathBuf], dest: &Path) -> io::Result<()> {
    if fs::symlink_metadata(dest).is_ok() {
        let msg = format!("{} already exists", dest.display());
        return Err(io::Error::new(io::ErrorKind::AlreadyExists, msg));
    }
    let made = (|| {
        // The root is trusted (built here); cp keeps hard links and shares extents.
        let out = Command::new("cp")
            .args(["-a", "--reflink=auto"])
            .arg(root)
            .arg(dest)
            .output()
            .map_err(ctx("running cp for", root))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let msg = format!("copying {}: {}", root.display(), err.trim());
            return Err(io::Error::other(msg));
        }
        for layer in layers_bottom_up {
            merge(layer, dest, &[], true)?;
        }
        Ok(())
    })();
    if made.is_err()
        && let Err(e) = remove_tree(dest)
    {
        tracing::warn!(path = %dest.display(), "removing a partial copy: {e}");
    }
    made
}

/// Copies the tree `src` onto the directory `dest` with the overlay's rules: an entry replaces
/// whatever `dest` has at its path, except that directories merge. When `flat`, the overlay's
/// encoding is applied rather than kept: a whiteout removes instead of being copied, an opaque
/// directory first empties its counterpart, and `user.overlay.*` xattrs are not copied.
/// Every directory on the way to an entry is made a real directory before the entry is
/// written, so no write goes through a symlink in `dest`. Returns the bytes written.
fn merge(src_root: &Path, dest: &Path, skip: &[&str], flat: bool) -> io::Result<u64> {
    let mut copier = Copier {
        overlay: !flat,
        links: HashMap::new(),
        bytes: 0,
    };
    let mut stack = vec![Step::Enter(PathBuf::new())];
    while let Some(step) = stack.pop() {
        let rel = match step {
            Step::Leave(rel, meta) => {
                copier.finish(&at(src_root, &rel), &meta, &at(dest, &rel))?;
                continue;
            }
            Step::Enter(rel) if is_skipped(&rel, skip) => continue,
            Step::Enter(rel) => rel,
        };
        let (src, dst) = (at(src_root, &rel), at(dest, &rel));
        let meta = fs::symlink_metadata(&src).map_err(ctx("examining", &src))?;
        if flat && is_whiteout(&meta) {
            remove_tree(&dst)?;
        } else if meta.is_dir() {
            match fs::symlink_metadata(&dst) {
                // Lower contents an opaque directory hides go; the layer's are merged in.
                Ok(d) if d.is_dir() && flat && is_opaque(&src)? => {
                    for e in fs::read_dir(&dst).map_err(ctx("listing", &dst))? {
                        remove_tree(&e.map_err(ctx("listing", &dst))?.path())?;
                    }
                }
                Ok(d) if d.is_dir() => {}
                // A directory hides whatever else (a file, a symlink) was there.
                Ok(_) => {
                    remove_tree(&dst)?;
                    copier.copy(&src, &meta, &dst)?;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => copier.copy(&src, &meta, &dst)?,
                Err(e) => return Err(ctx("examining", &dst)(e)),
            }
            push_children(&mut stack, &src, &rel, meta)?;
        } else {
            remove_tree(&dst)?;
            copier.copy(&src, &meta, &dst)?;
        }
    }
    Ok(copier.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_or_skip(test: &str) -> bool {
        let root = nix::unistd::geteuid().is_root();
        if !root {
            eprintln!("{test}: skipped, needs root (mknod, chown)");
        }
        root
    }

    fn xattr_set(p: &Path, name: &str, value: &[u8]) {
        set_xattr(p, &CString::new(name).unwrap(), value).unwrap();
    }

    /// The value of an xattr, empty when there is none.
    fn xattr(p: &Path, name: &str) -> Vec<u8> {
        let want = CString::new(name).unwrap();
        let mut all = xattrs(p, true).unwrap().into_iter();
        all.find(|(n, _)| *n == want)
            .map(|(_, v)| v)
            .unwrap_or_default()
    }

    fn set_mtime(p: &Path, secs: i64) {
        let t = TimeSpec::new(secs, 0);
        let flag = UtimensatFlags::NoFollowSymlink;
        utimensat(nix::fcntl::AT_FDCWD, p, &t, &t, flag).unwrap();
    }

    fn whiteout(p: &Path) {
        mknod(p, SFlag::S_IFCHR, Mode::empty(), 0).unwrap();
    }

    fn own(p: &Path, uid: u32, gid: u32, mode: u32) {
        lchown(p, Some(uid), Some(gid)).unwrap();
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Owner, group, mode and mtime.
    fn attrs(p: &Path) -> (u32, u32, u32, i64) {
        let m = fs::symlink_metadata(p).unwrap();
        (m.uid(), m.gid(), m.mode() & 0o7777, m.mtime())
    }

    fn lmeta(p: &Path) -> Metadata {
        fs::symlink_metadata(p).unwrap()
    }

    fn exists(p: &Path) -> bool {
        fs::symlink_metadata(p).is_ok()
    }

    fn mkdirs(base: &Path, dirs: &str) {
        for d in dirs.split(' ') {
            fs::create_dir_all(base.join(d)).unwrap();
        }
    }

    fn write_all(base: &Path, files: &str, content: &str) {
        for f in files.split(' ') {
            fs::write(base.join(f), content).unwrap();
        }
    }

    const SKIP: &[&str] = &["tmp/.e2b-build", "etc/hostname", "/etc/hosts"];

    #[test]
    fn commit_keeps_what_an_upper_holds_and_nothing_else() {
        if !root_or_skip("commit_keeps_what_an_upper_holds_and_nothing_else") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let up = tmp.path().join("upper");
        mkdirs(&up, "dir opq tmp/.e2b-build etc");
        write_all(&up, "dir/suid h1 tmp/.e2b-build/x", "x");
        write_all(&up, "etc/hostname etc/hosts etc/hostsx", "x");
        own(&up.join("dir/suid"), 1234, 5678, 0o4755);
        // File capabilities (v2: effective, cap_net_bind_service) must survive the chown.
        let caps = [1u8, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        xattr_set(&up.join("dir/suid"), "security.capability", &caps);
        set_mtime(&up.join("dir/suid"), 1_000_000);
        fs::hard_link(up.join("h1"), up.join("dir/h2")).unwrap();
        symlink("/etc/passwd", up.join("passwd")).unwrap();
        symlink("/etc", up.join("etc-link")).unwrap();
        set_mtime(&up.join("passwd"), 2_000_000);
        whiteout(&up.join("gone"));
        xattr_set(&up.join("opq"), "user.overlay.opaque", b"y");
        xattr_set(&up.join("opq"), "user.note", b"kept");
        nix::unistd::mkfifo(&up.join("fifo"), Mode::S_IRUSR).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(up.join("sock")).unwrap();
        let null = nix::sys::stat::makedev(1, 3);
        mknod(&up.join("null"), SFlag::S_IFCHR, Mode::S_IRUSR, null).unwrap();
        // Read-only, and filled all the same.
        own(&up.join("dir"), 1000, 1000, 0o555);
        set_mtime(&up.join("dir"), 3_000_000);

        let dest = tmp.path().join("layer");
        let d = |p: &str| dest.join(p);
        assert!(commit(&up, &dest, SKIP).unwrap() > 0);
        assert_eq!(attrs(&d("dir/suid")), (1234, 5678, 0o4755, 1_000_000));
        assert_eq!(xattr(&d("dir/suid"), "security.capability"), caps);
        assert_eq!(attrs(&d("dir")), (1000, 1000, 0o555, 3_000_000));
        let (h1, h2) = (lmeta(&d("h1")), lmeta(&d("dir/h2")));
        assert_eq!((h1.ino(), h1.nlink()), (h2.ino(), 2));
        // Symlinks stay symlinks: neither the file nor the directory they name is copied.
        let link = fs::read_link(d("passwd")).unwrap();
        assert_eq!(link, Path::new("/etc/passwd"));
        assert_eq!(attrs(&d("passwd")).3, 2_000_000);
        assert!(lmeta(&d("etc-link")).file_type().is_symlink());
        assert!(is_whiteout(&lmeta(&d("gone"))));
        assert_eq!(xattr(&d("opq"), "user.overlay.opaque"), b"y");
        assert_eq!(xattr(&d("opq"), "user.note"), b"kept");
        for gone in "fifo sock null tmp/.e2b-build etc/hostname etc/hosts".split(' ') {
            assert!(!exists(&d(gone)), "{gone} was copied");
        }
        assert!(d("tmp").is_dir() && d("etc/hostsx").is_file());

        // An existing destination is refused and left alone.
        let err = commit(&up, &dest, SKIP).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert!(d("h1").is_file());
    }

    #[test]
    fn is_empty_ignores_only_skipped_paths_and_their_parents() {
        let tmp = tempfile::tempdir().unwrap();
        let up = tmp.path().join("upper");
        fs::create_dir(&up).unwrap();
        assert!(is_empty(&up, SKIP).unwrap());
        fs::create_dir_all(up.join("tmp/.e2b-build/sub")).unwrap();
        fs::create_dir(up.join("etc")).unwrap();
        write_all(&up, "etc/hostname etc/hosts", "x");
        assert!(is_empty(&up, SKIP).unwrap());
        fs::create_dir(up.join("data")).unwrap();
        assert!(!is_empty(&up, SKIP).unwrap(), "a new directory is a change");
        fs::remove_dir(up.join("data")).unwrap();
        write_all(&up, "etc/passwd", "x");
        assert!(!is_empty(&up, SKIP).unwrap());
        fs::remove_file(up.join("etc/passwd")).unwrap();
        xattr_set(&up.join("etc"), "user.overlay.opaque", b"y");
        assert!(!is_empty(&up, SKIP).unwrap(), "opaque directory");
    }

    #[test]
    fn flatten_shows_what_an_overlay_would() {
        if !root_or_skip("flatten_shows_what_an_overlay_would") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let (root, l1, l2) = (t.join("r"), t.join("l1"), t.join("l2"));
        mkdirs(&root, "deldir/a opq f2d both");
        write_all(&root, "keep delme deldir/a/b opq/old", "root");
        write_all(&root, "f2d/x d2f s2f both/old", "root");
        mkdirs(&l1, "opq d2f both");
        fs::create_dir(&l2).unwrap();
        whiteout(&l1.join("delme"));
        whiteout(&l1.join("deldir"));
        xattr_set(&l1.join("opq"), "user.overlay.opaque", b"y");
        xattr_set(&l1.join("opq"), "user.note", b"kept");
        write_all(&l1, "opq/new f2d d2f/inner both/upper added", "l1");
        symlink("keep", l1.join("s2f")).unwrap();
        own(&l1.join("both/upper"), 1234, 5678, 0o4755);
        own(&l1.join("both"), 4321, 4321, 0o750);
        set_mtime(&l1.join("both"), 3_000_000);
        // The top layer removes what the one below added.
        whiteout(&l2.join("added"));

        let dest = tmp.path().join("flat");
        flatten(&root, &[l1.clone(), l2], &dest).unwrap();
        let d = |p: &str| dest.join(p);
        let read = |p: &str| fs::read_to_string(dest.join(p)).unwrap();
        assert_eq!([read("keep"), read("both/old")], ["root"; 2]);
        assert!(!exists(&d("delme")) && !exists(&d("deldir")) && !exists(&d("added")));
        assert!(read("opq/new") == "l1" && !exists(&d("opq/old")));
        assert_eq!(xattr(&d("opq"), "user.overlay.opaque"), b"");
        assert_eq!(xattr(&d("opq"), "user.note"), b"kept");
        assert_eq!([read("f2d"), read("d2f/inner")], ["l1"; 2]);
        assert_eq!(fs::read_link(d("s2f")).unwrap(), Path::new("keep"));
        assert_eq!(attrs(&d("both")), (4321, 4321, 0o750, 3_000_000));
        let u = attrs(&d("both/upper"));
        assert_eq!((u.0, u.1, u.2), (1234, 5678, 0o4755));
        for e in fs::read_dir(&dest).unwrap() {
            assert!(!lmeta(&e.unwrap().path()).file_type().is_char_device());
        }

        // An existing destination is refused and kept; a failed flatten leaves nothing.
        assert!(flatten(&root, &[], &dest).is_err());
        assert_eq!(read("keep"), "root");
        assert!(flatten(&tmp.path().join("missing"), &[l1], &d("bad")).is_err());
        assert!(!exists(&d("bad")));
    }

    /// 1900 levels: deep enough to matter for a recursive walk, yet within PATH_MAX, which
    /// path-based walks need (3000 one-letter levels would not be). A destination with a longer
    /// prefix passes PATH_MAX midway: that commit fails, and leaves nothing.
    #[test]
    fn deep_trees_are_walked_without_recursion() {
        let tmp = tempfile::tempdir().unwrap();
        let up = tmp.path().join("u");
        let rel: PathBuf = std::iter::repeat_n("d", 1900).collect();
        fs::create_dir_all(up.join(&rel)).unwrap();
        fs::write(up.join(&rel).join("f"), b"bottom").unwrap();
        let (layer, flat) = (tmp.path().join("l"), tmp.path().join("f"));
        commit(&up, &layer, &[]).unwrap();
        assert!(!is_empty(&layer, &[]).unwrap());
        flatten(&up, std::slice::from_ref(&layer), &flat).unwrap();
        assert_eq!(fs::read(flat.join(&rel).join("f")).unwrap(), b"bottom");

        let long = tmp.path().join("x".repeat(200)).join("y".repeat(200));
        fs::create_dir_all(&long).unwrap();
        let err = commit(&up, &long.join("l"), &[]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidFilename);
        assert!(!exists(&long.join("l")));
        for t in [&up, &layer, &flat] {
            remove_tree(t).unwrap();
        }
    }
}
