//! The records nodes keep and the dispatcher hands to the surfaces.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Error, PoolKey, Result};

/// Namespace of sandboxes whose claim named none.
pub const DEFAULT_NAMESPACE: &str = "default";
/// Bounds that keep a claim's free-form fields from growing a node's index without limit.
pub const MAX_CLAIM_REF: usize = 253 + 1 + 253;
pub const MAX_MAP_ENTRIES: usize = 256;
pub const MAX_MAP_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Running,
    Paused,
}

impl Phase {
    /// The e2b spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Running => "running",
            Phase::Paused => "paused",
        }
    }

    /// The Kubernetes spelling (labels, NodeInventory entries).
    pub fn title(self) -> &'static str {
        match self {
            Phase::Running => "Running",
            Phase::Paused => "Paused",
        }
    }
}

/// What a sandbox's node does when its lease ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    #[default]
    Kill,
    Pause,
}

impl OnTimeout {
    /// The e2b spelling, also used on the node wire.
    pub fn as_str(self) -> &'static str {
        match self {
            OnTimeout::Kill => "kill",
            OnTimeout::Pause => "pause",
        }
    }

    /// Reads the wire spelling; empty means the default (kill).
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "" | "kill" => Ok(OnTimeout::Kill),
            "pause" => Ok(OnTimeout::Pause),
            other => Err(Error::invalid(format!(
                "onTimeout {other:?} is neither \"kill\" nor \"pause\""
            ))),
        }
    }
}

/// What a pause keeps: the sandbox's memory and processes (`Full`), or only its files
/// (`Filesystem`: the instance is destroyed and its next resume boots fresh from them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PauseMode {
    #[default]
    Full,
    Filesystem,
}

impl PauseMode {
    /// The e2b spelling (`pauseMode`), also used on the node wire.
    pub fn as_str(self) -> &'static str {
        match self {
            PauseMode::Full => "full",
            PauseMode::Filesystem => "filesystem",
        }
    }

    /// Reads the wire spelling; empty means the default (full).
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "" | "full" => Ok(PauseMode::Full),
            "filesystem" => Ok(PauseMode::Filesystem),
            other => Err(Error::invalid(format!(
                "pause mode {other:?} is neither \"full\" nor \"filesystem\""
            ))),
        }
    }
}

/// A change of a sandbox's paused state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseChange {
    Pause(PauseMode),
    /// `cold`: boot fresh from the sandbox's files even when its pause kept its memory.
    Resume {
        cold: bool,
    },
}

/// A sandbox's lifecycle policy, chosen at claim.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lifecycle {
    pub on_timeout: OnTimeout,
    /// Whether reaching the sandbox's data plane resumes it when it is paused.
    pub auto_resume: bool,
    /// How the end of the lease pauses, when `on_timeout` is pause.
    #[serde(default)]
    pub pause_mode: PauseMode,
}

/// When a paused sandbox was paused and how long its node keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PausedSince {
    pub at: DateTime<Utc>,
    /// The end of the paused retention: the node releases the sandbox then.
    pub until: DateTime<Utc>,
    /// What the pause kept.
    #[serde(default)]
    pub mode: PauseMode,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: String,
    /// The sandbox's data-plane credential; empty where the source withholds it (lists, watches).
    pub token: String,
    pub key: PoolKey,
    pub claim_ref: String,
    pub claimed_at: DateTime<Utc>,
    pub deadline: DateTime<Utc>,
    pub phase: Phase,
    pub address: String,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    pub from_checkpoint: Option<String>,
    pub forked_from: Option<String>,
    pub node: String,
    pub cpu_count: u32,
    pub memory_bytes: u64,
    /// Where the instance's state lives on its node.
    pub state_dir: String,
    /// Disk the sandbox can use (the capacity of the file system holding its state).
    pub disk_bytes: u64,
    #[serde(default)]
    pub lifecycle: Lifecycle,
    /// The lease granted at claim, in seconds; every resume grants it again, because time
    /// spent paused does not consume a sandbox's timeout.
    #[serde(default)]
    pub lease_seconds: u64,
    /// Set while the sandbox is paused.
    #[serde(default)]
    pub paused: Option<PausedSince>,
    #[serde(default)]
    pub network: super::network::NetworkPolicy,
    /// Tenant volumes mounted in the sandbox (e2b `volumeMounts`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
}

/// A volume mounted read-write in a sandbox: its name (as the tenant knows it), where it shows
/// inside, and the directory on the node that holds its data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    pub name: String,
    pub path: String,
    pub source: String,
}

