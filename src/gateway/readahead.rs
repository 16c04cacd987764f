//! Large reads from a client's connection for actix's HTTP/1 reader.
//!
//! actix-http reads a connection into a buffer that grows 8 → 16 → 32 → 64 KiB and never
//! asks for more at once, so a 100 MiB upload costs thousands of `recvfrom` calls, each of
//! which on loopback also runs the sender's transmit path and may wake it on another CPU.
//! [`ReadAhead`] sits between the socket and actix: when actix asks for a few KiB and nothing
//! is buffered, it asks the socket for up to [`MAX`] at once and serves actix's reads from
//! that. The buffer starts small and grows only while reads fill it (a request head or a small
//! body never gets a large one), and it is given back once the connection goes quiet, so an
//! idle keep-alive connection holds none. Beyond [`SMALL`] a buffer takes a place from a
//! process-wide [`Budget`], so however many clients send at once the gateway holds at most
//! [`LARGE_CONNECTIONS`] large buffers; the others read as actix would.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use actix_web::rt::net::{ActixStream, Ready};
use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The first buffer a connection gets.
const MIN: usize = 16 * 1024;
/// The largest buffer a connection grows to.
pub const MAX: usize = 1024 * 1024;
/// The largest buffer a connection grows to without a place in the [`Budget`] (actix's own
/// largest read).
const SMALL: usize = 64 * 1024;
/// How many connections may hold a buffer larger than [`SMALL`] at once: 64 MiB at most.
pub const LARGE_CONNECTIONS: usize = 64;

/// Places for large buffers, shared by every connection of the process.
#[derive(Debug)]
pub struct Budget {
    held: AtomicUsize,
    limit: usize,
    /// How many places were ever taken (for the listener's tests: a place given back before
    /// they look still shows here).
    #[cfg(test)]
    taken: AtomicUsize,
}

impl Budget {
    pub const fn new(limit: usize) -> Self {
        Self {
            held: AtomicUsize::new(0),
            limit,
            #[cfg(test)]
            taken: AtomicUsize::new(0),
        }
    }

    fn take(&self) -> bool {
        let took = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .is_ok();
        #[cfg(test)]
        if took {
            self.taken.fetch_add(1, Ordering::AcqRel);
        }
        took
    }

