//! The gateway's side of cluster mode: it lists and watches NodeInventory objects, adds the
//! node each fresh object names, drops a node whose object is deleted or older than the
//! staleness bound, and (with the inventory feed) builds the read view from the objects'
//! entries. Get and the verbs still ask the owning node directly.
//!
//! **When the apiserver is unreachable** (the watch breaks, lists fail) the gateway keeps the
//! nodes it knew, as they were, and retries with backoff. Staleness is judged on what the
//! apiserver says, so time the gateway could not see it does not count towards an object's
//! age (`BlindClock`): a node's object goes stale only after the gateway has been able to
//! watch for `stale_after` without seeing a newer publish. Dropping nodes because their
//! objects could not be refreshed would turn a control-plane outage into a data-plane one:
//! every running sandbox unreachable and every create refused, while the nodes themselves are
//! fine (a node that really dies meanwhile still fails fast: its connection is marked down and
//! claims avoid it). Once the list works again, nodes that did not republish go stale as usual.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use tokio::task::JoinHandle;
use tokio::time::{Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::backoff::{self, Backoff};
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
    /// The `BlindClock` total when this publish was first seen: the blind time since then is
    /// not counted in its age.
    blind_at: Duration,
    /// The node is in the dispatcher (its object is fresh).
    active: bool,
}

/// How long, in total, the gateway could not see the apiserver: from a watch breaking (or a
/// request failing) until a watch opens or a list succeeds again. Monotonic time, so that a
/// wall-clock step does not count as blindness.
#[derive(Debug, Default)]
struct BlindClock {
    /// Blind time of the periods that ended.
    total: Duration,
    /// Since when the gateway is blind, if it is.
    since: Option<Instant>,
}

impl BlindClock {
    /// The gateway stops seeing the apiserver at `now` (a no-op while already blind: the
    /// period started earlier).
    fn lose(&mut self, now: Instant) {
        self.since.get_or_insert(now);
    }

    /// The gateway sees the apiserver again; returns how long it was blind, if it was.
    fn regain(&mut self, now: Instant) -> Option<Duration> {
        let since = self.since.take()?;
        let blind = now.saturating_duration_since(since);
        self.total = self.total.saturating_add(blind);
        Some(blind)
    }

    /// All blind time up to `now`, the current period included.
    fn total(&self, now: Instant) -> Duration {
        let current = self
            .since
            .map_or(Duration::ZERO, |s| now.saturating_duration_since(s));
        self.total.saturating_add(current)
    }
}

/// Whether a publish is stale at `now`: made longer than `bound` ago, not counting `unseen`,
/// the time since the gateway first saw it during which it could not see the apiserver. Never
/// for an object without a publish time.
fn stale(
    published_at: Option<DateTime<Utc>>,
    unseen: Duration,
    now: DateTime<Utc>,
    bound: Duration,
) -> bool {
    // Judging at `now - unseen` is judging an age that stood still while the gateway was blind.
    let Some(as_of) = chrono::Duration::from_std(unseen)
        .ok()
        .and_then(|u| now.checked_sub_signed(u))
    else {
        return false;
    };
    published_long_ago(published_at, as_of, bound)
}

pub struct Discovery {
    api: Api<NodeInventory>,
    dispatcher: Dispatcher,
    cfg: DiscoveryConfig,
    known: HashMap<String, Known>,
    blind: BlindClock,
}

/// How often objects are checked against the staleness bound between watch events.
const STALENESS_TICK: Duration = Duration::from_secs(1);
/// Server-side watch timeout (kube-apiserver caps it near 30 min; shorter keeps it fresh).
const WATCH_TIMEOUT_SECS: u32 = 290;
/// How long one list, or opening one watch, may take. The kube client retries 503s inside a
/// request with its own backoff (for minutes): unbounded, a list during an outage would
/// still be waiting long after the apiserver came back.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Retries after failed lists and watches wait 1 s, doubling up to 10 s: a gateway replica
/// costs a down apiserver about one request (burst) per 10 s, and sees it back within ~20 s.
const RETRY_BASE: Duration = Duration::from_secs(1);
const RETRY_CAP: Duration = Duration::from_secs(10);
/// A watch that delivered nothing and ended sooner than this after opening counts as failed,
/// so that a server (or proxy) that ends every watch at once is retried with backoff rather
/// than in a hot loop; one that delivered an event or lasted this long resets the backoff.
const HEALTHY_WATCH: Duration = Duration::from_secs(10);

