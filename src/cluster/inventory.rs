//! The NodeInventory object: one per node, cluster-scoped, in its own API group (the
//! APIService owns all of `agents.x-k8s.io/v1beta1`, so a CRD cannot live there). It holds
//! the node's address, pools and claimed sandboxes; gateways discover nodes from it and, in
//! cluster mode, build unpinned lists from its entries.

use std::borrow::Cow;
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::model::{NodeInfo, Phase, PoolKey, SandboxRecord, split_claim_ref};

pub const GROUP: &str = "extensions.agents.x-k8s.io";
pub const VERSION: &str = "v1beta1";
pub const KIND: &str = "NodeInventory";
pub const PLURAL: &str = "nodeinventories";
pub const API_VERSION: &str = "extensions.agents.x-k8s.io/v1beta1";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInventory {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    /// The node's name (also the object's name).
    #[serde(default)]
    pub node: String,
    /// Where gateways reach the node's gRPC API (`host:port`).
    #[serde(default)]
    pub address: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolCapacity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entries: Vec<InventoryEntry>,
    /// Disk each sandbox on the node can use.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub disk_bytes: u64,
    /// Where the node's data plane is (HTTP CONNECT into its sandboxes).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub data_address: String,
    /// The runtime and what it isolates.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub runtime: String,
    /// Whether pause, snapshot and fork capture sandboxes' memory on this node.
    #[serde(default)]
    pub captures_memory: bool,
    /// The templates the node can start sandboxes from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub templates: Vec<TemplateEntry>,
    /// When the node took this snapshot. An object without it never goes stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_at: Option<DateTime<Utc>>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A template as a node advertises it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateEntry {
    pub name: String,
    #[serde(default)]
    pub size_bytes: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
    #[serde(default)]
    pub kind: String,
    /// The namespace whose team built it through e2b (none for the node's own).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
    /// What its owner calls it: template id, alias, `alias:tag`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
}

