//! Starting a command as envd does: as the selected user (uid, gid, supplementary groups), in
//! its own session (a signal to the group ends its children too), with a raised
//! `oom_score_adj` (under memory pressure the kernel kills commands before envd), its output
//! read as it comes and its end reported once the output is drained.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use connectrpc::{ConnectError, ErrorCode};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{mpsc, watch};

use super::pty::{self, PtyMaster};
use super::status::{end_event, failed_end};
use super::table::{Hub, HubMsg, Proc};
use crate::envd::proto::process::__buffa::oneof::process_event::data_event::Output;
use crate::envd::proto::process::ProcessConfig;
use crate::envd::state::Envd;
use crate::envd::users::User;

/// The `oom_score_adj` of commands: well above envd's, so the OOM killer picks them first.
const OOM_SCORE_ADJ: &[u8] = b"500";
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
    let cwd = cstring("cwd", spec.cwd.as_os_str().as_bytes())?;
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

    let mut cmd = tokio::process::Command::new(&cfg.cmd);
    cmd.args(&cfg.args)
        .env_clear()
        .envs(spec.env.iter().cloned());
    let mut master = None;
    if let Some((cols, rows)) = spec.pty {
        let (m, s) = pty::open(cols, rows).map_err(|e| start_error(&cmdline, &e))?;
        let dup = |s: &OwnedFd| s.try_clone().map_err(|e| start_error(&cmdline, &e));
        cmd.stdin(Stdio::from(dup(&s)?))
            .stdout(Stdio::from(dup(&s)?))
            .stderr(Stdio::from(s));
        master = Some(m);
    } else {
        cmd.stdin(if spec.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    }

    let is_pty = spec.pty.is_some();
    let switch = spec.switch_user;
    let (uid, gid) = (spec.user.uid, spec.user.gid);
    let groups: Vec<libc::gid_t> = spec.user.groups.clone();
    let oom_path = c"/proc/self/oom_score_adj";
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the forked child before exec and makes only raw system calls
    // on values prepared before the fork (no allocation, no locks).
    unsafe {
        cmd.pre_exec(move || {
            let fail = || Err(std::io::Error::last_os_error());
            if libc::setsid() < 0 {
                return fail();
            }
            if is_pty && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return fail();
            }
            // Best effort: raising one's own score needs no privilege, but /proc may be absent.
            let fd = libc::open(oom_path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd >= 0 {
                libc::write(fd, OOM_SCORE_ADJ.as_ptr().cast(), OOM_SCORE_ADJ.len());
                libc::close(fd);
            }
            if switch {
                // Raw calls: glibc's wrappers would try to synchronise threads that the child
                // does not have.
                if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) < 0
                    || libc::syscall(libc::SYS_setresgid, gid, gid, gid) < 0
                    || libc::syscall(libc::SYS_setresuid, uid, uid, uid) < 0
                {
                    return fail();
                }
            }
            // After the switch (which clears it): the command dies with envd, even when envd
            // is killed outright. A parent already gone by now is one we will never serve.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) < 0
                || libc::getppid() != parent
            {
                return fail();
            }
            // After the switch, so the user needs the right to enter it.
            if libc::chdir(cwd.as_ptr()) < 0 {
                return fail();
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| start_error(&cmdline, &e))?;
    // Our copies of the terminal's slave side go with the command builder.
    drop(cmd);
    let pid = child.id().unwrap_or(0);
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
        stdin: tokio::sync::Mutex::new(child.stdin.take()),
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
        if let Some(out) = child.stdout.take() {
            readers.push(tokio::spawn(pump_pipe(
                out,
                proc.clone(),
                Output::Stdout,
                exited_rx.clone(),
            )));
        }
        if let Some(err) = child.stderr.take() {
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
