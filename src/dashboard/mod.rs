//! The web dashboard at `/dashboard`: server-rendered pages (askama) and one small script of
//! our own, all compiled into the binary. A login trades an API key (or the fleet token) for a
//! session cookie; the page then calls the e2b API itself with that cookie and the session's
//! CSRF header (see `sessions`), and reaches a sandbox's terminal through the data plane, as
//! the SDKs do. What only the dashboard needs (sign in/out, the fleet view) is here.

pub mod sessions;

use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use crate::e2b::E2b;
use crate::e2b::auth::{ApiKeys, Tenant};
use crate::e2b::error::{ApiError, ApiResult};
use sessions::{Session, Sessions};

const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

/// Only our own files, no inline script, no framing: a page that shows what sandboxes print
/// must not run any of it.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; \
                   require-trusted-types-for 'script'";

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage<'a> {
    error: Option<&'a str>,
}

#[derive(Template)]
#[template(path = "app.html")]
struct AppPage<'a> {
    namespace: &'a str,
    admin: bool,
    fleet: bool,
    csrf: &'a str,
}

#[derive(Deserialize)]
struct Login {
    key: String,
}

fn page(status: actix_web::http::StatusCode, html: String) -> HttpResponse {
    let mut res = HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .body(html);
    guard_headers(res.headers_mut());
    // A page that refuses a sign-in is still a page, not the API's JSON error.
    res.extensions_mut().insert(crate::httpx::Passthrough);
    res
}

fn guard_headers(h: &mut actix_web::http::header::HeaderMap) {
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Not `no-referrer`: under it a browser sends `Origin: null` with the sign-in form, and
    // the origin check below could not tell our own page from a sandboxed stranger.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
}

fn render(t: &impl Template) -> ApiResult<String> {
    t.render().map_err(|e| {
        ApiError::new(
            actix_web::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("rendering a dashboard page: {e}"),
        )
    })
}

/// The session the browser's cookie names, if it is live (and named once).
fn session_of(req: &HttpRequest, sessions: &Sessions) -> Option<(String, Session)> {
    let cookies = req
        .headers()
        .get_all(header::COOKIE)
        .filter_map(|v| v.to_str().ok());
    let id =
        sessions::from_cookie_headers(cookies, sessions::cookie_name(req.app_config().secure()))
            .ok()
            .flatten()?;
    sessions.page(id).map(|s| (id.to_string(), s))
}

async fn index(req: HttpRequest, sessions: web::Data<Sessions>) -> ApiResult<HttpResponse> {
    let html = match session_of(&req, &sessions) {
        Some((_, s)) => render(&AppPage {
            namespace: &s.tenant.namespace,
            admin: s.tenant.admin,
            fleet: s.fleet,
            csrf: &s.csrf,
        })?,
        None => render(&LoginPage { error: None })?,
    };
    Ok(page(actix_web::http::StatusCode::OK, html))
}

/// A login posted from another page than ours is refused: the browser names the page's origin
/// (scheme and host), or at least says whether it was the same origin. A sandbox's page on a
/// sibling host is another origin, though the same site.
fn same_origin(req: &HttpRequest) -> bool {
    let h = req.headers();
    if let Some(site) = h.get("sec-fetch-site").and_then(|v| v.to_str().ok())
        && !matches!(site, "same-origin" | "none")
    {
        return false;
    }
    let Some(origin) = h.get(header::ORIGIN) else {
        return true;
    };
    let info = req.connection_info();
    let ours = format!("{}://{}", info.scheme(), info.host());
    origin.to_str().is_ok_and(|o| o.eq_ignore_ascii_case(&ours))
}

async fn login(
    req: HttpRequest,
    form: web::Form<Login>,
    keys: web::Data<ApiKeys>,
    e2b: web::Data<E2b>,
    sessions: web::Data<Sessions>,
) -> ApiResult<HttpResponse> {
    let refuse = |status, error| -> ApiResult<HttpResponse> {
        Ok(page(status, render(&LoginPage { error: Some(error) })?))
    };
    if !same_origin(&req) {
        return refuse(
            actix_web::http::StatusCode::FORBIDDEN,
            "sign in from this gateway's own page",
        );
    }
    let key = form.key.trim();
    let fleet_token = e2b.dispatcher.fleet_token();
    let fleet = !key.is_empty() && bool::from(key.as_bytes().ct_eq(fleet_token.as_bytes()));
    let tenant = if fleet {
        // As an admin key without a namespace of its own: what it creates goes to `default`.
        Tenant {
            namespace: crate::model::DEFAULT_NAMESPACE.to_string(),
            admin: true,
        }
    } else if key.is_empty() {
        return refuse(
            actix_web::http::StatusCode::UNAUTHORIZED,
            "enter an API key",
        );
    } else {
        match keys.authenticate(Some(key)) {
            Ok(t) => t,
            Err(_) => {
                tracing::info!("dashboard sign-in refused");
                return refuse(
                    actix_web::http::StatusCode::UNAUTHORIZED,
                    "that key is not valid here",
                );
            }
        }
    };
    let (id, session) = sessions.start(tenant, fleet, crate::e2b::auth::digest(key));
    tracing::info!(namespace = %session.tenant.namespace, fleet, "dashboard sign-in");
    let mut res = HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/dashboard"))
        .insert_header((
            header::SET_COOKIE,
            sessions::set_cookie(&id, req.app_config().secure()),
        ))
        .finish();
    guard_headers(res.headers_mut());
    Ok(res)
}

