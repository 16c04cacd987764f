//! Path resolution as envd does it: an empty path is the default workdir, `~` is the user's
//! home, a relative path is relative to the home (not to envd's cwd), absolute paths are kept.

use std::path::{Path, PathBuf};

/// Why a path cannot be used. The message is what the caller sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path contains a NUL byte")]
    Nul,
    #[error("failed to expand path '{0}': cannot expand user-specific home dir")]
    OtherHome(String),
}

/// Lexical cleaning with the rules of Go's `filepath.Clean` (which envd's results carry):
/// repeated and trailing slashes go, `.` goes, `..` eats the element before it and cannot
/// climb above `/`; an empty result is `.`.
pub fn clean(path: &str) -> String {
    if path.is_empty() {
        return ".".into();
    }
    let rooted = path.starts_with('/');
    let mut out: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if out.last().is_some_and(|p| *p != "..") {
                    out.pop();
                } else if !rooted {
                    out.push("..");
                }
            }
            p => out.push(p),
        }
    }
    let joined = out.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".into(),
        (false, false) => joined,
    }
}

/// Resolves a request's path for `home` (the selected user's) and the sandbox's default
/// workdir.
pub fn resolve(
    path: &str,
    home: &Path,
    default_workdir: Option<&Path>,
) -> Result<PathBuf, PathError> {
    if path.contains('\0') {
        return Err(PathError::Nul);
    }
    let owned;
    let path = if path.is_empty() {
        match default_workdir {
            Some(w) => {
                owned = w.to_string_lossy().into_owned();
                owned.as_str()
            }
            None => "",
        }
    } else {
        path
    };
    let home = home.to_string_lossy();
    let expanded = if let Some(rest) = path.strip_prefix('~') {
        if !rest.is_empty() && !rest.starts_with('/') {
            return Err(PathError::OtherHome(path.to_string()));
        }
        clean(&format!("{home}/{rest}"))
    } else {
        path.to_string()
    };
    if expanded.starts_with('/') {
        return Ok(PathBuf::from(expanded));
    }
    Ok(PathBuf::from(clean(&format!("{home}/{expanded}"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleans_like_go() {
        for (i, want) in [
            ("", "."),
            ("/", "/"),
            ("//a//b/", "/a/b"),
            ("/a/./b/../c", "/a/c"),
            ("/../..", "/"),
            ("a/../..", ".."),
            ("../a/./b", "../a/b"),
            ("a/b/..", "a"),
            (".", "."),
        ] {
            assert_eq!(clean(i), want, "clean({i:?})");
        }
    }

    #[test]
    fn resolves_relative_to_home_and_workdir() {
        let home = Path::new("/home/user");
        let r = |p: &str, w: Option<&str>| resolve(p, home, w.map(Path::new));
        assert_eq!(r("", None).unwrap(), PathBuf::from("/home/user"));
        assert_eq!(r("", Some("/work")).unwrap(), PathBuf::from("/work"));
        assert_eq!(
            r("a/b", Some("/work")).unwrap(),
            PathBuf::from("/home/user/a/b")
        );
        assert_eq!(r("../x", None).unwrap(), PathBuf::from("/home/x"));
        assert_eq!(r("~", None).unwrap(), PathBuf::from("/home/user"));
        assert_eq!(
            r("~/f.txt", None).unwrap(),
            PathBuf::from("/home/user/f.txt")
        );
        // Absolute paths are taken as given, as envd does.
        assert_eq!(
            r("/tmp/../etc", None).unwrap(),
            PathBuf::from("/tmp/../etc")
        );
        assert_eq!(
            r("~root/x", None),
            Err(PathError::OtherHome("~root/x".into()))
        );
        assert_eq!(r("/tmp/a\0b", None), Err(PathError::Nul));
    }
}
