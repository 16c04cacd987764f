//! Runs a node: binds its gRPC listener, makes sure its `base` template exists, opens its state
//! with the built-in runtime, and serves until stopped. Used by `sandbox-gateway node` and by
//! the gateway's embedded node.

use std::net::SocketAddr;

use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;

use super::config::RuntimeKind;
use super::runtime::Runtime;
use super::runtime::any::AnyRuntime;
use super::runtime::builtin::{self, AgentCommand, BuiltinConfig, BuiltinRuntime};
use super::runtime::gvisor::runsc::Runsc;
use super::runtime::gvisor::{GvisorConfig, GvisorRuntime, hostmem};
use super::service::NodeService;
use super::{Node, NodeConfig};
use crate::model::{Error, Result, ids};
use crate::proto::auth::RequireFleetToken;
use crate::proto::node_server::NodeServer;
use crate::templates::TemplateStore;

#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub node: NodeConfig,
    pub listen: String,
    /// The data plane's listener [default: the gRPC port + 1 on the same host, or any free
    /// port when the gRPC port is 0].
    pub data_listen: Option<String>,
    /// The address the node advertises; the bound address when unset.
    pub advertise_address: Option<String>,
    pub token: String,
    pub agent: AgentCommand,
}

pub struct RunningNode {
    pub address: SocketAddr,
    pub data_address: SocketAddr,
    node: Node<AnyRuntime>,
    server: JoinHandle<std::result::Result<(), tonic::transport::Error>>,
}

/// The runtime the node was asked for; `auto` takes gvisor when runsc is installed.
fn pick_runtime(
    node: &super::NodeConfig,
    paths: &super::Paths,
    agent: AgentCommand,
) -> Result<AnyRuntime> {
    let choice = &node.runtime;
    let tag = ids::stable_hash_hex(paths.root.as_os_str().as_encoded_bytes());
    let runsc = match choice.kind {
        RuntimeKind::Builtin => None,
        RuntimeKind::Gvisor | RuntimeKind::Auto => Runsc::detect(
            choice.runsc.as_deref(),
            paths.runsc.clone(),
            &choice.runsc_platform,
        )?,
    };
    match (choice.kind, runsc) {
        (RuntimeKind::Gvisor, None) => Err(Error::invalid(
            "--runtime gvisor needs runsc (apt-get install runsc, or pass --runsc PATH)",
        )),
        (RuntimeKind::Gvisor | RuntimeKind::Auto, Some(runsc)) => {
            println!(
                "runtime: found {} at {}",
                runsc.version,
                runsc.path.display()
            );
            println!(
                "runtime: {}",
                hostmem::tune(
                    std::path::Path::new(hostmem::SHMEM_ENABLED),
                    choice.protect_kernel_defaults
                )
            );
            Ok(AnyRuntime::Gvisor(Box::new(GvisorRuntime::new(
                GvisorConfig {
                    agent,
                    state_root: paths.sandboxes.clone(),
                    templates: paths.templates.clone(),
                    ids: node.ids,
                    tag,
                    boot_timeout: node.boot_timeout,
                    runsc,
                    node_lock: paths.lock.clone(),
                    slirp4netns: builtin::find_slirp4netns(),
                    blocked: builtin::blocked_ranges(&node.sandbox_reachable)?,
                    disks: paths.disks.clone(),
                    disk_bytes: node.disk_bytes,
                    egress_hosts: node.egress_hosts.clone(),
                    secrets: node.secrets.clone(),
                    egress_trust: node.egress_trust.clone(),
                    standbys: choice.resume_standbys,
                },
            )?)))
        }
        (kind, _) => {
            if kind == RuntimeKind::Auto {
                println!("runtime: runsc is not installed; using the builtin runtime");
            }
            Ok(AnyRuntime::Builtin(Box::new(BuiltinRuntime::new(
                BuiltinConfig {
                    agent,
                    state_root: paths.sandboxes.clone(),
                    disks: paths.disks.clone(),
                    tag,
                    ids: node.ids,
                    boot_timeout: node.boot_timeout,
                    disk_bytes: node.disk_bytes,
                    node_lock: paths.lock.clone(),
                    reachable: node.sandbox_reachable.clone(),
                    egress_hosts: node.egress_hosts.clone(),
                    secrets: node.secrets.clone(),
                    egress_trust: node.egress_trust.clone(),
                },
            )?)))
        }
    }
}

