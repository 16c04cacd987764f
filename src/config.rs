//! The command line: `serve` (the default), `node` and `agent`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::model::{LeasePolicy, PoolTarget};

#[derive(Debug, Parser)]
#[command(
    name = "sandbox-gateway",
    version,
    about = "e2b-compatible and Kubernetes-native sandboxes, with node daemons that keep warm pools",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// `serve` options, for a bare `sandbox-gateway`.
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway (the default). Without --node it starts an embedded node.
    Serve(Box<ServeArgs>),
    /// Run a node daemon that owns the sandboxes of this machine.
    Node(Box<NodeArgs>),
    /// Run the in-sandbox agent (started by a node for every sandbox).
    Agent(AgentArgs),
    /// Serve e2b's Code Interpreter API in front of Jupyter kernels (sandboxes of a
    /// code-interpreter template run it by themselves; this is for development).
    Interpreter(InterpreterArgs),
    /// Manage e2b API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Print the e2b surface's OpenAPI document.
    Openapi(OpenapiArgs),
    /// Print a kubeconfig for kubectl against the Kubernetes API of a local gateway.
    Kubeconfig(KubeconfigArgs),
    /// Build, import and list templates (the root filesystems sandboxes start from).
    #[command(subcommand)]
    Template(TemplateCommand),
}

#[derive(Debug, Subcommand)]
pub enum TemplateCommand {
    /// Build a template from Debian packages (with mmdebstrap), or add packages to another one.
    Build(TemplateBuildArgs),
    /// Import an OCI image archive (`docker save` output or an OCI layout tarball).
    Import(TemplateImportArgs),
    /// List the templates.
    List(TemplateDirArgs),
}

/// Where templates are and which ids they are prepared for.
#[derive(Debug, Clone, Args)]
pub struct TemplateDirArgs {
    /// The templates directory [default: DATA_DIR/node/templates, the embedded node's].
    #[arg(long, env = "SANDBOX_GATEWAY_TEMPLATES_DIR")]
    pub templates_dir: Option<PathBuf>,
    #[arg(long, env = "SANDBOX_GATEWAY_DATA_DIR", default_value_os_t = default_data_dir())]
    pub data_dir: PathBuf,
    /// The host uid of sandbox root on the nodes that use these templates.
    #[arg(long, default_value_t = crate::node::config::DEFAULT_UID_BASE)]
    pub uid_base: u32,
}

impl TemplateDirArgs {
    pub fn dir(&self) -> PathBuf {
        self.templates_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("node/templates"))
    }
}

#[derive(Debug, Clone, Args)]
pub struct TemplateBuildArgs {
    pub name: String,
    /// Debian packages to install (comma-separated), beside base's own unless --from is given.
    #[arg(long, value_delimiter = ',')]
    pub packages: Vec<String>,
    /// Start from this template and install the packages into a copy of it.
    #[arg(long)]
    pub from: Option<String>,
    /// Replace a template of the same name.
    #[arg(long, conflicts_with = "if_missing")]
    pub force: bool,
    /// Succeed without building when the template exists.
    #[arg(long)]
    pub if_missing: bool,
    #[command(flatten)]
    pub dir: TemplateDirArgs,
}

#[derive(Debug, Clone, Args)]
pub struct TemplateImportArgs {
    pub name: String,
    /// The image archive.
    pub file: PathBuf,
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub dir: TemplateDirArgs,
}

#[derive(Debug, Clone, Args)]
pub struct KubeconfigArgs {
    /// The bearer token: an e2b API key (its namespace is the one kubectl may use).
    #[arg(long, env = "E2B_API_KEY")]
    pub api_key: String,
    /// The gateway's Kubernetes API address.
    #[arg(long, default_value = "https://127.0.0.1:6443")]
    pub server: String,
    /// Default namespace of the context.
    #[arg(long)]
    pub namespace: Option<String>,
    /// The gateway's data directory (its CA is DATA_DIR/tls/ca.crt).
    #[arg(long, env = "SANDBOX_GATEWAY_DATA_DIR", default_value_os_t = default_data_dir())]
    pub data_dir: PathBuf,
    /// The CA to trust instead (PEM).
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Add a key (`e2b_` + 40 hex) for a namespace to the key file and print it once.
    Create(KeysCreateArgs),
}

