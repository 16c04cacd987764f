//! OpenAPI for the facade: the v3 index, the `agents.x-k8s.io/v1beta1` document with the
//! Sandbox schema (generated from `types`, with Kubernetes' patch strategies on keyed lists),
//! and a v2 document with the operations only. kubectl reads the v3 document for `explain`,
//! to learn that the server validates fields itself (a PATCH operation declaring
//! `fieldValidation`), so `create -f` needs no client-side schema, and to compute the
//! strategic merge patch of a client-side `kubectl apply` (the PATCH operation accepts
//! `application/strategic-merge-patch+json`).

use std::sync::OnceLock;

use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use super::patch::{CONTENT_TYPES, MERGE_KEYS};
use super::types::{
    self, API_VERSION, GROUP, KIND, Sandbox, SandboxForkOptions, SandboxForkResult,
    SandboxPauseOptions, SandboxResumeOptions, SandboxSnapshotOptions, SandboxSnapshotResult,
    VERSION,
};

/// The name kubectl looks the Sandbox schema up by.
pub const SANDBOX_SCHEMA: &str = "io.x-k8s.agents.v1beta1.Sandbox";
pub const GV_PATH: &str = "apis/agents.x-k8s.io/v1beta1";

fn gvk(kind: &str) -> Value {
    json!([{"group": GROUP, "version": VERSION, "kind": kind}])
}

fn component_name(kind: &str) -> String {
    format!("io.x-k8s.agents.v1beta1.{kind}")
}

struct Docs {
    gv: Value,
    gv_bytes: Vec<u8>,
    hash: String,
    schemas: Map<String, Value>,
}

