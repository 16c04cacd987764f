//! The node daemon: owns every sandbox on one machine. Warm pools, claims (an ownership
//! transfer of an already-running instance), leases and reaping, pause/resume, fork,
//! checkpoints, persistence and the inventory change stream. It knows nothing of e2b or
//! Kubernetes.

mod agent_client;
mod builds;
pub mod config;
pub mod daemon;
pub mod dataplane;
pub mod egress;
mod identify;
mod leases;
pub mod logs;
mod metadata;
pub mod metrics;
mod network;
mod ops;
mod pause;
pub mod pid1;
mod pools;
mod readiness;
pub mod runtime;
pub mod service;
mod store;
mod volumes;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, broadcast};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::{NodeConfig, Paths};
use runtime::{Instance, Runtime};
use store::{IndexFile, PersistedClaim};

use crate::cluster::backoff::{self, Backoff};
use crate::model::{
    self, CheckpointRecord, Error, InventoryChange, InventoryEvent, LostClaim, NodeInfo,
    NodeLimits, PoolKey, PoolStatus, Result, SandboxRecord, ids,
};
use crate::templates::{Template, TemplateStore};

/// How many lost claims a node remembers and reports.
const LOST_MEMORY: usize = 1000;
/// The logs of sandboxes that ended stay readable (as on e2b, where `e2b sandbox logs` shows
/// why a sandbox ended after it has): the newest this many, for this long, each cut to its
/// newest entries within the byte budget.
const ENDED_LOGS: usize = 128;
const ENDED_LOGS_FOR: Duration = Duration::from_secs(15 * 60);
const ENDED_LOG_BYTES: usize = 64 * 1024;
/// How long a failed background destroy is retried (see `destroy_later`).
const DESTROY_RETRY_FOR: Duration = Duration::from_secs(600);
/// Background destroys run at most this many at once: each kills processes, unmounts and
/// removes a sandbox's cgroups and files, and a hundred released together would otherwise
/// take every core from the claims still coming in (the tail of concurrent creates).
const DESTROYS_AT_ONCE: usize = 2;
/// How long a node waits for the data directory of a node that just ended.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
const EVENT_BUFFER: usize = 4096;
/// How long claim changes gather before the index is rewritten.
const PERSIST_BATCH: std::time::Duration = std::time::Duration::from_millis(200);

/// Serializes the verbs that act on one instance (pause, resume, capture, release).
pub(crate) type VerbLock = Arc<tokio::sync::Mutex<()>>;

pub(crate) struct Claim<H> {
    record: SandboxRecord,
    instance: Instance<H>,
    /// Whether the agent has taken the claim's identity (token, env, hostname) yet.
    ready: identify::ReadyRx,
    /// Cancelled when the sandbox stops serving (pause, release): its data-plane tunnels close.
    tunnels: CancellationToken,
    op: VerbLock,
    /// The previous CPU reading, for a usage rate.
    last_cpu: Option<(Instant, u64)>,
}

pub(crate) struct Pool<H> {
    target: u32,
    /// Made for a built template's default build (see `builds::warm`), not configured.
    pub(crate) built: bool,
    warm: VecDeque<Instance<H>>,
    booting: u32,
    failures: u32,
    retry_at: Option<Instant>,
}

impl<H> Pool<H> {
    fn new(target: u32) -> Self {
        Pool {
            target,
            built: false,
            warm: VecDeque::new(),
            booting: 0,
            failures: 0,
            retry_at: None,
        }
    }

    fn built(target: u32) -> Self {
        Pool {
            built: true,
            ..Pool::new(target)
        }
    }
}

pub(crate) struct State<H> {
    claims: HashMap<String, Claim<H>>,
    pools: BTreeMap<PoolKey, Pool<H>>,
    checkpoints: HashMap<String, CheckpointRecord>,
    lost: VecDeque<LostClaim>,
    /// The logs of sandboxes released lately, newest first.
    ended: VecDeque<EndedLogs>,
    /// Claims served per template: count and last time.
    usage: BTreeMap<String, (u64, DateTime<Utc>)>,
    revision: u64,
    /// Instances being booted for claims, forks and branches (pool refills count in `Pool`).
    booting_for_claims: u32,
    closing: bool,
}

