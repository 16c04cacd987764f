//! Wire shapes of the e2b control plane, field for field as the SDKs parse them: camelCase
//! names, every required field present, optional objects omitted rather than `null`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::ErrorBody;

/// `POST /v2/sandboxes` (`NewSandboxV2`) and v1 `POST /sandboxes` (`NewSandbox`).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    /// A template name offered by the nodes, or a snapshot id to branch from.
    #[serde(rename = "templateID")]
    pub template_id: Option<String>,
    /// Lifetime in seconds (v2 default 300, v1 default 15).
    pub timeout: Option<i64>,
    pub auto_pause: Option<bool>,
    pub auto_pause_memory: Option<bool>,
    #[schema(value_type = Option<Object>)]
    pub auto_resume: Option<serde_json::Value>,
    /// v1 only.
    pub secure: Option<bool>,
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    pub network: Option<NetworkConfig>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub env_vars: Option<BTreeMap<String, String>>,
    #[schema(value_type = Option<Object>)]
    pub mcp: Option<serde_json::Value>,
    #[schema(value_type = Option<Object>)]
    pub iam: Option<serde_json::Value>,
    #[schema(value_type = Option<Vec<Object>>)]
    pub volume_mounts: Option<Vec<serde_json::Value>>,
}

/// A started sandbox: the answer to create, connect and resume, and each fork child.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Sandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// The node that runs the sandbox.
    #[serde(rename = "clientID")]
    pub client_id: String,
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    #[serde(rename = "envdAccessToken", skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    /// Set when the sandbox's ports are not public: requests to them through the gateway
    /// must carry it as `e2b-traffic-access-token`.
    #[serde(rename = "trafficAccessToken", skip_serializing_if = "Option::is_none")]
    pub traffic_access_token: Option<String>,
    pub domain: Option<String>,
}

/// e2b's `SandboxNetworkConfig` (create) and `SandboxNetworkUpdateConfig` (update): egress
/// lists of IPv4 addresses, CIDRs and (allow only) domain names, allow winning over deny, and
/// the ingress options, and per-host `rules` whose headers the egress proxy sets. An egress
/// proxy of the caller's own and HTTPS ports are refused (see README).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    pub allow_out: Option<Vec<String>>,
    pub deny_out: Option<Vec<String>>,
    /// Create only; false makes the sandbox's ports need its traffic access token.
    pub allow_public_traffic: Option<bool>,
    /// The resolvers reachable when `allowOut` names domains (unset: 8.8.8.8; `[]`: none).
    pub dns_servers: Option<Vec<String>>,
    #[schema(value_type = Option<Object>)]
    pub egress_proxy: Option<serde_json::Value>,
    pub mask_request_host: Option<String>,
    pub https_ports: Option<Vec<u32>>,
    /// Per host (`api.example.com`, `*.example.com`): `[{"transform": {"headers": {...}}}]`,
    /// header values may name the team's secrets as `${e2b.secrets.NAME}`.
    #[schema(value_type = Option<Object>)]
    pub rules: Option<serde_json::Value>,
    /// Update only (snake_case on the wire, as the SDKs send it): false denies all egress.
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
}

/// The network policy as `GET /sandboxes/{id}` reports it.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInfo {
    pub allow_out: Vec<String>,
    pub deny_out: Vec<String>,
    pub allow_public_traffic: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mask_request_host: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dns_servers: Option<Vec<String>>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    #[schema(value_type = Object)]
    pub rules: BTreeMap<String, Vec<crate::model::transforms::Rule>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    pub auto_resume: bool,
    /// What happens at the end of the lease: `kill` or `pause`.
    pub on_timeout: &'static str,
}

/// `GET /sandboxes/{sandboxID}`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    /// Everything a list item carries.
    #[serde(flatten)]
    pub listed: ListedSandbox,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    pub domain: Option<String>,
    pub allow_internet_access: bool,
    /// Omitted (never null) for a sandbox created without a network policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkInfo>,
    pub lifecycle: Lifecycle,
    /// While paused: when the node's paused retention ends and the sandbox is released
    /// (not an e2b field; the SDKs ignore it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused_until: Option<DateTime<Utc>>,
    /// The team's volumes mounted in the sandbox.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    /// While paused: `full` (memory kept) or `filesystem` (files only; the next resume boots
    /// fresh). Omitted while running.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause_mode: Option<&'static str>,
}

/// e2b's `SandboxVolumeMount`: a team volume by name, and where it shows in the sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VolumeMount {
    pub name: String,
    pub path: String,
}

/// An item of `GET /v2/sandboxes` and `GET /sandboxes`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListedSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub started_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    /// `running` or `paused`.
    pub state: &'static str,
    pub envd_version: String,
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct TimeoutRequest {
    /// Seconds from now; may shorten the lease.
    pub timeout: Option<i64>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct RefreshRequest {
    /// Seconds from now (at least 15); only ever extends the lease.
    pub duration: Option<i64>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PauseRequest {
    /// `false` keeps only the sandbox's files (the instance is destroyed; its next resume
    /// boots fresh from them).
    pub memory: Option<bool>,
    pub require_healthy_guest: Option<bool>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectRequest {
    /// Seconds; the lease is extended to at least this, never shortened.
    pub timeout: Option<i64>,
    /// `false` boots the paused sandbox fresh from its files, even after a full pause.
    pub memory: Option<bool>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResumeRequest {
    pub timeout: Option<i64>,
    /// Deprecated: true pauses the resumed sandbox at the end of its timeout, false kills it.
    pub auto_pause: Option<bool>,
    pub memory: Option<bool>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct ForkRequest {
    /// Each child's own lifetime in seconds (default 15).
    pub timeout: Option<i64>,
    /// Children to create (default 1).
    pub count: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ForkResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct SnapshotRequest {
    pub name: Option<String>,
    /// `true` asks for the sandbox's memory too: accepted where its runtime captures memory
    /// (gvisor, no internet access), refused with 400 elsewhere (the snapshot then holds files).
    pub memory: Option<bool>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SnapshotInfo {
    /// Usable as `templateID` to create a sandbox from the snapshot.
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    pub names: Vec<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxMetric {
    pub timestamp: DateTime<Utc>,
    pub timestamp_unix: i64,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    /// Not measured by the process runtime: always 0.
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SandboxesWithMetrics {
    pub sandboxes: BTreeMap<String, SandboxMetric>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Template {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub public: bool,
    pub aliases: Vec<String>,
    pub names: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    #[schema(value_type = Option<Object>)]
    pub created_by: Option<serde_json::Value>,
    pub last_spawned_at: Option<DateTime<Utc>>,
    pub spawn_count: u64,
    pub build_count: u64,
    pub envd_version: String,
    pub build_status: &'static str,
    /// Beyond e2b's schema: the root filesystem's size on the nodes.
    pub size_bytes: u64,
    /// Beyond e2b's schema: the Debian packages it was built with (empty for images).
    pub packages: Vec<String>,
    /// Beyond e2b's schema: how it was made (debian, derived, oci, host).
    pub kind: String,
    /// Beyond e2b's schema: whether snapshots of its sandboxes can keep their memory (on the
    /// gvisor runtime, for sandboxes without internet access).
    pub captures_memory: bool,
}
