//! A node's configuration and the directory layout under its data directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::model::{LeasePolicy, PoolTarget};
use crate::sandbox::spec::IdMap;

#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub name: String,
    pub data_dir: PathBuf,
    /// Where templates live; `<data_dir>/templates` when unset.
    pub templates_dir: Option<PathBuf>,
    /// Filled in once the listener is bound (or given explicitly).
    pub advertise_address: String,
    /// The data plane's address as others reach it; filled in once it is bound.
    pub data_address: String,
    pub pools: Vec<PoolTarget>,
    pub lease: LeasePolicy,
    pub fork_limit: u32,
    /// Claimed + warm + booting instances this node runs at most.
    pub max_sandboxes: u32,
    /// Boot on a claim that finds its pool empty, instead of answering RESOURCE_EXHAUSTED.
    pub cold_start: bool,
    /// Instances booted at once to refill pools.
    pub refill_concurrency: usize,
    /// The host ids sandbox ids map to (sandbox root is `ids.base`).
    pub ids: IdMap,
    /// Every sandbox's disk size instead of its tier's.
    pub disk_bytes: Option<u64>,
    /// Which runtime builds sandboxes.
    pub runtime: RuntimeChoice,
    /// Bytes all checkpoints on this node may take together (memory checkpoints are large).
    pub checkpoint_budget_bytes: u64,
    /// How long a paused sandbox is kept (its lease does not run while it is paused).
    pub paused_retention: Duration,
    /// Private or host ranges sandboxes may reach although they are blocked by default.
    pub sandbox_reachable: Vec<String>,
    /// Names the egress proxy resolves itself (`--egress-host`).
    pub egress_hosts: Vec<(String, std::net::Ipv4Addr)>,
    /// CA certificates (PEM) the egress proxy trusts besides the node's (`--egress-ca-file`).
    pub egress_trust: Vec<String>,
    /// The tenants' secrets, for the egress proxy's header rules (the gateway's own store for
    /// its embedded node; `--secrets-dir` for a node of its own).
    pub secrets: Option<std::sync::Arc<crate::secrets::SecretStore>>,
    /// Where tenants' volumes are (the gateway's `--volumes-dir`, shared storage in a fleet);
    /// a claim may mount directories below it and nothing else.
    pub volumes_dir: Option<std::path::PathBuf>,
    /// How long a sandbox may take to boot (or restore) before the node gives up on it and
    /// answers "no capacity": on an overloaded host, another node or a later retry will do.
    pub boot_timeout: Duration,
    /// How long a template's services (the code interpreter and its kernels) may take to
    /// answer after the sandbox booted; a pool's sandbox counts as warm only then.
    pub service_timeout: Duration,
    /// Largest archive a template build's COPY step may upload.
    pub template_upload_max_bytes: u64,
    /// Warm sandboxes kept for each built template's default build that has a start or ready
    /// command (0: none).
    pub built_pool: u32,
    /// Bytes the teams' build caches (layers no template uses) and uploads may take.
    pub build_cache_bytes: u64,
    /// Where builds pull images from.
    pub registry: crate::templates::registry::RegistryConfig,
}

/// The default upload limit of a template build's files: 1 GiB.
pub const DEFAULT_TEMPLATE_UPLOAD_MAX_BYTES: u64 = 1 << 30;

/// The default budget of build caches and uploads: 10 GiB.
pub const DEFAULT_BUILD_CACHE_MIB: u64 = 10 << 10;

/// The default paused retention: 7 days.
pub const DEFAULT_PAUSED_RETENTION_SECONDS: u64 = 7 * 24 * 3600;

/// The default checkpoint budget: 32 GiB.
pub const DEFAULT_CHECKPOINT_BUDGET_MIB: u64 = 32 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeKind {
    /// Linux namespaces, cgroups and seccomp on the host kernel (the default).
    Builtin,
    /// gVisor (runsc): its own kernel per sandbox; pause, snapshot and fork keep memory.
    Gvisor,
    /// gvisor when runsc is installed and works, else builtin.
    Auto,
}

