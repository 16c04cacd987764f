//! Moves a root filesystem's ownership into (and out of) the node's unprivileged id range, so
//! that a file owned by root in the image is owned by the sandbox's root, which is an ordinary
//! host id. Done once per template, never per sandbox.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt, lchown};
use std::path::Path;

use crate::sandbox::spec::IdMap;

/// Direction of a shift.
#[derive(Debug, Clone, Copy)]
pub enum Shift {
    /// Image ids (0..count) to host ids (base..base+count).
    In,
    /// Back again, for tools that run on the tree as host root (apt in a chroot).
    Out,
}

fn moved(id: u32, ids: IdMap, dir: Shift) -> Option<u32> {
    match dir {
        Shift::In => ids.host(id),
        Shift::Out => id.checked_sub(ids.base).filter(|&i| i < ids.count),
    }
}

/// Shifts every entry under `root` (not following symlinks). Ids that do not map (already
/// shifted, or outside the range) are left alone, so the walk can be repeated safely.
pub fn shift_tree(root: &Path, ids: IdMap, dir: Shift) -> io::Result<u64> {
    let mut count = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = fs::symlink_metadata(&path)?;
        let (uid, gid) = (moved(meta.uid(), ids, dir), moved(meta.gid(), ids, dir));
        if uid.is_some() || gid.is_some() {
            lchown(&path, uid.or(Some(meta.uid())), gid.or(Some(meta.gid())))?;
            count += 1;
            // chown clears setuid and setgid bits; put them back.
            if !meta.file_type().is_symlink() && meta.mode() & 0o6000 != 0 {
                fs::set_permissions(&path, fs::Permissions::from_mode(meta.mode() & 0o7777))?;
            }
        }
        if meta.is_dir() {
            for e in fs::read_dir(&path)? {
                stack.push(e?.path());
            }
        }
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_move_both_ways_and_only_once() {
        let ids = IdMap::new(200_000).unwrap();
        assert_eq!(moved(0, ids, Shift::In), Some(200_000));
        assert_eq!(moved(1000, ids, Shift::In), Some(201_000));
        assert_eq!(moved(70_000, ids, Shift::In), None);
        assert_eq!(moved(201_000, ids, Shift::Out), Some(1000));
        assert_eq!(moved(5, ids, Shift::Out), None);
        assert_eq!(moved(300_000, ids, Shift::Out), None);
    }

    #[test]
    fn trees_shift_and_keep_setuid_bits() {
        if !crate::node::runtime::sys::is_root() {
            eprintln!("skipped: chown needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("su");
        fs::write(&f, "x").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o4755)).unwrap();
        std::os::unix::fs::symlink("su", dir.path().join("link")).unwrap();
        let ids = IdMap::new(300_000).unwrap();
        shift_tree(dir.path(), ids, Shift::In).unwrap();
        let m = fs::metadata(&f).unwrap();
        assert_eq!((m.uid(), m.gid()), (300_000, 300_000));
        assert_eq!(m.mode() & 0o7777, 0o4755);
        assert_eq!(
            fs::symlink_metadata(dir.path().join("link")).unwrap().uid(),
            300_000
        );
        assert_eq!(
            shift_tree(dir.path(), ids, Shift::In).unwrap(),
            0,
            "idempotent"
        );
        shift_tree(dir.path(), ids, Shift::Out).unwrap();
        assert_eq!(fs::metadata(&f).unwrap().uid(), 0);
    }
}
