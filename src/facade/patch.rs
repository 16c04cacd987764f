//! Applying a PATCH body to the object as read. JSON merge patch (RFC 7386) and JSON patch
//! (RFC 6902) through the `json-patch` crate; strategic merge patch, which for a Sandbox is a
//! merge patch except that lists of keyed kinds (containers by name, env by name, ports by
//! containerPort, ...) merge by key and the `$patch`, `$setElementOrder`,
//! `$deleteFromPrimitiveList` and `$retainKeys` directives are honoured; and server-side
//! apply, which merges the applied configuration like a strategic patch and drops the labels
//! and annotations its field manager applied before and no longer names. What the result may
//! change is `update`'s business.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::status::{KubeError, KubeResult};
use super::stored::Owned;

/// How a PATCH body is to be read, from its Content-Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Json,
    Merge,
    Strategic,
    Apply,
}

/// The media types a PATCH accepts, as the OpenAPI document declares them.
pub const CONTENT_TYPES: [&str; 4] = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];

impl PatchKind {
    pub fn from_content_type(content_type: Option<&str>) -> KubeResult<Self> {
        let essence = content_type
            .and_then(|c| c.split(';').next())
            .map(|c| c.trim().to_ascii_lowercase())
            .unwrap_or_default();
        match essence.as_str() {
            "application/json-patch+json" => Ok(PatchKind::Json),
            "application/merge-patch+json" => Ok(PatchKind::Merge),
            "application/strategic-merge-patch+json" => Ok(PatchKind::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(PatchKind::Apply),
            _ => Err(KubeError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format ({essence:?}) - accepted media types include: {}",
                    CONTENT_TYPES.join(", ")
                ),
            )),
        }
    }
}

/// Lists that merge by key in strategic merge patches and server-side apply, with their key:
/// Kubernetes' `patchMergeKey` for the fields a Sandbox carries (the pod template, object
/// metadata). Matched by field name, which is unambiguous within those types.
pub const MERGE_KEYS: [(&str, &str); 12] = [
    ("containers", "name"),
    ("initContainers", "name"),
    ("ephemeralContainers", "name"),
    ("env", "name"),
    ("ports", "containerPort"),
    ("volumeMounts", "mountPath"),
    ("volumeDevices", "devicePath"),
    ("volumes", "name"),
    ("imagePullSecrets", "name"),
    ("hostAliases", "ip"),
    ("topologySpreadConstraints", "topologyKey"),
    ("ownerReferences", "uid"),
];

/// Lists of scalars that merge as sets (`patchStrategy: merge` without a key).
const MERGED_SETS: [&str; 1] = ["finalizers"];

pub fn merge_key(field: &str) -> Option<&'static str> {
    MERGE_KEYS
        .iter()
        .find(|(f, _)| *f == field)
        .map(|(_, k)| *k)
}

fn parse_json(body: &[u8], what: &str) -> KubeResult<Value> {
    serde_json::from_slice(body)
        .map_err(|e| KubeError::bad_request(format!("the {what} is not valid JSON: {e}")))
}

fn rejected(e: impl std::fmt::Display) -> KubeError {
    KubeError::new(
        422,
        "Invalid",
        format!("the server rejected our request due to an error in our request: {e}"),
    )
}

/// `current` with a JSON, merge or strategic merge patch applied.
pub fn apply(kind: PatchKind, current: &Value, body: &[u8]) -> KubeResult<Value> {
    let mut doc = current.clone();
    match kind {
        PatchKind::Json => {
            let ops: json_patch::Patch = serde_json::from_slice(body).map_err(|e| {
                KubeError::bad_request(format!("the JSON patch is not a list of operations: {e}"))
            })?;
            // On a copy, so a failed operation leaves nothing half-applied to undo.
            json_patch::patch_unsafe(&mut doc, &ops).map_err(rejected)?;
        }
        PatchKind::Merge => {
            let patch = parse_json(body, "merge patch")?;
            if !patch.is_object() {
                return Err(KubeError::bad_request(
                    "a merge patch must be a JSON object",
                ));
            }
            json_patch::merge(&mut doc, &patch);
        }
        PatchKind::Strategic => {
            let patch = parse_json(body, "strategic merge patch")?;
            if !patch.is_object() {
                return Err(KubeError::bad_request(
                    "a strategic merge patch must be a JSON object",
                ));
            }
            strategic_merge(&mut doc, &patch).map_err(rejected)?;
        }
        PatchKind::Apply => {
            return Err(KubeError::internal(
                "apply patches are merged with server_side_apply",
            ));
        }
    }
    Ok(doc)
}

