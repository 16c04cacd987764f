//! Gives a claimed instance its identity: the node posts envd's `/init` to the instance's agent
//! (through the runtime's dial, authenticated with the instance's boot secret) with the
//! sandbox's access token, its environment (the template's, then the claim's), its default
//! user and working directory, its hostname, and the CA its egress proxy intercepts with when
//! its rules set headers. Warm claims answer before this finishes; the
//! data plane waits for it.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::sync::watch;

use super::Node;
use super::runtime::{Instance, Runtime};
use crate::model::{Error, Result, SandboxRecord, ids};
use crate::sandbox::spec::ENVD_PORT;
use crate::templates::Template;

/// Whether a claim's agent has taken its identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ready {
    Pending,
    Done,
    Failed(String),
}

pub(crate) type ReadyRx = watch::Receiver<Ready>;

const INIT_TIMEOUT: Duration = Duration::from_secs(10);

/// envd's /init body (plus our `hostname`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InitBody<'a> {
    access_token: &'a str,
    env_vars: BTreeMap<String, String>,
    default_user: &'a str,
    default_workdir: &'a str,
    hostname: String,
    /// The CA the sandbox's egress proxy intercepts with, when its rules set headers (envd
    /// adds it to the system's trusted certificates).
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_bundle: Option<String>,
}

/// A sandbox needs its proxy's CA once its rules set headers on some host's requests.
pub(super) fn intercepts(record: &SandboxRecord) -> bool {
    record.key.net == "egress" && crate::model::transforms::sets_headers(&record.network.rules)
}

/// One HTTP/1.1 request to the agent over a dialed connection; answers its status.
async fn ask_agent(
    stream: super::runtime::Conn,
    req: hyper::Request<Full<Bytes>>,
) -> Result<hyper::StatusCode> {
    let path = req.uri().path().to_string();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| Error::unavailable(format!("talking to the agent: {e}")))?;
    let driver = tokio::spawn(conn);
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| Error::unavailable(format!("the agent's {path}: {e}")));
    driver.abort();
    Ok(resp?.status())
}

/// One `/init` to the agent over a dialed connection.
async fn post_init(stream: super::runtime::Conn, token: &str, body: Vec<u8>) -> Result<()> {
    let req = hyper::Request::post("/init")
        .header("host", "envd")
        .header("content-type", "application/json")
        .header("x-access-token", token)
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| Error::internal(format!("building the /init request: {e}")))?;
    let status = ask_agent(stream, req).await?;
    if status.is_success() {
        Ok(())
    } else {
        Err(Error::internal(format!(
            "the agent's /init answered {status}"
        )))
    }
}

impl<R: Runtime> Node<R> {
    /// Starts giving `record`'s agent its identity in the background.
    pub(super) fn identify(&self, record: &SandboxRecord, inst: &Instance<R::Handle>) -> ReadyRx {
        let (tx, rx) = watch::channel(Ready::Pending);
        let node = self.clone();
        let record = record.clone();
        let inst = inst.clone();
        self.inner.tasks.spawn(async move {
            let outcome = tokio::time::timeout(INIT_TIMEOUT, node.send_init(&record, &inst))
                .await
                .unwrap_or_else(|_| Err(Error::unavailable("the agent's /init timed out")));
            let state = match outcome {
                Ok(()) => Ready::Done,
                // A sandbox released while its identity was on the way is not a failure.
                Err(e) if !node.state().claims.contains_key(&record.id) => {
                    tracing::debug!(id = %record.id, error = %e, "released before its agent took its identity");
                    Ready::Failed(e.message)
                }
                Err(e) => {
                    tracing::error!(id = %record.id, error = %e, "the agent did not take its identity");
                    Ready::Failed(e.message)
                }
            };
            let _ = tx.send(state);
        });
        rx
    }

