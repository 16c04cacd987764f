//! File-system helpers shared by the node and the gateway: atomic writes, tree copies and sizes,
//! and secret files.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Replaces `path` with `bytes` so that a reader (or a crash) sees the old or the new content,
/// never a mix. A failed write (a full disk, say) leaves `path` as it was and removes its
/// temporary file, which would otherwise keep the space it took.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        // On a full disk a delayed allocation can fail only here, so this is part of the write.
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if let Ok(d) = fs::File::open(dir) {
        // Makes the rename itself durable; not every file system supports syncing a directory.
        let _ = d.sync_all();
    }
    Ok(())
}

/// Copies a directory tree (files, directories, symlinks, permissions) and returns the bytes
/// copied. `dst` must not exist yet.
pub fn copy_tree(src: &Path, dst: &Path) -> io::Result<u64> {
    let meta = fs::symlink_metadata(src)?;
    fs::create_dir(dst)?;
    fs::set_permissions(dst, meta.permissions())?;
    let mut total = 0;
    for entry in fs::read_dir(src)? {
        let entry = entry?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let ty = entry.file_type()?;
        if ty.is_dir() {
            total += copy_tree(&from, &to)?;
        } else if ty.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&from)?, &to)?;
        } else if ty.is_file() {
            total += fs::copy(&from, &to)?;
        }
        // Sockets, fifos and devices are runtime artefacts of the instance, not its state.
    }
    Ok(total)
}

/// Bytes a tree occupies on disk (allocated blocks), not following symlinks.
pub fn tree_disk_usage(path: &Path) -> io::Result<u64> {
    let meta = fs::symlink_metadata(path)?;
    let mut total = meta.blocks() * 512;
    if meta.is_dir() {
        for entry in fs::read_dir(path)? {
            let entry = entry?;
            match tree_disk_usage(&entry.path()) {
                Ok(n) => total += n,
                // A file removed while we walk is not an error for a measurement.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(total)
}

/// Total capacity of the file system holding `path`.
pub fn filesystem_capacity(path: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a valid NUL-terminated path and `st` is a valid out-pointer.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled the struct.
    let st = unsafe { st.assume_init() };
    // The field types differ between platforms (u32 on some 32-bit targets).
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_blocks as u64 * st.f_frsize as u64)
}

/// Bytes an unprivileged writer may still write on the file system holding `path`.
pub fn filesystem_free(path: &Path) -> io::Result<u64> {
    let st = nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?;
    Ok(st.blocks_available() * st.fragment_size())
}

/// Reads a secret from `path`, or creates it (mode 0600) with `generate()` when the file does
/// not exist. Returns the secret and whether it was created.
pub fn load_or_create_secret(
    path: &Path,
    generate: impl FnOnce() -> String,
) -> io::Result<(String, bool)> {
    match fs::read_to_string(path) {
        Ok(s) => {
            let s = s.trim().to_string();
            if s.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} is empty", path.display()),
                ));
            }
            Ok((s, false))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir)?;
            }
            let secret = generate();
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)?;
            f.write_all(secret.as_bytes())?;
            f.write_all(b"\n")?;
            f.sync_all()?;
            fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
            Ok((secret, true))
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_tree_copies_files_links_and_sizes() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        fs::create_dir_all(src.join("a/b")).unwrap();
        fs::write(src.join("a/b/f"), vec![7u8; 10_000]).unwrap();
        fs::write(src.join("top"), b"hi").unwrap();
        std::os::unix::fs::symlink("top", src.join("link")).unwrap();
        let dst = tmp.path().join("dst");
        let n = copy_tree(&src, &dst).unwrap();
        assert_eq!(n, 10_002);
        assert_eq!(fs::read(dst.join("a/b/f")).unwrap().len(), 10_000);
        assert_eq!(fs::read_link(dst.join("link")).unwrap(), Path::new("top"));
        assert!(tree_disk_usage(&dst).unwrap() >= 10_000);
        assert!(copy_tree(&src, &dst).is_err(), "destination must not exist");
    }

    #[test]
    fn atomic_write_and_secret_files() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("index.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        // A write that cannot finish keeps the old content and leaves no temporary file.
        let blocker = tmp.path().join("dir-in-the-way");
        fs::create_dir(&blocker).unwrap();
        fs::write(blocker.join("x"), b"keep").unwrap();
        assert!(write_atomic(&blocker, b"three").is_err());
        assert_eq!(fs::read(blocker.join("x")).unwrap(), b"keep");
        let stray: Vec<_> = fs::read_dir(tmp.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
            .collect();
        assert!(stray.is_empty(), "temporary files left: {stray:?}");
        let s = tmp.path().join("sub/token");
        let (a, created) = load_or_create_secret(&s, || "abc".into()).unwrap();
        assert!(created);
        let (b, created) = load_or_create_secret(&s, || "other".into()).unwrap();
        assert!(!created);
        assert_eq!(a, b);
        assert_eq!(
            fs::metadata(&s).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