#[derive(Debug, Clone, Args)]
pub struct KeysCreateArgs {
    /// The tenant's namespace (`*` makes an admin key that sees every namespace).
    #[arg(long)]
    pub namespace: String,
    /// The key file [default: DATA_DIR/api-keys, the one `serve` reads by default].
    #[arg(long)]
    pub file: Option<PathBuf>,
    #[arg(long, env = "SANDBOX_GATEWAY_DATA_DIR", default_value_os_t = default_data_dir())]
    pub data_dir: PathBuf,
}

fn default_data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_DATA_HOME") {
        return PathBuf::from(d).join("sandbox-gateway");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".local/share/sandbox-gateway");
    }
    PathBuf::from(".sandbox-gateway")
}

/// Warm pools out of the box: `base` with the node's network (what e2b SDKs ask for unless
/// they turn internet access off), `base` without a network of its own, and one sandbox of
/// `code-interpreter` (what `e2b-code-interpreter` asks for) at the template's own size, its
/// kernels started (the template is built in the background on first start).
const DEFAULT_POOLS: [&str; 3] = [
    "base/egress=2",
    "base=2",
    "code-interpreter/egress/medium=1",
];

/// A positive, finite number of seconds (fractions allowed), e.g. "15" or "0.5".
fn parse_seconds(s: &str) -> Result<Duration, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .and_then(|n| Duration::try_from_secs_f64(n).ok())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{s:?} must be a positive number of seconds"))
}