fn build() -> Docs {
    let mut generator = SchemaSettings::openapi3().into_generator();
    let mut roots = Vec::new();
    macro_rules! add {
        ($t:ty, $kind:expr) => {
            roots.push(($kind, generator.subschema_for::<$t>().to_value()));
        };
    }
    add!(Sandbox, KIND);
    add!(SandboxPauseOptions, "SandboxPauseOptions");
    add!(SandboxResumeOptions, "SandboxResumeOptions");
    add!(SandboxForkOptions, "SandboxForkOptions");
    add!(SandboxForkResult, "SandboxForkResult");
    add!(SandboxSnapshotOptions, "SandboxSnapshotOptions");
    add!(SandboxSnapshotResult, "SandboxSnapshotResult");
    let mut schemas: Map<String, Value> = generator.take_definitions(true).into_iter().collect();
    // Give our kinds their Kubernetes names and group-version-kind, and point references at
    // the new names.
    let mut renames = Vec::new();
    for (kind, reference) in &roots {
        let Some(old) = reference
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.rsplit('/').next())
            .map(str::to_string)
        else {
            continue;
        };
        let new = component_name(kind);
        if let Some(mut schema) = schemas.remove(&old) {
            if let Some(obj) = schema.as_object_mut() {
                obj.insert("x-kubernetes-group-version-kind".into(), gvk(kind));
            }
            schemas.insert(new.clone(), schema);
        }
        renames.push((
            format!("#/components/schemas/{old}"),
            format!("#/components/schemas/{new}"),
        ));
    }
    let mut schemas_value = Value::Object(schemas);
    rewrite_refs(&mut schemas_value, &renames);
    structural_nullables(&mut schemas_value);
    patch_strategies(&mut schemas_value);
    let Value::Object(schemas) = schemas_value else {
        return empty_docs();
    };

    let sandbox_ref = json!({"$ref": format!("#/components/schemas/{SANDBOX_SCHEMA}")});
    let json_body = |schema: Value| json!({"content": {"application/json": {"schema": schema}}});
    let ok = |schema: Value| json!({"200": {"description": "OK", "content": {"application/json": {"schema": schema}}}});
    let param = |name: &str, location: &str, required: bool| json!({"name": name, "in": location, "required": required, "schema": {"type": "string"}});
    let ns = param("namespace", "path", true);
    let name = param("name", "path", true);
    let list_params = json!([
        param("labelSelector", "query", false),
        param("fieldSelector", "query", false),
        param("limit", "query", false),
        param("continue", "query", false),
        param("resourceVersion", "query", false),
        param("watch", "query", false),
        param("timeoutSeconds", "query", false),
        param("allowWatchBookmarks", "query", false)
    ]);
    let gvk_obj = json!({"group": GROUP, "version": VERSION, "kind": KIND});
    let collection = format!("/{GV_PATH}/namespaces/{{namespace}}/{}", types::PLURAL);
    let item = format!("{collection}/{{name}}");
    let mut paths = Map::new();
    paths.insert(
        format!("/{GV_PATH}/{}", types::PLURAL),
        json!({
            "get": {"operationId": "listSandboxForAllNamespaces", "x-kubernetes-action": "list",
                    "x-kubernetes-group-version-kind": gvk_obj, "parameters": list_params,
                    "responses": ok(json!({"type": "object"}))}
        }),
    );
    paths.insert(collection.clone(), json!({
        "parameters": [ns],
        "get": {"operationId": "listNamespacedSandbox", "x-kubernetes-action": "list",
                "x-kubernetes-group-version-kind": gvk_obj, "parameters": list_params,
                "responses": ok(json!({"type": "object"}))},
        "post": {"operationId": "createNamespacedSandbox", "x-kubernetes-action": "post",
                 "x-kubernetes-group-version-kind": gvk_obj,
                 "parameters": [param("dryRun", "query", false), param("fieldManager", "query", false),
                                param("fieldValidation", "query", false)],
                 "requestBody": json_body(sandbox_ref.clone()),
                 "responses": {"201": {"description": "Created", "content": {"application/json": {"schema": sandbox_ref}}}}}
    }));
    paths.insert(item.clone(), json!({
        "parameters": [ns, name],
        "get": {"operationId": "readNamespacedSandbox", "x-kubernetes-action": "get",
                "x-kubernetes-group-version-kind": gvk_obj, "responses": ok(sandbox_ref.clone())},
        "delete": {"operationId": "deleteNamespacedSandbox", "x-kubernetes-action": "delete",
                   "x-kubernetes-group-version-kind": gvk_obj,
                   "parameters": [param("dryRun", "query", false)],
                   "responses": ok(sandbox_ref.clone())},
        "put": {"operationId": "replaceNamespacedSandbox", "x-kubernetes-action": "put",
                "x-kubernetes-group-version-kind": gvk_obj,
                "parameters": [param("dryRun", "query", false), param("fieldManager", "query", false),
                               param("fieldValidation", "query", false)],
                "requestBody": json_body(sandbox_ref.clone()),
                "responses": ok(sandbox_ref.clone())},
        // `fieldValidation` tells kubectl the server validates fields itself; the
        // strategic-merge media type makes a client-side `kubectl apply` compute a strategic
        // merge patch from this document's schema.
        "patch": {"operationId": "patchNamespacedSandbox", "x-kubernetes-action": "patch",
                  "x-kubernetes-group-version-kind": gvk_obj,
                  "parameters": [param("dryRun", "query", false), param("fieldManager", "query", false),
                                 param("fieldValidation", "query", false), param("force", "query", false)],
                  "requestBody": {"required": true, "content": CONTENT_TYPES.iter()
                      .map(|ct| (ct.to_string(), json!({"schema": {"type": "object"}})))
                      .collect::<Map<String, Value>>()},
                  "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": sandbox_ref.clone()}}},
                                "201": {"description": "Created", "content": {"application/json": {"schema": sandbox_ref.clone()}}}}}
    }));
    for (sub, kind) in types::SUBRESOURCES {
        let result = match sub {
            "fork" => "SandboxForkResult",
            "snapshot" => "SandboxSnapshotResult",
            _ => kind,
        };
        paths.insert(format!("{item}/{sub}"), json!({
            "parameters": [ns, name],
            "post": {"operationId": format!("create{}NamespacedSandbox", capitalize(sub)),
                     "x-kubernetes-action": "post",
                     "x-kubernetes-group-version-kind": {"group": GROUP, "version": VERSION, "kind": kind},
                     "requestBody": json_body(json!({"$ref": format!("#/components/schemas/{}", component_name(kind))})),
                     "responses": {"201": {"description": "Created", "content": {"application/json": {
                         "schema": {"$ref": format!("#/components/schemas/{}", component_name(result))}}}}}}
        }));
    }
    let gv = json!({
        "openapi": "3.0.0",
        "info": {"title": "sandbox-gateway agents.x-k8s.io", "version": API_VERSION},
        "paths": paths,
        "components": {"schemas": schemas.clone()},
    });
    let gv_bytes = serde_json::to_vec(&gv).unwrap_or_default();
    let hash = crate::model::ids::stable_hash_hex(&gv_bytes);
    Docs {
        gv,
        gv_bytes,
        hash,
        schemas,
    }
}

