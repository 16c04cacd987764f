//! Conversions between wire messages and domain records, and between gRPC status codes and
//! the shared error type (one code per kind, both ways; a full node disk shares
//! RESOURCE_EXHAUSTED with "no capacity" and is told apart by a status metadata entry).

use chrono::{DateTime, Utc};
use tonic::{Code, Status};

use crate::model::{self, Error, ErrorKind};

pub fn to_ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

pub fn from_ms(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::UNIX_EPOCH)
}

fn code_of(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::AlreadyExists => Code::AlreadyExists,
        ErrorKind::Invalid | ErrorKind::TooLarge => Code::InvalidArgument,
        ErrorKind::Conflict => Code::FailedPrecondition,
        ErrorKind::NoCapacity | ErrorKind::StorageFull => Code::ResourceExhausted,
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::OutcomeUnknown => Code::DeadlineExceeded,
        ErrorKind::Unauthenticated => Code::Unauthenticated,
        ErrorKind::Forbidden => Code::PermissionDenied,
        ErrorKind::Internal => Code::Internal,
    }
}

fn kind_of(code: Code) -> ErrorKind {
    match code {
        Code::NotFound => ErrorKind::NotFound,
        Code::AlreadyExists => ErrorKind::AlreadyExists,
        Code::InvalidArgument | Code::OutOfRange => ErrorKind::Invalid,
        Code::FailedPrecondition | Code::Aborted => ErrorKind::Conflict,
        Code::ResourceExhausted => ErrorKind::NoCapacity,
        Code::Unavailable => ErrorKind::Unavailable,
        Code::DeadlineExceeded | Code::Cancelled => ErrorKind::OutcomeUnknown,
        Code::Unauthenticated => ErrorKind::Unauthenticated,
        Code::PermissionDenied => ErrorKind::Forbidden,
        Code::Ok | Code::Unknown | Code::Internal | Code::Unimplemented | Code::DataLoss => {
            ErrorKind::Internal
        }
    }
}

/// Status metadata naming a kind more precisely than its code. gRPC has no code of its own for
/// "the disk is full": RESOURCE_EXHAUSTED is the standard one for it (and for quotas), which
/// this protocol already gives NoCapacity. Both mean "nothing was done; another node may
/// succeed", so they share the code and the entry refines it. A gateway that does not know the
/// entry still reads NoCapacity, which routes and answers (503, retry) correctly; a new code
/// from a spare one (DATA_LOSS, OUT_OF_RANGE) would be misread by it as a 500 or a 400.
const KIND_METADATA: &str = "x-sandbox-error-kind";
const STORAGE_FULL: &str = "storage-full";
/// INVALID_ARGUMENT refined: the request was over a size limit (413 rather than 400).
const TOO_LARGE: &str = "too-large";

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        let mut status = Status::new(code_of(e.kind), e.message);
        let refined = match e.kind {
            ErrorKind::StorageFull => Some(STORAGE_FULL),
            ErrorKind::TooLarge => Some(TOO_LARGE),
            _ => None,
        };
        if let Some(r) = refined {
            status.metadata_mut().insert(
                KIND_METADATA,
                tonic::metadata::MetadataValue::from_static(r),
            );
        }
        status
    }
}

/// The error a status a node sent stands for. Transport failures are classified by the caller,
/// which knows whether the request could have reached the node.
pub fn error_from_status(status: &Status) -> Error {
    let refined = status
        .metadata()
        .get(KIND_METADATA)
        .and_then(|v| v.to_str().ok());
    let kind = match (status.code(), refined) {
        (Code::ResourceExhausted, Some(STORAGE_FULL)) => ErrorKind::StorageFull,
        (Code::InvalidArgument, Some(TOO_LARGE)) => ErrorKind::TooLarge,
        (code, _) => kind_of(code),
    };
    Error::new(kind, status.message().to_string())
}