/// Builds, in the background, the built-in recipes the pools name that are missing (or were
/// made from an older recipe): sandboxes of other templates are served meanwhile, and the
/// pool fills once its template is there.
fn build_recipes_in_background(store: &TemplateStore, pools: &[crate::model::PoolTarget]) {
    let mut names: Vec<&str> = pools.iter().map(|p| p.key.template.as_str()).collect();
    names.sort();
    names.dedup();
    for name in names {
        let Some(recipe) = crate::templates::recipes::find(name) else {
            continue;
        };
        if store
            .get(name)
            .is_ok_and(|t| t.meta.recipe.as_deref() == Some(recipe.digest().as_str()))
        {
            continue;
        }
        let store = store.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("build-{name}"))
            .spawn(move || {
                let prefix = recipe.name;
                let progress = |line: &str| println!("{prefix} | {line}");
                progress(&format!(
                    "building template {prefix} in the background; other sandboxes are served meanwhile"
                ));
                let built = store.build(
                    &crate::templates::BuildSpec {
                        name: prefix.to_string(),
                        if_missing: true,
                        ..Default::default()
                    },
                    &progress,
                );
                match built {
                    Ok(_) => progress(&format!("template {prefix} is ready; its pool fills now")),
                    Err(e) => {
                        progress(&format!("building template {prefix} failed: {e}"));
                        progress(&format!(
                            "  retry with `sandbox-gateway template build {prefix}`; its pool stays empty until then"
                        ));
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(template = name, error = %e, "could not start the template build");
        }
    }
}

/// Where the data plane listens: `explicit` if given, else the node's port + 1, or a port of
/// its own when the node's was asked as 0. (Port + 1 of an ephemeral port may be any other
/// program's ephemeral port: two gateways starting side by side collided on it.)
fn data_listen(listen: &str, bound: SocketAddr, explicit: Option<&str>) -> String {
    if let Some(a) = explicit {
        return a.to_string();
    }
    let ephemeral = listen.rsplit_once(':').is_some_and(|(_, port)| port == "0");
    let port = if ephemeral {
        0
    } else {
        bound.port().wrapping_add(1)
    };
    SocketAddr::new(bound.ip(), port).to_string()
}

pub async fn start(cfg: DaemonConfig) -> Result<RunningNode> {
    let listener = tokio::net::TcpListener::bind(&cfg.listen)
        .await
        .map_err(|e| Error::io(format!("binding the node listener {}", cfg.listen), e))?;
    let address = listener
        .local_addr()
        .map_err(|e| Error::io("reading the node listener address", e))?;
    let data_listen = data_listen(&cfg.listen, address, cfg.data_listen.as_deref());
    let data_listener = tokio::net::TcpListener::bind(&data_listen)
        .await
        .map_err(|e| Error::io(format!("binding the data-plane listener {data_listen}"), e))?;
    let data_address = data_listener
        .local_addr()
        .map_err(|e| Error::io("reading the data-plane listener address", e))?;
    let mut node_cfg = cfg.node;
    std::fs::create_dir_all(&node_cfg.data_dir)
        .map_err(|e| Error::io(format!("creating {}", node_cfg.data_dir.display()), e))?;
    node_cfg.data_dir = node_cfg
        .data_dir
        .canonicalize()
        .map_err(|e| Error::io(format!("resolving {}", node_cfg.data_dir.display()), e))?;
    node_cfg.advertise_address = cfg.advertise_address.unwrap_or_else(|| address.to_string());
    // The data plane is advertised on the host the node is known by.
    let advertised_host = node_cfg
        .advertise_address
        .rsplit_once(':')
        .map_or(node_cfg.advertise_address.as_str(), |(h, _)| h)
        .to_string();
    node_cfg.data_address = format!("{advertised_host}:{}", data_address.port());
    let paths = node_cfg.paths();
    let lock = Node::<AnyRuntime>::lock_data_dir(&node_cfg)?;
    let store = TemplateStore::new(&paths.templates, node_cfg.ids)?;
    let progress = |line: &str| println!("{line}");
    tokio::task::block_in_place(|| store.ensure_base(&progress))?;
    let runtime = pick_runtime(&node_cfg, &paths, cfg.agent)?;
    println!("runtime {}", runtime.describe());
    if runtime.offers_egress() && !runtime.enforces_egress() {
        println!(
            "sandboxes' own network policies are refused on this node: nftables is not installed (apt-get install nftables)"
        );
    }
    if !runtime.offers_egress() {
        let before = node_cfg.pools.len();
        node_cfg.pools.retain(|p| p.key.net != "egress");
        if node_cfg.pools.len() != before {
            println!(
                "sandboxes get no internet access on this node: slirp4netns is not installed (apt-get install slirp4netns); egress pools dropped"
            );
        }
    }
    let recipes = node_cfg.pools.clone();
    let node = Node::open(node_cfg, runtime, lock).await?;
    // After the node cleaned the templates directory (which waits for builds under way).
    build_recipes_in_background(&store, &recipes);
    tokio::spawn(
        node.clone()
            .serve_data_plane(data_listener, cfg.token.clone()),
    );
    let service = NodeServer::with_interceptor(
        NodeService::new(node.clone()),
        RequireFleetToken::new(&cfg.token),
    );
    let shutdown = node.shutdown_token();
    // Replies are small and latency-bound: never let Nagle hold one back.
    let incoming = TcpListenerStream::new(listener).map(|conn| {
        conn.inspect(|s| {
            let _ = s.set_nodelay(true);
        })
    });
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, async move { shutdown.cancelled().await }),
    );
    Ok(RunningNode {
        address,
        data_address,
        node,
        server,
    })
}

impl RunningNode {
    pub fn node(&self) -> &Node<AnyRuntime> {
        &self.node
    }

    /// Stops serving and destroys every instance; checkpoints and the index stay on disk.
    pub async fn stop(self) -> Result<()> {
        self.node.close();
        match self.server.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "node server ended with an error"),
            Err(e) => tracing::error!(error = %e, "node server task failed"),
        }
        self.node.shutdown().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_plane_port_follows_the_nodes() {
        let bound: SocketAddr = "127.0.0.1:40123".parse().unwrap_or_else(|e| panic!("{e}"));
        // Asked for any port: any port of its own, not the neighbour of the one it got.
        assert_eq!(data_listen("127.0.0.1:0", bound, None), "127.0.0.1:0");
        assert_eq!(
            data_listen("127.0.0.1:40123", bound, None),
            "127.0.0.1:40124"
        );
        assert_eq!(
            data_listen("localhost:40123", bound, None),
            "127.0.0.1:40124"
        );
        assert_eq!(
            data_listen("127.0.0.1:0", bound, Some("0.0.0.0:7000")),
            "0.0.0.0:7000"
        );
        let v6: SocketAddr = "[::1]:50051".parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(data_listen("[::1]:0", v6, None), "[::1]:0");
        assert_eq!(data_listen("[::1]:50051", v6, None), "[::1]:50052");
    }
}
