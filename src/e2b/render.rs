//! From the dispatcher's records to the e2b wire shapes.

use super::E2b;
use super::error::ApiResult;
use super::wire;
use crate::agent::ENVD_VERSION;
use crate::model::{CheckpointRecord, SandboxRecord, SandboxStats, ids};

const MIB: u64 = 1024 * 1024;

pub fn ok_json<T: serde::Serialize>(
    status: actix_web::http::StatusCode,
    body: &T,
) -> actix_web::HttpResponse {
    actix_web::HttpResponse::build(status).json(body)
}

/// The id the e2b surface publishes: DNS-label safe, because the SDK builds
/// `{port}-{sandboxID}.{domain}` host names from it.
pub fn sandbox_id(record: &SandboxRecord) -> String {
    ids::dns_safe(&record.id)
}

/// What the sandbox was created from: a snapshot id, or the template name.
pub fn template_id(record: &SandboxRecord) -> String {
    record
        .from_checkpoint
        .clone()
        .unwrap_or_else(|| record.key.template.clone())
}

impl E2b {
    fn access_token(&self, record: &SandboxRecord) -> ApiResult<Option<String>> {
        if record.token.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.tokens.issue(&record.id, &record.token)?))
    }

    pub fn sandbox(&self, record: &SandboxRecord) -> ApiResult<wire::Sandbox> {
        Ok(wire::Sandbox {
            template_id: template_id(record),
            sandbox_id: sandbox_id(record),
            client_id: record.node.clone(),
            envd_version: ENVD_VERSION.to_string(),
            envd_access_token: self.access_token(record)?,
            traffic_access_token: self.traffic_token(record),
            domain: self.domain.clone(),
        })
    }

    /// Only for a sandbox whose ports are not public, and only where its node token is known.
    pub fn traffic_token(&self, record: &SandboxRecord) -> Option<String> {
        (!record.network.allow_public_traffic && !record.token.is_empty())
            .then(|| self.tokens.traffic(&record.id, &record.token))
    }

    pub fn detail(&self, record: &SandboxRecord) -> ApiResult<wire::SandboxDetail> {
        Ok(wire::SandboxDetail {
            listed: listed(record),
            envd_access_token: self.access_token(record)?,
            domain: self.domain.clone(),
            allow_internet_access: super::network::internet_access(record),
            network: super::network::info(record),
            paused_until: record.paused.map(|p| p.until),
            volume_mounts: record
                .volume_mounts
                .iter()
                .map(|m| wire::VolumeMount {
                    name: m.name.clone(),
                    path: m.path.clone(),
                })
                .collect(),
            pause_mode: record.pause_mode().map(crate::model::PauseMode::as_str),
            lifecycle: wire::Lifecycle {
                auto_resume: record.lifecycle.auto_resume,
                on_timeout: record.lifecycle.on_timeout.as_str(),
            },
        })
    }
}

pub fn listed(record: &SandboxRecord) -> wire::ListedSandbox {
    wire::ListedSandbox {
        template_id: template_id(record),
        sandbox_id: sandbox_id(record),
        client_id: record.node.clone(),
        started_at: record.claimed_at,
        // As on e2b, a paused sandbox's endAt is when it was paused (its lease does not run).
        end_at: record.paused.map(|p| p.at).unwrap_or(record.deadline),
        cpu_count: record.cpu_count,
        memory_mb: record.memory_bytes / MIB,
        disk_size_mb: record.disk_bytes / MIB,
        state: record.phase.as_str(),
        envd_version: ENVD_VERSION.to_string(),
        // The Kubernetes surface's bookkeeping (a kubectl apply's last-applied object, field
        // ownership) is not the sandbox's metadata.
        metadata: record
            .metadata
            .iter()
            .filter(|(k, _)| !crate::facade::stored::is_bookkeeping_key(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
}

pub fn metric(stats: &SandboxStats) -> wire::SandboxMetric {
    wire::SandboxMetric {
        timestamp: stats.measured_at,
        timestamp_unix: stats.measured_at.timestamp(),
        cpu_count: stats.cpu_count,
        cpu_used_pct: stats.cpu_used_pct,
        mem_used: stats.mem_used_bytes,
        mem_total: stats.mem_total_bytes,
        mem_cache: 0,
        disk_used: stats.disk_used_bytes,
        disk_total: stats.disk_total_bytes,
    }
}

/// A snapshot as its tenant sees it: the name without the `<namespace>/` stamp.
pub fn snapshot(ck: &CheckpointRecord, prefix: &str) -> wire::SnapshotInfo {
    let name = ck.name.strip_prefix(prefix).unwrap_or(&ck.name);
    wire::SnapshotInfo {
        snapshot_id: ck.id.clone(),
        names: if name.is_empty() {
            Vec::new()
        } else {
            vec![name.to_string()]
        },
    }
}
