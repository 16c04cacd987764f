//! Sandbox objects synthesized from the dispatcher's records (nothing is stored per
//! sandbox), and their Table rows for `kubectl get`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::types::{API_VERSION, KIND, keys};
use crate::model::{Phase, SandboxRecord, pool::size_tier};

/// Claim-metadata keys under which a sandbox's Kubernetes labels are kept on its node.
pub const LABEL_PREFIX: &str = "k8s.label/";

pub fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// A stable UID for a claim (the same on every replica).
pub fn uid(claim_id: &str) -> String {
    let d = Sha256::digest(claim_id.as_bytes());
    let h: String = d[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The object name of a sandbox: the name it was claimed under, or, for a claim that named
/// itself by its id (a fork child), the DNS-safe spelling of that id.
pub fn name(r: &SandboxRecord) -> Cow<'_, str> {
    let n = r.name();
    if n == r.id {
        Cow::Owned(crate::model::ids::dns_safe(n))
    } else {
        Cow::Borrowed(n)
    }
}

/// The labels an object shows: the user's, and the ones describing where it runs.
pub fn labels(r: &SandboxRecord) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = r
        .metadata
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix(LABEL_PREFIX)
                .map(|k| (k.to_string(), v.clone()))
        })
        .collect();
    out.insert(keys::NODE_LABEL.into(), r.node.clone());
    out.insert(keys::PHASE_LABEL.into(), phase_name(r.phase).into());
    out.insert(keys::CLAIM_LABEL.into(), name(r).into_owned());
    out.insert(keys::TEMPLATE_LABEL.into(), r.key.template.clone());
    out
}

/// The claim's own metadata (set through e2b), shown as one JSON annotation.
fn user_metadata(r: &SandboxRecord) -> Option<String> {
    let m: BTreeMap<&String, &String> = r
        .metadata
        .iter()
        .filter(|(k, _)| !k.starts_with(LABEL_PREFIX))
        .collect();
    (!m.is_empty()).then(|| serde_json::to_string(&m).unwrap_or_default())
}

pub fn annotations(r: &SandboxRecord) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    out.insert(keys::CLAIM_ID.into(), r.id.clone());
    out.insert(keys::DEADLINE.into(), timestamp(r.deadline));
    out.insert(keys::TEMPLATE.into(), r.key.template.clone());
    if !r.address.is_empty() {
        out.insert(keys::ADDRESS.into(), r.address.clone());
    }
    if let Some(m) = user_metadata(r) {
        out.insert(keys::METADATA.into(), m);
    }
    out
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Running => "Running",
        Phase::Paused => "Paused",
    }
}

fn host_of(address: &str) -> &str {
    address.rsplit_once(':').map_or(address, |(h, _)| h)
}

/// (status, reason, message) of the Ready condition.
pub fn ready(r: &SandboxRecord) -> (&'static str, &'static str, String) {
    match r.phase {
        Phase::Running => (
            "True",
            "DependenciesReady",
            format!("sandbox {:?} is running on node {:?}", r.id, r.node),
        ),
        Phase::Paused => (
            "False",
            "SandboxSuspended",
            format!("sandbox {:?} is paused on node {:?}", r.id, r.node),
        ),
    }
}

pub fn status(r: &SandboxRecord) -> Value {
    let (ready_status, reason, message) = ready(r);
    let since = timestamp(r.claimed_at);
    let suspended = if r.phase == Phase::Paused {
        "True"
    } else {
        "False"
    };
    json!({
        "nodeName": r.node,
        "podIPs": if r.address.is_empty() { vec![] } else { vec![host_of(&r.address)] },
        "conditions": [
            {"type": "Ready", "status": ready_status, "reason": reason, "message": message,
             "lastTransitionTime": since, "observedGeneration": 1},
            {"type": "Suspended", "status": suspended,
             "reason": if r.phase == Phase::Paused { "Paused" } else { "Running" },
             "message": if r.phase == Phase::Paused { "the sandbox is frozen" } else { "the sandbox is running" },
             "lastTransitionTime": since, "observedGeneration": 1}
        ]
    })
}

/// The spec a read shows: what the sandbox actually is (its template and size), since the
/// submitted spec is not stored.
fn spec(r: &SandboxRecord) -> Value {
    let tier = size_tier(&r.key.size);
    let (cpu, mem) = tier.map_or((1, 512), |t| (t.cpu_count, t.memory_bytes >> 20));
    let quantities = json!({"cpu": cpu.to_string(), "memory": format!("{mem}Mi")});
    let mut spec = json!({
        "podTemplate": {
            "metadata": {},
            "spec": {"containers": [{"name": "sandbox", "image": r.key.template,
                "resources": {"requests": quantities, "limits": quantities}}]}
        },
        "operatingMode": if r.phase == Phase::Paused { "Suspended" } else { "Running" },
        "shutdownTime": timestamp(r.deadline),
    });
    if r.key.net != "none"
        && let Some(o) = spec["podTemplate"]["metadata"].as_object_mut()
    {
        o.insert("annotations".into(), json!({keys::NET: r.key.net}));
    }
    spec
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMetaOut<'a> {
    pub name: Cow<'a, str>,
    pub namespace: &'a str,
    pub uid: String,
    pub resource_version: String,
    pub generation: i64,
    pub creation_timestamp: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxOut<'a> {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub metadata: ObjectMetaOut<'a>,
    pub spec: Value,
    pub status: Value,
}

