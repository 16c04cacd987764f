//! An update of a Sandbox (a PATCH once the patch is applied, or a PUT): what changed against
//! the object as read, checked, and turned into node actions. Labels and annotations are
//! stored with the claim; `spec.shutdownTime` (or the ttl annotation) renews the lease;
//! `spec.operatingMode` pauses or resumes; the rest of the spec describes what the sandbox
//! was claimed as and cannot change. An update that changes nothing plans nothing, so it
//! spends no revision and no watcher sees an event.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use super::create::str_map;
use super::objects;
use super::status::{Cause, KubeError, KubeResult};
use super::stored::{
    self, ANNOTATION_PREFIX, LABEL_PREFIX, Owned, SPEC_KEY, SYSTEM_ANNOTATIONS, SYSTEM_LABELS,
};
use super::types::{API_VERSION, KIND, keys};
use super::validation::{check_identity, invalid, shown, split_system};
pub use super::validation::{check_keys, check_size};
use crate::model::{Phase, SandboxRecord};

/// Spec fields that describe state a client may change; every other spec field is immutable.
const MUTABLE_SPEC: [&str; 2] = ["shutdownTime", "operatingMode"];

/// A lease renewal: `ttl_seconds` from now, shorter allowed (the client said when).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewal {
    pub ttl_seconds: u64,
    /// The time asked for through `spec.shutdownTime`, to tell the client when the node
    /// clamped it.
    pub until: Option<DateTime<Utc>>,
}

/// What an update does, in the order it is done: the lease, the operating mode, then the
/// stored labels, annotations and spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub renew: Option<Renewal>,
    /// `Some(true)` pauses, `Some(false)` resumes.
    pub pause: Option<bool>,
    /// Claim-metadata keys to set and to remove.
    pub set: BTreeMap<String, String>,
    pub remove: Vec<String>,
}

impl Plan {
    pub fn is_noop(&self) -> bool {
        self.renew.is_none()
            && self.pause.is_none()
            && self.set.is_empty()
            && self.remove.is_empty()
    }
}

/// The node's lease from an RFC 3339 time: whole seconds from `now`, rounded up.
fn lease_until(raw: &str, now: DateTime<Utc>) -> Result<(u64, DateTime<Utc>), &'static str> {
    let at = DateTime::parse_from_rfc3339(raw)
        .map_err(|_| "must be an RFC 3339 time")?
        .with_timezone(&Utc);
    let millis = (at - now).num_milliseconds();
    if millis <= 0 {
        return Err("must be in the future");
    }
    Ok(((millis as u64).div_ceil(1000), at))
}

