//! Wire shapes of e2b's template build API, field for field as the SDKs parse them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::model::builds::{BuildLogEntry, BuildState, LogLevel};

/// `POST /v3/templates` (`TemplateBuildRequestV3`).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuildRequestV3 {
    /// `[namespace/]alias[:tag]`.
    pub name: Option<String>,
    /// Older SDKs name the template here.
    pub alias: Option<String>,
    pub tags: Option<Vec<String>>,
    pub cpu_count: Option<i64>,
    #[serde(rename = "memoryMB")]
    pub memory_mb: Option<i64>,
    /// Accepted; the disk of a built template's sandboxes is their size's.
    pub min_free_disk_mb: Option<i64>,
    #[serde(rename = "teamID")]
    pub team_id: Option<String>,
}

/// `TemplateRequestResponseV3`: answered with 202.
#[derive(Debug, Serialize, ToSchema)]
pub struct RequestedV3 {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub public: bool,
    pub names: Vec<String>,
    pub tags: Vec<String>,
    pub aliases: Vec<String>,
}

/// `TemplateBuildFileUpload`: answered with 201.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileUpload {
    /// The files of this hash are stored for the team already.
    pub present: bool,
    /// Where to PUT the archive (signed; no API key).
    pub url: String,
}

/// A build's log line.
#[derive(Debug, Serialize, ToSchema)]
pub struct LogEntry {
    pub timestamp: DateTime<Utc>,
    #[schema(value_type = String)]
    pub level: LogLevel,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

impl From<BuildLogEntry> for LogEntry {
    fn from(e: BuildLogEntry) -> Self {
        LogEntry {
            timestamp: e.timestamp,
            level: e.level,
            message: e.message,
            step: e.step,
        }
    }
}

/// Why a build failed (`BuildStatusReason`).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Reason {
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    pub log_entries: Vec<LogEntry>,
}

/// `TemplateBuildInfo`: a build's status and a page of its log.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuildInfo {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    /// `building`, `waiting`, `ready` or `error`.
    #[schema(value_type = String)]
    pub status: BuildState,
    pub log_entries: Vec<LogEntry>,
    /// Legacy string log; always empty for these builds.
    pub logs: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
}

/// `GET /templates/aliases/{alias}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct AliasInfo {
    #[serde(rename = "templateID")]
    pub template_id: String,
    pub public: bool,
}
