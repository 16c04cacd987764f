//! Starting a command as envd does: as the selected user (uid, gid, supplementary groups), in
//! its own session (a signal to the group ends its children too), with a raised
//! `oom_score_adj` (under memory pressure the kernel kills commands before envd), its output
//! read as it comes and its end reported once the output is drained.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use connectrpc::{ConnectError, ErrorCode};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::unix::pipe::{Receiver, Sender};
use tokio::sync::{mpsc, watch};

use super::launch;
use super::pty::{self, PtyMaster};
use super::status::{end_event, failed_end};
use super::table::{Hub, HubMsg, Proc};
use crate::envd::proto::process::__buffa::oneof::process_event::data_event::Output;
use crate::envd::proto::process::ProcessConfig;
use crate::envd::state::Envd;
use crate::envd::users::User;

const PIPE_CHUNK: usize = 32 * 1024;
const PTY_CHUNK: usize = 16 * 1024;
/// After the command exits, output still arriving is forwarded until the pipe has been quiet
/// this long (a background child may hold it open forever).
const DRAIN_IDLE: Duration = Duration::from_millis(100);

pub struct SpawnSpec {
    pub user: User,
    pub switch_user: bool,
    pub config: ProcessConfig,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub pty: Option<(u16, u16)>,
    pub stdin: bool,
    pub tag: Option<String>,
    /// When the request's deadline passes the command is killed, as envd ties a process's
    /// life to the Start call's `Connect-Timeout-Ms`.
    pub deadline: Option<Instant>,
}

/// A command line cut for a log line.
fn short(cmdline: &str) -> String {
    const MAX: usize = 200;
    match cmdline.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &cmdline[..i]),
        None => cmdline.to_string(),
    }
}

fn cstring(what: &str, bytes: &[u8]) -> Result<CString, ConnectError> {
    CString::new(bytes).map_err(|_| {
        ConnectError::new(
            ErrorCode::InvalidArgument,
            format!("{what} contains a NUL byte"),
        )
    })
}

fn internal_error(what: &str) -> ConnectError {
    ConnectError::new(ErrorCode::Internal, what.to_string())
}

fn start_error(cmdline: &str, e: &std::io::Error) -> ConnectError {
    let code = match e.raw_os_error() {
        // fork/clone refused: the sandbox is out of processes or memory.
        Some(libc::EAGAIN) | Some(libc::ENOMEM) => ErrorCode::ResourceExhausted,
        Some(libc::EACCES) | Some(libc::EPERM) => ErrorCode::PermissionDenied,
        _ => ErrorCode::InvalidArgument,
    };
    ConnectError::new(code, format!("error starting process '{cmdline}': {e}"))
}

