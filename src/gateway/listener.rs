//! The e2b listener: actix's HTTP service over client connections read in large blocks.
//!
//! actix-web's `HttpServer` hands actix-http the socket itself and offers no hook to put
//! anything between the two; its HTTP/1 reader then reads at most 64 KiB at a time, and
//! under TLS rustls reads 4 KiB at a time. Uploads through the data plane paid for that in
//! system calls and wakeups (PERFORMANCE.md, "Transfers"). So the e2b listener is built here
//! from the same actix parts `HttpServer` uses (actix-server's acceptor, actix-tls, actix-
//! http's `HttpService`), with the same settings, and each connection is wrapped in a
//! [`ReadAhead`] before TLS or HTTP see it. The Kubernetes listener, whose requests are
//! small, keeps `HttpServer`.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use actix_http::body::MessageBody;
use actix_http::{HttpService, Protocol, Request, Response};
use actix_service::{
    IntoServiceFactory, ServiceFactory, ServiceFactoryExt as _, boxed, fn_service,
};
use actix_tls::accept::rustls_0_23::{Acceptor, TlsStream};
use actix_web::dev::{AppConfig, Server};
use actix_web::rt::net::TcpStream;

use super::readahead::ReadAhead;
use super::stalled;

/// How the listener serves: `HttpServer`'s settings, as the gateway gave them.
#[derive(Debug, Clone)]
pub struct Settings {
    pub workers: usize,
    pub keep_alive: Duration,
    pub shutdown_timeout: u64,
    /// `--stalled-client-seconds`.
    pub stall: Option<Duration>,
}

/// `HttpServer`'s defaults for what the gateway does not set.
const CLIENT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const CLIENT_DISCONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const BACKLOG: u32 = 1024;

/// Binds every address `listen` resolves to and returns them with the server, not yet run.
/// With `tls` the listener speaks TLS (HTTP/2 or HTTP/1.1 by ALPN), else plain HTTP/1.1.
pub fn bind<F, I, S, B>(
    listen: &str,
    tls: Option<rustls::ServerConfig>,
    settings: &Settings,
    app: F,
) -> std::io::Result<(Vec<SocketAddr>, Server)>
where
    F: Fn() -> I + Send + Clone + 'static,
    I: IntoServiceFactory<S, Request>,
    S: ServiceFactory<Request, Config = AppConfig> + 'static,
    S::Error: Into<actix_web::Error> + 'static,
    S::InitError: fmt::Debug,
    S::Response: Into<Response<B>> + 'static,
    B: MessageBody + 'static,
{
    let mut builder = Server::build()
        .workers(settings.workers)
        .shutdown_timeout(settings.shutdown_timeout)
        .backlog(BACKLOG)
        .disable_signals();
    let shutdown = builder.graceful_shutdown_signal();
    let tls = tls.map(|mut c| {
        c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        c
    });
    let mut addrs = Vec::new();
    for addr in listen.to_socket_addrs()? {
        let lst = tcp_listener(addr)?;
        let addr = lst.local_addr()?;
        addrs.push(addr);
        let (app, settings, shutdown, tls) =
            (app.clone(), settings.clone(), shutdown.clone(), tls.clone());
        builder = builder.listen(format!("e2b-{addr}"), lst, move || {
            let shutdown = shutdown.clone();
            let secure = tls.is_some();
            let host = addr.to_string();
            // A macro, not a value: the service's type names the connection's (plain or TLS).
            macro_rules! http {
                () => {
                    HttpService::build()
                        // What `HttpServer` does: idle keep-alive connections close when the server
                        // stops, instead of holding its graceful stop for the shutdown timeout.
                        .graceful_shutdown_signal(move || {
                            let shutdown = shutdown.clone();
                            async move { shutdown.notified().await }
                        })
                        .keep_alive(settings.keep_alive)
                        .client_request_timeout(CLIENT_REQUEST_TIMEOUT)
                        .client_disconnect_timeout(CLIENT_DISCONNECT_TIMEOUT)
                        .h1_allow_half_closed(true)
                        .local_addr(addr)
                        .finish(actix_service::map_config(
                            app().into_factory().map_err(|e| e.into().error_response()),
                            // actix-web has no public constructor for the connection facts its
                            // handlers read (`secure()` names the session cookie, `ConnectionInfo`
                            // the scheme); `HttpServer` makes them with this same call.
                            move |_| AppConfig::__priv_test_new(secure, host.clone(), addr),
                        ))
                        .map_err(|_| ())
                };
            }
            let stall = settings.stall;
            let accepted = fn_service(move |io: TcpStream| {
                stalled::limit(&io, stall);
                let _ = io.set_nodelay(true);
                async move { Ok::<_, ()>(ReadAhead::new(io)) }
            });
            match tls.clone() {
                None => boxed::factory(
                    accepted
                        .and_then(fn_service(|io: ReadAhead<TcpStream>| async move {
                            let peer = io.get_ref().peer_addr().ok();
                            Ok((io, Protocol::Http1, peer))
                        }))
                        .and_then(http!()),
                ),
                Some(tls) => boxed::factory(
                    accepted
                        .and_then(
                            Acceptor::new(tls)
                                .map_init_err(|_| ())
                                .map_err(|e| tracing::debug!(error = ?e, "a TLS handshake failed")),
                        )
                        .and_then(fn_service(
                            |io: TlsStream<ReadAhead<TcpStream>>| async move {
                                // HTTP/2 when the client's ALPN chose it, as `HttpServer` does.
                                let proto = match io.get_ref().1.alpn_protocol() {
                                    Some(b"h2") => Protocol::Http2,
                                    _ => Protocol::Http1,
                                };
                                let peer = io.get_ref().0.get_ref().peer_addr().ok();
                                Ok((io, proto, peer))
                            },
                        ))
                        .and_then(http!()),
                ),
            }
        })?;
    }
    if addrs.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrNotAvailable,
            format!("{listen} resolves to no address"),
        ));
    }
    Ok((addrs, builder.run()))
}

