//! Byte-stream helpers the gateway and the node share.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A stream that first yields bytes already read from it (a CONNECT answer's tail, a
/// connection's first bytes read to learn its name).
pub struct Prefixed {
    prefix: Bytes,
    inner: TcpStream,
}

impl Prefixed {
    pub fn new(prefix: impl Into<Bytes>, inner: TcpStream) -> Prefixed {
        Prefixed {
            prefix: prefix.into(),
            inner,
        }
    }
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let chunk = self.prefix.split_to(n);
            buf.put_slice(&chunk);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, b)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A stream that ends when `closed` is cancelled: reads see the end, writes a broken pipe.
/// It gives an in-process tunnel the cut a node's data plane makes when it drops a tunnel
/// (the sandbox paused, killed or gone).
pub struct Closable<S> {
    inner: S,
    closed: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
}

impl<S> Closable<S> {
    pub fn new(inner: S, closed: tokio_util::sync::CancellationToken) -> Closable<S> {
        Closable {
            inner,
            closed: Box::pin(closed.cancelled_owned()),
        }
    }

    fn is_closed(&mut self, cx: &mut Context<'_>) -> bool {
        self.closed.as_mut().poll(cx).is_ready()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Closable<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.is_closed(cx) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Closable<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.is_closed(cx) {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        Pin::new(&mut self.inner).poll_write(cx, b)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.is_closed(cx) {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A stream of what `next` makes on a blocking thread, up to `ahead` items before the reader
/// asks: the thread stops at the end (`None`), after passing on an error, or at its next item
/// once the stream is dropped. Memory stays bounded by `ahead` whatever the stream's length.
pub fn made_on_a_thread<T, F>(
    ahead: usize,
    mut next: F,
) -> impl futures::Stream<Item = io::Result<T>>
where
    T: Send + 'static,
    F: FnMut() -> Option<io::Result<T>> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(ahead.max(1));
    tokio::task::spawn_blocking(move || {
        while let Some(item) = next() {
            let failed = item.is_err();
            if tx.blocking_send(item).is_err() || failed {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_closable_stream_ends_when_cancelled() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let token = tokio_util::sync::CancellationToken::new();
        let mut s = Closable::new(ours, token.clone());
        s.write_all(b"hi").await.unwrap();
        let mut got = [0u8; 2];
        theirs.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hi");
        // A read waiting for bytes that never come ends when the tunnel is cut.
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            let n = s.read(&mut buf).await.unwrap();
            (n, s)
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        token.cancel();
        let (n, mut s) = reader.await.unwrap();
        assert_eq!(n, 0, "the end of the stream");
        let e = s.write_all(b"x").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }
}
