//! The gateway's side of cluster mode: it lists and watches NodeInventory objects, adds the
//! node each fresh object names, drops a node whose object is deleted or older than the
//! staleness bound, and (with the inventory feed) builds the read view from the objects'
//! entries. Get and the verbs still ask the owning node directly.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::inventory::{NodeInventory, published_long_ago};
use crate::dispatch::{Dispatcher, ViewFeed};
use crate::model::{Error, Result};

#[derive(Debug, Clone)]
pub struct DiscoveryConfig {
    /// A node whose object was published longer ago than this leaves claims and lists.
    pub stale_after: Duration,
    /// Where the read view gets discovered nodes' sandboxes from.
    pub feed: ViewFeed,
    /// How long startup waits for the first list before failing.
    pub sync_timeout: Duration,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            stale_after: Duration::from_secs(90),
            feed: ViewFeed::Inventory,
            sync_timeout: Duration::from_secs(120),
        }
    }
}

/// What discovery knows of one node object.
struct Known {
    address: String,
    published_at: Option<DateTime<Utc>>,
    /// The node is in the dispatcher (its object is fresh).
    active: bool,
}

pub struct Discovery {
    api: Api<NodeInventory>,
    dispatcher: Dispatcher,
    cfg: DiscoveryConfig,
    known: HashMap<String, Known>,
}

/// How often objects are checked against the staleness bound between watch events.
const STALENESS_TICK: Duration = Duration::from_secs(1);
/// Server-side watch timeout (kube-apiserver caps it near 30 min; shorter keeps it fresh).
const WATCH_TIMEOUT_SECS: u32 = 290;

