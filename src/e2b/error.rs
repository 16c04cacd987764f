//! The e2b error envelope: every error is `application/json`
//! `{"code": <HTTP status>, "message": "…", "error_code"?: "…"}`. The SDKs parse the body
//! before looking at the status, and the JS SDK reads `code` rather than the status, so the
//! two must agree and the body must always be JSON.

use std::fmt;

use actix_web::body::BoxBody;
use actix_web::dev::ServiceResponse;
use actix_web::http::StatusCode;
use actix_web::http::header::{self};
use actix_web::middleware::ErrorHandlerResponse;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

use crate::model::{self, ErrorKind};

/// Seconds a client should wait before retrying when no node has room.
const RETRY_AFTER_SECONDS: u32 = 1;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub error_code: Option<&'static str>,
    pub retry_after: Option<u32>,
    /// `Should-Retry: false` tells the Python SDK not to replay the request.
    pub should_retry: Option<bool>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// Equal to the HTTP status.
    pub code: u16,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            error_code: None,
            retry_after: None,
            should_retry: None,
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message)
    }
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }
    pub fn not_implemented(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_IMPLEMENTED, message)
    }
    /// A request no route serves: 405 when `own` (a path of the API, another method), else
    /// 404.
    pub fn not_served(req: &actix_web::HttpRequest, own: bool) -> Self {
        if own {
            return ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{} is not a method of {}", req.method(), req.path()),
            );
        }
        ApiError::not_found(format!("no route for {} {}", req.method(), req.path()))
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.error_code = Some(code);
        self
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            code: self.status.as_u16(),
            message: self.message.clone(),
            error_code: self.error_code,
        }
    }
}

/// Runs `f` (file or store work) off the request's thread; `what` names it when the thread
/// itself fails.
pub async fn off_thread<T: Send + 'static>(
    what: &'static str,
    f: impl FnOnce() -> model::Result<T> + Send + 'static,
) -> ApiResult<T> {
    actix_web::web::block(f)
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("{what} failed: {e}"),
            )
        })?
        .map_err(ApiError::from)
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.as_u16(), self.message)
    }
}

impl From<model::Error> for ApiError {
    fn from(e: model::Error) -> Self {
        let status = match e.kind {
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::AlreadyExists | ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::Invalid => StatusCode::BAD_REQUEST,
            ErrorKind::NoCapacity | ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::OutcomeUnknown => StatusCode::GATEWAY_TIMEOUT,
            // The SDKs raise NotEnoughSpaceException for 507.
            ErrorKind::StorageFull => StatusCode::INSUFFICIENT_STORAGE,
            ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
            ErrorKind::Forbidden => StatusCode::FORBIDDEN,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let mut out = ApiError::new(status, e.message);
        match e.kind {
            ErrorKind::NoCapacity => {
                out.error_code = Some("sandbox_capacity_unavailable");
                out.retry_after = Some(RETRY_AFTER_SECONDS);
            }
            ErrorKind::Unavailable => out.retry_after = Some(RETRY_AFTER_SECONDS),
            ErrorKind::OutcomeUnknown => {
                // The request may have taken effect: a blind replay could act twice.
                out.error_code = Some("idempotency_outcome_unknown");
                out.should_retry = Some(false);
            }
            // No Retry-After: what hit the full disk (a snapshot, a fork) must happen on the
            // sandbox's own node, which has room again only once someone frees some.
            ErrorKind::StorageFull => out.error_code = Some("insufficient_storage"),
            ErrorKind::Internal => out.error_code = Some("internal_server_error"),
            _ => {}
        }
        out
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse<BoxBody> {
        let mut res = HttpResponse::build(self.status);
        if let Some(s) = self.retry_after {
            res.insert_header((header::RETRY_AFTER, s.to_string()));
        }
        if let Some(r) = self.should_retry {
            res.insert_header(("Should-Retry", if r { "true" } else { "false" }));
        }
        res.json(self.body())
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// Rewrites any error response that is not JSON yet (a framework 404/405, an extractor's
/// plain-text error) into the envelope, keeping its status.
pub fn ensure_json<B>(res: ServiceResponse<B>) -> actix_web::Result<ErrorHandlerResponse<B>> {
    crate::httpx::json_error(res, |status, message| {
        ApiError::new(status, message).error_response()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_node_disk_is_507_without_retry_after() {
        let e: ApiError = model::Error::storage_full("the node's data directory is full").into();
        assert_eq!(e.status.as_u16(), 507);
        assert_eq!(e.error_code, Some("insufficient_storage"));
        assert_eq!(e.retry_after, None);
        let res = e.error_response();
        assert_eq!(res.status().as_u16(), 507);
        assert!(res.headers().get(header::RETRY_AFTER).is_none());
        assert_eq!(e.body().code, 507);
        // No capacity stays 503 with Retry-After.
        let busy: ApiError = model::Error::no_capacity("busy").into();
        assert_eq!(busy.status.as_u16(), 503);
        assert_eq!(busy.retry_after, Some(RETRY_AFTER_SECONDS));
    }
}
