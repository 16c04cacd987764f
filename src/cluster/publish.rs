//! The node's side of cluster mode: it server-side-applies its NodeInventory object every
//! interval and once more when it stops. Apply creates a missing object, so one lost to a
//! deletion is rebuilt on the next tick. A failed publish (the apiserver down, say) is logged
//! and retried with backoff (`retry_backoff`); the node keeps serving meanwhile, since
//! gateways keep a node whose object they cannot refresh (see `discover`).

use std::time::Duration;

use chrono::Utc;
use kube::api::{Api, Patch, PatchParams};
use tokio_util::sync::CancellationToken;

use super::backoff::{self, Backoff};
use super::inventory::NodeInventory;
use crate::model::{Error, Result};
use crate::node::Node;
use crate::node::runtime::Runtime;

/// The field manager of every field a node writes.
pub const FIELD_MANAGER: &str = "sandbox-gateway-node";
/// How long one publish may take.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);
/// The most a failing publisher waits between attempts (unless its interval is longer).
const RETRY_CAP: Duration = Duration::from_secs(30);

/// How a failing publisher retries: first after about one interval, then doubling up to eight
/// intervals, but never longer than `RETRY_CAP` unless the interval itself is. The cap bounds
/// how long after an apiserver outage the node's object is fresh again: gateways drop a node
/// `--inventory-stale-seconds` after its last publish (not counting the time they could not
/// see the apiserver either), so that bound must exceed the interval plus this cap (90 s
/// against 30 s + 30 s by default).
pub fn retry_backoff(interval: Duration) -> Backoff {
    let cap = interval.saturating_mul(8).min(RETRY_CAP).max(interval);
    Backoff::new(interval, cap)
}

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

    /// Publishes every `interval` until `stop` is cancelled; retries failures with
    /// `retry_backoff`.
    pub async fn run<R: Runtime>(self, node: Node<R>, interval: Duration, stop: CancellationToken) {
        let mut retry = retry_backoff(interval);
        loop {
            let wait = match self.publish(&node).await {
                Ok(()) => {
                    let failed = retry.succeed();
                    if failed > 0 {
                        tracing::info!(
                            failed_attempts = failed,
                            "publishing the node inventory works again"
                        );
                    }
                    interval
                }
                Err(e) => {
                    let wait = retry.fail(backoff::jitter());
                    tracing::warn!(
                        error = %e,
                        attempt = retry.failures(),
                        retry_in = ?wait,
                        "publishing the node inventory failed"
                    );
                    wait
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_publishes_back_off_to_eight_intervals_or_thirty_seconds() {
        let s = Duration::from_secs;
        let ceilings = |interval: Duration, n: usize| -> Vec<Duration> {
            let mut b = retry_backoff(interval);
            (0..n)
                .map(|_| {
                    b.fail(1.0);
                    b.ceiling()
                })
                .collect()
        };
        assert_eq!(ceilings(s(1), 5), [s(1), s(2), s(4), s(8), s(8)]);
        assert_eq!(ceilings(s(5), 4), [s(5), s(10), s(20), s(30)]);
        // The default interval: a failing node keeps its pace, it never publishes faster.
        assert_eq!(ceilings(s(30), 3), [s(30), s(30), s(30)]);
        assert_eq!(ceilings(s(600), 2), [s(600), s(600)]);
        // The first retry comes after half to all of one interval.
        let mut b = retry_backoff(s(10));
        assert_eq!(b.fail(0.0), s(5));
        // The documented default bound leaves room: interval + cap < stale-after.
        assert!(s(30) + retry_backoff(s(30)).cap() < s(90));
    }
}