impl<H> State<H> {
    fn instances(&self) -> u32 {
        let pooled: u32 = self
            .pools
            .values()
            .map(|p| p.warm.len() as u32 + p.booting)
            .sum();
        self.claims.len() as u32 + pooled + self.booting_for_claims
    }

    fn emit(&mut self, tx: &broadcast::Sender<InventoryEvent>, change: InventoryChange) {
        self.revision += 1;
        // Nobody listening is fine; watchers resynchronize from snapshots.
        let _ = tx.send(InventoryEvent {
            change,
            revision: self.revision,
        });
    }

    fn remember_lost(&mut self, lost: LostClaim) {
        self.lost.push_front(lost);
        self.lost.truncate(LOST_MEMORY);
    }

    /// Keeps the log of a sandbox that ended, with a last line saying why.
    fn remember_ended(&mut self, record: &SandboxRecord, logs: &logs::Logs, why: &str) {
        logs.note(model::logs::LogLevel::Info, format!("sandbox ended: {why}"));
        logs.shrink_to(ENDED_LOG_BYTES);
        self.ended.retain(|e| e.at.elapsed() < ENDED_LOGS_FOR);
        self.ended.push_front(EndedLogs {
            id: record.id.clone(),
            claim_ref: record.claim_ref.clone(),
            logs: logs.clone(),
            at: Instant::now(),
        });
        self.ended.truncate(ENDED_LOGS);
    }

    /// The kept log of sandbox `id`, and its claim ref.
    fn ended_logs(&self, id: &str) -> Option<(&str, &logs::Logs)> {
        self.ended
            .iter()
            .find(|e| e.id == id && e.at.elapsed() < ENDED_LOGS_FOR)
            .map(|e| (e.claim_ref.as_str(), &e.logs))
    }
}

/// The log of a sandbox that ended (see `ENDED_LOGS`).
struct EndedLogs {
    id: String,
    claim_ref: String,
    logs: logs::Logs,
    at: Instant,
}

pub(crate) struct Inner<R: Runtime> {
    cfg: NodeConfig,
    paths: Paths,
    templates: TemplateStore,
    builds: builds::Builds,
    runtime: R,
    state: Mutex<State<R::Handle>>,
    events: broadcast::Sender<InventoryEvent>,
    wake_refill: Notify,
    wake_persist: Notify,
    wake_reaper: Notify,
    /// One index write at a time, each from a fresh snapshot.
    persist_lock: tokio::sync::Mutex<()>,
    /// Background work (destroys, boots, the node's loops) that shutdown waits for.
    tasks: TaskTracker,
    /// Turns of the background destroys (see `DESTROYS_AT_ONCE`).
    destroys: tokio::sync::Semaphore,
    shutdown: CancellationToken,
    started_at: DateTime<Utc>,
    /// Capacity of the file system holding the sandboxes, read at start.
    disk_bytes: u64,
    metrics: metrics::NodeMetrics,
    _lock: runtime::sys::DirLock,
}

/// Exclusive use of a node's data directory.
pub struct DataDirLock(runtime::sys::DirLock);

/// A node: cheap to clone, all clones share one state.
pub struct Node<R: Runtime> {
    inner: Arc<Inner<R>>,
}

impl<R: Runtime> Clone for Node<R> {
    fn clone(&self) -> Self {
        Node {
            inner: self.inner.clone(),
        }
    }
}

/// What a caller asks for when claiming.
#[derive(Debug, Clone, Default)]
pub struct ClaimSpec {
    pub ttl_seconds: u64,
    pub claim_ref: String,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    pub lifecycle: model::Lifecycle,
    pub network: model::network::NetworkPolicy,
    pub volume_mounts: Vec<model::VolumeMount>,
}

impl ClaimSpec {
    /// The namespace (tenant) the claim is made for.
    pub fn namespace(&self) -> &str {
        model::sandbox::split_claim_ref(&self.claim_ref).0
    }

    fn validate(&self) -> Result<()> {
        model::sandbox::validate_claim_ref(&self.claim_ref)?;
        self.network.validate()?;
        model::sandbox::validate_string_map("metadata", &self.metadata)?;
        model::sandbox::validate_string_map("envVars", &self.env_vars)
    }
}

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

