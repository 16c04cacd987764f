//! The gVisor runtime: every sandbox is a runsc container whose kernel is gVisor's Sentry
//! (the host kernel only sees the Sentry's few system calls), started from an OCI bundle over
//! the template's root with the agent as init, inside the sandbox's cgroups. Its verbs capture
//! memory: pause writes a checkpoint (memory, processes, open files) to the node's disk and
//! stops the sandbox; resume restores it; snapshot and fork restore copies of one checkpoint.
//! The node reaches the sandbox only through its door, a Unix socket in a directory it shares
//! with it (see `crate::sandbox::gvisor_init`).

mod boot;
pub mod buildroot;
pub mod bundle;
mod checkpoint;
mod door;
pub mod files;
pub mod holder;
pub mod hostmem;
pub mod oomguard;
mod pending;
pub mod runsc;
mod standby;
pub mod views;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::builtin::AgentCommand;
use super::cgroup::{CgroupSet, Cgroups, Limits};
use super::reaper::Reaper;
use super::{BootSpec, Conn, Instance, Runtime, Usage};
use crate::model::network::Egress;
use crate::model::{Error, Result, ids};
use crate::node::egress::policy::Rules;
use crate::node::egress::proxy::Proxies;
use crate::sandbox::gvisor_init::{DOOR, GENERATION};
use crate::sandbox::net::ROUTER_ADDR;
use crate::sandbox::netholder::HolderSpec;
use crate::sandbox::spec::{IdMap, Net};
use crate::templates::{Template, TemplateStore};
use boot::Start;
use buildroot::BuildRoots;
use holder::Holder;
use pending::{Pending, PendingImages};
use runsc::Runsc;
use standby::Standby;
use views::{ChildMounts, IdViews};

