//! `process.Process`: start commands (pipes or a pseudo-terminal), attach to them again by pid
//! or tag, feed their input, signal and resize them. A command outlives the stream that
//! started it (a client that goes away does not kill it, as in envd); its life ends with the
//! Start call's deadline, a signal, or by itself.

pub mod launch;
pub mod pty;
pub mod spawn;
pub mod status;
pub mod table;

use std::sync::Arc;
use std::time::Duration;

use connectrpc::{
    ConnectError, RequestContext, Response, ServiceRequest, ServiceResult, ServiceStream,
};
use futures::StreamExt;
use tokio::sync::mpsc;

use self::spawn::SpawnSpec;
use self::table::HubMsg;
use super::auth::basic_auth_user;
use super::creds::check_can_act_as;
use super::errors::{creds_err, internal, invalid};
use super::paths::resolve;
use super::proto::process::__buffa::oneof::process_event::Event;
use super::proto::process::__buffa::oneof::process_input::Input;
use super::proto::process::__buffa::oneof::stream_input_request::Event as InputEvent;
use super::proto::process::*;
use super::state::Envd;
use super::users::User;

pub struct ProcessService {
    pub envd: Arc<Envd>,
}

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The user an RPC runs as (`Authorization: Basic`), or `unauthenticated` as envd answers an
/// unknown one.
pub fn rpc_user(
    envd: &Envd,
    ctx: &RequestContext,
) -> Result<(User, super::users::UserDb), ConnectError> {
    let requested = basic_auth_user(ctx.headers().get("authorization").map(|v| v.as_bytes()));
    envd.select_user(requested.as_deref()).map_err(|e| {
        ConnectError::new(
            connectrpc::ErrorCode::Unauthenticated,
            format!("invalid username: '{}'", e.0),
        )
    })
}

pub fn keepalive_of(ctx: &RequestContext) -> Duration {
    status::keepalive_interval(
        ctx.headers()
            .get("keepalive-ping-interval")
            .and_then(|v| v.to_str().ok()),
    )
}

fn ev(e: Event) -> ProcessEvent {
    ProcessEvent {
        event: Some(e),
        ..Default::default()
    }
}

/// A process's events for one stream: its start (pid), its output as it comes, keepalives
/// while it is quiet, and its end.
fn events(
    pid: u32,
    rx: mpsc::Receiver<HubMsg>,
    every: Duration,
) -> impl futures::Stream<Item = ProcessEvent> + Send {
    enum Phase {
        Start,
        Running,
        Done,
    }
    let mut ka = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ka.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    futures::stream::unfold(
        (Phase::Start, rx, ka),
        move |(phase, mut rx, mut ka)| async move {
            match phase {
                Phase::Done => None,
                Phase::Start => {
                    let start = process_event::StartEvent {
                        pid,
                        ..Default::default()
                    };
                    Some((ev(start.into()), (Phase::Running, rx, ka)))
                }
                Phase::Running => tokio::select! {
                    m = rx.recv() => match m {
                        Some(HubMsg::Data(out)) => {
                            ka.reset();
                            let data = process_event::DataEvent { output: Some(out), ..Default::default() };
                            Some((ev(data.into()), (Phase::Running, rx, ka)))
                        }
                        Some(HubMsg::End(end)) => Some((ev(end.into()), (Phase::Done, rx, ka))),
                        None => None,
                    },
                    _ = ka.tick() => {
                        Some((ev(process_event::KeepAlive::default().into()), (Phase::Running, rx, ka)))
                    }
                },
            }
        },
    )
}