#[derive(Debug, Clone)]
pub struct RuntimeChoice {
    pub kind: RuntimeKind,
    /// runsc's path [default: found on PATH].
    pub runsc: Option<PathBuf>,
    /// runsc's platform: ptrace here; systrap or kvm on newer builds and hosts.
    pub runsc_platform: String,
    /// Leave the host's kernel settings as they are (see `gvisor::hostmem`).
    pub protect_kernel_defaults: bool,
    /// How many paused gVisor sandboxes have their restore's container made ahead.
    pub resume_standbys: usize,
}

impl Default for RuntimeChoice {
    fn default() -> Self {
        RuntimeChoice {
            kind: RuntimeKind::Builtin,
            runsc: None,
            runsc_platform: "auto".into(),
            protect_kernel_defaults: false,
            resume_standbys: DEFAULT_RESUME_STANDBYS,
        }
    }
}

/// Paused gVisor sandboxes whose resume is readied ahead, by default: each standby is a waiting
/// Sentry and gofer of about 24 MiB (see `gvisor::standby`).
pub const DEFAULT_RESUME_STANDBYS: usize = 8;

/// Sandbox root is this host uid by default: far above the ranges `/etc/subuid` hands out to
/// people (100000 and up), so no local user's own containers share ids with sandboxes.
pub const DEFAULT_UID_BASE: u32 = 1_000_000_000;

impl NodeConfig {
    pub fn new(name: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        NodeConfig {
            name: name.into(),
            data_dir: data_dir.into(),
            templates_dir: None,
            advertise_address: String::new(),
            data_address: String::new(),
            pools: Vec::new(),
            lease: LeasePolicy::default(),
            fork_limit: 16,
            max_sandboxes: 512,
            cold_start: true,
            refill_concurrency: 4,
            ids: IdMap {
                base: DEFAULT_UID_BASE,
                count: IdMap::COUNT,
            },
            disk_bytes: None,
            runtime: RuntimeChoice::default(),
            checkpoint_budget_bytes: DEFAULT_CHECKPOINT_BUDGET_MIB << 20,
            paused_retention: Duration::from_secs(DEFAULT_PAUSED_RETENTION_SECONDS),
            sandbox_reachable: Vec::new(),
            egress_hosts: Vec::new(),
            egress_trust: Vec::new(),
            secrets: None,
            volumes_dir: None,
            boot_timeout: BOOT_TIMEOUT,
            service_timeout: SERVICE_TIMEOUT,
            template_upload_max_bytes: DEFAULT_TEMPLATE_UPLOAD_MAX_BYTES,
            built_pool: 1,
            build_cache_bytes: DEFAULT_BUILD_CACHE_MIB << 20,
            registry: Default::default(),
        }
    }

    pub fn paths(&self) -> Paths {
        Paths::new(&self.data_dir, self.templates_dir.as_deref())
    }
}

pub const BOOT_TIMEOUT: Duration = Duration::from_secs(15);
/// Starting kernels and warming their imports takes seconds, more on gVisor's ptrace platform.
pub const SERVICE_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone)]
pub struct Paths {
    pub root: PathBuf,
    pub index: PathBuf,
    pub lock: PathBuf,
    pub sandboxes: PathBuf,
    pub checkpoints: PathBuf,
    pub templates: PathBuf,
    /// Captures in flight (fork sources); emptied on start.
    pub scratch: PathBuf,
    /// Blank disk images, one per size.
    pub disks: PathBuf,
    /// The files of sandboxes paused without their memory, one directory per sandbox id.
    pub paused: PathBuf,
    /// runsc's state (the gvisor runtime).
    pub runsc: PathBuf,
}

impl Paths {
    pub fn new(root: &Path, templates: Option<&Path>) -> Self {
        Paths {
            root: root.to_path_buf(),
            index: root.join("index.json"),
            lock: root.join("lock"),
            sandboxes: root.join("sandboxes"),
            checkpoints: root.join("checkpoints"),
            templates: templates.map_or_else(|| root.join("templates"), Path::to_path_buf),
            scratch: root.join("scratch"),
            disks: root.join("disks"),
            paused: root.join("paused"),
            runsc: root.join("runsc"),
        }
    }
}
