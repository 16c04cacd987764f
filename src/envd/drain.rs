//! Reads what a client still sends after envd has answered. HTTP/1.1 clients send their whole
//! body before they read the answer; a server that answers early (a 507 during an upload, an
//! oversize message refused) and then closes with unread data makes the kernel reset the
//! connection, and the client sees the reset instead of the answer. So every request body
//! reaches its handler through a relay that, once the handler lets go of it, keeps reading and
//! dropping the rest (for a bounded time) while the answer goes out.

use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;

/// How long the rest of a body is read after its handler has stopped reading it.
const DRAIN_FOR: Duration = Duration::from_secs(60);
/// Frames in flight between the relay and the handler.
const RELAY_FRAMES: usize = 4;

fn has_body(req: &Request) -> bool {
    let h = req.headers();
    h.contains_key(header::TRANSFER_ENCODING)
        || h.get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|l| l.trim() != "0")
}

pub async fn drain_unread(req: Request, next: Next) -> Response {
    if !has_body(&req) {
        return next.run(req).await;
    }
    let (parts, mut body) = req.into_parts();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, axum::Error>>(RELAY_FRAMES);
    tokio::spawn(async move {
        let mut handler_gone_at: Option<Instant> = None;
        while let Some(frame) = body.frame().await {
            if let Some(since) = handler_gone_at {
                if since.elapsed() > DRAIN_FOR || frame.is_err() {
                    break;
                }
                continue;
            }
            let failed = frame.is_err();
            if tx.send(frame).await.is_err() {
                handler_gone_at = Some(Instant::now());
            } else if failed {
                break;
            }
        }
    });
    let relayed = Body::new(StreamBody::new(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    ));
    next.run(Request::from_parts(parts, relayed)).await
}
