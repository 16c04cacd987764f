//! `EntryInfo` as envd fills it: `lstat` for the entry itself, the target's type and permission
//! bits for a symbolic link (with `is_symlink` set), Go's `FileMode.String()` spelling of the
//! mode, owner and group names from the sandbox's own databases, and the `user.e2b.*` extended
//! attributes as metadata.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::proto::filesystem::{EntryInfo, FileType};
use super::users::UserDb;

/// The xattr namespace of file metadata; keys are stored below it.
pub const METADATA_XATTR_PREFIX: &str = "user.e2b.";
/// Linux caps an xattr name at 255 bytes, prefix included.
pub const MAX_METADATA_KEY_LEN: usize = 255 - METADATA_XATTR_PREFIX.len();
/// ext4 keeps all of an inode's xattrs in one 4 KiB block; larger sets cannot be stored.
pub const MAX_METADATA_TOTAL_LEN: usize = 4096;

/// Go's `os.FileMode.String()` for a raw `st_mode`: one letter per set type or special bit in
/// the order `dalTLDpSugct?`, `-` when none, then `rwxrwxrwx`.
pub fn mode_string(st_mode: u32) -> String {
    let fmt = st_mode & libc::S_IFMT;
    let mut letters = String::new();
    // (letter, whether set) in Go's bit order, mapped from the stat bits Go derives them from.
    let flags = [
        ('d', fmt == libc::S_IFDIR),
        ('L', fmt == libc::S_IFLNK),
        ('D', fmt == libc::S_IFBLK || fmt == libc::S_IFCHR),
        ('p', fmt == libc::S_IFIFO),
        ('S', fmt == libc::S_IFSOCK),
        ('u', st_mode & libc::S_ISUID != 0),
        ('g', st_mode & libc::S_ISGID != 0),
        ('c', fmt == libc::S_IFCHR),
        ('t', st_mode & libc::S_ISVTX != 0),
    ];
    for (c, set) in flags {
        if set {
            letters.push(c);
        }
    }
    if letters.is_empty() {
        letters.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        letters.push(if st_mode & (1 << (8 - i)) != 0 {
            c
        } else {
            '-'
        });
    }
    letters
}

fn file_type(st_mode: u32) -> FileType {
    match st_mode & libc::S_IFMT {
        libc::S_IFREG => FileType::FILE_TYPE_FILE,
        libc::S_IFDIR => FileType::FILE_TYPE_DIRECTORY,
        libc::S_IFLNK => FileType::FILE_TYPE_SYMLINK,
        _ => FileType::FILE_TYPE_UNSPECIFIED,
    }
}

/// The last path element as Go's `filepath.Base` gives it (`/` for the root).
fn base_name(path: &Path) -> String {
    let s = path.to_string_lossy();
    let trimmed = s.trim_end_matches('/');
    match trimmed.rsplit('/').next() {
        Some(last) if !last.is_empty() => last.to_string(),
        _ if s.is_empty() => ".".to_string(),
        _ => "/".to_string(),
    }
}

/// The entry at `path` (not following a final symlink), or the `lstat` error.
pub fn entry_info(path: &Path, db: &UserDb) -> std::io::Result<EntryInfo> {
    let meta = std::fs::symlink_metadata(path)?;
    let st_mode = meta.mode();
    let is_symlink = st_mode & libc::S_IFMT == libc::S_IFLNK;
    let (ty, perm, target) = if is_symlink {
        // Where the link finally leads; the link's own path when that cannot be resolved.
        let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        match std::fs::metadata(&target) {
            Ok(t) => (file_type(t.mode()), t.mode() & 0o777, Some(target)),
            Err(_) => (FileType::FILE_TYPE_UNSPECIFIED, 0, Some(target)),
        }
    } else {
        (file_type(st_mode), st_mode & 0o777, None)
    };
    let modified = buffa_types::google::protobuf::Timestamp {
        seconds: meta.mtime(),
        nanos: meta.mtime_nsec() as i32,
        ..Default::default()
    };
    Ok(EntryInfo {
        name: base_name(path),
        r#type: ty.into(),
        path: path.to_string_lossy().into_owned(),
        size: meta.size() as i64,
        mode: perm,
        permissions: mode_string(st_mode),
        owner: db.uid_name(meta.uid()),
        group: db.gid_name(meta.gid()),
        modified_time: modified.into(),
        symlink_target: target.map(|t| t.to_string_lossy().into_owned()),
        metadata: read_metadata(path).into_iter().collect(),
        is_symlink,
        ..Default::default()
    })
}