impl Discovery {
    /// Lists the nodes once (retrying until `sync_timeout`), then follows changes in the
    /// background until `stop` is cancelled. Fails when the first list never succeeds.
    pub async fn start(
        client: kube::Client,
        dispatcher: Dispatcher,
        cfg: DiscoveryConfig,
        stop: CancellationToken,
    ) -> Result<JoinHandle<()>> {
        let mut d = Discovery {
            api: Api::all(client),
            dispatcher,
            cfg,
            known: HashMap::new(),
        };
        let deadline = tokio::time::Instant::now() + d.cfg.sync_timeout;
        let version = loop {
            match d.relist().await {
                Ok(v) => break v,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::warn!(error = %e, "listing NodeInventory objects failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = stop.cancelled() => return Err(Error::unavailable("stopped")),
                    }
                }
                Err(e) => {
                    return Err(e.context(format!(
                        "no NodeInventory list within {:?} (is the CRD installed and may this service account list it?)",
                        d.cfg.sync_timeout
                    )));
                }
            }
        };
        Ok(tokio::spawn(d.follow(version, stop)))
    }

    /// Lists every object, replacing what was known; returns the list's resource version.
    async fn relist(&mut self) -> Result<String> {
        let list = self
            .api
            .list(&ListParams::default())
            .await
            .map_err(|e| Error::unavailable(format!("listing NodeInventory objects: {e}")))?;
        let mut seen = HashSet::new();
        for obj in &list.items {
            seen.insert(obj.node_name().to_string());
            self.apply(obj);
        }
        let gone: Vec<String> = self
            .known
            .keys()
            .filter(|n| !seen.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            self.remove(&name, "its NodeInventory object is gone");
        }
        Ok(list.metadata.resource_version.unwrap_or_default())
    }

    async fn follow(mut self, mut version: String, stop: CancellationToken) {
        let mut tick = tokio::time::interval(STALENESS_TICK);
        loop {
            let params = WatchParams::default().timeout(WATCH_TIMEOUT_SECS);
            let opened = tokio::select! {
                r = self.api.watch(&params, &version) => r,
                _ = stop.cancelled() => return,
            };
            let mut relist = match opened {
                Ok(stream) => {
                    let mut stream = std::pin::pin!(stream);
                    loop {
                        tokio::select! {
                            ev = stream.next() => match ev {
                                Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o))) => {
                                    if let Some(v) = &o.metadata.resource_version {
                                        version.clone_from(v);
                                    }
                                    self.apply(&o);
                                }
                                Some(Ok(WatchEvent::Deleted(o))) => {
                                    if let Some(v) = &o.metadata.resource_version {
                                        version.clone_from(v);
                                    }
                                    self.remove(o.node_name(), "its NodeInventory object was deleted");
                                }
                                Some(Ok(WatchEvent::Bookmark(b))) => {
                                    version = b.metadata.resource_version;
                                }
                                Some(Ok(WatchEvent::Error(status))) => {
                                    if status.code != 410 {
                                        tracing::warn!(message = %status.message, "NodeInventory watch error");
                                    }
                                    break true;
                                }
                                Some(Err(e)) => {
                                    tracing::warn!(error = %e, "NodeInventory watch failed");
                                    break true;
                                }
                                // The server ended the watch: resume from the last version.
                                None => break false,
                            },
                            _ = tick.tick() => self.sweep(),
                            _ = stop.cancelled() => return,
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "opening the NodeInventory watch failed");
                    true
                }
            };
            while relist {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.cancelled() => return,
                }
                self.sweep();
                match self.relist().await {
                    Ok(v) => {
                        version = v;
                        relist = false;
                    }
                    Err(e) => tracing::warn!(error = %e, "relisting NodeInventory objects failed"),
                }
            }
        }
    }

    fn apply(&mut self, obj: &NodeInventory) {
        let name = obj.node_name().to_string();
        if name.is_empty() || obj.address.is_empty() {
            tracing::warn!(object = ?obj.metadata.name, "NodeInventory without a node name or address; skipped");
            return;
        }
        if let Some(prev) = self.known.get(&name)
            && prev.active
            && prev.address != obj.address
        {
            tracing::info!(node = %name, from = %prev.address, to = %obj.address, "node moved");
            self.dispatcher.drop_node(&prev.address, &name);
        }
        let was_active = self.known.get(&name).is_some_and(|k| k.active);
        let now = Utc::now();
        let active = !obj.is_stale(now, self.cfg.stale_after);
        if active {
            if let Err(e) = self.dispatcher.add_node_fed(&obj.address, self.cfg.feed) {
                tracing::warn!(node = %name, address = %obj.address, error = %e, "cannot use node");
                return;
            }
            if !was_active {
                tracing::info!(node = %name, address = %obj.address, "discovered node");
            }
            if self.cfg.feed == ViewFeed::Inventory {
                self.dispatcher.view().replace(
                    &name,
                    obj.records(),
                    obj.published_at.unwrap_or(now),
                );
            }
        } else if was_active {
            self.drop(&name, &obj.address, "its NodeInventory object is stale");
        }
        self.known.insert(
            name,
            Known {
                address: obj.address.clone(),
                published_at: obj.published_at,
                active,
            },
        );
    }

    fn remove(&mut self, name: &str, why: &str) {
        if let Some(k) = self.known.remove(name)
            && k.active
        {
            self.drop(name, &k.address, why);
        }
    }

    fn drop(&self, name: &str, address: &str, why: &str) {
        tracing::warn!(node = %name, %address, "node left the fleet: {why}");
        self.dispatcher.drop_node(address, name);
    }

    /// Drops nodes whose objects went stale without a newer publish.
    fn sweep(&mut self) {
        let now = Utc::now();
        let stale: Vec<(String, String)> = self
            .known
            .iter()
            .filter(|(_, k)| {
                k.active && published_long_ago(k.published_at, now, self.cfg.stale_after)
            })
            .map(|(n, k)| (n.clone(), k.address.clone()))
            .collect();
        for (name, address) in stale {
            self.drop(&name, &address, "its NodeInventory object is stale");
            if let Some(k) = self.known.get_mut(&name) {
                k.active = false;
            }
        }
    }
}
