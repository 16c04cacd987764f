//! The dispatcher: the only code that knows nodes exist. It finds nodes, routes claims,
//! resolves a sandbox to its owning node, and keeps the merged read view. Both surfaces share
//! one instance.

pub mod builds;
mod catch_up;
mod changes;
mod checkpoints;
pub mod client;
mod fleet;
pub mod forms;
pub mod owner_index;
pub mod read_view;
pub mod registry;
mod routing;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use client::Effect;
use owner_index::OwnerIndex;
use read_view::{LocalChange, ReadView};
use registry::{NodeHandle, Registry};

use crate::model::{
    self, CheckpointRecord, Error, ErrorKind, NodeInfo, PoolKey, Result, SandboxRecord,
    SandboxStats, ids,
};
use crate::proto;

/// How long a list waits for the read view to reach what a live read saw. A node's stream
/// delivers within milliseconds; this bounds a list when a stream is resyncing or stuck.
const CATCH_UP: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    /// Per-node deadline when looking a sandbox up on every node.
    pub lookup_timeout: Duration,
    /// Deadline for asking the node known to own a sandbox: longer than a fan-out's, since
    /// no other node can answer and a busy node is not a missing sandbox.
    pub owner_timeout: Duration,
    /// Deadline for short node calls (release, renew, stats).
    pub call_timeout: Duration,
    /// Deadline for a claim; a cold start boots an instance within it.
    pub claim_timeout: Duration,
    /// Deadline for calls that copy a sandbox's state (pause, resume, fork, checkpoint, branch).
    pub capture_timeout: Duration,
    /// Nodes asked at once when fanning out.
    pub fanout_concurrency: usize,
    /// How often each node is asked for its info (pools, health).
    pub info_interval: Duration,
    /// A node whose inventory stream has been gone this long leaves the read view.
    pub stale_after: Duration,
    pub owner_index_capacity: u64,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        DispatcherConfig {
            lookup_timeout: Duration::from_millis(500),
            owner_timeout: Duration::from_secs(3),
            call_timeout: Duration::from_secs(10),
            claim_timeout: Duration::from_secs(30),
            capture_timeout: Duration::from_secs(600),
            fanout_concurrency: 32,
            info_interval: Duration::from_secs(1),
            stale_after: Duration::from_secs(90),
            owner_index_capacity: 200_000,
        }
    }
}

/// Where the read view learns a node's sandboxes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewFeed {
    /// The node's change stream: every replica sees a change within milliseconds.
    Stream,
    /// The NodeInventory snapshots the node publishes (cluster mode): the publish cadence
    /// bounds the lag, and the gateway holds no stream per node.
    Inventory,
}

/// A claim as a surface asks for it.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub namespace: String,
    /// Empty when the caller names nothing (the claim is then known by its id).
    pub name: String,
    pub key: PoolKey,
    pub ttl_seconds: u64,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    pub lifecycle: model::Lifecycle,
    pub network: model::network::NetworkPolicy,
    /// Volumes to mount (their sources on the nodes' shared volumes directory).
    pub volume_mounts: Vec<model::VolumeMount>,
}

impl ClaimRequest {
    fn claim_ref(&self) -> String {
        if self.name.is_empty() {
            String::new()
        } else {
            model::claim_ref(&self.namespace, &self.name)
        }
    }
}

#[derive(Debug, Clone)]
pub struct Claimed {
    /// The claimed sandbox, with its token.
    pub record: SandboxRecord,
    /// True when a warm instance was handed over.
    pub warm: bool,
}

#[derive(Debug, Clone)]
pub struct NodeSummary {
    pub address: String,
    pub up: bool,
    pub info: Option<NodeInfo>,
}

#[derive(Debug, Clone, Default)]
pub struct CheckpointListing {
    pub checkpoints: Vec<CheckpointRecord>,
    /// Nodes that did not answer; their checkpoints are missing from the listing.
    pub unreachable: Vec<String>,
}

