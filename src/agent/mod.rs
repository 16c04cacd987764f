//! The agent: envd (`crate::envd`) serving a sandbox's data plane. Inside a sandbox it is
//! pid 2 of the sandbox's pid namespace, started by the sandbox's init; by hand
//! (`sandbox-gateway agent --listen ADDR`) it serves the machine it runs on, for development.

use std::io::Write;
use std::net::TcpListener;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};

use crate::envd::{EnvdConfig, Listener};
use crate::model::{Error, Result};
use crate::sandbox::spec::{BootSpec, ENVD_ABSTRACT_SOCKET, ENVD_PORT};

/// The envd protocol version the e2b surface announces for sandboxes: the one the agent's
/// envd server implements (the SDKs gate client-side features on it).
pub use crate::envd::ENVD_VERSION;

fn bind(addr: &str) -> Result<TcpListener> {
    let l = TcpListener::bind(addr).map_err(|e| Error::io(format!("binding {addr}"), e))?;
    l.set_nonblocking(true)
        .map_err(|e| Error::io("configuring the listener", e))?;
    Ok(l)
}

/// Serves envd on `listeners`, printing `ready` once it accepts connections (the node waits
/// for that line before it counts the sandbox as warm).
fn serve(listeners: Vec<Listener>, cfg: EnvdConfig) -> Result<()> {
    let addr = listeners.iter().find_map(|l| match l {
        Listener::Tcp(t) => t.local_addr().ok(),
        Listener::Unix(_) => None,
    });
    crate::envd::run(listeners, cfg, move || {
        let mut out = std::io::stdout();
        let _ = out.write_all(b"ready\n").and_then(|_| out.flush());
        tracing::debug!(?addr, "agent ready");
    })
}

/// `sandbox-gateway agent --listen ADDR`: envd outside any sandbox.
pub fn run(listen: &str, cfg: EnvdConfig) -> Result<()> {
    serve(vec![bind(listen)?.into()], cfg)
}

/// The agent inside a sandbox: envd on its port, on every address of the sandbox's own
/// network namespace, and on an abstract Unix socket of that namespace, which the node dials
/// (it moves bytes at about twice the rate of loopback TCP here, and the proxy's transfers
/// cross it; PERFORMANCE.md, "Transfers"). Abstract names belong to the network namespace,
/// so only the sandbox and a socket made in its namespace reach it, as with the port. The
/// sandbox's size is envd's totals. Returns the exit code.
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
    let listeners = bind(&format!("0.0.0.0:{ENVD_PORT}")).and_then(|tcp| {
        let unix = UnixListener::bind_addr(
            &SocketAddr::from_abstract_name(ENVD_ABSTRACT_SOCKET)
                .map_err(|e| Error::io("naming envd's socket", e))?,
        )
        .map_err(|e| Error::io("binding envd's socket", e))?;
        Ok(vec![tcp.into(), Listener::Unix(unix)])
    });
    match listeners.and_then(|l| serve(l, cfg)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("agent: {e}");
            1
        }
    }
}
