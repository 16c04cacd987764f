//! One running Jupyter kernel: its process (started from its kernelspec, in a session of its
//! own, killed with the server) and the client side of the Jupyter messaging protocol over
//! ZeroMQ on Unix sockets (`ipc`: gVisor cannot checkpoint a TCP socket an event loop
//! watches, and a kernel manager on the network would be open to any local user; loopback TCP
//! only for a kernel whose kernelspec says it speaks nothing else, `KernelSpec::tcp`).
//! Replies and IOPub messages are routed to whoever waits for them by parent message id.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jupyter_protocol::connection_info::{ConnectionInfo, Transport};
use jupyter_protocol::messaging::{
    ExecuteRequest, Header, InputReply, InterruptRequest, JupyterMessage, JupyterMessageContent,
    KernelInfoRequest, ShutdownRequest,
};
use jupyter_zmq_client::{
    ClientIoPubConnection, Connection, DealerRecvConnection, DealerSendConnection, RawMessage,
    create_client_control_connection, create_client_iopub_connection,
    create_client_shell_connection_with_identity, create_client_stdin_connection_with_identity,
    peer_identity_for_session,
};
use tokio::io::AsyncBufReadExt;
use tokio::sync::{mpsc, oneshot, watch};
use zeromq::SocketRecv;

pub use super::kernelspec::{Interrupt, KernelSpec, Launch};
use super::kernelspec::{free_loopback_ports, kill_group, remove_sockets, spawn};

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("starting kernel {kernel}: {message}")]
    Start { kernel: String, message: String },
    #[error("the kernel is gone")]
    Gone,
    #[error("talking to the kernel: {0}")]
    Channel(String),
}

fn channel_err(e: impl std::fmt::Display) -> KernelError {
    KernelError::Channel(e.to_string())
}

/// A message from the kernel, read leniently: kernels differ in which optional fields they
/// fill (bash_kernel's `kernel_info_reply` has no language version), and a message this
/// server does not understand in full must still reach whoever waits for it.
#[derive(Debug, Clone)]
pub struct Incoming {
    pub msg_type: String,
    /// The `msg_id` of the request it answers or belongs to.
    pub parent: Option<String>,
    /// The header's `date`, as the kernel wrote it.
    pub date: Option<String>,
    pub content: serde_json::Value,
    header: serde_json::Value,
}

impl Incoming {
    fn from_raw(raw: &RawMessage) -> Option<Incoming> {
        let part = |i: usize| -> Option<serde_json::Value> {
            serde_json::from_slice(raw.jparts.get(i)?).ok()
        };
        let header = part(0)?;
        let parent = part(1)
            .and_then(|p| p.get("msg_id")?.as_str().map(str::to_string))
            .filter(|id| !id.is_empty());
        Some(Incoming {
            msg_type: header.get("msg_type")?.as_str()?.to_string(),
            parent,
            date: header
                .get("date")
                .and_then(|d| d.as_str())
                .map(str::to_string),
            content: part(3).unwrap_or(serde_json::Value::Null),
            header,
        })
    }

    #[cfg(test)]
    pub fn test(msg_type: &str, date: Option<&str>, content: serde_json::Value) -> Incoming {
        Incoming {
            msg_type: msg_type.into(),
            parent: Some("p".into()),
            date: date.map(str::to_string),
            content,
            header: serde_json::Value::Null,
        }
    }

    /// A string field of the content ("" when absent).
    pub fn text(&self, key: &str) -> &str {
        self.content.get(key).and_then(|v| v.as_str()).unwrap_or("")
    }
}

/// Who waits for which replies and IOPub messages.
#[derive(Default)]
struct Routes {
    replies: HashMap<String, oneshot::Sender<Incoming>>,
    iopub: HashMap<String, mpsc::Sender<Incoming>>,
}

/// How a kernel process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit(pub String);

