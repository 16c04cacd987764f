//! The e2b surface's OpenAPI document, generated from the handlers and wire types. The
//! checked-in copy is `openapi/e2b.json`; `sandbox-gateway openapi` prints the current one.

use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::error::ErrorBody;
use super::{logs, network, sandboxes, templates, wire};

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
        sandboxes::fork, sandboxes::snapshot, sandboxes::list_snapshots,
        sandboxes::delete_template, sandboxes::metrics, sandboxes::metrics_batch,
        logs::v1, logs::v2, templates::list, templates::list_v2, network::update,
    ),
    components(schemas(
        ErrorBody, wire::NewSandbox, wire::Sandbox, wire::SandboxDetail, wire::ListedSandbox,
        wire::Lifecycle, wire::TimeoutRequest, wire::RefreshRequest, wire::PauseRequest,
        wire::ConnectRequest, wire::ResumeRequest, wire::ForkRequest, wire::ForkResult,
        wire::SnapshotRequest, wire::SnapshotInfo, wire::SandboxMetric,
        wire::SandboxesWithMetrics, wire::Template, logs::SandboxLogs, logs::SandboxLogsV2,
        logs::SandboxLog, logs::SandboxLogEntry, wire::NetworkConfig, wire::NetworkInfo,
    )),
    modifiers(&ApiKeyAuth)
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