impl ProcessService {
    fn spawn_spec(
        &self,
        ctx: &RequestContext,
        req: StartRequest,
    ) -> Result<SpawnSpec, ConnectError> {
        let (user, _db) = rpc_user(&self.envd, ctx)?;
        check_can_act_as(&user).map_err(creds_err)?;
        let config = req.process.as_option().cloned().unwrap_or_default();
        let settings = self.envd.settings();
        let cwd = resolve(
            config.cwd.as_deref().unwrap_or(""),
            &user.home,
            settings.default_workdir.as_deref(),
        )
        .map_err(|e| invalid(e.to_string()))?;
        if !cwd.exists() {
            return Err(invalid(format!("cwd '{}' does not exist", cwd.display())));
        }
        let path = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.to_string());
        let shell = if user.shell.is_empty() {
            "/bin/sh".to_string()
        } else {
            user.shell.clone()
        };
        // Later entries win: the sandbox-wide variables override the basics, the request's
        // override both.
        let mut env: Vec<(String, String)> = vec![
            ("PATH".into(), path),
            ("HOME".into(), user.home.to_string_lossy().into_owned()),
            ("USER".into(), user.name.clone()),
            ("LOGNAME".into(), user.name.clone()),
            ("SHELL".into(), shell),
        ];
        env.extend(settings.env_vars);
        let mut request_env: Vec<(String, String)> = config.envs.clone().into_iter().collect();
        request_env.sort();
        env.extend(request_env);
        let mut merged: Vec<(String, String)> = Vec::new();
        for (k, v) in env {
            match merged.iter_mut().find(|(mk, _)| *mk == k) {
                Some(slot) => slot.1 = v,
                None => merged.push((k, v)),
            }
        }
        let pty = req.pty.as_option().map(|p| {
            let size = p.size.as_option().cloned().unwrap_or_default();
            (
                size.cols.min(u16::MAX as u32) as u16,
                size.rows.min(u16::MAX as u32) as u16,
            )
        });
        Ok(SpawnSpec {
            // Root sets the identity even for root (its own supplementary groups); a non-root envd
            // was checked above to be running as this very user.
            switch_user: super::users::euid() == 0,
            user,
            config,
            env: merged,
            cwd,
            pty,
            // Unset means true: SDKs older than envd 0.3.0's support never send it.
            stdin: req.stdin.unwrap_or(true),
            tag: req.tag,
            deadline: ctx.deadline(),
        })
    }
}

fn boxed<T: Send + 'static>(
    s: impl futures::Stream<Item = T> + Send + 'static,
) -> ServiceStream<T> {
    s.map(Ok).boxed()
}

// The trait allows any encodable body; these return the owned messages.
#[allow(refining_impl_trait)]
impl Process for ProcessService {
    async fn list(
        &self,
        _ctx: RequestContext,
        _req: ServiceRequest<'_, ListRequest>,
    ) -> ServiceResult<ListResponse> {
        Response::ok(ListResponse {
            processes: self.envd.processes.list(),
            ..Default::default()
        })
    }

    async fn connect(
        &self,
        ctx: RequestContext,
        req: ServiceRequest<'_, ConnectRequest>,
    ) -> ServiceResult<ServiceStream<ConnectResponse>> {
        let req: ConnectRequest = req.to_owned_message();
        let proc = self.envd.processes.get(req.process.as_option())?;
        let rx = proc.hub.subscribe().ok_or_else(|| {
            super::errors::not_found(format!("process with pid {} not found", proc.pid))
        })?;
        let s = events(proc.pid, rx, keepalive_of(&ctx)).map(|e| ConnectResponse {
            event: e.into(),
            ..Default::default()
        });
        Ok(Response::new(boxed(s)))
    }

    async fn start(
        &self,
        ctx: RequestContext,
        req: ServiceRequest<'_, StartRequest>,
    ) -> ServiceResult<ServiceStream<StartResponse>> {
        let req: StartRequest = req.to_owned_message();
        let spec = self.spawn_spec(&ctx, req)?;
        let (proc, rx) = spawn::start(&self.envd, spec)?;
        let s = events(proc.pid, rx, keepalive_of(&ctx)).map(|e| StartResponse {
            event: e.into(),
            ..Default::default()
        });
        Ok(Response::new(boxed(s)))
    }

