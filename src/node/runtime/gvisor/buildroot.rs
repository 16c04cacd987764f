//! The root of a gVisor build instance. A gVisor sandbox normally keeps its writes in its own
//! memory; a build step's writes must land on the host, where the node commits them as a
//! layer. So a build instance's root is a host overlay: its lower layers are the template's
//! layers and root, each shown through a read-only, id-mapped view (the store keeps files
//! under the node's shifted ids, the sandbox wants the image's), and its upper directory is on
//! an ext4 disk of the instance's size tier, the same quota a build has on the built-in
//! runtime. runsc then runs without its own overlay and writes through to that upper.
//!
//! The views and the overlay are mounted in a mount namespace of runsc's own, between fork and
//! exec (see `views`), so they vanish with the sandbox's processes. The disk is
//! mounted in the node's namespace, where the upper directory is read after the sandbox
//! stopped; `release` and `unmount_under` take it down.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use super::super::disk::{self, Disks};
use super::views::{ChildMounts, IdViews};
use crate::sandbox::loopdev;
use crate::sandbox::spec::IdMap;
use crate::templates::Template;

/// Where a build instance's pieces are, under its directory.
const BUILD: &str = "build";
/// Paths the runtime itself puts in a sandbox's root (runsc makes the mount points of the
/// agent's binary, its libraries and its door there); never part of a layer.
pub const OWN_PATHS: &[&str] = &[".sandbox-gateway"];

/// Layers are shown through the node's id-mapped views, as the sandbox should see them.
#[derive(Debug)]
pub struct BuildRoots {
    views: Arc<IdViews>,
    disks: Disks,
    ids: IdMap,
}

fn nix_io(what: &'static str) -> impl FnOnce(nix::Error) -> io::Error {
    move |e| io::Error::other(format!("{what}: {e}"))
}

impl BuildRoots {
    /// Makes the namespace and checks that `templates` (where layers live) can be shown
    /// through id-mapped mounts; an error says why builds cannot run on this node.
    pub fn new(
        views: Arc<IdViews>,
        ids: IdMap,
        templates: &Path,
        disks: PathBuf,
    ) -> io::Result<BuildRoots> {
        let disks = Disks::find(disks)?;
        views.check(templates, false)?;
        Ok(BuildRoots { views, disks, ids })
    }

    /// Prepares the build root of the instance in `dir` for `template`: the mount points, the
    /// disk (mounted here), and what runsc's child mounts. Answers where the root will be.
    pub fn prepare(
        &self,
        dir: &Path,
        template: &Template,
        disk_bytes: u64,
    ) -> io::Result<(PathBuf, ChildMounts)> {
        use std::os::unix::fs::PermissionsExt;
        let build = dir.join(BUILD);
        std::fs::create_dir_all(build.join("root"))?;
        // The upper directory holds the sandbox's files under the image's ids (root's are the
        // host's root): for the node and runsc only.
        std::fs::set_permissions(&build, std::fs::Permissions::from_mode(0o700))?;
        let lowers: Vec<&PathBuf> = template
            .layers
            .iter()
            .chain(std::iter::once(&template.root))
            .collect();
        let mut mounts = ChildMounts::new(self.views.clone());
        for (i, src) in lowers.iter().enumerate() {
            let target = build.join("l").join(i.to_string());
            std::fs::create_dir_all(&target)?;
            mounts.view(src, &target, false)?;
        }
        let image = build.join("disk.ext4");
        disk::copy_sparse(&self.disks.blank(disk_bytes)?, &image)?;
        let mountpoint = build.join("disk");
        std::fs::create_dir_all(&mountpoint)?;
        let dev = loopdev::attach(&image)?;
        mount(
            Some(dev.path.as_path()),
            &mountpoint,
            Some("ext4"),
            MsFlags::MS_NODEV | MsFlags::MS_NOSUID | MsFlags::MS_NOATIME,
            None::<&str>,
        )
        .map_err(nix_io("mounting the build's disk"))?;
        drop(dev);
        for d in ["upper", "work"] {
            std::fs::create_dir_all(mountpoint.join(d))?;
        }
        let lowerdir: Vec<String> = (0..lowers.len()).map(|i| format!("l/{i}")).collect();
        // Relative names keep the options within the page mount(2) takes; userxattr keeps
        // overlay's bookkeeping where the built-in runtime's layers have it.
        let opts = format!(
            "lowerdir={},upperdir=disk/upper,workdir=disk/work,userxattr",
            lowerdir.join(":")
        );
        mounts.overlay(&build, &opts)?;
        Ok((build.join("root"), mounts))
    }

    /// The upper directory of the instance in `dir`: what its sandbox wrote.
    pub fn upper(dir: &Path) -> PathBuf {
        dir.join(BUILD).join("disk").join("upper")
    }

    /// The mounted disk of the instance in `dir`, when it is a build instance.
    pub fn disk(dir: &Path) -> Option<PathBuf> {
        let d = dir.join(BUILD).join("disk");
        d.is_dir().then_some(d)
    }

    /// Copies the sandbox's writes into the new directory `dest` as a layer under the node's
    /// ids, leaving out `skip` and the runtime's own paths. None when it wrote nothing.
    pub fn commit(&self, dir: &Path, dest: &Path, skip: &[&str]) -> io::Result<Option<u64>> {
        use crate::templates::{layers, shift};
        let upper = Self::upper(dir);
        let skip: Vec<&str> = skip.iter().chain(OWN_PATHS).copied().collect();
        if layers::is_empty(&upper, &skip)? {
            return Ok(None);
        }
        let bytes = layers::commit(&upper, dest, &skip)?;
        if let Err(e) = shift::shift_tree(dest, self.ids, shift::Shift::In) {
            let _ = layers::remove_tree(dest);
            return Err(e);
        }
        Ok(Some(bytes))
    }

    /// Unmounts the disk of the instance in `dir` (nothing when it has none).
    pub fn release(dir: &Path) -> io::Result<()> {
        match Self::disk(dir) {
            Some(d) => detach(&d),
            None => Ok(()),
        }
    }
}

/// Unmounts every mount under `root` (a disk an earlier run of the node left mounted); the
/// deepest first.
pub fn unmount_under(root: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut points: Vec<PathBuf> = mount_points(&info)
        .into_iter()
        .filter(|p| p.starts_with(root) && p != root)
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.retain(|p| detach(p).is_ok());
    points
}

fn detach(p: &Path) -> io::Result<()> {
    match umount2(p, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => Ok(()),
        Err(e) => Err(io::Error::other(format!("unmounting {}: {e}", p.display()))),
    }
}

/// The mount points `/proc/self/mountinfo` lists (field 5, with its octal escapes undone).
fn mount_points(info: &str) -> Vec<PathBuf> {
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(&unescape(p))))
        .collect()
}

fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push(d.iter().fold(0u8, |n, c| n.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_come_unescaped_from_mountinfo() {
        let info = "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - ext4 /dev/x rw\n\
                    37 36 7:1 / /srv/sandboxes/in_1/build/disk rw - ext4 /dev/loop1 rw\n";
        assert_eq!(
            mount_points(info),
            vec![
                PathBuf::from("/mnt/a b"),
                PathBuf::from("/srv/sandboxes/in_1/build/disk")
            ]
        );
        assert_eq!(unescape("a\\134b\\011"), b"a\\b\t");
        assert_eq!(unescape("trailing\\04"), b"trailing\\04");
    }
}
