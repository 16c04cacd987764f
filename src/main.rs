use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use sandbox_gateway::cluster::discover::DiscoveryConfig;
use sandbox_gateway::cluster::{self, publish::Publisher};
use sandbox_gateway::config::{
    Cli, Command, KeysCommand, NodeArgs, ReadViewSource, TemplateCommand, host_name,
};
use sandbox_gateway::dispatch::{DispatcherConfig, ViewFeed};
use sandbox_gateway::facade::auth::DelegationSource;
use sandbox_gateway::model::{Error, Result, ids};
use sandbox_gateway::node::NodeConfig;
use sandbox_gateway::node::daemon::{self, DaemonConfig};
use sandbox_gateway::node::runtime::builtin::AgentCommand;
use sandbox_gateway::sandbox::spec::IdMap;
use sandbox_gateway::templates::{BuildSpec, TemplateStore};
use sandbox_gateway::{agent, fsx, gateway};
use tokio_util::sync::CancellationToken;

fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Inside a sandbox: `LEVEL message key=value…` lines on stderr, which the node keeps as the
/// sandbox's log (`node::logs::parse_line` reads them).
fn init_sandbox_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .with_ansi(false)
        .init();
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the async runtime", e))
}

async fn run_node(args: NodeArgs) -> Result<()> {
    // From here on a stop request waits for startup to finish, then stops cleanly.
    let stop = gateway::stop_signal();
    let token_file = args
        .token_file
        .clone()
        .unwrap_or_else(|| args.data_dir.join("node-token"));
    let (token, created) = fsx::load_or_create_secret(&token_file, || ids::random_hex(32))
        .map_err(|e| Error::io(format!("fleet token file {}", token_file.display()), e))?;
    if created {
        println!("created fleet token in {}", token_file.display());
    }
    let publish_interval = Duration::try_from_secs_f64(args.publish_interval_seconds)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| Error::invalid("--publish-interval-seconds must be a positive number"))?;
    let publisher = if args.publish_inventory {
        let client = cluster::client(args.kubeconfig.as_deref(), "--publish-inventory").await?;
        Some(Publisher::new(client))
    } else {
        None
    };
    let mut node = NodeConfig::new(args.name.clone().unwrap_or_else(host_name), &args.data_dir);
    node.pools = args.pools.clone();
    args.sandboxes.apply(&mut node)?;
    node.volumes_dir = args.volumes_dir.clone();
    if let (Some(dir), Some(key)) = (&args.secrets_dir, &args.secrets_key_file) {
        if !key.exists() {
            return Err(Error::invalid(format!(
                "--secrets-key-file {}: no such file (a node reads the gateway's key, it never makes one)",
                key.display()
            )));
        }
        let (store, _) = sandbox_gateway::secrets::SecretStore::open(dir, key)?;
        node.secrets = Some(std::sync::Arc::new(store));
    }
    node.lease = args.lease();
    node.fork_limit = args.fork_limit;
    node.max_sandboxes = args.max_sandboxes;
    node.cold_start = !args.no_cold_start;
    let running = daemon::start(DaemonConfig {
        node,
        listen: args.listen.clone(),
        data_listen: args.data_listen.clone(),
        advertise_address: args.advertise_address.clone(),
        token,
        agent: AgentCommand::current_exe().map_err(|e| Error::io("locating this executable", e))?,
    })
    .await?;
    let publishing = publisher.map(|p| {
        let stop = CancellationToken::new();
        let task = tokio::spawn(p.clone().run(
            running.node().clone(),
            publish_interval,
            stop.clone(),
        ));
        (p, stop, task)
    });
    println!(
        "node {} listening on {} (data plane on {}; token in {})",
        running.node().name(),
        running.address,
        running.data_address,
        token_file.display()
    );
    if publishing.is_some() {
        println!(
            "publishing NodeInventory {} every {publish_interval:?}",
            running.node().name()
        );
    }
    stop.await;
    tracing::info!("stopping");
    let node = running.node().clone();
    let stopped = running.stop().await;
    if let Some((publisher, stop, task)) = publishing {
        stop.cancel();
        let _ = task.await;
        // The last publish says the node holds nothing now, so lists drop its sandboxes at
        // once instead of after the staleness bound.
        if let Err(e) = publisher.publish(&node).await {
            tracing::warn!(error = %e, "the final NodeInventory publish failed");
        }
    }
    stopped
}

