//! HTTP helpers both surfaces share.

use actix_web::HttpResponse;
use actix_web::dev::ServiceResponse;
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::ErrorHandlerResponse;

/// Marks a response that must reach the client unchanged.
pub struct Passthrough;

/// Rewrites an error response that is not JSON yet (a framework 404 or 405, an extractor's
/// plain-text error) into the surface's JSON error, made by `envelope` from the status and a
/// message. The status and other headers (such as `Allow`) are kept.
pub fn json_error<B>(
    res: ServiceResponse<B>,
    envelope: impl FnOnce(StatusCode, String) -> HttpResponse,
) -> actix_web::Result<ErrorHandlerResponse<B>> {
    // Another party's answer (a sandbox's, through the data-plane proxy) is passed on as it is.
    if res.response().extensions().contains::<Passthrough>() {
        return Ok(ErrorHandlerResponse::Response(res.map_into_left_body()));
    }
    let is_json = res
        .response()
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return Ok(ErrorHandlerResponse::Response(res.map_into_left_body()));
    }
    let status = res.status();
    let message = res
        .response()
        .error()
        .map(|e| e.to_string())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_string());
    let (req, old) = res.into_parts();
    let mut new = envelope(status, message);
    for (name, value) in old.headers() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            new.headers_mut().insert(name.clone(), value.clone());
        }
    }
    new.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(ErrorHandlerResponse::Response(
        ServiceResponse::new(req, new).map_into_right_body(),
    ))
}
