//! Turning a submitted Sandbox into a claim: names, namespace rules, the lease, the pool key
//! and the environment, all checked before any warm sandbox is spent.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use rand::Rng;
use serde_json::Value;

use super::openapi;
use super::status::{KubeError, KubeResult};
use super::types::{API_VERSION, KIND, SandboxSpec, keys};
use super::{objects, stored, update};
use crate::dispatch::{ClaimRequest, Claimed};
use crate::model::PoolKey;

/// A create request, checked.
#[derive(Debug)]
pub struct Checked {
    pub object: Value,
    pub name: String,
    pub claim: ClaimRequest,
    /// Unknown fields, for a `Warn` field validation.
    pub warnings: Vec<String>,
    /// `spec.operatingMode: Suspended`: paused as soon as it is claimed.
    pub suspended: bool,
}

const GENERATED_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn generate_name(base: &str) -> String {
    let base: String = base.chars().take(58).collect();
    let mut rng = rand::rng();
    let suffix: String = (0..5)
        .map(|_| GENERATED_ALPHABET[rng.random_range(0..GENERATED_ALPHABET.len())] as char)
        .collect();
    format!("{base}{suffix}")
}

/// A DNS-1123 subdomain, as object names must be.
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 253
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

pub(super) fn str_map(v: Option<&Value>, what: &str) -> KubeResult<BTreeMap<String, String>> {
    let Some(v) = v else {
        return Ok(BTreeMap::new());
    };
    if v.is_null() {
        return Ok(BTreeMap::new());
    }
    let obj = v
        .as_object()
        .ok_or_else(|| KubeError::bad_request(format!("{what} must be a map of strings")))?;
    obj.iter()
        .map(|(k, v)| {
            v.as_str()
                .map(|s| (k.clone(), s.to_string()))
                .ok_or_else(|| KubeError::bad_request(format!("{what}[{k:?}] must be a string")))
        })
        .collect()
}

/// CPU in millicores from a Kubernetes quantity (`500m`, `1`, `2.5`).
pub fn cpu_millis(q: &str) -> Option<u64> {
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().ok();
    }
    let v: f64 = q.parse().ok()?;
    (v.is_finite() && v >= 0.0).then(|| (v * 1000.0).ceil() as u64)
}

/// Bytes from a Kubernetes memory quantity (`512Mi`, `2Gi`, `1G`, `1000`).
pub fn memory_bytes(q: &str) -> Option<u64> {
    const UNITS: [(&str, f64); 10] = [
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("Pi", 1125899906842624.0),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
    ];
    let (number, factor) = UNITS
        .iter()
        .find_map(|(u, f)| q.strip_suffix(u).map(|n| (n, *f)))
        .unwrap_or((q, 1.0));
    let v: f64 = number.parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some((v * factor) as u64)
}

/// The size tier the first container asks for (requests, else limits); None when it asks
/// for nothing, which leaves the template's own size.
fn size(container: &Value) -> KubeResult<Option<&'static str>> {
    let resources = &container["resources"];
    let pick = |what: &str| {
        resources["requests"][what]
            .as_str()
            .map(str::to_string)
            .or_else(|| resources["requests"][what].as_f64().map(|f| f.to_string()))
            .or_else(|| resources["limits"][what].as_str().map(str::to_string))
            .or_else(|| resources["limits"][what].as_f64().map(|f| f.to_string()))
    };
    let (cpu, mem) = (pick("cpu"), pick("memory"));
    if cpu.is_none() && mem.is_none() {
        return Ok(None);
    }
    let cpu = match cpu {
        Some(q) => cpu_millis(&q)
            .ok_or_else(|| KubeError::bad_request(format!("invalid cpu quantity {q:?}")))?,
        None => 0,
    };
    let mem = match mem {
        Some(q) => memory_bytes(&q)
            .ok_or_else(|| KubeError::bad_request(format!("invalid memory quantity {q:?}")))?,
        None => 0,
    };
    const GI: u64 = 1 << 30;
    Ok(Some(if cpu > 4000 || mem > 8 * GI {
        "large"
    } else if cpu > 1000 || mem > 2 * GI {
        "medium"
    } else {
        "small"
    }))
}

