//! The gateway's proxy reaching its embedded node by calls: a tunnel into a sandbox is let in
//! by the node's own checks (the credential, the sandbox's state, an auto-resume) and dialled
//! by its runtime, so request bytes go from the gateway straight into the sandbox, without a
//! loopback hop to the node's data plane and the node's copy of them.

use futures::future::BoxFuture;

use crate::e2b::proxy::tunnel::{LocalNode, TunnelError};
use crate::iox::Closable;
use crate::model::Error;
use crate::node::Node;
use crate::node::dataplane::status_line;
use crate::node::runtime::Conn;
use crate::node::runtime::any::AnyRuntime;

pub struct EmbeddedTunnels {
    pub node: Node<AnyRuntime>,
    /// The fleet token the node's data plane takes.
    pub token: String,
    /// The node's runtime: what a tunnel's admission starts (an auto-resume's tasks, a memory
    /// guard) lives there, not on the gateway worker that asked.
    pub runtime: tokio::runtime::Handle,
}

fn refused(e: Error) -> TunnelError {
    TunnelError::Refused {
        status: status_line(e.kind).0,
        message: e.message,
    }
}

impl LocalNode for EmbeddedTunnels {
    fn open<'a>(
        &'a self,
        sandbox: &'a str,
        port: u16,
        bearer: &'a str,
    ) -> BoxFuture<'a, Result<Conn, TunnelError>> {
        Box::pin(async move {
            let node = self.node.clone();
            let (sandbox_id, bearer_owned, token) =
                (sandbox.to_string(), bearer.to_string(), self.token.clone());
            let admitted = self
                .runtime
                .spawn(async move {
                    node.admit_tunnel(&sandbox_id, port, Some(&bearer_owned), &token)
                        .await
                })
                .await
                .map_err(|e| TunnelError::Broken(format!("the embedded node: {e}")))?;
            let (admitted, closed) = admitted.map_err(refused)?;
            // Dialled here, so that the socket belongs to the runtime that moves its bytes.
            let conn = self
                .node
                .dial_admitted(&admitted, port)
                .await
                .map_err(refused)?;
            // Cut when the node would drop the tunnel (the sandbox paused or gone).
            Ok(Box::new(Closable::new(conn, closed)) as Conn)
        })
    }
}
