//! `sandbox-gateway serve`: the gateway process. It starts an embedded node when no node
//! address is given, connects the dispatcher to the nodes, and serves the e2b surface.

mod embedded;
mod listener;
pub mod observe;
mod readahead;
pub mod stalled;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix_web::{App, HttpResponse, HttpServer, web};

use tokio_util::sync::CancellationToken;

use crate::cluster::discover::{Discovery, DiscoveryConfig};
use crate::dispatch::{Dispatcher, DispatcherConfig, ViewFeed};
use crate::e2b::auth::{self, ApiKeys};
use crate::e2b::tokens::EnvdTokens;
use crate::e2b::{self, E2b};
use crate::facade;
use crate::fsx;
use crate::model::{DEFAULT_NAMESPACE, Error, PoolTarget, Result, ids};
use crate::node::NodeConfig;
use crate::node::daemon::{self, DaemonConfig, RunningNode};
use crate::node::runtime::builtin::AgentCommand;
use crate::secrets::SecretStore;
use observe::Metrics;

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub e2b_listen: String,
    pub kube_listen: String,
    pub nodes: Vec<String>,
    pub data_dir: PathBuf,
    pub node_token_file: Option<PathBuf>,
    /// Warm pools of the embedded node.
    pub pools: Vec<PoolTarget>,
    /// How the embedded node builds sandboxes.
    pub sandboxes: crate::config::SandboxArgs,
    pub api_keys: Option<PathBuf>,
    pub allow_anonymous: bool,
    /// The sandbox domain returned to SDKs.
    pub e2b_domain: Option<String>,
    /// TLS on the e2b listener: generated (`Generated`) or provided.
    pub e2b_tls: Option<E2bTls>,
    /// Secret that signs envd access tokens [default: DATA_DIR/envd-secret, created].
    pub envd_secret_file: Option<PathBuf>,
    /// Tenants' secrets [default: DATA_DIR/secrets, sealed with DATA_DIR/secrets-key].
    pub secrets_dir: Option<PathBuf>,
    pub secrets_key_file: Option<PathBuf>,
    /// Tenants' volumes [default: DATA_DIR/volumes].
    pub volumes_dir: Option<PathBuf>,
    /// Each volume's size in MiB (a file system of its own), or 0 for plain directories
    /// [default: 10240 with an embedded node, 0 with remote nodes].
    pub volume_mib: Option<u64>,
    pub dispatcher: DispatcherConfig,
    pub kube: KubeConfig,
    /// Cluster mode: discover nodes from their NodeInventory objects.
    pub cluster: Option<ClusterConfig>,
    /// A client connection whose sent bytes go unacknowledged this long is cut
    /// (`stalled::limit`); `None` leaves the kernel's limits.
    pub stalled_client: Option<Duration>,
}

#[derive(Debug, Clone, Default)]
pub struct ClusterConfig {
    /// In-cluster when unset.
    pub kubeconfig: Option<PathBuf>,
    pub discovery: DiscoveryConfig,
}

impl ServeConfig {
    /// True when the gateway uses nodes it does not run itself.
    fn remote_nodes(&self) -> bool {
        !self.nodes.is_empty() || self.cluster.is_some()
    }
}

/// How long an idle client connection is kept open. actix's default (5 s) is shorter than
/// most clients' pool idle timeouts (reqwest and Go 90 s), so a client could reuse a
/// connection the gateway was closing at that moment and lose a POST it cannot safely replay
/// (the likely end of one create in a 10,000-cycle soak). Load balancers keep 60 to 75 s for
/// the same reason.
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(75);

/// Where the e2b listener's certificate comes from.
#[derive(Debug, Clone)]
pub enum E2bTls {
    /// For the domain and `*.domain` (and the listen address), from the gateway's CA.
    Generated,
    Provided {
        cert_file: PathBuf,
        key_file: PathBuf,
    },
}