fn empty_docs() -> Docs {
    Docs {
        gv: json!({}),
        gv_bytes: b"{}".to_vec(),
        hash: "0".into(),
        schemas: Map::new(),
    }
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
}

fn rewrite_refs(v: &mut Value, renames: &[(String, String)]) {
    match v {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get_mut("$ref")
                && let Some((_, new)) = renames.iter().find(|(old, _)| old == r)
            {
                *r = new.clone();
            }
            for value in map.values_mut() {
                rewrite_refs(value, renames);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| rewrite_refs(i, renames)),
        _ => {}
    }
}

/// `anyOf: [X, null]` (how an optional reference comes out) becomes `allOf: [X]` with
/// `nullable: true`, the shape Kubernetes tooling reads.
fn structural_nullables(v: &mut Value) {
    match v {
        Value::Object(map) => {
            let is_null = |o: &Value| o.get("enum").is_some_and(|e| e == &json!([null]));
            let replacement = map
                .get("anyOf")
                .and_then(Value::as_array)
                .and_then(|options| {
                    (options.len() == 2 && options.iter().any(is_null))
                        .then(|| options.iter().find(|o| !is_null(o)).cloned())
                        .flatten()
                });
            if let Some(inner) = replacement {
                map.remove("anyOf");
                map.insert("allOf".into(), json!([inner]));
                map.insert("nullable".into(), json!(true));
            }
            for value in map.values_mut() {
                structural_nullables(value);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(structural_nullables),
        _ => {}
    }
}

/// Marks the keyed lists the server merges by key (`patch::MERGE_KEYS`) and the sets it
/// merges (`finalizers`) with Kubernetes' patch extensions, so that kubectl computes strategic
/// merge patches the way the server applies them.
fn patch_strategies(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if let Some(Value::Object(props)) = map.get_mut("properties") {
                for (name, prop) in props.iter_mut() {
                    let Some(p) = prop.as_object_mut() else {
                        continue;
                    };
                    if p.get("items").is_none() {
                        continue;
                    }
                    if let Some((_, key)) = MERGE_KEYS.iter().find(|(f, _)| f == name) {
                        p.insert("x-kubernetes-patch-merge-key".into(), json!(key));
                        p.insert("x-kubernetes-patch-strategy".into(), json!("merge"));
                    } else if name == "finalizers" {
                        p.insert("x-kubernetes-patch-strategy".into(), json!("merge"));
                    }
                }
            }
            for value in map.values_mut() {
                patch_strategies(value);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(patch_strategies),
        _ => {}
    }
}

fn docs() -> &'static Docs {
    static DOCS: OnceLock<Docs> = OnceLock::new();
    DOCS.get_or_init(build)
}

/// `GET /openapi/v3`: where the group-version document is, with a content hash.
pub fn index() -> Value {
    json!({"paths": {GV_PATH: {"serverRelativeURL": format!("/openapi/v3/{GV_PATH}?hash={}", docs().hash)}}})
}

/// `GET /openapi/v3/apis/agents.x-k8s.io/v1beta1`, serialized once.
pub fn group_version_bytes() -> &'static [u8] {
    &docs().gv_bytes
}

pub fn group_version() -> &'static Value {
    &docs().gv
}

pub fn hash() -> &'static str {
    &docs().hash
}