impl<R: Runtime> Node<R> {
    /// Opens the node's data directory, recovers its index (reporting claims whose instances
    /// did not survive), removes leftovers of an earlier run, and starts the background loops.
    /// Takes the data directory for one node; a second node on it is refused. Take it before
    /// building the runtime, which may clean up after an earlier run of the same node.
    pub fn lock_data_dir(cfg: &NodeConfig) -> Result<DataDirLock> {
        let paths = cfg.paths();
        std::fs::create_dir_all(&paths.root)
            .map_err(io(format!("creating {}", paths.root.display())))?;
        // A node that just died leaves its reaper holding the lock for a moment while it
        // ends that node's sandboxes.
        let started = std::time::Instant::now();
        loop {
            match runtime::sys::lock_file(&paths.lock) {
                Ok(lock) => return Ok(DataDirLock(lock)),
                Err(e)
                    if e.raw_os_error() == Some(libc::EWOULDBLOCK)
                        && started.elapsed() < LOCK_WAIT =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(e) => {
                    return Err(Error::unavailable(format!(
                        "data directory {} is in use by another node ({e})",
                        paths.root.display()
                    )));
                }
            }
        }
    }

    pub async fn open(cfg: NodeConfig, runtime: R, lock: DataDirLock) -> Result<Self> {
        let paths = cfg.paths();
        for dir in [
            &paths.root,
            &paths.sandboxes,
            &paths.checkpoints,
            &paths.templates,
        ] {
            std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        }
        let templates = TemplateStore::new(&paths.templates, cfg.ids)?;
        templates.clean_staging();
        let mut pools = BTreeMap::new();
        for p in &cfg.pools {
            match templates.get(&p.key.template) {
                Ok(_) => {}
                // A recipe's template is built in the background (see `daemon`); its pool
                // fills once it is there.
                Err(e)
                    if e.kind == model::ErrorKind::NotFound
                        && crate::templates::recipes::find(&p.key.template).is_some() => {}
                Err(e) => return Err(e.context(format!("pool {}", p.key))),
            }
            pools.insert(p.key.clone(), Pool::new(p.target));
        }

        let previous = IndexFile::<R::Handle>::load(&paths.index)?;
        let mut lost: VecDeque<LostClaim> = VecDeque::new();
        let mut checkpoints = HashMap::new();
        if let Some(index) = previous {
            lost.extend(index.lost);
            let now = Utc::now();
            for PersistedClaim { record, instance } in index.claims {
                let alive = runtime.is_alive(&instance);
                let reason = if alive {
                    format!(
                        "node {} restarted; the instance could not be re-adopted and was stopped",
                        cfg.name
                    )
                } else {
                    format!("its instance was gone when node {} restarted", cfg.name)
                };
                tracing::warn!(id = %record.id, claim_ref = %record.claim_ref, %reason, "claim lost");
                if let Err(e) = runtime.destroy(&instance).await {
                    tracing::error!(id = %record.id, error = %e, "could not clean up a lost instance");
                }
                lost.push_front(LostClaim {
                    id: record.id,
                    claim_ref: record.claim_ref,
                    reason,
                    lost_at: now,
                });
            }
            for ck in index.checkpoints {
                if paths.checkpoints.join(&ck.id).is_dir() {
                    checkpoints.insert(ck.id.clone(), ck);
                } else {
                    tracing::error!(id = %ck.id, "checkpoint data is missing; dropping its record");
                }
            }
        }
        lost.truncate(LOST_MEMORY);
        runtime.reclaim_orphans().await;
        for dir in [&paths.sandboxes, &paths.scratch, &paths.paused] {
            // Nothing in these survives a restart: claims were handled above (a paused
            // sandbox, whether its memory or only its files were kept, is lost with the rest),
            // warm instances and captures in flight are rebuilt.
            let _ = std::fs::remove_dir_all(dir);
            std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        }
        if let Ok(entries) = std::fs::read_dir(&paths.checkpoints) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if !checkpoints.contains_key(&name) {
                    tracing::warn!(dir = %e.path().display(), "removing checkpoint data without a record");
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }

        let builds =
            builds::Builds::open(&paths.root, &paths.templates, cfg.template_upload_max_bytes)?;
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let paths_root = paths.root.clone();
        let node_metrics = metrics::NodeMetrics::new(&cfg.name)?;
        let inner = Arc::new(Inner {
            paths,
            templates,
            builds,
            runtime,
            state: Mutex::new(State {
                claims: HashMap::new(),
                pools,
                checkpoints,
                lost,
                ended: VecDeque::new(),
                usage: BTreeMap::new(),
                revision: 0,
                booting_for_claims: 0,
                closing: false,
            }),
            events,
            wake_refill: Notify::new(),
            wake_persist: Notify::new(),
            wake_reaper: Notify::new(),
            persist_lock: tokio::sync::Mutex::new(()),
            tasks: TaskTracker::new(),
            destroys: tokio::sync::Semaphore::new(DESTROYS_AT_ONCE),
            shutdown: CancellationToken::new(),
            started_at: Utc::now(),
            disk_bytes: crate::fsx::filesystem_capacity(&paths_root).unwrap_or(0),
            metrics: node_metrics,
            _lock: lock.0,
            cfg,
        });
        let node = Node { inner };
        node.persist_now().await?;
        node.sync_built_pools();
        node.collect_build_garbage(Default::default());
        node.inner.tasks.spawn(node.clone().refill_loop());
        node.inner.tasks.spawn(node.clone().reaper_loop());
        node.inner.tasks.spawn(node.clone().persist_loop());
        Ok(node)
    }