pub struct Kernel {
    pub spec: KernelSpec,
    pid: i32,
    conn_file: PathBuf,
    socket_prefix: PathBuf,
    shell: tokio::sync::Mutex<DealerSendConnection>,
    control: tokio::sync::Mutex<DealerSendConnection>,
    routes: Arc<Mutex<Routes>>,
    exited: watch::Receiver<Option<Exit>>,
    /// Set before the server ends this kernel on purpose (restart, delete).
    closing: std::sync::atomic::AtomicBool,
    /// Environment variables the server has put into the kernel, as the kernel has them.
    pub applied_env: Mutex<BTreeMap<String, String>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// An execution on its way: its IOPub messages and its reply, by parent id.
pub struct Pending {
    pub msg_id: String,
    pub iopub: mpsc::Receiver<Incoming>,
    pub reply: oneshot::Receiver<Incoming>,
    routes: Arc<Mutex<Routes>>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut r = lock(&self.routes);
        r.iopub.remove(&self.msg_id);
        r.replies.remove(&self.msg_id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// IOPub messages of one execution that may wait for its reader (a kernel's message can be a
/// megabyte of output); a reader that stops reading stops the server reading IOPub, so the
/// memory it holds stays bounded. The template's Python kernel then blocks (its IOPub socket
/// does not drop); other kernels drop what their own queue cannot hold, as ZeroMQ does.
const IOPUB_BUFFER: usize = 4;
/// How many lines of a kernel's own stderr are kept for error messages.
const STDERR_TAIL: usize = 20;

impl Kernel {
    /// Starts the kernel and waits until it answers on its shell and IOPub channels.
    pub async fn start(id: &str, launch: &Launch) -> Result<Arc<Kernel>, KernelError> {
        let fail = |message: String| KernelError::Start {
            kernel: launch.spec.name.clone(),
            message,
        };
        // Named per start, not per context: the sockets of a kernel that was restarted are
        // never dialled again by a client of the old one.
        let run = crate::model::ids::random_hex(6);
        let socket_prefix = launch.runtime_dir.join(format!("k-{run}"));
        let mut info = ConnectionInfo {
            ip: socket_prefix.to_string_lossy().to_string(),
            transport: Transport::IPC,
            shell_port: 1,
            iopub_port: 2,
            stdin_port: 3,
            control_port: 4,
            hb_port: 5,
            key: crate::model::ids::random_hex(32),
            signature_scheme: "hmac-sha256".into(),
            kernel_name: Some(launch.spec.name.clone()),
        };
        remove_sockets(&socket_prefix);
        if launch.spec.tcp {
            let ports = free_loopback_ports().map_err(|e| fail(format!("finding ports: {e}")))?;
            info.ip = "127.0.0.1".into();
            info.transport = Transport::TCP;
            [
                info.shell_port,
                info.iopub_port,
                info.stdin_port,
                info.control_port,
                info.hb_port,
            ] = ports;
        }
        let conn_file = launch.runtime_dir.join(format!("kernel-{id}-{run}.json"));
        let json = serde_json::to_vec(&info).map_err(|e| fail(e.to_string()))?;
        crate::fsx::write_atomic(&conn_file, &json)
            .map_err(|e| fail(format!("writing the connection file: {e}")))?;

        let mut child = spawn(launch, &conn_file).map_err(|e| {
            let _ = std::fs::remove_file(&conn_file);
            fail(format!("{e} (running {:?})", launch.spec.argv))
        })?;
        let pid = child.id().map(|p| p as i32).unwrap_or(0);
        let tail = Arc::new(Mutex::new(std::collections::VecDeque::new()));
        if let Some(err) = child.stderr.take() {
            let tail = tail.clone();
            let name = launch.spec.name.clone();
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(err).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::debug!(kernel = %name, "{line}");
                    let mut t = lock(&tail);
                    t.push_back(line);
                    if t.len() > STDERR_TAIL {
                        t.pop_front();
                    }
                }
            });
        }
        let (exit_tx, exited) = watch::channel(None);
        let waiter = tokio::spawn(async move {
            let status = child.wait().await;
            let why = match status {
                Ok(s) => match (s.code(), s.signal()) {
                    (Some(c), _) => format!("exit status {c}"),
                    (_, Some(sig)) => format!("signal {sig}"),
                    _ => "ended".to_string(),
                },
                Err(e) => format!("lost: {e}"),
            };
            let _ = exit_tx.send(Some(Exit(why)));
        });
        let started = Instant::now();
        let connected = connect(
            &info,
            &socket_prefix,
            &exited,
            started,
            launch.start_timeout,
        )
        .await;
        let (shell, control, iopub, stdin) = match connected {
            Ok(c) => c,
            Err(message) => {
                kill_group(pid);
                let _ = std::fs::remove_file(&conn_file);
                remove_sockets(&socket_prefix);
                let stderr: Vec<String> = lock(&tail).iter().cloned().collect();
                let message = if stderr.is_empty() {
                    message
                } else {
                    format!("{message}; it said: {}", stderr.join(" | "))
                };
                return Err(fail(message));
            }
        };
        let routes = Arc::new(Mutex::new(Routes::default()));
        let (shell_send, shell_recv) = shell.split();
        let (control_send, control_recv) = control.split();
        let tasks = vec![
            waiter,
            tokio::spawn(read_replies(shell_recv, routes.clone())),
            tokio::spawn(read_replies(control_recv, routes.clone())),
            tokio::spawn(read_iopub(iopub, routes.clone())),
            tokio::spawn(answer_input(stdin)),
        ];
        let kernel = Arc::new(Kernel {
            spec: launch.spec.clone(),
            pid,
            conn_file,
            socket_prefix,
            shell: tokio::sync::Mutex::new(shell_send),
            control: tokio::sync::Mutex::new(control_send),
            routes,
            exited,
            closing: Default::default(),
            applied_env: Mutex::new(BTreeMap::new()),
            tasks,
        });
        let left = launch.start_timeout.saturating_sub(started.elapsed());
        match kernel.handshake(left).await {
            Ok(()) => Ok(kernel),
            Err(message) => {
                kernel.kill();
                let stderr: Vec<String> = lock(&tail).iter().cloned().collect();
                Err(fail(if stderr.is_empty() {
                    message
                } else {
                    format!("{message}; it said: {}", stderr.join(" | "))
                }))
            }
        }
    }