/// The lease in seconds: `spec.shutdownTime` (rounded up), else the ttl annotation, else 0
/// (the node's default).
fn lease(
    spec: &Value,
    annotations: &BTreeMap<String, String>,
    now: DateTime<Utc>,
) -> KubeResult<u64> {
    if let Some(t) = spec.get("shutdownTime").filter(|v| !v.is_null()) {
        let raw = t
            .as_str()
            .ok_or_else(|| KubeError::bad_request("spec.shutdownTime must be an RFC 3339 time"))?;
        let at = DateTime::parse_from_rfc3339(raw).map_err(|e| {
            KubeError::bad_request(format!(
                "spec.shutdownTime {raw:?} is not an RFC 3339 time: {e}"
            ))
        })?;
        let millis = (at.with_timezone(&Utc) - now).num_milliseconds();
        if millis <= 0 {
            return Err(KubeError::bad_request(format!(
                "spec.shutdownTime {raw} is not in the future"
            )));
        }
        return Ok((millis as u64).div_ceil(1000));
    }
    match annotations.get(keys::TTL_SECONDS) {
        None => Ok(0),
        Some(v) => v.trim().parse::<u64>().map_err(|_| {
            KubeError::bad_request(format!(
                "invalid {} annotation {v:?}: want a non-negative integer of seconds",
                keys::TTL_SECONDS
            ))
        }),
    }
}

fn env_vars(container: &Value) -> KubeResult<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let Some(list) = container.get("env").and_then(Value::as_array) else {
        return Ok(out);
    };
    for e in list {
        let name = e["name"].as_str().unwrap_or_default();
        if e.get("valueFrom").is_some_and(|v| !v.is_null()) {
            return Err(KubeError::bad_request(format!(
                "env {name:?}: valueFrom is not supported; give a literal value"
            )));
        }
        out.insert(
            name.to_string(),
            e["value"].as_str().unwrap_or_default().to_string(),
        );
    }
    Ok(out)
}

/// Checks a create body for namespace `namespace` and builds the claim. `validation` is the
/// `fieldValidation` query parameter.
pub fn check(body: &[u8], namespace: &str, validation: Option<&str>) -> KubeResult<Checked> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(KubeError::bad_request(
            "the request body is empty: send a Sandbox object",
        ));
    }
    let mut object: Value = serde_json::from_slice(body).map_err(|e| {
        KubeError::bad_request(format!("the request body is not a JSON object: {e}"))
    })?;
    if !object.is_object() {
        return Err(KubeError::bad_request(
            "the request body must be a Sandbox object",
        ));
    }
    for (field, want) in [("apiVersion", API_VERSION), ("kind", KIND)] {
        match object.get(field).and_then(Value::as_str) {
            None | Some("") => {}
            Some(v) if v == want => {}
            Some(v) => {
                return Err(KubeError::bad_request(format!(
                    "{field} must be {want:?}, not {v:?}"
                )));
            }
        }
    }
    let meta = object.get("metadata").cloned().unwrap_or(Value::Null);
    match meta.get("namespace").and_then(Value::as_str) {
        None | Some("") => {}
        Some(ns) if ns == namespace => {}
        Some(_) => {
            return Err(KubeError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    let given = meta.get("name").and_then(Value::as_str).unwrap_or_default();
    let generate = meta
        .get("generateName")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let name = match (given, generate) {
        ("", "") => {
            return Err(KubeError::invalid(
                "",
                "metadata.name",
                "Required value: name or generateName is required",
            ));
        }
        ("", base) => generate_name(base),
        (n, _) => n.to_string(),
    };
    if !valid_name(&name) {
        return Err(KubeError::invalid(
            &name,
            "metadata.name",
            "Invalid value: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
        ));
    }
    let mut warnings = Vec::new();
    if matches!(validation, Some("Strict") | Some("Warn")) {
        let unknown = openapi::unknown_fields(&object, openapi::SANDBOX_SCHEMA);
        if !unknown.is_empty() {
            if validation == Some("Strict") {
                let list: Vec<String> = unknown
                    .iter()
                    .map(|f| format!("unknown field {f:?}"))
                    .collect();
                return Err(KubeError::bad_request(format!(
                    "strict decoding error: {}",
                    list.join(", ")
                )));
            }
            warnings = unknown
                .into_iter()
                .map(|f| format!("unknown field {f:?}"))
                .collect();
        }
    }
    let spec_value = object.get("spec").cloned().unwrap_or(Value::Null);
    if spec_value.is_null() {
        return Err(KubeError::invalid(&name, "spec", "Required value"));
    }
    serde_json::from_value::<SandboxSpec>(spec_value.clone())
        .map_err(|e| KubeError::bad_request(format!("spec: {e}")))?;
    let suspended = match spec_value.get("operatingMode").and_then(Value::as_str) {
        None | Some("Running") => false,
        Some("Suspended") => true,
        Some(other) => {
            return Err(KubeError::invalid(
                &name,
                "spec.operatingMode",
                &format!(
                    "Unsupported value: {other:?}: supported values: \"Running\", \"Suspended\""
                ),
            ));
        }
    };
    let container = spec_value["podTemplate"]["spec"]["containers"]
        .get(0)
        .cloned()
        .ok_or_else(|| {
            KubeError::invalid(&name, "spec.podTemplate.spec.containers", "Required value")
        })?;
    let labels = str_map(meta.get("labels"), "metadata.labels")?;
    let annotations = str_map(meta.get("annotations"), "metadata.annotations")?;
    let pod_annotations = str_map(
        spec_value["podTemplate"]["metadata"].get("annotations"),
        "spec.podTemplate.metadata.annotations",
    )?;
    let ttl_seconds = lease(&spec_value, &annotations, Utc::now())?;
    let template = annotations
        .get(keys::TEMPLATE)
        .cloned()
        .or_else(|| container["image"].as_str().map(str::to_string))
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            KubeError::invalid(
                &name,
                "spec.podTemplate.spec.containers[0].image",
                "Required value",
            )
        })?;
    let net = annotations
        .get(keys::NET)
        .or_else(|| pod_annotations.get(keys::NET))
        .cloned()
        .unwrap_or_default();
    let key = match size(&container)? {
        Some(size) => PoolKey::new(&template, &net, size),
        None => PoolKey::template_sized(&template, &net),
    }
    .map_err(|e| {
        KubeError::bad_request(format!(
            "{} (the first container's image names the sandbox template)",
            e.message
        ))
    })?;
    let causes = update::check_keys(&labels, &annotations);
    if !causes.is_empty() {
        return Err(KubeError::invalid_fields(&name, &causes));
    }
    // Kept with the claim so that reads echo them and later updates compare against them.
    let metadata = stored::encode(&labels, &annotations, Some(&spec_value));
    update::check_size(&name, &metadata)?;
    if let Some(o) = object.as_object_mut() {
        o.entry("apiVersion")
            .or_insert_with(|| Value::from(API_VERSION));
        o.entry("kind").or_insert_with(|| Value::from(KIND));
    }
    Ok(Checked {
        claim: ClaimRequest {
            lifecycle: Default::default(),
            network: Default::default(),
            volume_mounts: Vec::new(),
            namespace: namespace.to_string(),
            name: name.clone(),
            key,
            ttl_seconds,
            metadata,
            env_vars: env_vars(&container)?,
        },
        name,
        object,
        warnings,
        suspended,
    })
}