impl TemplateEntry {
    pub fn of(t: &crate::model::TemplateInfo) -> Self {
        TemplateEntry {
            name: t.name.clone(),
            size_bytes: t.size_bytes,
            packages: t.packages.clone(),
            kind: t.kind.clone(),
            owner: t.owner.clone(),
            names: t.e2b_names.clone(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolCapacity {
    pub template: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub net: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub size: String,
    pub warm: u32,
    pub target: u32,
    /// Whether snapshots and forks of these sandboxes hold their memory.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub captures_memory: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InventoryEntry {
    /// `<namespace>/<name>`, or the claim id for a claim that named nothing.
    pub name: String,
    pub id: String,
    /// `Running` or `Paused`.
    pub phase: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub claim_ref: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub addr: String,
    pub deadline: DateTime<Utc>,
    pub template: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub net: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub size: String,
    pub claimed_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_checkpoint: Option<String>,
}

impl kube::Resource for NodeInventory {
    type DynamicType = ();
    type Scope = kube::core::ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        KIND.into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl InventoryEntry {
    pub fn from_record(r: &SandboxRecord) -> Self {
        InventoryEntry {
            name: if r.claim_ref.is_empty() {
                r.id.clone()
            } else {
                r.claim_ref.clone()
            },
            id: r.id.clone(),
            phase: r.phase.title().to_string(),
            claim_ref: r.claim_ref.clone(),
            addr: r.address.clone(),
            deadline: r.deadline,
            template: r.key.template.clone(),
            net: r.key.net.clone(),
            size: r.key.size.clone(),
            claimed_at: r.claimed_at,
            metadata: r.metadata.clone(),
            forked_from: r.forked_from.clone(),
            from_checkpoint: r.from_checkpoint.clone(),
        }
    }

    /// The record a list shows for this entry; what the object does not carry (token,
    /// environment, state directory) stays empty. `None` for an entry no node could write.
    pub fn to_record(&self, node: &str, disk_bytes: u64) -> Option<SandboxRecord> {
        if self.id.is_empty() {
            return None;
        }
        let key = PoolKey::new(
            &self.template,
            or_default(&self.net, crate::model::pool::DEFAULT_NET),
            or_default(&self.size, crate::model::pool::DEFAULT_SIZE),
        )
        .ok()?;
        let tier = key.tier();
        let phase = match self.phase.as_str() {
            "Paused" | "Hibernated" => Phase::Paused,
            _ => Phase::Running,
        };
        let claim_ref = if self.claim_ref.is_empty() && self.name != self.id {
            // An entry written with a name but no claim ref: unqualified names are `default`.
            let (ns, name) = split_claim_ref(&self.name);
            crate::model::claim_ref(ns, name)
        } else {
            self.claim_ref.clone()
        };
        Some(SandboxRecord {
            id: self.id.clone(),
            token: String::new(),
            key,
            claim_ref,
            claimed_at: self.claimed_at,
            deadline: self.deadline,
            phase,
            address: self.addr.clone(),
            metadata: self.metadata.clone(),
            env_vars: BTreeMap::new(),
            from_checkpoint: self.from_checkpoint.clone(),
            forked_from: self.forked_from.clone(),
            node: node.to_string(),
            cpu_count: tier.cpu_count,
            memory_bytes: tier.memory_bytes,
            state_dir: String::new(),
            disk_bytes,
            // The published entry does not carry the lifecycle; Get asks the node for it.
            lifecycle: Default::default(),
            lease_seconds: 0,
            paused: None,
            network: Default::default(),
            volume_mounts: Vec::new(),
        })
    }
}

fn or_default<'a>(s: &'a str, default: &'a str) -> &'a str {
    if s.is_empty() { default } else { s }
}

impl NodeInventory {
    /// The object a node publishes: its info and claimed sandboxes, entries sorted by name.
    pub fn snapshot(info: &NodeInfo, sandboxes: &[SandboxRecord], at: DateTime<Utc>) -> Self {
        let mut entries: Vec<InventoryEntry> =
            sandboxes.iter().map(InventoryEntry::from_record).collect();
        entries.sort_by(|a, b| a.name.cmp(&b.name).then_with(|| a.id.cmp(&b.id)));
        NodeInventory {
            api_version: API_VERSION.to_string(),
            kind: KIND.to_string(),
            metadata: ObjectMeta {
                name: Some(info.name.clone()),
                ..ObjectMeta::default()
            },
            node: info.name.clone(),
            address: info.advertise_address.clone(),
            pools: info
                .pools
                .iter()
                .map(|p| PoolCapacity {
                    template: p.key.template.clone(),
                    net: p.key.net.clone(),
                    size: p.key.size.clone(),
                    warm: p.warm,
                    target: p.target,
                    captures_memory: p.captures_memory,
                })
                .collect(),
            entries,
            disk_bytes: info.disk_bytes,
            data_address: info.data_address.clone(),
            runtime: info.runtime.clone(),
            captures_memory: info.captures_memory,
            templates: info.template_info.iter().map(TemplateEntry::of).collect(),
            published_at: Some(at),
        }
    }

    /// The node's name: the `node` field, else the object's name.
    pub fn node_name(&self) -> &str {
        if self.node.is_empty() {
            self.metadata.name.as_deref().unwrap_or_default()
        } else {
            &self.node
        }
    }

    /// The sandboxes the object lists, as records of `node`; entries no node could have
    /// written are skipped.
    pub fn records(&self) -> Vec<SandboxRecord> {
        let node = self.node_name();
        self.entries
            .iter()
            .filter_map(|e| e.to_record(node, self.disk_bytes))
            .collect()
    }

    /// True when the object was published longer than `bound` ago (never for an object
    /// without a publish time).
    pub fn is_stale(&self, now: DateTime<Utc>, bound: std::time::Duration) -> bool {
        published_long_ago(self.published_at, now, bound)
    }
}

/// True for a publish time older than `bound` at `now`; never without a publish time.
pub fn published_long_ago(
    published_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    bound: std::time::Duration,
) -> bool {
    let Some(at) = published_at else {
        return false;
    };
    let bound = chrono::Duration::from_std(bound).unwrap_or(chrono::Duration::MAX);
    now.signed_duration_since(at) > bound
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    fn record(id: &str, claim_ref: &str) -> SandboxRecord {
        SandboxRecord {
            id: id.into(),
            token: "secret".into(),
            key: PoolKey::new("base", "egress", "small").unwrap(),
            claim_ref: claim_ref.into(),
            claimed_at: DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
            deadline: DateTime::from_timestamp(1_700_000_300, 0).unwrap(),
            phase: Phase::Paused,
            address: "127.0.0.1:4000".into(),
            metadata: BTreeMap::from([("k".into(), "v".into())]),
            env_vars: BTreeMap::from([("SECRET".into(), "x".into())]),
            from_checkpoint: None,
            forked_from: Some("sb_0000000000000001".into()),
            node: "n1".into(),
            cpu_count: 1,
            memory_bytes: 512 << 20,
            state_dir: "/var/lib/x".into(),
            disk_bytes: 10,
            lifecycle: Default::default(),
            lease_seconds: 0,
            paused: None,
            network: Default::default(),
            volume_mounts: Vec::new(),
        }
    }

    #[test]
    fn entries_round_trip_without_secrets() {
        let r = record("sb_00000000000000aa", "team-a/box");
        let e = InventoryEntry::from_record(&r);
        assert_eq!(e.name, "team-a/box");
        assert_eq!(e.phase, "Paused");
        let back = e.to_record("n1", 10).unwrap();
        assert_eq!(back.token, "");
        assert!(back.env_vars.is_empty());
        assert_eq!(back.state_dir, "");
        let expected = SandboxRecord {
            token: String::new(),
            env_vars: BTreeMap::new(),
            state_dir: String::new(),
            ..r
        };
        assert_eq!(back, expected);
        // A claim that named nothing is listed by its id.
        let bare = InventoryEntry::from_record(&record("sb_00000000000000bb", ""));
        assert_eq!(bare.name, "sb_00000000000000bb");
        assert_eq!(bare.to_record("n1", 0).unwrap().claim_ref, "");
    }

    #[test]
    fn built_templates_are_published_with_their_owner_and_names() {
        let base = TemplateEntry::of(&crate::model::TemplateInfo {
            name: "base".into(),
            ..Default::default()
        });
        let built = TemplateEntry::of(&crate::model::TemplateInfo {
            name: "k3x.6f1c2b8e".into(),
            kind: "built".into(),
            owner: "team-a".into(),
            e2b_names: vec!["k3x".into(), "my-env".into(), "my-env:default".into()],
            ..Default::default()
        });
        let json = serde_json::to_value([&base, &built]).unwrap();
        assert_eq!(
            json[0],
            serde_json::json!({"name": "base", "sizeBytes": 0, "kind": ""})
        );
        assert_eq!(json[1]["owner"], "team-a");
        assert_eq!(json[1]["names"][1], "my-env");
        let back: Vec<TemplateEntry> = serde_json::from_value(json).unwrap();
        assert_eq!(back, [base, built]);
    }

    #[test]
    fn the_object_names_its_api_and_goes_stale() {
        assert_eq!(NodeInventory::api_version(&()), API_VERSION);
        assert_eq!(
            NodeInventory::url_path(&(), None),
            format!("/apis/{API_VERSION}/nodeinventories")
        );
        let mut inv = NodeInventory::default();
        let now = Utc::now();
        assert!(!inv.is_stale(now, std::time::Duration::from_secs(90)));
        inv.published_at = Some(now - chrono::Duration::seconds(91));
        assert!(inv.is_stale(now, std::time::Duration::from_secs(90)));
        inv.published_at = Some(now - chrono::Duration::seconds(10));
        assert!(!inv.is_stale(now, std::time::Duration::from_secs(90)));
    }

    #[test]
    fn odd_entries_are_skipped_or_defaulted() {
        let json = serde_json::json!({
            "apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "n2"},
            "address": "10.0.0.2:7777",
            "entries": [
                {"name": "box", "id": "sb_00000000000000cc", "phase": "Hibernated",
                 "deadline": "2030-01-01T00:00:00Z", "template": "base", "claimedAt": "2029-01-01T00:00:00Z"},
                {"name": "pending", "id": "", "phase": "Running",
                 "deadline": "2030-01-01T00:00:00Z", "template": "base", "claimedAt": "2029-01-01T00:00:00Z"},
                {"name": "bad", "id": "sb_00000000000000dd", "phase": "Running",
                 "deadline": "2030-01-01T00:00:00Z", "template": "Not A Template!", "claimedAt": "2029-01-01T00:00:00Z"}
            ]
        });
        let inv: NodeInventory = serde_json::from_value(json).unwrap();
        assert_eq!(inv.node_name(), "n2");
        let records = inv.records();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].claim_ref, "default/box");
        assert_eq!(records[0].phase, Phase::Paused);
        assert_eq!(records[0].key.net, "none");
        assert_eq!(records[0].node, "n2");
    }
}