/// The configuration of a server-side apply: YAML (JSON is YAML too, and what kubectl sends).
pub fn parse_applied(body: &[u8]) -> KubeResult<Value> {
    let text = std::str::from_utf8(body)
        .map_err(|_| KubeError::bad_request("the applied configuration is not UTF-8"))?;
    let v: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(_) => serde_saphyr::from_str(text).map_err(|e| {
            KubeError::bad_request(format!("the applied configuration is not valid YAML: {e}"))
        })?,
    };
    let Some(obj) = v.as_object() else {
        return Err(KubeError::bad_request(
            "the applied configuration must be an object",
        ));
    };
    for field in ["apiVersion", "kind"] {
        if obj
            .get(field)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(KubeError::bad_request(format!(
                "{field} must be set in the applied configuration"
            )));
        }
    }
    Ok(v)
}

fn string_keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// The label and annotation keys an applied configuration names.
pub fn owned_by(applied: &Value) -> Owned {
    let meta = &applied["metadata"];
    Owned {
        labels: string_keys(&meta["labels"]),
        annotations: string_keys(&meta["annotations"]),
    }
}

/// The labels and annotations `applied` would change that another manager (of `others`)
/// applied: `(field path, manager)`. Setting a key to the value it has is no conflict.
pub fn conflicts(
    current: &Value,
    applied: &Value,
    others: &[(String, Owned)],
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for field in ["labels", "annotations"] {
        let Some(wanted) = applied["metadata"][field].as_object() else {
            continue;
        };
        for (key, value) in wanted {
            if current["metadata"][field].get(key) == Some(value) {
                continue;
            }
            for (manager, owned) in others {
                let keys = if field == "labels" {
                    &owned.labels
                } else {
                    &owned.annotations
                };
                if keys.contains(key) {
                    out.push((format!(".metadata.{field}.{key}"), manager.clone()));
                }
            }
        }
    }
    out
}

/// What the managers of `others` own once a forced apply took the keys of `applied` from
/// them (only the managers that lost something).
pub fn forced(applied: &Value, others: &[(String, Owned)]) -> Vec<(String, Owned)> {
    let taken = owned_by(applied);
    others
        .iter()
        .filter_map(|(manager, owned)| {
            let left = Owned {
                labels: owned.labels.difference(&taken.labels).cloned().collect(),
                annotations: owned
                    .annotations
                    .difference(&taken.annotations)
                    .cloned()
                    .collect(),
            };
            (left != *owned).then(|| (manager.clone(), left))
        })
        .collect()
}

/// `current` with the applied configuration merged in, and what the manager owns now.
/// `before` is what the same manager owned after its previous apply.
pub fn server_side_apply(
    current: &Value,
    applied: &Value,
    before: &Owned,
) -> KubeResult<(Value, Owned)> {
    let owned = owned_by(applied);
    let mut doc = current.clone();
    for (field, now, then) in [
        ("labels", &owned.labels, &before.labels),
        ("annotations", &owned.annotations, &before.annotations),
    ] {
        if let Some(m) = doc["metadata"][field].as_object_mut() {
            for gone in then.difference(now) {
                m.remove(gone);
            }
        }
    }
    // Status is not the client's to apply; managed fields are this server's own bookkeeping.
    let mut config = applied.clone();
    if let Some(o) = config.as_object_mut() {
        o.remove("status");
    }
    if let Some(m) = config["metadata"].as_object_mut() {
        m.remove("managedFields");
    }
    strategic_merge(&mut doc, &config).map_err(rejected)?;
    Ok((doc, owned))
}

/// A strategic merge patch applied to `doc`. Errors name what was malformed.
pub fn strategic_merge(doc: &mut Value, patch: &Value) -> Result<(), String> {
    merge_value(doc, patch, "")
}

