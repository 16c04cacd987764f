//! HTTP helpers both surfaces share.

use actix_web::dev::ServiceResponse;
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::ErrorHandlerResponse;
use actix_web::{HttpResponse, HttpResponseBuilder};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{Semaphore, SemaphorePermit};

/// Marks a response that must reach the client unchanged.
pub struct Passthrough;

/// Rewrites an error response that is not JSON yet (a framework 404 or 405, an extractor's
/// plain-text error) into the surface's JSON error, made by `envelope` from the status and a
/// message. The status and other headers (such as `Allow`) are kept.
pub fn json_error<B>(
    res: ServiceResponse<B>,
    envelope: impl FnOnce(StatusCode, String) -> HttpResponse,
) -> actix_web::Result<ErrorHandlerResponse<B>> {
    // Another party's answer (a sandbox's, through the data-plane proxy) is passed on as it is.
    if res.response().extensions().contains::<Passthrough>() {
        return Ok(ErrorHandlerResponse::Response(res.map_into_left_body()));
    }
    let is_json = res
        .response()
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return Ok(ErrorHandlerResponse::Response(res.map_into_left_body()));
    }
    let status = res.status();
    let message = res
        .response()
        .error()
        .map(|e| e.to_string())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_string());
    let (req, old) = res.into_parts();
    let mut new = envelope(status, message);
    for (name, value) in old.headers() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            new.headers_mut().insert(name.clone(), value.clone());
        }
    }
    new.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(ErrorHandlerResponse::Response(
        ServiceResponse::new(req, new).map_into_right_body(),
    ))
}

/// Bytes a streamed list body gathers before it hands a chunk to the connection. actix copies
/// each chunk into its write buffer and writes that buffer whole, so the chunk is the size of
/// the writes: at 64 KiB (a little over one loopback segment once framed) a 50,000-sandbox list
/// took about 1.5 times as long as at 1 MiB (PERFORMANCE.md, "Lists at scale"). A list in
/// flight holds about three chunks (see `made_ahead`).
pub const BODY_CHUNK: usize = 1 << 20;

/// `res` with `chunks` as its body: sized when there is only one chunk (a short list gets a
/// `Content-Length`), else streamed, made ahead of the connection (`made_ahead`) when a maker
/// is free and as the connection takes each chunk when none is.
pub fn chunked_reply<I>(mut res: HttpResponseBuilder, chunks: I) -> HttpResponse
where
    I: Iterator<Item = Bytes> + Send + 'static,
{
    let mut chunks = chunks.peekable();
    let first = chunks.next().unwrap_or_default();
    if chunks.peek().is_none() {
        return res.body(first);
    }
    let first = futures::stream::once(std::future::ready(Ok(first)));
    match MAKERS.try_acquire() {
        Ok(maker) => res.streaming(first.chain(made_ahead(chunks, maker))),
        Err(_) => res.streaming(first.chain(futures::stream::iter(chunks.map(Ok)))),
    }
}

/// Bodies that may be made ahead at once, one thread each: as many as the host has cores.
/// A maker waits for its client, so a slow client holds one (one that stops reading, until
/// the gateway cuts its connection: `gateway::stalled`); when all are held, further
/// bodies are made on their connection's thread as before, slower but never stalled, and the
/// blocking pool is never used up by clients that read slowly.
static MAKERS: std::sync::LazyLock<Semaphore> =
    std::sync::LazyLock::new(|| Semaphore::new(maker_count()));

