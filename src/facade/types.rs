//! The `agents.x-k8s.io/v1beta1` types the facade serves. `Sandbox` matches the upstream
//! agent-sandbox field set; its JSON schema (generated from these types) feeds the OpenAPI
//! documents that `kubectl explain` and `kubectl create -f` read. The lifecycle bodies are the
//! subresources' request and response types.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "agents.x-k8s.io";
pub const VERSION: &str = "v1beta1";
pub const API_VERSION: &str = "agents.x-k8s.io/v1beta1";
pub const KIND: &str = "Sandbox";
pub const LIST_KIND: &str = "SandboxList";
pub const PLURAL: &str = "sandboxes";
pub const SINGULAR: &str = "sandbox";
pub const SUBRESOURCES: [(&str, &str); 4] = [
    ("pause", "SandboxPauseOptions"),
    ("resume", "SandboxResumeOptions"),
    ("fork", "SandboxForkOptions"),
    ("snapshot", "SandboxSnapshotOptions"),
];

/// A Kubernetes `Time` from a chrono time (whole seconds, as the API server stores them).
pub fn time(t: chrono::DateTime<chrono::Utc>) -> Time {
    Time(
        k8s_openapi::jiff::Timestamp::from_second(t.timestamp())
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

/// Annotations and labels the facade reads and writes.
pub mod keys {
    pub const CLAIM_ID: &str = "sandbox.cocoonstack.io/claim-id";
    pub const DEADLINE: &str = "sandbox.cocoonstack.io/deadline";
    pub const ADDRESS: &str = "sandbox.cocoonstack.io/address";
    pub const TOKEN: &str = "sandbox.cocoonstack.io/token";
    pub const TTL_SECONDS: &str = "sandbox.cocoonstack.io/ttl-seconds";
    pub const NET: &str = "sandbox.cocoonstack.io/net";
    pub const TEMPLATE: &str = "sandbox.cocoonstack.io/template";
    /// How a paused sandbox was paused (`Full` or `Filesystem`); only while it is paused.
    pub const PAUSE_MODE: &str = "sandbox.cocoonstack.io/pause-mode";
    pub const METADATA: &str = "sandbox.cocoonstack.io/metadata";
    pub const NODE_LABEL: &str = "sandbox.cocoonstack.io/node";
    pub const PHASE_LABEL: &str = "sandbox.cocoonstack.io/phase";
    pub const CLAIM_LABEL: &str = "sandbox.cocoonstack.io/claim";
    pub const TEMPLATE_LABEL: &str = "sandbox.cocoonstack.io/template";
}

/// A sandbox: a claimed, running (or paused) instance on one node.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    /// `agents.x-k8s.io/v1beta1`.
    pub api_version: String,
    /// `Sandbox`.
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: SandboxSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SandboxStatus>,
}

/// What to run. The first container's image names the template the sandbox starts from, and
/// its resource requests (or limits) pick the size; `spec.shutdownTime` sets the lease.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.x-k8s.agents.v1beta1.SandboxSpec")]
pub struct SandboxSpec {
    /// The pod-shaped description of the sandbox.
    pub pod_template: PodTemplate,
    /// Volume claims for the sandbox (accepted for compatibility; the process runtime has no
    /// volumes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_claim_templates: Vec<PersistentVolumeClaimTemplate>,
    /// Whether a headless Service should front the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<bool>,
    /// When the sandbox ends. Rounded up to whole seconds from the request; must be in the
    /// future. The node clamps the lease to its maximum; the granted end is the
    /// `sandbox.cocoonstack.io/deadline` annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<Time>,
    /// What happens to the object when the sandbox ends: `Delete` or `Retain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["Delete", "Retain"]))]
    pub shutdown_policy: Option<String>,
    /// `Running` or `Suspended` (paused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["Running", "Suspended"]))]
    pub operating_mode: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "io.x-k8s.agents.v1beta1.PodTemplate")]
pub struct PodTemplate {
    /// Labels and annotations of the template.
    #[serde(default)]
    pub metadata: PodMetadata,
    /// The pod spec: its first container's image is the sandbox template.
    pub spec: PodSpec,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "io.x-k8s.agents.v1beta1.PodMetadata")]
pub struct PodMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "io.x-k8s.agents.v1beta1.PersistentVolumeClaimTemplate")]
pub struct PersistentVolumeClaimTemplate {
    #[serde(default)]
    pub metadata: ClaimTemplateMetadata,
    pub spec: PersistentVolumeClaimSpec,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "io.x-k8s.agents.v1beta1.ClaimTemplateMetadata")]
pub struct ClaimTemplateMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// What the owning node reports.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.x-k8s.agents.v1beta1.SandboxStatus")]
pub struct SandboxStatus {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "serviceFQDN"
    )]
    pub service_fqdn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// `Ready` (True while running) and `Suspended` (True while paused).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The address of the node the sandbox runs on.
    #[serde(default, skip_serializing_if = "Vec::is_empty", rename = "podIPs")]
    pub pod_ips: Vec<String>,
    /// The node that owns the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
}

/// Body of `sandboxes/pause`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxPauseOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// `Full` (the default: memory and processes are kept) or `Filesystem` (only the files
    /// are kept; a resume boots fresh processes over them, as e2b's `pause(mode="filesystem")`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["Full", "Filesystem"]))]
    pub mode: Option<String>,
}

impl SandboxPauseOptions {
    /// The pause's mode; e2b's lower-case spellings are taken too.
    pub fn pause_mode(&self) -> Result<crate::model::PauseMode, String> {
        use crate::model::PauseMode;
        match self.mode.as_deref() {
            None | Some("Full" | "full") => Ok(PauseMode::Full),
            Some("Filesystem" | "filesystem") => Ok(PauseMode::Filesystem),
            Some(other) => Err(format!(
                "mode: Unsupported value: {other:?}: supported values: \"Full\", \"Filesystem\""
            )),
        }
    }
}

/// The `Full`/`Filesystem` spelling of a pause mode.
pub fn pause_mode_name(m: crate::model::PauseMode) -> &'static str {
    match m {
        crate::model::PauseMode::Full => "Full",
        crate::model::PauseMode::Filesystem => "Filesystem",
    }
}

/// Body of `sandboxes/resume`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxResumeOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// Body of `sandboxes/fork`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxForkOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Children to create (0 means 1), bounded by the node's fork limit.
    #[serde(default)]
    pub count: i64,
    /// Each child's own lease in seconds (0 means the node default); children never inherit
    /// the parent's.
    #[serde(default)]
    pub ttl_seconds: i64,
}

/// Answer of `sandboxes/fork`: one entry per child, in request order.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxForkResult {
    pub api_version: String,
    pub kind: String,
    pub children: Vec<ForkChild>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.x-k8s.agents.v1beta1.ForkChild")]
pub struct ForkChild {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    pub node_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,
    /// The child's own data-plane credential.
    pub token: String,
}

/// Body of `sandboxes/snapshot`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSnapshotOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The checkpoint's name (stored as `<namespace>/<name>`, 63 characters at most).
    #[serde(default)]
    pub name: String,
}

/// Answer of `sandboxes/snapshot`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSnapshotResult {
    pub api_version: String,
    pub kind: String,
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub node_name: String,
    pub creation_timestamp: Time,
}