pub fn meta(r: &SandboxRecord, revision: u64) -> ObjectMetaOut<'_> {
    ObjectMetaOut {
        name: name(r),
        namespace: r.namespace(),
        uid: uid(&r.id),
        resource_version: revision.to_string(),
        generation: 1,
        creation_timestamp: timestamp(r.claimed_at),
        labels: labels(r),
        annotations: annotations(r),
    }
}

pub fn sandbox(r: &SandboxRecord, revision: u64) -> SandboxOut<'_> {
    SandboxOut {
        api_version: API_VERSION,
        kind: KIND,
        metadata: meta(r, revision),
        spec: spec(r),
        status: status(r),
    }
}

/// Go's `duration.HumanDuration`, as the API server renders ages in tables.
pub fn human_duration(d: chrono::TimeDelta) -> String {
    let seconds = d.num_seconds();
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Column {
    name: &'static str,
    #[serde(rename = "type")]
    ty: &'static str,
    format: &'static str,
    description: &'static str,
    priority: i32,
}

const COLUMNS: [Column; 6] = [
    Column {
        name: "Name",
        ty: "string",
        format: "name",
        description: "Name must be unique within a namespace.",
        priority: 0,
    },
    Column {
        name: "Ready",
        ty: "string",
        format: "",
        description: "Ready condition status",
        priority: 0,
    },
    Column {
        name: "Reason",
        ty: "string",
        format: "",
        description: "Ready condition reason",
        priority: 0,
    },
    Column {
        name: "Age",
        ty: "string",
        format: "",
        description: "Time since the sandbox was claimed",
        priority: 0,
    },
    Column {
        name: "Node",
        ty: "string",
        format: "",
        description: "The node that runs the sandbox",
        priority: 1,
    },
    Column {
        name: "Template",
        ty: "string",
        format: "",
        description: "The template the sandbox started from",
        priority: 1,
    },
];

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PartialObjectMetadata<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: ObjectMetaOut<'a>,
}

#[derive(Serialize)]
struct Row<'a> {
    cells: [Cow<'a, str>; 6],
    object: PartialObjectMetadata<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TableMeta {
    resource_version: String,
    #[serde(rename = "continue", skip_serializing_if = "Option::is_none")]
    continue_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining_item_count: Option<i64>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Table<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: TableMeta,
    column_definitions: &'static [Column; 6],
    rows: Vec<Row<'a>>,
}

fn row(r: &SandboxRecord, revision: u64, now: DateTime<Utc>) -> Row<'_> {
    let (ready, reason, _) = ready(r);
    Row {
        cells: [
            name(r),
            Cow::Borrowed(ready),
            Cow::Borrowed(reason),
            Cow::Owned(human_duration(now - r.claimed_at)),
            Cow::Borrowed(&r.node),
            Cow::Borrowed(&r.key.template),
        ],
        object: PartialObjectMetadata {
            api_version: "meta.k8s.io/v1",
            kind: "PartialObjectMetadata",
            metadata: meta(r, revision),
        },
    }
}

/// A `meta.k8s.io/v1` Table of `items` (record, revision) as of `revision`.
pub fn table<'a>(
    items: impl Iterator<Item = (&'a SandboxRecord, u64)>,
    revision: u64,
    continue_token: Option<String>,
    remaining: Option<i64>,
) -> Vec<u8> {
    let now = Utc::now();
    let t = Table {
        api_version: "meta.k8s.io/v1",
        kind: "Table",
        metadata: TableMeta {
            resource_version: revision.to_string(),
            continue_token,
            remaining_item_count: remaining,
        },
        column_definitions: &COLUMNS,
        rows: items.map(|(r, rv)| row(r, rv, now)).collect(),
    };
    serde_json::to_vec(&t).unwrap_or_default()
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ListMetaOut {
    resource_version: String,
    #[serde(rename = "continue", skip_serializing_if = "Option::is_none")]
    continue_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining_item_count: Option<i64>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ListOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: ListMetaOut,
    items: Vec<SandboxOut<'a>>,
}

/// A `SandboxList`.
pub fn list<'a>(
    items: impl Iterator<Item = (&'a SandboxRecord, u64)>,
    revision: u64,
    continue_token: Option<String>,
    remaining: Option<i64>,
) -> Vec<u8> {
    let l = ListOut {
        api_version: API_VERSION,
        kind: super::types::LIST_KIND,
        metadata: ListMetaOut {
            resource_version: revision.to_string(),
            continue_token,
            remaining_item_count: remaining,
        },
        items: items.map(|(r, rv)| sandbox(r, rv)).collect(),
    };
    serde_json::to_vec(&l).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;

    #[test]
    fn ages_read_like_kubectls() {
        for (secs, want) in [
            (-5, "<invalid>"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (125, "2m5s"),
            (600, "10m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60 * 7, "3h7m"),
            (30 * 3600, "30h"),
            (3 * 86400 + 3600 * 2, "3d2h"),
            (40 * 86400, "40d"),
            (3 * 365 * 86400 + 86400, "3y1d"),
            (9 * 365 * 86400, "9y"),
        ] {
            assert_eq!(human_duration(TimeDelta::seconds(secs)), want, "{secs}");
        }
        let u = uid("sb_0123456789abcdef");
        assert_eq!(u.len(), 36);
        assert_eq!(u, uid("sb_0123456789abcdef"));
    }
}
