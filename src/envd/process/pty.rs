//! Pseudo-terminals: the master side stays in envd (non-blocking, on tokio's reactor, so no
//! thread waits on it), the slave becomes the command's controlling terminal.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

pub struct PtyMaster {
    fd: AsyncFd<OwnedFd>,
}

fn winsize(cols: u16, rows: u16) -> libc::winsize {
    libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// A new pair sized `cols`×`rows`: the master (close-on-exec, non-blocking) and the slave.
pub fn open(cols: u16, rows: u16) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut master: RawFd = -1;
    let mut slave: RawFd = -1;
    let ws = winsize(cols, rows);
    // SAFETY: openpty writes two descriptors into the provided integers; the name buffer and
    // termios may be null; the winsize pointer is valid.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &ws,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: openpty succeeded, so both are fresh descriptors we own.
    let (m, s) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    for fd in [m.as_raw_fd(), s.as_raw_fd()] {
        // SAFETY: fcntl on descriptors we own. The command gets the slave through dup2 (which
        // clears the flag on the copy), so neither leaks into other children.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    // SAFETY: as above.
    unsafe {
        let flags = libc::fcntl(m.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(m.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    Ok((m, s))
}

impl PtyMaster {
    pub fn new(fd: OwnedFd) -> std::io::Result<PtyMaster> {
        // SAFETY: the descriptor is owned by the AsyncFd from here on and stays open (and the
        // same) until it is dropped.
        let fd =
            unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE | Interest::WRITABLE) }
                .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(PtyMaster { fd })
    }

    /// Reads what the terminal has; 0 (or EIO, which Linux reports once every slave copy is
    /// closed) means the terminal is gone.
    pub async fn read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            let res = guard.try_io(|fd| {
                // SAFETY: reading into a valid buffer of its length.
                let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match res {
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    pub async fn write_all(&self, mut data: &[u8]) -> std::io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            let res = guard.try_io(|fd| {
                // SAFETY: writing from a valid buffer of its length.
                let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match res {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// TIOCSWINSZ: the kernel then sends SIGWINCH to the terminal's foreground group.
    pub fn resize(&self, cols: u16, rows: u16) -> std::io::Result<()> {
        let ws = winsize(cols, rows);
        // SAFETY: TIOCSWINSZ reads a winsize from a valid pointer.
        let rc = unsafe { libc::ioctl(self.fd.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}