    /// Sends `kernel_info_request` until one is answered on the shell channel and its status
    /// arrives on IOPub: a subscription takes a moment to reach the kernel, and messages
    /// published before it are lost.
    async fn handshake(&self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(exit) = self.exit() {
                return Err(format!("the kernel ended before it answered ({})", exit.0));
            }
            let mut pending = self
                .send(KernelInfoRequest {}.into(), Channel::Shell, true)
                .await
                .map_err(|e| e.to_string())?;
            let reply = tokio::time::timeout(Duration::from_secs(1), &mut pending.reply).await;
            if !matches!(reply, Ok(Ok(_))) {
                continue;
            }
            // The reply came; its status messages (busy, idle) say IOPub is live too.
            let seen = tokio::time::timeout(Duration::from_millis(500), async {
                while let Some(m) = pending.iopub.recv().await {
                    if m.msg_type == "status" {
                        return true;
                    }
                }
                false
            })
            .await;
            if matches!(seen, Ok(true)) {
                return Ok(());
            }
        }
        Err(format!(
            "the kernel did not answer within {} s",
            within.as_secs()
        ))
    }

    /// Sends a request; `iopub` says whether its IOPub messages are wanted (a caller that
    /// asks for them must read them, or the kernel's stream waits for it).
    async fn send(
        &self,
        content: JupyterMessageContent,
        channel: Channel,
        iopub: bool,
    ) -> Result<Pending, KernelError> {
        let msg = JupyterMessage::new(content, None);
        let msg_id = msg.header.msg_id.clone();
        let (reply_tx, reply) = oneshot::channel();
        let (iopub_tx, iopub_rx) = mpsc::channel(IOPUB_BUFFER);
        {
            let mut r = lock(&self.routes);
            r.replies.insert(msg_id.clone(), reply_tx);
            if iopub {
                r.iopub.insert(msg_id.clone(), iopub_tx);
            }
        }
        let iopub = iopub_rx;
        let pending = Pending {
            msg_id,
            iopub,
            reply,
            routes: self.routes.clone(),
        };
        let sent = match channel {
            Channel::Shell => self.shell.lock().await.send(msg).await,
            Channel::Control => self.control.lock().await.send(msg).await,
        };
        sent.map_err(channel_err)?;
        Ok(pending)
    }

    /// Sends code to run. `silent` runs leave no trace: no execution count, no history, and
    /// their IOPub messages are not routed (only the reply is awaited).
    pub async fn execute(&self, code: &str, silent: bool) -> Result<Pending, KernelError> {
        if self.exit().is_some() {
            return Err(KernelError::Gone);
        }
        let req = ExecuteRequest {
            code: code.to_string(),
            silent,
            store_history: !silent,
            user_expressions: None,
            allow_stdin: false,
            // One run at a time per kernel: nothing queued behind it to abort.
            stop_on_error: false,
        };
        self.send(req.into(), Channel::Shell, !silent).await
    }

    /// Runs `code` silently and waits for its reply; an error in it is returned as text.
    pub async fn run_silently(&self, code: &str, within: Duration) -> Result<(), String> {
        let mut pending = self.execute(code, true).await.map_err(|e| e.to_string())?;
        let reply = tokio::select! {
            r = tokio::time::timeout(within, &mut pending.reply) => r,
            _ = self.ended() => return Err("the kernel ended".into()),
        };
        match reply {
            Ok(Ok(m)) if m.text("status") == "error" => {
                Err(format!("{}: {}", m.text("ename"), m.text("evalue")))
            }
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err("the kernel's channel closed".into()),
            Err(_) => Err(format!("no answer within {} s", within.as_secs())),
        }
    }

    /// Interrupts what the kernel runs, as its kernelspec asks.
    pub async fn interrupt(&self) {
        match self.spec.interrupt {
            Interrupt::Signal => {
                if self.pid > 0 {
                    // SAFETY: a signal to the kernel's own process group (it leads a session).
                    unsafe { libc::kill(-self.pid, libc::SIGINT) };
                }
            }
            Interrupt::Message => {
                if let Err(e) = self
                    .send(InterruptRequest {}.into(), Channel::Control, false)
                    .await
                {
                    tracing::warn!(kernel = %self.spec.name, error = %e, "interrupt_request failed");
                }
            }
        }
    }

    /// How the process ended, once it has.
    pub fn exit(&self) -> Option<Exit> {
        self.exited.borrow().clone()
    }

    /// Resolves once the process has ended.
    pub async fn ended(&self) {
        let mut exited = self.exited.clone();
        let _ = exited.wait_for(Option::is_some).await.map(|_| ());
    }

    /// Whether the server is ending this kernel on purpose.
    pub fn is_closing(&self) -> bool {
        self.closing.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Ends the kernel: a shutdown request, then its whole process group is killed if it has
    /// not left within `grace`.
    pub async fn shutdown(&self, grace: Duration) {
        self.closing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if self.exit().is_none() {
            let _ = self
                .send(
                    ShutdownRequest { restart: false }.into(),
                    Channel::Control,
                    false,
                )
                .await;
            let _ = tokio::time::timeout(grace, self.ended()).await;
        }
        self.kill();
    }

    /// Kills the kernel's process group at once.
    pub fn kill(&self) {
        self.closing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        kill_group(self.pid);
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        kill_group(self.pid);
        for t in &self.tasks {
            t.abort();
        }
        let _ = std::fs::remove_file(&self.conn_file);
        remove_sockets(&self.socket_prefix);
    }
}

