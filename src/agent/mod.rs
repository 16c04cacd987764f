//! The agent: envd (`crate::envd`) serving a sandbox's data plane. Inside a sandbox it is
//! pid 2 of the sandbox's pid namespace, started by the sandbox's init; by hand
//! (`sandbox-gateway agent --listen ADDR`) it serves the machine it runs on, for development.

use std::io::Write;
use std::net::TcpListener;

use crate::envd::EnvdConfig;
use crate::model::{Error, Result};
use crate::sandbox::spec::{BootSpec, ENVD_PORT};

/// The envd protocol version the e2b surface announces for sandboxes: the one the agent's
/// envd server implements (the SDKs gate client-side features on it).
pub use crate::envd::ENVD_VERSION;

fn bind(addr: &str) -> Result<TcpListener> {
    let l = TcpListener::bind(addr).map_err(|e| Error::io(format!("binding {addr}"), e))?;
    l.set_nonblocking(true)
        .map_err(|e| Error::io("configuring the listener", e))?;
    Ok(l)
}

/// Serves envd on `listener`, printing `ready` once it accepts connections (the node waits
/// for that line before it counts the sandbox as warm).
fn serve(listener: TcpListener, cfg: EnvdConfig) -> Result<()> {
    let addr = listener.local_addr().ok();
    crate::envd::run(listener, cfg, move || {
        let mut out = std::io::stdout();
        let _ = out.write_all(b"ready\n").and_then(|_| out.flush());
        tracing::debug!(?addr, "agent ready");
    })
}

/// `sandbox-gateway agent --listen ADDR`: envd outside any sandbox.
pub fn run(listen: &str, cfg: EnvdConfig) -> Result<()> {
    serve(bind(listen)?, cfg)
}

/// The agent inside a sandbox: envd on its port, on every address of the sandbox's own
/// network namespace, with the sandbox's size as its totals. Returns the exit code.
pub fn serve_in_sandbox(spec: &BootSpec) -> i32 {
    // Not dumpable: the sandbox's own root cannot attach to the agent or read its memory.
    // SAFETY: plain prctl.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    let cfg = EnvdConfig {
        init_token: Some(spec.init_token.clone()),
        mem_total_bytes: Some(spec.memory_bytes),
        cpu_count: Some(spec.cpu_count),
        envs_file: Some(crate::interpreter::envs::SANDBOX_ENVS_FILE.into()),
        ..Default::default()
    };
    match bind(&format!("0.0.0.0:{ENVD_PORT}")).and_then(|l| serve(l, cfg)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("agent: {e}");
            1
        }
    }
}