fn template_command(cmd: TemplateCommand) -> Result<()> {
    let progress = |line: &str| println!("{line}");
    let open = |d: &sandbox_gateway::config::TemplateDirArgs| {
        TemplateStore::new(d.dir(), IdMap::new(d.uid_base)?)
    };
    match cmd {
        TemplateCommand::Build(b) => {
            let store = open(&b.dir)?;
            store.build(
                &BuildSpec {
                    name: b.name,
                    packages: b.packages,
                    from: b.from,
                    force: b.force,
                    if_missing: b.if_missing,
                },
                &progress,
            )?;
        }
        TemplateCommand::Import(i) => {
            open(&i.dir)?.import(&i.name, &i.file, i.force, &progress)?;
        }
        TemplateCommand::List(d) => {
            println!(
                "{:<20} {:<8} {:>9}  {:<20}  SOURCE",
                "NAME", "KIND", "SIZE", "CREATED"
            );
            for t in open(&d)?.list() {
                let m = &t.meta;
                println!(
                    "{:<20} {:<8} {:>6} MiB  {:<20}  {}",
                    m.name,
                    format!("{:?}", m.kind).to_lowercase(),
                    m.size_bytes >> 20,
                    m.created_at.format("%Y-%m-%d %H:%M:%S"),
                    m.source
                );
            }
        }
    }
    Ok(())
}