fn parse_pool(s: &str) -> Result<PoolTarget, String> {
    s.parse().map_err(|e: crate::model::Error| e.message)
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address of the e2b REST API.
    #[arg(
        long,
        default_value = "127.0.0.1:3000",
        env = "SANDBOX_GATEWAY_E2B_LISTEN"
    )]
    pub e2b_listen: String,
    /// Address of the Kubernetes API facade.
    #[arg(
        long,
        default_value = "127.0.0.1:6443",
        env = "SANDBOX_GATEWAY_KUBE_LISTEN"
    )]
    pub kube_listen: String,
    /// A node daemon's address (repeatable). Without any, an embedded node is started.
    #[arg(long = "node", value_name = "ADDR")]
    pub nodes: Vec<String>,
    /// Where the gateway (and its embedded node) keep their state.
    #[arg(long, env = "SANDBOX_GATEWAY_DATA_DIR", default_value_os_t = default_data_dir())]
    pub data_dir: PathBuf,
    /// File holding the fleet token nodes require [default: DATA_DIR/node-token].
    #[arg(long)]
    pub node_token_file: Option<PathBuf>,
    /// Warm pool of the embedded node, TEMPLATE[/NET[/SIZE]]=COUNT (repeatable).
    #[arg(long = "pool", value_parser = parse_pool, default_values = DEFAULT_POOLS)]
    pub pools: Vec<PoolTarget>,
    #[command(flatten)]
    pub sandboxes: SandboxArgs,
    /// e2b API keys, one `KEY NAMESPACE` per line (`#` comments, `sha256:<hex>` keys).
    /// Without it (and without --allow-anonymous) a local gateway creates DATA_DIR/api-keys.
    #[arg(long, env = "SANDBOX_GATEWAY_API_KEYS")]
    pub api_keys: Option<PathBuf>,
    /// Accept calls without a known key (namespace `default`); for development.
    #[arg(long)]
    pub allow_anonymous: bool,
    /// Sandbox domain returned to e2b SDKs (they reach sandboxes at PORT-ID.DOMAIN). The
    /// default keeps SDK data-plane calls on this machine instead of e2b's cloud.
    #[arg(long, env = "SANDBOX_GATEWAY_E2B_DOMAIN", default_value = "localhost")]
    pub e2b_domain: String,
    /// Serve the e2b listener over TLS with a certificate for the domain and `*.DOMAIN` from
    /// the gateway's CA (DATA_DIR/tls/ca.crt), so SDKs can reach sandboxes at
    /// `https://PORT-ID.DOMAIN` once DNS points the domain here.
    #[arg(long)]
    pub e2b_tls: bool,
    /// The e2b listener's certificate chain (PEM) instead of a generated one (implies TLS).
    #[arg(long, requires = "e2b_tls_key")]
    pub e2b_tls_cert: Option<PathBuf>,
    #[arg(long, requires = "e2b_tls_cert")]
    pub e2b_tls_key: Option<PathBuf>,
    /// Secret that signs envd access tokens; replicas must share it [default: DATA_DIR/envd-secret].
    #[arg(long)]
    pub envd_secret_file: Option<PathBuf>,
    /// Where tenants' secrets are kept, sealed; replicas and nodes must share it
    /// [default: DATA_DIR/secrets].
    #[arg(long)]
    pub secrets_dir: Option<PathBuf>,
    /// The 256-bit key (64 hex digits) that seals secrets; made when missing. Replicas and
    /// nodes must share it [default: DATA_DIR/secrets-key].
    #[arg(long)]
    pub secrets_key_file: Option<PathBuf>,
    /// Where tenants' volumes are kept (with the key their tokens are signed with); replicas
    /// and nodes must share it, an NFS export mounted at the same path on each, say
    /// [default: DATA_DIR/volumes].
    #[arg(long)]
    pub volumes_dir: Option<PathBuf>,
    /// Each volume's size in MiB: on one machine a volume is an ext4 file system of its own
    /// (default 10240). 0 keeps volumes as plain directories, as a store several machines
    /// mount (NFS) needs; that is the default, and the only choice, with remote nodes.
    #[arg(long)]
    pub volume_mib: Option<u64>,
    /// How long a claim may take on a node before its outcome counts as unknown (a create
    /// then answers 504 with `Should-Retry: false`).
    #[arg(long, default_value_t = 30.0)]
    pub claim_timeout_seconds: f64,
    /// A client that takes none of a response's bytes for this long is disconnected, so that
    /// a list, download or output stream it stopped reading frees what it holds (like
    /// nginx's `send_timeout`); 0 keeps the connection as long as the kernel does.
    #[arg(long, default_value_t = crate::gateway::stalled::DEFAULT_STALLED_CLIENT.as_secs_f64())]
    pub stalled_client_seconds: f64,
    /// Serving certificate of the Kubernetes API (PEM) [default: generated into DATA_DIR/tls].
    #[arg(long, requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    #[arg(long, requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// Extra DNS name for the generated certificate, e.g. the Service `NAME.NAMESPACE.svc`
    /// kube-apiserver dials (repeatable).
    #[arg(long = "tls-dns-name")]
    pub tls_dns_names: Vec<String>,
    /// Serve behind kube-apiserver: trust its front-proxy certificate and authorize every
    /// request with a SubjectAccessReview.
    #[arg(long)]
    pub delegate_auth: bool,
    /// The front-proxy CA (PEM) [default: from kube-system/extension-apiserver-authentication].
    #[arg(long, requires = "delegate_auth")]
    pub requestheader_client_ca_file: Option<PathBuf>,
    /// Names the front-proxy certificate may carry (comma-separated).
    #[arg(long, value_delimiter = ',', requires = "delegate_auth")]
    pub requestheader_allowed_names: Vec<String>,
    /// Kubeconfig for the cluster (SubjectAccessReviews, NodeInventory objects)
    /// [default: the in-cluster service account, or $KUBECONFIG].
    #[arg(long, alias = "authorization-kubeconfig")]
    pub kubeconfig: Option<PathBuf>,
    /// Cluster mode: find nodes from the NodeInventory objects they publish (beside any
    /// --node). No embedded node is started.
    #[arg(long)]
    pub discover_nodes: bool,
    /// A node whose NodeInventory was published longer ago than this leaves claims and lists
    /// (time without a working list+watch does not count). Keep it above the nodes'
    /// publish interval plus 30 s, their longest retry after a failed publish.
    #[arg(long, default_value_t = 90)]
    pub inventory_stale_seconds: u64,
    /// Where unpinned lists and watches learn discovered nodes' sandboxes from: `inventory`
    /// (the published objects, lagging up to the publish interval) or `stream` (each node's
    /// change stream, within a second) [default: inventory with --discover-nodes].
    #[arg(long, value_enum, requires = "discover_nodes")]
    pub read_view: Option<ReadViewSource>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReadViewSource {
    Inventory,
    Stream,
}

