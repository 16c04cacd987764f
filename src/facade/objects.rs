//! Sandbox objects built from the dispatcher's records: what the node reports, plus the
//! labels, annotations and spec a client stored with the claim (see `stored`). Lists are
//! written object by object without intermediate values.

use std::borrow::Cow;
use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::Value;

use super::stored::{self, ANNOTATION_PREFIX, SYSTEM_ANNOTATIONS, SYSTEM_LABELS};
use super::types::{API_VERSION, KIND, keys, pause_mode_name};
use crate::dispatch::forms::{Form, Rendered, kept};
use crate::dispatch::read_view::Entry;
use crate::model::{Phase, SandboxRecord};

pub use super::stored::LABEL_PREFIX;
// Tables moved to `table`; the old paths keep working for callers outside the facade.
pub use super::table::{human_duration, table};

pub fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// A stable UID for a claim (the same on every replica, so no storage is needed): 128 bits
/// hashed from the claim id, in UUID form. Not a secret, just unique per claim.
pub fn uid(claim_id: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let fnv = |seed: u64| {
        claim_id.bytes().fold(seed, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    };
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&fnv(0xcbf2_9ce4_8422_2325).to_be_bytes());
    d[8..].copy_from_slice(&fnv(0x6c62_272e_07bb_0142).to_be_bytes());
    let mut out = String::with_capacity(36);
    for (i, b) in d.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 0xf) as usize] as char);
    }
    out
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
    out.insert(keys::PHASE_LABEL.into(), r.phase.title().into());
    out.insert(keys::CLAIM_LABEL.into(), name(r).into_owned());
    out.insert(keys::TEMPLATE_LABEL.into(), r.key.template.clone());
    out
}

/// The claim's own metadata (set through e2b), shown as one JSON annotation.
fn user_metadata(r: &SandboxRecord) -> Option<String> {
    let m: BTreeMap<&String, &String> = r
        .metadata
        .iter()
        .filter(|(k, _)| !stored::is_facade_key(k))
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
    if let Some(mode) = r.pause_mode() {
        out.insert(keys::PAUSE_MODE.into(), pause_mode_name(mode).into());
    }
    out
}

fn host_of(address: &str) -> &str {
    address.rsplit_once(':').map_or(address, |(h, _)| h)
}

/// (status, reason) of the Ready condition.
pub fn ready(r: &SandboxRecord) -> (&'static str, &'static str) {
    match r.phase {
        Phase::Running => ("True", "DependenciesReady"),
        Phase::Paused => ("False", "SandboxSuspended"),
    }
}

pub fn status(r: &SandboxRecord) -> Value {
    serde_json::to_value(status_json(r)).unwrap_or(Value::Null)
}

// ----- serialization without intermediate values: a list of 50,000 is written object by
// object straight into the output buffer. -----

/// `YYYY-MM-DDTHH:MM:SSZ`, written without allocating.
struct Ts(DateTime<Utc>);

impl Ts {
    fn bytes(&self) -> [u8; 20] {
        use chrono::{Datelike, Timelike};
        let t = self.0;
        let mut b = *b"0000-00-00T00:00:00Z";
        let put = |b: &mut [u8; 20], at: usize, width: usize, mut v: u32| {
            for i in (at..at + width).rev() {
                b[i] = b'0' + (v % 10) as u8;
                v /= 10;
            }
        };
        put(&mut b, 0, 4, t.year().clamp(0, 9999) as u32);
        put(&mut b, 5, 2, t.month());
        put(&mut b, 8, 2, t.day());
        put(&mut b, 11, 2, t.hour());
        put(&mut b, 14, 2, t.minute());
        put(&mut b, 17, 2, t.second());
        b
    }
}

impl Serialize for Ts {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let b = self.bytes();
        // Only ASCII digits and separators were written.
        s.serialize_str(std::str::from_utf8(&b).unwrap_or("1970-01-01T00:00:00Z"))
    }
}

