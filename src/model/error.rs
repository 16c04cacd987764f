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
    /// The node's data directory is full (ENOSPC or EDQUOT): what was being written was
    /// removed again, so nothing half-written is left or listed. Another node, or this one once
    /// space is freed, can do the same request.
    StorageFull,
    /// What was sent is over a size limit; nothing of it was kept.
    TooLarge,
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
            ErrorKind::StorageFull => "no space",
            ErrorKind::TooLarge => "too large",
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
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::TooLarge, message)
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
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Forbidden, message)
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

    pub fn storage_full(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::StorageFull, message)
    }

    /// An I/O failure while doing `what`. A full file system (ENOSPC, or EDQUOT for a quota)
    /// is the node's storage running out, not a bug: it gets a kind of its own so clients
    /// learn that the request may succeed elsewhere or later. Everything else is internal.
    pub fn io(what: impl fmt::Display, err: std::io::Error) -> Self {
        if is_storage_full(&err) {
            Self::storage_full(format!(
                "the node's data directory is full (no space left on device) while {what}: {err}"
            ))
        } else {
            Self::internal(format!("{what}: {err}"))
        }
    }
}

/// Whether `err` says the file system (or the writer's quota on it) has no room left.
pub fn is_storage_full(err: &std::io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        || matches!(
            err.kind(),
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_its_own_kind_and_says_so() {
        for errno in [libc::ENOSPC, libc::EDQUOT] {
            let e = Error::io(
                "copying the sandbox's disk",
                std::io::Error::from_raw_os_error(errno),
            );
            assert_eq!(e.kind, ErrorKind::StorageFull, "errno {errno}");
            assert!(e.message.contains("data directory is full"), "{e}");
            assert!(e.message.contains("copying the sandbox's disk"), "{e}");
        }
        assert_eq!(ErrorKind::StorageFull.as_str(), "no space");
        // Wrapping keeps the kind (a context added on the way up must not turn it into a 500).
        let wrapped = Error::io("x", std::io::Error::from_raw_os_error(libc::ENOSPC)).context("y");
        assert_eq!(wrapped.kind, ErrorKind::StorageFull);
    }

    #[test]
    fn other_io_errors_stay_internal() {
        for errno in [libc::EIO, libc::EACCES, libc::ENOENT, libc::EROFS] {
            let e = Error::io("x", std::io::Error::from_raw_os_error(errno));
            assert_eq!(e.kind, ErrorKind::Internal, "errno {errno}");
        }
        let e = Error::io("x", std::io::Error::other("no space left, says a message"));
        assert_eq!(e.kind, ErrorKind::Internal, "only the errno decides");
    }
}
