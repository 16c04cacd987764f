//! The in-sandbox agent. Today it answers health on the listener its node hands it; it grows
//! into an envd-compatible data plane.

use std::io::Write;
use std::net::TcpListener;
use std::os::fd::{FromRawFd, RawFd};
use std::path::PathBuf;

use actix_web::{App, HttpResponse, HttpServer, web};

use crate::model::{Error, Result};

/// The envd protocol version the e2b surface announces for sandboxes. The agent serves
/// envd's `GET /health`; the SDKs gate client-side features on this number, and 0.2.4 is the
/// lowest at which they allow every control-plane call the gateway serves (metrics included)
/// without warnings. It rises as the agent implements more of envd.
pub const ENVD_VERSION: &str = "0.2.4";

#[derive(Debug, Clone, Default)]
pub struct AgentConfig {
    /// Address to bind, for running an agent by hand.
    pub listen: Option<String>,
    /// An already-listening socket inherited from the node.
    pub listen_fd: Option<RawFd>,
    /// The read end of the node's lifeline pipe: end of file means the node is gone.
    pub lifeline_fd: Option<RawFd>,
    pub state_dir: Option<PathBuf>,
}

async fn health() -> HttpResponse {
    HttpResponse::NoContent().finish()
}

fn listener(cfg: &AgentConfig) -> Result<TcpListener> {
    let l = match (cfg.listen_fd, &cfg.listen) {
        (Some(fd), _) => {
            // SAFETY: the node placed a listening TCP socket at this descriptor for us.
            unsafe { TcpListener::from_raw_fd(fd) }
        }
        (None, Some(addr)) => {
            TcpListener::bind(addr).map_err(|e| Error::io(format!("binding {addr}"), e))?
        }
        (None, None) => return Err(Error::invalid("agent needs --listen or --listen-fd")),
    };
    l.set_nonblocking(true)
        .map_err(|e| Error::io("configuring the listener", e))?;
    Ok(l)
}

/// Ends the whole process group (this agent and everything it started) once the node is gone.
fn watch_lifeline(fd: RawFd) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16];
        loop {
            // SAFETY: reading into a valid buffer from an inherited descriptor.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n > 0 {
                continue;
            }
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        // SAFETY: signalling our own process group.
        unsafe { libc::kill(0, libc::SIGKILL) };
    });
}

pub fn run(cfg: AgentConfig) -> Result<()> {
    if let Some(dir) = &cfg.state_dir {
        std::env::set_current_dir(dir)
            .map_err(|e| Error::io(format!("entering {}", dir.display()), e))?;
    }
    if let Some(fd) = cfg.lifeline_fd {
        watch_lifeline(fd);
    }
    serve(listener(&cfg)?)
}

/// The agent inside a sandbox (pid 2 of its pid namespace): envd on its port, on every
/// address of the sandbox's own network namespace. Returns the process's exit code.
pub fn serve_in_sandbox(_spec: &crate::sandbox::spec::BootSpec) -> i32 {
    // Not dumpable: the sandbox's own root cannot attach to the agent or read its memory.
    // SAFETY: plain prctl.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    let addr = std::net::SocketAddr::from(([0, 0, 0, 0], crate::sandbox::spec::ENVD_PORT));
    let served = TcpListener::bind(addr)
        .map_err(|e| Error::io(format!("binding {addr}"), e))
        .and_then(|l| {
            l.set_nonblocking(true)
                .map_err(|e| Error::io("configuring the listener", e))?;
            serve(l)
        });
    match served {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("agent: {e}");
            1
        }
    }
}

fn serve(listener: TcpListener) -> Result<()> {
    let addr = listener.local_addr().ok();
    actix_web::rt::System::new().block_on(async move {
        let server = HttpServer::new(|| App::new().route("/health", web::get().to(health)))
            .workers(1)
            .disable_signals()
            .listen(listener)
            .map_err(|e| Error::io("serving the agent listener", e))?
            .run();
        // The node waits for this line before it counts the instance as warm.
        let mut out = std::io::stdout();
        let _ = out.write_all(b"ready\n").and_then(|_| out.flush());
        tracing::debug!(?addr, "agent ready");
        server.await.map_err(|e| Error::io("agent server", e))
    })
}