#[derive(Debug, Clone)]
pub struct GvisorConfig {
    pub agent: AgentCommand,
    pub state_root: PathBuf,
    pub templates: PathBuf,
    pub ids: IdMap,
    pub tag: String,
    pub boot_timeout: Duration,
    pub runsc: Runsc,
    /// The node's data-directory lock (see `Reaper`).
    pub node_lock: PathBuf,
    /// For egress; without it sandboxes have loopback only.
    pub slirp4netns: Option<PathBuf>,
    /// What no sandbox may reach (see `crate::sandbox::net`).
    pub blocked: Vec<String>,
    /// Where blank disk images are kept (a build instance's writes go to one).
    pub disks: PathBuf,
    /// Every build instance's disk size instead of its tier's.
    pub disk_bytes: Option<u64>,
    /// Names the egress proxy resolves before DNS.
    pub egress_hosts: Vec<(String, std::net::Ipv4Addr)>,
    /// Where the egress proxy fills `${e2b.secrets.NAME}` from.
    pub secrets: Option<std::sync::Arc<crate::secrets::SecretStore>>,
    /// CA files the egress proxy trusts for upstreams, besides the system's.
    pub egress_trust: Vec<String>,
    /// How many paused sandboxes have their restore's container made ahead (see `standby`).
    pub standbys: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GvisorHandle {
    pub cgroup: CgroupSet,
    /// Whether the sandbox has egress (a network holder each time it runs).
    #[serde(default)]
    pub egress: bool,
    /// What the agent's /init requires (kept across checkpoints: it is in the agent's memory).
    pub init_token: String,
    /// When its root (the template's plain copy) was made, in ns since the epoch: files it
    /// changed after are its own (see `files`); 0 saves them all.
    #[serde(default)]
    pub root_made_ns: i64,
    /// Whether volumes are mounted in it (its checkpoint would hold their mounts, which a
    /// restore elsewhere does not have).
    #[serde(default)]
    pub volumes: bool,
}

/// What changes while a sandbox lives: the runsc container that runs it, or the image it is
/// paused in.
struct Live {
    container: Option<String>,
    paused: bool,
    /// Paused by freezing in place (`runsc pause`) rather than by a checkpoint.
    frozen: bool,
    /// A pause, resume or capture is under way: between a checkpoint and its restore the
    /// sandbox has no processes, and that is not death.
    busy: bool,
    /// The network namespace of the running container (egress only).
    holder: Option<Holder>,
    /// The sandbox's egress rules, put in each new holder before the sandbox runs in it.
    egress: Option<Egress>,
    /// Ends the largest process inside before the sandbox's memory runs out (see `oomguard`);
    /// stops when the sandbox is forgotten.
    _guard: Option<oomguard::Guard>,
    /// The processes the guard ended.
    oom_kills: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Work left for after an answer (see `later`), which its destroy waits for.
    pending: Option<tokio::task::JoinHandle<()>>,
    /// The container its next restore goes into, made while it is paused (see `standby`).
    standby: Option<Standby>,
}

/// Written beside a checkpoint image: what a restore of it needs.
#[derive(Serialize, Deserialize)]
struct ImageMeta {
    init_token: String,
}

/// What a capture takes (see `capturable`).
enum Capture {
    /// A paused sandbox's image was copied (this many bytes); it stays paused.
    Copied(u64),
    /// The running sandbox is to be checkpointed (and restored, where runsc stops it).
    Checkpoint,
}

const IMAGE_META: &str = "sandbox.json";
const IMAGE_DIR: &str = "paused";
/// How long a sandbox whose checkpoint failed has to answer again before it is taken as dead.
const RUN_ON_WITHIN: Duration = Duration::from_secs(5);
/// How long one try at the door waits for its answer before the next try.
const PING_WITHIN: Duration = Duration::from_secs(1);
/// Where an instance's volumes are shown to runsc (see `volume_views`).
const VOLUMES_DIR: &str = "volumes";

pub struct GvisorRuntime {
    cfg: GvisorConfig,
    cgroups: Cgroups,
    store: TemplateStore,
    libs: Vec<PathBuf>,
    loader: PathBuf,
    live: Mutex<HashMap<String, Live>>,
    /// For sandboxes' own egress policies (`crate::sandbox::egress`).
    nft: Option<PathBuf>,
    /// Sandboxes whose policies allow names or set headers (`crate::node::egress`), each in
    /// its router's namespace.
    proxies: Proxies,
    /// Ends the runsc processes of every sandbox if the node dies; network holders watch its
    /// lifeline too.
    reaper: Reaper,
    /// Build instances' roots, or why this node cannot have them.
    builds: std::result::Result<std::sync::Arc<BuildRoots>, String>,
    /// Id-mapped views for build roots and volumes, or why this node cannot make them.
    views: std::result::Result<std::sync::Arc<IdViews>, String>,
    /// Images a capture is writing now, which a fork's children start from ahead.
    pending: PendingImages,
}

fn io_err(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

/// The shared libraries this binary needs and its ELF loader, as `ldd` resolves them.
fn linked_libraries(binary: &Path) -> Result<(Vec<PathBuf>, PathBuf)> {
    let out = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(io_err("running ldd"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut libs = Vec::new();
    let mut loader = None;
    for line in text.lines() {
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            let p = PathBuf::from(p);
            if line.contains("ld-linux") {
                loader = Some(p.clone());
            }
            libs.push(p);
        }
    }
    let loader = loader.ok_or_else(|| {
        Error::internal(format!("ldd found no ELF loader for {}", binary.display()))
    })?;
    Ok((libs, loader))
}

/// Whether `pid` is a runsc sandbox process (gVisor's kernel; runsc names it so).
fn is_sentry(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| c.split(|&b| b == 0).next() == Some(b"runsc-sandbox".as_slice()))
}

impl GvisorRuntime {
    pub fn new(cfg: GvisorConfig) -> Result<Self> {
        if !super::sys::is_root() {
            return Err(Error::invalid(
                "the gvisor runtime needs root (runsc runs sandboxes as root)",
            ));
        }
        let cgroups = Cgroups::detect(&cfg.tag).ok_or_else(|| {
            Error::invalid(
                "no cgroup file system is mounted; sandboxes need cgroups for their limits",
            )
        })?;
        let (libs, loader) = linked_libraries(&cfg.agent.program)?;
        let store = TemplateStore::new(&cfg.templates, cfg.ids)?;
        let reaper = Reaper::spawn(&cfg.agent, &cgroups, &cfg.node_lock)?;
        let views = IdViews::new(cfg.ids)
            .map(std::sync::Arc::new)
            .map_err(|e| format!("no user namespace for id-mapped mounts: {e}"));
        let builds = views.clone().and_then(|v| {
            BuildRoots::new(v, cfg.ids, &cfg.templates, cfg.disks.clone())
                .map(std::sync::Arc::new)
                .map_err(|e| e.to_string())
        });
        if let Err(why) = &builds {
            tracing::warn!("template builds are off on this node: {why}");
        }
        let proxies = Proxies::new(
            &cfg.blocked,
            &cfg.egress_hosts,
            cfg.secrets.clone(),
            &cfg.egress_trust,
        )?;
        Ok(GvisorRuntime {
            proxies,
            builds,
            views,
            reaper,
            cfg,
            cgroups,
            store,
            libs,
            loader,
            live: Mutex::new(HashMap::new()),
            pending: PendingImages::default(),
            nft: super::builtin::which("nft"),
        })
    }

    /// The template's root as gVisor boots it: one plain tree with the image's ids, made by
    /// the first call after each build of it (a gigabyte or two for code-interpreter) off the
    /// async threads, which also serve the node's calls meanwhile.
    async fn plain_root(&self, t: &Template) -> Result<PathBuf> {
        let (store, template) = (self.store.clone(), t.clone());
        let started = Instant::now();
        let root = tokio::task::spawn_blocking(move || store.plain_root(&template))
            .await
            .map_err(|e| Error::internal(format!("preparing the template failed: {e}")))??;
        let took = started.elapsed();
        if took > Duration::from_millis(100) {
            tracing::info!(template = %t.meta.name, "template's root ready for gVisor in {took:.1?}");
        }
        Ok(root)
    }

    /// Puts `rules` in force in the router namespace at `router` (the instance `id`'s), with
    /// its egress proxy there when they name hosts; the proxy is started (or given the new
    /// rules) before the redirect sends anything to it, and stopped after the redirect is gone.
    async fn enforce(&self, id: &str, router: PathBuf, rules: Option<&Egress>) -> Result<()> {
        let proxy = match rules.filter(|e| e.needs_proxy()) {
            Some(e) => Some(
                self.proxies
                    .ensure(id, router.clone(), ROUTER_ADDR, Rules::from_egress(e)?)
                    .await?,
            ),
            None => None,
        };
        super::builtin::enforce_egress(
            self.nft.as_deref(),
            router,
            rules,
            crate::sandbox::egress::Hook::Router,
            proxy,
        )
        .await?;
        if proxy.is_none() {
            self.proxies.forget(id);
        }
        Ok(())
    }

    /// Whether sandboxes with net `egress` can be made here.
    pub fn offers_egress(&self) -> bool {
        self.cfg.slirp4netns.is_some()
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<String, Live>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the sandbox busy until the guard is dropped (see `Live::busy`).
    fn busy<'a>(&'a self, id: &'a str) -> Busy<'a> {
        if let Some(l) = self.live().get_mut(id) {
            l.busy = true;
        }
        Busy { rt: self, id }
    }

    fn container(&self, inst: &Instance<GvisorHandle>) -> Option<String> {
        self.live().get(&inst.id).and_then(|l| l.container.clone())
    }
}

struct Busy<'a> {
    rt: &'a GvisorRuntime,
    id: &'a str,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if let Some(l) = self.rt.live().get_mut(self.id) {
            l.busy = false;
        }
    }
}

