//! A small async client for envd (the agent inside every sandbox), over one of the three ways
//! in: the gateway's e2b listener (data-plane headers and the envdAccessToken), a CONNECT
//! tunnel through the node's data plane (the sandbox's own token), or a socket made inside the
//! sandbox's network namespace (the bench runs as root; this is what the node itself does).
//! Each client keeps one HTTP/1.1 keep-alive connection and reconnects when it closes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use sandbox_gateway::node::runtime::dial::Dialer;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{Context, Res};

pub const ENVD_PORT: u16 = 49983;

pub type Body = UnsyncBoxBody<Bytes, std::io::Error>;

pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub fn empty() -> Body {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// How a client reaches the sandbox's envd.
#[derive(Clone)]
pub enum Via {
    /// The gateway's e2b listener (`host:port`), `E2b-Sandbox-Id`/`-Port` headers, and the
    /// create response's envdAccessToken.
    Gateway {
        addr: String,
        id: String,
        token: String,
    },
    /// `CONNECT id:49983` to the node's data plane with the sandbox's own token, which is
    /// also the agent's access token.
    Node {
        data: String,
        id: String,
        token: String,
    },
    /// A plain TCP connection to envd at `addr` (an agent outside any sandbox).
    Plain { addr: String, token: String },
    /// A socket created in `/proc/<pid>/ns/net` (any process of the sandbox, e.g. its
    /// supervisor), to 127.0.0.1:49983 there.
    Netns {
        pid: i32,
        token: String,
        dialer: Arc<Dialer>,
    },
}

impl Via {
    pub fn name(&self) -> &'static str {
        match self {
            Via::Gateway { .. } => "gateway",
            Via::Node { .. } => "node data plane",
            Via::Netns { .. } => "direct (netns)",
            Via::Plain { .. } => "plain TCP",
        }
    }

    fn token(&self) -> &str {
        match self {
            Via::Gateway { token, .. }
            | Via::Node { token, .. }
            | Via::Netns { token, .. }
            | Via::Plain { token, .. } => token,
        }
    }
}

/// Opens `CONNECT id:port` on a node's data plane; the stream is the port's once it answers.
pub async fn node_tunnel(data: &str, id: &str, port: u16, token: &str) -> Res<TcpStream> {
    let mut s = TcpStream::connect(data)
        .await
        .context(format!("connecting to the node's data plane {data}"))?;
    s.set_nodelay(true)?;
    s.write_all(
        format!("CONNECT {id}:{port} HTTP/1.1\r\nProxy-Authorization: Bearer {token}\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    // The node sends nothing after its answer until the sandbox does, and the sandbox's
    // server speaks only when spoken to: reading byte by byte up to the blank line is exact.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await? == 0 {
            return Err(format!(
                "the node closed the tunnel: {:?}",
                String::from_utf8_lossy(&head)
            )
            .into());
        }
        head.push(byte[0]);
        if head.len() > 16 * 1024 {
            return Err("the node's answer to CONNECT is too long".into());
        }
    }
    let text = String::from_utf8_lossy(&head);
    if text.split(' ').nth(1) != Some("200") {
        let mut rest = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(1), s.read(&mut rest))
            .await
            .unwrap_or(Ok(0))
            .unwrap_or(0);
        return Err(format!(
            "the node refused the tunnel: {} {}",
            text.lines().next().unwrap_or_default(),
            String::from_utf8_lossy(&rest[..n])
        )
        .into());
    }
    Ok(s)
}

/// A command's outcome.
#[derive(Debug)]
pub struct Ran {
    pub exit_code: i64,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// When the first stdout bytes arrived.
    pub first_stdout: Option<Instant>,
}

/// One envd client on one keep-alive connection (or, with `on_port`, a client of another
/// port of the sandbox, e.g. the code interpreter's 49999).
pub struct Envd {
    pub via: Via,
    conn: Option<SendRequest<Body>>,
    port: u16,
    /// The user commands run as (`Authorization: Basic`), envd's default when unset.
    user: Option<String>,
}