#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// Address of the node's gRPC listener.
    #[arg(long, default_value = "127.0.0.1:7777")]
    pub listen: String,
    /// Address of the node's data plane (HTTP CONNECT into sandboxes) [default: the gRPC
    /// port + 1 on the same host; any free port when --listen asks for port 0].
    #[arg(long)]
    pub data_listen: Option<String>,
    /// Address the node tells others to reach it at [default: the bound address].
    #[arg(long)]
    pub advertise_address: Option<String>,
    /// Where the node keeps its index, sandboxes, checkpoints and templates.
    #[arg(long, env = "SANDBOX_GATEWAY_NODE_DATA_DIR", default_value_os_t = default_data_dir().join("node"))]
    pub data_dir: PathBuf,
    /// File holding the fleet token; created when missing [default: DATA_DIR/node-token].
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// The node's name [default: the host name].
    #[arg(long)]
    pub name: Option<String>,
    /// Warm pool target, TEMPLATE[/NET[/SIZE]]=COUNT (repeatable).
    #[arg(long = "pool", value_parser = parse_pool, default_values = DEFAULT_POOLS)]
    pub pools: Vec<PoolTarget>,
    /// Lease of a claim that asks for none.
    #[arg(long, default_value_t = 300)]
    pub lease_default_seconds: u64,
    /// Longest lease the node grants.
    #[arg(long, default_value_t = 86_400)]
    pub lease_max_seconds: u64,
    /// Most children one fork may ask for.
    #[arg(long, default_value_t = 16)]
    pub fork_limit: u32,
    /// Most sandboxes (claimed, warm and booting) the node runs.
    #[arg(long, default_value_t = 512)]
    pub max_sandboxes: u32,
    /// Answer RESOURCE_EXHAUSTED on an empty pool instead of booting a sandbox.
    #[arg(long)]
    pub no_cold_start: bool,
    #[command(flatten)]
    pub sandboxes: SandboxArgs,
    /// The gateway's secrets directory (shared storage), for the egress proxy's header rules
    /// that name `${e2b.secrets.NAME}`; without it such rules answer 502 inside the sandbox.
    #[arg(long, requires = "secrets_key_file")]
    pub secrets_dir: Option<PathBuf>,
    /// The key that seals those secrets (the gateway's `--secrets-key-file`).
    #[arg(long, requires = "secrets_dir")]
    pub secrets_key_file: Option<PathBuf>,
    /// The gateway's volumes directory (shared storage, mounted at the same path as on the
    /// gateway); without it this node refuses claims that mount volumes.
    #[arg(long)]
    pub volumes_dir: Option<PathBuf>,
    /// Cluster mode: publish this node's NodeInventory object (server-side apply).
    #[arg(long)]
    pub publish_inventory: bool,
    /// How often the NodeInventory object is published.
    #[arg(long, default_value_t = 30.0, requires = "publish_inventory")]
    pub publish_interval_seconds: f64,
    /// Kubeconfig for publishing [default: the in-cluster service account, or $KUBECONFIG].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