/// The Kubernetes facade's listener settings.
#[derive(Debug, Clone, Default)]
pub struct KubeConfig {
    /// A provided serving certificate and key; generated into DATA_DIR/tls when unset.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// Extra DNS names for the generated certificate (e.g. the Service name).
    pub dns_names: Vec<String>,
    /// Trust kube-apiserver's front proxy and authorize with SubjectAccessReview.
    pub delegate: Option<crate::facade::auth::DelegationSource>,
}

/// Resolves when the process is asked to stop (SIGINT or SIGTERM). The handlers are in place
/// when this returns, so call it before announcing readiness: a signal that arrives before
/// the future is awaited still stops cleanly instead of killing the process.
pub fn stop_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut t), Ok(mut i)) => {
                tokio::select! {
                    _ = t.recv() => {}
                    _ = i.recv() => {}
                }
            }
            (Ok(mut s), Err(e)) | (Err(e), Ok(mut s)) => {
                tracing::error!(error = %e, "cannot watch one of SIGTERM and SIGINT");
                s.recv().await;
            }
            (Err(e), Err(_)) => {
                tracing::error!(error = %e, "cannot watch SIGTERM or SIGINT; stop with SIGKILL");
                std::future::pending::<()>().await;
            }
        }
    }
}

fn fleet_token(cfg: &ServeConfig) -> Result<String> {
    let path = cfg
        .node_token_file
        .clone()
        .unwrap_or_else(|| cfg.data_dir.join("node-token"));
    if !cfg.remote_nodes() {
        let (token, created) = fsx::load_or_create_secret(&path, || ids::random_hex(32))
            .map_err(|e| Error::io(format!("fleet token file {}", path.display()), e))?;
        if created {
            tracing::info!(path = %path.display(), "created the fleet token");
        }
        return Ok(token);
    }
    let token = std::fs::read_to_string(&path).map_err(|e| {
        Error::invalid(format!(
            "--node and --discover-nodes need the fleet token the nodes use: could not read {} ({e}); pass --node-token-file",
            path.display()
        ))
    })?;
    let token = token.trim().to_string();
    if token.is_empty() {
        return Err(Error::invalid(format!(
            "fleet token file {} is empty",
            path.display()
        )));
    }
    Ok(token)
}

/// Where API keys come from, and what to tell the user about them.
fn api_keys(cfg: &ServeConfig) -> Result<(ApiKeys, Vec<String>)> {
    if let Some(path) = &cfg.api_keys {
        let keys = ApiKeys::new(Some(path.clone()), cfg.allow_anonymous)?;
        let note = format!("API keys: {} ({} keys)", path.display(), keys.len());
        return Ok((keys, vec![note]));
    }
    if cfg.allow_anonymous {
        let keys = ApiKeys::new(None, true)?;
        return Ok((
            keys,
            vec!["API keys: anonymous use allowed, any key works (namespace default)".into()],
        ));
    }
    if cfg.remote_nodes() {
        return Err(Error::invalid(
            "pass --api-keys FILE (lines `KEY NAMESPACE`) or --allow-anonymous",
        ));
    }
    // The local default: one key, made on first start, kept next to the data.
    let path = cfg.data_dir.join("api-keys");
    let mut notes = Vec::new();
    if !path.exists() {
        let key = auth::new_key();
        auth::append_key(&path, &key, DEFAULT_NAMESPACE, "created on first start")?;
        notes.push(format!(
            "created an API key for namespace {DEFAULT_NAMESPACE}: {key}"
        ));
        notes.push(format!("  export E2B_API_KEY={key}"));
    }
    notes.push(format!("API keys: {}", path.display()));
    Ok((ApiKeys::new(Some(path), false)?, notes))
}

fn envd_tokens(cfg: &ServeConfig) -> Result<EnvdTokens> {
    let path = cfg
        .envd_secret_file
        .clone()
        .unwrap_or_else(|| cfg.data_dir.join("envd-secret"));
    let (secret, _) = fsx::load_or_create_secret(&path, || ids::random_hex(32))
        .map_err(|e| Error::io(format!("envd token secret {}", path.display()), e))?;
    EnvdTokens::new(secret.as_bytes())
}

