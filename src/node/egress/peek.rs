//! The name an outbound connection is for, read from its first bytes without consuming them:
//! an HTTP/1 request's `Host` (port 80) or a TLS ClientHello's SNI (port 443). The proxy keeps
//! the bytes it peeked and sends them on unchanged once the connection is allowed.

use rustls::server::Acceptor;

/// Most bytes read while looking for the name: a request head or a ClientHello (which may
/// carry large key shares) fits well within this.
pub const MAX_PEEK: usize = 16 * 1024;

/// What the first bytes say so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peeked {
    /// More bytes are needed.
    Incomplete,
    /// The connection names this host (as sent: any case, maybe with a port).
    Name(String),
    /// The bytes are complete and name no host, or are not this protocol: the connection is
    /// judged by its address alone.
    Nameless,
}

/// The `Host` of an HTTP/1 request head in `buf`.
pub fn http_host(buf: &[u8]) -> Peeked {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) if buf.len() < MAX_PEEK => Peeked::Incomplete,
        Ok(httparse::Status::Partial) | Err(_) => Peeked::Nameless,
        Ok(httparse::Status::Complete(_)) => {
            // Two Host headers are ambiguous; a proxy that picked one could be fooled by it.
            let mut hosts = req
                .headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case("host"));
            match (hosts.next(), hosts.next()) {
                (Some(h), None) => std::str::from_utf8(h.value)
                    .ok()
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .map_or(Peeked::Nameless, |v| Peeked::Name(v.to_string())),
                _ => Peeked::Nameless,
            }
        }
    }
}

/// The SNI of a TLS ClientHello in `buf`.
pub fn tls_server_name(buf: &[u8]) -> Peeked {
    let mut acceptor = Acceptor::default();
    let mut rd = buf;
    // Feeds everything peeked; rustls buffers records until the hello is whole.
    while !rd.is_empty() {
        match acceptor.read_tls(&mut rd) {
            Ok(0) => break,
            Ok(_) => {}
            Err(_) => return Peeked::Nameless,
        }
    }
    match acceptor.accept() {
        Ok(Some(accepted)) => accepted
            .client_hello()
            .server_name()
            .map_or(Peeked::Nameless, |n| Peeked::Name(n.to_string())),
        Ok(None) if buf.len() < MAX_PEEK => Peeked::Incomplete,
        Ok(None) | Err(_) => Peeked::Nameless,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn an_http_request_names_its_host_once_its_head_is_whole() {
        let req = b"GET /simple HTTP/1.1\r\nHost: PyPI.org:80\r\nAccept: */*\r\n\r\n";
        assert_eq!(http_host(req), Peeked::Name("PyPI.org:80".into()));
        for cut in [0, 5, 30, req.len() - 1] {
            assert_eq!(http_host(&req[..cut]), Peeked::Incomplete, "{cut}");
        }
        let two = b"GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n";
        assert_eq!(http_host(two), Peeked::Nameless);
        assert_eq!(http_host(b"GET / HTTP/1.0\r\n\r\n"), Peeked::Nameless);
        assert_eq!(http_host(b"SSH-2.0-OpenSSH_9.2\r\n"), Peeked::Nameless);
        assert_eq!(http_host(&[0x16, 0x03, 0x01, 0x00]), Peeked::Nameless);
        let endless = [b'a'; MAX_PEEK];
        assert_eq!(http_host(&endless), Peeked::Nameless);
    }

    /// A real ClientHello, as rustls's client sends it for `name`.
    fn client_hello(name: &str) -> Vec<u8> {
        let roots = rustls::RootCertStore::empty();
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        let server = rustls::pki_types::ServerName::try_from(name.to_string()).expect("name");
        let mut conn = rustls::ClientConnection::new(Arc::new(cfg), server).expect("client");
        let mut out = Vec::new();
        conn.write_tls(&mut out).expect("hello");
        out
    }

    #[test]
    fn a_client_hello_names_its_server() {
        let hello = client_hello("api.github.com");
        assert_eq!(
            tls_server_name(&hello),
            Peeked::Name("api.github.com".into())
        );
        assert_eq!(tls_server_name(&hello[..10]), Peeked::Incomplete);
        assert_eq!(
            tls_server_name(&hello[..hello.len() - 1]),
            Peeked::Incomplete
        );
        // An address as the server name sends no SNI at all.
        assert_eq!(
            tls_server_name(&client_hello("203.0.113.9")),
            Peeked::Nameless
        );
        assert_eq!(tls_server_name(b"GET / HTTP/1.1\r\n\r\n"), Peeked::Nameless);
    }
}
