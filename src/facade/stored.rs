//! What the facade keeps of a Sandbox object, and where: the labels, annotations, submitted
//! spec and server-side-apply ownership that Kubernetes clients write live in the claim's
//! metadata on its node, under `k8s.` keys beside the e2b metadata. Nothing else is stored;
//! everything else a read shows comes from the node's record.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::types::keys;
use crate::model::SandboxRecord;

/// Claim-metadata keys under which a sandbox's Kubernetes labels are kept on its node.
pub const LABEL_PREFIX: &str = "k8s.label/";
/// The same for annotations (`kubectl apply` keeps its last-applied configuration there).
pub const ANNOTATION_PREFIX: &str = "k8s.annotation/";
/// Per field manager: the label and annotation keys its last server-side apply set, so that
/// the next apply can remove the ones it no longer names.
pub const MANAGED_PREFIX: &str = "k8s.managed/";
/// The spec as submitted (without `operatingMode`, which reads take from the live phase), so
/// that reads echo what the client wrote and `kubectl apply` of an unchanged file is a no-op.
pub const SPEC_KEY: &str = "k8s.spec";

/// Labels every read computes from the record. A stored label of the same name is hidden.
pub const SYSTEM_LABELS: [&str; 4] = [
    keys::CLAIM_LABEL,
    keys::NODE_LABEL,
    keys::PHASE_LABEL,
    keys::TEMPLATE_LABEL,
];

/// Annotations every read computes from the record (the token only in the create reply);
/// they are never stored.
pub const SYSTEM_ANNOTATIONS: [&str; 7] = [
    keys::ADDRESS,
    keys::CLAIM_ID,
    keys::DEADLINE,
    keys::METADATA,
    keys::PAUSE_MODE,
    keys::TEMPLATE,
    keys::TOKEN,
];

/// Whether a claim-metadata key belongs to the facade rather than to the claim's own (e2b)
/// metadata.
pub fn is_facade_key(k: &str) -> bool {
    k.starts_with(LABEL_PREFIX)
        || k.starts_with(ANNOTATION_PREFIX)
        || k.starts_with(MANAGED_PREFIX)
        || k == SPEC_KEY
}

/// Whether a key holds the facade's own bookkeeping (annotations, apply ownership, the
/// submitted spec), which other surfaces do not show; labels stay visible as metadata.
pub fn is_bookkeeping_key(k: &str) -> bool {
    is_facade_key(k) && !k.starts_with(LABEL_PREFIX)
}

fn prefixed(r: &SandboxRecord, prefix: &str, hidden: &[&str]) -> BTreeMap<String, String> {
    r.metadata
        .iter()
        .filter_map(|(k, v)| {
            let k = k.strip_prefix(prefix)?;
            (!hidden.contains(&k)).then(|| (k.to_string(), v.clone()))
        })
        .collect()
}

/// The labels a client set (the system ones excluded).
pub fn user_labels(r: &SandboxRecord) -> BTreeMap<String, String> {
    prefixed(r, LABEL_PREFIX, &SYSTEM_LABELS)
}

/// The annotations a client set (the system ones excluded).
pub fn user_annotations(r: &SandboxRecord) -> BTreeMap<String, String> {
    prefixed(r, ANNOTATION_PREFIX, &SYSTEM_ANNOTATIONS)
}

/// The submitted spec, if the sandbox was created through the facade (and it still parses).
pub fn stored_spec(r: &SandboxRecord) -> Option<Map<String, Value>> {
    let raw = r.metadata.get(SPEC_KEY)?;
    match serde_json::from_str::<Value>(raw) {
        Ok(Value::Object(m)) => Some(m),
        _ => None,
    }
}

/// The spec to store for a submitted one: without `operatingMode`, which is state, not
/// description (reads show the live phase).
pub fn spec_to_store(spec: &Value) -> Option<String> {
    let mut m = spec.as_object()?.clone();
    m.remove("operatingMode");
    serde_json::to_string(&m).ok()
}

/// Keys one field manager set through server-side apply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owned {
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub labels: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub annotations: BTreeSet<String>,
}

pub fn owned(r: &SandboxRecord, manager: &str) -> Owned {
    r.metadata
        .get(&format!("{MANAGED_PREFIX}{manager}"))
        .and_then(|raw| serde_json::from_str(raw).ok())
        .unwrap_or_default()
}

/// Every field manager that applied to `r`, with the keys it owns.
pub fn managers(r: &SandboxRecord) -> Vec<(String, Owned)> {
    r.metadata
        .iter()
        .filter_map(|(k, raw)| {
            let manager = k.strip_prefix(MANAGED_PREFIX)?;
            Some((manager.to_string(), serde_json::from_str(raw).ok()?))
        })
        .collect()
}

/// The claim-metadata entry recording `owned` for `manager`.
pub fn owned_entry(manager: &str, owned: &Owned) -> (String, String) {
    (
        format!("{MANAGED_PREFIX}{manager}"),
        serde_json::to_string(owned).unwrap_or_default(),
    )
}

/// The claim metadata for an object's labels, annotations and spec. System labels and
/// annotations are left out: reads compute them.
pub fn encode(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    spec: Option<&Value>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (k, v) in labels {
        if !SYSTEM_LABELS.contains(&k.as_str()) {
            out.insert(format!("{LABEL_PREFIX}{k}"), v.clone());
        }
    }
    for (k, v) in annotations {
        if !SYSTEM_ANNOTATIONS.contains(&k.as_str()) {
            out.insert(format!("{ANNOTATION_PREFIX}{k}"), v.clone());
        }
    }
    if let Some(s) = spec.and_then(spec_to_store) {
        out.insert(SPEC_KEY.to_string(), s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn system_keys_are_never_stored_and_facade_keys_are_recognised() {
        let labels = BTreeMap::from([
            ("app".to_string(), "web".to_string()),
            (keys::PHASE_LABEL.to_string(), "x".to_string()),
        ]);
        let annotations = BTreeMap::from([
            ("note".to_string(), "hi".to_string()),
            (keys::TOKEN.to_string(), "secret".to_string()),
        ]);
        let spec = json!({"podTemplate": {"spec": {}}, "operatingMode": "Suspended"});
        let m = encode(&labels, &annotations, Some(&spec));
        assert_eq!(
            m.keys().collect::<Vec<_>>(),
            ["k8s.annotation/note", "k8s.label/app", "k8s.spec"]
        );
        assert_eq!(m["k8s.spec"], r#"{"podTemplate":{"spec":{}}}"#);
        assert!(m.keys().all(|k| is_facade_key(k)));
        assert!(!is_facade_key("job"));
        assert!(is_facade_key("k8s.managed/kubectl"));
        assert!(is_bookkeeping_key("k8s.spec") && is_bookkeeping_key("k8s.annotation/a"));
        assert!(!is_bookkeeping_key("k8s.label/app") && !is_bookkeeping_key("team"));
        let owned = Owned {
            labels: BTreeSet::from(["app".to_string()]),
            annotations: BTreeSet::new(),
        };
        let (k, v) = owned_entry("kubectl", &owned);
        assert_eq!(
            (k.as_str(), v.as_str()),
            ("k8s.managed/kubectl", r#"{"labels":["app"]}"#)
        );
    }
}