fn maker_count() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// `chunks` as a stream made on a blocking-pool thread while the connection writes the chunks
/// before. Making the chunks of a 50,000-sandbox list (copying each entry's kept form) takes
/// about as long as writing them, and on the writing thread the two added up (PERFORMANCE.md,
/// "Lists at scale"). The queue holds one chunk, so a list in flight holds about three (being
/// made, queued, being written). A client that hangs up closes the queue and the maker stops
/// at its next chunk; a maker that panics ends the body with an error, so that the connection
/// is cut rather than the list ending early as if it were whole.
fn made_ahead<I>(
    mut chunks: I,
    maker: SemaphorePermit<'static>,
) -> impl futures::Stream<Item = std::io::Result<Bytes>>
where
    I: Iterator<Item = Bytes> + Send + 'static,
{
    crate::iox::made_on_a_thread(1, move || {
        // The permit goes with the thread: it is held until the maker stops.
        let _maker = &maker;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| chunks.next())) {
            Ok(Some(chunk)) => Some(Ok(chunk)),
            Ok(None) => None,
            Err(_) => Some(Err(std::io::Error::other(
                "making the body's next chunk panicked",
            ))),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::body::{BodySize, MessageBody};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tokio::sync::oneshot;

    fn parts(n: usize) -> impl Iterator<Item = Bytes> {
        (0..n).map(|i| Bytes::from(format!("part{i};")))
    }

    #[actix_web::test]
    async fn one_chunk_is_a_sized_body_and_more_are_streamed() {
        let one = chunked_reply(HttpResponse::Ok(), parts(1));
        assert_eq!(one.body().size(), BodySize::Sized(6));
        let none = chunked_reply(HttpResponse::Ok(), parts(0));
        assert_eq!(none.body().size(), BodySize::Sized(0));

        let three = chunked_reply(HttpResponse::Ok(), parts(3));
        assert_eq!(three.body().size(), BodySize::Stream);
        let body = actix_web::body::to_bytes(three.into_body())
            .await
            .unwrap_or_default();
        assert_eq!(&body[..], b"part0;part1;part2;");
    }

    /// Endless chunks that count how many were made and say when they are dropped.
    struct Counted {
        made: Arc<AtomicUsize>,
        dropped: Option<oneshot::Sender<()>>,
        panic_at: Option<usize>,
    }

    impl Iterator for Counted {
        type Item = Bytes;
        fn next(&mut self) -> Option<Bytes> {
            let n = self.made.fetch_add(1, Ordering::SeqCst);
            assert_ne!(Some(n), self.panic_at, "the maker fails at chunk {n}");
            Some(Bytes::from(vec![b'x'; 100]))
        }
    }

    impl Drop for Counted {
        fn drop(&mut self) {
            if let Some(tx) = self.dropped.take() {
                let _ = tx.send(());
            }
        }
    }

    fn counted(panic_at: Option<usize>) -> (Counted, Arc<AtomicUsize>, oneshot::Receiver<()>) {
        let made = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = oneshot::channel();
        let c = Counted {
            made: made.clone(),
            dropped: Some(tx),
            panic_at,
        };
        (c, made, rx)
    }

    /// A semaphore of one maker of the test's own (leaked, as `MAKERS` lives for good) and
    /// its permit.
    fn one_maker() -> (&'static Semaphore, SemaphorePermit<'static>) {
        let makers: &'static Semaphore = Box::leak(Box::new(Semaphore::new(1)));
        let permit = makers.try_acquire();
        (makers, permit.expect("a fresh semaphore has a permit"))
    }

    #[actix_web::test]
    async fn a_client_that_hangs_up_stops_the_maker_and_frees_it() {
        let (chunks, made, dropped) = counted(None);
        let (makers, maker) = one_maker();
        let mut body = Box::pin(made_ahead(chunks, maker));
        for _ in 0..5 {
            assert!(matches!(body.next().await, Some(Ok(_))));
        }
        assert_eq!(
            makers.available_permits(),
            0,
            "the maker is held while it makes"
        );
        drop(body);
        let stopped = tokio::time::timeout(Duration::from_secs(10), dropped).await;
        assert!(
            stopped.is_ok(),
            "the maker still runs after the body was dropped"
        );
        // Five read, and at most the queued one and the one being made beyond them.
        let n = made.load(Ordering::SeqCst);
        assert!((5..=8).contains(&n), "{n} chunks made for 5 read");
        let freed = async {
            while makers.available_permits() == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        assert!(
            tokio::time::timeout(Duration::from_secs(10), freed)
                .await
                .is_ok(),
            "the maker is not freed"
        );
    }

    #[actix_web::test]
    async fn a_maker_that_fails_cuts_the_body_instead_of_ending_it() {
        let (chunks, _, _) = counted(Some(3));
        let (_makers, maker) = one_maker();
        let sent: Vec<_> = made_ahead(chunks, maker).collect().await;
        assert_eq!(sent.len(), 4, "three chunks, then the error");
        assert!(sent[..3].iter().all(Result::is_ok));
        assert!(sent[3].is_err());
    }

    #[actix_web::test]
    async fn bodies_are_whole_when_every_maker_is_busy() {
        // Every maker held (once other tests free theirs), so the body is made on the
        // connection's thread.
        let all = u32::try_from(maker_count()).unwrap_or(u32::MAX);
        let held = MAKERS.acquire_many(all).await;
        assert_eq!(MAKERS.available_permits(), 0);
        let three = chunked_reply(HttpResponse::Ok(), parts(3));
        assert_eq!(three.body().size(), BodySize::Stream);
        let body = actix_web::body::to_bytes(three.into_body()).await;
        assert_eq!(&body.unwrap_or_default()[..], b"part0;part1;part2;");
        drop(held);
    }
}
