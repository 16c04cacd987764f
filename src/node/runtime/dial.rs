//! Connections from the node into a sandbox's network namespace. A socket belongs to the
//! namespace it was created in, whatever thread later uses it, so one dedicated thread enters
//! the sandbox's namespace, creates the socket and returns; the connect then happens on the
//! node's runtime like any other. Nothing of the sandbox listens on the host: only the node
//! can reach its agent and its ports. The agent is reached on its abstract Unix socket, which
//! belongs to the namespace the same way (see `agent`).

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::mpsc;

use tokio::net::{TcpSocket, TcpStream, UnixStream};
use tokio::sync::oneshot;

struct Job {
    netns: PathBuf,
    /// `AF_INET` or `AF_UNIX`.
    domain: libc::c_int,
    reply: oneshot::Sender<io::Result<OwnedFd>>,
}

/// Creates sockets inside other network namespaces.
pub struct Dialer {
    jobs: mpsc::Sender<Job>,
}

fn socket_in(netns: &PathBuf, domain: libc::c_int, home: &File) -> io::Result<OwnedFd> {
    let target = File::open(netns)?;
    // SAFETY: setns on this dedicated thread; it returns to `home` before the next job.
    if unsafe { libc::setns(target.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a plain socket call; the descriptor is owned right after.
    let fd = unsafe {
        libc::socket(
            domain,
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
                    let _ = job.reply.send(socket_in(&job.netns, job.domain, &home));
                }
            })?;
        Ok(Dialer { jobs: tx })
    }

    /// Connects to `port` on the loopback address of the network namespace `netns`
    /// (a `/proc/PID/ns/net` path).
    pub async fn connect(&self, netns: PathBuf, port: u16) -> io::Result<TcpStream> {
        let fd = self.socket(netns, libc::AF_INET).await?;
        let socket = TcpSocket::from_std_stream(std::net::TcpStream::from(fd));
        socket.set_nodelay(true)?;
        socket
            .connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
            .await
    }

    /// Connects to the abstract Unix socket `name` of the network namespace `netns`. Never
    /// waits: a listener whose queue is full is an error (`WouldBlock`), as is a name nobody
    /// listens on, so that a caller can fall back to another way in.
    pub async fn connect_abstract(&self, netns: PathBuf, name: &str) -> io::Result<UnixStream> {
        use nix::sys::socket::{UnixAddr, connect};
        let fd = self.socket(netns, libc::AF_UNIX).await?;
        let addr = UnixAddr::new_abstract(name.as_bytes()).map_err(io::Error::from)?;
        // The name is looked up in the namespace the socket was made in, whichever thread
        // connects; a Unix stream connects at once or not at all.
        connect(fd.as_raw_fd(), &addr).map_err(io::Error::from)?;
        UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))
    }

    /// A fresh non-blocking socket of `domain`, made inside `netns`.
    async fn socket(&self, netns: PathBuf, domain: libc::c_int) -> io::Result<OwnedFd> {
        let (reply, rx) = oneshot::channel();
        self.jobs
            .send(Job {
                netns,
                domain,
                reply,
            })
            .map_err(|_| io::Error::other("the dial thread is gone"))?;
        rx.await
            .map_err(|_| io::Error::other("the dial thread is gone"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr as UnixName, UnixListener};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A thread in a network namespace of its own (needs root, as the node does), listening on
    /// the abstract name `name` there; its namespace path, and a sender that ends it.
    fn namespace_with_listener(name: &str) -> (PathBuf, mpsc::Sender<()>) {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let name = name.to_string();
        std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let l = UnixListener::bind_addr(&UnixName::from_abstract_name(&name).unwrap()).unwrap();
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            let path = PathBuf::from(format!("/proc/{}/task/{tid}/ns/net", std::process::id()));
            ready_tx.send(path).unwrap();
            let (mut conn, _) = l.accept().unwrap();
            let mut buf = [0u8; 4];
            conn.read_exact(&mut buf).unwrap();
            conn.write_all(&buf).unwrap();
            let _ = stop_rx.recv();
        });
        (ready_rx.recv().unwrap(), stop_tx)
    }

    #[tokio::test]
    async fn abstract_names_are_reached_in_their_namespace_only() {
        let name = format!("sgw-dial-test-{}", std::process::id());
        let (netns, stop) = namespace_with_listener(&name);
        let dialer = Dialer::new().unwrap();
        // Inside the namespace: connected, and the bytes go both ways.
        let mut conn = dialer
            .connect_abstract(netns.clone(), &name)
            .await
            .expect("the listener in its namespace");
        conn.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        conn.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"ping");
        // The same name from this process's own namespace: nobody.
        let here = std::os::unix::net::UnixStream::connect_addr(
            &UnixName::from_abstract_name(&name).unwrap(),
        );
        assert!(here.is_err(), "the name leaked out of its namespace");
        // A name nobody listens on in that namespace fails at once (the caller falls back).
        let none = dialer.connect_abstract(netns, "sgw-dial-test-nobody").await;
        assert!(none.is_err());
        let _ = stop.send(());
    }
}
