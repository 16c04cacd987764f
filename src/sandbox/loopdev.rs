//! Loop devices for sandbox disk images. A device is configured with autoclear, so it is
//! detached by the kernel as soon as its last user (the mount, or this process's descriptor)
//! is gone: a sandbox that dies for any reason leaves no loop device behind.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_DIRECT_IO: u32 = 16;
const LO_NAME_SIZE: usize = 64;
const LO_KEY_SIZE: usize = 32;

/// `struct loop_info64` from linux/loop.h.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; LO_KEY_SIZE],
    lo_init: [u64; 2],
}

/// `struct loop_config` from linux/loop.h.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// A configured loop device; dropping it closes this process's descriptor (the device stays
/// attached while something has it mounted).
pub struct LoopDevice {
    pub path: PathBuf,
    _dev: File,
}

/// Attaches `image` to a free loop device with autoclear. Another process may take the free
/// device between the two calls; that is retried after a pause that grows and differs per
/// process, since boots that start together would otherwise keep picking the same device
/// (seen in a 10,000-cycle soak: 32 immediate retries were not enough).
pub fn attach(image: &Path) -> io::Result<LoopDevice> {
    let backing = OpenOptions::new().read(true).write(true).open(image)?;
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    let mut last = io::Error::other("no loop device could be configured");
    // Differs between processes and between threads that start in the same instant.
    let seed = std::process::id()
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            std::thread::sleep(retry_pause(seed, attempt));
        }
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number or -1.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let dev = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(d) => d,
            Err(e) => {
                last = e;
                continue;
            }
        };
        // SAFETY: an all-zero loop_config is valid; the fields that matter are set below.
        let mut cfg: LoopConfig = unsafe { std::mem::zeroed() };
        cfg.fd = backing.as_raw_fd() as u32;
        // Direct I/O to the image: the disk's pages are cached once (in the file system on
        // the device), not a second time in the image's own page cache, which doubled the
        // memory a write costs and the copying its writeback does.
        cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
        let mut err = configure(&dev, &cfg);
        if err
            .as_ref()
            .is_some_and(|e| e.raw_os_error() == Some(libc::EINVAL))
        {
            // The image's file system does not take direct I/O: buffered, then.
            cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR;
            err = configure(&dev, &cfg);
        }
        let Some(err) = err else {
            return Ok(LoopDevice { path, _dev: dev });
        };
        if err.raw_os_error() != Some(libc::EBUSY) {
            return Err(err);
        }
        last = err;
    }
    Err(last)
}

/// Configures `dev` with `cfg`; None when it took.
fn configure(dev: &File, cfg: &LoopConfig) -> Option<io::Error> {
    // SAFETY: LOOP_CONFIGURE reads one loop_config from the pointer we pass.
    let rc = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, cfg as *const LoopConfig) };
    (rc != 0).then(io::Error::last_os_error)
}

const ATTEMPTS: u32 = 64;

/// How long attempt `attempt` (from 1) of an attach seeded `seed` waits: up to 1, 2, 4, 8,
/// then 16 ms, spread by the seed so that racing attaches fall apart.
fn retry_pause(seed: u32, attempt: u32) -> std::time::Duration {
    let window_us = 1000u64 << attempt.saturating_sub(1).min(4);
    let spread =
        (u64::from(seed).wrapping_mul(7919) + u64::from(attempt).wrapping_mul(104_729)) % window_us;
    std::time::Duration::from_micros(window_us / 4 + spread)
}

/// Backing files of the loop devices attached now, for leak checks.
pub fn attached_backing_files() -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    dir.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("loop"))
        .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
        .map(|s| PathBuf::from(s.trim_end()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_pauses_grow_stay_bounded_and_differ_by_seed() {
        for attempt in 1..ATTEMPTS {
            let p = retry_pause(4242, attempt);
            assert!(p >= std::time::Duration::from_micros(250), "{p:?}");
            assert!(p < std::time::Duration::from_millis(20), "{p:?}");
        }
        assert!(retry_pause(1, 6).as_micros() >= 4000);
        let spread: std::collections::BTreeSet<_> =
            (100..140).map(|seed| retry_pause(seed, 5)).collect();
        assert!(spread.len() > 20, "{spread:?}");
    }

    /// Many processes' boots attach at once; every attach must get a device. Needs root and
    /// /dev/loop-control (skipped without them).
    #[test]
    fn concurrent_attaches_all_get_a_device() {
        if OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/loop-control")
            .is_err()
        {
            eprintln!("SKIPPED: /dev/loop-control is not usable here");
            return;
        }
        let dir = tempfile::tempdir().expect("a temporary directory");
        let threads: Vec<_> = (0..16)
            .map(|t| {
                let image = dir.path().join(format!("img{t}"));
                std::thread::spawn(move || {
                    File::create(&image)
                        .and_then(|f| f.set_len(1 << 20))
                        .expect("a sparse image");
                    for _ in 0..6 {
                        // Dropped at once: autoclear detaches it, freeing the device again.
                        attach(&image).expect("attach under contention");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("an attaching thread");
        }
    }

    #[test]
    fn layouts_match_the_kernel() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
    }
}