fn secret_store(cfg: &ServeConfig) -> Result<Arc<SecretStore>> {
    let dir = cfg
        .secrets_dir
        .clone()
        .unwrap_or_else(|| cfg.data_dir.join("secrets"));
    let key = cfg
        .secrets_key_file
        .clone()
        .unwrap_or_else(|| cfg.data_dir.join("secrets-key"));
    let (store, made) = SecretStore::open(&dir, &key)?;
    if made {
        tracing::info!(key = %key.display(), "made a key for tenants' secrets");
    }
    Ok(Arc::new(store))
}

/// Unmounts a store's volumes when dropped.
struct Unmounts(Arc<crate::volumes::VolumeStore>);

impl Drop for Unmounts {
    fn drop(&mut self) {
        self.0.unmount_all();
    }
}

/// A volume's size on one machine unless `--volume-mib` says otherwise.
const DEFAULT_VOLUME_MIB: u64 = 10 << 10;

fn volume_store(cfg: &ServeConfig) -> Result<Arc<crate::volumes::VolumeStore>> {
    let dir = cfg
        .volumes_dir
        .clone()
        .unwrap_or_else(|| cfg.data_dir.join("volumes"));
    // The token key lives with the volumes, so that replicas sharing them share it too.
    let ids = crate::sandbox::spec::IdMap::new(cfg.sandboxes.uid_base)?;
    // An image is mounted on this machine only: remote nodes would see an empty directory.
    let image_bytes = match (cfg.volume_mib, cfg.remote_nodes()) {
        (Some(0), _) | (None, true) => None,
        (Some(_), true) => {
            return Err(Error::invalid(
                "with remote nodes, volumes must be plain directories on a store every machine mounts (--volume-mib 0 and --volumes-dir on an NFS export, say)",
            ));
        }
        (Some(mib), false) => Some(mib << 20),
        (None, false) => Some(DEFAULT_VOLUME_MIB << 20),
    };
    let (store, made) =
        crate::volumes::VolumeStore::open(&dir, &dir.join(".token-key"), ids, image_bytes)?;
    if made {
        tracing::info!(dir = %dir.display(), "made a key for volume tokens");
    }
    Ok(Arc::new(store))
}

/// `/metrics`, open to any scrape. Tenant names (sandboxes by team) are only for a scrape with
/// an admin API key (`Authorization: Bearer <key>` as Prometheus sends it, or `X-API-KEY`):
/// the e2b port may face the internet, and who the tenants are is not everyone's business.
async fn metrics_route(
    req: actix_web::HttpRequest,
    metrics: web::Data<Arc<Metrics>>,
    e2b: web::Data<E2b>,
) -> HttpResponse {
    let header = |name| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let key = header(actix_web::http::header::AUTHORIZATION.as_str())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| header(auth::API_KEY_HEADER));
    let admin = key.is_some()
        && req
            .app_data::<web::Data<ApiKeys>>()
            .and_then(|keys| keys.authenticate(key).ok())
            .is_some_and(|t| t.admin);
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(metrics.render(&e2b.dispatcher, admin))
}