fn directive(v: &Value) -> Option<&str> {
    v.get("$patch").and_then(Value::as_str)
}

/// The value a patch value stands for on its own (nulls and directives removed).
fn fresh(v: &Value, path: &str) -> Result<Value, String> {
    match v {
        Value::Object(_) => {
            let mut out = Value::Object(Map::new());
            merge_value(&mut out, v, path)?;
            Ok(out)
        }
        Value::Array(items) => Ok(Value::Array(
            items
                .iter()
                .filter(|i| directive(i).is_none())
                .map(|i| fresh(i, path))
                .collect::<Result<_, _>>()?,
        )),
        other => Ok(other.clone()),
    }
}

fn merge_value(doc: &mut Value, patch: &Value, path: &str) -> Result<(), String> {
    let Value::Object(p) = patch else {
        *doc = patch.clone();
        return Ok(());
    };
    match directive(patch) {
        None | Some("merge") => {}
        Some("replace") => {
            let mut rest = p.clone();
            rest.remove("$patch");
            *doc = fresh(&Value::Object(rest), path)?;
            return Ok(());
        }
        Some(other) => return Err(format!("{path}: unknown patch directive {other:?}")),
    }
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let Value::Object(d) = doc else {
        return Ok(());
    };
    let mut orders = Vec::new();
    for (k, v) in p {
        let child = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        if k == "$patch" || k == "$retainKeys" {
            continue;
        }
        if let Some(field) = k.strip_prefix("$setElementOrder/") {
            orders.push((field, v));
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let gone = v
                .as_array()
                .ok_or_else(|| format!("{child}: must be a list"))?;
            if let Some(Value::Array(list)) = d.get_mut(field) {
                list.retain(|e| !gone.contains(e));
            }
            continue;
        }
        if k.starts_with('$') {
            return Err(format!("{child}: unknown patch directive"));
        }
        match v {
            Value::Null => {
                d.remove(k);
            }
            Value::Object(_) if directive(v) == Some("delete") => {
                d.remove(k);
            }
            Value::Object(_) => merge_value(d.entry(k.as_str()).or_insert(Value::Null), v, &child)?,
            Value::Array(items) => {
                merge_list(k, d.entry(k.as_str()).or_insert(Value::Null), items, &child)?
            }
            scalar => {
                d.insert(k.clone(), scalar.clone());
            }
        }
    }
    for (field, order) in orders {
        let order = order
            .as_array()
            .ok_or_else(|| format!("$setElementOrder/{field}: must be a list"))?;
        if let Some(Value::Array(list)) = d.get_mut(field) {
            reorder(list, order, merge_key(field));
        }
    }
    if let Some(keep) = p.get("$retainKeys") {
        let keep = keep
            .as_array()
            .ok_or_else(|| format!("{path}.$retainKeys: must be a list"))?;
        d.retain(|k, _| keep.iter().any(|x| x.as_str() == Some(k.as_str())));
    }
    Ok(())
}

fn merge_list(field: &str, doc: &mut Value, items: &[Value], path: &str) -> Result<(), String> {
    if items.iter().any(|i| directive(i) == Some("replace")) {
        *doc = fresh(&Value::Array(items.to_vec()), path)?;
        return Ok(());
    }
    if let Some(key) = merge_key(field) {
        let mut list = match doc {
            Value::Array(l) => std::mem::take(l),
            _ => Vec::new(),
        };
        for item in items {
            if !item.is_object() {
                return Err(format!(
                    "{path}: elements must be objects merged by {key:?}"
                ));
            }
            let id = item.get(key);
            let found = id.and_then(|id| list.iter().position(|e| e.get(key) == Some(id)));
            match (directive(item), found) {
                (Some("delete"), Some(i)) => {
                    list.remove(i);
                }
                (Some("delete"), None) => {}
                (_, Some(i)) => merge_value(&mut list[i], item, path)?,
                (_, None) => list.push(fresh(item, path)?),
            }
        }
        *doc = Value::Array(list);
    } else if MERGED_SETS.contains(&field) {
        let mut list = match doc {
            Value::Array(l) => std::mem::take(l),
            _ => Vec::new(),
        };
        for item in items {
            if !list.contains(item) {
                list.push(item.clone());
            }
        }
        *doc = Value::Array(list);
    } else {
        *doc = fresh(&Value::Array(items.to_vec()), path)?;
    }
    Ok(())
}