/// A number written as a JSON string (resource versions).
pub(super) struct NumStr(pub(super) u64);

impl Serialize for NumStr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

struct LabelsJson<'a>(&'a SandboxRecord);

impl Serialize for LabelsJson<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let r = self.0;
        let mut m = s.serialize_map(None)?;
        for (k, v) in &r.metadata {
            if let Some(k) = k.strip_prefix(LABEL_PREFIX)
                && !SYSTEM_LABELS.contains(&k)
            {
                m.serialize_entry(k, v)?;
            }
        }
        m.serialize_entry(keys::CLAIM_LABEL, &name(r))?;
        m.serialize_entry(keys::NODE_LABEL, &r.node)?;
        m.serialize_entry(keys::PHASE_LABEL, r.phase.title())?;
        m.serialize_entry(keys::TEMPLATE_LABEL, &r.key.template)?;
        m.end()
    }
}

struct AnnotationsJson<'a>(&'a SandboxRecord);

impl Serialize for AnnotationsJson<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let r = self.0;
        let mut m = s.serialize_map(None)?;
        if !r.address.is_empty() {
            m.serialize_entry(keys::ADDRESS, &r.address)?;
        }
        m.serialize_entry(keys::CLAIM_ID, &r.id)?;
        m.serialize_entry(keys::DEADLINE, &Ts(r.deadline))?;
        if let Some(meta) = user_metadata(r) {
            m.serialize_entry(keys::METADATA, &meta)?;
        }
        if let Some(mode) = r.pause_mode() {
            m.serialize_entry(keys::PAUSE_MODE, pause_mode_name(mode))?;
        }
        m.serialize_entry(keys::TEMPLATE, &r.key.template)?;
        for (k, v) in &r.metadata {
            if let Some(k) = k.strip_prefix(ANNOTATION_PREFIX)
                && !SYSTEM_ANNOTATIONS.contains(&k)
            {
                m.serialize_entry(k, v)?;
            }
        }
        m.end()
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct MetaJson<'a> {
    name: Cow<'a, str>,
    namespace: &'a str,
    uid: String,
    resource_version: NumStr,
    generation: i64,
    creation_timestamp: Ts,
    labels: LabelsJson<'a>,
    annotations: AnnotationsJson<'a>,
}

pub(super) fn meta_json(r: &SandboxRecord, revision: u64) -> MetaJson<'_> {
    MetaJson {
        name: name(r),
        namespace: r.namespace(),
        uid: uid(&r.id),
        resource_version: NumStr(revision),
        generation: 1,
        creation_timestamp: Ts(r.claimed_at),
        labels: LabelsJson(r),
        annotations: AnnotationsJson(r),
    }
}

#[derive(Serialize)]
struct Quantities<'a> {
    cpu: &'a str,
    memory: &'a str,
}

#[derive(Serialize)]
struct Resources<'a> {
    requests: &'a Quantities<'a>,
    limits: &'a Quantities<'a>,
}

#[derive(Serialize)]
struct Container<'a> {
    name: &'static str,
    image: &'a str,
    resources: Resources<'a>,
}

#[derive(Serialize)]
struct PodSpecJson<'a> {
    containers: [Container<'a>; 1],
}

#[derive(Serialize)]
struct NetAnnotation<'a> {
    #[serde(rename = "sandbox.cocoonstack.io/net")]
    net: &'a str,
}

#[derive(Serialize)]
struct PodMetaJson<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    annotations: Option<NetAnnotation<'a>>,
}

#[derive(Serialize)]
struct PodTemplateJson<'a> {
    metadata: PodMetaJson<'a>,
    spec: PodSpecJson<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SpecJson<'a> {
    pod_template: PodTemplateJson<'a>,
    operating_mode: &'static str,
    shutdown_time: Ts,
}

