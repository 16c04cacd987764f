//! Template builds as the gateway and the nodes speak of them: the e2b build system's requests,
//! a build's status and log, and the step list a build runs. These travel between gateway and
//! node as JSON inside the node protocol (their shape is the e2b API's, which changes with
//! it, not with ours).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A build's state, as e2b names it (the SDKs refuse any other value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BuildState {
    Waiting,
    Building,
    Ready,
    Error,
}

impl BuildState {
    pub fn is_final(self) -> bool {
        matches!(self, BuildState::Ready | BuildState::Error)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

/// One line of a build's log; `step` says which phase wrote it (`base`, `1`…, `finalize`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildLogEntry {
    pub timestamp: DateTime<Utc>,
    pub level: LogLevel,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// Why a build failed, and which of the user's builder calls it points at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildReason {
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// `POST /v3/templates`, as the gateway hands it to the node that keeps the template.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RequestBuild {
    pub team: String,
    pub alias: String,
    /// Tags the build will carry once ready (at least `default`).
    pub tags: Vec<String>,
    pub cpu_count: u32,
    pub memory_mb: u64,
}

/// A registered build.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RequestedBuild {
    pub template_id: String,
    pub build_id: String,
    pub alias: String,
    pub tags: Vec<String>,
    pub public: bool,
}

/// Names a build of a team's template.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildRef {
    pub team: String,
    pub template_id: String,
    pub build_id: String,
}

/// `POST /v2/templates/{id}/builds/{build}`: the build's recipe, as the SDK sent it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StartBuild {
    #[serde(flatten)]
    pub build: BuildRef,
    pub spec: BuildSpec,
}

/// `GET …/status`: the page of the log wanted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildQuery {
    #[serde(flatten)]
    pub build: BuildRef,
    pub offset: usize,
    pub limit: usize,
    pub level: Option<LogLevel>,
}

/// A build's status and a page of its log.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildStatus {
    pub template_id: String,
    pub build_id: String,
    pub state: BuildState,
    pub entries: Vec<BuildLogEntry>,
    pub reason: Option<BuildReason>,
}

/// Whether a team's upload of `hash` is stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FilesRef {
    pub team: String,
    pub template_id: String,
    pub hash: String,
}

/// The body of `TemplateBuildStartV2` (e2b's names).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_template: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_image_registry: Option<serde_json::Value>,
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub steps: Vec<Step>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_cmd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_cmd: Option<String>,
}

/// One instruction: `RUN`, `COPY`, `ENV`, `WORKDIR`, `USER` (and `ADD`, `ARG`). Keys the SDKs
/// add beyond these (`forceUpload`, `gzip`, …) are ignored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_hash: Option<String>,
    #[serde(default)]
    pub force: bool,
}

/// Which build a tag names, since when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TagRecord {
    pub build_id: String,
    pub assigned_at: DateTime<Utc>,
}

/// What a node keeps of an e2b template: its names, who owns it and which build each tag
/// points at.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TemplateRecord {
    pub template_id: String,
    pub team: String,
    pub alias: String,
    pub public: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Tag → the ready build it names.
    pub tags: BTreeMap<String, TagRecord>,
    /// Every build, oldest first.
    pub builds: Vec<String>,
    pub cpu_count: u32,
    pub memory_mb: u64,
}

/// What can be asked of a team's template once it exists (e2b's template management routes).
/// `name` is the template's id or alias.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum TemplateOp {
    /// The node template a create of `name` (`alias[:tag]` or id) by `team` starts.
    Resolve {
        team: String,
        name: String,
    },
    Describe {
        team: String,
        name: String,
    },
    List {
        team: String,
    },
    AssignTags {
        team: String,
        name: String,
        /// The tag whose build gets the new tags.
        tag: String,
        tags: Vec<String>,
    },
    RemoveTags {
        team: String,
        name: String,
        tags: Vec<String>,
    },
    Delete {
        team: String,
        name: String,
    },
    Publish {
        team: String,
        name: String,
        public: bool,
    },
}

/// One build, as the template routes list them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildSummary {
    pub build_id: String,
    pub state: BuildState,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub cpu_count: u32,
    pub memory_mb: u64,
    /// What the build's template adds over its parent, when ready.
    pub layer_bytes: u64,
}

