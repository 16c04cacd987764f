//! `sandbox-gateway serve`: the gateway process. It starts an embedded node when no node
//! address is given, connects the dispatcher to the nodes, and serves the e2b surface.

use std::path::PathBuf;
use std::time::Duration;

use actix_web::{App, HttpServer};

use crate::dispatch::{Dispatcher, DispatcherConfig};
use crate::fsx;
use crate::model::{Error, PoolTarget, Result, ids};
use crate::node::NodeConfig;
use crate::node::daemon::{self, DaemonConfig, RunningNode};
use crate::node::runtime::process::AgentCommand;

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub e2b_listen: String,
    pub kube_listen: String,
    pub nodes: Vec<String>,
    pub data_dir: PathBuf,
    pub node_token_file: Option<PathBuf>,
    /// Warm pools of the embedded node.
    pub pools: Vec<PoolTarget>,
}

/// Resolves when the process is asked to stop (SIGINT or SIGTERM).
pub async fn stop_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch SIGTERM; stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

fn fleet_token(cfg: &ServeConfig) -> Result<String> {
    let path = cfg
        .node_token_file
        .clone()
        .unwrap_or_else(|| cfg.data_dir.join("node-token"));
    if cfg.nodes.is_empty() {
        let (token, created) = fsx::load_or_create_secret(&path, || ids::random_hex(32))
            .map_err(|e| Error::io(format!("fleet token file {}", path.display()), e))?;
        if created {
            tracing::info!(path = %path.display(), "created the fleet token");
        }
        return Ok(token);
    }
    let token = std::fs::read_to_string(&path).map_err(|e| {
        Error::invalid(format!(
            "--node needs the fleet token the nodes use: could not read {} ({e}); pass --node-token-file",
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

pub async fn run(cfg: ServeConfig) -> Result<()> {
    std::fs::create_dir_all(&cfg.data_dir)
        .map_err(|e| Error::io(format!("creating {}", cfg.data_dir.display()), e))?;
    let token = fleet_token(&cfg)?;

    let embedded: Option<RunningNode> = if cfg.nodes.is_empty() {
        let mut node = NodeConfig::new("embedded", cfg.data_dir.join("node"));
        node.pools = cfg.pools.clone();
        let running = daemon::start(DaemonConfig {
            node,
            listen: "127.0.0.1:0".into(),
            advertise_address: None,
            token: token.clone(),
            agent: AgentCommand::current_exe()
                .map_err(|e| Error::io("locating this executable", e))?,
            isolate: true,
        })
        .await?;
        Some(running)
    } else {
        None
    };

    let dispatcher = Dispatcher::new(DispatcherConfig::default(), &token);
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

    let server = HttpServer::new(|| App::new().configure(crate::e2b::configure))
        .workers(2)
        .disable_signals()
        .bind(&cfg.e2b_listen)
        .map_err(|e| Error::io(format!("binding the e2b listener {}", cfg.e2b_listen), e))?;
    let e2b_addr = server
        .addrs()
        .first()
        .map(|a| a.to_string())
        .unwrap_or_else(|| cfg.e2b_listen.clone());
    let server = server.run();
    let handle = server.handle();
    let serving = tokio::spawn(server);

    println!("sandbox-gateway {}", env!("CARGO_PKG_VERSION"));
    println!("e2b API listening on http://{e2b_addr}");
    println!("  export E2B_API_URL=http://{e2b_addr}");
    println!("  health: curl -i http://{e2b_addr}/health");
    match &embedded {
        Some(n) => println!(
            "embedded node {:?} on {} (data in {})",
            n.node().name(),
            n.address,
            cfg.data_dir.join("node").display()
        ),
        None => println!("nodes: {}", cfg.nodes.join(", ")),
    }
    println!(
        "Kubernetes API ({}) is not served by this build yet",
        cfg.kube_listen
    );
    println!("press Ctrl-C to stop");

    stop_signal().await;
    tracing::info!("stopping");
    handle.stop(true).await;
    let _ = serving.await;
    dispatcher.shutdown().await;
    if let Some(n) = embedded {
        n.stop().await?;
    }
    Ok(())
}
