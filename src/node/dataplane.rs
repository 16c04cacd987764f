//! The node's data plane: the only way into a sandbox. A client (the gateway, or anyone holding
//! a sandbox's own token) sends an HTTP `CONNECT <sandbox id>:<port>` with
//! `Proxy-Authorization: Bearer <fleet token | sandbox token>`; the node checks the credential,
//! that the sandbox runs here and has taken its identity, dials the port inside the sandbox
//! through the runtime, answers `200`, and then only copies bytes both ways. Nothing inside a
//! sandbox ever listens on the host.

use std::time::Duration;

use subtle::ConstantTimeEq;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::Node;
use super::runtime::Runtime;
use crate::model::logs::LogLevel;
use crate::model::{Error, ErrorKind, Phase, Result, ids};

/// The longest CONNECT head accepted.
const MAX_HEAD: usize = 8 * 1024;
/// How long a client may take to send its CONNECT head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a tunnel to a just-claimed sandbox waits for its agent to take its identity.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Buffers of the byte copy; large enough that bulk transfers are not bound by syscalls.
const COPY_BUFFER: usize = 256 * 1024;

/// A parsed CONNECT request.
#[derive(Debug, PartialEq, Eq)]
pub struct ConnectHead {
    pub sandbox: String,
    pub port: u16,
    pub bearer: Option<String>,
    /// Bytes the client sent after the head (already the tunnelled stream's).
    pub rest: Vec<u8>,
}

/// Parses `CONNECT id:port HTTP/1.1` and its headers from `buf`, or says why it is not one.
/// Answers None while the head is incomplete.
pub fn parse_head(buf: &[u8]) -> Option<std::result::Result<ConnectHead, String>> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = match std::str::from_utf8(&buf[..end]) {
        Ok(h) => h,
        Err(_) => return Some(Err("the request head is not UTF-8".into())),
    };
    let mut lines = head.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let mut parts = first.split(' ');
    let (method, target, version) = (parts.next(), parts.next(), parts.next());
    if method != Some("CONNECT") || !version.is_some_and(|v| v.starts_with("HTTP/1.")) {
        return Some(Err(format!(
            "expected `CONNECT <sandbox>:<port> HTTP/1.1`, got {first:?}"
        )));
    }
    let Some((sandbox, port)) = target.and_then(|t| t.rsplit_once(':')) else {
        return Some(Err("the CONNECT target must be <sandbox id>:<port>".into()));
    };
    let Ok(port) = port.parse::<u16>() else {
        return Some(Err(format!("{port:?} is not a port")));
    };
    if port == 0 {
        return Some(Err("port 0 is not a port".into()));
    }
    let bearer = lines.find_map(|l| {
        let (name, value) = l.split_once(':')?;
        if !name.trim().eq_ignore_ascii_case("proxy-authorization") {
            return None;
        }
        let value = value.trim();
        let (scheme, token) = value.split_once(' ')?;
        scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| token.trim().to_string())
    });
    Some(Ok(ConnectHead {
        sandbox: sandbox.to_string(),
        port,
        bearer,
        rest: buf[end + 4..].to_vec(),
    }))
}

/// The status (and reason phrase) a refused tunnel is answered with.
pub fn status_line(kind: ErrorKind) -> (u16, &'static str) {
    match kind {
        ErrorKind::Unauthenticated => (401, "Unauthorized"),
        ErrorKind::Forbidden => (403, "Forbidden"),
        ErrorKind::NotFound => (404, "Not Found"),
        ErrorKind::Invalid => (400, "Bad Request"),
        ErrorKind::Conflict => (409, "Conflict"),
        ErrorKind::Unavailable | ErrorKind::NoCapacity => (503, "Service Unavailable"),
        _ => (502, "Bad Gateway"),
    }
}