    fn give_back(&self) {
        self.held.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The gateway's budget.
static BUDGET: Budget = Budget::new(LARGE_CONNECTIONS);

/// How many times a connection took a large buffer (for the listener's tests; nothing else
/// in the crate's tests uses the gateway's budget).
#[cfg(test)]
pub fn large_buffers_taken() -> usize {
    BUDGET.taken.load(Ordering::Acquire)
}

/// A connection whose reads are made in large blocks (see the module's comment).
#[derive(Debug)]
pub struct ReadAhead<T> {
    io: T,
    /// Bytes read from the socket and not yet handed on.
    buf: BytesMut,
    /// How much the next read from the socket may bring.
    size: usize,
    /// How much the last read from the socket brought.
    last: usize,
    /// Where a buffer beyond [`SMALL`] takes its place; this connection holds one exactly
    /// while `size` is beyond [`SMALL`].
    budget: &'static Budget,
}

impl<T> ReadAhead<T> {
    pub fn new(io: T) -> Self {
        Self::with_budget(io, &BUDGET)
    }

    fn with_budget(io: T, budget: &'static Budget) -> Self {
        Self {
            io,
            buf: BytesMut::new(),
            size: MIN,
            last: 0,
            budget,
        }
    }

    /// The next read's size after one that brought `got` bytes: grown by [`grown`], beyond
    /// [`SMALL`] only with a place in the budget.
    fn grow(&mut self, got: usize) {
        let next = grown(self.size, got);
        if next > SMALL && self.size <= SMALL && !self.budget.take() {
            return;
        }
        self.size = next;
    }

    /// Gives the buffer, and its place in the budget, back.
    fn shrink(&mut self) {
        self.buf = BytesMut::new();
        if std::mem::replace(&mut self.size, MIN) > SMALL {
            self.budget.give_back();
        }
    }

    /// The connection underneath.
    pub fn get_ref(&self) -> &T {
        &self.io
    }
}

/// The next read's size after a read of `got` bytes into room for `size`: doubled while
/// reads fill their room, up to [`MAX`].
fn grown(size: usize, got: usize) -> usize {
    if got >= size {
        (size * 2).min(MAX)
    } else {
        size
    }
}

/// Whether a connection whose socket just ran dry gives its buffer back: only when its last
/// read did not fill half its room, so a client sending faster than we read keeps it.
fn quiet(size: usize, last: usize) -> bool {
    last < size / 2
}

impl<T: AsyncRead + Unpin> AsyncRead for ReadAhead<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.buf.is_empty() {
            // A caller with room for a whole block reads straight into it.
            if out.remaining() >= this.size {
                return Pin::new(&mut this.io).poll_read(cx, out);
            }
            this.buf.clear();
            this.buf.reserve(this.size);
            // At most `size`: BytesMut may have kept or given more room than was asked.
            let room = (&mut this.buf).limit(this.size);
            match tokio_util::io::poll_read_buf(Pin::new(&mut this.io), cx, &mut { room }) {
                Poll::Pending => {
                    if quiet(this.size, this.last) {
                        this.shrink();
                    }
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(0)) => {
                    // The client sends no more: nothing to keep a buffer for.
                    this.shrink();
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Ok(got)) => {
                    this.grow(got);
                    this.last = got;
                }
            }
        }
        let n = out.remaining().min(this.buf.len());
        out.put_slice(&this.buf[..n]);
        this.buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<T> Drop for ReadAhead<T> {
    fn drop(&mut self) {
        self.shrink();
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ReadAhead<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<T: ActixStream> ActixStream for ReadAhead<T> {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<Ready>> {
        if self.buf.is_empty() {
            self.io.poll_read_ready(cx)
        } else {
            Poll::Ready(Ok(Ready::READABLE))
        }
    }

    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<Ready>> {
        self.io.poll_write_ready(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use tokio::io::AsyncReadExt;

    /// What the socket underneath does on each read.
    enum Step {
        /// Gives up to this many bytes of the stream (all at once if the read has room).
        Data(usize),
        /// Nothing yet (wakes the reader at once).
        Pending,
        Fail,
    }

    /// A scripted socket: a numbered byte stream given out as the script says, recording how
    /// much room each read offered.
    struct Script {
        steps: VecDeque<Step>,
        next: u8,
        asked: Vec<usize>,
    }

    impl Script {
        fn new(steps: impl IntoIterator<Item = Step>) -> Self {
            Self {
                steps: steps.into_iter().collect(),
                next: 0,
                asked: Vec::new(),
            }
        }
    }

    impl AsyncRead for Script {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            out: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            this.asked.push(out.remaining());
            match this.steps.pop_front() {
                None => Poll::Ready(Ok(())),
                Some(Step::Pending) => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
                Some(Step::Fail) => Poll::Ready(Err(io::Error::other("reset"))),
                Some(Step::Data(n)) => {
                    let n = n.min(out.remaining());
                    for _ in 0..n {
                        out.put_slice(&[this.next]);
                        this.next = this.next.wrapping_add(1);
                    }
                    Poll::Ready(Ok(()))
                }
            }
        }
    }

    /// A reader with a budget of its own: the gateway's is the listener's tests' to watch.
    fn reader(script: Script) -> ReadAhead<Script> {
        ReadAhead::with_budget(script, Box::leak(Box::new(Budget::new(LARGE_CONNECTIONS))))
    }

    /// Reads everything in `chunk`-sized reads, as actix does, checking the numbering.
    async fn drain(r: &mut ReadAhead<Script>, chunk: usize) -> io::Result<usize> {
        let mut buf = vec![0u8; chunk];
        let mut total = 0usize;
        loop {
            let n = r.read(&mut buf).await?;
            if n == 0 {
                return Ok(total);
            }
            for (i, b) in buf[..n].iter().enumerate() {
                assert_eq!(*b, (total + i) as u8, "byte {} out of order", total + i);
            }
            total += n;
        }
    }

    #[tokio::test]
    async fn small_reads_become_large_ones_while_the_socket_has_more() {
        // A client sending faster than it is read: every socket read could be filled.
        let steps = (0..16).map(|_| Step::Data(usize::MAX));
        let mut r = reader(Script::new(steps));
        let total = drain(&mut r, 8 * 1024).await.unwrap();
        let asked = &r.get_ref().asked;
        // The socket saw room for 16, 32, ... KiB, then 1 MiB per read, not actix's 8 KiB.
        assert_eq!(
            asked[..7],
            [16, 32, 64, 128, 256, 512, 1024].map(|k| k * 1024)
        );
        assert!(asked[7..16].iter().all(|&n| n == MAX), "{asked:?}");
        assert_eq!(total, asked[..16].iter().sum::<usize>());
    }

    #[tokio::test]
    async fn a_quiet_socket_gives_the_buffer_back() {
        let steps = [
            Step::Data(usize::MAX),
            Step::Data(usize::MAX),
            Step::Data(usize::MAX),
            // A read that fills under half its room, then nothing: the client went quiet.
            Step::Data(1000),
            Step::Pending,
            Step::Data(10),
        ];
        let mut r = reader(Script::new(steps));
        let total = drain(&mut r, 4096).await.unwrap();
        assert_eq!(total, (16 + 32 + 64) * 1024 + 1000 + 10);
        let asked = &r.get_ref().asked;
        // 16, 32, 64, 128 KiB of room, the empty socket at 128 KiB, then back to the first size.
        assert_eq!(asked[..6], [16384, 32768, 65536, 131072, 131072, MIN]);
        assert_eq!(
            r.buf.capacity(),
            0,
            "the end of the stream gives the buffer back"
        );
    }

    #[tokio::test]
    async fn a_busy_socket_keeps_its_buffer_across_a_pause() {
        let steps = [
            Step::Data(usize::MAX),
            Step::Data(usize::MAX),
            Step::Pending,
            Step::Data(usize::MAX),
        ];
        let mut r = reader(Script::new(steps));
        drain(&mut r, 4096).await.unwrap();
        // After filled reads a pause is the client's, not the end of its sending: 64 KiB stay.
        assert_eq!(r.get_ref().asked[..4], [16384, 32768, 65536, 65536]);
    }

    #[tokio::test]
    async fn a_reader_with_room_for_a_block_reads_straight_in() {
        let mut r = reader(Script::new([Step::Data(usize::MAX), Step::Data(5)]));
        let mut buf = vec![0u8; 64 * 1024];
        assert_eq!(r.read(&mut buf).await.unwrap(), 64 * 1024);
        assert_eq!(r.read(&mut buf).await.unwrap(), 5);
        assert_eq!(r.get_ref().asked[..2], [64 * 1024, 64 * 1024]);
        assert_eq!(r.buf.capacity(), 0, "nothing was buffered");
    }

    #[tokio::test]
    async fn end_of_stream_and_errors_pass_through() {
        let mut r = reader(Script::new([Step::Data(100), Step::Fail]));
        let mut buf = [0u8; 10];
        let mut got = 0;
        let err = loop {
            match r.read(&mut buf).await {
                Ok(n) => got += n,
                Err(e) => break e,
            }
        };
        assert_eq!((got, err.to_string().as_str()), (100, "reset"));
        let mut r = reader(Script::new([Step::Data(3)]));
        assert_eq!(drain(&mut r, 2).await.unwrap(), 3);
        assert_eq!(r.read(&mut buf).await.unwrap(), 0, "the end stays the end");
    }

    #[tokio::test]
    async fn large_buffers_are_limited_across_connections() {
        let budget: &'static Budget = Box::leak(Box::new(Budget::new(1)));
        let busy = || Script::new((0..8).map(|_| Step::Data(usize::MAX)));
        let mut first = ReadAhead::with_budget(busy(), budget);
        let mut second = ReadAhead::with_budget(busy(), budget);
        let mut buf = [0u8; 4096];
        while !first.get_ref().asked.contains(&MAX) {
            assert!(first.read(&mut buf).await.unwrap() > 0);
        }
        drain(&mut second, 4096).await.unwrap();
        // The one place is the first's: the second connection read as actix would.
        assert_eq!(second.get_ref().asked.iter().max(), Some(&SMALL));
        // A connection that reached its end, or was dropped, gives its place back.
        let mut third = ReadAhead::with_budget(busy(), budget);
        drain(&mut first, 4096).await.unwrap();
        drain(&mut third, 4096).await.unwrap();
        assert_eq!(third.get_ref().asked.iter().max(), Some(&MAX));
        assert_eq!(budget.held.load(Ordering::Acquire), 0);
        let mut fourth = ReadAhead::with_budget(busy(), budget);
        while !fourth.get_ref().asked.contains(&MAX) {
            assert!(fourth.read(&mut buf).await.unwrap() > 0);
        }
        assert_eq!(budget.held.load(Ordering::Acquire), 1);
        drop(fourth);
        assert_eq!(budget.held.load(Ordering::Acquire), 0);
    }

    #[test]
    fn sizes_double_while_filled_up_to_the_cap() {
        assert_eq!(grown(MIN, MIN), 2 * MIN);
        assert_eq!(grown(MIN, MIN - 1), MIN);
        assert_eq!(grown(MAX, MAX), MAX);
        assert!(quiet(MAX, MAX / 2 - 1) && !quiet(MAX, MAX / 2));
    }
}
