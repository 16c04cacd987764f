//! Sandbox disks: each sandbox's writable layer is an ext4 image of its size tier, so its disk
//! quota is a file system's size (the writer gets ENOSPC) and its snapshot is one file. Blank
//! images are made once per size with mkfs.ext4 and copied; copies skip holes, so a copy costs
//! the data the layer holds, not the tier's size.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where blank images live and how they are made.
#[derive(Debug)]
pub struct Disks {
    pub dir: PathBuf,
    pub mkfs: PathBuf,
    /// One blank image is made at a time (boots of a new size would otherwise race).
    making: std::sync::Mutex<()>,
}

/// mkfs.ext4, or why there is none.
pub fn find_mkfs() -> io::Result<PathBuf> {
    [
        "/usr/sbin/mkfs.ext4",
        "/sbin/mkfs.ext4",
        "/usr/bin/mkfs.ext4",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
    .ok_or_else(|| {
        io::Error::other(
            "mkfs.ext4 is not installed; sandbox disks and volumes need it (apt-get install e2fsprogs)",
        )
    })
}

/// Makes an ext4 file system filling the file `image`: no reserved blocks, tables initialized
/// lazily, and a journal only when asked (a sandbox's disk ends with its sandbox).
pub fn mkfs_ext4(mkfs: &Path, image: &Path, journal: bool) -> io::Result<()> {
    let out = Command::new(mkfs)
        .args(["-q", "-F", "-m", "0", "-E"])
        .arg("lazy_itable_init=1,lazy_journal_init=1,nodiscard")
        .args([
            "-O",
            if journal {
                "has_journal"
            } else {
                "^has_journal"
            },
        ])
        .arg(image)
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(io::Error::new(
        mkfs_error_kind(&stderr),
        format!("mkfs.ext4 failed: {}", stderr.trim()),
    ))
}

impl Disks {
    pub fn find(dir: PathBuf) -> io::Result<Disks> {
        let mkfs = find_mkfs()?;
        fs::create_dir_all(&dir)?;
        Ok(Disks {
            dir,
            mkfs,
            making: std::sync::Mutex::new(()),
        })
    }

    /// The blank image for `bytes`, made on first use. Nodes sharing a directory may each make
    /// one; the last rename wins and all are equivalent.
    pub fn blank(&self, bytes: u64) -> io::Result<PathBuf> {
        let path = self.dir.join(format!("blank-{bytes}.ext4"));
        if path.exists() {
            return Ok(path);
        }
        let _one = self.making.lock().unwrap_or_else(|p| p.into_inner());
        if path.exists() {
            return Ok(path);
        }
        let tmp = self.dir.join(format!(
            ".blank-{bytes}.{}",
            crate::model::ids::random_hex(6)
        ));
        let _ = fs::remove_file(&tmp);
        // Whatever fails (mkfs on a full disk, typically), no half-made image stays behind.
        let made = self
            .make(&tmp, bytes)
            .and_then(|()| fs::rename(&tmp, &path));
        if made.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        made.map(|()| path)
    }

    fn make(&self, image: &Path, bytes: u64) -> io::Result<()> {
        File::create(image)?.set_len(bytes)?;
        mkfs_ext4(&self.mkfs, image, false)
    }
}

/// mkfs reports a full disk only in its output; the kind lets callers tell it from a bug.
fn mkfs_error_kind(stderr: &str) -> io::ErrorKind {
    if stderr.to_lowercase().contains("no space left on device") {
        io::ErrorKind::StorageFull
    } else {
        io::ErrorKind::Other
    }
}

/// Copies `src` to `dst` (which must not exist) skipping holes; returns the bytes of data
/// copied. The destination has the same length as the source. A copy that fails (the disk
/// filled up) removes its partial destination.
pub fn copy_sparse(src: &Path, dst: &Path) -> io::Result<u64> {
    let from = File::open(src)?;
    let to = OpenOptions::new().write(true).create_new(true).open(dst)?;
    let copied = copy_data(&from, &to);
    if copied.is_err() {
        drop(to);
        let _ = fs::remove_file(dst);
    }
    copied
}

fn copy_data(from: &File, to: &File) -> io::Result<u64> {
    let len = from.metadata()?.len();
    to.set_len(len)?;
    let (fi, fo) = (from.as_raw_fd(), to.as_raw_fd());
    let mut copied = 0u64;
    let mut pos: i64 = 0;
    while (pos as u64) < len {
        // SAFETY: lseek on a descriptor we own.
        let data = unsafe { libc::lseek(fi, pos, libc::SEEK_DATA) };
        if data < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // only a hole is left
            }
            return Err(e);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fi, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut off_in = data;
        let mut off_out = data;
        let mut left = (hole - data) as usize;
        while left > 0 {
            // SAFETY: copy_file_range between two descriptors we own, with valid offsets.
            let n = unsafe { libc::copy_file_range(fi, &mut off_in, fo, &mut off_out, left, 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n == 0 {
                break;
            }
            left -= n as usize;
            copied += n as u64;
        }
        pos = hole;
    }
    Ok(copied)
}

/// Bytes a file occupies on disk (its allocated blocks).
pub fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).map(|m| m.blocks() * 512).unwrap_or(0)
}

