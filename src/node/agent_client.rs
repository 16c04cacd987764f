//! The node's own client of an instance's agent, over the runtime's dial: runs a command to its
//! end with its output streamed back, starts one that outlives the call, and writes files.
//! An unclaimed instance's agent has no access token yet, so only the node (the one that can
//! dial it) reaches it. Template builds and start commands use this.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use connectrpc::client::{CallOptions, ClientBody, ClientConfig, ClientTransport};
use futures::StreamExt;
use futures::future::BoxFuture;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;

use super::runtime::Conn;
use crate::envd::proto::process::__buffa::oneof::process_event::Event;
use crate::envd::proto::process::__buffa::oneof::process_event::data_event::Output;
use crate::envd::proto::process::{ProcessClient, ProcessConfig, StartRequest};
use crate::model::{Error, Result};

/// Opens a fresh connection to the agent.
pub type Dial = Arc<dyn Fn() -> BoxFuture<'static, Result<Conn>> + Send + Sync>;

/// A Connect transport that dials the agent for every call (HTTP/1.1, one call per connection).
#[derive(Clone)]
struct Dialed(Dial);

impl ClientTransport for Dialed {
    type ResponseBody = hyper::body::Incoming;
    type Error = Error;

    fn send(
        &self,
        request: hyper::Request<ClientBody>,
    ) -> BoxFuture<'static, Result<hyper::Response<hyper::body::Incoming>>> {
        let dial = self.0.clone();
        Box::pin(async move {
            let conn = dial().await?;
            let (mut send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(conn))
                .await
                .map_err(|e| Error::unavailable(format!("talking to the agent: {e}")))?;
            // Lives as long as the response body is read.
            tokio::spawn(connection);
            send.send_request(request)
                .await
                .map_err(|e| Error::unavailable(format!("the agent did not answer: {e}")))
        })
    }
}

/// Which stream a chunk of output came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A command to run: `/bin/bash -l -c <cmd>` as `user`.
pub struct Command<'a> {
    pub cmd: &'a str,
    pub user: &'a str,
    pub cwd: Option<&'a str>,
    pub env: &'a BTreeMap<String, String>,
    pub timeout: Duration,
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    pub code: i32,
    /// envd's status text (`exit status 3`, `signal: killed`).
    pub status: String,
}

/// A started command, watched for its end.
pub struct Watched {
    ended: tokio::sync::oneshot::Receiver<Exit>,
    watcher: tokio::task::JoinHandle<()>,
}

impl Watched {
    /// How it ended, if it has.
    pub fn ended(&mut self) -> Option<Exit> {
        self.ended.try_recv().ok()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

pub struct AgentClient {
    dial: Dial,
    process: ProcessClient<Dialed>,
}

/// What the agent said when it refused to start a command (`unauthenticated: invalid
/// username: 'x'`, as envd words it).
fn refused(e: connectrpc::ConnectError) -> Error {
    Error::invalid(format!(
        "{}: {}",
        e.code.as_str(),
        e.message.unwrap_or_default()
    ))
}

fn basic_user(user: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:"))
    )
}

impl AgentClient {
    pub fn new(dial: Dial) -> AgentClient {
        let config = ClientConfig::new(hyper::Uri::from_static("http://agent"));
        AgentClient {
            process: ProcessClient::new(Dialed(dial.clone()), config),
            dial,
        }
    }

    fn start_request(c: &Command<'_>) -> StartRequest {
        StartRequest {
            process: ProcessConfig {
                cmd: "/bin/bash".into(),
                args: vec!["-l".into(), "-c".into(), c.cmd.into()],
                envs: c.env.clone().into_iter().collect(),
                cwd: c.cwd.map(str::to_string),
                ..Default::default()
            }
            .into(),
            stdin: Some(false),
            ..Default::default()
        }
    }

