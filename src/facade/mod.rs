//! The Kubernetes aggregated-API facade for `agents.x-k8s.io/v1beta1` sandboxes: discovery,
//! OpenAPI, list/get/watch/create/delete/patch/update and the lifecycle subresources, on its own TLS
//! listener, over the same dispatcher as the e2b surface.

pub mod auth;
pub mod create;
pub mod discovery;
pub mod inventories;
pub mod kubeconfig;
pub mod list_body;
pub mod objects;
pub mod openapi;
pub mod patch;
pub mod sandboxes;
pub mod selectors;
pub mod status;
pub mod stored;
pub mod table;
pub mod tls;
pub mod types;
pub mod update;
pub mod validation;
pub mod watch;
pub mod writes;

use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::ServiceResponse;
use actix_web::middleware::{ErrorHandlerResponse, ErrorHandlers};
use actix_web::{ResponseError, web};
use moka::sync::Cache;

use crate::dispatch::Dispatcher;
use crate::dispatch::read_view::Entry;
use status::KubeError;

/// Largest request body (kube-apiserver's own limit is 3 MiB).
pub const MAX_BODY: usize = 3 * 1024 * 1024;
/// How long the pages of one paginated list stay available.
const CONTINUE_TTL: Duration = Duration::from_secs(300);

/// One list result, kept for its continue tokens.
pub struct ListSnapshot {
    pub entries: Arc<[Entry]>,
    pub revision: u64,
}

pub struct Facade {
    pub dispatcher: Dispatcher,
    pub auth: auth::Auth,
    continues: Cache<String, Arc<ListSnapshot>>,
    /// Ends open watches when the gateway stops.
    closing: tokio_util::sync::CancellationToken,
}

impl Facade {
    pub fn new(dispatcher: Dispatcher, auth: auth::Auth) -> Self {
        Facade {
            dispatcher,
            auth,
            continues: Cache::builder()
                .time_to_live(CONTINUE_TTL)
                .max_capacity(256)
                .build(),
            closing: tokio_util::sync::CancellationToken::new(),
        }
    }

    /// Ends every open watch (they would otherwise hold a graceful shutdown open).
    pub fn close(&self) {
        self.closing.cancel();
    }

    pub fn closing(&self) -> tokio_util::sync::CancellationToken {
        self.closing.clone()
    }
}

/// Rewrites any error response that is not a Status yet (a framework 404, an extractor error)
/// into one, keeping its code.
fn ensure_status<B>(res: ServiceResponse<B>) -> actix_web::Result<ErrorHandlerResponse<B>> {
    crate::httpx::json_error(res, |status, message| {
        let reason = match status.as_u16() {
            400 => "BadRequest",
            404 => "NotFound",
            405 => "MethodNotAllowed",
            413 => "RequestEntityTooLarge",
            415 => "UnsupportedMediaType",
            code if code >= 500 => "InternalError",
            _ => "BadRequest",
        };
        KubeError::new(status.as_u16(), reason, message).error_response()
    })
}

pub fn status_errors<B: 'static>() -> ErrorHandlers<B> {
    ErrorHandlers::new().default_handler(ensure_status)
}

const GV: &str = "/apis/agents.x-k8s.io/v1beta1";

/// Registers the facade's routes; the caller provides `web::Data<Facade>`.
pub fn configure(cfg: &mut web::ServiceConfig) {
    use discovery as d;
    use sandboxes as s;
    cfg.app_data(web::PayloadConfig::new(MAX_BODY))
        .route("/healthz", web::get().to(d::healthz))
        .route("/livez", web::get().to(d::healthz))
        .route("/readyz", web::get().to(d::readyz))
        .route("/version", web::get().to(d::version))
        .route("/api", web::get().to(d::api))
        .route("/apis", web::get().to(d::apis))
        .route("/apis/agents.x-k8s.io", web::get().to(d::api_group))
        .route(GV, web::get().to(d::resources))
        .route("/openapi/v3", web::get().to(d::openapi_v3))
        .route(
            "/openapi/v3/apis/agents.x-k8s.io/v1beta1",
            web::get().to(d::openapi_v3_group_version),
        )
        .route("/openapi/v2", web::get().to(d::openapi_v2))
        .route(
            inventories::GROUP_PATH,
            web::get().to(inventories::api_group),
        )
        .route(inventories::GV_PATH, web::get().to(inventories::resources))
        .service(
            web::resource(format!("{}/nodeinventories", inventories::GV_PATH))
                .route(web::get().to(inventories::list))
                .default_service(web::to(s::method_not_allowed)),
        )
        .service(
            web::resource(format!("{}/nodeinventories/{{name}}", inventories::GV_PATH))
                .route(web::get().to(inventories::get))
                .default_service(web::to(s::method_not_allowed)),
        )
        .service(
            web::resource(format!("{GV}/sandboxes"))
                .route(web::get().to(s::list_all))
                .default_service(web::to(s::method_not_allowed)),
        )
        .service(
            web::resource(format!("{GV}/namespaces/{{ns}}/sandboxes"))
                .route(web::get().to(s::list_namespaced))
                .route(web::post().to(s::create))
                .default_service(web::to(s::method_not_allowed)),
        )
        .service(
            web::resource(format!("{GV}/namespaces/{{ns}}/sandboxes/{{name}}"))
                .route(web::get().to(s::get))
                .route(web::delete().to(s::delete))
                .route(web::patch().to(writes::patch))
                .route(web::put().to(writes::replace))
                .default_service(web::to(s::method_not_allowed)),
        )
        .service(
            web::resource(format!("{GV}/namespaces/{{ns}}/sandboxes/{{name}}/{{sub}}"))
                .route(web::post().to(s::verb))
                .default_service(web::to(s::method_not_allowed)),
        )
        .default_service(web::to(s::not_found));
}