/// A Connect envelope: flags, big-endian length, the JSON message.
pub fn envelope(message: &Value) -> Bytes {
    let payload = serde_json::to_vec(message).unwrap_or_default();
    let mut b = Vec::with_capacity(payload.len() + 5);
    b.push(0u8);
    b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    b.extend_from_slice(&payload);
    Bytes::from(b)
}

/// `commands.run(cmd)`'s request: `/bin/bash -l -c cmd` without stdin.
pub fn start_request(cmd: &str) -> Bytes {
    envelope(&json!({
        "process": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd], "envs": {}},
        "stdin": false
    }))
}

impl Envd {
    pub fn new(via: Via) -> Self {
        Envd {
            via,
            conn: None,
            port: ENVD_PORT,
            user: None,
        }
    }

    /// The same way in, to `port` of the sandbox instead of envd's.
    pub fn on_port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Requests that select `user` (for envd: who runs the commands).
    pub fn with_user(mut self, user: &str) -> Self {
        self.user = Some(user.to_string());
        self
    }

    async fn stream(&self) -> Res<TcpStream> {
        match &self.via {
            Via::Gateway { addr, .. } | Via::Plain { addr, .. } => {
                let s = TcpStream::connect(addr.as_str())
                    .await
                    .context(format!("connecting to {addr}"))?;
                s.set_nodelay(true)?;
                Ok(s)
            }
            Via::Node { data, id, token } => node_tunnel(data, id, self.port, token).await,
            Via::Netns { pid, dialer, .. } => Ok(dialer
                .connect(PathBuf::from(format!("/proc/{pid}/ns/net")), self.port)
                .await
                .context(format!("dialing envd in the netns of pid {pid}"))?),
        }
    }

    /// Opens the connection now (so that a timed request does not pay for it).
    pub async fn connect(&mut self) -> Res<()> {
        let stream = self.stream().await?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP/1.1 handshake")?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        self.conn = Some(send);
        Ok(())
    }

    /// Sends one request on the keep-alive connection (opening one if needed).
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, String)],
        body: Body,
    ) -> Res<hyper::Response<Incoming>> {
        let usable = match self.conn.as_mut() {
            Some(c) => c.ready().await.is_ok(),
            None => false,
        };
        if !usable {
            self.connect().await?;
        }
        let mut b = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("x-access-token", self.via.token());
        b = match &self.via {
            Via::Gateway { addr, id, .. } => b
                .header("host", addr.as_str())
                .header("e2b-sandbox-id", id.as_str())
                .header("e2b-sandbox-port", self.port.to_string()),
            _ => b.header("host", "envd"),
        };
        if let Some(user) = &self.user {
            let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:"));
            b = b.header("authorization", format!("Basic {basic}"));
        }
        for (k, v) in headers {
            b = b.header(*k, v.as_str());
        }
        let req = b.body(body).context("building a request")?;
        let conn = self.conn.as_mut().ok_or("no connection")?;
        conn.send_request(req)
            .await
            .context(format!("{method} {path} via the {}", self.via.name()))
    }

    /// Runs `bash -l -c cmd` (Connect `process.Process/Start`, JSON codec) and reads the
    /// stream to its end.
    pub async fn run(&mut self, cmd: &str) -> Res<Ran> {
        let resp = self
            .send(
                "POST",
                "/process.Process/Start",
                &[
                    ("content-type", "application/connect+json".into()),
                    ("connect-protocol-version", "1".into()),
                ],
                full(start_request(cmd)),
            )
            .await?;
        read_start(resp).await
    }

    /// `GET /health`; fails unless envd answers with success.
    pub async fn health(&mut self) -> Res<()> {
        let resp = self.send("GET", "/health", &[], empty()).await?;
        let status = resp.status();
        resp.into_body().collect().await?;
        if !status.is_success() {
            return Err(format!("/health answered {status} via the {}", self.via.name()).into());
        }
        Ok(())
    }

    /// Uploads `body` (`len` bytes) to `path` as an octet stream; returns the status.
    pub async fn upload(&mut self, path: &str, len: u64, body: Body) -> Res<u16> {
        let resp = self
            .send(
                "POST",
                &format!("/files?path={}", urlencode(path)),
                &[
                    ("content-type", "application/octet-stream".into()),
                    ("content-length", len.to_string()),
                ],
                body,
            )
            .await?;
        let status = resp.status().as_u16();
        let text = resp.into_body().collect().await?.to_bytes();
        if status != 200 {
            return Err(format!(
                "upload of {path} answered {status}: {}",
                String::from_utf8_lossy(&text)
            )
            .into());
        }
        Ok(status)
    }

    /// Downloads `path`, counting the bytes without keeping them.
    pub async fn download(&mut self, path: &str) -> Res<u64> {
        let resp = self
            .send(
                "GET",
                &format!("/files?path={}", urlencode(path)),
                &[],
                empty(),
            )
            .await?;
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        let mut n = 0u64;
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame?.into_data() {
                n += data.len() as u64;
            }
        }
        if status != 200 {
            return Err(format!("download of {path} answered {status}").into());
        }
        Ok(n)
    }
}

