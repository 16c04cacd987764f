//! The node's side of cluster mode: it server-side-applies its NodeInventory object every
//! interval and once more when it stops. Apply creates a missing object, so one lost to a
//! deletion is rebuilt on the next tick; a failed publish is logged and retried on the next.

use std::time::Duration;

use chrono::Utc;
use kube::api::{Api, Patch, PatchParams};
use tokio_util::sync::CancellationToken;

use super::inventory::NodeInventory;
use crate::model::{Error, Result};
use crate::node::Node;
use crate::node::runtime::Runtime;

/// The field manager of every field a node writes.
pub const FIELD_MANAGER: &str = "sandbox-gateway-node";
/// How long one publish may take.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct Publisher {
    api: Api<NodeInventory>,
}

impl Publisher {
    pub fn new(client: kube::Client) -> Self {
        Publisher {
            api: Api::all(client),
        }
    }

    /// Publishes the node's current state.
    pub async fn publish<R: Runtime>(&self, node: &Node<R>) -> Result<()> {
        let info = node.info();
        let (sandboxes, _) = node.list(None);
        let object = NodeInventory::snapshot(&info, &sandboxes, Utc::now());
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let applied = tokio::time::timeout(
            PUBLISH_TIMEOUT,
            self.api.patch(&info.name, &params, &Patch::Apply(&object)),
        )
        .await
        .map_err(|_| {
            Error::unavailable(format!(
                "publishing NodeInventory {} took over {PUBLISH_TIMEOUT:?}",
                info.name
            ))
        })?;
        applied.map_err(|e| {
            Error::unavailable(format!("publishing NodeInventory {}: {e}", info.name))
        })?;
        Ok(())
    }

    /// Publishes every `interval` until `stop` is cancelled.
    pub async fn run<R: Runtime>(self, node: Node<R>, interval: Duration, stop: CancellationToken) {
        let mut failing = false;
        loop {
            match self.publish(&node).await {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!("publishing the node inventory works again");
                }
                Ok(()) => {}
                Err(e) => {
                    failing = true;
                    tracing::warn!(error = %e, "publishing the node inventory failed; retrying next tick");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stop.cancelled() => return,
            }
        }
    }
}
