//! Connections to a host whose rule sets headers: the proxy answers them itself (TLS with the
//! sandbox's CA on 443, plain HTTP on 80), sets the rule's headers on every request (replacing
//! any of the same name, `${e2b.secrets.NAME}` filled from the tenant's secrets at that moment)
//! and forwards each request to the real host, dialled by name from the node, over TLS verified
//! against the node's trusted roots. A secret never enters the sandbox, and is only ever sent
//! over TLS: a rule that would put one in a plain HTTP request answers 502 instead. A request
//! that asks to switch protocols (a WebSocket's) gets the headers too and, once the host
//! agrees (101), becomes a plain pipe between the two on a connection of its own.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::net::Ipv4Addr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::AbortHandle;
use zeroize::Zeroizing;

use super::ca::SandboxCa;
use super::proxy::Dialer;
use crate::model::transforms::{Piece, pieces};
use crate::secrets::SecretStore;

/// What every interception on a node shares.
pub struct Interception {
    /// Where placeholders are filled from (None: a node without a secret store).
    pub secrets: Option<Arc<SecretStore>>,
    /// How the real hosts are verified.
    pub upstream_tls: Arc<rustls::ClientConfig>,
}

impl Interception {
    /// The node's trusted roots plus `extra` (PEM certificates an operator adds).
    pub fn new(secrets: Option<Arc<SecretStore>>, extra: &[String]) -> crate::model::Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for cert in native.certs {
            // A system certificate rustls cannot use is skipped, as every rustls client does.
            let _ = roots.add(cert);
        }
        for pem in extra {
            for cert in crate::tlsx::parse_certs(pem.as_bytes())? {
                roots.add(cert).map_err(|e| {
                    crate::model::Error::invalid(format!("an egress CA certificate: {e}"))
                })?;
            }
        }
        let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| crate::model::Error::internal(format!("egress TLS versions: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Interception {
            secrets,
            upstream_tls: Arc::new(cfg),
        })
    }
}

/// One intercepted connection's task.
pub struct Job {
    /// The host the rule matched (the TLS SNI or the HTTP Host), dialled by name.
    pub host: String,
    pub port: u16,
    pub tls: bool,
    pub headers: BTreeMap<String, String>,
    pub tenant: String,
    pub dialer: Arc<Dialer>,
    /// Which of the host's addresses may be dialled (the sandbox's rules).
    pub permit: Box<dyn Fn(Ipv4Addr) -> bool + Send + Sync>,
    pub shared: Arc<Interception>,
}

/// Serves one intercepted connection until either side closes it.
pub async fn serve<S>(stream: S, job: Job, ca: &Arc<SandboxCa>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let forwarder = Arc::new(Forwarder {
        job,
        upstream: tokio::sync::Mutex::new(None),
    });
    let result = if forwarder.job.tls {
        let cfg = match ca.server_config() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "egress interception");
                return;
            }
        };
        match tokio_rustls::TlsAcceptor::from(cfg).accept(stream).await {
            Ok(tls) => http(tls, forwarder).await,
            // The sandbox's client did not trust its CA, or went away: nothing more to do.
            Err(_) => return,
        }
    } else {
        http(stream, forwarder).await
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "an intercepted connection ended");
    }
}

type Answer = Response<Either<Incoming, Full<Bytes>>>;

async fn http<S>(io: S, forwarder: Arc<Forwarder>) -> hyper::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let f = forwarder.clone();
        async move { Ok::<_, Infallible>(f.forward(req).await) }
    });
    hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), svc)
        .with_upgrades()
        .await
}

/// An upstream connection, its driver stopped when it goes (unless detached).
struct Upstream {
    send: hyper::client::conn::http1::SendRequest<Incoming>,
    driver: Option<AbortHandle>,
}

impl Upstream {
    /// Lets the connection finish what it carries (an answer's body, an upgrade) and close
    /// by itself: nothing more is sent on it.
    fn detach(mut self) {
        self.driver = None;
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(d) = &self.driver {
            d.abort();
        }
    }
}

struct Forwarder {
    job: Job,
    upstream: tokio::sync::Mutex<Option<Upstream>>,
}

/// Headers that describe one hop, not the request (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The protocol a request asks to switch to (`Connection: upgrade` with `Upgrade`), if any.
fn upgrade_of(h: &HeaderMap) -> Option<HeaderValue> {
    let asks = h
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| h.get(hyper::header::UPGRADE).cloned())
        .flatten()
}