pub async fn run(cfg: ServeConfig) -> Result<()> {
    // From here on a stop request waits for startup to finish, then stops cleanly.
    let stop = stop_signal();
    std::fs::create_dir_all(&cfg.data_dir)
        .map_err(|e| Error::io(format!("creating {}", cfg.data_dir.display()), e))?;
    let token = fleet_token(&cfg)?;
    let (keys, key_notes) = api_keys(&cfg)?;
    let tokens = envd_tokens(&cfg)?;
    let secrets = secret_store(&cfg)?;
    let volumes = volume_store(&cfg)?;
    // However this function ends, the volumes' file systems are unmounted (after the embedded
    // node, and its sandboxes, have stopped).
    let _volumes_mounted = Unmounts(volumes.clone());

    let embedded: Option<RunningNode> = if !cfg.remote_nodes() {
        let mut node = NodeConfig::new("embedded", cfg.data_dir.join("node"));
        node.pools = cfg.pools.clone();
        cfg.sandboxes.apply(&mut node)?;
        node.secrets = Some(secrets.clone());
        node.volumes_dir = Some(volumes.dir().to_path_buf());
        let running = daemon::start(DaemonConfig {
            node,
            listen: "127.0.0.1:0".into(),
            data_listen: None,
            advertise_address: None,
            token: token.clone(),
            agent: AgentCommand::current_exe()
                .map_err(|e| Error::io("locating this executable", e))?,
        })
        .await?;
        Some(running)
    } else {
        None
    };

    let dispatcher = Dispatcher::new(cfg.dispatcher.clone(), &token);
    let mut addresses = cfg.nodes.clone();
    if let Some(n) = &embedded {
        addresses.push(n.address.to_string());
    }
    for a in &addresses {
        dispatcher.add_node(a)?;
    }
    if embedded.is_some() {
        dispatcher
            .wait_for_nodes(1, Duration::from_secs(10))
            .await?;
    }
    let discovery_stop = CancellationToken::new();
    let discovery = match &cfg.cluster {
        Some(c) => {
            let client =
                crate::cluster::client(c.kubeconfig.as_deref(), "--discover-nodes").await?;
            Some(
                Discovery::start(
                    client,
                    dispatcher.clone(),
                    c.discovery.clone(),
                    discovery_stop.clone(),
                )
                .await?,
            )
        }
        None => None,
    };

    let metrics = Metrics::new(embedded.as_ref().map(|n| n.node().clone()))?;
    let keys = web::Data::new(keys);
    let (facade_auth, client_cas) = match &cfg.kube.delegate {
        Some(source) => {
            let (delegation, client) = facade::auth::delegation(source).await?;
            let cas = delegation.requestheader_ca.clone();
            (
                facade::auth::Auth::delegated(keys.clone(), delegation, client)?,
                vec![cas],
            )
        }
        None => (facade::auth::Auth::local(keys.clone()), Vec::new()),
    };
    let facade_state = web::Data::new(facade::Facade::new(dispatcher.clone(), facade_auth));
    let facade_closing = facade_state.closing();
    let tls = facade::tls::server_config(
        &facade::tls::TlsConfig {
            dir: cfg.data_dir.join("tls"),
            cert_file: cfg.kube.tls_cert_file.clone(),
            key_file: cfg.kube.tls_key_file.clone(),
            dns_names: cfg.kube.dns_names.clone(),
        },
        &client_cas.iter().map(Vec::as_slice).collect::<Vec<_>>(),
    )?;
    let kube_metrics = metrics.clone();
    let stall = cfg.stalled_client;
    let kube_server = HttpServer::new(move || {
        App::new()
            .app_data(facade_state.clone())
            .wrap(actix_web::middleware::NormalizePath::trim())
            .wrap(facade::status_errors())
            .wrap_fn(observe::observed(kube_metrics.clone(), "kube"))
            .configure(facade::configure)
    })
    .workers(2)
    .tcp_nodelay(true)
    .keep_alive(KEEP_ALIVE)
    .shutdown_timeout(5)
    .disable_signals()
    .on_connect(move |conn, ext| {
        stalled::limit(conn, stall);
        capture_peer_certificates(conn, ext);
    })
    .bind_rustls_0_23(&cfg.kube_listen, tls.config)
    .map_err(|e| {
        Error::io(
            format!("binding the Kubernetes listener {}", cfg.kube_listen),
            e,
        )
    })?;
    let (kube_addr, kube_handle, kube_serving) =
        spawn_server(kube_server.addrs(), kube_server.run(), &cfg.kube_listen);
    let state = web::Data::new(E2b {
        dispatcher: dispatcher.clone(),
        tokens,
        domain: cfg.e2b_domain.clone(),
        idempotency: Default::default(),
        proxy: Default::default(),
        upload_max_bytes: cfg.sandboxes.template_upload_max_mib << 20,
        secrets,
        volumes: Some(volumes),
    });
    state.proxy.count_bytes(metrics.data_plane_bytes());
    if let Some(n) = &embedded {
        state.proxy.set_local_node(
            n.data_address.to_string(),
            Arc::new(embedded::EmbeddedTunnels {
                node: n.node().clone(),
                token: token.clone(),
                runtime: tokio::runtime::Handle::current(),
            }),
        );
    }
    let metrics_data = web::Data::new(metrics.clone());
    let sessions = web::Data::new(crate::dashboard::sessions::Sessions::default());
    let make_app = move || {
        App::new()
            .app_data(state.clone())
            .app_data(keys.clone())
            .app_data(metrics_data.clone())
            .app_data(sessions.clone())
            // Before every route of the gateway's own: a request for a sandbox goes there.
            .wrap_fn(e2b::proxy::intercept())
            .wrap(e2b::json_errors())
            .wrap_fn(observe::observed(metrics.clone(), "e2b"))
            .route("/metrics", web::get().to(metrics_route))
            .configure(crate::dashboard::configure)
            .configure(e2b::configure)
    };
    let settings = listener::Settings {
        workers: 2,
        keep_alive: KEEP_ALIVE,
        shutdown_timeout: 5,
        stall,
    };
    let (addrs, server) =
        listener::bind(&cfg.e2b_listen, e2b_tls_config(&cfg)?, &settings, make_app)
            .map_err(|e| Error::io(format!("binding the e2b listener {}", cfg.e2b_listen), e))?;
    let (e2b_addr, handle, serving) = spawn_server(addrs, server, &cfg.e2b_listen);

    println!("sandbox-gateway {}", env!("CARGO_PKG_VERSION"));
    print_e2b_exports(&cfg, &e2b_addr);
    for note in key_notes {
        println!("{note}");
    }
    let scheme = if cfg.e2b_tls.is_some() {
        "https"
    } else {
        "http"
    };
    println!(
        "  health: curl -i {scheme}://{e2b_addr}/health   metrics: /metrics   OpenAPI: /openapi.json"
    );
    match &embedded {
        Some(n) => println!(
            "embedded node {:?} on {} (data in {})",
            n.node().name(),
            n.address,
            cfg.data_dir.join("node").display()
        ),
        None if cfg.nodes.is_empty() => {}
        None => println!("nodes: {}", cfg.nodes.join(", ")),
    }
    if let Some(c) = &cfg.cluster {
        let feed = match c.discovery.feed {
            ViewFeed::Inventory => "their published NodeInventory objects",
            ViewFeed::Stream => "their change streams",
        };
        println!(
            "discovering nodes from NodeInventory objects ({} known); lists follow {feed}",
            dispatcher.nodes().len()
        );
    }
    println!("Kubernetes API listening on https://{kube_addr}");
    println!(
        "  kubeconfig: sandbox-gateway kubeconfig --data-dir {} --server https://{kube_addr} --api-key KEY > kubeconfig",
        cfg.data_dir.display()
    );
    println!("press Ctrl-C to stop");

    stop.await;
    tracing::info!("stopping");
    facade_closing.cancel();
    discovery_stop.cancel();
    if let Some(d) = discovery {
        let _ = d.await;
    }
    handle.stop(true).await;
    kube_handle.stop(true).await;
    let _ = serving.await;
    let _ = kube_serving.await;
    dispatcher.shutdown().await;
    if let Some(n) = embedded {
        n.stop().await?;
    }
    Ok(())
}