/// Flushes the file system holding `path` (a directory of a mounted disk) to its device, so
/// that a copy of the image taken next is consistent.
pub fn sync_fs(path: &Path) -> io::Result<()> {
    let dir = File::open(path)?;
    // SAFETY: syncfs on a descriptor we own.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Free space below which a host file system counts as full when a flush fails.
const NEARLY_FULL: u64 = 1 << 20;

/// `sync_fs` for the disk mounted at `mount` whose image is `image`. The loop device turns the
/// image's ENOSPC on the host into an I/O error of the sandbox's file system, so an EIO while
/// the host file system holding the image is (nearly) full is reported as what it is.
pub fn sync_disk(mount: &Path, image: &Path) -> io::Result<()> {
    sync_fs(mount).map_err(|e| {
        let host = image.parent().unwrap_or(image);
        let full = crate::fsx::filesystem_free(host).is_ok_and(|free| free < NEARLY_FULL);
        if e.raw_os_error() == Some(libc::EIO) && full {
            io::Error::new(
                io::ErrorKind::StorageFull,
                format!("the image could not be written ({e}): its file system has no space left"),
            )
        } else {
            e
        }
    })
}

/// (used, total) bytes of the file system holding `path`.
pub fn usage(path: &Path) -> io::Result<(u64, u64)> {
    let s = nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?;
    let block = s.fragment_size();
    let total = s.blocks() * block;
    let free = s.blocks_free() * block;
    Ok((total.saturating_sub(free), total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};

    #[test]
    fn mkfs_running_out_of_space_is_a_full_disk() {
        assert_eq!(
            mkfs_error_kind("ext2fs_write_inode: No space left on device while writing"),
            io::ErrorKind::StorageFull
        );
        assert_eq!(mkfs_error_kind("bad blocks"), io::ErrorKind::Other);
    }

    #[test]
    fn sparse_copies_keep_data_and_holes() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let mut f = File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        f.seek(SeekFrom::Start(10 << 20)).unwrap();
        f.write_all(&[7u8; 8192]).unwrap();
        f.seek(SeekFrom::Start(60 << 20)).unwrap();
        f.write_all(b"tail").unwrap();
        drop(f);
        let dst = dir.path().join("dst");
        let copied = copy_sparse(&src, &dst).unwrap();
        assert!(
            copied < 1 << 20,
            "copied {copied} bytes of a mostly empty file"
        );
        assert_eq!(fs::read(&src).unwrap(), fs::read(&dst).unwrap());
        assert!(allocated(&dst) < 1 << 20);
        assert!(
            copy_sparse(&src, &dst).is_err(),
            "the destination must be new"
        );
    }
}