struct Inner {
    cfg: DispatcherConfig,
    token: String,
    registry: Registry,
    owners: OwnerIndex,
    view: ReadView,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

#[derive(Clone)]
pub struct Dispatcher {
    inner: Arc<Inner>,
}

fn not_found(id: &str) -> Error {
    Error::not_found(format!("sandbox {id:?} not found"))
}

fn in_scope(record: &SandboxRecord, namespace: Option<&str>) -> bool {
    claim_in_scope(&record.claim_ref, namespace)
}

/// Whether a claim ref (`namespace/name`) is in `namespace` (None: every namespace).
fn claim_in_scope(claim_ref: &str, namespace: Option<&str>) -> bool {
    namespace.is_none_or(|ns| crate::model::sandbox::split_claim_ref(claim_ref).0 == ns)
}

impl Dispatcher {
    pub fn new(cfg: DispatcherConfig, token: &str) -> Self {
        let inner = Arc::new(Inner {
            owners: OwnerIndex::new(cfg.owner_index_capacity),
            cfg,
            token: token.to_string(),
            registry: Registry::default(),
            view: ReadView::new(),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
        });
        let d = Dispatcher { inner };
        d.inner.tasks.spawn(d.clone().sweep_loop());
        d
    }

    /// The fleet credential nodes require (their data planes too).
    pub fn fleet_token(&self) -> &str {
        &self.inner.token
    }

    pub fn config(&self) -> &DispatcherConfig {
        &self.inner.cfg
    }

    pub fn view(&self) -> &ReadView {
        &self.inner.view
    }

    /// The read view once it reflects what live reads on this replica have seen (waiting at
    /// most `CATCH_UP`): what lists are served from, so that a sandbox a client just saw
    /// paused through a get is not listed as running.
    pub async fn settled_view(&self) -> &ReadView {
        let view = &self.inner.view;
        if !view.caught_up(CATCH_UP).await {
            tracing::debug!("the read view lags a live read; listing what it has");
        }
        view
    }

    pub fn owners(&self) -> &OwnerIndex {
        &self.inner.owners
    }

    /// Unpinned listing from the read view (eventually consistent).
    pub fn list(&self, namespace: Option<&str>) -> (Vec<Arc<SandboxRecord>>, u64) {
        self.inner.view.list(|r| in_scope(r, namespace))
    }

    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }

    /// Records a sandbox a node just handed over: routing estimates, owner index, read view.
    fn claimed_on(&self, node: &Arc<NodeHandle>, record: &SandboxRecord, warm: bool) {
        node.took_claim(&record.key, warm);
        self.inner
            .owners
            .remember(&record.id, &record.claim_ref, node);
        self.local(&record.node, LocalChange::Upsert(Box::new(record.clone())));
    }

    fn local(&self, node: &str, change: LocalChange) {
        self.inner.view.apply_local(node, change);
    }

    /// The longest lease every reachable node grants, in seconds.
    pub fn max_lease_seconds(&self) -> Option<u64> {
        self.inner
            .registry
            .up()
            .iter()
            .filter_map(|h| h.lease_max_seconds())
            .min()
    }

    // ----- claims -----

