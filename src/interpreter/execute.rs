//! One execution: waits for its context's turn, brings the kernel's environment up to date,
//! sends the code and turns what the kernel publishes into stream lines. A client that goes
//! away interrupts the kernel (so the next execution is not stuck behind this one); a kernel
//! that does not heed the interrupt is restarted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::contexts::Context;
use super::envs;
use super::kernel::{Incoming, Kernel};
use super::languages;
use super::output::{self, Line};
use super::server::Server;

/// A line is written at least this often, so that a client gone away is noticed.
pub const KEEPALIVE: Duration = Duration::from_secs(5);
/// Lines that may wait for a slow client before the kernel's stream is held back (each may
/// carry a megabyte of output).
pub const LINE_BUFFER: usize = 8;
/// How long a kernel has to stop after an interrupt before it is restarted.
const INTERRUPT_GRACE: Duration = Duration::from_secs(10);
/// How long the idle status may lag the reply.
const IDLE_AFTER_REPLY: Duration = Duration::from_secs(2);
/// How long a silent environment update may take.
const ENV_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Request {
    pub code: String,
    pub env_vars: BTreeMap<String, String>,
}

/// The stream's sending side: lines go out in order, keepalives fill the silences.
struct Out {
    tx: mpsc::Sender<Bytes>,
    last: Instant,
    /// The client went away: nothing more is sent.
    gone: bool,
}

impl Out {
    async fn send(&mut self, line: Line) {
        if self.gone {
            return;
        }
        self.last = Instant::now();
        if self.tx.send(line.to_bytes()).await.is_err() {
            self.gone = true;
        }
    }

    /// `send`, given up when `stop` comes first, after which nothing more is sent: a client
    /// that keeps its connection but stopped reading must not hold the context (its turn, its
    /// old kernel) once that kernel is restarted or removed.
    async fn send_until(&mut self, line: Line, stop: impl std::future::Future<Output = ()>) {
        let stopped = tokio::select! {
            _ = self.send(line) => false,
            _ = stop => true,
        };
        if stopped {
            self.gone = true;
        }
    }
}

/// Runs `req` on `ctx`, writing lines to `tx` until the last one (`end_of_execution`).
pub async fn run(server: Arc<Server>, ctx: Arc<Context>, req: Request, tx: mpsc::Sender<Bytes>) {
    let mut out = Out {
        tx,
        last: Instant::now(),
        gone: false,
    };
    // Waiting for the turn is silent; a client that leaves meanwhile gives up its place.
    let closed = out.tx.clone();
    let _turn = tokio::select! {
        t = ctx.turn.lock() => t,
        _ = closed.closed() => return,
    };
    let kernel = tokio::select! {
        k = ctx.kernel() => k,
        _ = closed.closed() => return,
    };
    match kernel {
        Ok(kernel) => execute(&server, &ctx, &kernel, req, &mut out).await,
        Err(why) => out.send(Line::error("KernelError", why)).await,
    }
    out.send(Line::EndOfExecution).await;
}

/// Sets and removes variables silently so that the kernel holds the sandbox's variables and
/// this run's own (which win).
async fn sync_env(server: &Server, ctx: &Context, kernel: &Kernel, run: &BTreeMap<String, String>) {
    let mut wanted = server.envs.current();
    wanted.extend(run.iter().map(|(k, v)| (k.clone(), v.clone())));
    let applied = kernel
        .applied_env
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let changes = envs::changes(&applied, &wanted);
    let code = languages::env_code(ctx.family, &changes);
    if code.is_empty() {
        return;
    }
    match kernel.run_silently(&code, ENV_TIMEOUT).await {
        Ok(()) => *kernel.applied_env.lock().unwrap_or_else(|p| p.into_inner()) = wanted,
        Err(e) => {
            tracing::warn!(context = %ctx.id, error = %e, "setting environment variables failed")
        }
    }
}

/// What this execution has seen so far.
#[derive(Default)]
struct Progress {
    replied: Option<Instant>,
    /// When the last IOPub message was passed on: output still arriving after the reply
    /// (a large figure queued behind it, a slow reader) keeps the wait for idle going.
    last_output: Option<Instant>,
    idle: bool,
    error_sent: bool,
    interrupted: Option<Instant>,
    iopub_closed: bool,
}