/// Puts the elements named in `order` first, in that order; the others keep theirs after.
fn reorder(list: &mut [Value], order: &[Value], key: Option<&str>) {
    let rank = |e: &Value| {
        order
            .iter()
            .position(|o| match key {
                Some(k) => o.get(k).is_some() && o.get(k) == e.get(k),
                None => o == e,
            })
            .unwrap_or(usize::MAX)
    };
    list.sort_by_key(rank);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object() -> Value {
        json!({
            "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
            "metadata": {"name": "demo", "labels": {"app": "web", "tier": "a"},
                         "annotations": {"note": "x"}},
            "spec": {"podTemplate": {"spec": {"containers": [
                {"name": "main", "image": "base", "env": [{"name": "A", "value": "1"}]},
                {"name": "side", "image": "base"}]}},
                "operatingMode": "Running"}
        })
    }

    #[test]
    fn content_types_pick_the_kind_and_others_are_415() {
        let k = |c| PatchKind::from_content_type(Some(c));
        assert_eq!(k("application/merge-patch+json").unwrap(), PatchKind::Merge);
        assert_eq!(
            k("application/json-patch+json; charset=utf-8").unwrap(),
            PatchKind::Json
        );
        assert_eq!(
            k("application/strategic-merge-patch+json").unwrap(),
            PatchKind::Strategic
        );
        assert_eq!(k("application/apply-patch+yaml").unwrap(), PatchKind::Apply);
        assert_eq!(k("application/json").unwrap_err().code, 415);
        assert_eq!(PatchKind::from_content_type(None).unwrap_err().code, 415);
    }

    #[test]
    fn merge_patches_replace_lists_and_drop_nulls() {
        let out = apply(
            PatchKind::Merge,
            &object(),
            br#"{"metadata":{"labels":{"tier":null,"new":"1"}},"spec":{"operatingMode":"Suspended"}}"#,
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"app": "web", "new": "1"}));
        assert_eq!(out["spec"]["operatingMode"], "Suspended");
        assert_eq!(out["spec"]["podTemplate"], object()["spec"]["podTemplate"]);
        assert_eq!(
            apply(PatchKind::Merge, &object(), b"[1]").unwrap_err().code,
            400
        );
        assert_eq!(
            apply(PatchKind::Merge, &object(), b"{").unwrap_err().code,
            400
        );
    }

    #[test]
    fn json_patches_apply_all_or_nothing() {
        let out = apply(
            PatchKind::Json,
            &object(),
            br#"[{"op":"replace","path":"/metadata/labels/app","value":"db"},
                 {"op":"add","path":"/metadata/annotations/b","value":"2"}]"#,
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"]["app"], "db");
        assert_eq!(out["metadata"]["annotations"]["b"], "2");
        let failed = apply(
            PatchKind::Json,
            &object(),
            br#"[{"op":"test","path":"/metadata/labels/app","value":"nope"}]"#,
        )
        .unwrap_err();
        assert_eq!((failed.code, failed.reason), (422, "Invalid"));
        let missing = apply(
            PatchKind::Json,
            &object(),
            br#"[{"op":"remove","path":"/spec/nothing"}]"#,
        )
        .unwrap_err();
        assert_eq!(missing.code, 422);
        assert_eq!(
            apply(PatchKind::Json, &object(), br#"{"op":"add"}"#)
                .unwrap_err()
                .code,
            400
        );
    }

    #[test]
    fn strategic_patches_merge_keyed_lists_and_honour_directives() {
        let mut doc = object();
        strategic_merge(
            &mut doc,
            &json!({"spec": {"podTemplate": {"spec": {
                "$setElementOrder/containers": [{"name": "side"}, {"name": "main"}],
                "containers": [{"name": "main", "image": "other",
                                "env": [{"name": "B", "value": "2"}]}]}}}}),
        )
        .unwrap();
        let containers = &doc["spec"]["podTemplate"]["spec"]["containers"];
        assert_eq!(containers[0]["name"], "side", "reordered: {containers}");
        assert_eq!(containers[1]["image"], "other");
        assert_eq!(
            containers[1]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}])
        );
        let mut doc = object();
        strategic_merge(
            &mut doc,
            &json!({"spec": {"podTemplate": {"spec": {"containers": [
                {"name": "side", "$patch": "delete"}]}}},
                "metadata": {"labels": {"$patch": "replace", "only": "this"}}}),
        )
        .unwrap();
        assert_eq!(
            doc["spec"]["podTemplate"]["spec"]["containers"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        assert_eq!(doc["metadata"]["labels"], json!({"only": "this"}));
        let mut doc = json!({"metadata": {"finalizers": ["a", "b"]}, "x": {"keep": 1, "drop": 2}});
        strategic_merge(
            &mut doc,
            &json!({"metadata": {"finalizers": ["c"], "$deleteFromPrimitiveList/finalizers": ["a"]},
                    "x": {"$retainKeys": ["keep"], "keep": 3}}),
        )
        .unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!(["b", "c"]));
        assert_eq!(doc["x"], json!({"keep": 3}));
        // Lists without a key are replaced, as in a merge patch.
        let mut doc = json!({"args": ["a", "b"]});
        strategic_merge(&mut doc, &json!({"args": ["c"]})).unwrap();
        assert_eq!(doc["args"], json!(["c"]));
        let mut doc = object();
        assert!(strategic_merge(&mut doc, &json!({"$bogus": 1})).is_err());
        assert!(strategic_merge(&mut doc, &json!({"metadata": {"$patch": "explode"}})).is_err());
    }

    #[test]
    fn apply_drops_what_the_manager_no_longer_names() {
        let before = Owned {
            labels: ["tier".to_string()].into(),
            annotations: BTreeSet::new(),
        };
        let applied = parse_applied(
            b"apiVersion: agents.x-k8s.io/v1beta1\nkind: Sandbox\nmetadata:\n  name: demo\n  labels:\n    app: web\n    env: prod\nspec:\n  operatingMode: Suspended\nstatus:\n  nodeName: x\n",
        )
        .unwrap();
        let (out, owned) = server_side_apply(&object(), &applied, &before).unwrap();
        assert_eq!(
            out["metadata"]["labels"],
            json!({"app": "web", "env": "prod"})
        );
        assert_eq!(out["metadata"]["annotations"], json!({"note": "x"}));
        assert_eq!(out["spec"]["operatingMode"], "Suspended");
        assert_eq!(out["spec"]["podTemplate"], object()["spec"]["podTemplate"]);
        assert!(out.get("status").is_none());
        assert_eq!(owned.labels, ["app".to_string(), "env".to_string()].into());
        assert!(
            parse_applied(b"metadata: {}").is_err(),
            "apiVersion and kind required"
        );
        assert!(parse_applied(b"- a").is_err());
    }

    #[test]
    fn appliers_conflict_over_each_others_keys_unless_the_value_is_the_same() {
        let current = serde_json::json!({"metadata": {"labels": {"tier": "a", "app": "db"}, "annotations": {"n": "1"}}});
        let others = vec![(
            "team".to_string(),
            Owned {
                labels: ["tier".to_string(), "app".to_string()].into(),
                annotations: ["n".to_string()].into(),
            },
        )];
        let applied = serde_json::json!({"metadata": {"labels": {"tier": "b", "app": "db", "new": "x"}, "annotations": {"n": "2"}}});
        assert_eq!(
            conflicts(&current, &applied, &others),
            vec![
                (".metadata.labels.tier".to_string(), "team".to_string()),
                (".metadata.annotations.n".to_string(), "team".to_string()),
            ]
        );
        let same = serde_json::json!({"metadata": {"labels": {"tier": "a"}}});
        assert!(conflicts(&current, &same, &others).is_empty());
        let moved = forced(&applied, &others);
        assert_eq!(moved.len(), 1);
        assert!(moved[0].1.labels.is_empty() && moved[0].1.annotations.is_empty());
        assert!(
            forced(
                &serde_json::json!({"metadata": {"labels": {"zzz": "1"}}}),
                &others
            )
            .is_empty()
        );
    }
}
