//! An envd-compatible server, the data plane of every sandbox: the e2b SDKs' `commands`,
//! `files` and `pty` talk to it unmodified (Connect RPC with the JSON or binary codec, plus
//! envd's plain HTTP routes). See README.md, "The e2b data plane (envd)".

pub mod auth;
pub mod cacerts;
pub mod creds;
mod drain;
pub mod encoding;
pub mod entry;
pub mod errors;
pub mod fileio;
pub mod files;
pub mod fs;
pub mod http;
pub mod metrics;
pub mod paths;
pub mod process;
pub mod proto;
pub mod state;
pub mod users;
pub mod watch;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::model::{Error, Result};

/// The envd version this server claims. The SDKs gate features on it locally; 0.6.4 is the
/// highest version whose gates (stdin control, close_stdin, octet-stream and gzip uploads, file
/// metadata, watch entries, watching network mounts) are all implemented and tested here.
pub const ENVD_VERSION: &str = "0.6.4";

/// Blocking threads started up front and kept for the life of the process: under a pid limit
/// (a fork bomb in a command) the kernel may refuse new threads, and tokio can still queue
/// blocking work as long as one thread exists.
const PREWARMED_BLOCKING_THREADS: usize = 4;
const MAX_BLOCKING_THREADS: usize = 64;
/// One: a command's request, spawn, output and end then stay on one thread. Each hand-off
/// between workers woken from idle cost a sandbox's spaced command about a millisecond on
/// these hosts (PERFORMANCE.md, "Command round trip"); blocking work has its own threads.
const WORKER_THREADS: usize = 1;

#[derive(Debug, Clone, Default)]
pub struct EnvdConfig {
    /// Token /init must carry (the node's per-instance boot secret); None = /init unauthenticated.
    pub init_token: Option<String>,
    /// The access token in force before any /init (dev use); None = no token required until /init sets one.
    pub access_token: Option<String>,
    /// Default user for commands and files ("user" on e2b); None = "user" if it exists in /etc/passwd, else the user envd runs as.
    pub default_user: Option<String>,
    pub default_workdir: Option<PathBuf>,
    pub env_vars: BTreeMap<String, String>,
    /// What /metrics reports as totals when set (the sandbox's size tier); else measured from the host view.
    pub mem_total_bytes: Option<u64>,
    pub cpu_count: Option<u32>,
    /// Inside a sandbox: where the sandbox-wide variables are published for the code
    /// interpreter whenever they change.
    pub envs_file: Option<PathBuf>,
}

/// Where envd accepts connections.
pub enum Listener {
    Tcp(std::net::TcpListener),
    /// A Unix socket: what a gVisor sandbox's door reaches (gVisor cannot checkpoint a TCP
    /// listener that an epoll instance watches, and envd's runtime uses epoll), and, beside
    /// the TCP port, what the node dials in a built-in sandbox (see `agent`).
    Unix(std::os::unix::net::UnixListener),
}

impl From<std::net::TcpListener> for Listener {
    fn from(l: std::net::TcpListener) -> Self {
        Listener::Tcp(l)
    }
}

/// Serves envd on already-bound listeners (the same server on each) until the process ends.
/// Builds its own tokio runtime (the caller is a freshly forked, single-threaded process);
/// calls `on_ready` once it accepts connections.
pub fn run(
    listeners: Vec<Listener>,
    cfg: EnvdConfig,
    on_ready: impl FnOnce() + Send + 'static,
) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        // Idle blocking threads are never given back (see PREWARMED_BLOCKING_THREADS).
        .thread_keep_alive(Duration::from_secs(10 * 365 * 24 * 3600))
        .thread_name("envd")
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the envd runtime", e))?;
    rt.block_on(serve(listeners, cfg, on_ready))
}

/// Makes `n` blocking threads exist at once (each waits for the others), so they stay idle.
async fn prewarm_blocking(n: usize) {
    let barrier = Arc::new(std::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let b = barrier.clone();
            tokio::task::spawn_blocking(move || {
                b.wait();
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
}

async fn serve(
    listeners: Vec<Listener>,
    cfg: EnvdConfig,
    on_ready: impl FnOnce() + Send + 'static,
) -> Result<()> {
    use axum::serve::ListenerExt;
    prewarm_blocking(PREWARMED_BLOCKING_THREADS).await;
    let app = http::router(Arc::new(state::Envd::new(cfg)));
    let configure = |e| Error::io("configuring the envd listener", e);
    let register = |e| Error::io("registering the envd listener", e);
    let mut served = tokio::task::JoinSet::new();
    for listener in listeners {
        let app = app.clone();
        match listener {
            Listener::Tcp(l) => {
                l.set_nonblocking(true).map_err(configure)?;
                let l = tokio::net::TcpListener::from_std(l).map_err(register)?;
                // Without TCP_NODELAY a command's first output waits out a delayed ACK (~40 ms).
                let l = l.tap_io(|t| {
                    let _ = t.set_nodelay(true);
                });
                served.spawn(async move { axum::serve(l, app).await });
            }
            Listener::Unix(l) => {
                l.set_nonblocking(true).map_err(configure)?;
                let l = tokio::net::UnixListener::from_std(l).map_err(register)?;
                served.spawn(async move { axum::serve(l, app).await });
            }
        }
    }
    on_ready();
    // A listener only stops serving on an error; the first one ends the agent.
    match served.join_next().await {
        Some(Ok(r)) => r.map_err(|e| Error::io("serving envd", e)),
        Some(Err(e)) => Err(Error::io("serving envd", std::io::Error::other(e))),
        None => Err(Error::invalid("envd was given no listener")),
    }
}