#[derive(Clone, Copy)]
enum Channel {
    Shell,
    Control,
}

type Connected = (
    jupyter_zmq_client::ClientShellConnection,
    jupyter_zmq_client::ClientControlConnection,
    ClientIoPubConnection,
    jupyter_zmq_client::ClientStdinConnection,
);

/// Connects once the kernel has made its sockets (a Unix socket cannot be dialled before it
/// exists, and a TCP port refuses until it listens, so this polls).
async fn connect(
    info: &ConnectionInfo,
    prefix: &Path,
    exited: &watch::Receiver<Option<Exit>>,
    started: Instant,
    timeout: Duration,
) -> Result<Connected, String> {
    let session = uuid::Uuid::new_v4().to_string();
    let mut last = String::from("its sockets never appeared");
    while started.elapsed() < timeout {
        if let Some(exit) = exited.borrow().clone() {
            return Err(format!("the kernel ended at start ({})", exit.0));
        }
        let ready = info.transport == Transport::TCP
            || [1, 2, 3, 4].iter().all(|p| {
                std::fs::metadata(format!("{}-{p}", prefix.display()))
                    .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
            });
        if ready {
            let attempt = async {
                let identity = peer_identity_for_session(&session).map_err(|e| e.to_string())?;
                let shell =
                    create_client_shell_connection_with_identity(info, &session, identity.clone())
                        .await
                        .map_err(|e| e.to_string())?;
                // Same identity as the shell: a kernel sends its input requests there.
                let stdin = create_client_stdin_connection_with_identity(info, &session, identity)
                    .await
                    .map_err(|e| e.to_string())?;
                let control = create_client_control_connection(info, &session)
                    .await
                    .map_err(|e| e.to_string())?;
                let iopub = create_client_iopub_connection(info, "", &session)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>((shell, control, iopub, stdin))
            };
            match tokio::time::timeout(Duration::from_secs(5), attempt).await {
                Ok(Ok(c)) => return Ok(c),
                Ok(Err(e)) => last = e,
                Err(_) => last = "connecting timed out".into(),
            }
        }
        tokio::time::sleep(Duration::from_millis(if ready { 50 } else { 5 })).await;
    }
    Err(format!(
        "the kernel did not open its sockets within {} s ({last})",
        timeout.as_secs()
    ))
}