impl SandboxRecord {
    /// A running `base` sandbox on node `n1` with everything else empty: the fixture unit
    /// tests change what they are about (`SandboxRecord { field, ..SandboxRecord::fixture(..) }`).
    #[cfg(test)]
    pub fn fixture(id: &str, claim_ref: &str) -> Self {
        SandboxRecord {
            id: id.into(),
            token: String::new(),
            key: super::PoolKey::base(),
            claim_ref: claim_ref.into(),
            claimed_at: chrono::DateTime::UNIX_EPOCH,
            deadline: chrono::DateTime::UNIX_EPOCH,
            phase: super::Phase::Running,
            address: String::new(),
            metadata: Default::default(),
            env_vars: Default::default(),
            from_checkpoint: None,
            forked_from: None,
            node: "n1".into(),
            cpu_count: 1,
            memory_bytes: 1,
            state_dir: String::new(),
            disk_bytes: 0,
            lifecycle: Default::default(),
            lease_seconds: 0,
            paused: None,
            network: Default::default(),
            volume_mounts: Vec::new(),
        }
    }

    /// The namespace part of the claim ref (`default` when the claim named none).
    pub fn namespace(&self) -> &str {
        split_claim_ref(&self.claim_ref).0
    }

    /// The name part of the claim ref, or the claim id when the claim named none.
    pub fn name(&self) -> &str {
        let name = split_claim_ref(&self.claim_ref).1;
        if name.is_empty() { &self.id } else { name }
    }

    /// When the sandbox ends unless something changes: its lease's deadline while it runs, the
    /// end of its paused retention while it is paused.
    pub fn ends_at(&self) -> DateTime<Utc> {
        match self.paused {
            Some(p) if self.phase == Phase::Paused => p.until,
            _ => self.deadline,
        }
    }

    /// The pause's mode while the sandbox is paused.
    pub fn pause_mode(&self) -> Option<PauseMode> {
        self.paused
            .filter(|_| self.phase == Phase::Paused)
            .map(|p| p.mode)
    }

    /// Whether the sandbox is paused with only its files kept (it has no instance).
    pub fn paused_on_disk(&self) -> bool {
        self.pause_mode() == Some(PauseMode::Filesystem)
    }

    pub fn without_token(mut self) -> Self {
        self.token.clear();
        self
    }
}

/// Splits `<ns>/<name>`; a ref without `/` is a name in the default namespace.
pub fn split_claim_ref(claim_ref: &str) -> (&str, &str) {
    match claim_ref.split_once('/') {
        Some((ns, name)) if !ns.is_empty() => (ns, name),
        Some((_, name)) => (DEFAULT_NAMESPACE, name),
        None => (DEFAULT_NAMESPACE, claim_ref),
    }
}

