//! What crosses the proxy of a request's and an answer's headers: hop-by-hop headers and the
//! gateway's own credentials (access tokens, the dashboard's session cookie) stay behind, a
//! masked host is swapped in, and a sandbox cannot set cookies or clear site data on the
//! gateway's origin.

use actix_web::HttpRequest;
use actix_web::dev::RequestHead;
use actix_web::http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::tunnel::ProxyBody;

/// Headers that describe one hop, never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
];
pub(super) const ACCESS_TOKEN: &str = "x-access-token";
pub(super) const TRAFFIC_TOKEN: &str = "e2b-traffic-access-token";
const FORWARDED_HOST: &str = "x-forwarded-host";

pub(super) fn host_of(head: &RequestHead) -> Option<&str> {
    head.headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| head.uri.authority().map(|a| a.as_str()))
}

pub(super) fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// A WebSocket handshake: the one upgrade the listener can hand over as a raw byte stream
/// (any other `Upgrade` is forwarded as a plain request, without its upgrade headers).
pub(super) fn is_upgrade(req: &HttpRequest) -> bool {
    header_str(req.headers(), "upgrade").is_some_and(|u| u.trim().eq_ignore_ascii_case("websocket"))
        && header_str(req.headers(), "connection").is_some_and(|c| {
            c.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        })
}

/// The request as the sandbox gets it: same method, path, query and end-to-end headers; the
/// access token replaced according to `access`; with a `host` mask, that `Host` and the
/// original in `X-Forwarded-Host`, as e2b's edge does.
pub(super) fn upstream_request(
    req: &HttpRequest,
    body: ProxyBody,
    agent_token: Option<&str>,
    host: Option<&str>,
) -> Result<hyper::Request<ProxyBody>, String> {
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut b = hyper::Request::builder()
        .method(req.method().as_str())
        .uri(path);
    let upgrade = is_upgrade(req);
    for (name, value) in req.headers() {
        let n = name.as_str();
        // The gateway's credentials are for the gateway; the sandbox never sees them.
        if n == ACCESS_TOKEN
            || n == TRAFFIC_TOKEN
            || (HOP_BY_HOP.contains(&n) && !(upgrade && (n == "upgrade" || n == "connection")))
            || (host.is_some() && (n == "host" || n == FORWARDED_HOST))
        {
            continue;
        }
        if n == "cookie" {
            // A dashboard session is the gateway's credential too (a cookie that is not
            // text cannot be searched for it, and goes nowhere).
            if let Some(rest) = value
                .to_str()
                .ok()
                .and_then(crate::dashboard::sessions::without_ours)
            {
                b = b.header(n, rest);
            }
            continue;
        }
        b = b.header(n, value.as_bytes());
    }
    let original = host_of(req.head());
    match host {
        Some(masked) => {
            b = b.header("host", masked);
            if let Some(o) = original {
                b = b.header(FORWARDED_HOST, o);
            }
        }
        None if original.is_some() && !req.headers().contains_key(header::HOST) => {
            b = b.header("host", original.unwrap_or_default());
        }
        None => {}
    }
    if let Some(t) = agent_token {
        b = b.header(ACCESS_TOKEN, t);
    }
    b.body(body).map_err(|e| e.to_string())
}

/// Whose origin a sandbox's answer reaches the browser on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    /// Its own host (`{port}-{id}.{domain}`): its cookies are its own business, except one
    /// that would pass for the dashboard's session (set for the parent domain).
    Own,
    /// The gateway's (addressed by the `E2b-Sandbox-Id` header): it must not set cookies
    /// there, nor clear the gateway's site data.
    Gateway,
}

pub(super) fn copy_headers(
    from: &hyper::HeaderMap,
    to: &mut actix_web::HttpResponseBuilder,
    keep_upgrade: bool,
    origin: Origin,
) {
    for (name, value) in from {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) && !(keep_upgrade && (n == "upgrade" || n == "connection")) {
            continue;
        }
        let refused = match n {
            "set-cookie" => {
                origin == Origin::Gateway
                    || crate::dashboard::sessions::names_ours(value.as_bytes())
            }
            "clear-site-data" => origin == Origin::Gateway,
            _ => false,
        };
        if refused {
            continue;
        }
        if n == "content-length" {
            continue; // set by the body
        }
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(name.as_str().as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) {
            to.append_header((k, v));
        }
    }
}