/// A listening socket as `HttpServer` makes one: address reuse and a backlog of [`BACKLOG`].
fn tcp_listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    let lst = socket.listen(BACKLOG)?;
    lst.into_std()
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::{App, HttpRequest, HttpResponse, web};
    use futures::StreamExt;

    /// Waits until the client's body has filled the socket, then reads it; and says what the
    /// handler was told of its connection.
    async fn count(req: HttpRequest, mut body: web::Payload) -> HttpResponse {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut len = 0usize;
        while let Some(chunk) = body.next().await {
            match chunk {
                Ok(c) => len += c.len(),
                Err(e) => return HttpResponse::BadRequest().body(e.to_string()),
            }
        }
        let scheme = req.connection_info().scheme().to_string();
        HttpResponse::Ok().body(format!("{len} {scheme} {}", req.app_config().secure()))
    }

    async fn upload(tls: bool) -> String {
        let dir = tempfile::tempdir().unwrap();
        let config = tls.then(|| {
            crate::facade::tls::server_config(
                &crate::facade::tls::TlsConfig {
                    dir: dir.path().to_path_buf(),
                    cert_file: None,
                    key_file: None,
                    dns_names: vec!["localhost".into()],
                },
                &[],
            )
            .unwrap()
            .config
        });
        let settings = Settings {
            workers: 1,
            keep_alive: Duration::from_secs(5),
            shutdown_timeout: 1,
            stall: None,
        };
        let app = || App::new().route("/count", web::post().to(count));
        let (addrs, server) = bind("127.0.0.1:0", config, &settings, app).unwrap();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        let scheme = if tls { "https" } else { "http" };
        let client = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .build()
            .unwrap();
        let body = vec![7u8; 8 << 20];
        let res = client
            .post(format!("{scheme}://localhost:{}/count", addrs[0].port()))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let text = res.text().await.unwrap();
        handle.stop(false).await;
        text
    }

    /// Uploads through a listener until one upload's connection took a large buffer (at most
    /// five: a client starved of CPU may send slower than it is read, and then a small buffer
    /// is right), checking each answer: the whole body arrived and the handler was told
    /// `scheme` and `secure`. The gateway's budget is watched, so the two listeners take turns.
    async fn uploads_take_large_buffers(tls: bool, scheme: &str, secure: &str) {
        for _ in 0..5 {
            let before = super::super::readahead::large_buffers_taken();
            let got = upload(tls).await;
            let parts: Vec<&str> = got.split(' ').collect();
            assert_eq!(parts, [(8 << 20).to_string().as_str(), scheme, secure]);
            if super::super::readahead::large_buffers_taken() > before {
                return;
            }
        }
        panic!("no {scheme} upload in five took a large buffer");
    }

    #[actix_web::test]
    async fn connections_are_read_in_large_blocks_and_say_whether_they_are_secure() {
        uploads_take_large_buffers(false, "http", "false").await;
        // The session cookie's name and the dashboard's origin check depend on these.
        uploads_take_large_buffers(true, "https", "true").await;
    }
}