/// The e2b listener's TLS configuration, when it serves TLS.
fn e2b_tls_config(cfg: &ServeConfig) -> Result<Option<rustls::ServerConfig>> {
    let Some(tls) = &cfg.e2b_tls else {
        return Ok(None);
    };
    let mut names = Vec::new();
    if let Some(d) = cfg.e2b_domain.as_deref().filter(|d| !d.is_empty()) {
        names.push(d.to_string());
        names.push(format!("*.{d}"));
    }
    if let Some((host, _)) = cfg.e2b_listen.rsplit_once(':') {
        names.push(host.trim_matches(['[', ']']).to_string());
    }
    let (cert_file, key_file) = match tls {
        E2bTls::Generated => (None, None),
        E2bTls::Provided {
            cert_file,
            key_file,
        } => (Some(cert_file.clone()), Some(key_file.clone())),
    };
    let served = facade::tls::server_config(
        &facade::tls::TlsConfig {
            dir: cfg.data_dir.join("tls"),
            cert_file,
            key_file,
            dns_names: names,
        },
        &[],
    )?;
    Ok(Some(served.config))
}

/// How to point the e2b SDKs at this gateway, control plane and data plane.
fn print_e2b_exports(cfg: &ServeConfig, addr: &str) {
    let domain = cfg.e2b_domain.clone().unwrap_or_default();
    if cfg.e2b_tls.is_some() {
        println!("e2b API listening on https://{addr}");
        println!("  export E2B_API_URL=https://{addr}");
        println!(
            "  export E2B_DOMAIN={domain}   # sandboxes at https://PORT-ID.{domain}: point *.{domain} at this address on port 443"
        );
        if matches!(cfg.e2b_tls, Some(E2bTls::Generated)) {
            let ca = facade::tls::ca_paths(&cfg.data_dir.join("tls")).0;
            println!(
                "  export SSL_CERT_FILE={0} NODE_EXTRA_CA_CERTS={0}   # trust the gateway's CA",
                ca.display()
            );
        }
    } else {
        println!("e2b API listening on http://{addr}");
        println!("  export E2B_API_URL=http://{addr}");
        println!("  export E2B_SANDBOX_URL=http://{addr}");
    }
    let scheme = if cfg.e2b_tls.is_some() {
        "https"
    } else {
        "http"
    };
    println!("dashboard at {scheme}://{addr}/dashboard (sign in with an API key)");
}