async fn execute(server: &Server, ctx: &Context, kernel: &Kernel, req: Request, out: &mut Out) {
    sync_env(server, ctx, kernel, &req.env_vars).await;
    let mut pending = match kernel.execute(&req.code, false).await {
        Ok(p) => p,
        Err(e) => {
            out.send(Line::error(
                "WebSocketError",
                format!("Failed to send execution request: {e}"),
            ))
            .await;
            return;
        }
    };
    let closed = out.tx.clone();
    let mut p = Progress::default();
    loop {
        if p.replied.is_some() && p.idle {
            return;
        }
        let keepalive_at = out.last + KEEPALIVE;
        let idle_deadline = p
            .replied
            .map(|t| t.max(p.last_output.unwrap_or(t)) + IDLE_AFTER_REPLY);
        let interrupt_deadline = p.interrupted.map(|t| t + INTERRUPT_GRACE);
        tokio::select! {
            msg = pending.iopub.recv(), if !p.iopub_closed => match msg {
                Some(m) => {
                    if let Some(line) = line_for(&m, &mut p) {
                        out.send_until(line, kernel.ended()).await;
                    }
                    p.last_output = Some(Instant::now());
                }
                // The kernel's IOPub reader ended: the kernel is going (its exit says why),
                // or the reply and the idle wait decide.
                None => p.iopub_closed = true,
            },
            reply = &mut pending.reply, if p.replied.is_none() => {
                p.replied = Some(Instant::now());
                if let Ok(m) = reply
                    && let Some(line) = reply_line(&m, &mut p)
                {
                    out.send_until(line, kernel.ended()).await;
                }
            }
            _ = kernel.ended() => {
                let why = kernel.exit().map(|e| e.0).unwrap_or_default();
                if kernel.is_closing() {
                    out.send(Line::error(
                        "UnexpectedEndOfExecution",
                        "Connection to the execution was closed before the execution was finished",
                    ))
                    .await;
                } else {
                    out.send(Line::error(
                        "ContextRestarting",
                        format!("Context was restarted: its kernel died ({why}) and is being started again; its state is lost"),
                    ))
                    .await;
                }
                return;
            }
            _ = tokio::time::sleep_until(keepalive_at), if !out.gone => {
                out.send_until(Line::Keepalive, kernel.ended()).await;
            }
            _ = closed.closed(), if p.interrupted.is_none() => {
                out.gone = true;
                tracing::info!(context = %ctx.id, "the client left mid-run; interrupting the kernel");
                kernel.interrupt().await;
                p.interrupted = Some(Instant::now());
            }
            _ = sleep_until_opt(interrupt_deadline) => {
                tracing::warn!(context = %ctx.id, "the kernel ignored the interrupt; restarting it");
                ctx.restart_later();
                return;
            }
            _ = sleep_until_opt(idle_deadline) => return,
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// The timestamp of a stream line: the kernel's message date with an explicit offset, as
/// upstream sends it (kernels write `Z`); now, when the kernel gave none.
fn timestamp(m: &Incoming) -> String {
    m.date
        .as_deref()
        .and_then(|d| chrono::DateTime::parse_from_rfc3339(d).ok())
        .map(|d| d.with_timezone(&chrono::Utc))
        .unwrap_or_else(chrono::Utc::now)
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, false)
}

/// A traceback's frames as the kernel sent them (a list of strings; anything else is kept
/// as its text).
fn frames(v: Option<&Value>) -> String {
    match v {
        Some(Value::Array(a)) => {
            let frames: Vec<String> = a
                .iter()
                .map(|f| f.as_str().map_or_else(|| f.to_string(), str::to_string))
                .collect();
            output::traceback(&frames)
        }
        Some(Value::String(s)) => s.clone(),
        _ => String::new(),
    }
}

fn bundle(m: &Incoming) -> serde_json::Map<String, Value> {
    m.content
        .get("data")
        .and_then(|d| d.as_object())
        .cloned()
        .unwrap_or_default()
}

/// The stream line an IOPub message becomes, if any.
fn line_for(m: &Incoming, p: &mut Progress) -> Option<Line> {
    match m.msg_type.as_str() {
        "execute_input" => Some(Line::NumberOfExecutions {
            execution_count: m.content.get("execution_count")?.as_i64()?,
        }),
        "stream" => {
            let text = m.text("text").to_string();
            Some(match m.text("name") {
                "stderr" => Line::Stderr {
                    text,
                    timestamp: timestamp(m),
                },
                _ => Line::Stdout {
                    text,
                    timestamp: timestamp(m),
                },
            })
        }
        "execute_result" => Some(Line::Result(output::result(bundle(m), true))),
        "display_data" | "update_display_data" => {
            Some(Line::Result(output::result(bundle(m), false)))
        }
        "error" if !p.error_sent => {
            p.error_sent = true;
            Some(error_line(m))
        }
        "status" => {
            if m.text("execution_state") == "idle" {
                p.idle = true;
            }
            None
        }
        _ => None,
    }
}

/// The `error` line of an IOPub `error` or an `execute_reply` with status `error` (the same
/// fields in both).
fn error_line(m: &Incoming) -> Line {
    Line::Error {
        name: m.text("ename").to_string(),
        value: m.text("evalue").to_string(),
        traceback: frames(m.content.get("traceback")),
    }
}

/// The error line a reply adds, when the kernel did not publish one.
fn reply_line(m: &Incoming, p: &mut Progress) -> Option<Line> {
    if m.msg_type != "execute_reply" {
        return None;
    }
    match m.text("status") {
        // Kernels say "aborted" (the spec) or "abort" (bash_kernel, IRkernel).
        "aborted" | "abort" => Some(Line::error("ExecutionAborted", "Execution was aborted")),
        "error" if !p.error_sent => {
            p.error_sent = true;
            Some(error_line(m))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msg(msg_type: &str, content: serde_json::Value) -> Incoming {
        Incoming::test(msg_type, Some("2026-12-04T05:33:07.044754Z"), content)
    }

    fn wire(l: Option<Line>) -> serde_json::Value {
        serde_json::from_slice(&l.expect("a line").to_bytes()).unwrap()
    }

    #[test]
    fn iopub_messages_become_lines() {
        let mut p = Progress::default();
        assert_eq!(
            wire(line_for(
                &msg("execute_input", json!({"code": "x", "execution_count": 2})),
                &mut p
            )),
            json!({"type": "number_of_executions", "execution_count": 2})
        );
        assert_eq!(
            wire(line_for(
                &msg("stream", json!({"name": "stderr", "text": "err\n"})),
                &mut p
            )),
            json!({"type": "stderr", "text": "err\n", "timestamp": "2026-12-04T05:33:07.044754+00:00"})
        );
        let main = wire(line_for(
            &msg(
                "execute_result",
                json!({"execution_count": 2, "data": {"text/plain": "'hi'", "application/json": {"f": 1.0}}, "metadata": {}}),
            ),
            &mut p,
        ));
        assert_eq!(main["text"], "hi");
        assert_eq!(main["is_main_result"], true);
        // Floats stay floats: clients check their types.
        assert!(main["json"]["f"].is_f64());
        let shown = wire(line_for(
            &msg(
                "display_data",
                json!({"data": {"image/png": "iVBOR", "text/plain": "<Figure>"}, "metadata": {}}),
            ),
            &mut p,
        ));
        assert_eq!(shown["is_main_result"], false);
        assert_eq!(shown["png"], "iVBOR");
        assert!(line_for(&msg("status", json!({"execution_state": "busy"})), &mut p).is_none());
        assert!(!p.idle);
        assert!(line_for(&msg("status", json!({"execution_state": "idle"})), &mut p).is_none());
        assert!(p.idle);
        assert!(line_for(&msg("clear_output", json!({"wait": false})), &mut p).is_none());
        // A kernel that leaves out fields still gets through.
        let bare = line_for(&msg("stream", json!({"text": "x"})), &mut p);
        assert_eq!(wire(bare)["type"], "stdout");
        let undated = Incoming::test("stream", None, json!({"name": "stdout", "text": "x"}));
        assert!(
            wire(line_for(&undated, &mut p))["timestamp"]
                .as_str()
                .unwrap()
                .ends_with("+00:00")
        );
        assert!(line_for(&msg("execute_input", json!({})), &mut p).is_none());
    }

    #[test]
    fn only_the_first_error_is_sent_and_a_reply_adds_one_only_when_none_was() {
        let mut p = Progress::default();
        let err = msg(
            "error",
            json!({"ename": "ZeroDivisionError", "evalue": "division by zero", "traceback": ["a\n", "b"]}),
        );
        assert_eq!(
            wire(line_for(&err, &mut p)),
            json!({"type": "error", "name": "ZeroDivisionError", "value": "division by zero", "traceback": "a\nb"})
        );
        assert!(line_for(&err, &mut p).is_none());
        let reply = msg(
            "execute_reply",
            json!({"status": "error", "execution_count": 3, "ename": "E", "evalue": "v", "traceback": []}),
        );
        assert!(reply_line(&reply, &mut p).is_none());
        let mut fresh = Progress::default();
        assert_eq!(wire(reply_line(&reply, &mut fresh))["name"], "E");
        for status in ["aborted", "abort"] {
            let aborted = msg("execute_reply", json!({ "status": status }));
            assert_eq!(
                wire(reply_line(&aborted, &mut Progress::default()))["name"],
                "ExecutionAborted"
            );
        }
        let odd = msg(
            "error",
            json!({"ename": "E", "evalue": "v", "traceback": "one string"}),
        );
        assert_eq!(
            wire(line_for(&odd, &mut Progress::default()))["traceback"],
            "one string"
        );
        let ok = msg(
            "execute_reply",
            json!({"status": "ok", "execution_count": 1}),
        );
        assert!(reply_line(&ok, &mut Progress::default()).is_none());
    }
}