/// How one watch ended.
enum Watched {
    /// `stop` was cancelled.
    Stopped,
    /// The server ended it (its timeout, a connection closed between events).
    Ended,
    /// The version it started from is gone (410): relist, nothing is wrong.
    Expired,
    /// It could not be opened, or broke.
    Failed(String),
}

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
            blind: BlindClock::default(),
        };
        let deadline = tokio::time::Instant::now() + d.cfg.sync_timeout;
        let mut retry = Backoff::new(RETRY_BASE, RETRY_CAP);
        let version = loop {
            let e = match d.relist_bounded().await {
                Ok(v) => break v,
                Err(e) => e,
            };
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(e.context(format!(
                    "no NodeInventory list within {:?} (is the CRD installed and may this service account list it?)",
                    d.cfg.sync_timeout
                )));
            }
            let wait = retry.fail(backoff::jitter()).min(left);
            tracing::warn!(error = %e, attempt = retry.failures(), retry_in = ?wait, "listing NodeInventory objects failed");
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.cancelled() => return Err(Error::unavailable("stopped")),
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
        // The list is the apiserver's current state: the gateway sees again.
        self.blind.regain(Instant::now());
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

    /// `relist`, within `REQUEST_TIMEOUT`.
    async fn relist_bounded(&mut self) -> Result<String> {
        tokio::time::timeout(REQUEST_TIMEOUT, self.relist())
            .await
            .unwrap_or_else(|_| {
                Err(Error::unavailable(format!(
                    "listing NodeInventory objects took over {REQUEST_TIMEOUT:?}"
                )))
            })
    }

    /// Watches, relists when the watch fails, and retries failures with backoff, keeping
    /// the known nodes meanwhile (see the module's comment).
    async fn follow(mut self, mut version: String, stop: CancellationToken) {
        let mut tick = tokio::time::interval(STALENESS_TICK);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut retry = Backoff::new(RETRY_BASE, RETRY_CAP);
        loop {
            let (watched, healthy) = self.watch(&mut version, &mut tick, &stop).await;
            if healthy {
                retry.succeed();
            }
            let (mut failure, mut expected) = match watched {
                Watched::Stopped => return,
                // The server ended a working watch: resume from the last version at once.
                Watched::Ended if healthy => continue,
                Watched::Ended => (
                    "the NodeInventory watch ended as soon as it opened".to_string(),
                    false,
                ),
                Watched::Expired => ("the NodeInventory watch expired".to_string(), true),
                Watched::Failed(e) => (e, false),
            };
            loop {
                let wait = retry.fail(backoff::jitter());
                if expected {
                    tracing::debug!(reason = %failure, retry_in = ?wait, "relisting NodeInventory objects");
                } else {
                    tracing::warn!(
                        error = %failure,
                        attempt = retry.failures(),
                        retry_in = ?wait,
                        nodes = self.known.values().filter(|k| k.active).count(),
                        "NodeInventory list+watch failed; keeping the known nodes until it works again"
                    );
                }
                if self.pause(wait, &mut tick, &stop).await {
                    return;
                }
                // Cancellable: a gateway stopping during an outage need not wait out a list.
                let relisted = tokio::select! {
                    r = self.relist_bounded() => r,
                    _ = stop.cancelled() => return,
                };
                match relisted {
                    Ok(v) => {
                        version = v;
                        if !expected {
                            tracing::info!(
                                failed_attempts = retry.failures(),
                                "listing NodeInventory objects works again"
                            );
                        }
                        break;
                    }
                    Err(e) => {
                        failure = e.to_string();
                        expected = false;
                    }
                }
            }
        }
    }

    /// Opens one watch from `version` and follows it until it ends, sweeping on `tick`.
    /// Also says whether it was healthy (see `HEALTHY_WATCH`).
    async fn watch(
        &mut self,
        version: &mut String,
        tick: &mut Interval,
        stop: &CancellationToken,
    ) -> (Watched, bool) {
        let params = WatchParams::default().timeout(WATCH_TIMEOUT_SECS);
        // Between watches the gateway does not see changes; a reopen that works in time
        // (the usual case) makes this a few milliseconds.
        self.blind.lose(Instant::now());
        let opened = tokio::select! {
            r = tokio::time::timeout(REQUEST_TIMEOUT, self.api.watch(&params, version)) => r,
            _ = stop.cancelled() => return (Watched::Stopped, false),
        };
        let stream = match opened {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                let e = format!("opening the NodeInventory watch: {e}");
                return (Watched::Failed(e), false);
            }
            Err(_) => {
                let e = format!("opening the NodeInventory watch took over {REQUEST_TIMEOUT:?}");
                return (Watched::Failed(e), false);
            }
        };
        // The watch replays every change since `version`: nothing is missed from here on.
        self.blind.regain(Instant::now());
        let opened_at = Instant::now();
        let mut events = 0u64;
        let mut stream = std::pin::pin!(stream);
        let watched = loop {
            tokio::select! {
                ev = stream.next() => {
                    if matches!(ev, Some(Ok(_))) {
                        events += 1;
                    }
                    match ev {
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
                            *version = b.metadata.resource_version;
                        }
                        Some(Ok(WatchEvent::Error(status))) if status.code == 410 => {
                            break Watched::Expired;
                        }
                        Some(Ok(WatchEvent::Error(status))) => {
                            break Watched::Failed(format!("NodeInventory watch error: {}", status.message));
                        }
                        Some(Err(e)) => break Watched::Failed(format!("NodeInventory watch failed: {e}")),
                        None => break Watched::Ended,
                    }
                }
                _ = tick.tick() => self.sweep(),
                _ = stop.cancelled() => return (Watched::Stopped, false),
            }
        };
        self.blind.lose(Instant::now());
        (watched, events > 0 || opened_at.elapsed() >= HEALTHY_WATCH)
    }

    /// Waits `wait` (sweeping on `tick`); true when `stop` was cancelled meanwhile.
    async fn pause(
        &mut self,
        wait: Duration,
        tick: &mut Interval,
        stop: &CancellationToken,
    ) -> bool {
        let until = tokio::time::sleep(wait);
        let mut until = std::pin::pin!(until);
        loop {
            tokio::select! {
                _ = &mut until => return false,
                _ = tick.tick() => self.sweep(),
                _ = stop.cancelled() => return true,
            }
        }
    }

    /// The blind time to leave out of the age of `published_at` for node `name`, and the
    /// clock reading to remember with it.
    fn unseen(&self, name: &str, published_at: Option<DateTime<Utc>>) -> (Duration, Duration) {
        let total = self.blind.total(Instant::now());
        let blind_at = match self.known.get(name) {
            // The same publish seen again (a relist after an outage): its age stood still.
            Some(k) if k.published_at == published_at => k.blind_at,
            _ => total,
        };
        (total.saturating_sub(blind_at), blind_at)
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
        let (unseen, blind_at) = self.unseen(&name, obj.published_at);
        let active = !stale(obj.published_at, unseen, now, self.cfg.stale_after);
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
                blind_at,
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
        let blind = self.blind.total(Instant::now());
        let expired: Vec<(String, String)> = self
            .known
            .iter()
            .filter(|(_, k)| {
                let unseen = blind.saturating_sub(k.blind_at);
                k.active && stale(k.published_at, unseen, now, self.cfg.stale_after)
            })
            .map(|(n, k)| (n.clone(), k.address.clone()))
            .collect();
        for (name, address) in expired {
            self.drop(&name, &address, "its NodeInventory object is stale");
            if let Some(k) = self.known.get_mut(&name) {
                k.active = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn the_blind_clock_counts_only_time_without_the_apiserver() {
        let t0 = Instant::now();
        let mut c = BlindClock::default();
        assert_eq!(c.total(t0 + 5 * S), Duration::ZERO);
        assert_eq!(c.regain(t0), None, "regaining while seeing is nothing");
        c.lose(t0 + 10 * S);
        // Losing again while blind keeps the start of the period.
        c.lose(t0 + 20 * S);
        assert_eq!(c.total(t0 + 30 * S), 20 * S, "the current period counts");
        assert_eq!(c.regain(t0 + 70 * S), Some(60 * S));
        assert_eq!(
            c.total(t0 + 100 * S),
            60 * S,
            "seeing again: it stands still"
        );
        c.lose(t0 + 100 * S);
        assert_eq!(c.regain(t0 + 101 * S), Some(S));
        assert_eq!(c.total(t0 + 200 * S), 61 * S);
        // An instant before the period began (clock reads out of order) counts as none.
        c.lose(t0 + 300 * S);
        assert_eq!(c.total(t0 + 299 * S), 61 * S);
    }

    #[test]
    fn blind_time_does_not_age_a_publish() {
        let now = Utc::now();
        let bound = 90 * S;
        let at = |secs_ago: i64| Some(now - chrono::Duration::seconds(secs_ago));
        // Seeing all along: the wall-clock age decides.
        assert!(!stale(at(80), Duration::ZERO, now, bound));
        assert!(stale(at(100), Duration::ZERO, now, bound));
        // Published 10 s before a 60 s outage, judged 5 s after it ended: 15 s old.
        assert!(!stale(at(75), 60 * S, now, bound));
        // The outage does not reset the age either: 40 s old before it, 55 s after it.
        assert!(stale(at(40 + 600 + 55), 600 * S, now, bound));
        assert!(!stale(at(40 + 600 + 49), 600 * S, now, bound));
        // Never for an object without a publish time, nor with absurd blind time.
        assert!(!stale(None, Duration::ZERO, now, bound));
        assert!(!stale(at(100), Duration::MAX, now, bound));
    }
}