    async fn send_init(&self, record: &SandboxRecord, inst: &Instance<R::Handle>) -> Result<()> {
        let (line, template) = match inst.agent.take() {
            Some((conn, template)) => (Some(conn), template),
            None => (None, self.template(&record.key.template)?),
        };
        let mut env_vars = template.meta.env.clone();
        env_vars.extend(record.env_vars.clone());
        let body = InitBody {
            access_token: &record.token,
            env_vars,
            default_user: template.meta.user.as_deref().unwrap_or("user"),
            default_workdir: template.meta.workdir.as_deref().unwrap_or("/home/user"),
            hostname: ids::dns_safe(&record.id),
            ca_bundle: if intercepts(record) {
                Some(self.inner.runtime.egress_ca(inst)?)
            } else {
                None
            },
        };
        let body = serde_json::to_vec(&body)
            .map_err(|e| Error::internal(format!("encoding /init: {e}")))?;
        let token = self.inner.runtime.init_token(inst);
        if let Some(line) = line {
            // /init only sets the agent's identity, so sending it again on a fresh connection
            // after the opened one broke does no harm.
            match post_init(line, &token, body.clone()).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::debug!(id = %record.id, error = %e, "the agent line opened ahead broke; dialling")
                }
            }
        }
        let stream = self.inner.runtime.dial(inst, ENVD_PORT).await?;
        post_init(stream, &token, body).await
    }

    /// Opens `inst`'s agent line (see `AgentLine`) to the agent of an instance booted from
    /// `template`; without one its claim dials.
    pub(super) async fn open_agent_line(&self, inst: &Instance<R::Handle>, template: &Template) {
        if let Ok(conn) = self.inner.runtime.dial(inst, ENVD_PORT).await {
            inst.agent.put(conn, template.clone());
        }
    }

    /// Makes a running sandbox trust its egress proxy's CA when `record` (its policy about to
    /// be put in force) sets headers, before any connection is intercepted. Installing it again
    /// changes nothing.
    pub(super) async fn trust_egress_ca(
        &self,
        record: &SandboxRecord,
        inst: &Instance<R::Handle>,
    ) -> Result<()> {
        if !intercepts(record) {
            return Ok(());
        }
        let body = serde_json::json!({ "caBundle": self.inner.runtime.egress_ca(inst)? });
        let stream = self.inner.runtime.dial(inst, ENVD_PORT).await?;
        let token = self.inner.runtime.init_token(inst);
        let send = post_init(stream, &token, body.to_string().into_bytes());
        tokio::time::timeout(INIT_TIMEOUT, send)
            .await
            .unwrap_or_else(|_| Err(Error::unavailable("the agent's /init timed out")))
    }

    /// Ok when the instance's agent answers its health check within `within`; else 503 (e2b
    /// refuses a filesystem-only pause of a sandbox whose envd does not answer).
    pub(super) async fn agent_answers(
        &self,
        inst: &Instance<R::Handle>,
        within: Duration,
    ) -> Result<()> {
        let ask = async {
            let stream = self.inner.runtime.dial(inst, ENVD_PORT).await?;
            let req = hyper::Request::get("/health")
                .header("host", "envd")
                .body(Full::new(Bytes::new()))
                .map_err(|e| Error::internal(format!("building the /health request: {e}")))?;
            ask_agent(stream, req).await
        };
        match tokio::time::timeout(within, ask).await {
            Ok(Ok(status)) if status.is_success() => Ok(()),
            Ok(Ok(status)) => Err(Error::unavailable(format!(
                "its agent answered its health check with {status}"
            ))),
            Ok(Err(e)) => Err(Error::unavailable(format!(
                "its agent does not answer: {}",
                e.message
            ))),
            Err(_) => Err(Error::unavailable(format!(
                "its agent did not answer its health check within {}s",
                within.as_secs()
            ))),
        }
    }

    /// Waits until the sandbox's agent has its identity (or says why it never will).
    pub async fn wait_ready(&self, id: &str, timeout: Duration) -> Result<()> {
        let mut rx = {
            let st = self.state();
            match st.claims.get(id) {
                Some(c) => c.ready.clone(),
                None => return Err(self.not_found(&st, id)),
            }
        };
        let waited = tokio::time::timeout(timeout, rx.wait_for(|r| *r != Ready::Pending)).await;
        match waited {
            Ok(Ok(r)) => match &*r {
                Ready::Done => Ok(()),
                Ready::Failed(why) => Err(Error::unavailable(format!(
                    "sandbox {id} is not serving: {why}"
                ))),
                Ready::Pending => Err(Error::unavailable(format!("sandbox {id} is starting"))),
            },
            Ok(Err(_)) => Err(Error::unavailable(format!("sandbox {id} is gone"))),
            Err(_) => Err(Error::unavailable(format!(
                "sandbox {id} is still starting"
            ))),
        }
    }
}
