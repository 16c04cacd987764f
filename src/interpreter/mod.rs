//! The code interpreter: e2b's Code Interpreter API (port 49999) in front of real Jupyter
//! kernels, so that `e2b-code-interpreter`'s `run_code` works unmodified. It runs in every
//! sandbox of a template that ships `/etc/sandbox-gateway/code-interpreter.json`, started by
//! the sandbox's init (and started again when it dies), as the sandbox's root; it speaks the
//! Jupyter messaging protocol to the kernels itself, with no Jupyter server. See README.md,
//! "The Code Interpreter".

pub mod config;
mod contexts;
pub mod envs;
mod execute;
mod http;
mod kernel;
mod kernelspec;
pub mod languages;
pub mod openapi;
pub mod output;
mod server;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::model::{Error, Result};

pub use config::{Config, TEMPLATE_CONFIG};

/// The port SDKs reach the interpreter on.
pub const PORT: u16 = 49999;
/// The socket a gVisor sandbox's interpreter listens on (its door leads port 49999 there).
pub const SOCKET: &str = "/.sandbox-gateway/interpreter.sock";
/// Where kernels' connection files and sockets live inside a sandbox (root only).
pub const RUNTIME_DIR: &str = "/run/sandbox-gateway/kernels";

/// Where the server accepts connections.
pub enum Listen {
    Tcp(String),
    Unix(PathBuf),
}

pub struct Options {
    pub listen: Listen,
    pub config: Config,
    pub runtime_dir: PathBuf,
    /// The sandbox-wide variables envd publishes (none outside a sandbox).
    pub envs_file: Option<PathBuf>,
    /// The environment kernels start with.
    pub kernel_env: Vec<(String, String)>,
    /// The sandbox's memory: a context is refused when the kernels already use it up.
    pub memory_bytes: Option<u64>,
}

/// The environment of kernels inside a sandbox: root's, with a plain PATH; the kernelspec and
/// the sandbox's own variables come on top.
pub fn sandbox_kernel_env() -> Vec<(String, String)> {
    [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("HOME", "/root"),
        ("USER", "root"),
        ("LOGNAME", "root"),
        ("SHELL", "/bin/bash"),
        ("LANG", "C.UTF-8"),
        ("TERM", "xterm-256color"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Prepares the runtime directory: made afresh (a previous server's kernels are gone with it)
/// and only for its owner.
fn fresh_runtime_dir(dir: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let _ = std::fs::remove_dir_all(dir);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| Error::io(format!("securing {}", dir.display()), e))
}

/// Serves until the process ends: binds, starts the default contexts in the background, and
/// answers `/health` once they are up.
pub fn run(opts: Options) -> Result<()> {
    fresh_runtime_dir(&opts.runtime_dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("interpreter")
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the interpreter's runtime", e))?;
    rt.block_on(serve(opts))
}

async fn serve(opts: Options) -> Result<()> {
    let server = Arc::new(server::Server {
        cfg: opts.config,
        runtime_dir: opts.runtime_dir,
        kernel_env: opts.kernel_env,
        memory_bytes: opts.memory_bytes,
        envs: envs::SandboxEnvs::new(opts.envs_file),
        contexts: Default::default(),
        started: Default::default(),
        admitting: Default::default(),
    });
    let app = http::router(server.clone());
    let starting = server.clone();
    tokio::spawn(async move { starting.start_defaults().await });
    let served = match opts.listen {
        Listen::Tcp(addr) => {
            use axum::serve::ListenerExt;
            let l = tokio::net::TcpListener::bind(&addr)
                .await
                .map_err(|e| Error::io(format!("binding {addr}"), e))?;
            // Lines go out as they come: no delayed-ACK wait on a small one.
            axum::serve(
                l.tap_io(|t| {
                    let _ = t.set_nodelay(true);
                }),
                app,
            )
            .await
        }
        Listen::Unix(path) => {
            let _ = std::fs::remove_file(&path);
            let l = tokio::net::UnixListener::bind(&path)
                .map_err(|e| Error::io(format!("binding {}", path.display()), e))?;
            axum::serve(l, app).await
        }
    };
    served.map_err(|e| Error::io("serving the code interpreter", e))
}

/// How long a sandbox's init waits before starting a server that died, by how often it did.
pub fn restart_delay(deaths: u32) -> Duration {
    Duration::from_secs(u64::from(deaths.clamp(1, 30)))
}
