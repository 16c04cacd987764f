//! Errors as `metav1.Status` (kind and apiVersion included: kubectl drops the message of a
//! Status without them), with the reason and details kubectl and client-go act on.

use std::fmt;

use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{HttpResponse, ResponseError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    ListMeta, Status, StatusCause, StatusDetails,
};

use super::types::{GROUP, PLURAL};
use crate::model::{self, ErrorKind};

#[derive(Debug, Clone)]
pub struct KubeError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Box<StatusDetails>>,
    pub retry_after: Option<u32>,
}

pub type KubeResult<T> = Result<T, KubeError>;

/// One field's validation failure: `reason` is the API server's cause type
/// (`FieldValueInvalid`, `FieldValueNotSupported`, `FieldValueForbidden`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    pub field: String,
    pub reason: &'static str,
    pub message: String,
}

impl Cause {
    pub fn new(field: impl Into<String>, reason: &'static str, message: impl Into<String>) -> Self {
        Cause {
            field: field.into(),
            reason,
            message: message.into(),
        }
    }
}

fn resource_details(name: &str) -> StatusDetails {
    StatusDetails {
        name: (!name.is_empty()).then(|| name.to_string()),
        group: Some(GROUP.into()),
        kind: Some(PLURAL.into()),
        ..Default::default()
    }
}

impl KubeError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        KubeError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    pub fn not_found(name: &str) -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            format!("{PLURAL}.{GROUP} {name:?} not found"),
        );
        e.details = Some(Box::new(resource_details(name)));
        e
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn invalid(name: &str, field: &str, why: &str) -> Self {
        let mut e = Self::new(
            422,
            "Invalid",
            format!("Sandbox.{GROUP} {name:?} is invalid: {field}: {why}"),
        );
        let mut d = resource_details(name);
        d.kind = Some("Sandbox".into());
        d.causes = Some(vec![StatusCause {
            field: Some(field.into()),
            message: Some(why.into()),
            reason: Some("FieldValueInvalid".into()),
        }]);
        e.details = Some(Box::new(d));
        e
    }

    /// 422 Invalid with one cause per field, as the API server reports validation failures.
    pub fn invalid_fields(name: &str, causes: &[Cause]) -> Self {
        let listed: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let what = match listed.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let mut e = Self::new(
            422,
            "Invalid",
            format!("Sandbox.{GROUP} {name:?} is invalid: {what}"),
        );
        let mut d = resource_details(name);
        d.kind = Some("Sandbox".into());
        d.causes = Some(
            causes
                .iter()
                .map(|c| StatusCause {
                    field: Some(c.field.clone()),
                    message: Some(c.message.clone()),
                    reason: Some(c.reason.into()),
                })
                .collect(),
        );
        e.details = Some(Box::new(d));
        e
    }

    /// 409 Conflict on the object `name` (a stale resourceVersion or a failed precondition).
    pub fn conflict(name: &str, message: impl Into<String>) -> Self {
        let mut e = Self::new(409, "Conflict", message);
        e.details = Some(Box::new(resource_details(name)));
        e
    }

    /// 409 Conflict of a server-side apply with fields other managers applied: each cause
    /// names the field and its manager, as the API server does.
    pub fn apply_conflicts(name: &str, conflicts: &[(String, String)]) -> Self {
        let listed: Vec<String> = conflicts
            .iter()
            .map(|(field, manager)| format!("conflict with {manager:?}: {field}"))
            .collect();
        let mut e = Self::new(
            409,
            "Conflict",
            format!(
                "Apply failed with {} conflict{}: {}",
                conflicts.len(),
                if conflicts.len() == 1 { "" } else { "s" },
                listed.join("\n")
            ),
        );
        let mut d = resource_details(name);
        d.causes = Some(
            conflicts
                .iter()
                .map(|(field, manager)| StatusCause {
                    field: Some(field.clone()),
                    message: Some(format!("conflict with {manager:?}")),
                    reason: Some("FieldManagerConflict".into()),
                })
                .collect(),
        );
        e.details = Some(Box::new(d));
        e
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// `user` cannot `verb` the resource in `namespace` (None: cluster-wide).
    pub fn forbidden(
        user: &str,
        verb: &str,
        subresource: Option<&str>,
        namespace: Option<&str>,
        why: &str,
    ) -> Self {
        let resource = match subresource {
            Some(s) => format!("{PLURAL}/{s}"),
            None => PLURAL.to_string(),
        };
        let scope = match namespace {
            Some(ns) => format!("in the namespace {ns:?}"),
            None => "at the cluster scope".to_string(),
        };
        let mut e = Self::new(
            403,
            "Forbidden",
            format!(
                "{PLURAL}.{GROUP} is forbidden: User {user:?} cannot {verb} resource {resource:?} in API group {GROUP:?} {scope}{}",
                if why.is_empty() {
                    String::new()
                } else {
                    format!(": {why}")
                }
            ),
        );
        e.details = Some(Box::new(resource_details("")));
        e
    }

    pub fn forbidden_path(user: &str, path: &str) -> Self {
        Self::new(
            403,
            "Forbidden",
            format!("forbidden: User {user:?} cannot get path {path:?}"),
        )
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn internal(message: impl fmt::Display) -> Self {
        let mut e = Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
        );
        e.details = Some(Box::new(StatusDetails {
            causes: Some(vec![StatusCause {
                message: Some(message.to_string()),
                ..Default::default()
            }]),
            ..Default::default()
        }));
        e
    }

    pub fn status(&self) -> Status {
        Status {
            code: Some(i32::from(self.code)),
            details: self.details.clone().map(|d| {
                let mut d = *d;
                if let Some(r) = self.retry_after {
                    d.retry_after_seconds = Some(r as i32);
                }
                d
            }),
            message: Some(self.message.clone()),
            metadata: ListMeta::default(),
            reason: Some(self.reason.to_string()),
            status: Some("Failure".into()),
        }
    }
}

