//! The in-sandbox agent: serves the envd-compatible data plane (`crate::envd`) on the
//! listener its node hands it (or one it binds when run by hand), and takes its sandbox down
//! when the node's lifeline closes.

use std::io::Write;
use std::net::TcpListener;
use std::os::fd::{FromRawFd, RawFd};
use std::path::PathBuf;

use crate::envd::EnvdConfig;
use crate::model::{Error, Result};

/// The envd protocol version the e2b surface announces for sandboxes: the one the agent's
/// envd server implements (the SDKs gate client-side features on it).
pub use crate::envd::ENVD_VERSION;

#[derive(Debug, Clone, Default)]
pub struct AgentConfig {
    /// Address to bind, for running an agent by hand.
    pub listen: Option<String>,
    /// An already-listening socket inherited from the node.
    pub listen_fd: Option<RawFd>,
    /// The read end of the node's lifeline pipe: end of file means the node is gone.
    pub lifeline_fd: Option<RawFd>,
    pub state_dir: Option<PathBuf>,
    pub envd: EnvdConfig,
}

/// Keeps an inherited descriptor out of the commands the agent starts (a command holding the
/// listening socket could accept envd's connections).
fn set_cloexec(fd: RawFd) {
    // SAFETY: fcntl on a descriptor this process owns; failure leaves it as it was.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
        }
    }
}

fn listener(cfg: &AgentConfig) -> Result<TcpListener> {
    let l = match (cfg.listen_fd, &cfg.listen) {
        (Some(fd), _) => {
            set_cloexec(fd);
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
    set_cloexec(fd);
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
        // Commands lead their own sessions: end them first, then our own process group.
        crate::envd::process::table::kill_all_commands();
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
    let listener = listener(&cfg)?;
    let addr = listener.local_addr().ok();
    crate::envd::run(listener, cfg.envd, move || {
        // The node waits for this line before it counts the instance as warm.
        let mut out = std::io::stdout();
        let _ = out.write_all(b"ready\n").and_then(|_| out.flush());
        tracing::debug!(?addr, "agent ready");
    })
}