/// Puts an upgrade back after the hop-by-hop headers went: it is what the hop is for.
fn ask_upgrade(h: &mut HeaderMap, protocol: HeaderValue) {
    h.insert(
        hyper::header::CONNECTION,
        HeaderValue::from_static("upgrade"),
    );
    h.insert(hyper::header::UPGRADE, protocol);
}

fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
}

fn refusal(status: StatusCode, why: String) -> Answer {
    let mut r = Response::new(Either::Right(Full::new(Bytes::from(format!(
        "sandbox-gateway egress proxy: {why}\n"
    )))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The rule's headers with their placeholders filled (blocking: secrets are read from disk).
fn fill(
    headers: &BTreeMap<String, String>,
    host: &str,
    tls: bool,
    tenant: &str,
    secrets: Option<&SecretStore>,
) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let mut out = Vec::with_capacity(headers.len());
    for (name, value) in headers {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("the rule for {host} names header {name:?}, which is not one"))?;
        let mut text = Zeroizing::new(String::with_capacity(value.len()));
        let mut secret = false;
        for piece in pieces(value).map_err(|e| e.message)? {
            match piece {
                Piece::Text(t) => text.push_str(&t),
                Piece::Secret(s) => {
                    if !tls {
                        return Err(format!(
                            "the rule for {host} puts secret {s:?} in header {name}, and secrets are only sent over HTTPS"
                        ));
                    }
                    let store = secrets.ok_or_else(|| {
                        format!("header {name} names secret {s:?}, but this node has no secret store (--secrets-dir)")
                    })?;
                    let v = store.value(tenant, &s).map_err(|_| {
                        format!("header {name} names secret {s:?}, which this team does not have")
                    })?;
                    text.push_str(&v);
                    secret = true;
                }
                Piece::Identity(t) => {
                    return Err(format!(
                        "header {name} names identity token {t:?}; workload identity tokens are not offered"
                    ));
                }
            }
        }
        let mut v = HeaderValue::from_str(&text).map_err(|_| {
            format!("header {name}'s value is not a valid header value once filled")
        })?;
        v.set_sensitive(secret);
        out.push((header, v));
    }
    Ok(out)
}

impl Forwarder {
    async fn forward(&self, mut req: Request<Incoming>) -> Answer {
        let job = &self.job;
        let headers = job.headers.clone();
        let (host, tls, tenant) = (job.host.clone(), job.tls, job.tenant.clone());
        let secrets = job.shared.secrets.clone();
        let filled = tokio::task::spawn_blocking(move || {
            fill(&headers, &host, tls, &tenant, secrets.as_deref())
        })
        .await
        .unwrap_or_else(|e| Err(format!("filling the rule's headers: {e}")));
        let filled = match filled {
            Ok(f) => f,
            Err(why) => return refusal(StatusCode::BAD_GATEWAY, why),
        };
        let upgrade = upgrade_of(req.headers());
        strip_hop_by_hop(req.headers_mut());
        for (name, value) in filled {
            req.headers_mut().remove(&name);
            req.headers_mut().insert(name, value);
        }
        if let Some(protocol) = upgrade {
            return self.switch(req, protocol).await;
        }
        let mut upstream = self.upstream.lock().await;
        let usable = upstream.as_ref().is_some_and(|u| !u.send.is_closed());
        if !usable {
            *upstream = None;
            match self.connect().await {
                Ok(u) => *upstream = Some(u),
                Err(e) => {
                    return refusal(
                        StatusCode::BAD_GATEWAY,
                        format!("{}:{} could not be reached: {e}", job.host, job.port),
                    );
                }
            }
        }
        let Some(up) = upstream.as_mut() else {
            return refusal(StatusCode::BAD_GATEWAY, "no upstream connection".into());
        };
        if let Err(e) = up.send.ready().await {
            *upstream = None;
            return refusal(StatusCode::BAD_GATEWAY, format!("{}: {e}", job.host));
        }
        match up.send.send_request(req).await {
            Ok(mut resp) => {
                strip_hop_by_hop(resp.headers_mut());
                resp.map(Either::Left)
            }
            Err(e) => {
                *upstream = None;
                refusal(StatusCode::BAD_GATEWAY, format!("{}: {e}", job.host))
            }
        }
    }

    /// Forwards a request to switch protocols on a new upstream connection; when the host
    /// agrees, both sides' connections are joined once the answer reached the sandbox.
    async fn switch(&self, mut req: Request<Incoming>, protocol: HeaderValue) -> Answer {
        let job = &self.job;
        ask_upgrade(req.headers_mut(), protocol);
        let from_sandbox = hyper::upgrade::on(&mut req);
        let mut up = match self.connect().await {
            Ok(u) => u,
            Err(e) => {
                return refusal(
                    StatusCode::BAD_GATEWAY,
                    format!("{}:{} could not be reached: {e}", job.host, job.port),
                );
            }
        };
        let sent = match up.send.ready().await {
            Ok(()) => up.send.send_request(req).await,
            Err(e) => Err(e),
        };
        let mut resp = match sent {
            Ok(r) => r,
            Err(e) => return refusal(StatusCode::BAD_GATEWAY, format!("{}: {e}", job.host)),
        };
        // Nothing else goes on this connection; it closes once its answer (or pipe) is done.
        up.detach();
        let agreed = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
        let protocol = upgrade_of(resp.headers());
        strip_hop_by_hop(resp.headers_mut());
        if agreed && let Some(p) = protocol {
            ask_upgrade(resp.headers_mut(), p);
            let from_host = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                if let (Ok(a), Ok(b)) = (from_sandbox.await, from_host.await) {
                    let (mut a, mut b) = (TokioIo::new(a), TokioIo::new(b));
                    let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
                }
            });
        }
        resp.map(Either::Left)
    }

    /// Dials the host by name from the node (never where the sandbox pointed it) and, on
    /// 443, speaks TLS to it, verifying it is that host.
    async fn connect(&self) -> io::Result<Upstream> {
        let job = &self.job;
        let tcp = job
            .dialer
            .connect_name_where(&job.host, job.port, &*job.permit)
            .await?;
        if job.tls {
            let name = rustls::pki_types::ServerName::try_from(job.host.clone())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            let connector = tokio_rustls::TlsConnector::from(job.shared.upstream_tls.clone());
            let tls = tokio::time::timeout(super::proxy::DIAL_FOR, connector.connect(name, tcp))
                .await
                .map_err(|_| {
                    io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
                })??;
            handshake(tls).await
        } else {
            handshake(tcp).await
        }
    }
}