impl From<&model::PoolKey> for super::PoolKey {
    fn from(k: &model::PoolKey) -> Self {
        super::PoolKey {
            template: k.template.clone(),
            net: k.net.clone(),
            size: k.size.clone(),
        }
    }
}

impl super::PoolKey {
    /// Validates and normalizes a key received from a caller.
    pub fn to_model(&self) -> model::Result<model::PoolKey> {
        model::PoolKey::new(&self.template, &self.net, &self.size)
    }

    /// Takes a key a node reported as it is (the node validated it when it created it).
    pub fn to_model_unchecked(&self) -> model::PoolKey {
        model::PoolKey {
            template: self.template.clone(),
            net: self.net.clone(),
            size: self.size.clone(),
        }
    }
}

fn phase_to_wire(p: model::Phase) -> super::Phase {
    match p {
        model::Phase::Running => super::Phase::Running,
        model::Phase::Paused => super::Phase::Paused,
    }
}

fn phase_from_wire(p: i32) -> model::Phase {
    match super::Phase::try_from(p) {
        Ok(super::Phase::Paused) => model::Phase::Paused,
        _ => model::Phase::Running,
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

impl From<&model::SandboxRecord> for super::Sandbox {
    fn from(r: &model::SandboxRecord) -> Self {
        super::Sandbox {
            id: r.id.clone(),
            token: r.token.clone(),
            key: Some((&r.key).into()),
            claim_ref: r.claim_ref.clone(),
            claimed_at_ms: to_ms(r.claimed_at),
            deadline_ms: to_ms(r.deadline),
            phase: phase_to_wire(r.phase) as i32,
            address: r.address.clone(),
            metadata: r
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            env_vars: r
                .env_vars
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            from_checkpoint: r.from_checkpoint.clone().unwrap_or_default(),
            forked_from: r.forked_from.clone().unwrap_or_default(),
            node: r.node.clone(),
            cpu_count: r.cpu_count,
            memory_bytes: r.memory_bytes,
            state_dir: r.state_dir.clone(),
            disk_bytes: r.disk_bytes,
            on_timeout: r.lifecycle.on_timeout.as_str().to_string(),
            auto_resume: r.lifecycle.auto_resume,
            lease_seconds: r.lease_seconds,
            paused_at_ms: r.paused.map(|p| to_ms(p.at)).unwrap_or(0),
            retain_until_ms: r.paused.map(|p| to_ms(p.until)).unwrap_or(0),
            network: Some((&r.network).into()),
            volume_mounts: r.volume_mounts.iter().map(Into::into).collect(),
            inventory_revision: 0,
            pause_mode: r
                .pause_mode()
                .map(|m| m.as_str().to_string())
                .unwrap_or_default(),
            auto_pause_mode: r.lifecycle.pause_mode.as_str().to_string(),
        }
    }
}

impl From<super::Sandbox> for model::SandboxRecord {
    fn from(s: super::Sandbox) -> Self {
        model::SandboxRecord {
            key: s
                .key
                .as_ref()
                .map(|k| k.to_model_unchecked())
                .unwrap_or_else(|| model::PoolKey {
                    template: String::new(),
                    net: String::new(),
                    size: String::new(),
                }),
            claimed_at: from_ms(s.claimed_at_ms),
            deadline: from_ms(s.deadline_ms),
            phase: phase_from_wire(s.phase),
            metadata: s.metadata.into_iter().collect(),
            env_vars: s.env_vars.into_iter().collect(),
            from_checkpoint: non_empty(&s.from_checkpoint),
            forked_from: non_empty(&s.forked_from),
            id: s.id,
            token: s.token,
            claim_ref: s.claim_ref,
            address: s.address,
            node: s.node,
            cpu_count: s.cpu_count,
            memory_bytes: s.memory_bytes,
            state_dir: s.state_dir,
            disk_bytes: s.disk_bytes,
            // A node sends what it stored; an unknown spelling (a newer node) reads as kill.
            lifecycle: model::Lifecycle {
                on_timeout: model::OnTimeout::parse(&s.on_timeout).unwrap_or_default(),
                auto_resume: s.auto_resume,
                pause_mode: model::PauseMode::parse(&s.auto_pause_mode).unwrap_or_default(),
            },
            lease_seconds: s.lease_seconds,
            paused: (s.paused_at_ms != 0).then(|| model::PausedSince {
                at: from_ms(s.paused_at_ms),
                until: from_ms(s.retain_until_ms),
                // An older node does not say: its pauses keep memory.
                mode: model::PauseMode::parse(&s.pause_mode).unwrap_or_default(),
            }),
            network: s.network.map(Into::into).unwrap_or_default(),
            volume_mounts: s.volume_mounts.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<&model::VolumeMount> for super::VolumeMount {
    fn from(m: &model::VolumeMount) -> Self {
        super::VolumeMount {
            name: m.name.clone(),
            path: m.path.clone(),
            source: m.source.clone(),
        }
    }
}

impl From<super::VolumeMount> for model::VolumeMount {
    fn from(m: super::VolumeMount) -> Self {
        model::VolumeMount {
            name: m.name,
            path: m.path,
            source: m.source,
        }
    }
}

impl From<&model::CheckpointRecord> for super::Checkpoint {
    fn from(c: &model::CheckpointRecord) -> Self {
        super::Checkpoint {
            id: c.id.clone(),
            name: c.name.clone(),
            sandbox_id: c.sandbox_id.clone(),
            key: Some((&c.key).into()),
            created_at_ms: to_ms(c.created_at),
            size_bytes: c.size_bytes,
            node: c.node.clone(),
        }
    }
}

impl From<super::Checkpoint> for model::CheckpointRecord {
    fn from(c: super::Checkpoint) -> Self {
        model::CheckpointRecord {
            key: c
                .key
                .as_ref()
                .map(|k| k.to_model_unchecked())
                .unwrap_or_else(model::PoolKey::base),
            created_at: from_ms(c.created_at_ms),
            id: c.id,
            name: c.name,
            sandbox_id: c.sandbox_id,
            size_bytes: c.size_bytes,
            node: c.node,
            template_id: String::new(),
        }
    }
}

impl From<&model::SandboxStats> for super::SandboxStats {
    fn from(s: &model::SandboxStats) -> Self {
        super::SandboxStats {
            id: s.id.clone(),
            cpu_count: s.cpu_count,
            cpu_used_pct: s.cpu_used_pct,
            mem_used_bytes: s.mem_used_bytes,
            mem_total_bytes: s.mem_total_bytes,
            mem_used_measured: s.mem_used_measured,
            disk_used_bytes: s.disk_used_bytes,
            disk_total_bytes: s.disk_total_bytes,
            measured_at_ms: to_ms(s.measured_at),
            phase: phase_to_wire(s.phase) as i32,
            process_count: s.process_count,
        }
    }
}

impl From<super::SandboxStats> for model::SandboxStats {
    fn from(s: super::SandboxStats) -> Self {
        model::SandboxStats {
            cpu_count: s.cpu_count,
            cpu_used_pct: s.cpu_used_pct,
            mem_used_bytes: s.mem_used_bytes,
            mem_total_bytes: s.mem_total_bytes,
            mem_used_measured: s.mem_used_measured,
            disk_used_bytes: s.disk_used_bytes,
            disk_total_bytes: s.disk_total_bytes,
            measured_at: from_ms(s.measured_at_ms),
            phase: phase_from_wire(s.phase),
            process_count: s.process_count,
            id: s.id,
        }
    }
}

impl From<&model::NodeInfo> for super::NodeInfo {
    fn from(i: &model::NodeInfo) -> Self {
        super::NodeInfo {
            name: i.name.clone(),
            advertise_address: i.advertise_address.clone(),
            pools: i
                .pools
                .iter()
                .map(|p| super::PoolStatus {
                    key: Some((&p.key).into()),
                    warm: p.warm,
                    target: p.target,
                    booting: p.booting,
                    captures_memory: p.captures_memory,
                })
                .collect(),
            claimed: i.claimed,
            paused: i.paused,
            checkpoints: i.checkpoints,
            limits: Some(super::Limits {
                lease_default_seconds: i.limits.lease_default_seconds,
                lease_max_seconds: i.limits.lease_max_seconds,
                fork_limit: i.limits.fork_limit,
                max_sandboxes: i.limits.max_sandboxes,
                cold_start: i.limits.cold_start,
                paused_retention_seconds: i.limits.paused_retention_seconds,
            }),
            templates: i.templates.clone(),
            revision: i.revision,
            lost: i
                .lost
                .iter()
                .map(|l| super::LostClaim {
                    id: l.id.clone(),
                    claim_ref: l.claim_ref.clone(),
                    reason: l.reason.clone(),
                    lost_at_ms: to_ms(l.lost_at),
                })
                .collect(),
            runtime: i.runtime.clone(),
            version: i.version.clone(),
            started_at_ms: to_ms(i.started_at),
            disk_bytes: i.disk_bytes,
            data_address: i.data_address.clone(),
            template_info: i
                .template_info
                .iter()
                .map(|t| super::TemplateInfo {
                    name: t.name.clone(),
                    size_bytes: t.size_bytes,
                    packages: t.packages.clone(),
                    kind: t.kind.clone(),
                    source: t.source.clone(),
                    created_at_ms: t.created_at.map(to_ms).unwrap_or(0),
                    aliases: t.aliases.clone(),
                    owner: t.owner.clone(),
                    e2b_names: t.e2b_names.clone(),
                    public: t.public,
                    layer_bytes: t.layer_bytes,
                    size: t.size.clone(),
                })
                .collect(),
            boundary: i.boundary.clone(),
            captures_memory: i.captures_memory,
            templates_building: i.templates_building.clone(),
            builds: i.builds,
            usage: i
                .usage
                .iter()
                .map(|u| super::TemplateUsage {
                    template: u.template.clone(),
                    claims: u.claims,
                    last_claim_ms: u.last_claim.map(to_ms).unwrap_or(0),
                })
                .collect(),
        }
    }
}

impl From<super::NodeInfo> for model::NodeInfo {
    fn from(i: super::NodeInfo) -> Self {
        let limits = i.limits.unwrap_or_default();
        model::NodeInfo {
            pools: i
                .pools
                .into_iter()
                .filter_map(|p| {
                    Some(model::PoolStatus {
                        key: p.key?.to_model_unchecked(),
                        warm: p.warm,
                        target: p.target,
                        booting: p.booting,
                        captures_memory: p.captures_memory,
                    })
                })
                .collect(),
            limits: model::NodeLimits {
                lease_default_seconds: limits.lease_default_seconds,
                lease_max_seconds: limits.lease_max_seconds,
                fork_limit: limits.fork_limit,
                max_sandboxes: limits.max_sandboxes,
                cold_start: limits.cold_start,
                paused_retention_seconds: limits.paused_retention_seconds,
            },
            lost: i
                .lost
                .into_iter()
                .map(|l| model::LostClaim {
                    lost_at: from_ms(l.lost_at_ms),
                    id: l.id,
                    claim_ref: l.claim_ref,
                    reason: l.reason,
                })
                .collect(),
            started_at: from_ms(i.started_at_ms),
            disk_bytes: i.disk_bytes,
            data_address: i.data_address,
            template_info: i
                .template_info
                .into_iter()
                .map(|t| model::TemplateInfo {
                    created_at: (t.created_at_ms != 0).then(|| from_ms(t.created_at_ms)),
                    name: t.name,
                    size_bytes: t.size_bytes,
                    packages: t.packages,
                    kind: t.kind,
                    source: t.source,
                    aliases: t.aliases,
                    size: t.size,
                    owner: t.owner,
                    e2b_names: t.e2b_names,
                    public: t.public,
                    layer_bytes: t.layer_bytes,
                })
                .collect(),
            boundary: i.boundary,
            captures_memory: i.captures_memory,
            templates_building: i.templates_building,
            builds: i.builds,
            usage: i
                .usage
                .into_iter()
                .map(|u| model::TemplateUsage {
                    last_claim: (u.last_claim_ms != 0).then(|| from_ms(u.last_claim_ms)),
                    template: u.template,
                    claims: u.claims,
                })
                .collect(),
            name: i.name,
            advertise_address: i.advertise_address,
            claimed: i.claimed,
            paused: i.paused,
            checkpoints: i.checkpoints,
            templates: i.templates,
            revision: i.revision,
            runtime: i.runtime,
            version: i.version,
        }
    }
}

impl From<&model::InventoryEvent> for super::InventoryEvent {
    fn from(e: &model::InventoryEvent) -> Self {
        use super::EventType as T;
        use model::InventoryChange as C;
        let (ty, sandbox) = match &e.change {
            C::Added(r) => (T::Added, Some(r)),
            C::Modified(r) => (T::Modified, Some(r)),
            C::Deleted(r) => (T::Deleted, Some(r)),
            C::Synced => (T::Synced, None),
            C::Reset => (T::Reset, None),
        };
        super::InventoryEvent {
            r#type: ty as i32,
            sandbox: sandbox.map(|r| r.into()),
            revision: e.revision,
        }
    }
}

impl TryFrom<super::InventoryEvent> for model::InventoryEvent {
    type Error = Error;
    fn try_from(e: super::InventoryEvent) -> model::Result<Self> {
        use super::EventType as T;
        use model::InventoryChange as C;
        let record = |s: Option<super::Sandbox>| {
            s.map(model::SandboxRecord::from)
                .ok_or_else(|| Error::internal("inventory event without a sandbox"))
        };
        let change = match T::try_from(e.r#type) {
            Ok(T::Added) => C::Added(record(e.sandbox)?),
            Ok(T::Modified) => C::Modified(record(e.sandbox)?),
            Ok(T::Deleted) => C::Deleted(record(e.sandbox)?),
            Ok(T::Synced) => C::Synced,
            Ok(T::Reset) => C::Reset,
            Ok(T::Unspecified) | Err(_) => {
                return Err(Error::internal(format!(
                    "unknown inventory event type {}",
                    e.r#type
                )));
            }
        };
        Ok(model::InventoryEvent {
            change,
            revision: e.revision,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_survives_the_wire() {
        for kind in [
            ErrorKind::NotFound,
            ErrorKind::AlreadyExists,
            ErrorKind::Invalid,
            ErrorKind::Conflict,
            ErrorKind::NoCapacity,
            ErrorKind::Unavailable,
            ErrorKind::OutcomeUnknown,
            ErrorKind::StorageFull,
            ErrorKind::TooLarge,
            ErrorKind::Unauthenticated,
            ErrorKind::Forbidden,
            ErrorKind::Internal,
        ] {
            let status: Status = Error::new(kind, "m").into();
            let back = error_from_status(&status);
            assert_eq!(back.kind, kind);
            assert_eq!(back.message, "m");
        }
    }

    #[test]
    fn a_full_disk_crosses_the_wire_as_resource_exhausted_with_its_marker() {
        let status: Status = Error::storage_full("data directory is full").into();
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(
            status
                .metadata()
                .get(KIND_METADATA)
                .and_then(|v| v.to_str().ok()),
            Some(STORAGE_FULL)
        );
        // Through the real HTTP/2 trailer encoding and back, as a gateway receives it.
        let wire = status.into_http::<()>();
        let back = error_from_status(&Status::from_header_map(wire.headers()).unwrap());
        assert_eq!(back.kind, ErrorKind::StorageFull);
        assert_eq!(back.message, "data directory is full");
        // No capacity carries no marker, and a marker on another code is ignored.
        let busy: Status = Error::no_capacity("busy").into();
        assert!(busy.metadata().get(KIND_METADATA).is_none());
        let mut odd = Status::internal("x");
        odd.metadata_mut().insert(
            KIND_METADATA,
            tonic::metadata::MetadataValue::from_static(STORAGE_FULL),
        );
        assert_eq!(error_from_status(&odd).kind, ErrorKind::Internal);
    }
}

impl super::LogsRequest {
    /// The query a request asks (its level checked).
    pub fn to_query(&self) -> model::Result<model::logs::LogQuery> {
        Ok(model::logs::LogQuery {
            cursor: (self.cursor_ms != 0).then(|| from_ms(self.cursor_ms)),
            limit: if self.limit == 0 {
                model::logs::MAX_LIMIT
            } else {
                self.limit
            },
            forward: !self.backward,
            min_level: non_empty(&self.min_level)
                .map(|l| model::logs::LogLevel::parse(&l))
                .transpose()?,
            search: non_empty(&self.search),
        })
    }

    pub fn from_query(id: &str, q: &model::logs::LogQuery) -> Self {
        super::LogsRequest {
            id: id.to_string(),
            cursor_ms: q.cursor.map(to_ms).unwrap_or(0),
            limit: q.limit,
            backward: !q.forward,
            min_level: q
                .min_level
                .map(|l| l.as_str().to_string())
                .unwrap_or_default(),
            search: q.search.clone().unwrap_or_default(),
        }
    }
}

impl From<&model::logs::LogEntry> for super::LogEntry {
    fn from(e: &model::logs::LogEntry) -> Self {
        super::LogEntry {
            at_ms: to_ms(e.at),
            level: e.level.as_str().to_string(),
            message: e.message.clone(),
            fields: e
                .fields
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }
}

impl From<super::LogEntry> for model::logs::LogEntry {
    fn from(e: super::LogEntry) -> Self {
        model::logs::LogEntry {
            at: from_ms(e.at_ms),
            level: model::logs::LogLevel::parse(&e.level).unwrap_or(model::logs::LogLevel::Info),
            message: e.message,
            fields: e.fields.into_iter().collect(),
        }
    }
}

impl From<&model::network::NetworkPolicy> for super::NetworkPolicy {
    fn from(n: &model::network::NetworkPolicy) -> Self {
        super::NetworkPolicy {
            allow_out: n.allow_out.clone(),
            deny_out: n.deny_out.clone(),
            allow_internet_access: n.allow_internet_access,
            private_traffic: !n.allow_public_traffic,
            mask_request_host: n.mask_request_host.clone(),
            dns_servers: n.dns_servers.clone().unwrap_or_default(),
            dns_servers_set: n.dns_servers.is_some(),
            rules: n
                .rules
                .iter()
                .map(|(host, rules)| {
                    let rules = rules
                        .iter()
                        .map(|r| super::HostRule {
                            has_transform: r.transform.is_some(),
                            headers: r
                                .transform
                                .as_ref()
                                .map(|t| t.headers.clone().into_iter().collect())
                                .unwrap_or_default(),
                        })
                        .collect();
                    (host.clone(), super::HostRules { rules })
                })
                .collect(),
        }
    }
}

impl From<super::NetworkPolicy> for model::network::NetworkPolicy {
    fn from(n: super::NetworkPolicy) -> Self {
        model::network::NetworkPolicy {
            allow_out: n.allow_out,
            deny_out: n.deny_out,
            allow_internet_access: n.allow_internet_access,
            allow_public_traffic: !n.private_traffic,
            mask_request_host: n.mask_request_host,
            dns_servers: n.dns_servers_set.then_some(n.dns_servers),
            rules: n
                .rules
                .into_iter()
                .map(|(host, rules)| {
                    let rules = rules
                        .rules
                        .into_iter()
                        .map(|r| model::transforms::Rule {
                            transform: r.has_transform.then(|| model::transforms::Transform {
                                headers: r.headers.into_iter().collect(),
                            }),
                        })
                        .collect();
                    (host, rules)
                })
                .collect(),
        }
    }
}
