//! The one error type every layer shares. Surfaces map it once (e2b JSON, Kubernetes Status);
//! the node protocol carries it as a gRPC status code, one code per kind.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    NotFound,
    AlreadyExists,
    /// The request itself is wrong; retrying it unchanged cannot succeed.
    Invalid,
    /// The request conflicts with the current state of the resource.
    Conflict,
    /// No node has room; nothing was claimed, so a retry is safe.
    NoCapacity,
    /// A node or dependency could not be reached; nothing was done.
    Unavailable,
    /// A call may or may not have taken effect (timeout after sending); must not be blindly retried.
    OutcomeUnknown,
    Unauthenticated,
    Forbidden,
    Internal,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not found",
            ErrorKind::AlreadyExists => "already exists",
            ErrorKind::Invalid => "invalid",
            ErrorKind::Conflict => "conflict",
            ErrorKind::NoCapacity => "no capacity",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::OutcomeUnknown => "outcome unknown",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, message)
    }
    pub fn no_capacity(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NoCapacity, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }
    pub fn outcome_unknown(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::OutcomeUnknown, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unauthenticated, message)
    }

    /// Adds context in front of the message, keeping the kind.
    pub fn context(self, what: impl fmt::Display) -> Self {
        Error {
            kind: self.kind,
            message: format!("{what}: {}", self.message),
        }
    }

    pub fn io(what: impl fmt::Display, err: std::io::Error) -> Self {
        Self::internal(format!("{what}: {err}"))
    }
}
