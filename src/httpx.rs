//! HTTP helpers both surfaces share.

use actix_web::dev::ServiceResponse;
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::ErrorHandlerResponse;
use actix_web::{HttpResponse, HttpResponseBuilder};
use bytes::Bytes;

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
/// flight holds about two chunks: the one being made and the one being written.
pub const BODY_CHUNK: usize = 1 << 20;

/// `res` with `chunks` as its body: sized when there is only one chunk (a short list gets a
/// `Content-Length`), else streamed, each chunk made as the connection takes the one before.
pub fn chunked_reply(
    mut res: HttpResponseBuilder,
    chunks: impl Iterator<Item = Bytes> + 'static,
) -> HttpResponse {
    let mut chunks = chunks.peekable();
    let first = chunks.next().unwrap_or_default();
    if chunks.peek().is_none() {
        return res.body(first);
    }
    let body = std::iter::once(first)
        .chain(chunks)
        .map(Ok::<_, std::io::Error>);
    res.streaming(futures::stream::iter(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::body::{BodySize, MessageBody};

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
}
