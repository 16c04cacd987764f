//! Connections from the node into a sandbox's network namespace. A socket belongs to the
//! namespace it was created in, whatever thread later uses it, so one dedicated thread enters
//! the sandbox's namespace, creates the socket and returns; the connect then happens on the
//! node's runtime like any other. Nothing of the sandbox listens on the host: only the node
//! can reach its agent and its ports.

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::mpsc;

use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot;

struct Job {
    netns: PathBuf,
    reply: oneshot::Sender<io::Result<OwnedFd>>,
}

/// Creates TCP sockets inside other network namespaces.
pub struct Dialer {
    jobs: mpsc::Sender<Job>,
}

fn socket_in(netns: &PathBuf, home: &File) -> io::Result<OwnedFd> {
    let target = File::open(netns)?;
    // SAFETY: setns on this dedicated thread; it returns to `home` before the next job.
    if unsafe { libc::setns(target.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a plain socket call; the descriptor is owned right after.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    let made = if fd < 0 {
        Err(io::Error::last_os_error())
    } else {
        // SAFETY: fd is fresh and ours.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    // SAFETY: back to the node's own namespace.
    if unsafe { libc::setns(home.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        // This thread can no longer make sockets for the right namespace; stop it.
        let e = io::Error::last_os_error();
        tracing::error!(error = %e, "the dial thread could not return to the node's network namespace");
        std::process::abort();
    }
    made
}

impl Dialer {
    pub fn new() -> io::Result<Dialer> {
        let home = File::open("/proc/thread-self/ns/net")?;
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("netns-dial".into())
            .spawn(move || {
                for job in rx {
                    let _ = job.reply.send(socket_in(&job.netns, &home));
                }
            })?;
        Ok(Dialer { jobs: tx })
    }

    /// Connects to `port` on the loopback address of the network namespace `netns`
    /// (a `/proc/PID/ns/net` path).
    pub async fn connect(&self, netns: PathBuf, port: u16) -> io::Result<TcpStream> {
        let (reply, rx) = oneshot::channel();
        self.jobs
            .send(Job { netns, reply })
            .map_err(|_| io::Error::other("the dial thread is gone"))?;
        let fd = rx
            .await
            .map_err(|_| io::Error::other("the dial thread is gone"))??;
        let socket = TcpSocket::from_std_stream(std::net::TcpStream::from(fd));
        socket.set_nodelay(true)?;
        socket
            .connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
            .await
    }
}