/// `sandbox-gateway interpreter`: the code interpreter outside any sandbox, with this
/// process's own environment for its kernels.
fn interpreter(args: sandbox_gateway::config::InterpreterArgs) -> Result<()> {
    use sandbox_gateway::interpreter::{self, Config, Listen, Options};
    let config = match &args.config {
        Some(p) => Config::load(p).map_err(Error::invalid)?,
        None => Config::default(),
    };
    let runtime_dir = args.runtime_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("sandbox-gateway-kernels-{}", std::process::id()))
    });
    interpreter::run(Options {
        listen: Listen::Tcp(args.listen),
        config,
        runtime_dir,
        envs_file: args.envs_file,
        kernel_env: std::env::vars().collect(),
        memory_bytes: None,
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command.unwrap_or(Command::Serve(Box::new(cli.serve))) {
        Command::Agent(a) => {
            if a.boot.is_some() {
                init_sandbox_logging();
            } else {
                init_logging("warn");
            }
            if a.gvisor_init {
                sandbox_gateway::sandbox::gvisor_init::run(
                    a.init_token.unwrap_or_default(),
                    a.memory_bytes,
                    a.cpu_count,
                    a.pids,
                    a.egress,
                    &a.services,
                );
            }
            if let (Some(spec), Some(fd)) = (&a.reap, a.lifeline_fd) {
                let code = sandbox_gateway::node::runtime::reaper::run(spec, fd);
                return ExitCode::from(code.clamp(0, 255) as u8);
            }
            if let (Some(spec), Some(fd)) = (&a.net_holder, a.lifeline_fd) {
                let code = sandbox_gateway::sandbox::netholder::run(spec, fd);
                return ExitCode::from(code.clamp(0, 255) as u8);
            }
            if let Some(spec) = &a.boot {
                let code = sandbox_gateway::sandbox::supervisor::run(spec, a.lifeline_fd);
                return ExitCode::from(code.clamp(0, 255) as u8);
            }
            agent::run(
                a.listen.as_deref().unwrap_or_default(),
                sandbox_gateway::envd::EnvdConfig {
                    access_token: a.access_token,
                    init_token: a.init_token,
                    default_user: a.user,
                    default_workdir: a.workdir,
                    ..Default::default()
                },
            )
        }
        Command::Interpreter(i) => {
            init_logging("info");
            interpreter(i)
        }
        Command::Node(n) => {
            if let Some(code) = sandbox_gateway::node::pid1::stand_in() {
                return code;
            }
            init_logging("info");
            runtime().and_then(|rt| rt.block_on(run_node(*n)))
        }
        Command::Serve(s) => {
            if let Some(code) = sandbox_gateway::node::pid1::stand_in() {
                return code;
            }
            let s = *s;
            init_logging("info");
            let claim_timeout = Duration::try_from_secs_f64(s.claim_timeout_seconds)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| Error::invalid("--claim-timeout-seconds must be a positive number"));
            let stalled_client = match Duration::try_from_secs_f64(s.stalled_client_seconds) {
                Ok(d) => Ok((!d.is_zero()).then_some(d)),
                Err(_) => Err(Error::invalid(
                    "--stalled-client-seconds must be 0 (no limit) or a positive number",
                )),
            };
            claim_timeout
                .and_then(|claim_timeout| stalled_client.map(|stall| (claim_timeout, stall)))
                .and_then(|(claim_timeout, stalled_client)| {
                    runtime().map(|rt| (rt, claim_timeout, stalled_client))
                })
                .and_then(|(rt, claim_timeout, stalled_client)| {
                    rt.block_on(gateway::run(gateway::ServeConfig {
                        e2b_listen: s.e2b_listen,
                        kube_listen: s.kube_listen,
                        nodes: s.nodes,
                        data_dir: s.data_dir,
                        node_token_file: s.node_token_file,
                        pools: s.pools,
                        sandboxes: s.sandboxes,
                        api_keys: s.api_keys,
                        allow_anonymous: s.allow_anonymous,
                        e2b_domain: Some(s.e2b_domain),
                        e2b_tls: match (s.e2b_tls_cert, s.e2b_tls_key) {
                            (Some(cert_file), Some(key_file)) => Some(gateway::E2bTls::Provided {
                                cert_file,
                                key_file,
                            }),
                            _ => s.e2b_tls.then_some(gateway::E2bTls::Generated),
                        },
                        envd_secret_file: s.envd_secret_file,
                        secrets_dir: s.secrets_dir,
                        secrets_key_file: s.secrets_key_file,
                        volumes_dir: s.volumes_dir,
                        volume_mib: s.volume_mib,
                        dispatcher: DispatcherConfig {
                            claim_timeout,
                            ..Default::default()
                        },
                        kube: gateway::KubeConfig {
                            tls_cert_file: s.tls_cert_file,
                            tls_key_file: s.tls_key_file,
                            dns_names: s.tls_dns_names,
                            delegate: s.delegate_auth.then_some(DelegationSource {
                                requestheader_ca_file: s.requestheader_client_ca_file,
                                allowed_names: s.requestheader_allowed_names,
                                kubeconfig: s.kubeconfig.clone(),
                            }),
                        },
                        cluster: s.discover_nodes.then(|| gateway::ClusterConfig {
                            kubeconfig: s.kubeconfig.clone(),
                            discovery: DiscoveryConfig {
                                stale_after: Duration::from_secs(s.inventory_stale_seconds),
                                feed: match s.read_view {
                                    Some(ReadViewSource::Stream) => ViewFeed::Stream,
                                    Some(ReadViewSource::Inventory) | None => ViewFeed::Inventory,
                                },
                                ..Default::default()
                            },
                        }),
                        stalled_client,
                    }))
                })
        }
        Command::Keys(KeysCommand::Create(k)) => {
            let file = k.file.unwrap_or_else(|| k.data_dir.join("api-keys"));
            gateway::create_key(&file, &k.namespace).map(|key| {
                println!("{key}");
                eprintln!(
                    "added to {} for namespace {} (stored as its SHA-256; this is the only time it is shown)",
                    file.display(),
                    k.namespace
                );
            })
        }
        Command::Kubeconfig(k) => {
            let ca = k.ca_file.clone().unwrap_or_else(|| {
                sandbox_gateway::facade::tls::ca_paths(&k.data_dir.join("tls")).0
            });
            std::fs::read_to_string(&ca)
                .map_err(|e| {
                    Error::io(
                        format!(
                            "reading the gateway CA {} (start the gateway once first)",
                            ca.display()
                        ),
                        e,
                    )
                })
                .map(|pem| {
                    print!(
                        "{}",
                        sandbox_gateway::facade::kubeconfig::render(
                            &k.server,
                            &pem,
                            &k.api_key,
                            k.namespace.as_deref()
                        )
                    )
                })
        }
        Command::Template(t) => {
            init_logging("warn");
            template_command(t)
        }
        Command::Openapi(o) => {
            if o.interpreter {
                print!("{}", sandbox_gateway::interpreter::openapi::document_json());
            } else {
                print!("{}", sandbox_gateway::e2b::openapi::document_json());
            }
            Ok(())
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandbox-gateway: {e}");
            ExitCode::FAILURE
        }
    }
}
