//! Data-plane routing on the e2b listener: a request that names a sandbox (by the
//! `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers or a `{port}-{id}.{domain}` host) never reaches
//! the gateway's own routes. It is streamed, both ways and without buffering, to that port
//! inside the sandbox through the sandbox's node; envd's port (49983) gets its credential
//! checked and swapped for the agent's, any other port is the sandbox's own server (HTTP and
//! upgrades such as WebSocket). The gateway keeps no sandbox state beyond a route cache.

mod credentials;
mod headers;
mod target;
pub mod tunnel;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use actix_web::body::EitherBody;
use actix_web::body::{BodyStream, SizedStream};
use actix_web::dev::{RequestHead, Service, ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::{FromRequest, HttpRequest, HttpResponse, web};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http_body_util::{BodyDataStream, BodyExt, Empty, StreamBody};
use hyper::body::Frame;
use prometheus::{IntCounter, IntCounterVec};
use subtle::ConstantTimeEq;
use tokio::io::AsyncWriteExt;

pub use credentials::{Access, Signed, sign};
use headers::{
    ACCESS_TOKEN, Origin, TRAFFIC_TOKEN, copy_headers, header_str, host_of, is_upgrade,
    upstream_request,
};
pub use target::{Target, target};
use tunnel::{Buffered, ProxyBody, TunnelError, Tunnels, full_body};

use super::E2b;
use crate::httpx::Passthrough;
use crate::model::{ErrorKind, ids};

/// How long a sandbox's route (its node and token) is remembered.
const ROUTE_TTL: Duration = Duration::from_secs(60);
/// Request-body chunks in flight between the client and the sandbox.
const BODY_CHUNKS: usize = 8;
/// How long the rest of a body is read after the sandbox has answered without it.
const DRAIN_FOR: Duration = Duration::from_secs(60);
/// Bodies of idempotent requests up to this size are read whole before they are sent, so that
/// the request can be sent again when a reused connection drops it.
const REPLAYABLE_BODY: u64 = 64 * 1024;

#[derive(Clone)]
struct Route {
    /// The owning node's data plane.
    node: String,
    /// The agent's token (the node's per-sandbox token).
    agent_token: String,
    /// The sandbox's envdAccessToken as the SDK holds it.
    jwt: String,
    /// Set when the sandbox's ports are not public: what `e2b-traffic-access-token` must be.
    traffic: Option<String>,
    /// The sandbox's `maskRequestHost`, for requests to its own ports.
    mask: Option<String>,
}

/// The proxy's state, part of the e2b surface's.
pub struct Proxy {
    tunnels: Arc<Tunnels>,
    routes: moka::sync::Cache<String, Route>,
    /// Bytes into and out of sandboxes, once the gateway's metrics are set up.
    bytes: std::sync::OnceLock<ByteCounters>,
}

/// The data plane's byte counters: into the sandboxes, out of them (none before the metrics
/// are set up).
#[derive(Clone, Default)]
struct ByteCounters {
    to: Option<IntCounter>,
    from: Option<IntCounter>,
}

impl ByteCounters {
    fn went_in(&self, n: usize) {
        if let Some(c) = &self.to {
            c.inc_by(n as u64);
        }
    }

    fn came_out(&self, n: usize) {
        if let Some(c) = &self.from {
            c.inc_by(n as u64);
        }
    }
}

impl Default for Proxy {
    fn default() -> Self {
        Proxy {
            tunnels: Arc::new(Tunnels::default()),
            routes: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(ROUTE_TTL)
                .build(),
            bytes: std::sync::OnceLock::new(),
        }
    }
}

fn detect(head: &RequestHead, domain: Option<&str>) -> Option<Result<Target, target::Malformed>> {
    target(
        host_of(head),
        header_str(&head.headers, target::ID_HEADER),
        header_str(&head.headers, target::PORT_HEADER),
        domain,
    )
}

/// The data plane as the e2b listener's innermost middleware: a request that names a sandbox
/// is forwarded before routing, so it never reaches the gateway's own routes, and those routes
/// keep their patterns for the request metrics (a catch-all scope would hide them).
pub fn intercept<S, B>() -> impl Fn(ServiceRequest, &S) -> Intercepted<B> + Clone
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
    S::Future: 'static,
    B: 'static,
{
    |req: ServiceRequest, srv: &S| {
        let e2b = req.app_data::<web::Data<E2b>>().cloned();
        let e2b = match e2b {
            Some(e2b) if detect(req.head(), e2b.domain.as_deref()).is_some() => e2b,
            _ => {
                let fut = srv.call(req);
                return Box::pin(async move { Ok(fut.await?.map_into_left_body()) });
            }
        };
        let (http, mut payload) = req.into_parts();
        Box::pin(async move {
            let body = web::Payload::from_request(&http, &mut payload).await?;
            let res = forward(http.clone(), body, e2b).await;
            Ok(ServiceResponse::new(http, res).map_into_right_body())
        })
    }
}

/// What [`intercept`] answers: the gateway's own response or the proxy's.
pub type Intercepted<B> = std::pin::Pin<
    Box<dyn Future<Output = Result<ServiceResponse<EitherBody<B>>, actix_web::Error>>>,
>;

/// An answer of the proxy itself, shaped as e2b's edge shapes it (the SDKs classify 502s by
/// their message).
fn answer(status: u16, sandbox: &str, message: &str) -> HttpResponse {
    let status = actix_web::http::StatusCode::from_u16(status)
        .unwrap_or(actix_web::http::StatusCode::BAD_GATEWAY);
    let body =
        serde_json::json!({"sandboxId": sandbox, "message": message, "code": status.as_u16()});
    let mut res = HttpResponse::build(status)
        .content_type("application/json")
        .body(body.to_string());
    res.extensions_mut().insert(Passthrough);
    res
}

const NOT_FOUND: &str = "The sandbox was not found";

/// A sandbox whose route could not be found: 502 as e2b answers for an unknown sandbox, but a
/// node that is slow or unreachable is a 503 to retry (the sandbox may well exist), not a
/// "not found" the client would act on.
fn route_failure(e: &crate::model::Error, published: &str) -> HttpResponse {
    match e.kind {
        ErrorKind::NotFound => answer(502, published, NOT_FOUND),
        ErrorKind::Unavailable | ErrorKind::OutcomeUnknown | ErrorKind::NoCapacity => {
            let mut res = answer(
                503,
                published,
                &format!("The sandbox's node is not answering; retry: {}", e.message),
            );
            res.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            res
        }
        _ => answer(502, published, &format!("{NOT_FOUND}: {}", e.message)),
    }
}
const PORT_CLOSED: &str = "The sandbox is running but port is not open";
const BROKEN: &str = "The connection to the sandbox's node broke";

impl Proxy {
    /// Tunnels to the node at data-plane `address` open by calls into `node`, which runs in
    /// this process.
    /// Counts the bytes the proxy moves into `counters`, by `direction` (`to_sandbox`,
    /// `from_sandbox`).
    pub fn count_bytes(&self, counters: &IntCounterVec) {
        let _ = self.bytes.set(ByteCounters {
            to: Some(counters.with_label_values(&["to_sandbox"])),
            from: Some(counters.with_label_values(&["from_sandbox"])),
        });
    }

    fn byte_counters(&self) -> ByteCounters {
        self.bytes.get().cloned().unwrap_or_default()
    }

    pub fn set_local_node(&self, address: String, node: Arc<dyn tunnel::LocalNode>) {
        self.tunnels.set_local(address, node);
    }

    async fn route(&self, e2b: &E2b, sandbox: &str) -> Result<Route, crate::model::Error> {
        if let Some(r) = self.routes.get(sandbox) {
            return Ok(r);
        }
        let (_, record) = e2b.dispatcher.locate(None, sandbox).await?;
        if record.address.is_empty() {
            return Err(crate::model::Error::unavailable(format!(
                "the node of sandbox {sandbox} has no data plane"
            )));
        }
        let route = Route {
            node: record.address.clone(),
            jwt: e2b.tokens.issue(&record.id, &record.token)?,
            traffic: e2b.traffic_token(&record),
            mask: record.network.mask_request_host.clone(),
            agent_token: record.token,
        };
        self.routes.insert(sandbox.to_string(), route.clone());
        Ok(route)
    }
}

fn has_body(req: &HttpRequest) -> bool {
    let h = req.headers();
    if let Some(len) = header_str(h, "content-length") {
        return len.trim() != "0";
    }
    if req.version() == actix_web::http::Version::HTTP_2 {
        // HTTP/2 frames its body without a length header; only methods without one are sure.
        return !matches!(req.method().as_str(), "GET" | "HEAD" | "OPTIONS");
    }
    h.contains_key(header::TRANSFER_ENCODING)
}

/// The client's body, streamed to the sandbox with bounded buffering (back-pressure).
fn request_body(mut payload: web::Payload, counted: ByteCounters) -> ProxyBody {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, io::Error>>(BODY_CHUNKS);
    // The payload lives on this worker's thread; a local task feeds the channel. When the
    // sandbox answers before it has read everything, the rest is still read (and dropped) for
    // a while: the client sends its whole body before it reads the answer, and closing on
    // unread data would reset the connection under it.
    actix_web::rt::spawn(async move {
        let mut answered_at: Option<std::time::Instant> = None;
        while let Some(chunk) = payload.next().await {
            if let Some(at) = answered_at {
                if at.elapsed() > DRAIN_FOR || chunk.is_err() {
                    break;
                }
                continue;
            }
            let item = chunk.map_err(|e| io::Error::other(e.to_string()));
            if let Ok(b) = &item {
                counted.went_in(b.len());
            }
            let failed = item.is_err();
            if tx.send(item).await.is_err() {
                answered_at = Some(std::time::Instant::now());
            } else if failed {
                break;
            }
        }
    });
    StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx).map_ok(Frame::data))
        .boxed_unsync()
}