    pub fn name(&self) -> &str {
        &self.inner.cfg.name
    }

    pub(crate) fn metrics(&self) -> &metrics::NodeMetrics {
        &self.inner.metrics
    }

    /// The node's metrics in Prometheus's text format, its gauges read from the state now.
    pub fn metrics_text(&self) -> String {
        let snapshot = {
            let st = self.state();
            let mut running = 0;
            let mut paused = 0;
            for c in st.claims.values() {
                match c.record.phase {
                    model::Phase::Running => running += 1,
                    model::Phase::Paused => paused += 1,
                }
            }
            metrics::Snapshot {
                pools: st
                    .pools
                    .iter()
                    .map(|(k, p)| (k.to_string(), p.warm.len() as u32, p.booting, p.target))
                    .collect(),
                sandboxes: vec![
                    (model::Phase::Running.as_str(), running),
                    (model::Phase::Paused.as_str(), paused),
                ],
            }
        };
        self.inner.metrics.render(&snapshot)
    }

    pub fn config(&self) -> &NodeConfig {
        &self.inner.cfg
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State<R::Handle>> {
        // A panic while holding the lock leaves consistent-enough data; keep serving.
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn shutdown_token(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    fn not_found(&self, st: &State<R::Handle>, id: &str) -> Error {
        if let Some(l) = st.lost.iter().find(|l| l.id == id) {
            return Error::not_found(format!(
                "sandbox {id:?} is gone: {} ({})",
                l.reason,
                l.lost_at.to_rfc3339()
            ));
        }
        Error::not_found(format!(
            "sandbox {id:?} not found on node {:?}",
            self.name()
        ))
    }

    /// The templates being built in the node's directory, with the aliases of those that are
    /// recipes (`code-interpreter-v1` while `code-interpreter` builds).
    fn templates_building(&self) -> Vec<String> {
        let mut names = Vec::new();
        for name in self.inner.templates.building() {
            if let Some(recipe) = crate::templates::recipes::find(&name) {
                names.extend(recipe.aliases.iter().map(|a| a.to_string()));
            }
            names.push(name);
        }
        names
    }

    fn template(&self, name: &str) -> Result<Template> {
        self.inner.templates.get(name).map_err(|e| match e.kind {
            model::ErrorKind::NotFound => Error::not_found(format!(
                "template {name:?} is not on node {:?}",
                self.name()
            )),
            _ => e,
        })
    }

    pub fn templates(&self) -> Vec<Template> {
        self.inner.templates.list()
    }

    pub fn runtime(&self) -> &R {
        &self.inner.runtime
    }

    fn stamp(
        &self,
        inst: &Instance<R::Handle>,
        key: &PoolKey,
        spec: &ClaimSpec,
        origin: Origin,
    ) -> SandboxRecord {
        let now = Utc::now();

        let tier = key.tier();
        let id = ids::new_claim_id();
        let claim_ref = match &origin {
            Origin::Fork { prefix, .. } => format!("{prefix}{id}"),
            _ => spec.claim_ref.clone(),
        };
        SandboxRecord {
            token: ids::new_token(),
            key: key.clone(),
            claim_ref,
            claimed_at: now,
            deadline: self.inner.cfg.lease.deadline(now, spec.ttl_seconds),
            phase: model::Phase::Running,
            // Sandboxes are reached through the node's data plane, never directly.
            address: self.inner.cfg.data_address.clone(),
            metadata: spec.metadata.clone(),
            env_vars: spec.env_vars.clone(),
            from_checkpoint: match &origin {
                Origin::Checkpoint(ck) => Some(ck.clone()),
                _ => None,
            },
            forked_from: match &origin {
                Origin::Fork { parent, .. } => Some(parent.clone()),
                _ => None,
            },
            node: self.name().to_string(),
            cpu_count: tier.cpu_count,
            memory_bytes: tier.memory_bytes,
            state_dir: inst.dir.display().to_string(),
            disk_bytes: self.inner.cfg.disk_bytes.unwrap_or(tier.disk_bytes),
            lifecycle: spec.lifecycle,
            lease_seconds: self.inner.cfg.lease.grant(spec.ttl_seconds).as_secs(),
            paused: None,
            network: spec.network.clone(),
            volume_mounts: spec.volume_mounts.clone(),
            id,
        }
    }

    /// Records a new claim and announces it. Returns the record with its token.
    fn insert_claim(
        &self,
        st: &mut State<R::Handle>,
        record: SandboxRecord,
        instance: Instance<R::Handle>,
    ) -> SandboxRecord {
        st.emit(
            &self.inner.events,
            InventoryChange::Added(record.clone().without_token()),
        );
        let used = st
            .usage
            .entry(record.key.template.clone())
            .or_insert((0, record.claimed_at));
        used.0 += 1;
        used.1 = record.claimed_at;
        instance.logs.note(
            model::logs::LogLevel::Info,
            format!(
                "claimed{} ({}), lease until {}",
                if record.claim_ref.is_empty() {
                    String::new()
                } else {
                    format!(" as {}", record.claim_ref)
                },
                record.key,
                record.deadline.to_rfc3339()
            ),
        );
        let ready = self.identify(&record, &instance);
        st.claims.insert(
            record.id.clone(),
            Claim {
                record: record.clone(),
                instance,
                ready,
                tunnels: CancellationToken::new(),
                op: Arc::new(tokio::sync::Mutex::new(())),
                last_cpu: None,
            },
        );
        record
    }

    fn changed(&self) {
        self.inner.wake_persist.notify_one();
        self.inner.wake_reaper.notify_one();
    }

    /// Destroys an instance without making the caller wait; shutdown waits for it. A failed
    /// destroy is retried with backoff for `DESTROY_RETRY_FOR` (once more when the node is
    /// closing): on an overloaded host a sandbox's processes can take longer to exit than the
    /// runtime waits (network namespaces being torn down hold them), and giving up would leave
    /// the instance's directory, disk and cgroups behind until the node restarts.
    fn destroy_later(&self, instance: Instance<R::Handle>, why: &'static str) {
        // An unused agent line would hold the sandbox's network namespace open.
        drop(instance.agent.take());
        let node = self.clone();
        self.inner.tasks.spawn(async move {
            // Never closed, so a turn always comes.
            let _turn = node.inner.destroys.acquire().await;
            let started = Instant::now();
            let mut retry = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
            loop {
                let Err(e) = node.inner.runtime.destroy(&instance).await else {
                    node.inner.metrics.destroyed(true);
                    if retry.failures() > 0 {
                        tracing::info!(instance = %instance.id, attempts = retry.failures() + 1, why, "destroyed an instance after retrying");
                    }
                    return;
                };
                let shutdown = &node.inner.shutdown;
                if shutdown.is_cancelled() || started.elapsed() >= DESTROY_RETRY_FOR {
                    tracing::error!(instance = %instance.id, error = %e, why, attempts = retry.failures() + 1, "destroying an instance failed; its remains are removed when the node next starts");
                    node.inner.metrics.destroyed(false);
                    return;
                }
                let wait = retry.fail(backoff::jitter());
                tracing::warn!(instance = %instance.id, error = %e, why, retry_in = ?wait, "destroying an instance failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.cancelled() => {}
                }
            }
        });
    }

    /// Boots an instance of `template`, fresh or from a captured state.
    async fn boot(
        &self,
        key: &PoolKey,
        template: &Template,
        seed: Option<&std::path::Path>,
        egress: Option<&model::network::Egress>,
    ) -> Result<Instance<R::Handle>> {
        self.boot_as(key, template, seed, egress, false, &[]).await
    }

    /// `boot`, with `volumes` mounted before it is handed out: at boot where the runtime
    /// cannot mount into a running instance, else right after.
    async fn boot_mounted(
        &self,
        key: &PoolKey,
        template: &Template,
        seed: Option<&std::path::Path>,
        egress: Option<&model::network::Egress>,
        volumes: &[model::VolumeMount],
    ) -> Result<Instance<R::Handle>> {
        if self.inner.runtime.mounts_volumes_live() {
            let booted = self.boot(key, template, seed, egress).await;
            return self.with_volumes(booted, volumes).await;
        }
        self.boot_as(key, template, seed, egress, false, volumes)
            .await
    }

    /// `boot`, for a build step when `build` (see `runtime::BootSpec::build`), with `volumes`
    /// for a runtime that mounts them at boot.
    async fn boot_as(
        &self,
        key: &PoolKey,
        template: &Template,
        seed: Option<&std::path::Path>,
        egress: Option<&model::network::Egress>,
        build: bool,
        volumes: &[model::VolumeMount],
    ) -> Result<Instance<R::Handle>> {
        let id = ids::new_instance_id();
        let dir = self.inner.paths.sandboxes.join(&id);
        let inst = self
            .inner
            .runtime
            .boot(runtime::BootSpec {
                instance_id: &id,
                key,
                template,
                seed,
                dir: &dir,
                egress,
                build,
                volumes,
            })
            .await?;
        let services = &template.meta.services;
        if !services.is_empty() {
            let rt = &self.inner.runtime;
            if let Err(e) =
                readiness::wait(rt, &inst, services, self.inner.cfg.service_timeout).await
            {
                self.destroy_later(inst, "its services did not start");
                return Err(e);
            }
        }
        // A built template's start command runs before the sandbox is warm or handed out,
        // so its server already answers.
        if template.meta.start_cmd.is_some() || template.meta.ready_cmd.is_some() {
            let id = inst.id.clone();
            let started = self
                .start_command(&inst, template, self.inner.cfg.service_timeout, |line| {
                    tracing::debug!(instance = %id, "{line}");
                })
                .await;
            if let Err(e) = started {
                self.destroy_later(inst, "its start command did not become ready");
                return Err(e.context("the template's start command"));
            }
        }
        Ok(inst)
    }

    /// Takes a slot for an instance to be booted for a caller, or says why there is none.
    fn reserve(&self, st: &mut State<R::Handle>, count: u32) -> Result<()> {
        if st.closing {
            return Err(Error::unavailable(format!(
                "node {:?} is shutting down",
                self.name()
            )));
        }
        let max = self.inner.cfg.max_sandboxes;
        if st.instances() + count > max {
            return Err(Error::no_capacity(format!(
                "node {:?} runs {} of at most {max} sandboxes; {count} more do not fit",
                self.name(),
                st.instances()
            )));
        }
        st.booting_for_claims += count;
        Ok(())
    }

    pub fn info(&self) -> NodeInfo {
        let templates = self.templates();
        let st = self.state();
        let cfg = &self.inner.cfg;
        NodeInfo {
            name: cfg.name.clone(),
            advertise_address: cfg.advertise_address.clone(),
            pools: st
                .pools
                .iter()
                .map(|(k, p)| PoolStatus {
                    key: k.clone(),
                    warm: p.warm.len() as u32,
                    target: p.target,
                    booting: p.booting,
                    captures_memory: self.inner.runtime.captures_memory(&k.net),
                })
                .collect(),
            claimed: st.claims.len() as u32,
            paused: st
                .claims
                .values()
                .filter(|c| c.record.phase == model::Phase::Paused)
                .count() as u32,
            checkpoints: st.checkpoints.len() as u32,
            limits: NodeLimits {
                lease_default_seconds: cfg.lease.default.as_secs(),
                lease_max_seconds: cfg.lease.max.as_secs(),
                fork_limit: cfg.fork_limit,
                max_sandboxes: cfg.max_sandboxes,
                cold_start: cfg.cold_start,
                paused_retention_seconds: cfg.paused_retention.as_secs(),
            },
            templates: templates.iter().map(|t| t.meta.name.clone()).collect(),
            template_info: templates
                .iter()
                .map(|t| model::TemplateInfo {
                    name: t.meta.name.clone(),
                    size_bytes: t.meta.size_bytes,
                    packages: t.meta.packages.clone(),
                    kind: format!("{:?}", t.meta.kind).to_lowercase(),
                    source: t.meta.source.clone(),
                    created_at: Some(t.meta.created_at),
                    aliases: t.meta.aliases.clone(),
                    size: t.meta.size.clone().unwrap_or_default(),
                    owner: t
                        .meta
                        .e2b
                        .as_ref()
                        .map(|e| e.team.clone())
                        .unwrap_or_default(),
                    e2b_names: self.e2b_names(t),
                    public: self.is_public(t),
                    layer_bytes: if t.meta.kind == crate::templates::Kind::Built {
                        t.meta.size_bytes
                    } else {
                        0
                    },
                })
                .collect(),
            data_address: cfg.data_address.clone(),
            boundary: self.inner.runtime.describe(),
            captures_memory: ["none", "egress"]
                .iter()
                .any(|n| self.inner.runtime.captures_memory(n)),
            templates_building: self.templates_building(),
            builds: self.inner.runtime.commits(),
            revision: st.revision,
            lost: st.lost.iter().cloned().collect(),
            runtime: self.inner.runtime.name().to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            started_at: self.inner.started_at,
            disk_bytes: self.inner.disk_bytes,
            usage: st
                .usage
                .iter()
                .map(|(t, (n, at))| model::TemplateUsage {
                    template: t.clone(),
                    claims: *n,
                    last_claim: Some(*at),
                })
                .collect(),
        }
    }

    /// A claimed sandbox and the inventory revision it is current as of (read under one
    /// lock, so every change the record shows was emitted at or before that revision).
    pub fn get(&self, id: &str) -> Result<(SandboxRecord, u64)> {
        let st = self.state();
        st.claims
            .get(id)
            .map(|c| (c.record.clone(), st.revision))
            .ok_or_else(|| self.not_found(&st, id))
    }

    /// Claimed sandboxes (without tokens), optionally only those with one claim ref.
    pub fn list(&self, claim_ref: Option<&str>) -> (Vec<SandboxRecord>, u64) {
        let st = self.state();
        let mut out: Vec<SandboxRecord> = st
            .claims
            .values()
            .filter(|c| claim_ref.is_none_or(|r| c.record.claim_ref == r))
            .map(|c| c.record.clone().without_token())
            .collect();
        out.sort_by(|a, b| {
            a.claimed_at
                .cmp(&b.claimed_at)
                .then_with(|| a.id.cmp(&b.id))
        });
        (out, st.revision)
    }

    /// A snapshot of the inventory and a receiver for every change after it.
    pub fn watch(&self) -> (Vec<SandboxRecord>, u64, broadcast::Receiver<InventoryEvent>) {
        let st = self.state();
        let rx = self.inner.events.subscribe();
        let snapshot = st
            .claims
            .values()
            .map(|c| c.record.clone().without_token())
            .collect();
        (snapshot, st.revision, rx)
    }

    /// Writes the index now. Claims rely on the background writer; checkpoints, which must
    /// survive a crash right after they were reported, call this before answering.
    pub(crate) async fn persist_now(&self) -> Result<()> {
        self.persist_with(None).await
    }

    /// Writes the index with `adding` in it, and only once that write succeeded puts `adding`
    /// among the node's checkpoints (still as the one writer, so no later write can miss it).
    /// A write that fails (a full disk) leaves the file as it was and memory without the
    /// checkpoint: nothing lists what the index does not hold.
    async fn persist_with(&self, adding: Option<CheckpointRecord>) -> Result<()> {
        let _one_writer = self.inner.persist_lock.lock().await;
        let index = {
            let st = self.state();
            let mut checkpoints: Vec<CheckpointRecord> = st.checkpoints.values().cloned().collect();
            checkpoints.extend(adding.iter().cloned());
            IndexFile {
                version: store::INDEX_VERSION,
                node: self.name().to_string(),
                claims: st
                    .claims
                    .values()
                    .map(|c| PersistedClaim {
                        record: c.record.clone(),
                        instance: c.instance.clone(),
                    })
                    .collect(),
                checkpoints,
                lost: st.lost.iter().cloned().collect(),
            }
        };
        let path = self.inner.paths.index.clone();
        tokio::task::spawn_blocking(move || index.save(&path))
            .await
            .map_err(|e| Error::internal(format!("persist task failed: {e}")))??;
        if let Some(ck) = adding {
            self.state().checkpoints.insert(ck.id.clone(), ck);
        }
        Ok(())
    }

    async fn persist_loop(self) {
        loop {
            tokio::select! {
                _ = self.inner.wake_persist.notified() => {}
                _ = self.inner.shutdown.cancelled() => return,
            }
            // Claims do not outlive their node's process, so their records are written in
            // batches: one write for every burst of changes, off the claim path.
            tokio::select! {
                _ = tokio::time::sleep(PERSIST_BATCH) => {}
                _ = self.inner.shutdown.cancelled() => return,
            }
            if let Err(e) = self.persist_now().await {
                tracing::error!(error = %e, "writing the node index failed");
            }
        }
    }

    /// Stops accepting work and ends watches and background loops. In-flight requests finish.
    pub fn close(&self) {
        self.state().closing = true;
        self.inner.shutdown.cancel();
    }

    /// Closes the node and destroys every instance it runs. Claims destroyed this way are
    /// remembered as lost, so a later Get explains what happened to them. Checkpoints stay.
    pub async fn shutdown(&self) -> Result<()> {
        self.close();
        let (claims, warm) = {
            let mut st = self.state();
            let claims: Vec<Claim<R::Handle>> = st.claims.drain().map(|(_, c)| c).collect();
            let warm: Vec<Instance<R::Handle>> = st
                .pools
                .values_mut()
                .flat_map(|p| p.warm.drain(..))
                .collect();
            let now = Utc::now();
            for c in &claims {
                st.remember_lost(LostClaim {
                    id: c.record.id.clone(),
                    claim_ref: c.record.claim_ref.clone(),
                    reason: format!("destroyed when node {} shut down", self.name()),
                    lost_at: now,
                });
                st.emit(
                    &self.inner.events,
                    InventoryChange::Deleted(c.record.clone().without_token()),
                );
            }
            (claims, warm)
        };
        let runtime = &self.inner.runtime;
        for c in claims.iter().filter(|c| c.record.paused_on_disk()) {
            let _ = tokio::fs::remove_dir_all(self.saved_files(&c.record.id)).await;
        }
        let destroys = claims
            .iter()
            // A sandbox paused on disk has no instance left.
            .filter(|c| !c.record.paused_on_disk())
            .map(|c| &c.instance)
            .chain(warm.iter())
            .map(|i| runtime.destroy(i));
        for r in futures::future::join_all(destroys).await {
            if let Err(e) = r {
                tracing::error!(error = %e, "destroying an instance at shutdown failed");
            }
        }
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
        // Refills that finished after the drain above put nothing back (the node is closing),
        // but make sure no warm instance is left.
        let late: Vec<Instance<R::Handle>> = {
            let mut st = self.state();
            st.pools
                .values_mut()
                .flat_map(|p| p.warm.drain(..))
                .collect()
        };
        for i in late {
            let _ = runtime.destroy(&i).await;
        }
        self.persist_now().await
    }
}

/// Where a claimed instance's state came from.
#[derive(Debug, Clone)]
pub(crate) enum Origin {
    Pool,
    Checkpoint(String),
    Fork { parent: String, prefix: String },
}