/// How a node builds sandboxes (shared by `node` and `serve`'s embedded node).
#[derive(Debug, Clone, Args)]
pub struct SandboxArgs {
    /// The host uid (and gid) of sandbox root: sandbox ids 0..65536 map to this range.
    #[arg(long, default_value_t = crate::node::config::DEFAULT_UID_BASE)]
    pub uid_base: u32,
    /// Every sandbox's disk (writable layer) in MiB instead of its size tier's.
    #[arg(long)]
    pub sandbox_disk_mib: Option<u64>,
    /// Directory of templates [default: the node's DATA_DIR/templates]; nodes may share one.
    #[arg(long, env = "SANDBOX_GATEWAY_TEMPLATES_DIR")]
    pub templates_dir: Option<PathBuf>,
    /// The runtime that builds sandboxes.
    #[arg(
        long,
        value_enum,
        default_value = "builtin",
        env = "SANDBOX_GATEWAY_RUNTIME"
    )]
    pub runtime: crate::node::config::RuntimeKind,
    /// runsc for the gvisor runtime [default: found on PATH].
    #[arg(long)]
    pub runsc: Option<PathBuf>,
    /// runsc's platform: auto (systrap on runsc builds from mid-2023 on, ptrace on older
    /// ones), ptrace, systrap, or kvm where the host allows.
    #[arg(long, default_value = "auto")]
    pub runsc_platform: String,
    /// Leave the host's kernel settings alone. Without it a gvisor node moves the host's
    /// shared-memory huge pages from `never` to `advise` (for memory that asks for them, as
    /// gVisor's does), which makes restores much faster; as kubelet's flag of the same name.
    #[arg(long)]
    pub protect_kernel_defaults: bool,
    /// How many paused gVisor sandboxes (the most recently paused) have the processes their
    /// resume needs started ahead: such a resume skips about 100 ms of start-up, and each
    /// costs about 24 MiB while it waits. 0 starts none.
    #[arg(
        long,
        default_value_t = crate::node::config::DEFAULT_RESUME_STANDBYS,
        env = "SANDBOX_GATEWAY_RESUME_STANDBYS"
    )]
    pub resume_standbys: usize,
    /// Disk all of the node's checkpoints (snapshots) may take together, in MiB; a snapshot
    /// that would exceed it is refused.
    #[arg(long, default_value_t = crate::node::config::DEFAULT_CHECKPOINT_BUDGET_MIB)]
    pub checkpoint_budget_mib: u64,
    /// How long a paused sandbox is kept before it is released, in seconds (its lease does not
    /// run while it is paused; resuming grants the lease again).
    #[arg(long, default_value_t = crate::node::config::DEFAULT_PAUSED_RETENTION_SECONDS)]
    pub paused_retention_seconds: u64,
    /// An IPv4 range sandboxes may reach although it is private or the host's own (an
    /// internal mirror, say); repeatable. Sandboxes' own network policies still apply.
    #[arg(long = "sandbox-reachable", value_name = "CIDR")]
    pub sandbox_reachable: Vec<String>,
    /// A name the egress proxy resolves to this IPv4 address before asking DNS (internal
    /// names an allow-list may name; the tests' servers); repeatable.
    #[arg(long = "egress-host", value_name = "NAME=IP")]
    pub egress_hosts: Vec<String>,
    /// A PEM file of CA certificates the egress proxy trusts, besides the node's own, when it
    /// forwards a request whose headers a rule sets (an internal API's CA); repeatable.
    #[arg(long = "egress-ca-file", value_name = "PEM")]
    pub egress_ca_files: Vec<PathBuf>,
    /// How long a sandbox may take to boot or restore, in seconds; past it the claim answers
    /// "no capacity" (503, Retry-After) and the dispatcher tries another node.
    #[arg(long = "boot-timeout-seconds", value_name = "SECONDS", value_parser = parse_seconds, default_value = "15")]
    pub boot_timeout: Duration,
    /// How long a template's services (the code interpreter with its kernels) may take to
    /// answer after the sandbox booted; a pool's sandbox is warm only once they do.
    #[arg(long = "service-timeout-seconds", value_name = "SECONDS", value_parser = parse_seconds, default_value = "120")]
    pub service_timeout: Duration,
    /// Largest archive of files a template build's COPY step may upload, in MiB (413 beyond).
    #[arg(
        long = "template-upload-max-mib",
        value_name = "MIB",
        default_value_t = 1024
    )]
    pub template_upload_max_mib: u64,
    /// Warm sandboxes kept for each built template (its `default` build) that has a start or
    /// ready command, its server already answering; 0 turns these pools off.
    #[arg(
        long = "built-template-pool",
        value_name = "COUNT",
        default_value_t = 1
    )]
    pub built_template_pool: u32,
    /// Disk the teams' build caches (layers no template uses) and uploaded files may take, in
    /// MiB; past it the least recently used go.
    #[arg(long = "build-cache-mib", value_name = "MIB", default_value_t = crate::node::config::DEFAULT_BUILD_CACHE_MIB)]
    pub build_cache_mib: u64,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