async fn logout(req: HttpRequest, sessions: web::Data<Sessions>) -> ApiResult<HttpResponse> {
    if let Some((id, s)) = session_of(&req, &sessions) {
        let csrf = req
            .headers()
            .get(sessions::CSRF_HEADER)
            .and_then(|v| v.to_str().ok());
        sessions
            .call(&id, csrf, |_| true)
            .map_err(|e| ApiError::unauthorized(e.to_string()))?;
        sessions.end(&id);
        tracing::info!(namespace = %s.tenant.namespace, "dashboard sign-out");
    }
    let mut res = HttpResponse::NoContent()
        .insert_header((
            header::SET_COOKIE,
            sessions::clear_cookie(req.app_config().secure()),
        ))
        .finish();
    guard_headers(res.headers_mut());
    Ok(res)
}

#[derive(Serialize)]
struct FleetNode {
    address: String,
    up: bool,
    name: Option<String>,
    runtime: Option<String>,
    version: Option<String>,
    claimed: Option<u32>,
    paused: Option<u32>,
    checkpoints: Option<u32>,
    pools: Vec<FleetPool>,
}

#[derive(Serialize)]
struct FleetPool {
    pool: String,
    warm: u32,
    target: u32,
}

/// Nodes and their pools, for an admin (an admin API key or the fleet token).
async fn fleet(e2b: web::Data<E2b>, tenant: Tenant) -> ApiResult<HttpResponse> {
    if !tenant.admin {
        return Err(ApiError::new(
            actix_web::http::StatusCode::FORBIDDEN,
            "the fleet view is for an admin key or the fleet token",
        ));
    }
    let nodes: Vec<FleetNode> = e2b
        .dispatcher
        .nodes()
        .into_iter()
        .map(|n| FleetNode {
            address: n.address,
            up: n.up,
            name: n.info.as_ref().map(|i| i.name.clone()),
            runtime: n.info.as_ref().map(|i| i.runtime.clone()),
            version: n.info.as_ref().map(|i| i.version.clone()),
            claimed: n.info.as_ref().map(|i| i.claimed),
            paused: n.info.as_ref().map(|i| i.paused),
            checkpoints: n.info.as_ref().map(|i| i.checkpoints),
            pools: n
                .info
                .map(|i| {
                    i.pools
                        .into_iter()
                        .map(|p| FleetPool {
                            pool: p.key.to_string(),
                            warm: p.warm,
                            target: p.target,
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({ "nodes": nodes })))
}

fn asset(content_type: &'static str, body: &'static str) -> HttpResponse {
    let mut res = HttpResponse::Ok().content_type(content_type).body(body);
    guard_headers(res.headers_mut());
    res
}

async fn app_js() -> HttpResponse {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn style_css() -> HttpResponse {
    asset("text/css; charset=utf-8", STYLE_CSS)
}

/// Registers the dashboard's routes (before the e2b routes). The caller provides
/// `web::Data<Sessions>` beside the e2b state and keys.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/dashboard", web::get().to(index))
        .route("/dashboard/", web::get().to(index))
        .route("/dashboard/login", web::post().to(login))
        .route("/dashboard/logout", web::post().to(logout))
        .route("/dashboard/api/fleet", web::get().to(fleet))
        .route("/dashboard/assets/app.js", web::get().to(app_js))
        .route("/dashboard/assets/style.css", web::get().to(style_css));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_escape_what_they_show() {
        let html = LoginPage {
            error: Some("<script>x</script>"),
        }
        .render()
        .unwrap();
        assert!(!html.contains("<script>x"), "{html}");
        assert!(html.contains("&#60;script&#62;") || html.contains("&lt;script&gt;"));
        let html = AppPage {
            namespace: "team-a",
            admin: false,
            fleet: false,
            csrf: "abc",
        }
        .render()
        .unwrap();
        assert!(html.contains(r#"content="abc""#), "{html}");
        assert!(!html.contains("<script>"), "no inline script: {html}");
    }
}
