//! The e2b REST surface: the control-plane API the e2b SDKs call, on the shared dispatcher.
//! Every error is JSON `{"code": <status>, "message": "…"}`; ids are published DNS-safe.

pub mod auth;
pub mod body;
pub mod builds;
pub mod error;
pub mod idempotency;
pub mod listed;
pub mod listing;
pub mod logs;
pub mod metrics;
pub mod network;
pub mod openapi;
pub mod proxy;
mod render;
pub mod sandboxes;
pub mod secrets;
pub mod snapshots;
pub mod template_admin;
pub mod template_names;
pub mod templates;
pub mod tokens;
pub mod upload_url;
pub mod volumes;
pub mod wire;
pub mod wire_templates;

use actix_web::middleware::ErrorHandlers;
use actix_web::{HttpRequest, HttpResponse, web};

use crate::dispatch::Dispatcher;
use error::{ApiError, ensure_json};

/// State shared by the e2b handlers.
pub struct E2b {
    pub dispatcher: Dispatcher,
    pub tokens: tokens::EnvdTokens,
    /// The sandbox domain the SDKs build data-plane host names from.
    pub domain: Option<String>,
    pub idempotency: idempotency::Idempotency,
    /// Data-plane routing into sandboxes.
    pub proxy: proxy::Proxy,
    /// Largest upload of a template build's files.
    pub upload_max_bytes: u64,
    /// Tenants' secrets (the Secrets API writes them; egress proxies fill them in).
    pub secrets: std::sync::Arc<crate::secrets::SecretStore>,
    /// Tenants' volumes (None: not offered, 501).
    pub volumes: Option<std::sync::Arc<crate::volumes::VolumeStore>>,
}

async fn health() -> HttpResponse {
    HttpResponse::NoContent().finish()
}

async fn no_route(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::not_found(format!(
        "no route for {} {}",
        req.method(),
        req.path()
    )))
}

async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(openapi::document_json())
}

/// The middleware that turns every error response into the JSON envelope.
pub fn json_errors<B: 'static>() -> ErrorHandlers<B> {
    ErrorHandlers::new().default_handler(ensure_json)
}

/// Registers the e2b routes. The caller provides `web::Data<E2b>` and `web::Data<ApiKeys>`.
pub fn configure(cfg: &mut web::ServiceConfig) {
    use sandboxes as s;
    cfg.app_data(web::PayloadConfig::new(body::MAX_BODY))
        .route("/health", web::get().to(health))
        .route("/openapi.json", web::get().to(openapi_json))
        .route("/v2/sandboxes", web::post().to(s::create_v2))
        .route("/v2/sandboxes", web::get().to(s::list_v2))
        .route("/sandboxes", web::post().to(s::create_v1))
        .route("/sandboxes", web::get().to(s::list_v1))
        // Before /sandboxes/{id} so that "metrics" is not taken for an id.
        .route("/sandboxes/metrics", web::get().to(metrics::metrics_batch))
        .route("/sandboxes/{id}", web::get().to(s::get))
        .route("/sandboxes/{id}", web::delete().to(s::kill))
        .route("/sandboxes/{id}/timeout", web::post().to(s::set_timeout))
        .route("/sandboxes/{id}/refreshes", web::post().to(s::refresh))
        .route("/sandboxes/{id}/pause", web::post().to(s::pause))
        .route("/sandboxes/{id}/resume", web::post().to(s::resume))
        .route("/sandboxes/{id}/connect", web::post().to(s::connect_v1))
        .route("/v2/sandboxes/{id}/connect", web::post().to(s::connect_v2))
        .route("/sandboxes/{id}/fork", web::post().to(s::fork))
        .route(
            "/sandboxes/{id}/snapshots",
            web::post().to(snapshots::snapshot),
        )
        .route("/sandboxes/{id}/metrics", web::get().to(metrics::metrics))
        .route("/sandboxes/{id}/logs", web::get().to(logs::v1))
        .route("/v2/sandboxes/{id}/logs", web::get().to(logs::v2))
        .route("/snapshots", web::get().to(snapshots::list_snapshots))
        .route("/v3/templates", web::post().to(builds::request))
        .route("/templates/aliases/{alias}", web::get().to(builds::alias))
        .route("/templates/{id}/files/{hash}", web::get().to(builds::files))
        .route("/_uploads/{id}/{hash}", web::put().to(builds::upload))
        .route(
            "/v2/templates/{id}/builds/{build}",
            web::post().to(builds::start),
        )
        .route(
            "/templates/{id}/builds/{build}/status",
            web::get().to(builds::status),
        )
        .route(
            "/templates/tags",
            web::post().to(template_admin::assign_tags),
        )
        .route(
            "/templates/tags",
            web::delete().to(template_admin::remove_tags),
        )
        .route("/templates/{id}/tags", web::get().to(template_admin::tags))
        .route("/templates/{id}", web::get().to(template_admin::get))
        .route(
            "/templates/{id}",
            web::patch().to(template_admin::publish_v1),
        )
        .route(
            "/v2/templates/{id}",
            web::patch().to(template_admin::publish_v2),
        )
        .route("/templates", web::get().to(templates::list))
        .route("/v2/templates", web::get().to(templates::list_v2))
        .route(
            "/templates/{id}",
            web::delete().to(snapshots::delete_template),
        )
        // Known to the SDKs, not served here.
        .route("/sandboxes/{id}/network", web::put().to(network::update))
        // The legacy build routes (a Docker push to e2b's registry, v1 CLIs and early SDKs).
        .route("/templates", web::post().to(builds::legacy_create_v1))
        .route("/v2/templates", web::post().to(builds::legacy_create_v2))
        .route("/templates/{id}", web::post().to(builds::legacy_rebuild))
        .route(
            "/templates/{id}/builds/{build}",
            web::post().to(builds::legacy_start),
        )
        // Every template route is above: what reaches here is a method they do not take.
        .route("/templates/{tail:.*}", web::to(builds::no_method))
        .route("/volumes", web::get().to(volumes::list))
        .route("/volumes", web::post().to(volumes::create))
        .route("/volumes/{volume}", web::get().to(volumes::get))
        .route("/volumes/{volume}", web::delete().to(volumes::delete))
        .route("/volumes{tail:.*}", web::to(volumes::other))
        .route(
            "/volumecontent/{volume}/dir",
            web::get().to(volumes::list_dir),
        )
        .route(
            "/volumecontent/{volume}/dir",
            web::post().to(volumes::make_dir),
        )
        .route(
            "/volumecontent/{volume}/file",
            web::get().to(volumes::read_file),
        )
        .route(
            "/volumecontent/{volume}/file",
            web::put().to(volumes::write_file),
        )
        .route("/volumecontent/{volume}/path", web::get().to(volumes::stat))
        .route(
            "/volumecontent/{volume}/path",
            web::patch().to(volumes::update),
        )
        .route(
            "/volumecontent/{volume}/path",
            web::delete().to(volumes::remove),
        )
        .route("/secrets", web::get().to(secrets::list))
        .route("/secrets", web::post().to(secrets::create))
        .route("/secrets/{secret}", web::get().to(secrets::get))
        .route("/secrets/{secret}", web::post().to(secrets::update))
        .route("/secrets/{secret}", web::delete().to(secrets::delete))
        .route("/secrets{tail:.*}", web::to(secrets::other))
        .default_service(web::to(no_route));
}