/// CPU and memory quantities of each size tier, as Kubernetes writes them.
fn quantities(size: &str) -> Quantities<'static> {
    match size {
        "medium" => Quantities {
            cpu: "2",
            memory: "1024Mi",
        },
        "large" => Quantities {
            cpu: "4",
            memory: "4096Mi",
        },
        "xlarge" => Quantities {
            cpu: "4",
            memory: "8192Mi",
        },
        "2xlarge" => Quantities {
            cpu: "8",
            memory: "16384Mi",
        },
        _ => Quantities {
            cpu: "1",
            memory: "512Mi",
        },
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ConditionJson {
    #[serde(rename = "type")]
    ty: &'static str,
    status: &'static str,
    reason: &'static str,
    message: &'static str,
    last_transition_time: Ts,
    observed_generation: i64,
}

/// Zero or one address, as a JSON array.
struct PodIps<'a>(&'a str);

impl Serialize for PodIps<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(usize::from(!self.0.is_empty())))?;
        if !self.0.is_empty() {
            seq.serialize_element(self.0)?;
        }
        seq.end()
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusJson<'a> {
    node_name: &'a str,
    #[serde(rename = "podIPs")]
    pod_ips: PodIps<'a>,
    conditions: [ConditionJson; 1],
}

fn status_json(r: &SandboxRecord) -> StatusJson<'_> {
    let paused = r.phase == Phase::Paused;
    let (ready_status, reason) = ready(r);
    StatusJson {
        node_name: &r.node,
        pod_ips: PodIps(if r.address.is_empty() {
            ""
        } else {
            host_of(&r.address)
        }),
        conditions: [ConditionJson {
            ty: "Ready",
            status: ready_status,
            reason,
            message: match r.pause_mode() {
                _ if !paused => "running",
                Some(crate::model::PauseMode::Filesystem) => {
                    "paused: its files are kept; a resume starts its processes afresh"
                }
                _ => "paused",
            },
            last_transition_time: Ts(r.claimed_at),
            observed_generation: 1,
        }],
    }
}

/// A Sandbox object as reads show it.
pub struct SandboxJson<'a> {
    r: &'a SandboxRecord,
    revision: u64,
}

impl Serialize for SandboxJson<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let r = self.r;
        let q = quantities(&r.key.size);
        let mut o = s.serialize_struct("Sandbox", 5)?;
        o.serialize_field("apiVersion", API_VERSION)?;
        o.serialize_field("kind", KIND)?;
        o.serialize_field("metadata", &meta_json(r, self.revision))?;
        if let Some(spec) = stored::stored_spec(r) {
            o.serialize_field("spec", &echoed_spec(r, spec))?;
            o.serialize_field("status", &status_json(r))?;
            return o.end();
        }
        o.serialize_field(
            "spec",
            &SpecJson {
                pod_template: PodTemplateJson {
                    metadata: PodMetaJson {
                        annotations: (r.key.net != "none")
                            .then_some(NetAnnotation { net: &r.key.net }),
                    },
                    spec: PodSpecJson {
                        containers: [Container {
                            name: "sandbox",
                            image: &r.key.template,
                            resources: Resources {
                                requests: &q,
                                limits: &q,
                            },
                        }],
                    },
                },
                operating_mode: operating_mode(r),
                shutdown_time: Ts(r.deadline),
            },
        )?;
        o.serialize_field("status", &status_json(r))?;
        o.end()
    }
}

fn operating_mode(r: &SandboxRecord) -> &'static str {
    if r.phase == Phase::Paused {
        "Suspended"
    } else {
        "Running"
    }
}

/// `spec.shutdownTime` as reads show it: the time last asked for through Kubernetes, as it
/// was written (so an unchanged manifest stays unchanged, and the spec says what the client
/// wants while the `deadline` annotation says what the node granted); without one, the
/// deadline in force.
pub fn shown_shutdown_time(r: &SandboxRecord, requested: Option<&Value>) -> Value {
    match requested {
        Some(Value::String(raw)) => Value::from(raw.as_str()),
        _ => Value::from(timestamp(r.deadline)),
    }
}