async fn handshake<S>(io: S) -> io::Result<Upstream>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(io::Error::other)?;
    let driver = tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    })
    .abort_handle();
    Ok(Upstream {
        send,
        driver: Some(driver),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn store() -> (tempfile::TempDir, SecretStore) {
        let dir = tempfile::tempdir().unwrap();
        let (s, _) = SecretStore::open(&dir.path().join("s"), &dir.path().join("k")).unwrap();
        s.create("team-a", "openai", "sk-123", Default::default())
            .unwrap();
        (dir, s)
    }

    #[test]
    fn placeholders_are_filled_from_the_tenants_secrets_over_tls_only() {
        let (_d, s) = store();
        let h = headers(&[
            ("Authorization", "Bearer ${e2b.secrets.OpenAI}"),
            ("X-Plain", "v ${HOME}"),
        ]);
        let out = fill(&h, "api.test", true, "team-a", Some(&s)).unwrap();
        let auth = out.iter().find(|(n, _)| n == "authorization").unwrap();
        assert_eq!(auth.1, "Bearer sk-123");
        assert!(auth.1.is_sensitive(), "kept out of debug output");
        let plain = out.iter().find(|(n, _)| n == "x-plain").unwrap();
        assert_eq!(plain.1, "v ${HOME}");
        assert!(!plain.1.is_sensitive());

        let over_http = fill(&h, "api.test", false, "team-a", Some(&s)).unwrap_err();
        assert!(over_http.contains("only sent over HTTPS"), "{over_http}");
        assert!(!over_http.contains("sk-123"));
        let other_team = fill(&h, "api.test", true, "team-b", Some(&s)).unwrap_err();
        assert!(other_team.contains("does not have"), "{other_team}");
        let no_store = fill(&h, "api.test", true, "team-a", None).unwrap_err();
        assert!(no_store.contains("--secrets-dir"), "{no_store}");
        // Plain headers need no store and go over HTTP too.
        let plain_only = headers(&[("X-Team", "a")]);
        assert_eq!(fill(&plain_only, "h", false, "t", None).unwrap().len(), 1);
    }

    #[test]
    fn only_a_connection_that_asks_is_upgraded() {
        let mut h = HeaderMap::new();
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        assert_eq!(upgrade_of(&h), None, "Upgrade alone asks nothing");
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        assert_eq!(upgrade_of(&h).unwrap(), "websocket");
        strip_hop_by_hop(&mut h);
        ask_upgrade(&mut h, HeaderValue::from_static("websocket"));
        assert_eq!(h["connection"], "upgrade");
        assert_eq!(h["upgrade"], "websocket");
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_go() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("authorization", HeaderValue::from_static("kept"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h["authorization"], "kept");
    }
}