impl Runtime for GvisorRuntime {
    type Handle = GvisorHandle;

    fn name(&self) -> &'static str {
        "gvisor"
    }

    fn describe(&self) -> String {
        format!(
            "gvisor: {} ({} platform); each sandbox runs on gVisor's own kernel (the Sentry) in a runsc container, cgroups {} for memory/CPU/pids; pause, snapshot and fork capture memory; template builds {}; egress from gVisor's own network stack through a router namespace (nftables rules and the egress proxy) to slirp4netns",
            self.cfg.runsc.version,
            self.cfg.runsc.platform,
            self.cgroups.describe(),
            match &self.builds {
                Ok(_) => "write through to id-mapped overlays".to_string(),
                Err(why) => format!("are off ({why})"),
            }
        )
    }

    fn enforces_egress(&self) -> bool {
        self.nft.is_some()
    }

    fn proxies_egress(&self) -> bool {
        self.nft.is_some()
    }

    fn egress_ca(&self, inst: &Instance<GvisorHandle>) -> Result<String> {
        Ok(self.proxies.ca(&inst.id)?.pem())
    }

    async fn set_egress(
        &self,
        inst: &Instance<GvisorHandle>,
        egress: Option<&Egress>,
    ) -> Result<()> {
        let netns = {
            let mut live = self.live();
            let l = live
                .get_mut(&inst.id)
                .ok_or_else(|| Error::unavailable(format!("sandbox {} is not running", inst.id)))?;
            l.egress = egress.cloned();
            // A checkpointed sandbox has no holder of its own; its next one gets the rules at
            // birth, unless it was made already, for its standby (see `standby`), whose
            // rules change now, before the resume that runs the sandbox behind it.
            let standby = l.standby.as_ref().and_then(|s| s.holder.as_ref());
            l.holder.as_ref().or(standby).map(Holder::router_netns)
        };
        match netns {
            Some(router) => self.enforce(&inst.id, router, egress).await,
            None => Ok(()),
        }
    }

    async fn commit(
        &self,
        inst: &Instance<GvisorHandle>,
        dest: &Path,
        skip: &'static [&'static str],
    ) -> Result<Option<u64>> {
        let roots = self.build_roots()?;
        if BuildRoots::disk(&inst.dir).is_none() {
            return Err(Error::invalid(format!(
                "sandbox {} keeps its writes in its memory; only a build's can be committed",
                inst.id
            )));
        }
        // The Sentry's page cache reaches the disk, then the sandbox stops, so the tree holds
        // still while it is read; the instance is destroyed next.
        let synced = Self::ask(&inst.dir, "SYNC").await?;
        if synced.trim() != "OK" {
            return Err(Error::unavailable(format!(
                "the sandbox did not flush its writes: {:?}",
                synced.trim()
            )));
        }
        let container = self
            .live()
            .get_mut(&inst.id)
            .and_then(|l| l.container.take());
        if let Some(c) = container {
            self.cfg.runsc.delete(&c).await?;
        }
        let (dir, dest) = (inst.dir.clone(), dest.to_path_buf());
        tokio::task::spawn_blocking(move || roots.commit(&dir, &dest, skip))
            .await
            .map_err(|e| Error::internal(format!("committing the sandbox's writes failed: {e}")))?
            .map_err(io_err("committing the sandbox's writes"))
    }

    fn commits(&self) -> bool {
        self.builds.is_ok()
    }

    fn captures_files(&self) -> Result<()> {
        // The init streams the writes out of runsc's in-memory overlay (see `files`).
        Ok(())
    }

    async fn capture_files(
        &self,
        inst: &Instance<GvisorHandle>,
        frozen: bool,
        dest: &Path,
    ) -> Result<u64> {
        // The init reads the files itself, so a paused sandbox runs again first (its other
        // processes are stopped again by the save).
        if frozen {
            self.resume(inst).await?;
        }
        let _busy = self.busy(&inst.id);
        let door = Self::door(&inst.dir);
        match files::save(&door, inst.handle.root_made_ns, dest).await {
            Ok(bytes) => Ok(bytes),
            Err(e) => {
                files::resume_processes(&door).await;
                if frozen && let Err(again) = self.pause(inst).await {
                    tracing::error!(instance = %inst.id, error = %again, "a sandbox could not be paused again after its files failed to save");
                }
                Err(e)
            }
        }
    }

    fn captures_memory(&self, net: &str) -> bool {
        // Older runsc builds cannot save internet connections (not even closed ones they still
        // track), and a failed checkpoint ends the sandbox; newer ones drop them.
        net == "none" || self.cfg.runsc.saves_connections
    }

    async fn prepare_template(&self, t: &Template) -> Result<()> {
        self.plain_root(t).await.map(drop)
    }

    async fn boot(&self, spec: BootSpec<'_>) -> Result<Instance<GvisorHandle>> {
        self.start_instance(spec).await
    }

    async fn destroy(&self, inst: &Instance<GvisorHandle>) -> Result<()> {
        let live = self.live().remove(&inst.id);
        self.proxies.forget_instance(&inst.id);
        if let Some(mut l) = live {
            if let Some(pending) = l.pending.take() {
                let _ = pending.await;
            }
            if let Some(c) = l.container {
                let _ = self.cfg.runsc.delete(&c).await;
            }
            if let Some(s) = l.standby {
                self.drop_standby(s).await;
            }
        }
        let cgroups = self.cgroups.clone();
        let cg = inst.handle.cgroup.clone();
        let dir = inst.dir.clone();
        tokio::task::spawn_blocking(move || {
            cgroups
                .destroy(&cg)
                .map_err(io_err(format!("destroying sandbox {}", dir.display())))?;
            BuildRoots::release(&dir)
                .map_err(io_err(format!("destroying sandbox {}", dir.display())))?;
            match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(Error::io(format!("removing {}", dir.display()), e))
                }
                _ => Ok(()),
            }
        })
        .await
        .map_err(|e| Error::internal(format!("destroy task failed: {e}")))?
    }

    /// A checkpoint to the node's disk where one is safe (the memory is freed); else the
    /// sandbox is frozen in place, which keeps its memory and its connections.
    async fn pause(&self, inst: &Instance<GvisorHandle>) -> Result<()> {
        let _busy = self.busy(&inst.id);
        let why_not = if inst.handle.egress && !self.cfg.runsc.saves_connections {
            Some("it has internet access".to_string())
        } else if inst.handle.volumes {
            Some("it has volumes mounted".to_string())
        } else {
            self.unsaveable(&inst.dir).await?
        };
        if let Some(why) = why_not {
            let container = self
                .container(inst)
                .ok_or_else(|| Error::conflict(format!("sandbox {} is not running", inst.id)))?;
            tracing::info!(id = %inst.id, reason = %why, "pausing in memory instead of to disk");
            self.cfg.runsc.pause(&container).await?;
            if let Some(l) = self.live().get_mut(&inst.id) {
                l.paused = true;
                l.frozen = true;
            }
            return Ok(());
        }
        let image = inst.dir.join(IMAGE_DIR);
        let _ = std::fs::remove_dir_all(&image);
        self.checkpoint_to(inst, &image).await?;
        if let Some(l) = self.live().get_mut(&inst.id) {
            l.paused = true;
        }
        Ok(())
    }

    async fn resume(&self, inst: &Instance<GvisorHandle>) -> Result<()> {
        let _busy = self.busy(&inst.id);
        let frozen = self
            .live()
            .get(&inst.id)
            .and_then(|l| l.frozen.then(|| l.container.clone()));
        if let Some(container) = frozen {
            let container = container.ok_or_else(|| {
                Error::internal(format!("sandbox {} lost its container", inst.id))
            })?;
            self.cfg.runsc.resume(&container).await?;
            if let Some(l) = self.live().get_mut(&inst.id) {
                l.paused = false;
                l.frozen = false;
            }
            return Ok(());
        }
        let image = inst.dir.join(IMAGE_DIR);
        let started = Instant::now();
        self.restore_into(inst, &image).await?;
        let restored = started.elapsed();
        // The image goes after the answer (a 512 MiB one takes ~45 ms to remove here), moved
        // aside first so that a pause sooner than that writes its own under the usual name.
        let spent = inst
            .dir
            .join(format!("{IMAGE_DIR}.spent-{}", ids::random_hex(4)));
        match std::fs::rename(&image, &spent) {
            Ok(()) => self.later(&inst.id, async move {
                let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(spent)).await;
            }),
            Err(_) => {
                let _ = std::fs::remove_dir_all(&image);
            }
        }
        tracing::debug!(
            instance = %inst.id,
            restore_ms = restored.as_secs_f64() * 1e3,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "resumed from the pause's image"
        );
        Ok(())
    }

    async fn ready_resume(&self, inst: &Instance<GvisorHandle>) -> Result<()> {
        self.make_standby(inst).await
    }

    async fn capture(
        &self,
        inst: &Instance<GvisorHandle>,
        paused: bool,
        dest: &Path,
    ) -> Result<u64> {
        // Nothing boots from it meanwhile, so it is not announced as pending.
        self.capture_beside(inst, paused, dest, None::<std::future::Ready<()>>)
            .await
            .0
    }

    async fn capture_then<T: Send>(
        &self,
        inst: &Instance<GvisorHandle>,
        paused: bool,
        dest: &Path,
        meanwhile: impl Future<Output = T> + Send,
    ) -> (Result<u64>, Option<T>) {
        self.capture_beside(inst, paused, dest, Some(meanwhile))
            .await
    }

    async fn usage(&self, inst: &Instance<GvisorHandle>) -> Result<Usage> {
        let m = Cgroups::measure(&inst.handle.cgroup);
        let disk = BuildRoots::disk(&inst.dir).and_then(|d| super::disk::usage(&d).ok());
        Ok(Usage {
            cpu_ns: m.cpu_ns.unwrap_or(0),
            mem_bytes: m.memory_bytes.unwrap_or(0),
            processes: m.pids.unwrap_or(0),
            measured: m.memory_bytes.is_some(),
            // The writable layer lives in the sandbox's memory, except a build's.
            disk_used: disk.map_or(0, |d| d.0),
            disk_total: disk.map_or(0, |d| d.1),
            oom_kills: m.oom_kills.unwrap_or(0)
                + self.live().get(&inst.id).map_or(0, |l| {
                    l.oom_kills.load(std::sync::atomic::Ordering::Relaxed)
                }),
        })
    }

    fn is_alive(&self, inst: &Instance<GvisorHandle>) -> bool {
        match self.live().get(&inst.id) {
            Some(l) if l.busy => true,
            Some(l) if l.paused && !l.frozen => inst.dir.join(IMAGE_DIR).exists(),
            // Its Sentry, not just any of its processes: a gofer or a network holder outlives
            // a Sentry the host killed, and such a sandbox is dead.
            Some(_) => Cgroups::pids(&inst.handle.cgroup)
                .into_iter()
                .any(is_sentry),
            None => false,
        }
    }

    async fn dial(&self, inst: &Instance<GvisorHandle>, port: u16) -> Result<Conn> {
        Self::open_port(&inst.dir, &inst.id, port).await
    }

    fn init_token(&self, inst: &Instance<GvisorHandle>) -> String {
        inst.handle.init_token.clone()
    }

    async fn reclaim_orphans(&self) {
        for c in self.cfg.runsc.list().await {
            tracing::warn!(container = %c, "deleting a runsc container left by an earlier run");
            let _ = self.cfg.runsc.delete(&c).await;
        }
        let files = self.cfg.runsc.remove_leftovers();
        if files > 0 {
            tracing::warn!(files, "removed runsc command files left by an earlier run");
        }
        for set in self.cgroups.leftovers() {
            if let Err(e) = self.cgroups.destroy(&set) {
                tracing::error!(error = %e, "could not remove orphaned cgroups");
            }
        }
        for m in buildroot::unmount_under(&self.cfg.state_root) {
            tracing::warn!(mount = %m.display(), "unmounted a build disk left by an earlier run");
        }
    }
}

impl Drop for GvisorRuntime {
    fn drop(&mut self) {
        self.cgroups.remove_parents();
    }
}