/// Where a build's `fromImage` is pulled from (shared by `node` and `serve`).
#[derive(Debug, Clone, Args)]
pub struct RegistryArgs {
    /// Pull images of REGISTRY from MIRROR instead, e.g. `docker.io=mirror.internal:5000`
    /// (repeatable); the mirror may be private.
    #[arg(long = "registry-mirror", value_name = "REGISTRY=MIRROR", value_parser = parse_mirror)]
    pub mirrors: Vec<(String, String)>,
    /// A registry spoken to over plain HTTP, as HOST[:PORT] (repeatable); it may be private.
    #[arg(long = "registry-insecure", value_name = "HOST[:PORT]")]
    pub insecure: Vec<String>,
    /// A registry that may have a private or loopback address, as HOST[:PORT] (repeatable).
    /// Others must resolve to public addresses: tenants name the registries.
    #[arg(long = "registry-private", value_name = "HOST[:PORT]")]
    pub private: Vec<String>,
    /// A PEM file of certificate authorities registries' certificates may chain to, besides
    /// the system's (repeatable).
    #[arg(long = "registry-ca", value_name = "FILE")]
    pub ca: Vec<PathBuf>,
    /// Largest image a build may pull, in MiB of compressed layers.
    #[arg(long = "image-max-mib", value_name = "MIB", default_value_t = crate::templates::registry::DEFAULT_IMAGE_MAX_BYTES >> 20)]
    pub image_max_mib: u64,
}

fn parse_mirror(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((from, to)) if !from.is_empty() && !to.is_empty() && !to.contains('/') => {
            Ok((from.to_string(), to.to_string()))
        }
        _ => Err(format!(
            "expected REGISTRY=MIRROR (hosts, e.g. docker.io=127.0.0.1:5000), got {s:?}"
        )),
    }
}

impl RegistryArgs {
    pub fn config(&self) -> crate::model::Result<crate::templates::registry::RegistryConfig> {
        let ca_pem = self
            .ca
            .iter()
            .map(|p| {
                let pem = std::fs::read(p).map_err(|e| {
                    crate::model::Error::io(format!("reading --registry-ca {}", p.display()), e)
                })?;
                if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                    return Err(crate::model::Error::invalid(format!(
                        "--registry-ca {} holds no PEM certificate",
                        p.display()
                    )));
                }
                Ok(pem)
            })
            .collect::<crate::model::Result<_>>()?;
        Ok(crate::templates::registry::RegistryConfig {
            mirrors: self.mirrors.clone(),
            insecure: self.insecure.clone(),
            private: self.private.clone(),
            ca_pem,
            max_bytes: self.image_max_mib << 20,
        })
    }
}

