//! HTTP to a sandbox's port through its node: a CONNECT tunnel to the node's data plane
//! (authenticated with the fleet token), then HTTP/1.1 over it with hyper. Connections are
//! kept per (node, sandbox, port) and reused once their previous exchange is over; a request
//! that a stale connection could not even start, or that a reused connection dropped before
//! any answer when repeating it is safe, is retried once on a fresh one.

use std::collections::HashMap;
use std::io;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response, body::Incoming};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::iox::Prefixed;

pub type ProxyBody = UnsyncBoxBody<Bytes, io::Error>;

/// A request's whole body, kept beside it (as an extension) so that the request can be sent
/// again if a reused connection drops it (see `replayable`).
#[derive(Clone)]
pub struct Buffered(pub Bytes);

/// A body of `bytes`, as the proxy sends it.
pub fn full_body(bytes: Bytes) -> ProxyBody {
    use http_body_util::BodyExt;
    http_body_util::Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
const MAX_HEAD: usize = 16 * 1024;
const IDLE_PER_TARGET: usize = 16;

/// Why a request did not reach the sandbox.
#[derive(Debug, Clone)]
pub enum TunnelError {
    /// The node answered the CONNECT with this status and message.
    Refused { status: u16, message: String },
    /// The node could not be reached, or the exchange broke.
    Broken(String),
}

/// Parses a CONNECT answer head: its status, and the byte offset where the head ends.
fn parse_answer(buf: &[u8]) -> Option<(u16, usize, Option<usize>)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..end]);
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(502);
    let length = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse().ok())
            .flatten()
    });
    Some((status, end + 4, length))
}