pub fn claim_ref(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

pub fn validate_claim_ref(claim_ref: &str) -> Result<()> {
    if claim_ref.len() > MAX_CLAIM_REF {
        return Err(Error::invalid(format!(
            "claim ref is {} characters, at most {MAX_CLAIM_REF} are allowed",
            claim_ref.len()
        )));
    }
    if claim_ref.chars().any(char::is_control) {
        return Err(Error::invalid(
            "claim ref must not contain control characters",
        ));
    }
    Ok(())
}

pub fn validate_string_map(what: &str, map: &BTreeMap<String, String>) -> Result<()> {
    if map.len() > MAX_MAP_ENTRIES {
        return Err(Error::invalid(format!(
            "{what} has {} entries, at most {MAX_MAP_ENTRIES} are allowed",
            map.len()
        )));
    }
    let bytes: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_MAP_BYTES {
        return Err(Error::invalid(format!(
            "{what} is {bytes} bytes, at most {MAX_MAP_BYTES} are allowed"
        )));
    }
    if map.keys().any(|k| k.is_empty()) {
        return Err(Error::invalid(format!("{what} has an empty key")));
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    pub id: String,
    pub name: String,
    pub sandbox_id: String,
    pub key: PoolKey,
    pub created_at: DateTime<Utc>,
    pub size_bytes: u64,
    pub node: String,
    /// The build of the template the checkpoint's layer sits on; a rebuilt template does not
    /// fit it.
    #[serde(default)]
    pub template_id: String,
}

/// Which checkpoints a listing wants; empty fields do not filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckpointFilter {
    pub name_prefix: String,
    pub sandbox_id: String,
    pub id: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SandboxStats {
    pub id: String,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_used_bytes: u64,
    pub mem_total_bytes: u64,
    pub mem_used_measured: bool,
    pub disk_used_bytes: u64,
    pub disk_total_bytes: u64,
    pub measured_at: DateTime<Utc>,
    pub phase: Phase,
    pub process_count: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostClaim {
    pub id: String,
    pub claim_ref: String,
    pub reason: String,
    pub lost_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStatus {
    pub key: PoolKey,
    pub warm: u32,
    pub target: u32,
    pub booting: u32,
    /// Whether snapshots and forks of the pool's sandboxes hold their memory.
    pub captures_memory: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLimits {
    pub lease_default_seconds: u64,
    pub lease_max_seconds: u64,
    pub fork_limit: u32,
    pub max_sandboxes: u32,
    pub cold_start: bool,
    pub paused_retention_seconds: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub advertise_address: String,
    pub pools: Vec<PoolStatus>,
    pub claimed: u32,
    pub paused: u32,
    pub checkpoints: u32,
    pub limits: NodeLimits,
    pub templates: Vec<String>,
    pub revision: u64,
    pub lost: Vec<LostClaim>,
    pub runtime: String,
    pub version: String,
    pub started_at: DateTime<Utc>,
    pub disk_bytes: u64,
    pub usage: Vec<TemplateUsage>,
    /// host:port of the node's data plane (HTTP CONNECT into sandboxes).
    pub data_address: String,
    pub template_info: Vec<TemplateInfo>,
    /// What the runtime isolates, for people.
    pub boundary: String,
    /// Whether pause, snapshot and fork capture memory for some of the node's sandboxes (which
    /// ones: `PoolStatus::captures_memory`).
    pub captures_memory: bool,
    /// Templates being built now (and their aliases): claims for them are told to come back.
    pub templates_building: Vec<String>,
    /// Whether the node's runtime can build templates.
    pub builds: bool,
}

/// A template as a node describes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TemplateInfo {
    pub name: String,
    pub size_bytes: u64,
    pub packages: Vec<String>,
    pub kind: String,
    pub source: String,
    pub created_at: Option<DateTime<Utc>>,
    /// Other names the template answers to.
    pub aliases: Vec<String>,
    /// The size its sandboxes have when a create names none ("" = the smallest).
    pub size: String,
    /// The namespace of the team that built it through e2b ("" = every team's).
    pub owner: String,
    /// What its owner calls it: template id, alias, and `name:tag` for each tag naming it.
    pub e2b_names: Vec<String>,
    /// Other teams may start it too.
    pub public: bool,
    /// What it adds over the template it was built from.
    pub layer_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateUsage {
    pub template: String,
    pub claims: u64,
    pub last_claim: Option<DateTime<Utc>>,
}

impl NodeInfo {
    pub fn warm(&self, key: &PoolKey) -> u32 {
        self.pools
            .iter()
            .filter(|p| &p.key == key)
            .map(|p| p.warm)
            .sum()
    }
}

/// One change to a node's claimed sandboxes.
#[derive(Debug, Clone, PartialEq)]
pub enum InventoryChange {
    Added(SandboxRecord),
    Modified(SandboxRecord),
    Deleted(SandboxRecord),
    /// The initial snapshot is complete.
    Synced,
    /// The watcher fell behind: drop what is known of this node, a fresh snapshot follows.
    Reset,
}

#[derive(Debug, Clone, PartialEq)]
pub struct InventoryEvent {
    pub change: InventoryChange,
    pub revision: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_refs_split_into_namespace_and_name() {
        assert_eq!(split_claim_ref("team-a/box"), ("team-a", "box"));
        assert_eq!(split_claim_ref("box"), ("default", "box"));
        assert_eq!(split_claim_ref("/box"), ("default", "box"));
        assert_eq!(split_claim_ref("a/b/c"), ("a", "b/c"));
        assert!(validate_claim_ref(&"x".repeat(600)).is_err());
        assert!(validate_claim_ref("ns/a\nb").is_err());
    }

    #[test]
    fn on_timeout_spellings() {
        assert_eq!(OnTimeout::parse("").unwrap(), OnTimeout::Kill);
        assert_eq!(OnTimeout::parse("kill").unwrap(), OnTimeout::Kill);
        assert_eq!(OnTimeout::parse("pause").unwrap(), OnTimeout::Pause);
        assert!(OnTimeout::parse("Pause").is_err());
        assert_eq!(OnTimeout::Pause.as_str(), "pause");
    }
}