    /// Claims a sandbox on some node: power-of-two choices among nodes with warm capacity for
    /// the pool key, then among nodes that can cold-start it. A node that refuses (no
    /// capacity, unreachable) is skipped; a claim whose outcome is unknown is never re-sent.
    pub async fn claim(&self, mut req: ClaimRequest) -> Result<Claimed> {
        model::sandbox::validate_claim_ref(&req.claim_ref())?;
        let up = self.inner.registry.up();
        if let Some(name) = routing::canonical_template(&up, &req.key.template) {
            req.key.template = name;
        }
        if req.key.size_unset() {
            req.key.size = routing::template_size(&up, &req.key.template)
                .unwrap_or_else(|| model::pool::DEFAULT_SIZE.to_string());
        }
        if up.is_empty() {
            return Err(Error::unavailable("no node is reachable"));
        }
        let key = &req.key;
        let (mut warm, mut cold): (Vec<_>, Vec<_>) =
            up.into_iter().partition(|h| h.warm_estimate(key) > 0);
        cold.retain(|h| h.offers_template(&key.template) && h.cold_starts());
        if warm.is_empty() && cold.is_empty() {
            let offered = self
                .inner
                .registry
                .up()
                .iter()
                .any(|h| h.offers_template(&key.template));
            return Err(if offered {
                Error::no_capacity(format!(
                    "no node has a warm sandbox for {key} or can start one"
                ))
            } else if let Some(node) = routing::building(&self.inner.registry.up(), &key.template) {
                Error::unavailable(format!(
                    "template {:?} is being built on node {node:?} (on a first start this takes several minutes; other templates are served meanwhile); try again when it is ready",
                    key.template
                ))
            } else {
                Error::not_found(format!(
                    "template {:?} is not offered by any node",
                    key.template
                ))
            });
        }
        let request = proto::ClaimRequest {
            key: Some(key.into()),
            ttl_seconds: req.ttl_seconds,
            claim_ref: req.claim_ref(),
            metadata: req.metadata.clone().into_iter().collect(),
            env_vars: req.env_vars.clone().into_iter().collect(),
            no_redirect: true,
            on_timeout: req.lifecycle.on_timeout.as_str().to_string(),
            auto_resume: req.lifecycle.auto_resume,
            auto_pause_mode: req.lifecycle.pause_mode.as_str().to_string(),
            network: Some((&req.network).into()),
            volume_mounts: req.volume_mounts.iter().map(Into::into).collect(),
        };
        let mut refused: Vec<String> = Vec::new();
        let mut last_err: Option<Error> = None;
        loop {
            let node = match routing::take_next(&mut warm, key) {
                Some(n) => n,
                None => match routing::take_next(&mut cold, key) {
                    Some(n) => n,
                    None => break,
                },
            };
            cold.retain(|h| !Arc::ptr_eq(h, &node));
            let mut c = node.conn().client();
            let outcome = node
                .conn()
                .call(
                    "claim",
                    Effect::Write,
                    self.inner.cfg.claim_timeout,
                    c.claim(request.clone()),
                )
                .await;
            match outcome {
                Ok(reply) => {
                    let record: SandboxRecord = reply
                        .sandbox
                        .ok_or_else(|| Error::internal("node answered a claim without a sandbox"))?
                        .into();
                    self.claimed_on(&node, &record, reply.warm);
                    return Ok(Claimed {
                        record,
                        warm: reply.warm,
                    });
                }
                // A node whose disk is full refused before claiming anything (it removed
                // what it had started), so another node may well boot the sandbox: the same
                // as a node without room.
                Err(e)
                    if matches!(
                        e.kind,
                        ErrorKind::NoCapacity
                            | ErrorKind::StorageFull
                            | ErrorKind::Unavailable
                            | ErrorKind::NotFound
                    ) =>
                {
                    tracing::debug!(node = %node.label(), error = %e, "node refused a claim; trying another");
                    if e.kind == ErrorKind::Unavailable {
                        node.mark_down();
                    } else {
                        node.refused_claim(key);
                    }
                    refused.push(node.label());
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        match last_err {
            Some(e) if e.kind == ErrorKind::NotFound => Err(e),
            Some(e) if e.kind == ErrorKind::Unavailable && refused.len() == 1 => Err(e),
            // Every node refused: nothing was claimed, so this is "no capacity" (503 with
            // Retry-After) even when disks were full; a full disk is the operator's to fix,
            // the client's best move is to come back later. The last refusal says why.
            last => Err(Error::no_capacity(format!(
                "no node could take a claim for {key} (tried {}){}",
                refused.join(", "),
                last.map(|e| format!("; last refusal: {}", e.message))
                    .unwrap_or_default()
            ))),
        }
    }

    // ----- resolution -----

    async fn get_on(
        &self,
        node: &Arc<NodeHandle>,
        id: &str,
        timeout: Duration,
    ) -> Result<SandboxRecord> {
        let mut c = node.conn().client();
        let reply = node
            .conn()
            .call(
                "get",
                Effect::Read,
                timeout,
                c.get(proto::SandboxRef { id: id.to_string() }),
            )
            .await?;
        let revision = reply.inventory_revision;
        let record: SandboxRecord = reply.into();
        self.inner.view.observed(&record.node, revision);
        Ok(record)
    }

    /// Finds the node that owns claim id `id` (either spelling) and its live record (with
    /// token): owner index → read view → every node. A sandbox outside `namespace` is not
    /// found. When the owner cannot be reached the answer is Unavailable, never NotFound.
    pub async fn locate(
        &self,
        namespace: Option<&str>,
        id: &str,
    ) -> Result<(Arc<NodeHandle>, SandboxRecord)> {
        let id = ids::canonical_claim_id(id).ok_or_else(|| not_found(id))?;
        let scoped = |r: SandboxRecord| {
            if in_scope(&r, namespace) {
                Ok(r)
            } else {
                Err(not_found(&id))
            }
        };
        let known = self.inner.owners.node_of_id(&id).or_else(|| {
            let rec = self.inner.view.find_id(&id)?;
            self.inner.registry.by_name(&rec.node)
        });
        if let Some(node) = known {
            return match self.get_on(&node, &id, self.inner.cfg.owner_timeout).await {
                Ok(r) => {
                    self.inner.owners.remember(&r.id, &r.claim_ref, &node);
                    Ok((node, scoped(r)?))
                }
                Err(e) if e.kind == ErrorKind::NotFound => {
                    self.inner.owners.forget_id(&id);
                    self.gone_from(&node, &id);
                    Err(e)
                }
                Err(e) => Err(e.context(format!("sandbox {id:?} is on node {}", node.label()))),
            };
        }
        let nodes = self.inner.registry.all();
        let mut asks = futures::stream::iter(nodes.into_iter().map(|node| {
            let id = id.clone();
            async move {
                let r = self.get_on(&node, &id, self.inner.cfg.lookup_timeout).await;
                (node, r)
            }
        }))
        .buffer_unordered(self.inner.cfg.fanout_concurrency.max(1));
        let mut unreachable = Vec::new();
        let mut gone: Option<Error> = None;
        while let Some((node, r)) = asks.next().await {
            match r {
                Ok(r) => {
                    self.inner.owners.remember(&r.id, &r.claim_ref, &node);
                    return Ok((node, scoped(r)?));
                }
                Err(e) if e.kind == ErrorKind::NotFound => {
                    // A node that lost the claim says so; keep the more useful message.
                    if e.message.contains("is gone") {
                        gone = Some(e);
                    }
                }
                Err(_) => unreachable.push(node.label()),
            }
        }
        if !unreachable.is_empty() {
            return Err(Error::unavailable(format!(
                "sandbox {id:?} was not found on the nodes that answered; {} did not answer",
                unreachable.join(", ")
            )));
        }
        Err(gone.unwrap_or_else(|| not_found(&id)))
    }

    /// The node that held sandbox `id` says it has it no more (its lease ran out, or another
    /// replica or client released it): a list on this replica stops showing it now, instead
    /// of when the node's stream, or its next published inventory, says so.
    fn gone_from(&self, node: &Arc<NodeHandle>, id: &str) {
        let Some(name) = node.name() else { return };
        if self.inner.view.find_id(id).is_some_and(|r| r.node == name) {
            self.local(&name, LocalChange::Released { id: id.to_string() });
        }
    }

    pub async fn get(&self, namespace: Option<&str>, id: &str) -> Result<SandboxRecord> {
        self.locate(namespace, id).await.map(|(_, r)| r)
    }

    async fn list_on(
        &self,
        node: &Arc<NodeHandle>,
        claim_ref: &str,
        timeout: Duration,
    ) -> Result<Vec<SandboxRecord>> {
        let mut c = node.conn().client();
        let reply = node
            .conn()
            .call(
                "list",
                Effect::Read,
                timeout,
                c.list(proto::ListRequest {
                    claim_ref: claim_ref.to_string(),
                }),
            )
            .await?;
        if let Some(name) = node.name() {
            self.inner.view.observed(&name, reply.revision);
        }
        Ok(reply.sandboxes.into_iter().map(Into::into).collect())
    }

    /// The sandboxes claimed under `<namespace>/<name>`, asked live (newest first; a repeated
    /// create under one name yields several). Records carry no tokens.
    pub async fn find_by_name(&self, namespace: &str, name: &str) -> Result<Vec<SandboxRecord>> {
        let claim_ref = model::claim_ref(namespace, name);
        let mut candidates: Vec<Arc<NodeHandle>> = Vec::new();
        if let Some(n) = self.inner.owners.node_of_ref(&claim_ref) {
            candidates.push(n);
        }
        for rec in self.inner.view.find_claim_ref(&claim_ref) {
            if let Some(n) = self.inner.registry.by_name(&rec.node)
                && !candidates.iter().any(|c| Arc::ptr_eq(c, &n))
            {
                candidates.push(n);
            }
        }
        let mut found = Vec::new();
        let mut unreachable = Vec::new();
        for node in &candidates {
            match self
                .list_on(node, &claim_ref, self.inner.cfg.owner_timeout)
                .await
            {
                Ok(rs) => found.extend(rs.into_iter().map(|r| (node.clone(), r))),
                Err(_) => unreachable.push(node.label()),
            }
        }
        if found.is_empty() && unreachable.is_empty() {
            self.inner.owners.forget_ref(&claim_ref);
            let nodes = self.inner.registry.all();
            let mut asks = futures::stream::iter(nodes.into_iter().map(|node| {
                let claim_ref = claim_ref.clone();
                async move {
                    let r = self
                        .list_on(&node, &claim_ref, self.inner.cfg.lookup_timeout)
                        .await;
                    (node, r)
                }
            }))
            .buffer_unordered(self.inner.cfg.fanout_concurrency.max(1));
            while let Some((node, r)) = asks.next().await {
                match r {
                    Ok(rs) => found.extend(rs.into_iter().map(|r| (node.clone(), r))),
                    Err(_) => unreachable.push(node.label()),
                }
            }
        }
        if found.is_empty() && !unreachable.is_empty() {
            return Err(Error::unavailable(format!(
                "sandbox {namespace}/{name} was not found on the nodes that answered; {} did not answer",
                unreachable.join(", ")
            )));
        }
        for (node, r) in &found {
            self.inner.owners.remember(&r.id, &r.claim_ref, node);
        }
        let mut records: Vec<SandboxRecord> = found.into_iter().map(|(_, r)| r).collect();
        records.sort_by(|a, b| {
            b.claimed_at
                .cmp(&a.claimed_at)
                .then_with(|| a.id.cmp(&b.id))
        });
        Ok(records)
    }

    // ----- verbs on one sandbox -----

    pub async fn release(&self, namespace: Option<&str>, id: &str) -> Result<()> {
        let (node, record) = self.locate(namespace, id).await?;
        let mut c = node.conn().client();
        node.conn()
            .call(
                "release",
                Effect::Write,
                self.inner.cfg.call_timeout,
                c.release(proto::SandboxRef {
                    id: record.id.clone(),
                }),
            )
            .await?;
        self.inner.owners.forget_id(&record.id);
        // The name may come back on another node; a stale entry would send its lookups here.
        self.inner.owners.forget_ref(&record.claim_ref);
        self.local(&record.node, LocalChange::Released { id: record.id });
        Ok(())
    }

    /// Sets the lease to `ttl_seconds` from now; a shorter lease only with `allow_shorter`.
    /// Answers the deadline in force and whether it changed.
    pub async fn renew(
        &self,
        namespace: Option<&str>,
        id: &str,
        ttl_seconds: u64,
        allow_shorter: bool,
    ) -> Result<(DateTime<Utc>, bool)> {
        let req = proto::RenewRequest {
            id: String::new(),
            ttl_seconds,
            allow_shorter,
            expire_now: false,
        };
        self.set_lease(namespace, id, req).await
    }

    /// Ends the lease now: the node runs the sandbox's on-timeout action (kill or pause).
    pub async fn expire(&self, namespace: Option<&str>, id: &str) -> Result<DateTime<Utc>> {
        let req = proto::RenewRequest {
            id: String::new(),
            ttl_seconds: 0,
            allow_shorter: true,
            expire_now: true,
        };
        Ok(self.set_lease(namespace, id, req).await?.0)
    }

    async fn set_lease(
        &self,
        namespace: Option<&str>,
        id: &str,
        mut req: proto::RenewRequest,
    ) -> Result<(DateTime<Utc>, bool)> {
        let (node, record) = self.locate(namespace, id).await?;
        req.id = record.id.clone();
        let mut c = node.conn().client();
        let reply = node
            .conn()
            .call(
                "renew",
                Effect::Write,
                self.inner.cfg.call_timeout,
                c.renew(req),
            )
            .await?;
        let deadline = proto::from_ms(reply.deadline_ms);
        let change = LocalChange::Deadline {
            id: record.id,
            deadline,
        };
        self.local(&record.node, change);
        Ok((deadline, reply.changed))
    }

    /// Forks `count` children on the source's node, named `<namespace>/<child id>` in the
    /// source's namespace, in request order.
    pub async fn fork(
        &self,
        namespace: Option<&str>,
        id: &str,
        count: u32,
        ttl_seconds: u64,
    ) -> Result<Vec<SandboxRecord>> {
        let (node, record) = self.locate(namespace, id).await?;
        let mut c = node.conn().client();
        let reply = node
            .conn()
            .call(
                "fork",
                Effect::Write,
                self.inner.cfg.capture_timeout,
                c.fork(proto::ForkRequest {
                    id: record.id.clone(),
                    count,
                    ttl_seconds,
                    claim_ref_prefix: format!("{}/", record.namespace()),
                }),
            )
            .await?;
        let children: Vec<SandboxRecord> = reply.children.into_iter().map(Into::into).collect();
        for child in &children {
            self.claimed_on(&node, child, false);
        }
        Ok(children)
    }

    pub async fn stats(&self, namespace: Option<&str>, id: &str) -> Result<SandboxStats> {
        let (node, record) = self.locate(namespace, id).await?;
        let mut c = node.conn().client();
        node.conn()
            .call(
                "stats",
                Effect::Read,
                self.inner.cfg.call_timeout,
                c.stats(proto::SandboxRef { id: record.id }),
            )
            .await
            .map(Into::into)
    }

    /// Entries of a sandbox's log, from its node.
    pub async fn logs(
        &self,
        namespace: Option<&str>,
        id: &str,
        query: &model::logs::LogQuery,
    ) -> Result<Vec<model::logs::LogEntry>> {
        let (node, record) = match self.locate(namespace, id).await {
            Ok(found) => found,
            // Gone, but its node may still keep its log.
            Err(e) if e.kind == ErrorKind::NotFound => {
                return self.ended_logs(namespace, id, query, e).await;
            }
            Err(e) => return Err(e),
        };
        let reply = self.logs_on(&node, &record.id, query).await?;
        Ok(reply.entries.into_iter().map(Into::into).collect())
    }

    async fn logs_on(
        &self,
        node: &NodeHandle,
        id: &str,
        query: &model::logs::LogQuery,
    ) -> Result<proto::LogsReply> {
        let mut c = node.conn().client();
        node.conn()
            .call(
                "logs",
                Effect::Read,
                self.inner.cfg.call_timeout,
                c.logs(proto::LogsRequest::from_query(id, query)),
            )
            .await
    }

    /// The log a node keeps of sandbox `id` after it ended, if one does and it is in
    /// `namespace`; else `gone`, the error that said the sandbox is not there.
    async fn ended_logs(
        &self,
        namespace: Option<&str>,
        id: &str,
        query: &model::logs::LogQuery,
        gone: Error,
    ) -> Result<Vec<model::logs::LogEntry>> {
        let Some(id) = ids::canonical_claim_id(id) else {
            return Err(gone);
        };
        let nodes = self.inner.registry.all();
        let mut asks = futures::stream::iter(nodes.into_iter().map(|node| {
            let id = id.clone();
            async move { self.logs_on(&node, &id, query).await }
        }))
        .buffer_unordered(self.inner.cfg.fanout_concurrency.max(1));
        while let Some(reply) = asks.next().await {
            let Ok(reply) = reply else { continue };
            if claim_in_scope(&reply.claim_ref, namespace) {
                return Ok(reply.entries.into_iter().map(Into::into).collect());
            }
        }
        Err(gone)
    }
}