/// Runs a bound server in the background: the address it listens on (`asked` when it cannot
/// tell), its handle, and its task.
fn spawn_server(
    bound: Vec<std::net::SocketAddr>,
    server: actix_web::dev::Server,
    asked: &str,
) -> (
    String,
    actix_web::dev::ServerHandle,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let addr = bound
        .first()
        .map_or_else(|| asked.to_string(), ToString::to_string);
    let handle = server.handle();
    (addr, handle, tokio::spawn(server))
}

/// Keeps the client certificate chain of a TLS connection for the request handlers.
fn capture_peer_certificates(conn: &dyn std::any::Any, ext: &mut actix_web::dev::Extensions) {
    type Tls = actix_tls::accept::rustls_0_23::TlsStream<actix_web::rt::net::TcpStream>;
    if let Some(tls) = conn.downcast_ref::<Tls>() {
        let (_, session) = tls.get_ref();
        if let Some(certs) = session.peer_certificates() {
            ext.insert(facade::auth::PeerCerts(
                certs.iter().map(|c| c.clone().into_owned()).collect(),
            ));
        }
    }
}

/// `sandbox-gateway keys create`: appends a new key for `namespace` (stored as its SHA-256) and
/// returns the key, which is shown once.
pub fn create_key(file: &Path, namespace: &str) -> Result<String> {
    let key = auth::new_key();
    let note = format!(
        "created {} for namespace {namespace}",
        chrono::Utc::now().to_rfc3339()
    );
    auth::append_key(file, &auth::hashed(&key), namespace, &note)?;
    Ok(key)
}