impl fmt::Display for KubeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for KubeError {}

impl From<model::Error> for KubeError {
    fn from(e: model::Error) -> Self {
        let (code, reason) = match e.kind {
            ErrorKind::NotFound => (404, "NotFound"),
            ErrorKind::AlreadyExists => (409, "AlreadyExists"),
            ErrorKind::Invalid => (400, "BadRequest"),
            ErrorKind::Conflict => (409, "Conflict"),
            ErrorKind::NoCapacity | ErrorKind::Unavailable => (503, "ServiceUnavailable"),
            ErrorKind::OutcomeUnknown => (504, "Timeout"),
            // metav1 has no reason for a full disk. Its reasons name the HTTP status they go
            // with ("ServiceUnavailable", "TooManyRequests"), so 507 gets the status's own
            // name: kubectl prints "Error from server (InsufficientStorage)", and client-go,
            // which does not know the reason, goes by the code and does not retry a 507.
            ErrorKind::StorageFull => (507, "InsufficientStorage"),
            ErrorKind::TooLarge => (413, "RequestEntityTooLarge"),
            ErrorKind::Unauthenticated => (401, "Unauthorized"),
            ErrorKind::Forbidden => (403, "Forbidden"),
            ErrorKind::Internal => return KubeError::internal(e.message),
        };
        let mut out = KubeError::new(code, reason, e.message);
        if code == 503 {
            // client-go retries a 503 that names when to come back.
            out.retry_after = Some(1);
            out.details = Some(Box::default());
        }
        out
    }
}

impl ResponseError for KubeError {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse {
        let mut res = HttpResponse::build(self.status_code());
        if let Some(s) = self.retry_after {
            res.insert_header((header::RETRY_AFTER, s.to_string()));
        }
        res.json(self.status())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_carry_kind_reason_and_details() {
        let v = serde_json::to_value(KubeError::not_found("nope").status()).unwrap();
        assert_eq!(v["kind"], "Status");
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["reason"], "NotFound");
        assert_eq!(v["code"], 404);
        assert_eq!(v["details"]["kind"], "sandboxes");
        assert_eq!(v["message"], "sandboxes.agents.x-k8s.io \"nope\" not found");
        let busy: KubeError = model::Error::no_capacity("full").into();
        let v = serde_json::to_value(busy.status()).unwrap();
        assert_eq!(v["code"], 503);
        assert_eq!(v["details"]["retryAfterSeconds"], 1);
        let full: KubeError =
            model::Error::storage_full("the node's data directory is full").into();
        let v = serde_json::to_value(full.status()).unwrap();
        assert_eq!(v["code"], 507);
        assert_eq!(v["reason"], "InsufficientStorage");
        assert_eq!(v["status"], "Failure");
        assert!(
            full.retry_after.is_none(),
            "a full disk is not a come-back-in-a-second"
        );
        assert_eq!(full.status_code().as_u16(), 507);
        let bad: KubeError = model::Error::invalid("fork count 17 not in 1..16").into();
        assert_eq!(bad.code, 400);
    }
}
