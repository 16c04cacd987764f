//! File bytes moved on a blocking thread of their own, handed to and from the async side as
//! whole `Bytes` over a short bounded channel: no copy into an intermediate buffer and no
//! thread hand-off per chunk (as `tokio::fs::File` does), the disk and the socket working at
//! the same time, and memory bounded by the channel whatever the file's size.

use std::fs::File;
use std::io::{self, Read, Write};

use bytes::{Bytes, BytesMut};
use futures::Stream;
use tokio::sync::mpsc;

/// How many chunks may wait between the socket and the disk, each way.
const IN_FLIGHT: usize = 4;
/// The size of the blocks a download reads: large enough that a transfer costs few syscalls
/// and channel hand-offs, small enough that the first bytes leave at once.
pub const READ_BLOCK: usize = 256 * 1024;

/// A file being written by a thread of its own.
pub struct FileSink {
    tx: Option<mpsc::Sender<Bytes>>,
    /// The writer, until it is waited for.
    done: Option<tokio::task::JoinHandle<io::Result<File>>>,
}

impl FileSink {
    /// Starts writing to `file`; its chunks are written in the order given.
    pub fn new(mut file: File) -> FileSink {
        let (tx, mut rx) = mpsc::channel::<Bytes>(IN_FLIGHT);
        let done = tokio::task::spawn_blocking(move || {
            while let Some(chunk) = rx.blocking_recv() {
                file.write_all(&chunk)?;
            }
            Ok(file)
        });
        FileSink {
            tx: Some(tx),
            done: Some(done),
        }
    }

    /// Queues `chunk`; waits while the disk is behind. Fails with the write's error once the
    /// writer has stopped on one.
    pub async fn write(&mut self, chunk: Bytes) -> io::Result<()> {
        let sent = match &self.tx {
            Some(tx) => tx.send(chunk).await.is_ok(),
            None => false,
        };
        if sent {
            return Ok(());
        }
        // The writer ended early: it failed, and its error says why.
        self.tx = None;
        match self.wait().await {
            Err(e) => Err(e),
            Ok(_) => Err(io::Error::other("the file writer stopped")),
        }
    }

    async fn wait(&mut self) -> io::Result<File> {
        match self.done.take() {
            Some(done) => match done.await {
                Ok(r) => r,
                Err(e) => Err(io::Error::other(format!("the file writer failed: {e}"))),
            },
            None => Err(io::Error::other("the file writer stopped")),
        }
    }

    /// Waits until every queued chunk is written, and gives the file back.
    pub async fn finish(mut self) -> io::Result<File> {
        self.tx = None;
        self.wait().await
    }
}

/// The bytes of `file` from where it stands to its end, read in blocks of `block` bytes by a
/// thread of its own. Reading stops when the stream is dropped.
pub fn file_stream(mut file: File, block: usize) -> impl Stream<Item = io::Result<Bytes>> {
    crate::iox::made_on_a_thread(IN_FLIGHT, move || {
        let mut buf = BytesMut::zeroed(block);
        let read = loop {
            match file.read(&mut buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        match read {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some(Ok(buf.freeze()))
            }
            Err(e) => Some(Err(e)),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("fileio-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("f")
    }

    #[tokio::test]
    async fn chunks_written_in_order_and_read_back_in_blocks() {
        let path = scratch("order");
        let mut sink = FileSink::new(File::create(&path).unwrap());
        let mut want = Vec::new();
        for i in 0..50u8 {
            let chunk = vec![i; 1000 + i as usize * 37];
            want.extend_from_slice(&chunk);
            sink.write(Bytes::from(chunk)).await.unwrap();
        }
        sink.finish().await.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), want);

        let blocks: Vec<Bytes> = file_stream(File::open(&path).unwrap(), 4096)
            .map(|b| b.unwrap())
            .collect()
            .await;
        assert!(blocks.iter().all(|b| b.len() <= 4096 && !b.is_empty()));
        assert_eq!(blocks.concat(), want);
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[tokio::test]
    async fn a_failing_write_is_reported_to_the_writer() {
        // /dev/full answers every write with ENOSPC.
        let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
            return;
        };
        let mut sink = FileSink::new(full);
        let mut err = None;
        for _ in 0..(IN_FLIGHT + 4) {
            if let Err(e) = sink.write(Bytes::from_static(b"x")).await {
                err = Some(e);
                break;
            }
        }
        let err = match err {
            Some(e) => e,
            None => sink.finish().await.unwrap_err(),
        };
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    }

    #[tokio::test]
    async fn an_empty_file_is_an_empty_stream() {
        let path = scratch("empty");
        File::create(&path).unwrap();
        let n = file_stream(File::open(&path).unwrap(), READ_BLOCK)
            .count()
            .await;
        assert_eq!(n, 0);
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}