/// Reads a `Start` answer: envelopes of `{"event": ...}`, then the end-of-stream envelope.
pub async fn read_start(resp: hyper::Response<Incoming>) -> Res<Ran> {
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    if status != 200 {
        let text = body.collect().await?.to_bytes();
        return Err(format!(
            "Start answered {status}: {}",
            String::from_utf8_lossy(&text)
        )
        .into());
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut buf: Vec<u8> = Vec::new();
    let mut ran = Ran {
        exit_code: -1,
        stdout: Vec::new(),
        stderr: Vec::new(),
        first_stdout: None,
    };
    let mut ended = false;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while buf.len() >= 5 {
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if buf.len() < 5 + len {
                break;
            }
            let flags = buf[0];
            let msg: Value = serde_json::from_slice(&buf[5..5 + len]).unwrap_or(Value::Null);
            buf.drain(..5 + len);
            if flags & 2 != 0 {
                if msg.get("error").is_some() {
                    return Err(format!("the command's stream ended with {msg}").into());
                }
                ended = true;
                continue;
            }
            let ev = &msg["event"];
            if let Some(d) = ev["data"]["stdout"].as_str() {
                if ran.first_stdout.is_none() {
                    ran.first_stdout = Some(Instant::now());
                }
                ran.stdout.extend(b64.decode(d).unwrap_or_default());
            }
            if let Some(d) = ev["data"]["stderr"].as_str() {
                ran.stderr.extend(b64.decode(d).unwrap_or_default());
            }
            if !ev["end"].is_null() {
                ran.exit_code = ev["end"]["exitCode"].as_i64().unwrap_or(0);
            }
        }
    }
    if !ended {
        return Err("the command's stream ended without its end-of-stream message".into());
    }
    Ok(ran)
}

pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Runs `cmd` and fails unless it exited 0; returns its stdout.
pub async fn check(envd: &mut Envd, cmd: &str) -> Res<String> {
    let ran = envd.run(cmd).await?;
    if ran.exit_code != 0 {
        return Err(format!(
            "{cmd:?} exited {} via the {}: {}",
            ran.exit_code,
            envd.via.name(),
            String::from_utf8_lossy(&ran.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&ran.stdout).to_string())
}

/// The record of a claim id as its node has it (with its token, data address and instance
/// directory), asked of the node directly with the fleet token.
pub async fn node_record(
    node: &str,
    fleet_token: &str,
    id: &str,
) -> Res<sandbox_gateway::model::SandboxRecord> {
    let conn = sandbox_gateway::dispatch::client::NodeConn::new(node, fleet_token)?;
    let canonical = sandbox_gateway::model::ids::canonical_claim_id(id)
        .ok_or_else(|| format!("{id:?} is not a sandbox id"))?;
    let mut c = conn.client();
    let reply = c
        .get(sandbox_gateway::proto::SandboxRef { id: canonical })
        .await
        .context(format!("Get {id} from node {node}"))?
        .into_inner();
    Ok(reply.into())
}