    /// Runs `c` to its end, handing each chunk of output to `out`.
    pub async fn run(
        &self,
        c: &Command<'_>,
        mut out: impl FnMut(Stream, &[u8]) + Send,
    ) -> Result<Exit> {
        let options = CallOptions::default()
            .with_timeout(c.timeout)
            .with_header("authorization", basic_user(c.user));
        let mut stream = self
            .process
            .start_with_options(Self::start_request(c), options)
            .await
            .map_err(refused)?;
        loop {
            let msg = stream
                .message()
                .await
                .map_err(|e| Error::unavailable(format!("the command's stream broke: {e}")))?;
            let Some(msg) = msg else {
                return Err(Error::unavailable(
                    "the command's stream ended before it did",
                ));
            };
            let resp = msg.to_owned_message();
            match resp.event.as_option().and_then(|e| e.event.clone()) {
                Some(Event::Data(d)) => match &d.output {
                    Some(Output::Stdout(b)) => out(Stream::Stdout, b),
                    Some(Output::Stderr(b)) => out(Stream::Stderr, b),
                    _ => {}
                },
                Some(Event::End(end)) => {
                    return Ok(Exit {
                        code: end.exit_code,
                        status: end.status.clone(),
                    });
                }
                _ => {}
            }
        }
    }

    /// Starts `c` and returns once it runs; it outlives the call (envd keeps it). The answer
    /// says how it ended, should it end while the answer is kept; dropping the answer stops
    /// watching, not the process.
    pub async fn spawn(&self, c: &Command<'_>) -> Result<Watched> {
        let options = CallOptions::default().with_header("authorization", basic_user(c.user));
        let mut stream = self
            .process
            .start_with_options(Self::start_request(c), options)
            .await
            .map_err(refused)?;
        // The first event is the start (its pid).
        match stream.message().await {
            Ok(Some(_)) => {}
            Ok(None) => return Err(Error::unavailable("the command ended before it started")),
            Err(e) => return Err(Error::unavailable(format!("starting the command: {e}"))),
        }
        let (tx, ended) = tokio::sync::oneshot::channel();
        let watcher = tokio::spawn(async move {
            while let Ok(Some(msg)) = stream.message().await {
                if let Some(Event::End(end)) = msg
                    .to_owned_message()
                    .event
                    .as_option()
                    .and_then(|e| e.event.clone())
                {
                    let _ = tx.send(Exit {
                        code: end.exit_code,
                        status: end.status.clone(),
                    });
                    return;
                }
            }
        });
        Ok(Watched { ended, watcher })
    }

    /// Writes the host file `from` to `path` as `user` (envd's raw upload), streamed.
    pub async fn write_file(&self, path: &str, user: &str, from: &std::path::Path) -> Result<()> {
        let file = tokio::fs::File::open(from)
            .await
            .map_err(|e| Error::io(format!("opening {}", from.display()), e))?;
        let frames = tokio_util::io::ReaderStream::new(file)
            .map(|chunk| chunk.map(hyper::body::Frame::data));
        let body = http_body_util::StreamBody::new(frames);
        let conn = (self.dial)().await?;
        let (mut send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(conn))
            .await
            .map_err(|e| Error::unavailable(format!("talking to the agent: {e}")))?;
        let driver = tokio::spawn(connection);
        let query: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("path", path)
            .append_pair("username", user)
            .finish();
        let req = hyper::Request::post(format!("/files?{query}"))
            .header("host", "agent")
            .header("content-type", "application/octet-stream")
            .body(body)
            .map_err(|e| Error::internal(format!("building an upload: {e}")))?;
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| Error::unavailable(format!("the agent's /files: {e}")))?;
        let status = resp.status();
        let text = resp
            .into_body()
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).to_string())
            .unwrap_or_default();
        driver.abort();
        if status.is_success() {
            Ok(())
        } else {
            Err(Error::invalid(format!("writing {path}: {status} {text}")))
        }
    }
}
