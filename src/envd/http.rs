//! The plain HTTP side of envd and the one router that serves it with the Connect services:
//! `/health`, `/metrics`, `/envs`, `/init`, `/files` (see `files`), and the access-token rule
//! in front of all of it.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use super::auth::{ACCESS_TOKEN_HEADER, tokens_equal};
use super::errors::HttpError;
use super::files;
use super::fs::FilesystemService;
use super::metrics::measure;
use super::process::ProcessService;
use super::proto::filesystem::FilesystemExt;
use super::proto::process::ProcessExt;
use super::state::Envd;

/// Connect messages larger than this are refused (`resource_exhausted`) before decoding.
pub const MAX_RPC_MESSAGE: usize = 8 << 20;

/// Routes reachable without the access token: health, and the ones with their own checks
/// (`/files` takes the token or a signature, `/init` its own token).
fn exempt(method: &Method, path: &str) -> bool {
    matches!(
        (method.as_str(), path),
        ("GET", "/health") | ("GET", "/files") | ("POST", "/files") | ("POST", "/init")
    )
}

pub fn header_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(ACCESS_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
}

async fn require_token(State(envd): State<Arc<Envd>>, req: Request, next: Next) -> Response {
    if !exempt(req.method(), req.uri().path())
        && let Some(token) = envd.access_token()
    {
        let sent = header_token(req.headers()).unwrap_or("");
        if !tokens_equal(sent, &token) {
            return HttpError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized access, please provide a valid access token or method signing if supported",
            )
            .into_response();
        }
    }
    next.run(req).await
}

async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

async fn get_metrics(State(envd): State<Arc<Envd>>) -> Result<Response, HttpError> {
    let m = tokio::task::spawn_blocking(move || {
        let mut s = match envd.cpu.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        measure(&mut s, envd.mem_total_bytes, envd.cpu_count)
    })
    .await
    .map_err(|e| HttpError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("measuring: {e}")))?;
    Ok(axum::Json(m).into_response())
}

async fn get_envs(State(envd): State<Arc<Envd>>) -> Response {
    axum::Json(envd.settings().env_vars).into_response()
}

/// envd's `/init` body (what does not apply here is ignored) plus our `hostname`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct InitBody {
    env_vars: Option<BTreeMap<String, String>>,
    access_token: Option<String>,
    default_user: Option<String>,
    default_workdir: Option<String>,
    hostname: Option<String>,
    /// The egress proxy's CA, to trust (see `cacerts`).
    ca_bundle: Option<String>,
}

fn set_hostname(name: &str) {
    // SAFETY: sethostname reads `len` bytes from a valid buffer. It works inside the sandbox's
    // own UTS namespace; elsewhere (not root) it fails, which is fine: best effort.
    let rc = unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "sethostname");
    }
}

async fn init(
    State(envd): State<Arc<Envd>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, HttpError> {
    if let Some(boot) = &envd.init_token {
        let sent = header_token(&headers).unwrap_or("");
        let current = envd.access_token();
        let ok = tokens_equal(sent, boot) || current.is_some_and(|c| tokens_equal(sent, &c));
        if !ok {
            return Err(HttpError::new(
                StatusCode::UNAUTHORIZED,
                "/init needs the sandbox's init token",
            ));
        }
    }
    let b: InitBody = if body.iter().all(u8::is_ascii_whitespace) {
        InitBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            HttpError::new(StatusCode::BAD_REQUEST, format!("invalid /init body: {e}"))
        })?
    };
    if let Some(pem) = b.ca_bundle.clone().filter(|p| !p.trim().is_empty()) {
        tokio::task::spawn_blocking(move || super::cacerts::install(&pem))
            .await
            .map_err(|e| HttpError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
            .map_err(|e| {
                let status = if e.kind() == std::io::ErrorKind::InvalidInput {
                    StatusCode::BAD_REQUEST
                } else {
                    StatusCode::INTERNAL_SERVER_ERROR
                };
                HttpError::new(status, format!("trusting the egress CA: {e}"))
            })?;
    }
    if let Some(h) = b
        .hostname
        .as_deref()
        .filter(|h| !h.is_empty() && h.len() <= 64)
    {
        set_hostname(h);
    }
    envd.update_settings(|s| {
        // A new /init (a fork, a restore) replaces the sandbox-wide environment.
        if let Some(env) = b.env_vars {
            s.env_vars = env;
        }
        if let Some(t) = b.access_token {
            s.access_token = (!t.is_empty()).then_some(t);
        }
        if let Some(u) = b.default_user.filter(|u| !u.is_empty()) {
            s.default_user = Some(u);
        }
        if let Some(w) = b.default_workdir.filter(|w| !w.is_empty()) {
            s.default_workdir = Some(w.into());
        }
    });
    Ok(Response::builder()
        .status(StatusCode::NO_CONTENT)
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::empty())
        .unwrap_or_default())
}

/// Everything envd serves, on one router.
pub fn router(envd: Arc<Envd>) -> axum::Router {
    let rpc = connectrpc::Router::new();
    let rpc = Arc::new(ProcessService { envd: envd.clone() }).register(rpc);
    let rpc = Arc::new(FilesystemService { envd: envd.clone() }).register(rpc);
    let limits = connectrpc::Limits::default()
        .with_max_message_size(MAX_RPC_MESSAGE)
        .with_max_request_body_size(MAX_RPC_MESSAGE);
    let connect = connectrpc::ConnectRpcService::new(rpc).with_limits(limits);
    axum::Router::new()
        .route("/health", get(health))
        .route("/metrics", get(get_metrics))
        .route("/envs", get(get_envs))
        .route("/init", post(init))
        .route("/files", get(files::download).post(files::upload))
        .route("/files/compose", post(files::compose))
        .fallback_service(connect)
        .layer(middleware::from_fn_with_state(envd.clone(), require_token))
        .layer(middleware::from_fn(super::drain::drain_unread))
        .with_state(envd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_health_files_and_init_skip_the_token() {
        assert!(exempt(&Method::GET, "/health"));
        assert!(exempt(&Method::GET, "/files"));
        assert!(exempt(&Method::POST, "/files"));
        assert!(exempt(&Method::POST, "/init"));
        assert!(!exempt(&Method::POST, "/health"));
        assert!(!exempt(&Method::GET, "/metrics"));
        assert!(!exempt(&Method::POST, "/files/compose"));
        assert!(!exempt(&Method::POST, "/process.Process/Start"));
    }
}