/// Opens a tunnel to `port` of `sandbox` through the node at `node`.
pub async fn open(
    node: &str,
    sandbox: &str,
    port: u16,
    bearer: &str,
) -> Result<Prefixed, TunnelError> {
    let opened = tokio::time::timeout(CONNECT_TIMEOUT, async {
        let mut s = TcpStream::connect(node)
            .await
            .map_err(|e| TunnelError::Broken(format!("node {node}: {e}")))?;
        let _ = s.set_nodelay(true);
        let head = format!(
            "CONNECT {sandbox}:{port} HTTP/1.1\r\nhost: {sandbox}:{port}\r\nproxy-authorization: Bearer {bearer}\r\n\r\n"
        );
        s.write_all(head.as_bytes())
            .await
            .map_err(|e| TunnelError::Broken(format!("node {node}: {e}")))?;
        let mut buf = Vec::with_capacity(256);
        let mut chunk = [0u8; 1024];
        loop {
            if let Some((status, end, length)) = parse_answer(&buf) {
                if status == 200 {
                    let prefix = Bytes::copy_from_slice(&buf[end..]);
                    return Ok(Prefixed::new(prefix, s));
                }
                let want = end + length.unwrap_or(0).min(MAX_HEAD);
                while buf.len() < want {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let body = &buf[end..buf.len().min(want)];
                let message = serde_json::from_slice::<serde_json::Value>(body)
                    .ok()
                    .and_then(|v| v.get("message")?.as_str().map(str::to_string))
                    .unwrap_or_else(|| String::from_utf8_lossy(body).to_string());
                return Err(TunnelError::Refused { status, message });
            }
            if buf.len() > MAX_HEAD {
                return Err(TunnelError::Broken(format!("node {node} sent an oversized answer")));
            }
            match s.read(&mut chunk).await {
                Ok(0) => return Err(TunnelError::Broken(format!("node {node} closed the tunnel"))),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(TunnelError::Broken(format!("node {node}: {e}"))),
            }
        }
    })
    .await;
    opened.unwrap_or_else(|_| {
        Err(TunnelError::Broken(format!(
            "node {node} did not open the tunnel in time"
        )))
    })
}

/// A node in this very process (the gateway's embedded node): its tunnels open by a call,
/// and the bytes go straight to the sandbox instead of through a loopback hop to the node's
/// data plane and the node's copy of them.
pub trait LocalNode: Send + Sync {
    /// The tunnel the node's data plane would give for `CONNECT sandbox:port` with `bearer`,
    /// or its refusal (the status and message the data plane would answer).
    fn open<'a>(
        &'a self,
        sandbox: &'a str,
        port: u16,
        bearer: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<crate::node::runtime::Conn, TunnelError>>;
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    node: String,
    sandbox: String,
    port: u16,
}

/// Idle HTTP/1.1 connections into sandboxes.
#[derive(Default)]
pub struct Tunnels {
    idle: Mutex<HashMap<Key, Vec<SendRequest<ProxyBody>>>>,
    /// Connections given back since the last sweep.
    returned: std::sync::atomic::AtomicUsize,
    /// The node that runs in this process, by its data-plane address.
    local: std::sync::OnceLock<(String, std::sync::Arc<dyn LocalNode>)>,
}

/// Every this many returned connections, targets whose connections have all closed (their
/// sandbox is gone, by whatever way it went) are dropped; without it every sandbox ever
/// reached keeps an entry (found by the soak: gateway memory grew with each cycle).
const SWEEP_EVERY: usize = 64;

fn broken(e: impl std::fmt::Display) -> TunnelError {
    TunnelError::Broken(e.to_string())
}

impl Tunnels {
    fn take(&self, key: &Key) -> Option<SendRequest<ProxyBody>> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let list = idle.get_mut(key)?;
        let mut found = None;
        while let Some(s) = list.pop() {
            if s.is_ready() {
                found = Some(s);
                break;
            }
        }
        if list.is_empty() {
            idle.remove(key);
        }
        found
    }

    fn give_back(&self, key: Key, sender: SendRequest<ProxyBody>) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let list = idle.entry(key).or_default();
        list.retain(|s| !s.is_closed());
        if list.len() < IDLE_PER_TARGET {
            list.push(sender);
        }
        let returned = self
            .returned
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if returned % SWEEP_EVERY == SWEEP_EVERY - 1 {
            Self::sweep(&mut idle);
        }
    }

    /// Drops closed connections, and targets left without any.
    fn sweep(idle: &mut HashMap<Key, Vec<SendRequest<ProxyBody>>>) {
        idle.retain(|_, list| {
            list.retain(|s| !s.is_closed());
            !list.is_empty()
        });
    }

    /// Targets with idle connections (for tests).
    #[cfg(test)]
    fn targets(&self) -> usize {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Forgets the connections of a sandbox that is gone.
    pub fn forget(&self, sandbox: &str) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.retain(|k, _| k.sandbox != sandbox);
    }

    /// Reaches the node whose data plane is at `address` by calls instead (set once, by the
    /// process that runs it).
    pub fn set_local(&self, address: String, node: std::sync::Arc<dyn LocalNode>) {
        let _ = self.local.set((address, node));
    }

    async fn connect(
        &self,
        node: &str,
        sandbox: &str,
        port: u16,
        bearer: &str,
        upgrades: bool,
    ) -> Result<SendRequest<ProxyBody>, TunnelError> {
        let stream: crate::node::runtime::Conn = match self.local.get() {
            Some((address, local)) if address == node => local.open(sandbox, port, bearer).await?,
            _ => Box::new(open(node, sandbox, port, bearer).await?),
        };
        let (sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(broken)?;
        if upgrades {
            tokio::spawn(async move {
                let _ = conn.with_upgrades().await;
            });
        } else {
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
        Ok(sender)
    }

    /// Sends `req` to `port` of `sandbox` on `node`. With `upgrade` the connection is a fresh
    /// one that can be taken over after a 101 answer.
    pub async fn send(
        self: &std::sync::Arc<Self>,
        node: &str,
        sandbox: &str,
        port: u16,
        bearer: &str,
        req: Request<ProxyBody>,
        upgrade: bool,
    ) -> Result<Response<Incoming>, TunnelError> {
        let key = Key {
            node: node.to_string(),
            sandbox: sandbox.to_string(),
            port,
        };
        let mut req = req;
        if !upgrade && let Some(mut sender) = self.take(&key) {
            let replay = replayable(&req);
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    self.recycle(key, sender);
                    return Ok(resp);
                }
                Err(mut e) => match (e.take_message(), replay) {
                    // Never started: the connection was stale. Once more, on a fresh one.
                    (Some(r), _) => req = r,
                    // The server closed a reused connection without a byte of answer (its
                    // idle close crossed our request). An idempotent request without a body
                    // may be sent again (RFC 9110, 9.2.2); anything else could act twice.
                    (None, Some(again)) if e.error().is_incomplete_message() => req = again,
                    (None, _) => return Err(broken(e.into_error())),
                },
            }
        }
        let mut sender = self.connect(node, sandbox, port, bearer, upgrade).await?;
        let resp = sender.send_request(req).await.map_err(broken)?;
        if !upgrade {
            self.recycle(key, sender);
        }
        Ok(resp)
    }

    /// Returns the connection to the pool once its current exchange has finished.
    fn recycle(self: &std::sync::Arc<Self>, key: Key, mut sender: SendRequest<ProxyBody>) {
        let me = self.clone();
        tokio::spawn(async move {
            if sender.ready().await.is_ok() {
                me.give_back(key, sender);
            }
        });
    }
}

