//! Disconnecting clients that stop taking a response's bytes.
//!
//! A client that opens a list of 50,000 sandboxes, a file download or a command's output
//! stream and then stops reading holds what the response holds (its snapshot, the chunks in
//! flight, a body maker, a tunnel to the sandbox) for as long as its connection lives. The
//! gateway cannot notice this itself: once the socket takes no more bytes, actix stops asking
//! the body for more, and no code of ours runs again for that response. The kernel does
//! notice: with `TCP_USER_TIMEOUT` set, a connection whose sent bytes go unacknowledged for
//! that long, including when the client's window stays closed (Linux 5.11 and later), is
//! aborted; actix then sees the write fail and drops the response and all it holds. An idle
//! connection (a quiet watch, a command with no output) has nothing unacknowledged and is
//! never cut, and a client that reads often, however slowly, keeps its connection. The
//! kernel's clock is coarser than nginx's `send_timeout` (whose 60 s default the gateway's
//! is), though: while the window is closed it counts from its first window probe and starts
//! again only when the window reopens for all it has queued, so a client that reads in
//! bursts with pauses of a few hundred milliseconds, slower than the gateway writes, can be
//! cut after the limit although it reads (measured in RELIABILITY.md, "Limits").

use std::any::Any;
use std::os::fd::AsFd;
use std::time::Duration;

use actix_web::rt::net::TcpStream;

/// The default of `--stalled-client-seconds`.
pub const DEFAULT_STALLED_CLIENT: Duration = Duration::from_secs(60);

type Tls = actix_tls::accept::rustls_0_23::TlsStream<TcpStream>;

/// Sets the stall limit on a new connection of either listener (plain or TLS); `None` leaves
/// the kernel's retransmission limits alone.
pub fn limit(conn: &dyn Any, after: Option<Duration>) {
    let Some(after) = after else { return };
    let socket = match (conn.downcast_ref::<TcpStream>(), conn.downcast_ref::<Tls>()) {
        (Some(tcp), _) => tcp,
        (None, Some(tls)) => tls.get_ref().0,
        (None, None) => return,
    };
    if let Err(e) = set_user_timeout(socket, after) {
        tracing::debug!(error = %e, "cannot set TCP_USER_TIMEOUT on a client connection");
    }
}

/// `TCP_USER_TIMEOUT` in whole milliseconds (at least one; the kernel takes 0 as "unset").
fn set_user_timeout(socket: &impl AsFd, after: Duration) -> nix::Result<()> {
    let ms = u32::try_from(after.as_millis()).unwrap_or(u32::MAX).max(1);
    nix::sys::socket::setsockopt(socket, nix::sys::socket::sockopt::TcpUserTimeout, &ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{ErrorKind, Read, Write};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    /// A loopback pair: the server's end (with the limit) and the client's, whose receive
    /// buffer is `rcvbuf` bytes when given (small, so that a client that stops reading closes
    /// its window soon).
    fn pair(after: Duration, rcvbuf: Option<usize>) -> (std::net::TcpStream, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = std::net::TcpStream::connect(addr).expect("connect");
        if let Some(bytes) = rcvbuf {
            nix::sys::socket::setsockopt(&client, nix::sys::socket::sockopt::RcvBuf, &bytes)
                .expect("SO_RCVBUF");
        }
        let (server, _) = listener.accept().expect("accept");
        set_user_timeout(&server, after).expect("TCP_USER_TIMEOUT");
        (server, client)
    }

    /// Writes until the write fails or `deadline` passes; answers the error, if any.
    fn write_until_cut(server: &mut std::net::TcpStream, deadline: Duration) -> Option<ErrorKind> {
        server
            .set_write_timeout(Some(Duration::from_millis(200)))
            .expect("write timeout");
        let start = Instant::now();
        let block = [b'x'; 64 << 10];
        while start.elapsed() < deadline {
            match server.write(&block) {
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => return Some(e.kind()),
            }
        }
        None
    }

    #[test]
    fn a_client_that_stops_reading_is_cut_after_the_limit() {
        let (mut server, _client) = pair(Duration::from_millis(500), Some(4096));
        let start = Instant::now();
        let cut = write_until_cut(&mut server, Duration::from_secs(20));
        assert!(cut.is_some(), "the stalled connection was not cut in 20 s");
        assert!(
            start.elapsed() >= Duration::from_millis(500),
            "cut before the limit: {:?}",
            start.elapsed()
        );
    }

    #[test]
    fn a_client_that_keeps_reading_is_not_cut() {
        // Far slower than the server writes (its window is closed most of the time), but often:
        // what keeps the connection is the kernel seeing the window reopen for what it has
        // queued, and a reader that pauses for a few hundred milliseconds between reads can be
        // cut after the limit although it reads (RELIABILITY.md, "Limits"). A read every 50 ms
        // against a 2 s limit keeps well inside what holds, also on a loaded machine.
        let (mut server, mut client) = pair(Duration::from_secs(2), None);
        // The reader keeps its socket until the server has closed its end and then drains it:
        // a client closing with bytes unread resets the connection, which the writer would
        // take for a cut.
        let writing = Arc::new(AtomicBool::new(true));
        let still_writing = writing.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 16 << 10];
            let mut total = 0usize;
            loop {
                match client.read(&mut buf) {
                    Ok(0) => return (total, true),
                    Err(_) => return (total, false),
                    Ok(n) => total += n,
                }
                if still_writing.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        });
        let cut = write_until_cut(&mut server, Duration::from_secs(4));
        writing.store(false, Ordering::Relaxed);
        drop(server);
        let (total, whole) = reader.join().unwrap_or((0, false));
        assert_eq!(cut, None, "a slow but steady reader was cut");
        assert!(
            whole && total > 0,
            "the reader got {total} bytes, to the end: {whole}"
        );
    }

    #[actix_web::test]
    async fn the_listeners_connections_get_the_limit_and_others_are_left_alone() {
        let (server, _client) = pair(Duration::from_secs(1), Some(4096));
        server.set_nonblocking(true).expect("nonblocking");
        let server = TcpStream::from_std(server).expect("a tokio stream");
        let get =
            || nix::sys::socket::getsockopt(&server, nix::sys::socket::sockopt::TcpUserTimeout);
        limit(&server, None);
        assert_eq!(get(), Ok(1000), "no limit changes nothing");
        limit(&server, Some(Duration::from_millis(2500)));
        assert_eq!(get(), Ok(2500));
        // Neither a TCP stream nor a TLS one: nothing to set, and no panic.
        limit(&42u8, Some(Duration::from_secs(1)));
    }
}