impl SandboxArgs {
    /// Applies these settings to a node's configuration.
    pub fn apply(&self, node: &mut crate::node::NodeConfig) -> crate::model::Result<()> {
        node.ids = crate::sandbox::spec::IdMap::new(self.uid_base)?;
        if let Some(d) = &self.templates_dir {
            node.templates_dir = Some(d.clone());
        }
        node.runtime = crate::node::config::RuntimeChoice {
            kind: self.runtime,
            runsc: self.runsc.clone(),
            runsc_platform: self.runsc_platform.clone(),
            protect_kernel_defaults: self.protect_kernel_defaults,
            resume_standbys: self.resume_standbys,
        };
        node.checkpoint_budget_bytes = self.checkpoint_budget_mib << 20;
        node.paused_retention = Duration::from_secs(self.paused_retention_seconds);
        crate::model::network::parse_cidrs("--sandbox-reachable", &self.sandbox_reachable)?;
        node.sandbox_reachable = self.sandbox_reachable.clone();
        node.egress_hosts = self
            .egress_hosts
            .iter()
            .map(|h| {
                h.split_once('=')
                    .and_then(|(n, ip)| {
                        Some((n.trim().to_ascii_lowercase(), ip.trim().parse().ok()?))
                    })
                    .filter(|(n, _)| !n.is_empty())
                    .ok_or_else(|| {
                        crate::model::Error::invalid(format!(
                            "--egress-host {h:?}: expected NAME=IPv4"
                        ))
                    })
            })
            .collect::<crate::model::Result<_>>()?;
        node.egress_trust = self
            .egress_ca_files
            .iter()
            .map(|f| {
                let pem = std::fs::read_to_string(f).map_err(|e| {
                    crate::model::Error::io(format!("--egress-ca-file {}", f.display()), e)
                })?;
                crate::tlsx::parse_certs(pem.as_bytes())?;
                Ok(pem)
            })
            .collect::<crate::model::Result<_>>()?;
        node.boot_timeout = self.boot_timeout;
        node.service_timeout = self.service_timeout;
        node.template_upload_max_bytes = self.template_upload_max_mib << 20;
        node.registry = self.registry.config()?;
        node.built_pool = self.built_template_pool;
        node.build_cache_bytes = self.build_cache_mib << 20;
        node.disk_bytes = match self.sandbox_disk_mib {
            Some(0) => {
                return Err(crate::model::Error::invalid(
                    "--sandbox-disk-mib must be positive",
                ));
            }
            Some(m) => Some(m << 20),
            None => None,
        };
        Ok(())
    }
}