/// A template with its builds, newest last.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TemplateView {
    pub record: TemplateRecord,
    pub builds: Vec<BuildSummary>,
    /// Sandboxes made from it so far (on its node), and the last time one was.
    pub spawn_count: u64,
    pub last_spawned_at: Option<DateTime<Utc>>,
}

/// The build a tag assignment went to, and the tags it gave.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TagsAssigned {
    pub build_id: String,
    pub tags: Vec<String>,
}

/// The credentials a build's `fromImage` is pulled with, from e2b's `fromImageRegistry`.
#[derive(Clone, PartialEq, Eq)]
pub enum ImageAuth {
    Anonymous,
    /// HTTP basic credentials for the image's registry (`gcp` keys are basic auth too, as
    /// `_json_key` with the key as the password).
    Basic {
        username: String,
        password: String,
    },
}

impl std::fmt::Debug for ImageAuth {
    // A password never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImageAuth::Anonymous => f.write_str("Anonymous"),
            ImageAuth::Basic { username, .. } => write!(f, "Basic({username}, ***)"),
        }
    }
}

impl ImageAuth {
    /// Reads e2b's `fromImageRegistry` (`type` `registry`, `gcp` or `aws`), or says what is
    /// wrong with it.
    pub fn parse(v: Option<&serde_json::Value>) -> super::Result<ImageAuth> {
        let Some(v) = v.filter(|v| !v.is_null()) else {
            return Ok(ImageAuth::Anonymous);
        };
        let bad = |why: &str| Err(super::Error::invalid(format!("fromImageRegistry: {why}")));
        let field = |k: &str| v.get(k).and_then(|s| s.as_str()).filter(|s| !s.is_empty());
        match v.get("type").and_then(|t| t.as_str()) {
            Some("registry") => match (field("username"), field("password")) {
                (Some(u), Some(p)) => Ok(ImageAuth::Basic {
                    username: u.to_string(),
                    password: p.to_string(),
                }),
                _ => bad("type registry needs both username and password"),
            },
            Some("gcp") => match field("serviceAccountJson") {
                Some(key) if serde_json::from_str::<serde_json::Value>(key).is_ok() => {
                    Ok(ImageAuth::Basic {
                        username: "_json_key".into(),
                        password: key.to_string(),
                    })
                }
                _ => bad("type gcp needs serviceAccountJson, the service account's JSON key"),
            },
            Some("aws") => bad(
                "type aws (ECR) is not supported by this gateway yet; pull the image with its ECR token as type registry (username AWS, password from `aws ecr get-login-password`)",
            ),
            Some(other) => bad(&format!(
                "unknown type {other:?}; expected registry, gcp or aws"
            )),
            None => bad("type is missing; expected registry, gcp or aws"),
        }
    }
}

#[cfg(test)]
mod image_auth_tests {
    use super::ImageAuth;
    use serde_json::json;

    #[test]
    fn registry_credentials_are_read_and_never_printed() {
        assert_eq!(ImageAuth::parse(None).unwrap(), ImageAuth::Anonymous);
        assert_eq!(
            ImageAuth::parse(Some(&json!(null))).unwrap(),
            ImageAuth::Anonymous
        );
        let basic = ImageAuth::parse(Some(
            &json!({"type": "registry", "username": "u", "password": "s3cret"}),
        ))
        .unwrap();
        assert_eq!(
            basic,
            ImageAuth::Basic {
                username: "u".into(),
                password: "s3cret".into()
            }
        );
        assert!(!format!("{basic:?}").contains("s3cret"));
        let gcp = ImageAuth::parse(Some(
            &json!({"type": "gcp", "serviceAccountJson": "{\"type\":\"service_account\"}"}),
        ))
        .unwrap();
        assert!(matches!(gcp, ImageAuth::Basic { ref username, .. } if username == "_json_key"));
        for bad in [
            json!({"type": "registry", "username": "u"}),
            json!({"type": "gcp", "serviceAccountJson": "not json"}),
            json!({"type": "aws", "awsAccessKeyId": "a", "awsSecretAccessKey": "b", "awsRegion": "r"}),
            json!({"type": "ftp"}),
            json!({"username": "u", "password": "p"}),
        ] {
            let e = ImageAuth::parse(Some(&bad)).unwrap_err();
            assert!(
                e.message.starts_with("fromImageRegistry: "),
                "{}",
                e.message
            );
        }
    }
}