/// The declared length of an idempotent request's body when it is small enough to keep whole.
fn small_idempotent_body(req: &HttpRequest) -> Option<u64> {
    use actix_web::http::Method;
    let idempotent = matches!(*req.method(), Method::PUT | Method::DELETE | Method::GET);
    let len = header_str(req.headers(), "content-length")?
        .trim()
        .parse::<u64>()
        .ok()?;
    (idempotent && len <= REPLAYABLE_BODY).then_some(len)
}

/// The whole body, which declared `len` bytes.
async fn read_whole(mut payload: web::Payload, len: u64) -> Result<Bytes, String> {
    let mut buf = bytes::BytesMut::with_capacity(len as usize);
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| format!("reading the request body: {e}"))?;
        if (buf.len() + chunk.len()) as u64 > len {
            return Err("the request body is longer than its Content-Length".into());
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

fn empty_body() -> ProxyBody {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn tunnel_failure(e: TunnelError, target: &Target, proxy: &Proxy) -> HttpResponse {
    match e {
        TunnelError::Refused { status: 404, .. } => {
            proxy.routes.invalidate(&target.sandbox);
            proxy.tunnels.forget(&target.sandbox);
            answer(502, &target.published, NOT_FOUND)
        }
        TunnelError::Refused { status: 409, .. } => answer(502, &target.published, NOT_FOUND),
        TunnelError::Refused {
            status: 502,
            message,
        } if message.contains(crate::node::dataplane::PORT_CLOSED) => {
            answer(502, &target.published, PORT_CLOSED)
        }
        TunnelError::Refused { status, message } => {
            tracing::warn!(sandbox = %target.sandbox, status, %message, "the node refused a data-plane tunnel");
            answer(502, &target.published, &format!("{NOT_FOUND}: {message}"))
        }
        TunnelError::Broken(message) => {
            // Not "not found": the sandbox may live on (a connection that broke) or have gone
            // with its node; the next request dials afresh and finds out.
            tracing::warn!(sandbox = %target.sandbox, %message, "data-plane tunnel failed");
            proxy.tunnels.forget(&target.sandbox);
            answer(502, &target.published, &format!("{BROKEN}: {message}"))
        }
    }
}

/// Streams one request to its sandbox and the answer back.
pub async fn forward(req: HttpRequest, payload: web::Payload, e2b: web::Data<E2b>) -> HttpResponse {
    let target = match detect(req.head(), e2b.domain.as_deref()) {
        Some(Ok(t)) => t,
        Some(Err(target::Malformed(why))) => return answer(400, "", &why),
        None => return answer(404, "", "not a data-plane request"),
    };
    let route = match e2b.proxy.route(&e2b, &target.sandbox).await {
        Ok(r) => r,
        Err(e) => return route_failure(&e, &target.published),
    };
    let mut agent_token = None;
    if let Some(wanted) = route.traffic.as_deref().filter(|_| !target.is_envd()) {
        // The messages are e2b's edge's, which clients may match on.
        match header_str(req.headers(), TRAFFIC_TOKEN) {
            None => {
                return answer(
                    403,
                    &target.published,
                    "Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing",
                );
            }
            Some(presented) if !bool::from(presented.as_bytes().ct_eq(wanted.as_bytes())) => {
                return answer(
                    403,
                    &target.published,
                    "Sandbox is secured with traffic access token. Provided token in header 'e2b-traffic-access-token' is invalid",
                );
            }
            Some(_) => {}
        }
    }
    if target.is_envd() {
        if req.path() == "/init" {
            return answer(
                403,
                &target.published,
                "/init belongs to the sandbox's node",
            );
        }
        let presented = header_str(req.headers(), ACCESS_TOKEN);
        let signed = Signed::from_request(req.method().as_str(), req.path(), req.query_string());
        let now = chrono::Utc::now().timestamp();
        if credentials::decide(presented, &route.jwt, signed.as_ref(), now) == Access::Grant {
            agent_token = Some(route.agent_token.as_str());
        }
    }
    let upgrade = is_upgrade(&req);
    let small = small_idempotent_body(&req);
    let counted = e2b.proxy.byte_counters();
    let mut buffered = None;
    let (body, payload) = if upgrade || !has_body(&req) {
        (empty_body(), Some(payload))
    } else if let Some(limit) = small {
        match read_whole(payload, limit).await {
            Ok(bytes) => {
                counted.went_in(bytes.len());
                buffered = Some(Buffered(bytes.clone()));
                (full_body(bytes), None)
            }
            Err(why) => return answer(400, &target.published, &why),
        }
    } else {
        (request_body(payload, counted.clone()), None)
    };
    // envd's traffic is never masked.
    let masked = route
        .mask
        .as_deref()
        .filter(|_| !target.is_envd())
        .map(|m| crate::model::mask::apply(m, target.port));
    let mut upstream = match upstream_request(&req, body, agent_token, masked.as_deref()) {
        Ok(r) => r,
        Err(why) => return answer(400, &target.published, &why),
    };
    if let Some(b) = buffered {
        upstream.extensions_mut().insert(b);
    }
    let bearer = e2b.dispatcher.fleet_token().to_string();
    let sent = e2b
        .proxy
        .tunnels
        .send(
            &route.node,
            &target.sandbox,
            target.port,
            &bearer,
            upstream,
            upgrade,
        )
        .await;
    let resp = match sent {
        Ok(r) => r,
        Err(e) => return tunnel_failure(e, &target, &e2b.proxy),
    };
    let origin = if req.headers().contains_key(target::ID_HEADER) {
        Origin::Gateway
    } else {
        Origin::Own
    };
    if upgrade && resp.status() == hyper::StatusCode::SWITCHING_PROTOCOLS {
        return switch_protocols(resp, payload, counted, origin).await;
    }
    respond(
        resp,
        req.method() == actix_web::http::Method::HEAD,
        counted,
        origin,
    )
}

fn respond(
    resp: hyper::Response<hyper::body::Incoming>,
    head: bool,
    counted: ByteCounters,
    origin: Origin,
) -> HttpResponse {
    let status = actix_web::http::StatusCode::from_u16(resp.status().as_u16())
        .unwrap_or(actix_web::http::StatusCode::BAD_GATEWAY);
    let mut b = HttpResponse::build(status);
    copy_headers(resp.headers(), &mut b, false, origin);
    let length = resp
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let stream = BodyDataStream::new(resp.into_body())
        .map_err(|e| io::Error::other(e.to_string()))
        .inspect_ok(move |b| counted.came_out(b.len()));
    let mut res = if head
        || status == actix_web::http::StatusCode::NO_CONTENT
        || status == actix_web::http::StatusCode::NOT_MODIFIED
    {
        if let Some(len) = length.filter(|_| head) {
            b.insert_header((header::CONTENT_LENGTH, len));
        }
        b.finish()
    } else {
        match length {
            Some(len) => b.body(SizedStream::new(len, stream)),
            None => b.body(BodyStream::new(stream)),
        }
    };
    res.extensions_mut().insert(Passthrough);
    res
}

/// After a 101: the client's connection and the sandbox's become one byte stream.
async fn switch_protocols(
    mut resp: hyper::Response<hyper::body::Incoming>,
    payload: Option<web::Payload>,
    counted: ByteCounters,
    origin: Origin,
) -> HttpResponse {
    let mut b = HttpResponse::SwitchingProtocols();
    let upgrade = resp
        .headers()
        .get(hyper::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("websocket")
        .to_string();
    copy_headers(resp.headers(), &mut b, false, origin);
    b.upgrade(upgrade);
    let upgraded = match hyper::upgrade::on(&mut resp).await {
        Ok(u) => u,
        Err(e) => return answer(502, "", &format!("the upgrade failed: {e}")),
    };
    let (read, mut write) = tokio::io::split(hyper_util::rt::TokioIo::new(upgraded));
    if let Some(mut payload) = payload {
        let counted = counted.clone();
        actix_web::rt::spawn(async move {
            while let Some(Ok(chunk)) = payload.next().await {
                counted.went_in(chunk.len());
                if write.write_all(&chunk).await.is_err() {
                    break;
                }
            }
            let _ = write.shutdown().await;
        });
    }
    let read =
        tokio_util::io::ReaderStream::new(read).inspect_ok(move |b| counted.came_out(b.len()));
    let mut res = b.body(BodyStream::new(read));
    res.extensions_mut().insert(Passthrough);
    res
}

/// The published id's claim id, for callers that only have what the SDK sent.
pub fn claim_id(published: &str) -> Option<String> {
    ids::canonical_claim_id(published)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_node_is_a_retry_not_a_missing_sandbox() {
        let slow = crate::model::Error::unavailable("node n did not answer get within 1s");
        let r = route_failure(&slow, "sb-1");
        assert_eq!(r.status().as_u16(), 503);
        assert_eq!(r.headers().get(header::RETRY_AFTER).unwrap(), "1");
        let gone = crate::model::Error::not_found("sandbox sb_1 not found");
        assert_eq!(route_failure(&gone, "sb-1").status().as_u16(), 502);
    }
}