/// The stored spec with the live operating mode (and the deadline when it asked for no time).
fn echoed_spec(r: &SandboxRecord, mut spec: serde_json::Map<String, Value>) -> Value {
    let shutdown = shown_shutdown_time(r, spec.get("shutdownTime"));
    spec.insert("shutdownTime".into(), shutdown);
    spec.insert("operatingMode".into(), Value::from(operating_mode(r)));
    Value::Object(spec)
}

pub fn sandbox(r: &SandboxRecord, revision: u64) -> SandboxJson<'_> {
    SandboxJson { r, revision }
}

/// An entry's object as `sandbox` serializes it, rendered once per entry and kept with it
/// (a changed record is a new entry).
pub fn object_form(e: &Entry) -> &Rendered {
    e.forms.get_or_render(Form::KubeObject, || Rendered {
        bytes: kept(serde_json::to_vec(&sandbox(&e.record, e.revision)).unwrap_or_default()),
        mark: 0..0,
    })
}

/// The start of a `SandboxList`, up to the opening of its items.
pub(super) fn list_head(out: &mut Vec<u8>, meta: &ListMeta) {
    out.extend_from_slice(b"{\"apiVersion\":");
    let _ = serde_json::to_writer(&mut *out, API_VERSION);
    out.extend_from_slice(b",\"kind\":");
    let _ = serde_json::to_writer(&mut *out, super::types::LIST_KIND);
    out.extend_from_slice(b",\"metadata\":");
    let _ = serde_json::to_writer(&mut *out, meta);
    out.extend_from_slice(b",\"items\":[");
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ListMeta {
    pub(super) resource_version: NumStr,
    #[serde(rename = "continue", skip_serializing_if = "Option::is_none")]
    pub(super) continue_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) remaining_item_count: Option<i64>,
}

/// Entries serialized one by one as a JSON array.
pub(super) struct Items<'a, T, F: Fn(&'a Entry) -> T> {
    pub(super) entries: &'a [Entry],
    pub(super) each: F,
}

impl<'a, T: Serialize, F: Fn(&'a Entry) -> T> Serialize for Items<'a, T, F> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.entries.len()))?;
        for e in self.entries {
            seq.serialize_element(&(self.each)(e))?;
        }
        seq.end()
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ListOut<I> {
    api_version: &'static str,
    kind: &'static str,
    metadata: ListMeta,
    items: I,
}

/// An output buffer for `n` items the size of `first`, with a little room to spare, so that a
/// large list is written without the buffer doubling.
pub(super) fn sized_buffer<T: Serialize>(first: Option<T>, n: usize) -> Vec<u8> {
    let each = first
        .and_then(|f| serde_json::to_vec(&f).ok())
        .map_or(0, |b| b.len());
    Vec::with_capacity(n * (each + each / 8) + 1024)
}

/// A `SandboxList` of `entries` as of `revision`, serialized whole into one buffer. Lists are
/// served by `list_body`, streamed from cached forms; this is the plain serialization they
/// are checked against.
pub fn list(
    entries: &[Entry],
    revision: u64,
    continue_token: Option<String>,
    remaining: Option<i64>,
) -> Vec<u8> {
    let l = ListOut {
        api_version: API_VERSION,
        kind: super::types::LIST_KIND,
        metadata: ListMeta {
            resource_version: NumStr(revision),
            continue_token,
            remaining_item_count: remaining,
        },
        items: Items {
            entries,
            each: |e: &Entry| sandbox(&e.record, e.revision),
        },
    };
    let mut out = sized_buffer(
        entries.first().map(|e| sandbox(&e.record, e.revision)),
        entries.len(),
    );
    let _ = serde_json::to_writer(&mut out, &l);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_are_stable_per_claim() {
        let u = uid("sb_0123456789abcdef");
        assert_eq!(u.len(), 36);
        assert_eq!(u, uid("sb_0123456789abcdef"));
    }
}
