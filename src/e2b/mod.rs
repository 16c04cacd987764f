//! The e2b REST surface. It answers health; the sandbox routes are built on the dispatcher
//! next. Every error is JSON `{"code": <status>, "message": "…"}` as the SDKs expect.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};

pub fn error_response(status: StatusCode, message: impl Into<String>) -> HttpResponse {
    HttpResponse::build(status).json(serde_json::json!({
        "code": status.as_u16(),
        "message": message.into(),
    }))
}

async fn health() -> HttpResponse {
    HttpResponse::NoContent().finish()
}

async fn no_route(req: HttpRequest) -> HttpResponse {
    error_response(
        StatusCode::NOT_FOUND,
        format!("no route for {} {}", req.method(), req.path()),
    )
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/health", web::get().to(health))
        .default_service(web::to(no_route));
}
