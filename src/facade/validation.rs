//! Checks on an updated Sandbox's metadata: label and annotation keys and values as
//! Kubernetes allows them, the object's identity and preconditions, the gateway's own labels
//! and annotations (read-only), and the claim-metadata limits of what would be stored.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::create;
use super::objects;
use super::status::{Cause, KubeError, KubeResult};
use super::types::keys;
use crate::model::{self, SandboxRecord};

/// Compact JSON of a value for a message, cut to a readable length.
pub(super) fn shown(v: &Value) -> String {
    let mut s = v.to_string();
    if s.len() > 160 {
        let cut = (0..=157)
            .rev()
            .find(|i| s.is_char_boundary(*i))
            .unwrap_or(0);
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

pub(super) fn invalid(field: impl Into<String>, value: &Value, why: &str) -> Cause {
    Cause::new(
        field,
        "FieldValueInvalid",
        format!("Invalid value: {}: {why}", shown(value)),
    )
}

/// A label name part or value: at most 63 characters, alphanumerics at both ends, `-_.`
/// between.
fn valid_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A qualified key (`[prefix/]name`, the prefix a DNS subdomain), as label and annotation
/// keys must be.
fn valid_key(k: &str) -> bool {
    match k.split_once('/') {
        Some((prefix, name)) => {
            create::valid_name(prefix) && prefix.len() <= 253 && valid_name_part(name)
        }
        None => valid_name_part(k),
    }
}

/// Causes for label keys and values and annotation keys Kubernetes would refuse.
pub fn check_keys(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Vec<Cause> {
    let mut causes = Vec::new();
    for (k, v) in labels {
        if !valid_key(k) {
            causes.push(invalid("metadata.labels", &Value::from(k.as_str()), "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (at most 63 characters, with an optional DNS subdomain prefix and '/')"));
        } else if !v.is_empty() && !valid_name_part(v) {
            causes.push(invalid(format!("metadata.labels[{k}]"), &Value::from(v.as_str()), "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (at most 63 characters)"));
        }
    }
    for k in annotations.keys() {
        if !valid_key(k) {
            causes.push(invalid("metadata.annotations", &Value::from(k.as_str()), "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (at most 63 characters, with an optional DNS subdomain prefix and '/')"));
        }
    }
    causes
}

/// Name, namespace, uid and resourceVersion of the updated object must still be the
/// object's (a resourceVersion is a precondition: stale is a conflict).
pub(super) fn check_identity(
    r: &SandboxRecord,
    current: &Value,
    meta: &Map<String, Value>,
) -> KubeResult<()> {
    let name = objects::name(r);
    let given = |f: &str| {
        meta.get(f)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    if let Some(n) = given("name")
        && n != name
        && n != r.name()
    {
        return Err(KubeError::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        )));
    }
    if let Some(ns) = given("namespace")
        && ns != r.namespace()
    {
        return Err(KubeError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let uid = objects::uid(&r.id);
    if let Some(u) = given("uid")
        && u != uid
    {
        return Err(KubeError::conflict(
            &name,
            format!("Precondition failed: UID in precondition: {u}, UID in object meta: {uid}"),
        ));
    }
    let rv = current["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default();
    if let Some(v) = given("resourceVersion")
        && v != rv
    {
        return Err(KubeError::conflict(
            &name,
            format!(
                "Operation cannot be fulfilled on sandboxes.agents.x-k8s.io {name:?}: the object has been modified; please apply your changes to the latest version and try again"
            ),
        ));
    }
    Ok(())
}

/// Splits submitted labels or annotations into the client's own and checks that the system
/// ones keep the values reads show: a change is refused, a removal ignored (reads show them
/// again).
pub(super) fn split_system(
    submitted: BTreeMap<String, String>,
    system: &[&str],
    shown: &BTreeMap<String, String>,
    field: &str,
    causes: &mut Vec<Cause>,
) -> BTreeMap<String, String> {
    let mut own = BTreeMap::new();
    for (k, v) in submitted {
        if !system.contains(&k.as_str()) {
            own.insert(k, v);
        } else if k != keys::TOKEN && shown.get(&k) != Some(&v) {
            causes.push(invalid(
                format!("{field}[{k}]"),
                &Value::from(v),
                "set by the gateway from the sandbox's state; it cannot be changed",
            ));
        }
    }
    own
}

/// The claim-metadata limits hold for what would be stored (else 422 naming `metadata`).
pub fn check_size(name: &str, metadata: &BTreeMap<String, String>) -> KubeResult<()> {
    model::sandbox::validate_string_map("metadata", metadata).map_err(|e| {
        KubeError::invalid_fields(
            name,
            &[Cause::new(
                "metadata",
                "FieldValueTooLong",
                format!(
                    "Too long: labels, annotations and the spec are kept with the claim, which allows {} entries and {} bytes ({})",
                    model::sandbox::MAX_MAP_ENTRIES,
                    model::sandbox::MAX_MAP_BYTES,
                    e.message
                ),
            )],
        )
    })
}
