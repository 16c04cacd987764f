//! A volume's own file system on one machine: an ext4 image beside its record, mounted (loop,
//! nosuid, nodev) at its `data` directory while the gateway runs, so a volume's size is a file
//! system's (a writer gets ENOSPC at the limit, and one volume cannot fill the host's disk).
//! Images suit one machine only: on a store several machines mount, each would mount the same
//! image, so there volumes stay plain directories (`crate::volumes`).

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use crate::node::runtime::disk;
use crate::sandbox::loopdev;

/// The image's name in a volume's directory.
pub const IMAGE: &str = "data.ext4";

/// Makes a blank image of `bytes` at `image` (which must not exist).
pub fn make(mkfs: &Path, image: &Path, bytes: u64) -> io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(image)?
        .set_len(bytes)?;
    // A journal: a volume outlives every sandbox and must survive a crash of the host.
    disk::mkfs_ext4(mkfs, image, true)
}

/// Whether `data` has a file system of its own mounted on it.
pub fn is_mounted(data: &Path) -> io::Result<bool> {
    let parent = data
        .parent()
        .ok_or_else(|| io::Error::other("a volume's data directory has no parent"))?;
    Ok(std::fs::metadata(data)?.dev() != std::fs::metadata(parent)?.dev())
}

/// Mounts `image` at the directory `data` unless something is mounted there already (a gateway
/// that was killed left it). The loop device goes with the last mount of it.
pub fn mount_at(image: &Path, data: &Path) -> io::Result<()> {
    std::fs::create_dir_all(data)?;
    if is_mounted(data)? {
        return Ok(());
    }
    let dev = loopdev::attach(image)?;
    mount(
        Some(&dev.path),
        data,
        Some("ext4"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(io::Error::from)
}

/// Unmounts the volume at `data` if it is mounted; sandboxes that still have it mounted keep
/// it until they end.
pub fn unmount(data: &Path) -> io::Result<()> {
    if !data.exists() || !is_mounted(data)? {
        return Ok(());
    }
    umount2(data, MntFlags::MNT_DETACH).map_err(io::Error::from)
}