/// What `patched` changes against `current` (the object as read from `r`), checked. `owners`
/// are field managers of a server-side apply and the keys each owns now (the applier, and
/// those a forced apply took keys from).
pub fn plan(
    r: &SandboxRecord,
    current: &Value,
    patched: &Value,
    owners: &[(&str, &Owned)],
    now: DateTime<Utc>,
) -> KubeResult<Plan> {
    let name = objects::name(r).into_owned();
    let obj = patched
        .as_object()
        .ok_or_else(|| KubeError::bad_request("the updated object must be a JSON object"))?;
    for (field, want) in [("apiVersion", API_VERSION), ("kind", KIND)] {
        match obj.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::String(v)) if v == want => {}
            Some(v) => {
                return Err(KubeError::bad_request(format!(
                    "{field} must be {want:?}, not {v}"
                )));
            }
        }
    }
    let empty = Map::new();
    let meta = match obj.get("metadata") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(m)) => m,
        Some(_) => return Err(KubeError::bad_request("metadata must be an object")),
    };
    check_identity(r, current, meta)?;
    let mut causes = Vec::new();
    for field in ["finalizers", "ownerReferences"] {
        if meta
            .get(field)
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
        {
            causes.push(Cause::new(
                format!("metadata.{field}"),
                "FieldValueForbidden",
                "Forbidden: not supported: a sandbox ends when it is deleted or its lease runs out",
            ));
        }
    }
    let labels = split_system(
        str_map(meta.get("labels"), "metadata.labels")?,
        &SYSTEM_LABELS,
        &objects::labels(r),
        "metadata.labels",
        &mut causes,
    );
    let annotations = split_system(
        str_map(meta.get("annotations"), "metadata.annotations")?,
        &SYSTEM_ANNOTATIONS,
        &objects::annotations(r),
        "metadata.annotations",
        &mut causes,
    );
    causes.extend(check_keys(&labels, &annotations));
    if let Some(net) = annotations.get(keys::NET) {
        let effective = if net.is_empty() { "none" } else { net.as_str() };
        if effective != r.key.net {
            causes.push(invalid(
                format!("metadata.annotations[{}]", keys::NET),
                &Value::from(net.as_str()),
                "field is immutable",
            ));
        }
    }

    let mut plan = Plan::default();
    let mut new_shutdown = None;
    let spec_now = current["spec"].as_object().unwrap_or(&empty);
    match obj.get("spec") {
        None | Some(Value::Null) => {
            causes.push(Cause::new("spec", "FieldValueRequired", "Required value"))
        }
        Some(Value::Object(spec)) => {
            let fields: BTreeSet<&String> = spec.keys().chain(spec_now.keys()).collect();
            for f in fields {
                if MUTABLE_SPEC.contains(&f.as_str()) {
                    continue;
                }
                let new = spec.get(f).unwrap_or(&Value::Null);
                if spec_now.get(f).unwrap_or(&Value::Null) != new {
                    causes.push(invalid(format!("spec.{f}"), new, "field is immutable"));
                }
            }
            match spec.get("operatingMode") {
                None | Some(Value::Null) => {}
                Some(Value::String(m)) if m == "Suspended" => {
                    plan.pause = (r.phase != Phase::Paused).then_some(true);
                }
                Some(Value::String(m)) if m == "Running" => {
                    plan.pause = (r.phase == Phase::Paused).then_some(false);
                }
                Some(other) => causes.push(Cause::new(
                    "spec.operatingMode",
                    "FieldValueNotSupported",
                    format!(
                        "Unsupported value: {}: supported values: \"Running\", \"Suspended\"",
                        shown(other)
                    ),
                )),
            }
            match spec.get("shutdownTime") {
                None | Some(Value::Null) => {}
                Some(t) if Some(t) == spec_now.get("shutdownTime") => {}
                Some(Value::String(raw)) => match lease_until(raw, now) {
                    Ok((ttl_seconds, at)) => {
                        plan.renew = Some(Renewal {
                            ttl_seconds,
                            until: Some(at),
                        });
                        new_shutdown = Some(raw.clone());
                    }
                    Err(why) => causes.push(invalid(
                        "spec.shutdownTime",
                        &Value::from(raw.as_str()),
                        why,
                    )),
                },
                Some(other) => causes.push(invalid(
                    "spec.shutdownTime",
                    other,
                    "must be an RFC 3339 time",
                )),
            }
        }
        Some(other) => causes.push(invalid("spec", other, "must be an object")),
    }
    let ttl_before = stored::user_annotations(r).remove(keys::TTL_SECONDS);
    if let Some(ttl) = annotations.get(keys::TTL_SECONDS)
        && ttl_before.as_ref() != Some(ttl)
    {
        match ttl.trim().parse::<u64>() {
            // spec.shutdownTime, when it changed too, is the more precise ask.
            Ok(ttl_seconds) => {
                plan.renew.get_or_insert(Renewal {
                    ttl_seconds,
                    until: None,
                });
            }
            Err(_) => causes.push(invalid(
                format!("metadata.annotations[{}]", keys::TTL_SECONDS),
                &Value::from(ttl.as_str()),
                "must be a non-negative integer of seconds",
            )),
        }
    }
    if !causes.is_empty() {
        return Err(KubeError::invalid_fields(&name, &causes));
    }

    // The facade's keys as they should be: labels and annotations replaced, the stored spec
    // keeping the requested shutdown time, ownership updated; e2b's own keys untouched.
    let mut desired: BTreeMap<String, String> = r
        .metadata
        .iter()
        .filter(|(k, _)| {
            stored::is_facade_key(k)
                && !k.starts_with(LABEL_PREFIX)
                && !k.starts_with(ANNOTATION_PREFIX)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    desired.extend(stored::encode(&labels, &annotations, None));
    if let (Some(raw), Some(mut spec)) = (new_shutdown, stored::stored_spec(r)) {
        spec.insert("shutdownTime".into(), Value::from(raw));
        if let Ok(s) = serde_json::to_string(&spec) {
            desired.insert(SPEC_KEY.into(), s);
        }
    }
    for &(manager, owned) in owners {
        let (k, v) = stored::owned_entry(manager, owned);
        if *owned == Owned::default() {
            desired.remove(&k);
        } else {
            desired.insert(k, v);
        }
    }
    for (k, v) in &desired {
        if r.metadata.get(k) != Some(v) {
            plan.set.insert(k.clone(), v.clone());
        }
    }
    plan.remove = r
        .metadata
        .keys()
        .filter(|k| stored::is_facade_key(k) && !desired.contains_key(*k))
        .cloned()
        .collect();
    let mut next = r.metadata.clone();
    next.retain(|k, _| !plan.remove.contains(k));
    next.extend(plan.set.clone());
    check_size(&name, &next)?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model;
    use chrono::TimeDelta;
    use serde_json::json;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2030-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    /// A sandbox created through the facade as `team-a/demo` with a label, an annotation and
    /// a spec asking for 10:00 minutes.
    fn record() -> SandboxRecord {
        let spec = json!({"podTemplate": {"spec": {"containers": [{"name": "main", "image": "base"}]}},
                          "shutdownTime": "2030-01-01T00:10:00Z"});
        let metadata = stored::encode(
            &BTreeMap::from([("app".into(), "web".into())]),
            &BTreeMap::from([("note".into(), "x".into())]),
            Some(&spec),
        );
        SandboxRecord {
            claimed_at: now(),
            deadline: now() + TimeDelta::milliseconds(600_300),
            address: "127.0.0.1:1".into(),
            metadata,
            ..SandboxRecord::fixture("sb_0123456789abcdef", "team-a/demo")
        }
    }

    fn current(r: &SandboxRecord) -> Value {
        serde_json::to_value(objects::sandbox(r, 7)).unwrap()
    }

    fn merged(r: &SandboxRecord, patch: Value) -> Value {
        let mut v = current(r);
        json_patch::merge(&mut v, &patch);
        v
    }

    fn plan_of(r: &SandboxRecord, patch: Value) -> KubeResult<Plan> {
        plan(r, &current(r), &merged(r, patch), &[], now())
    }

    #[test]
    fn reads_echo_the_stored_spec_and_an_unchanged_object_plans_nothing() {
        let r = record();
        let c = current(&r);
        assert_eq!(
            c["spec"]["podTemplate"]["spec"]["containers"][0]["name"],
            "main"
        );
        assert_eq!(
            c["spec"]["shutdownTime"], "2030-01-01T00:10:00Z",
            "the requested time, as written"
        );
        // The node clamped or moved the lease: the spec still says what was asked, the
        // deadline annotation what was granted.
        let mut moved = record();
        moved.deadline = now() + TimeDelta::minutes(3);
        let m = current(&moved);
        assert_eq!(m["spec"]["shutdownTime"], "2030-01-01T00:10:00Z");
        assert_eq!(
            m["metadata"]["annotations"]["sandbox.cocoonstack.io/deadline"],
            "2030-01-01T00:03:00Z"
        );
        assert!(plan(&moved, &m, &m, &[], now()).unwrap().is_noop());
        assert_eq!(c["spec"]["operatingMode"], "Running");
        assert_eq!(c["metadata"]["annotations"]["note"], "x");
        assert!(plan_of(&r, json!({})).unwrap().is_noop());
        // Restating what reads show, system labels and annotations included, is no change.
        assert!(plan(&r, &c, &c, &[], now()).unwrap().is_noop());
        // Removing a system label or annotation is ignored: reads show them again.
        let p = plan_of(
            &r,
            json!({"metadata": {"labels": {"sandbox.cocoonstack.io/phase": null},
                                "annotations": {"sandbox.cocoonstack.io/claim-id": null}}}),
        )
        .unwrap();
        assert!(p.is_noop(), "{p:?}");
    }

    #[test]
    fn labels_and_annotations_become_metadata_changes() {
        let r = record();
        let p = plan_of(
            &r,
            json!({"metadata": {"labels": {"app": null, "env": "prod"},
                                "annotations": {"note": "y"}}}),
        )
        .unwrap();
        assert_eq!(
            p.set,
            BTreeMap::from([
                ("k8s.annotation/note".to_string(), "y".to_string()),
                ("k8s.label/env".to_string(), "prod".to_string()),
            ])
        );
        assert_eq!(p.remove, ["k8s.label/app"]);
        assert!(p.renew.is_none() && p.pause.is_none());
        // e2b's own metadata is never touched.
        let mut e2b = record();
        e2b.metadata.insert("job".into(), "1".into());
        let p = plan_of(&e2b, json!({"metadata": {"labels": {"app": "db"}}})).unwrap();
        assert!(!p.set.contains_key("job") && !p.remove.contains(&"job".to_string()));
    }

    #[test]
    fn operating_mode_pauses_and_resumes_only_when_it_differs() {
        let r = record();
        assert_eq!(
            plan_of(&r, json!({"spec": {"operatingMode": "Suspended"}}))
                .unwrap()
                .pause,
            Some(true)
        );
        assert!(
            plan_of(&r, json!({"spec": {"operatingMode": "Running"}}))
                .unwrap()
                .is_noop()
        );
        let mut paused = record();
        paused.phase = Phase::Paused;
        assert_eq!(
            plan_of(&paused, json!({"spec": {"operatingMode": "Running"}}))
                .unwrap()
                .pause,
            Some(false)
        );
        let e = plan_of(&r, json!({"spec": {"operatingMode": "Asleep"}})).unwrap_err();
        let s = serde_json::to_value(e.status()).unwrap();
        assert_eq!(s["details"]["causes"][0]["field"], "spec.operatingMode");
        assert_eq!(
            s["details"]["causes"][0]["reason"],
            "FieldValueNotSupported"
        );
    }

    #[test]
    fn shutdown_time_and_the_ttl_annotation_renew_the_lease() {
        let r = record();
        let p = plan_of(
            &r,
            json!({"spec": {"shutdownTime": "2030-01-01T01:00:00.5Z"}}),
        )
        .unwrap();
        let renew = p.renew.clone().unwrap();
        assert_eq!(renew.ttl_seconds, 3601, "rounded up");
        assert!(renew.until.is_some());
        let spec: Value = serde_json::from_str(&p.set["k8s.spec"]).unwrap();
        assert_eq!(
            spec["shutdownTime"], "2030-01-01T01:00:00.5Z",
            "kept as written"
        );
        assert_eq!(p.set.len(), 1);
        let ttl = plan_of(
            &r,
            json!({"metadata": {"annotations": {"sandbox.cocoonstack.io/ttl-seconds": "600"}}}),
        )
        .unwrap();
        assert_eq!(
            ttl.renew,
            Some(Renewal {
                ttl_seconds: 600,
                until: None
            })
        );
        assert_eq!(
            ttl.set["k8s.annotation/sandbox.cocoonstack.io/ttl-seconds"],
            "600"
        );
        for (patch, field) in [
            (
                json!({"spec": {"shutdownTime": "2029-12-31T23:00:00Z"}}),
                "spec.shutdownTime",
            ),
            (
                json!({"spec": {"shutdownTime": "soon"}}),
                "spec.shutdownTime",
            ),
            (
                json!({"metadata": {"annotations": {"sandbox.cocoonstack.io/ttl-seconds": "-1"}}}),
                "metadata.annotations[sandbox.cocoonstack.io/ttl-seconds]",
            ),
        ] {
            let e = plan_of(&r, patch).unwrap_err();
            assert_eq!(e.code, 422, "{e}");
            let s = serde_json::to_value(e.status()).unwrap();
            assert_eq!(s["details"]["causes"][0]["field"], field, "{s}");
        }
    }

    #[test]
    fn the_rest_of_the_spec_is_immutable() {
        let r = record();
        let e = plan_of(
            &r,
            json!({"spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "other"}]}},
                            "service": true}}),
        )
        .unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
        let s = serde_json::to_value(e.status()).unwrap();
        let causes = s["details"]["causes"].as_array().unwrap();
        let fields: Vec<&str> = causes
            .iter()
            .map(|c| c["field"].as_str().unwrap())
            .collect();
        assert_eq!(fields, ["spec.podTemplate", "spec.service"]);
        assert!(
            causes[0]["message"]
                .as_str()
                .unwrap()
                .ends_with("field is immutable"),
            "{s}"
        );
        assert_eq!(s["details"]["kind"], "Sandbox");
        assert!(
            e.message.contains("spec.podTemplate: Invalid value: "),
            "{e}"
        );
        let removed = plan_of(&r, json!({"spec": null})).unwrap_err();
        assert_eq!(removed.code, 422);
        let net = plan_of(
            &r,
            json!({"metadata": {"annotations": {"sandbox.cocoonstack.io/net": "egress"}}}),
        )
        .unwrap_err();
        assert_eq!(net.code, 422);
        // Restating the net it has is fine.
        assert!(
            plan_of(
                &r,
                json!({"metadata": {"annotations": {"sandbox.cocoonstack.io/net": "none"}}})
            )
            .is_ok()
        );
    }

    #[test]
    fn system_values_identity_and_preconditions_are_checked() {
        let r = record();
        let e = plan_of(
            &r,
            json!({"metadata": {"labels": {"sandbox.cocoonstack.io/node": "n2"}}}),
        )
        .unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(
            plan_of(&r, json!({"metadata": {"resourceVersion": "6"}}))
                .unwrap_err()
                .code,
            409
        );
        assert!(plan_of(&r, json!({"metadata": {"resourceVersion": "7"}})).is_ok());
        assert_eq!(
            plan_of(&r, json!({"metadata": {"uid": "other"}}))
                .unwrap_err()
                .code,
            409
        );
        assert_eq!(
            plan_of(&r, json!({"metadata": {"name": "other"}}))
                .unwrap_err()
                .code,
            400
        );
        assert_eq!(plan_of(&r, json!({"kind": "Pod"})).unwrap_err().code, 400);
        assert_eq!(
            plan_of(&r, json!({"metadata": {"finalizers": ["x"]}}))
                .unwrap_err()
                .code,
            422
        );
        assert_eq!(
            plan_of(&r, json!({"metadata": {"labels": {"bad key!": "v"}}}))
                .unwrap_err()
                .code,
            422
        );
        assert_eq!(
            plan_of(&r, json!({"metadata": {"labels": {"a": 1}}}))
                .unwrap_err()
                .code,
            400
        );
        let big = "x".repeat(model::sandbox::MAX_MAP_BYTES);
        let e = plan_of(&r, json!({"metadata": {"annotations": {"big": big}}})).unwrap_err();
        assert_eq!(e.code, 422);
    }

    #[test]
    fn apply_ownership_is_recorded_and_dropped() {
        let r = record();
        let owned = Owned {
            labels: ["app".to_string()].into(),
            annotations: BTreeSet::new(),
        };
        let c = current(&r);
        let p = plan(&r, &c, &c, &[("kubectl", &owned)], now()).unwrap();
        assert_eq!(p.set["k8s.managed/kubectl"], r#"{"labels":["app"]}"#);
        let mut mine = record();
        mine.metadata.insert(
            p.set.keys().next().unwrap().clone(),
            p.set.values().next().unwrap().clone(),
        );
        let c = current(&mine);
        assert!(
            plan(&mine, &c, &c, &[("kubectl", &owned)], now())
                .unwrap()
                .is_noop()
        );
        let none = Owned::default();
        let p = plan(&mine, &c, &c, &[("kubectl", &none)], now()).unwrap();
        assert_eq!(p.remove, ["k8s.managed/kubectl"]);
    }

    #[test]
    fn sandboxes_from_e2b_have_a_synthesized_spec_that_stays_put() {
        let mut r = record();
        r.metadata.clear();
        r.claim_ref = "team-a/e2b-x".into();
        let c = current(&r);
        assert_eq!(
            c["spec"]["podTemplate"]["spec"]["containers"][0]["name"],
            "sandbox"
        );
        let p = plan_of(&r, json!({"metadata": {"labels": {"app": "x"}}})).unwrap();
        assert_eq!(p.set.keys().collect::<Vec<_>>(), ["k8s.label/app"]);
        let p = plan_of(
            &r,
            json!({"spec": {"shutdownTime": "2030-01-01T02:00:00Z"}}),
        )
        .unwrap();
        assert_eq!(p.renew.map(|r| r.ttl_seconds), Some(7200));
        assert!(p.set.is_empty(), "no spec is stored for it: {:?}", p.set);
    }
}