/// The create reply: the submitted object with what the claim made of it (name, uid,
/// resourceVersion, the system labels and annotations, the token, the status).
pub fn reply(mut object: Value, claimed: &Claimed, ns: &str, rv: u64) -> Value {
    let r = &claimed.record;
    let meta = object.as_object_mut().map(|o| {
        o.entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()))
    });
    if let Some(Value::Object(m)) = meta {
        m.insert("name".into(), Value::from(r.name()));
        m.insert("namespace".into(), Value::from(ns));
        m.insert("uid".into(), Value::from(objects::uid(&r.id)));
        m.insert("resourceVersion".into(), Value::from(rv.to_string()));
        m.insert("generation".into(), Value::from(1));
        m.insert(
            "creationTimestamp".into(),
            Value::from(objects::timestamp(r.claimed_at)),
        );
        let labels = m
            .entry("labels")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(l) = labels.as_object_mut() {
            for (k, v) in objects::labels(r) {
                l.insert(k, Value::from(v));
            }
        }
        let annotations = m
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        if !annotations.is_object() {
            *annotations = Value::Object(Default::default());
        }
        if let Some(a) = annotations.as_object_mut() {
            for (k, v) in objects::annotations(r) {
                a.insert(k, Value::from(v));
            }
            // Only the create reply carries the sandbox's credential.
            a.insert(keys::TOKEN.into(), Value::from(r.token.as_str()));
        }
    }
    let mut status = objects::status(r);
    if let Some(c) = status["conditions"].get_mut(0) {
        let how = if claimed.warm {
            "warm sandbox"
        } else {
            "sandbox"
        };
        c["message"] = Value::from(format!("{how} {:?} delivered by node {:?}", r.id, r.node));
    }
    if let Some(o) = object.as_object_mut() {
        o.insert("status".into(), status);
    }
    object
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Vec<u8> {
        serde_json::to_vec(&v).unwrap()
    }

    fn sandbox(extra_spec: Value, meta: Value) -> Value {
        let mut spec =
            json!({"podTemplate": {"spec": {"containers": [{"name": "main", "image": "base"}]}}});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra_spec.as_object()) {
            s.extend(e.clone());
        }
        json!({"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec})
    }

    #[test]
    fn lifetimes_names_and_pools() {
        let soon = (Utc::now() + chrono::TimeDelta::milliseconds(90_500)).to_rfc3339();
        let c = check(
            &body(sandbox(json!({"shutdownTime": soon}), json!({"name": "a"}))),
            "ns",
            None,
        )
        .unwrap();
        assert!(
            (90..=91).contains(&c.claim.ttl_seconds),
            "rounded up: {}",
            c.claim.ttl_seconds
        );
        // No resources asked for: the template's own size, which the dispatcher fills in.
        assert_eq!(c.claim.key, PoolKey::template_sized("base", "").unwrap());
        let past = (Utc::now() - chrono::TimeDelta::seconds(5)).to_rfc3339();
        let e = check(
            &body(sandbox(json!({"shutdownTime": past}), json!({"name": "a"}))),
            "ns",
            None,
        )
        .unwrap_err();
        assert!(e.message.contains("not in the future"), "{e}");
        let ttl = json!({"name": "a", "annotations": {keys::TTL_SECONDS: "120"}});
        assert_eq!(
            check(&body(sandbox(json!({}), ttl)), "ns", None)
                .unwrap()
                .claim
                .ttl_seconds,
            120
        );
        for bad in ["-5", "x", "1.5"] {
            let meta = json!({"name": "a", "annotations": {keys::TTL_SECONDS: bad}});
            assert_eq!(
                check(&body(sandbox(json!({}), meta)), "ns", None)
                    .unwrap_err()
                    .code,
                400,
                "{bad}"
            );
        }
        let g = check(
            &body(sandbox(json!({}), json!({"generateName": "job-"}))),
            "ns",
            None,
        )
        .unwrap();
        assert!(
            g.name.starts_with("job-") && g.name.len() == 9,
            "{}",
            g.name
        );
        assert_eq!(
            check(&body(sandbox(json!({}), json!({}))), "ns", None)
                .unwrap_err()
                .code,
            422
        );
        assert_eq!(
            check(
                &body(sandbox(json!({}), json!({"name": "Bad_Name"}))),
                "ns",
                None
            )
            .unwrap_err()
            .code,
            422
        );
        let other = json!({"name": "a", "namespace": "elsewhere"});
        assert_eq!(
            check(&body(sandbox(json!({}), other)), "ns", None)
                .unwrap_err()
                .code,
            400
        );
        let strict = sandbox(json!({"shutdownTimee": "x"}), json!({"name": "a"}));
        let e = check(&body(strict.clone()), "ns", Some("Strict")).unwrap_err();
        assert!(e.message.contains("spec.shutdownTimee"), "{e}");
        assert_eq!(
            check(&body(strict), "ns", Some("Warn"))
                .unwrap()
                .warnings
                .len(),
            1
        );
        assert!(check(b"{not json", "ns", None).is_err());
        assert!(check(b"", "ns", None).is_err());
        let wrong_kind =
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}, "spec": {}});
        assert_eq!(check(&body(wrong_kind), "ns", None).unwrap_err().code, 400);
    }

    #[test]
    fn sizes_and_env_come_from_the_first_container() {
        let spec = json!({"podTemplate": {"spec": {"containers": [{"name": "m", "image": "base",
            "resources": {"requests": {"cpu": "2", "memory": "1Gi"}},
            "env": [{"name": "A", "value": "1"}]}]}}});
        let c = check(
            &body(json!({"metadata": {"name": "a", "labels": {"team": "x"}}, "spec": spec})),
            "ns",
            None,
        )
        .unwrap();
        assert_eq!(c.claim.key.size, "medium");
        assert_eq!(c.claim.env_vars.get("A").map(String::as_str), Some("1"));
        assert_eq!(
            c.claim.metadata.get("k8s.label/team").map(String::as_str),
            Some("x")
        );
        assert_eq!(memory_bytes("512Mi"), Some(512 << 20));
        assert_eq!(cpu_millis("500m"), Some(500));
        assert_eq!(cpu_millis("4.5"), Some(4500));
        let secret = json!({"podTemplate": {"spec": {"containers": [{"name": "m", "image": "base",
            "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}}});
        assert_eq!(
            check(
                &body(json!({"metadata": {"name": "a"}, "spec": secret})),
                "ns",
                None
            )
            .unwrap_err()
            .code,
            400
        );
    }
}