    async fn update(
        &self,
        _ctx: RequestContext,
        req: ServiceRequest<'_, UpdateRequest>,
    ) -> ServiceResult<UpdateResponse> {
        let req: UpdateRequest = req.to_owned_message();
        let proc = self.envd.processes.get(req.process.as_option())?;
        if let Some(p) = req.pty.as_option() {
            let size = p.size.as_option().cloned().unwrap_or_default();
            let Some(master) = &proc.pty else {
                return Err(internal("error resizing tty: tty not assigned to process"));
            };
            master
                .resize(
                    size.cols.min(u16::MAX as u32) as u16,
                    size.rows.min(u16::MAX as u32) as u16,
                )
                .map_err(|e| internal(format!("error resizing tty: {e}")))?;
        }
        Response::ok(UpdateResponse::default())
    }

    async fn stream_input(
        &self,
        _ctx: RequestContext,
        mut requests: connectrpc::InboundStream<StreamInputRequest>,
    ) -> ServiceResult<StreamInputResponse> {
        let mut target = None;
        while let Some(item) = requests.next().await {
            let msg: StreamInputRequest = item?.to_owned_message();
            match msg.event {
                Some(InputEvent::Start(s)) => {
                    target = Some(self.envd.processes.get(s.process.as_option())?);
                }
                Some(InputEvent::Data(d)) => {
                    let Some(proc) = &target else {
                        return Err(invalid("input before the start event naming the process"));
                    };
                    write_input(proc, d.input.as_option()).await?;
                }
                Some(InputEvent::Keepalive(_)) => {}
                None => {
                    return Err(ConnectError::new(
                        connectrpc::ErrorCode::Unimplemented,
                        "invalid event type",
                    ));
                }
            }
        }
        Response::ok(StreamInputResponse::default())
    }

    async fn send_input(
        &self,
        _ctx: RequestContext,
        req: ServiceRequest<'_, SendInputRequest>,
    ) -> ServiceResult<SendInputResponse> {
        let req: SendInputRequest = req.to_owned_message();
        let proc = self.envd.processes.get(req.process.as_option())?;
        write_input(&proc, req.input.as_option()).await?;
        Response::ok(SendInputResponse::default())
    }

    async fn send_signal(
        &self,
        _ctx: RequestContext,
        req: ServiceRequest<'_, SendSignalRequest>,
    ) -> ServiceResult<SendSignalResponse> {
        let req: SendSignalRequest = req.to_owned_message();
        let proc = self.envd.processes.get(req.process.as_option())?;
        let sig = match req.signal.as_known() {
            Some(Signal::SIGNAL_SIGKILL) => libc::SIGKILL,
            Some(Signal::SIGNAL_SIGTERM) => libc::SIGTERM,
            _ => {
                return Err(ConnectError::new(
                    connectrpc::ErrorCode::Unimplemented,
                    format!("invalid signal: {}", req.signal),
                ));
            }
        };
        proc.signal(sig)
            .map_err(|e| internal(format!("error sending signal: {e}")))?;
        Response::ok(SendSignalResponse::default())
    }

    async fn close_stdin(
        &self,
        _ctx: RequestContext,
        req: ServiceRequest<'_, CloseStdinRequest>,
    ) -> ServiceResult<CloseStdinResponse> {
        let req: CloseStdinRequest = req.to_owned_message();
        let proc = self.envd.processes.get(req.process.as_option())?;
        if proc.pty.is_some() {
            return Err(ConnectError::new(
                connectrpc::ErrorCode::Unknown,
                "error closing stdin: cannot close stdin for PTY process — send Ctrl+D (0x04) instead",
            ));
        }
        // Dropping the write end is the end of file the command reads.
        proc.stdin.lock().await.take();
        Response::ok(CloseStdinResponse::default())
    }
}

async fn write_input(proc: &table::Proc, input: Option<&ProcessInput>) -> Result<(), ConnectError> {
    match input.and_then(|i| i.input.as_ref()) {
        Some(Input::Stdin(d)) => proc.write_input(d, false).await,
        Some(Input::Pty(d)) => proc.write_input(d, true).await,
        None => Err(ConnectError::new(
            connectrpc::ErrorCode::Unimplemented,
            "invalid input type",
        )),
    }
}
