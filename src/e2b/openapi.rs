//! The e2b surface's OpenAPI document, generated from the handlers and wire types. The
//! checked-in copy is `openapi/e2b.json`; `sandbox-gateway openapi` prints the current one.

use utoipa::openapi::RefOr;
use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::error::ErrorBody;
use super::{
    builds, logs, metrics, network, sandboxes, secrets, snapshots, template_admin, templates,
    volumes, wire, wire_templates,
};

struct ApiKeyAuth;

impl Modify for ApiKeyAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "ApiKeyAuth",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new(
                super::auth::API_KEY_HEADER,
            ))),
        );
        // The volume content API takes the volume's token instead.
        components.add_security_scheme(
            "VolumeToken",
            SecurityScheme::Http(utoipa::openapi::security::Http::new(
                utoipa::openapi::security::HttpAuthScheme::Bearer,
            )),
        );
    }
}

/// Every operation that takes an API key can answer 401 (a missing, unknown or revoked key), and
/// every one that takes input can answer 400; declared once here rather than on each handler.
struct Unauthorized;

impl Modify for Unauthorized {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let error = |why: &str| {
            utoipa::openapi::ResponseBuilder::new()
                .description(why)
                .content(
                    "application/json",
                    utoipa::openapi::ContentBuilder::new()
                        .schema(Some(utoipa::openapi::Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build()
        };
        let unauthorized = error("the API key is missing or not known");
        let bad_request = error("the request's input is not valid");
        for item in doc.paths.paths.values_mut() {
            let operations = [
                item.get.as_mut(),
                item.post.as_mut(),
                item.put.as_mut(),
                item.patch.as_mut(),
                item.delete.as_mut(),
            ];
            for op in operations.into_iter().flatten() {
                if op.security.as_ref().is_some_and(|s| !s.is_empty()) {
                    op.responses
                        .responses
                        .entry("401".to_string())
                        .or_insert_with(|| RefOr::T(unauthorized.clone()));
                }
                // Whatever takes input can be given input it refuses (a malformed body, a
                // query value out of range, an id that is not one).
                let takes_input = op.request_body.is_some()
                    || op.parameters.as_ref().is_some_and(|p| !p.is_empty());
                if takes_input {
                    op.responses
                        .responses
                        .entry("400".to_string())
                        .or_insert_with(|| RefOr::T(bad_request.clone()));
                }
            }
        }
    }
}

/// What a response hands on to a later request.
#[derive(Clone, Copy)]
enum Carries {
    /// A sandbox (`wire::Sandbox`).
    Sandbox,
    /// A template (`wire::Template`).
    Template,
    /// A snapshot (`wire::SnapshotInfo`), whose id is also a `templateID`.
    Snapshot,
    /// A requested build (`wire_templates::RequestedV3`): its template and build ids.
    Build,
}

/// Responses that carry an object, by operation id and status, with the JSON pointer to the
/// object in the body ("" for the body itself). The template list stands for its items by its
/// first one; the other lists are filtered and often empty, so they are not sources.
const LINK_SOURCES: &[(&str, &str, &str, Carries)] = &[
    ("create_v2", "201", "", Carries::Sandbox),
    ("create_v1", "201", "", Carries::Sandbox),
    ("connect_v2", "200", "", Carries::Sandbox),
    ("connect_v2", "201", "", Carries::Sandbox),
    ("connect_v1", "200", "", Carries::Sandbox),
    ("connect_v1", "201", "", Carries::Sandbox),
    ("resume", "201", "", Carries::Sandbox),
    ("fork", "201", "/0/sandbox", Carries::Sandbox),
    ("list_templates", "200", "/0", Carries::Template),
    ("list_templates_v2", "200", "/0", Carries::Template),
    ("snapshot", "201", "", Carries::Snapshot),
    ("request_build", "202", "", Carries::Build),
];

/// Where a link puts the value it takes.
#[derive(Clone, Copy)]
enum Put {
    Path(&'static str),
    Query(&'static str),
    /// The JSON request body `{field: value}`, a complete request on its own (schemathesis
    /// merges it into a generated body).
    Body(&'static str),
}

/// A link's target: its operation id, the field of the carried object it takes, and where.
type Target = (&'static str, &'static str, Put);

impl Carries {
    fn targets(self) -> &'static [Target] {
        match self {
            Carries::Sandbox => &[
                ("get", "sandboxID", Put::Path("sandboxID")),
                ("kill", "sandboxID", Put::Path("sandboxID")),
                ("set_timeout", "sandboxID", Put::Path("sandboxID")),
                ("refresh", "sandboxID", Put::Path("sandboxID")),
                ("pause", "sandboxID", Put::Path("sandboxID")),
                ("connect_v2", "sandboxID", Put::Path("sandboxID")),
                ("connect_v1", "sandboxID", Put::Path("sandboxID")),
                ("resume", "sandboxID", Put::Path("sandboxID")),
                ("fork", "sandboxID", Put::Path("sandboxID")),
                ("snapshot", "sandboxID", Put::Path("sandboxID")),
                ("metrics", "sandboxID", Put::Path("sandboxID")),
                ("metrics_batch", "sandboxID", Put::Query("sandbox_ids")),
                ("v1", "sandboxID", Put::Path("sandboxID")),
                ("v2", "sandboxID", Put::Path("sandboxID")),
                ("update", "sandboxID", Put::Path("sandboxID")),
                ("list_snapshots", "sandboxID", Put::Query("sandboxID")),
                ("list_v2", "templateID", Put::Query("template")),
            ],
            Carries::Template => &[
                ("create_v2", "templateID", Put::Body("templateID")),
                ("create_v1", "templateID", Put::Body("templateID")),
            ],
            Carries::Snapshot => &[
                ("create_v2", "snapshotID", Put::Body("templateID")),
                ("create_v1", "snapshotID", Put::Body("templateID")),
                ("delete_template", "snapshotID", Put::Path("templateID")),
                ("list_snapshots", "snapshotID", Put::Query("name")),
            ],
            Carries::Build => &[
                ("build_files", "templateID", Put::Path("templateID")),
                ("start_build", "templateID", Put::Path("templateID")),
                ("build_status", "templateID", Put::Path("templateID")),
            ],
        }
    }
}

/// OpenAPI links from each of `LINK_SOURCES` to the targets of what it carries: which value of
/// a response a later request takes, so that a client generator, or schemathesis's stateful
/// phase (tests/schema_fuzz.rs), can follow create → use → delete with real ids.
struct Links;

impl Modify for Links {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        for item in doc.paths.paths.values_mut() {
            let operations = [
                item.get.as_mut(),
                item.post.as_mut(),
                item.put.as_mut(),
                item.delete.as_mut(),
            ];
            for op in operations.into_iter().flatten() {
                let id = op.operation_id.clone().unwrap_or_default();
                for (_, status, object, carries) in LINK_SOURCES.iter().filter(|s| s.0 == id) {
                    let Some(RefOr::T(response)) = op.responses.responses.get_mut(*status) else {
                        continue;
                    };
                    for &(target, field, put) in carries.targets() {
                        let value =
                            serde_json::Value::from(format!("$response.body#{object}/{field}"));
                        let link = LinkBuilder::new().operation_id(target);
                        let link = match put {
                            Put::Path(p) => link.parameter(format!("path.{p}"), value),
                            Put::Query(q) => link.parameter(format!("query.{q}"), value),
                            Put::Body(f) => {
                                let body = serde_json::Map::from_iter([(f.to_string(), value)]);
                                link.request_body(Some(body))
                            }
                        };
                        response
                            .links
                            .insert(target.to_string(), RefOr::T(link.build()));
                    }
                }
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "sandbox-gateway e2b API",
        description = "The e2b control-plane API served by sandbox-gateway. Errors are JSON {code, message} with code equal to the HTTP status.\n\nData plane: the same listener routes a request to a sandbox instead of these routes when it carries the headers `E2b-Sandbox-Id` (and `E2b-Sandbox-Port`, default 49983) or is addressed to the host `{port}-{sandboxID}.{domain}`. Port 49983 is the sandbox's envd (Connect RPC `process.Process` and `filesystem.Filesystem`, `/files`, `/health`, `/envs`, `/metrics`): `X-Access-Token` must be the sandbox's `envdAccessToken`, or a `/files` URL must carry a valid `v1_` signature made with it; `/init` is refused with 403. Any other port reaches that port inside the sandbox (HTTP, and WebSocket upgrades). An unknown or paused sandbox answers 502 `{sandboxId, message: \"The sandbox was not found\", code: 502}`; a port nobody listens on answers 502 with \"The sandbox is running but port is not open\". Bodies stream both ways; HTTP/1.1, and HTTP/2 over TLS (`--e2b-tls`)."
    ),
    paths(
        sandboxes::create_v2, sandboxes::create_v1, sandboxes::list_v2, sandboxes::list_v1,
        sandboxes::get, sandboxes::kill, sandboxes::set_timeout, sandboxes::refresh,
        sandboxes::pause, sandboxes::connect_v2, sandboxes::connect_v1, sandboxes::resume,
        sandboxes::fork, snapshots::snapshot, snapshots::list_snapshots,
        snapshots::delete_template, metrics::metrics, metrics::metrics_batch,
        logs::v1, logs::v2, templates::list, templates::list_v2, network::update,
        builds::request, builds::files, builds::upload, builds::start, builds::status,
        builds::alias, template_admin::assign_tags, template_admin::remove_tags,
        template_admin::tags, template_admin::get, template_admin::publish_v2,
        template_admin::publish_v1, builds::legacy_create_v1, builds::legacy_create_v2,
        builds::legacy_rebuild, builds::legacy_start, secrets::list, secrets::create,
        secrets::get, secrets::update, secrets::delete, volumes::list, volumes::create,
        volumes::get, volumes::delete, volumes::list_dir, volumes::make_dir, volumes::read_file,
        volumes::write_file, volumes::stat, volumes::update, volumes::remove,
    ),
    components(schemas(
        ErrorBody, wire::NewSandbox, wire::Sandbox, wire::SandboxDetail, wire::ListedSandbox,
        wire::Lifecycle, wire::TimeoutRequest, wire::RefreshRequest, wire::PauseRequest,
        wire::ConnectRequest, wire::ResumeRequest, wire::ForkRequest, wire::ForkResult,
        wire::SnapshotRequest, wire::SnapshotInfo, wire::SandboxMetric,
        wire::SandboxesWithMetrics, wire::Template, logs::SandboxLogs, logs::SandboxLogsV2,
        logs::SandboxLog, logs::SandboxLogEntry, wire::NetworkConfig, wire::NetworkInfo,
        wire_templates::BuildRequestV3, wire_templates::RequestedV3, wire_templates::FileUpload,
        wire_templates::LogEntry, wire_templates::Reason, wire_templates::BuildInfo,
        wire_templates::AliasInfo, template_admin::AssignTags, template_admin::RemoveTags,
        template_admin::AssignedTags, template_admin::TagInfo, template_admin::BuildItem,
        template_admin::TemplateWithBuilds, template_admin::Publish, template_admin::Published,
        secrets::Secret, secrets::NewSecret, secrets::SecretUpdate, volumes::Volume,
        volumes::VolumeAndToken, volumes::NewVolume, volumes::MetaUpdate,
        crate::volumes::content::EntryStat,
    )),
    modifiers(&ApiKeyAuth, &Unauthorized, &Links)
)]
pub struct ApiDoc;

/// The document as pretty-printed JSON with a trailing newline.
pub fn document_json() -> String {
    let doc = ApiDoc::openapi();
    let mut s = serde_json::to_string_pretty(&doc).unwrap_or_else(|e| {
        format!("{{\"error\": \"the OpenAPI document could not be rendered: {e}\"}}")
    });
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn operations(doc: &Value) -> Vec<(&str, &Value)> {
        let paths = doc["paths"].as_object().into_iter().flatten();
        paths
            .flat_map(|(_, item)| item.as_object().into_iter().flatten())
            .filter_map(|(_, op)| Some((op.get("operationId")?.as_str()?, op)))
            .collect()
    }

    /// A link names its target by operation id, so ids must be unique (OpenAPI requires it);
    /// `GET /v2/templates` and `GET /v2/sandboxes` were both `list_v2`.
    #[test]
    fn operation_ids_are_unique() {
        let doc: Value = serde_json::from_str(&document_json()).unwrap_or_default();
        let mut ids: Vec<&str> = operations(&doc).into_iter().map(|(id, _)| id).collect();
        let all = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert!(
            all > 20 && ids.len() == all,
            "duplicate operation ids in {ids:?}"
        );
    }

    #[test]
    fn every_operation_that_takes_a_key_declares_401() {
        let doc: Value = serde_json::from_str(&document_json()).unwrap_or_default();
        let secured: Vec<_> = operations(&doc)
            .into_iter()
            .filter(|(_, op)| op["security"].as_array().is_some_and(|s| !s.is_empty()))
            .collect();
        assert!(secured.len() > 30, "{}", secured.len());
        for (id, op) in secured {
            assert!(op["responses"].get("401").is_some(), "{id} declares no 401");
        }
    }

    /// Every link leaves a declared response, names a declared operation, and puts its value
    /// into a parameter or body field that operation declares.
    #[test]
    fn links_connect_declared_operations() {
        let doc: Value = serde_json::from_str(&document_json()).unwrap_or_default();
        let ops = operations(&doc);
        let find = |id: &str| ops.iter().find(|(i, _)| *i == id).map(|(_, op)| *op);
        let mut links = 0;
        for &(source, status, ..) in LINK_SOURCES {
            let op = find(source).unwrap_or_else(|| panic!("no operation {source}"));
            let declared = op["responses"][status]["links"].as_object();
            let declared = declared.unwrap_or_else(|| panic!("no links on {source} {status}"));
            for (name, link) in declared {
                links += 1;
                let target = link["operationId"].as_str().unwrap_or_default();
                let target_op = find(target).unwrap_or_else(|| panic!("{name}: no {target}"));
                for (parameter, value) in link["parameters"].as_object().into_iter().flatten() {
                    let (location, param) = parameter.split_once('.').unwrap_or_default();
                    let params = target_op["parameters"].as_array().into_iter().flatten();
                    assert!(
                        params
                            .into_iter()
                            .any(|p| p["in"] == location && p["name"] == param),
                        "{source} {status} -> {target}: {parameter} is not a parameter"
                    );
                    assert!(
                        value
                            .as_str()
                            .is_some_and(|v| v.starts_with("$response.body#"))
                    );
                }
                if let Some(body) = link.get("requestBody").and_then(Value::as_object) {
                    let schema = &target_op["requestBody"]["content"]["application/json"]["schema"];
                    let name = schema["$ref"].as_str().and_then(|r| r.rsplit('/').next());
                    let props =
                        &doc["components"]["schemas"][name.unwrap_or_default()]["properties"];
                    for field in body.keys() {
                        assert!(props.get(field).is_some(), "{target} takes no {field}");
                    }
                }
            }
        }
        let expected: usize = LINK_SOURCES.iter().map(|s| s.3.targets().len()).sum();
        assert_eq!(
            links, expected,
            "every source gets the links of what it carries"
        );
    }
}