fn cpath(path: &Path) -> Option<CString> {
    CString::new(path.as_os_str().as_bytes()).ok()
}

/// The file's `user.e2b.*` attributes, prefix stripped; entries that are not UTF-8 are left
/// out (they could not travel in a proto string map). Filesystems without xattrs have none.
pub fn read_metadata(path: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some(c) = cpath(path) else { return out };
    let mut names = vec![0u8; 4096];
    // SAFETY: the buffer is valid for its length; listxattr writes at most that many bytes.
    let n = unsafe { libc::listxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n <= 0 {
        return out;
    }
    names.truncate(n as usize);
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let Some(key) = name.strip_prefix(METADATA_XATTR_PREFIX.as_bytes()) else {
            continue;
        };
        let Ok(cname) = CString::new(name) else {
            continue;
        };
        let mut value = vec![0u8; 4096];
        // SAFETY: as above, for getxattr's value buffer.
        let m = unsafe {
            libc::getxattr(
                c.as_ptr(),
                cname.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if m < 0 {
            continue;
        }
        value.truncate(m as usize);
        if let (Ok(k), Ok(v)) = (std::str::from_utf8(key), String::from_utf8(value)) {
            out.insert(k.to_string(), v);
        }
    }
    out
}

/// Replaces the `user.e2b.*` attributes of an open file with `metadata` (an overwrite must not
/// keep the previous upload's keys). `Ok(false)` when the filesystem has no xattrs.
pub fn write_metadata(
    fd: &std::fs::File,
    metadata: &BTreeMap<String, String>,
) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let raw = fd.as_raw_fd();
    let mut names = vec![0u8; 4096];
    // SAFETY: the buffer is valid for its length.
    let n = unsafe { libc::flistxattr(raw, names.as_mut_ptr().cast(), names.len()) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENOTSUP) {
            Ok(false)
        } else {
            Err(e)
        };
    }
    names.truncate(n as usize);
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let Some(key) = name.strip_prefix(METADATA_XATTR_PREFIX.as_bytes()) else {
            continue;
        };
        if std::str::from_utf8(key).is_ok_and(|k| metadata.contains_key(k)) {
            continue;
        }
        if let Ok(cname) = CString::new(name) {
            // SAFETY: a valid descriptor and NUL-terminated name.
            unsafe { libc::fremovexattr(raw, cname.as_ptr()) };
        }
    }
    for (k, v) in metadata {
        let Ok(cname) = CString::new(format!("{METADATA_XATTR_PREFIX}{k}")) else {
            continue;
        };
        // SAFETY: a valid descriptor, NUL-terminated name and a value buffer of its length.
        let rc = unsafe { libc::fsetxattr(raw, cname.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENOTSUP) {
                return Ok(false);
            }
            return Err(e);
        }
    }
    Ok(true)
}

/// `X-Metadata-<key>: value` request headers as metadata: keys lowercased, the first value
/// of a repeated header, empty keys dropped.
pub fn metadata_from_headers(headers: &axum::http::HeaderMap) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (name, value) in headers {
        // HeaderName is already lowercase.
        let Some(key) = name.as_str().strip_prefix("x-metadata-") else {
            continue;
        };
        if key.is_empty() || out.contains_key(key) {
            continue;
        }
        out.insert(
            key.to_string(),
            String::from_utf8_lossy(value.as_bytes()).into_owned(),
        );
    }
    out
}

