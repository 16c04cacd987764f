//! One connection per node: a lazily connected, multiplexed tonic channel that carries the
//! fleet token, with a timeout on every call. Failures are classified so that callers know
//! whether a mutating call could have reached the node.

use std::future::Future;
use std::time::Duration;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Response, Status};

use crate::model::{Error, ErrorKind, Result};
use crate::proto::auth::SendFleetToken;
use crate::proto::{self, error_from_status, node_client::NodeClient};

pub type Client = NodeClient<InterceptedService<Channel, SendFleetToken>>;

/// Node replies can be large (a list of thousands of sandboxes).
const MAX_REPLY: usize = 256 * 1024 * 1024;
/// How long a check that a node still listens may take to connect.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long each of that check's connections is watched for a reset.
const PROBE_LISTEN: Duration = Duration::from_millis(250);
/// How long that check keeps trying before it takes the node to be alive: a process that
/// is being killed on a loaded machine can take a while to close its listener.
const PROBE_WINDOW: Duration = Duration::from_secs(2);

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

/// `host:port` of a node address, with or without a scheme (and a path).
fn host_port(address: &str) -> &str {
    let rest = address.split_once("://").map_or(address, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest)
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
            Ok(Err(status)) => {
                let err = self.classify(status, effect, what);
                if err.kind == ErrorKind::OutcomeUnknown && self.refuses_connections().await {
                    // The node's process is gone (a SIGKILL breaks the connection a call was
                    // just sent on): whatever it did went with it, so the call is as good as
                    // refused and a claim may go to another node.
                    return Err(Error::unavailable(format!(
                        "node {} went away during {what}: its port refuses connections",
                        self.address
                    )));
                }
                Err(err)
            }
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

    /// Whether the node's process is gone: its port refuses a new connection, or resets one
    /// (a process that is exiting resets what its listener had not accepted), where a live
    /// node, even a stalled one, keeps the connection open and waits for the client. Tried
    /// again for a short while, so a kill that is still under way is seen through.
    async fn refuses_connections(&self) -> bool {
        let addr = host_port(&self.address).to_string();
        let deadline = tokio::time::Instant::now() + PROBE_WINDOW;
        loop {
            match probe_once(&addr).await {
                Probe::Gone => return true,
                Probe::Answered => return false,
                Probe::Unsure if tokio::time::Instant::now() >= deadline => return false,
                Probe::Unsure => tokio::time::sleep(Duration::from_millis(100)).await,
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

/// What one look at a node's port showed.
#[derive(Debug, PartialEq, Eq)]
enum Probe {
    /// Refused or reset: no process holds the port.
    Gone,
    /// The node wrote to a new connection: it runs and serves.
    Answered,
    /// The connection stayed open and silent (a stalled node, or one still dying), or the
    /// connect itself failed some other way.
    Unsure,
}

async fn probe_once(addr: &str) -> Probe {
    use tokio::io::AsyncReadExt;
    let mut stream =
        match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Probe::Gone,
            _ => return Probe::Unsure,
        };
    let mut byte = [0u8; 1];
    match tokio::time::timeout(PROBE_LISTEN, stream.read(&mut byte)).await {
        Ok(Ok(0) | Err(_)) => Probe::Gone,
        Ok(Ok(_)) => Probe::Answered,
        Err(_) => Probe::Unsure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_port_is_gone_only_when_refused_or_reset() {
        // Nothing listens once the listener is dropped.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed = l.local_addr().unwrap().to_string();
        drop(l);
        assert_eq!(probe_once(&closed).await, Probe::Gone);

        // A listener that never accepts (a stopped process) keeps the connection silent.
        let stalled = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = stalled.local_addr().unwrap().to_string();
        assert_eq!(probe_once(&addr).await, Probe::Unsure);

        // One that writes first (an HTTP/2 server's settings) is alive.
        let serving = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = serving.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let (mut s, _) = serving.accept().await.unwrap();
            s.write_all(b"x").await.unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
        });
        assert_eq!(probe_once(&addr).await, Probe::Answered);
        server.abort();

        // One that closes what it accepts (an exiting process) is gone.
        let closing = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = closing.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (s, _) = closing.accept().await.unwrap();
            drop(s);
        });
        assert_eq!(probe_once(&addr).await, Probe::Gone);
    }

    #[test]
    fn node_addresses_come_down_to_host_and_port() {
        assert_eq!(host_port("127.0.0.1:7777"), "127.0.0.1:7777");
        assert_eq!(host_port("http://10.0.0.1:7777"), "10.0.0.1:7777");
        assert_eq!(host_port("https://node-a:7777/"), "node-a:7777");
    }
}
