//! Which nodes the dispatcher knows: adding and dropping them, their health and pools, and
//! following each one's change stream into the read view.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::client::NodeConn;
use super::registry::NodeHandle;
use super::{Dispatcher, NodeSummary, ViewFeed};
use crate::model::{Error, InventoryEvent, PoolKey, Result};
use crate::proto;

impl Dispatcher {
    /// Adds a node by address and starts following its change stream.
    pub fn add_node(&self, address: &str) -> Result<()> {
        self.add_node_fed(address, ViewFeed::Stream)
    }

    /// Adds a node by address (nothing happens for a known one); `feed` says where its
    /// sandboxes in the read view come from.
    pub fn add_node_fed(&self, address: &str, feed: ViewFeed) -> Result<()> {
        // Discovery re-adds every node on each publish: skip building a connection for it.
        if self
            .inner
            .registry
            .all()
            .iter()
            .any(|h| h.address() == address)
        {
            return Ok(());
        }
        let conn = NodeConn::new(address, &self.inner.token)?;
        let (handle, added) = self.inner.registry.add(conn);
        if added {
            self.inner.tasks.spawn(self.clone().monitor(handle, feed));
        }
        Ok(())
    }

    /// Drops a node at once: it takes no more claims and its sandboxes leave the read view.
    /// (Verbs on them still ask it, and answer Unavailable while it is unreachable.)
    pub fn drop_node(&self, address: &str, name: &str) {
        if let Some(h) = self.inner.registry.remove(address) {
            h.mark_down();
            if let Some(n) = h.name().filter(|n| n != name) {
                self.inner.view.forget(&n);
            }
        }
        self.inner.view.forget(name);
    }

    /// Forgets a node (its sandboxes leave the view once it is stale).
    pub fn remove_node(&self, address: &str) {
        if let Some(h) = self.inner.registry.remove(address) {
            h.mark_down();
            if let Some(name) = h.name() {
                self.inner.view.stream_lost(&name);
            }
        }
    }

    /// Waits until `count` nodes have answered.
    pub async fn wait_for_nodes(&self, count: usize, timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let up = self.inner.registry.up().len();
            if up >= count {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::unavailable(format!(
                    "{up} of {count} nodes answered within {timeout:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn nodes(&self) -> Vec<NodeSummary> {
        self.inner
            .registry
            .all()
            .iter()
            .map(|h| NodeSummary {
                address: h.address().to_string(),
                up: h.is_up(),
                info: h.info(),
            })
            .collect()
    }

    /// Warm pools across the fleet: pool key → (warm, target), summed over nodes that answer.
    pub fn pools(&self) -> BTreeMap<PoolKey, (u32, u32)> {
        let mut out: BTreeMap<PoolKey, (u32, u32)> = BTreeMap::new();
        for h in self.inner.registry.up() {
            if let Some(info) = h.info() {
                for p in info.pools {
                    let e = out.entry(p.key).or_default();
                    e.0 += p.warm;
                    e.1 += p.target;
                }
            }
        }
        out
    }

    async fn monitor(self, h: Arc<NodeHandle>, feed: ViewFeed) {
        let mut following = false;
        loop {
            if !self.is_registered(&h) {
                return;
            }
            match h
                .conn()
                .info(self.inner.cfg.lookup_timeout.max(Duration::from_secs(1)))
                .await
            {
                Ok(info) => {
                    let name = info.name.clone();
                    if !h.is_up() {
                        tracing::info!(node = %name, address = h.address(), "node is up");
                    }
                    h.set_info(info);
                    self.inner.registry.named(&h, &name);
                    if !following && feed == ViewFeed::Stream {
                        following = true;
                        self.inner.tasks.spawn(self.clone().follow(h.clone(), name));
                    }
                }
                Err(e) => {
                    if h.is_up() || h.down_since().is_none() {
                        tracing::warn!(node = %h.label(), error = %e, "node is not answering");
                    }
                    h.mark_down();
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.inner.cfg.info_interval) => {}
                _ = self.inner.shutdown.cancelled() => return,
            }
        }
    }

    fn is_registered(&self, h: &Arc<NodeHandle>) -> bool {
        self.inner.registry.all().iter().any(|x| Arc::ptr_eq(x, h))
    }

    /// Follows a node's inventory stream into the read view, reconnecting as needed.
    async fn follow(self, h: Arc<NodeHandle>, name: String) {
        let view = &self.inner.view;
        loop {
            if !self.is_registered(&h) {
                return;
            }
            let mut client = h.conn().client();
            let opened = tokio::select! {
                r = client.watch_inventory(proto::WatchInventoryRequest {}) => r,
                _ = self.inner.shutdown.cancelled() => return,
            };
            if let Ok(reply) = opened {
                view.stream_started(&name);
                let mut stream = reply.into_inner();
                loop {
                    let msg = tokio::select! {
                        m = stream.message() => m,
                        _ = self.inner.shutdown.cancelled() => return,
                    };
                    match msg {
                        Ok(Some(ev)) => match InventoryEvent::try_from(ev) {
                            Ok(ev) => view.apply(&name, ev),
                            Err(e) => {
                                tracing::warn!(node = %name, error = %e, "bad inventory event")
                            }
                        },
                        Ok(None) | Err(_) => break,
                    }
                }
            }
            view.stream_lost(&name);
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                _ = self.inner.shutdown.cancelled() => return,
            }
        }
    }

    /// Drops stale nodes' sandboxes from the read view, once a second.
    pub(super) async fn sweep_loop(self) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = self.inner.shutdown.cancelled() => return,
            }
            for node in self.inner.view.sweep(self.inner.cfg.stale_after) {
                tracing::warn!(%node, "node is stale; its sandboxes left the read view");
            }
        }
    }
}