/// The answer to a CONNECT that is refused: the status carries the reason's kind, the JSON
/// body its message.
fn refusal(err: &Error) -> Vec<u8> {
    let (code, reason) = status_line(err.kind);
    let body = serde_json::json!({"code": code, "message": err.message}).to_string();
    format!(
        "HTTP/1.1 {code} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Whether a data-plane request is Prometheus's scrape of the node (`GET /metrics`), the one
/// plain HTTP request the listener answers besides CONNECT.
fn is_metrics_scrape(buf: &[u8]) -> bool {
    buf.starts_with(b"GET /metrics HTTP/1.") || buf.starts_with(b"GET /metrics?")
}

/// The answer to a scrape: the metrics text, then the connection closes.
fn metrics_answer(text: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
        text.len()
    )
    .into_bytes()
}

/// A sandbox a tunnel may be dialled into (see `Node::admit_tunnel`).
pub struct Admitted<H>(super::runtime::Instance<H>);

/// Port errors come back as Bad Gateway with a machine-readable reason, so that the gateway
/// can tell "not listening" from "not there".
pub const PORT_CLOSED: &str = "port is not open";

impl<R: Runtime> Node<R> {
    /// Checks the credential and the sandbox, and connects to `port` inside it.
    pub async fn open_tunnel(
        &self,
        sandbox: &str,
        port: u16,
        bearer: Option<&str>,
        fleet_token: &str,
    ) -> Result<(super::runtime::Conn, tokio_util::sync::CancellationToken)> {
        let (admitted, closed) = self
            .admit_tunnel(sandbox, port, bearer, fleet_token)
            .await?;
        Ok((self.dial_admitted(&admitted, port).await?, closed))
    }

    /// Connects to `port` inside a sandbox `admit_tunnel` let in. The socket belongs to the
    /// calling runtime, so it is dialled where it will be used.
    pub async fn dial_admitted(
        &self,
        admitted: &Admitted<R::Handle>,
        port: u16,
    ) -> Result<super::runtime::Conn> {
        self.inner
            .runtime
            .dial(&admitted.0, port)
            .await
            .map_err(|e| Error::new(ErrorKind::Internal, format!("{PORT_CLOSED}: {}", e.message)))
    }

    /// Checks the credential and the sandbox (waking it if it auto-resumes, and waiting until
    /// its agent has taken its identity): what a tunnel to `port` inside it needs before the
    /// dial. Answers the sandbox and the token cancelled when its tunnels must close.
    pub async fn admit_tunnel(
        &self,
        sandbox: &str,
        port: u16,
        bearer: Option<&str>,
        fleet_token: &str,
    ) -> Result<(Admitted<R::Handle>, tokio_util::sync::CancellationToken)> {
        let id = ids::canonical_claim_id(sandbox)
            .ok_or_else(|| Error::not_found(format!("{sandbox:?} is not a sandbox id")))?;
        let bearer = bearer
            .ok_or_else(|| Error::unauthenticated("Proxy-Authorization: Bearer is required"))?;
        let (record, inst, closed) = {
            let st = self.state();
            match st.claims.get(&id) {
                Some(c) => (c.record.clone(), c.instance.clone(), c.tunnels.clone()),
                None => return Err(self.not_found(&st, &id)),
            }
        };
        let fleet = bool::from(bearer.as_bytes().ct_eq(fleet_token.as_bytes()));
        let own = !record.token.is_empty()
            && bool::from(bearer.as_bytes().ct_eq(record.token.as_bytes()));
        if !fleet && !own {
            return Err(Error::unauthenticated(format!(
                "the credential does not open sandbox {id}"
            )));
        }
        let closed = if record.phase == Phase::Paused {
            if !record.lifecycle.auto_resume {
                return Err(Error::conflict(format!("sandbox {id} is paused")));
            }
            if record.paused_on_disk() {
                // As on e2b: traffic never cold-boots a sandbox; connect does.
                return Err(Error::conflict(format!(
                    "sandbox {id} is paused without its memory (filesystem-only); traffic does not resume it, connect does"
                )));
            }
            // Reaching an auto-resuming sandbox wakes it, as on e2b.
            self.set_paused(&id, false).await?;
            tracing::info!(id, "resumed by data-plane traffic");
            self.note(
                &id,
                LogLevel::Info,
                format!("auto-resumed by a connection to port {port}"),
            );
            let st = self.state();
            match st.claims.get(&id) {
                Some(c) => c.tunnels.clone(),
                None => return Err(self.not_found(&st, &id)),
            }
        } else {
            closed
        };
        self.wait_ready(&id, READY_TIMEOUT).await?;
        Ok((Admitted(inst), closed))
    }

    async fn tunnel(&self, mut client: TcpStream, fleet_token: &str) {
        let mut buf = Vec::with_capacity(1024);
        let head = tokio::time::timeout(HEAD_TIMEOUT, async {
            let mut chunk = [0u8; 2048];
            loop {
                if let Some(parsed) = parse_head(&buf) {
                    return Some(parsed);
                }
                if buf.len() > MAX_HEAD {
                    return Some(Err("the CONNECT head is too long".into()));
                }
                match client.read(&mut chunk).await {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        })
        .await;
        let head = match head {
            Ok(Some(Ok(h))) => h,
            Ok(Some(Err(_))) if is_metrics_scrape(&buf) => {
                let _ = client
                    .write_all(&metrics_answer(&self.metrics_text()))
                    .await;
                return;
            }
            Ok(Some(Err(why))) => {
                let _ = client.write_all(&refusal(&Error::invalid(why))).await;
                return;
            }
            Ok(None) | Err(_) => return,
        };
        let upstream = self
            .open_tunnel(
                &head.sandbox,
                head.port,
                head.bearer.as_deref(),
                fleet_token,
            )
            .await;
        let (mut upstream, closed) = match upstream {
            Ok(u) => u,
            Err(e) => {
                let _ = client.write_all(&refusal(&e)).await;
                return;
            }
        };
        if client
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
        if !head.rest.is_empty() && upstream.write_all(&head.rest).await.is_err() {
            return;
        }
        tokio::select! {
            copied = tokio::io::copy_bidirectional_with_sizes(
                &mut client,
                &mut upstream,
                COPY_BUFFER,
                COPY_BUFFER,
            ) => {
                if let Ok((to, from)) = copied {
                    self.metrics().tunnelled(to, from);
                }
            }
            _ = closed.cancelled() => {}
        }
    }

    /// Serves the data plane on `listener` until the node shuts down.
    pub async fn serve_data_plane(self, listener: TcpListener, fleet_token: String) {
        let stop = self.shutdown_token();
        let fleet_token = std::sync::Arc::new(fleet_token);
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = stop.cancelled() => return,
            };
            match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let node = self.clone();
                    let token = fleet_token.clone();
                    tokio::spawn(async move { node.tunnel(stream, &token).await });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a data-plane connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_get_of_metrics_is_a_scrape() {
        assert!(is_metrics_scrape(
            b"GET /metrics HTTP/1.1\r\nHost: n\r\n\r\n"
        ));
        assert!(is_metrics_scrape(b"GET /metrics?x=1 HTTP/1.1\r\n\r\n"));
        for other in [
            &b"GET /metricsx HTTP/1.1\r\n\r\n"[..],
            b"POST /metrics HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n",
            b"CONNECT sb-1:49983 HTTP/1.1\r\n\r\n",
        ] {
            assert!(!is_metrics_scrape(other), "{other:?}");
        }
        let answer = metrics_answer("a 1\n");
        assert!(answer.starts_with(b"HTTP/1.1 200 OK\r\n"));
        assert!(answer.ends_with(b"content-length: 4\r\nconnection: close\r\n\r\na 1\n"));
    }

    #[test]
    fn connect_heads_parse() {
        let h = parse_head(
            b"CONNECT sb-0123456789abcdef:49983 HTTP/1.1\r\nHost: x\r\nproxy-authorization: Bearer tok\r\n\r\nGET /",
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.sandbox, "sb-0123456789abcdef");
        assert_eq!(h.port, 49983);
        assert_eq!(h.bearer.as_deref(), Some("tok"));
        assert_eq!(h.rest, b"GET /");
        assert!(
            parse_head(b"CONNECT a:1 HTTP/1.1\r\n").is_none(),
            "incomplete"
        );
        for bad in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"CONNECT nocolon HTTP/1.1\r\n\r\n",
            b"CONNECT a:99999 HTTP/1.1\r\n\r\n",
            b"CONNECT a:0 HTTP/1.1\r\n\r\n",
            b"CONNECT a:1 SPDY\r\n\r\n",
            b"CONNECT \xff:1 HTTP/1.1\r\n\r\n",
        ] {
            assert!(parse_head(bad).unwrap().is_err(), "{bad:?}");
        }
        let h = parse_head(b"CONNECT a:1 HTTP/1.1\r\nProxy-Authorization: Basic x\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.bearer, None);
    }

    #[test]
    fn refusals_carry_the_kind_and_message() {
        let r = String::from_utf8(refusal(&Error::conflict("sandbox x is paused"))).unwrap();
        assert!(r.starts_with("HTTP/1.1 409 Conflict\r\n"));
        assert!(r.ends_with(r#"{"code":409,"message":"sandbox x is paused"}"#));
    }
}
