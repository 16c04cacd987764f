//! One connection per node: a lazily connected, multiplexed tonic channel that carries the
//! fleet token, with a timeout on every call. Failures are classified so that callers know
//! whether a mutating call could have reached the node.

use std::future::Future;
use std::time::Duration;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Response, Status};

use crate::model::{Error, Result};
use crate::proto::auth::SendFleetToken;
use crate::proto::{self, error_from_status, node_client::NodeClient};

pub type Client = NodeClient<InterceptedService<Channel, SendFleetToken>>;

/// Node replies can be large (a list of thousands of sandboxes).
const MAX_REPLY: usize = 256 * 1024 * 1024;

/// Whether a call changes node state: a mutating call whose outcome is unknown must not be
/// reported as "nothing happened".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    Read,
    Write,
}

#[derive(Clone)]
pub struct NodeConn {
    address: String,
    client: Client,
}

fn endpoint_uri(address: &str) -> String {
    if address.contains("://") {
        address.to_string()
    } else {
        format!("http://{address}")
    }
}

/// True when the transport failed before the request could be delivered.
fn is_connect_failure(status: &Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionRefused | AddrNotAvailable | NetworkUnreachable | HostUnreachable
            ) {
                return true;
            }
        }
        let text = err.to_string();
        if text.contains("tcp connect error") || text.contains("error trying to connect") {
            return true;
        }
        source = err.source();
    }
    false
}

impl NodeConn {
    pub fn new(address: &str, token: &str) -> Result<Self> {
        let endpoint = Endpoint::from_shared(endpoint_uri(address))
            .map_err(|e| Error::invalid(format!("node address {address:?}: {e}")))?
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        let channel = endpoint.connect_lazy();
        let client = NodeClient::with_interceptor(channel, SendFleetToken::new(token)?)
            .max_decoding_message_size(MAX_REPLY);
        Ok(NodeConn {
            address: address.to_string(),
            client,
        })
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    fn classify(&self, status: Status, effect: Effect, what: &str) -> Error {
        if std::error::Error::source(&status).is_none() {
            // The node answered: its code and message stand.
            return error_from_status(&status);
        }
        let addr = &self.address;
        if is_connect_failure(&status) || effect == Effect::Read {
            return Error::unavailable(format!(
                "node {addr} is unreachable ({what}): {}",
                status.message()
            ));
        }
        Error::outcome_unknown(format!(
            "the connection to node {addr} failed during {what} ({}); it may or may not have taken effect",
            status.message()
        ))
    }

    /// Runs one call with a deadline and maps its failure onto the shared error type.
    pub async fn call<T>(
        &self,
        what: &str,
        effect: Effect,
        timeout: Duration,
        fut: impl Future<Output = std::result::Result<Response<T>, Status>>,
    ) -> Result<T> {
        match tokio::time::timeout(timeout, fut).await {
            Ok(Ok(reply)) => Ok(reply.into_inner()),
            Ok(Err(status)) => Err(self.classify(status, effect, what)),
            Err(_) => {
                let addr = &self.address;
                Err(match effect {
                    Effect::Read => Error::unavailable(format!(
                        "node {addr} did not answer {what} within {timeout:?}"
                    )),
                    Effect::Write => Error::outcome_unknown(format!(
                        "node {addr} did not answer {what} within {timeout:?}; it may or may not have taken effect"
                    )),
                })
            }
        }
    }

    pub async fn info(&self, timeout: Duration) -> Result<crate::model::NodeInfo> {
        let mut c = self.client();
        self.call("info", Effect::Read, timeout, c.info(proto::InfoRequest {}))
            .await
            .map(Into::into)
    }
}