/// `GET /openapi/v2` as JSON: the sandbox operations (with the media types PATCH accepts) and
/// no schemas. kube-apiserver merges it into its own document; the schema lives in v3, since
/// the generated one uses OpenAPI 3 forms a v2 consumer may refuse.
pub fn v2() -> &'static Value {
    static V2: OnceLock<Value> = OnceLock::new();
    V2.get_or_init(|| {
        let gvk = json!({"group": GROUP, "version": VERSION, "kind": KIND});
        let ok = json!({"200": {"description": "OK", "schema": {"type": "object"}}});
        let op = |id: &str, action: &str| {
            json!({"operationId": id, "x-kubernetes-action": action,
                   "x-kubernetes-group-version-kind": gvk, "produces": ["application/json"],
                   "responses": ok})
        };
        let mut patch = op("patchNamespacedSandbox", "patch");
        patch["consumes"] = json!(CONTENT_TYPES);
        // Swagger 2.0 wants every path template variable declared (schemathesis refused the
        // document without them); in v2 form, with `type` beside the name.
        let path_param = |name: &str| json!({"name": name, "in": "path", "required": true, "type": "string"});
        let (ns, name) = (path_param("namespace"), path_param("name"));
        let collection = format!("/{GV_PATH}/namespaces/{{namespace}}/{}", types::PLURAL);
        json!({
            "swagger": "2.0",
            "info": {"title": "sandbox-gateway", "version": API_VERSION},
            "paths": {
                format!("/{GV_PATH}/{}", types::PLURAL): {"get": op("listSandboxForAllNamespaces", "list")},
                collection.clone(): {"parameters": [ns],
                                     "get": op("listNamespacedSandbox", "list"),
                                     "post": op("createNamespacedSandbox", "post")},
                format!("{collection}/{{name}}"): {
                    "parameters": [ns, name],
                    "get": op("readNamespacedSandbox", "get"),
                    "put": op("replaceNamespacedSandbox", "put"),
                    "patch": patch,
                    "delete": op("deleteNamespacedSandbox", "delete")},
            },
        })
    })
}

/// Fields of `value` that the schema `schema_name` does not know, as dotted paths.
pub fn unknown_fields(value: &Value, schema_name: &str) -> Vec<String> {
    let schemas = &docs().schemas;
    let mut out = Vec::new();
    if let Some(schema) = schemas.get(schema_name) {
        walk(value, schema, schemas, "", &mut out, 0);
    }
    out
}

fn resolve<'a>(schema: &'a Value, schemas: &'a Map<String, Value>) -> &'a Value {
    let mut s = schema;
    for _ in 0..16 {
        match s.get("$ref").and_then(Value::as_str) {
            Some(r) => match r.rsplit('/').next().and_then(|n| schemas.get(n)) {
                Some(next) => s = next,
                None => return s,
            },
            None => return s,
        }
    }
    s
}