/// Starts the command and registers it. The returned receiver is already attached, so the
/// Start stream sees the command's first byte.
pub fn start(
    envd: &Arc<Envd>,
    spec: SpawnSpec,
) -> Result<(Arc<Proc>, mpsc::Receiver<HubMsg>), ConnectError> {
    let cfg = &spec.config;
    let cmdline = std::iter::once(cfg.cmd.as_str())
        .chain(cfg.args.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ");
    if cfg.cmd.is_empty() {
        return Err(ConnectError::new(
            ErrorCode::InvalidArgument,
            "cmd must not be empty",
        ));
    }
    cstring("cwd", spec.cwd.as_os_str().as_bytes())?;
    cstring("cmd", cfg.cmd.as_bytes())?;
    for a in &cfg.args {
        cstring("an argument", a.as_bytes())?;
    }
    for (k, v) in &spec.env {
        cstring("an environment variable", k.as_bytes())?;
        cstring("an environment variable", v.as_bytes())?;
        if k.is_empty() || k.contains('=') {
            return Err(ConnectError::new(
                ErrorCode::InvalidArgument,
                format!("invalid environment variable name '{k}'"),
            ));
        }
    }

    // The parent's ends of the pipes (or the terminal's master), and what the child gets.
    let io_err = |e: std::io::Error| start_error(&cmdline, &e);
    let mut master = None;
    let (mut stdin_w, mut stdout_r, mut stderr_r) = (None, None, None);
    let child_fds: Vec<OwnedFd> = if let Some((cols, rows)) = spec.pty {
        let (m, s) = pty::open(cols, rows).map_err(io_err)?;
        master = Some(m);
        vec![s]
    } else {
        let stdin = if spec.stdin {
            let (r, w) = launch::pipe().map_err(io_err)?;
            stdin_w = Some(w);
            r
        } else {
            launch::null().map_err(io_err)?
        };
        let (out_r, out_w) = launch::pipe().map_err(io_err)?;
        let (err_r, err_w) = launch::pipe().map_err(io_err)?;
        stdout_r = Some(out_r);
        stderr_r = Some(err_r);
        vec![stdin, out_w, err_w]
    };
    let stdio = match child_fds.as_slice() {
        [t] => [launch::raw(t); 3],
        [i, o, e] => [launch::raw(i), launch::raw(o), launch::raw(e)],
        _ => return Err(internal_error("unexpected standard streams")),
    };
    // Root sets the identity even for root (its own supplementary groups).
    let identity = spec.switch_user.then(|| launch::Identity {
        uid: spec.user.uid,
        gid: spec.user.gid,
        groups: spec.user.groups.clone(),
    });
    let plan = launch::Plan::new(
        &cfg.cmd,
        &cfg.args,
        &spec.env,
        &spec.cwd,
        stdio,
        spec.pty.is_some(),
        identity,
    )
    .map_err(io_err)?;
    let child = launch::launch(&plan).map_err(io_err)?;
    // Our copies of the child's ends (the terminal's slave side, the pipes' far ends).
    drop(child_fds);
    let pid = child.pid as u32;
    let pty = match master {
        Some(m) => Some(Arc::new(
            PtyMaster::new(m).map_err(|e| start_error(&cmdline, &e))?,
        )),
        None => None,
    };
    let proc = Arc::new(Proc {
        pid,
        config: spec.config.clone(),
        tag: spec.tag.clone(),
        hub: Hub::new(),
        stdin: tokio::sync::Mutex::new(match stdin_w {
            Some(w) => Some(Sender::from_owned_fd(w).map_err(io_err)?),
            None => None,
        }),
        pty: pty.clone(),
    });
    let Some(first) = proc.hub.subscribe() else {
        return Err(ConnectError::new(
            ErrorCode::Internal,
            "process output closed",
        ));
    };
    envd.processes.insert(proc.clone());
    // One line per command start and exit: the sandbox's log (e2b's logs routes) shows them.
    tracing::info!(pid, user = %spec.user.name, cmd = %short(&cmdline), "process started");

    let (exited_tx, exited_rx) = watch::channel(false);
    let mut readers = Vec::new();
    if let Some(p) = pty {
        readers.push(tokio::spawn(pump_pty(p, proc.clone(), exited_rx.clone())));
    } else {
        if let Some(out) = stdout_r {
            let out = Receiver::from_owned_fd(out).map_err(io_err)?;
            readers.push(tokio::spawn(pump_pipe(
                out,
                proc.clone(),
                Output::Stdout,
                exited_rx.clone(),
            )));
        }
        if let Some(err) = stderr_r {
            let err = Receiver::from_owned_fd(err).map_err(io_err)?;
            readers.push(tokio::spawn(pump_pipe(
                err,
                proc.clone(),
                Output::Stderr,
                exited_rx.clone(),
            )));
        }
    }
    if let Some(deadline) = spec.deadline {
        let p = proc.clone();
        let mut done = exited_rx.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline.into()) => {
                    let _ = p.signal(libc::SIGKILL);
                }
                _ = done.wait_for(|e| *e) => {}
            }
        });
    }
    let envd = envd.clone();
    let p = proc.clone();
    tokio::spawn(async move {
        let status = child.wait().await;
        envd.processes.remove(p.pid);
        let _ = exited_tx.send(true);
        for r in readers {
            let _ = r.await;
        }
        let end = match status {
            Ok(s) => end_event(s),
            Err(e) => failed_end(&format!("error waiting for the process: {e}")),
        };
        tracing::info!(pid = p.pid, exit_code = end.exit_code, status = %end.status, "process exited");
        p.hub.end(end).await;
    });
    Ok((proc, first))
}

/// Forwards output until end of file; once the command has exited, only while output keeps
/// coming (a quiet pipe held open by a background child ends the forwarding).
macro_rules! pump {
    ($read:expr, $buf:ident, $exited:ident, $publish:expr) => {
        loop {
            let n = if *$exited.borrow() {
                match tokio::time::timeout(DRAIN_IDLE, $read).await {
                    Ok(Ok(n)) if n > 0 => n,
                    _ => break,
                }
            } else {
                tokio::select! {
                    r = $read => match r { Ok(n) if n > 0 => n, _ => break },
                    changed = $exited.changed() => {
                        if changed.is_err() { break }
                        continue;
                    }
                }
            };
            $publish($buf[..n].to_vec()).await;
        }
    };
}

async fn pump_pipe<R: AsyncRead + Unpin + Send>(
    mut r: R,
    proc: Arc<Proc>,
    wrap: fn(Vec<u8>) -> Output,
    mut exited: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; PIPE_CHUNK];
    pump!(r.read(&mut buf), buf, exited, |d| proc.hub.publish(wrap(d)));
}

async fn pump_pty(master: Arc<PtyMaster>, proc: Arc<Proc>, mut exited: watch::Receiver<bool>) {
    let mut buf = vec![0u8; PTY_CHUNK];
    pump!(master.read(&mut buf), buf, exited, |d| proc
        .hub
        .publish(Output::Pty(d)));
}