/// The next message on a socket, checked against the kernel's key; `Ok(None)` for one that
/// does not parse or verify (skipped), `Err` when the socket is gone.
async fn receive<S: SocketRecv>(
    conn: &mut Connection<S>,
) -> Result<Option<Incoming>, zeromq::ZmqError> {
    let frames = conn.socket.recv().await?;
    match RawMessage::from_multipart(frames, &conn.mac) {
        Ok(raw) => Ok(Incoming::from_raw(&raw)),
        Err(e) => {
            tracing::warn!(error = %e, "a kernel message could not be read; skipped");
            Ok(None)
        }
    }
}

/// Hands each reply to whoever waits for it.
async fn read_replies(mut conn: DealerRecvConnection, routes: Arc<Mutex<Routes>>) {
    while let Ok(msg) = receive(&mut conn).await {
        let Some(msg) = msg else { continue };
        let Some(parent) = msg.parent.clone() else {
            continue;
        };
        if let Some(tx) = lock(&routes).replies.remove(&parent) {
            let _ = tx.send(msg);
        }
    }
}

/// Hands each IOPub message to the execution it belongs to, waiting while that execution's
/// buffer is full.
async fn read_iopub(mut conn: ClientIoPubConnection, routes: Arc<Mutex<Routes>>) {
    while let Ok(msg) = receive(&mut conn).await {
        let Some(msg) = msg else { continue };
        let Some(parent) = msg.parent.clone() else {
            continue;
        };
        let tx = lock(&routes).iopub.get(&parent).cloned();
        if let Some(tx) = tx {
            let _ = tx.send(msg).await;
        }
    }
}

/// Answers every input request with an empty line: clients cannot type into a cell, and
/// some kernels (IRkernel) ask although told not to, then wait for ever.
async fn answer_input(mut conn: jupyter_zmq_client::ClientStdinConnection) {
    loop {
        let msg = match receive(&mut conn).await {
            Ok(Some(m)) => m,
            Ok(None) => continue,
            Err(_) => return,
        };
        if msg.msg_type != "input_request" {
            continue;
        }
        let mut reply = JupyterMessage::new(InputReply::default(), None);
        reply.parent_header = serde_json::from_value::<Header>(msg.header.clone()).ok();
        if conn.send(reply).await.is_err() {
            return;
        }
    }
}