/// Refuses what could not be stored: empty or over-long keys, non-printable ASCII, and sets
/// that do not fit one filesystem block.
pub fn validate_metadata(metadata: &BTreeMap<String, String>) -> Result<(), String> {
    let printable = |s: &str| s.bytes().all(|b| (0x20..=0x7e).contains(&b));
    let mut total = 0;
    for (k, v) in metadata {
        if k.is_empty() {
            return Err("metadata key must not be empty".into());
        }
        if k.len() > MAX_METADATA_KEY_LEN {
            return Err(format!(
                "metadata key {k:?} exceeds {MAX_METADATA_KEY_LEN} bytes"
            ));
        }
        if !printable(k) {
            return Err(format!(
                "metadata key {k:?} contains non-printable-ASCII bytes"
            ));
        }
        if !printable(v) {
            return Err(format!(
                "metadata value for key {k:?} contains non-printable-ASCII bytes"
            ));
        }
        total += METADATA_XATTR_PREFIX.len() + k.len() + v.len();
    }
    if total > MAX_METADATA_TOTAL_LEN {
        return Err(format!(
            "total metadata size {total} exceeds {MAX_METADATA_TOTAL_LEN} bytes"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_strings_match_go() {
        assert_eq!(mode_string(libc::S_IFREG | 0o644), "-rw-r--r--");
        assert_eq!(mode_string(libc::S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(
            mode_string(libc::S_IFDIR | libc::S_ISVTX | 0o777),
            "dtrwxrwxrwx"
        );
        assert_eq!(mode_string(libc::S_IFLNK | 0o777), "Lrwxrwxrwx");
        assert_eq!(
            mode_string(libc::S_IFREG | libc::S_ISUID | 0o755),
            "urwxr-xr-x"
        );
        assert_eq!(mode_string(libc::S_IFCHR | 0o666), "Dcrw-rw-rw-");
        assert_eq!(mode_string(libc::S_IFIFO | 0o600), "prw-------");
        assert_eq!(mode_string(libc::S_IFSOCK | 0o700), "Srwx------");
        assert_eq!(mode_string(libc::S_IFREG), "----------");
    }

    #[test]
    fn metadata_headers_are_lowercased_first_value_wins() {
        let mut h = axum::http::HeaderMap::new();
        h.append("X-Metadata-Author", "first".parse().unwrap());
        h.append("X-Metadata-Author", "second".parse().unwrap());
        h.insert("x-metadata-purpose", "upload".parse().unwrap());
        h.insert("X-Metadata-", "ignored".parse().unwrap());
        h.insert("X-Access-Token", "t".parse().unwrap());
        let m = metadata_from_headers(&h);
        assert_eq!(m.len(), 2);
        assert_eq!(m["author"], "first");
        assert_eq!(m["purpose"], "upload");
    }

    #[test]
    fn metadata_validation() {
        let m = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert!(validate_metadata(&m("a", "b c")).is_ok());
        assert!(validate_metadata(&m("a", "tab\there")).is_err());
        assert!(validate_metadata(&m(&"k".repeat(MAX_METADATA_KEY_LEN + 1), "v")).is_err());
        assert!(validate_metadata(&m("a", &"v".repeat(5000))).is_err());
        assert!(validate_metadata(&BTreeMap::new()).is_ok());
    }

    #[test]
    fn entries_of_files_links_and_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f.txt");
        std::fs::write(&f, b"hello").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        let db = UserDb::from_texts("root:x:0:0::/root:/bin/sh\n", "root:x:0:\n");
        let e = entry_info(&f, &db).unwrap();
        assert_eq!(e.name, "f.txt");
        assert_eq!(e.r#type, FileType::FILE_TYPE_FILE);
        assert_eq!(e.size, 5);
        assert!(!e.is_symlink && e.symlink_target.is_none());
        assert!(e.permissions.starts_with('-'));
        let l = entry_info(&link, &db).unwrap();
        assert!(l.is_symlink);
        assert_eq!(
            l.r#type,
            FileType::FILE_TYPE_FILE,
            "a link reports its target's type"
        );
        assert!(l.permissions.starts_with('L'));
        assert_eq!(
            l.symlink_target.as_deref(),
            Some(std::fs::canonicalize(&f).unwrap().to_str().unwrap())
        );
        let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
        let md = BTreeMap::from([("k".to_string(), "v".to_string())]);
        if write_metadata(&file, &md).unwrap() {
            assert_eq!(read_metadata(&f), md);
            write_metadata(&file, &BTreeMap::new()).unwrap();
            assert!(read_metadata(&f).is_empty(), "an empty set clears old keys");
        }
        assert!(entry_info(&dir.path().join("missing"), &db).is_err());
    }
}
