//! How failures reach the SDKs: Connect error codes for RPCs (the SDK maps them to its
//! exceptions) and envd's JSON `{"code", "message"}` bodies for the plain HTTP routes.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use connectrpc::{ConnectError, ErrorCode};

use super::creds::CredsError;

/// The Connect code for a failed system call, as envd reports them: a missing path is
/// `not_found`, an existing one `already_exists`, no room `resource_exhausted`, a refusal
/// `permission_denied`, a malformed path `invalid_argument`.
pub fn io_code(e: &std::io::Error) -> ErrorCode {
    match e.raw_os_error() {
        Some(libc::ENOENT) => ErrorCode::NotFound,
        Some(libc::EEXIST) | Some(libc::ENOTEMPTY) => ErrorCode::AlreadyExists,
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => ErrorCode::PermissionDenied,
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EAGAIN) | Some(libc::ENOMEM)
        | Some(libc::EMFILE) | Some(libc::ENFILE) => ErrorCode::ResourceExhausted,
        Some(libc::ENOTDIR)
        | Some(libc::EISDIR)
        | Some(libc::ENAMETOOLONG)
        | Some(libc::EINVAL)
        | Some(libc::EXDEV) => ErrorCode::InvalidArgument,
        Some(libc::ELOOP) => ErrorCode::FailedPrecondition,
        _ => ErrorCode::Internal,
    }
}

pub fn io_err(what: impl std::fmt::Display, e: &std::io::Error) -> ConnectError {
    ConnectError::new(io_code(e), format!("{what}: {e}"))
}

pub fn creds_err(e: CredsError) -> ConnectError {
    match e {
        CredsError::CannotSwitch { .. } => {
            ConnectError::new(ErrorCode::PermissionDenied, e.to_string())
        }
        CredsError::SwitchFailed(_) => ConnectError::new(ErrorCode::Internal, e.to_string()),
    }
}

pub fn invalid(msg: impl Into<String>) -> ConnectError {
    ConnectError::new(ErrorCode::InvalidArgument, msg.into())
}

pub fn not_found(msg: impl Into<String>) -> ConnectError {
    ConnectError::new(ErrorCode::NotFound, msg.into())
}

pub fn internal(msg: impl Into<String>) -> ConnectError {
    ConnectError::new(ErrorCode::Internal, msg.into())
}

/// An error answer of the plain HTTP routes: envd's `{"code": <status>, "message": "…"}`.
#[derive(Debug)]
pub struct HttpError {
    pub status: StatusCode,
    pub message: String,
}

impl HttpError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> HttpError {
        HttpError {
            status,
            message: message.into(),
        }
    }

    /// The status for a failed file system call on `/files`.
    pub fn io(what: impl std::fmt::Display, e: &std::io::Error) -> HttpError {
        let status = match e.raw_os_error() {
            Some(libc::ENOENT) => StatusCode::NOT_FOUND,
            Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => StatusCode::FORBIDDEN,
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => StatusCode::INSUFFICIENT_STORAGE,
            Some(libc::ENOTDIR)
            | Some(libc::EISDIR)
            | Some(libc::ENAMETOOLONG)
            | Some(libc::EINVAL)
            | Some(libc::ELOOP) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        HttpError::new(status, format!("{what}: {e}"))
    }
}

impl From<CredsError> for HttpError {
    fn from(e: CredsError) -> HttpError {
        let status = match e {
            CredsError::CannotSwitch { .. } => StatusCode::FORBIDDEN,
            CredsError::SwitchFailed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        HttpError::new(status, e.to_string())
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        (self.status, axum::Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_errnos_to_envd_codes() {
        let e = |n| std::io::Error::from_raw_os_error(n);
        assert_eq!(io_code(&e(libc::ENOENT)), ErrorCode::NotFound);
        assert_eq!(io_code(&e(libc::EEXIST)), ErrorCode::AlreadyExists);
        assert_eq!(io_code(&e(libc::EACCES)), ErrorCode::PermissionDenied);
        assert_eq!(io_code(&e(libc::ENOSPC)), ErrorCode::ResourceExhausted);
        assert_eq!(io_code(&e(libc::EAGAIN)), ErrorCode::ResourceExhausted);
        assert_eq!(io_code(&e(libc::ENOTDIR)), ErrorCode::InvalidArgument);
        assert_eq!(io_code(&e(libc::EIO)), ErrorCode::Internal);
        assert_eq!(
            HttpError::io("w", &e(libc::EDQUOT)).status,
            StatusCode::INSUFFICIENT_STORAGE
        );
    }
}