/// A copy of `req` to send again if a reused connection drops it: only for idempotent methods
/// with an empty body or one kept whole beside the request (`Buffered`), which is all that can
/// be rebuilt and safely repeated.
fn replayable(req: &Request<ProxyBody>) -> Option<Request<ProxyBody>> {
    use http_body_util::BodyExt;
    use hyper::body::Body;
    let idempotent = matches!(
        *req.method(),
        hyper::Method::GET
            | hyper::Method::HEAD
            | hyper::Method::OPTIONS
            | hyper::Method::DELETE
            | hyper::Method::PUT
    );
    let buffered = req.extensions().get::<Buffered>().cloned();
    if !idempotent || (buffered.is_none() && !req.body().is_end_stream()) {
        return None;
    }
    let mut copy = Request::new(match &buffered {
        Some(b) => full_body(b.0.clone()),
        None => http_body_util::Empty::<Bytes>::new()
            .map_err(|never| match never {})
            .boxed_unsync(),
    });
    if let Some(b) = buffered {
        copy.extensions_mut().insert(b);
    }
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    Some(copy)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection over an in-memory pipe; dropping the returned end closes it.
    async fn pipe_connection() -> (SendRequest<ProxyBody>, tokio::io::DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(1024);
        let (sender, conn) = http1::Builder::new()
            .handshake(hyper_util::rt::TokioIo::new(ours))
            .await
            .expect("handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        (sender, theirs)
    }

    #[tokio::test]
    async fn targets_whose_connections_closed_are_swept() {
        let tunnels = Tunnels::default();
        let key = |s: &str| Key {
            node: "n".into(),
            sandbox: s.into(),
            port: 1,
        };
        let (alive, _keep) = pipe_connection().await;
        tunnels.give_back(key("alive"), alive);
        // With the open one, SWEEP_EVERY returns: the last one sweeps.
        for i in 1..SWEEP_EVERY {
            let (gone, other_end) = pipe_connection().await;
            drop(other_end);
            // Let the connection task see the close.
            for _ in 0..50 {
                if gone.is_closed() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            tunnels.give_back(key(&format!("gone-{i}")), gone);
        }
        assert_eq!(
            tunnels.targets(),
            1,
            "only the open connection's target is kept"
        );
        assert!(tunnels.take(&key("alive")).is_some());
        assert_eq!(tunnels.targets(), 0, "an emptied target is dropped at once");
    }

    fn request(method: &str, body: ProxyBody) -> Request<ProxyBody> {
        let mut r = Request::new(body);
        *r.method_mut() = method.parse().expect("method");
        *r.uri_mut() = "/execute?x=1".parse().expect("uri");
        r.headers_mut()
            .insert("x-test", hyper::header::HeaderValue::from_static("kept"));
        r
    }

    fn empty() -> ProxyBody {
        use http_body_util::BodyExt;
        http_body_util::Empty::<Bytes>::new()
            .map_err(|never| match never {})
            .boxed_unsync()
    }

    #[test]
    fn only_idempotent_requests_with_a_body_that_can_be_rebuilt_are_replayable() {
        use http_body_util::BodyExt;
        let copy = replayable(&request("DELETE", empty())).expect("DELETE without a body");
        assert_eq!(copy.method(), hyper::Method::DELETE);
        assert_eq!(copy.uri(), "/execute?x=1");
        assert_eq!(copy.headers()["x-test"], "kept");
        assert!(replayable(&request("GET", empty())).is_some());
        assert!(
            replayable(&request("POST", empty())).is_none(),
            "POST may act twice"
        );
        let streamed = http_body_util::Full::new(Bytes::from_static(b"x"))
            .map_err(|never| match never {})
            .boxed_unsync();
        assert!(
            replayable(&request("PUT", streamed)).is_none(),
            "a body cannot be rebuilt"
        );
        // A body kept whole beside the request is sent again as it was.
        let mut kept = request("DELETE", full_body(Bytes::from_static(b"{\"a\":1}")));
        kept.extensions_mut()
            .insert(Buffered(Bytes::from_static(b"{\"a\":1}")));
        let copy = replayable(&kept).expect("a kept body can be rebuilt");
        let body = futures::executor::block_on(copy.into_body().collect()).unwrap();
        assert_eq!(body.to_bytes(), Bytes::from_static(b"{\"a\":1}"));
        let mut posted = request("POST", full_body(Bytes::from_static(b"x")));
        posted
            .extensions_mut()
            .insert(Buffered(Bytes::from_static(b"x")));
        assert!(
            replayable(&posted).is_none(),
            "POST may act twice, body or not"
        );
    }

    /// The case the replay is for: the server reads the request and closes without answering.
    #[tokio::test]
    async fn a_dropped_exchange_is_an_incomplete_message_without_the_request() {
        use tokio::io::AsyncReadExt;
        let (mut sender, mut theirs) = pipe_connection().await;
        tokio::spawn(async move {
            let mut buf = [0u8; 256];
            let _ = theirs.read(&mut buf).await;
            drop(theirs);
        });
        let mut e = sender
            .try_send_request(request("DELETE", empty()))
            .await
            .expect_err("no answer");
        assert!(e.take_message().is_none(), "the request was sent");
        assert!(e.error().is_incomplete_message(), "{}", e.error());
    }

    #[test]
    fn connect_answers_parse() {
        let (status, end, len) =
            parse_answer(b"HTTP/1.1 200 Connection Established\r\n\r\nxyz").unwrap();
        assert_eq!((status, end, len), (200, 39, None));
        let (status, _, len) = parse_answer(
            b"HTTP/1.1 409 Conflict\r\ncontent-type: application/json\r\nContent-Length: 12\r\n\r\n",
        )
        .unwrap();
        assert_eq!((status, len), (409, Some(12)));
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\n").is_none());
        assert_eq!(parse_answer(b"garbage\r\n\r\n").unwrap().0, 502);
    }
}