impl NodeArgs {
    pub fn lease(&self) -> LeasePolicy {
        LeasePolicy {
            default: Duration::from_secs(self.lease_default_seconds),
            max: Duration::from_secs(self.lease_max_seconds),
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// Serve envd on this address, outside any sandbox (for development and tests).
    #[arg(long, required_unless_present_any = ["boot", "gvisor_init", "reap", "net_holder"])]
    pub listen: Option<String>,
    /// Be the init of a gVisor sandbox (the gvisor runtime starts its sandboxes this way).
    #[arg(long, conflicts_with_all = ["listen", "boot"])]
    pub gvisor_init: bool,
    /// The sandbox's memory, reported by envd (with --gvisor-init).
    #[arg(long, requires = "gvisor_init", default_value_t = 512 << 20)]
    pub memory_bytes: u64,
    /// The sandbox's CPUs, reported by envd (with --gvisor-init).
    #[arg(long, requires = "gvisor_init", default_value_t = 1)]
    pub cpu_count: u32,
    /// How many processes and threads what the sandbox runs may hold (with --gvisor-init;
    /// gVisor's own pids controller holds them to it).
    #[arg(long, requires = "gvisor_init")]
    pub pids: Option<u32>,
    /// The sandbox has egress through slirp4netns (with --gvisor-init).
    #[arg(long, requires = "gvisor_init")]
    pub egress: bool,
    /// A service the sandbox runs beside envd (with --gvisor-init; repeatable).
    #[arg(long = "service", value_enum, requires = "gvisor_init")]
    pub services: Vec<crate::sandbox::services::Service>,
    /// Build a sandbox from this boot spec and supervise it (the built-in runtime starts
    /// every sandbox this way).
    #[arg(long, conflicts_with = "listen")]
    pub boot: Option<PathBuf>,
    /// Be a node's reaper: end its sandboxes when its lifeline closes (every node starts one;
    /// the argument describes the node's cgroups).
    #[arg(long, conflicts_with_all = ["listen", "boot", "gvisor_init"], requires = "lifeline_fd")]
    pub reap: Option<String>,
    /// Hold a gVisor sandbox's network namespace (the gvisor runtime starts one per sandbox
    /// with egress; the argument describes it).
    #[arg(long, conflicts_with_all = ["listen", "boot", "gvisor_init", "reap"], requires = "lifeline_fd")]
    pub net_holder: Option<String>,
    /// The node's lifeline pipe (with --boot, --reap or --net-holder): the sandbox ends when it closes.
    #[arg(long)]
    pub lifeline_fd: Option<i32>,
    /// The envd access token in force before any /init (every route but /health then needs it).
    #[arg(
        long,
        env = "SANDBOX_GATEWAY_ENVD_ACCESS_TOKEN",
        hide_env_values = true
    )]
    pub access_token: Option<String>,
    /// The token /init must carry (the node's per-instance boot secret).
    #[arg(long, env = "SANDBOX_GATEWAY_ENVD_INIT_TOKEN", hide_env_values = true)]
    pub init_token: Option<String>,
    /// Default user for commands and files [default: `user` when it exists and the agent runs
    /// as root, else the agent's own user].
    #[arg(long)]
    pub user: Option<String>,
    /// Default working directory for commands and relative paths [default: the user's home].
    #[arg(long)]
    pub workdir: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct OpenapiArgs {
    /// The code interpreter's (port 49999 of code-interpreter sandboxes) instead.
    #[arg(long)]
    pub interpreter: bool,
}

#[derive(Debug, Clone, Args)]
pub struct InterpreterArgs {
    /// Address to serve on (a sandbox's is port 49999).
    #[arg(long, default_value = "127.0.0.1:49999")]
    pub listen: String,
    /// The interpreter configuration (a template's /etc/sandbox-gateway/code-interpreter.json)
    /// [default: python only, from the Jupyter data directories].
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory for kernels' connection files and sockets (emptied at start).
    #[arg(long)]
    pub runtime_dir: Option<PathBuf>,
    /// A JSON object of variables every execution gets (what envd publishes in a sandbox).
    #[arg(long)]
    pub envs_file: Option<PathBuf>,
}

pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        if let Ok(s) = std::str::from_utf8(&buf[..end])
            && !s.is_empty()
        {
            return s.to_string();
        }
    }
    "node".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boot_timeout(args: &[&str]) -> Result<Duration, clap::Error> {
        let cli = Cli::try_parse_from([&["sandbox-gateway", "serve"], args].concat())?;
        match cli.command {
            Some(Command::Serve(s)) => Ok(s.sandboxes.boot_timeout),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn boot_timeout_is_positive_seconds() {
        assert_eq!(boot_timeout(&[]).ok(), Some(Duration::from_secs(15)));
        assert_eq!(
            boot_timeout(&["--boot-timeout-seconds", "0.25"]).ok(),
            Some(Duration::from_millis(250))
        );
        for bad in ["0", "-1", "nan", "inf", "1e30", "soon", ""] {
            // `=` so that clap takes "-1" as the value rather than as a flag.
            let arg = format!("--boot-timeout-seconds={bad}");
            let err = boot_timeout(&[&arg]).expect_err(bad).to_string();
            assert!(
                err.contains("must be a positive number of seconds"),
                "{bad}: {err}"
            );
        }
    }
}