fn walk(
    value: &Value,
    schema: &Value,
    schemas: &Map<String, Value>,
    path: &str,
    out: &mut Vec<String>,
    depth: usize,
) {
    if depth > 64 {
        return;
    }
    let schema = resolve(schema, schemas);
    // Optional fields come as anyOf/oneOf [T, null]: check against the object branch.
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(options) = schema.get(key).and_then(Value::as_array) {
            if let Some(branch) = options.iter().map(|o| resolve(o, schemas)).find(|o| {
                o.get("properties").is_some()
                    || o.get("items").is_some()
                    || o.get("additionalProperties").is_some()
            }) {
                walk(value, branch, schemas, path, out, depth + 1);
            }
            return;
        }
    }
    match value {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            for (k, v) in map {
                let child = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match props.and_then(|p| p.get(k)) {
                    Some(s) => walk(v, s, schemas, &child, out, depth + 1),
                    None => match additional {
                        Some(Value::Object(_)) => walk(
                            v,
                            additional.unwrap_or(&Value::Null),
                            schemas,
                            &child,
                            out,
                            depth + 1,
                        ),
                        Some(Value::Bool(true)) => {}
                        // A schema without properties describes a free-form value.
                        _ if props.is_none() => {}
                        _ => out.push(child),
                    },
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    walk(
                        v,
                        item_schema,
                        schemas,
                        &format!("{path}[{i}]"),
                        out,
                        depth + 1,
                    );
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_has_the_sandbox_schema_and_the_field_validation_hint() {
        let gv = group_version();
        let s = &gv["components"]["schemas"][SANDBOX_SCHEMA];
        assert_eq!(s["x-kubernetes-group-version-kind"][0]["kind"], "Sandbox");
        assert!(s["properties"]["spec"].is_object());
        let patch = &gv["paths"]["/apis/agents.x-k8s.io/v1beta1/namespaces/{namespace}/sandboxes/{name}"]
            ["patch"];
        assert!(
            patch["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation")
        );
        assert!(
            index()["paths"][GV_PATH]["serverRelativeURL"]
                .as_str()
                .unwrap()
                .contains("hash=")
        );
        // The PodSpec schema came along (kubectl explain sandboxes.spec.podTemplate.spec).
        assert!(serde_json::to_string(gv).unwrap().contains("containers"));
    }

    #[test]
    fn patch_and_update_are_declared_with_what_strategic_merge_needs() {
        let gv = group_version();
        let item =
            &gv["paths"]["/apis/agents.x-k8s.io/v1beta1/namespaces/{namespace}/sandboxes/{name}"];
        let content = item["patch"]["requestBody"]["content"].as_object().unwrap();
        for ct in CONTENT_TYPES {
            assert!(content.contains_key(ct), "{ct}");
        }
        assert_eq!(item["put"]["x-kubernetes-action"], "put");
        let schemas = gv["components"]["schemas"].as_object().unwrap();
        let containers = schemas
            .values()
            .find_map(|s| s["properties"]["containers"].as_object())
            .expect("a schema with containers");
        assert_eq!(containers["x-kubernetes-patch-merge-key"], "name");
        assert_eq!(containers["x-kubernetes-patch-strategy"], "merge");
        let v2 = v2();
        assert_eq!(v2["swagger"], "2.0");
        let patch = &v2["paths"]["/apis/agents.x-k8s.io/v1beta1/namespaces/{namespace}/sandboxes/{name}"]
            ["patch"];
        assert_eq!(
            patch["consumes"].as_array().unwrap().len(),
            CONTENT_TYPES.len()
        );
        assert_eq!(patch["x-kubernetes-group-version-kind"]["kind"], "Sandbox");
    }

    /// Found by tests/schema_fuzz.rs: schemathesis refused the v2 document, whose paths used
    /// `{namespace}` and `{name}` without declaring them.
    #[test]
    fn every_path_variable_is_declared_in_both_documents() {
        for (doc, paths) in [
            (v2(), &v2()["paths"]),
            (group_version(), &group_version()["paths"]),
        ] {
            let paths = paths
                .as_object()
                .unwrap_or_else(|| panic!("paths in {doc}"));
            for (path, item) in paths {
                let declared: Vec<&str> = item["parameters"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|p| p["in"] == "path")
                    .filter_map(|p| p["name"].as_str())
                    .collect();
                for var in path
                    .split('{')
                    .skip(1)
                    .filter_map(|s| s.split_once('}'))
                    .map(|(v, _)| v)
                {
                    assert!(declared.contains(&var), "{path}: {{{var}}} is not declared");
                }
            }
        }
    }

    #[test]
    fn unknown_fields_are_found_at_any_depth() {
        let ok = json!({"apiVersion": API_VERSION, "kind": "Sandbox", "metadata": {"name": "x", "labels": {"a": "b"}},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "base",
                "resources": {"requests": {"cpu": "1"}}}]}}, "shutdownTime": "2030-01-01T00:00:00Z"}});
        assert_eq!(unknown_fields(&ok, SANDBOX_SCHEMA), Vec::<String>::new());
        let bad = json!({"spec": {"foo": 1, "podTemplate": {"spec": {"containers": [{"name": "c", "imagee": "base"}]}}}});
        let found = unknown_fields(&bad, SANDBOX_SCHEMA);
        assert!(found.contains(&"spec.foo".to_string()), "{found:?}");
        assert!(
            found.contains(&"spec.podTemplate.spec.containers[0].imagee".to_string()),
            "{found:?}"
        );
    }
}
