//! Keeps every warm pool at its target in the background, booting a few instances at a time.

use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::Node;
use super::runtime::{Instance, Runtime};
use crate::model::{PoolKey, Result};
use crate::templates::Template;

const IDLE_CHECK: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// How long the claims must pause before boots start competing with them for the cores.
const REFILL_SETTLE: Duration = Duration::from_millis(20);
/// The longest a burst of claims holds the refill back, while every pool keeps half its target.
const REFILL_HOLD: Duration = Duration::from_millis(500);

/// Whether a pool with `have` instances (warm or booting) of its `target` is so close to empty
/// that its refill must not wait for a burst of claims to end: below an eighth of its target, or
/// below what one round of the refill boots, whichever is more. Until then the burst is served
/// from what is warm and the boots wait: started at half the target, as they once were, they
/// shared the two cores with the burst's last claims and made the e2b create p99 at
/// concurrency 16 about 50 ms where it is about 18 ms now (PERFORMANCE.md); at the rates where
/// an eighth of a pool lasts less than a boot takes, boots started earlier would not have
/// finished in time either.
fn nearly_empty(have: u32, target: u32, refill_concurrency: usize) -> bool {
    let floor = (target / 8).max(u32::try_from(refill_concurrency).unwrap_or(u32::MAX));
    have < floor.min(target)
}

impl<R: Runtime> Node<R> {
    /// Picks the pools to top up now, reserving a slot for each boot.
    fn plan_refill(&self, in_flight: usize) -> Vec<(PoolKey, Template)> {
        let mut plan = Vec::new();
        let concurrency = self.inner.cfg.refill_concurrency.max(1);
        let max = self.inner.cfg.max_sandboxes;
        let now = Instant::now();
        let mut st = self.state();
        if st.closing {
            return plan;
        }
        let keys: Vec<PoolKey> = st.pools.keys().cloned().collect();
        for key in keys {
            let Ok(template) = self.template(&key.template) else {
                continue;
            };
            loop {
                if in_flight + plan.len() >= concurrency || st.instances() >= max {
                    return plan;
                }
                let Some(pool) = st.pools.get_mut(&key) else {
                    break;
                };
                let have = pool.warm.len() as u32 + pool.booting;
                if have >= pool.target || pool.retry_at.is_some_and(|t| t > now) {
                    break;
                }
                pool.booting += 1;
                plan.push((key.clone(), template.clone()));
            }
        }
        plan
    }

    /// Puts a finished boot into its pool, or destroys it when it is no longer wanted.
    fn refilled(&self, key: PoolKey, booted: Result<Instance<R::Handle>>) {
        let mut st = self.state();
        let closing = st.closing;
        let Some(pool) = st.pools.get_mut(&key) else {
            // Its pool went away while it booted (a built template's tag moved).
            drop(st);
            if let Ok(inst) = booted {
                self.destroy_later(inst, "its pool is gone");
            }
            return;
        };
        pool.booting -= 1;
        match booted {
            Ok(inst) if !closing && (pool.warm.len() as u32) < pool.target => {
                pool.failures = 0;
                pool.retry_at = None;
                pool.warm.push_back(inst);
            }
            Ok(inst) => {
                drop(st);
                self.destroy_later(inst, "pool over target");
            }
            Err(e) => {
                pool.failures += 1;
                let backoff = Duration::from_millis(100 << pool.failures.min(7)).min(MAX_BACKOFF);
                pool.retry_at = Some(Instant::now() + backoff);
                tracing::error!(pool = %key, error = %e, ?backoff, "warm boot failed");
            }
        }
    }

    /// Lets a burst of claims finish before boots compete with it for the cores: each claim
    /// pushes the refill back by `REFILL_SETTLE`, for up to `REFILL_HOLD`, until a pool runs
    /// nearly empty (`nearly_empty`); that one is refilled at once, since its next claims would
    /// boot cold.
    async fn hold_refill(&self) {
        let until = tokio::time::Instant::now() + REFILL_HOLD;
        loop {
            let quiet =
                tokio::time::timeout(REFILL_SETTLE, self.inner.wake_refill.notified()).await;
            if quiet.is_err() || tokio::time::Instant::now() >= until || self.a_pool_is_low() {
                return;
            }
        }
    }

    /// Whether a pool has (warm or booting) fewer than `nearly_empty` allows.
    fn a_pool_is_low(&self) -> bool {
        let concurrency = self.inner.cfg.refill_concurrency;
        self.state()
            .pools
            .values()
            .any(|p| nearly_empty(p.warm.len() as u32 + p.booting, p.target, concurrency))
    }

    pub(super) async fn refill_loop(self) {
        let mut boots: JoinSet<(PoolKey, Result<Instance<R::Handle>>)> = JoinSet::new();
        loop {
            for (key, template) in self.plan_refill(boots.len()) {
                let node = self.clone();
                boots.spawn(async move {
                    let started = Instant::now();
                    let booted = node.boot(&key, &template, None, None).await;
                    node.metrics().refill_booted(
                        &key.to_string(),
                        booted.is_ok(),
                        started.elapsed(),
                    );
                    if let Ok(inst) = &booted {
                        node.open_agent_line(inst, &template).await;
                    }
                    (key, booted)
                });
            }
            tokio::select! {
                Some(done) = boots.join_next(), if !boots.is_empty() => {
                    if let Ok((key, booted)) = done {
                        self.refilled(key, booted);
                    }
                }
                _ = self.inner.wake_refill.notified() => self.hold_refill().await,
                _ = tokio::time::sleep(IDLE_CHECK) => {}
                _ = self.inner.shutdown.cancelled() => break,
            }
        }
        // Let boots in flight finish so that no instance is left half-started; `refilled`
        // destroys them because the node is closing.
        while let Some(done) = boots.join_next().await {
            if let Ok((key, booted)) = done {
                self.refilled(key, booted);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::nearly_empty;

    #[test]
    fn a_large_pool_waits_until_an_eighth_is_left() {
        assert!(!nearly_empty(64, 128, 4));
        assert!(!nearly_empty(16, 128, 4));
        assert!(nearly_empty(15, 128, 4));
        assert!(nearly_empty(0, 128, 4));
    }

    #[test]
    fn a_small_pool_is_nearly_empty_below_one_refill_round() {
        assert!(nearly_empty(3, 8, 4));
        assert!(!nearly_empty(4, 8, 4));
        // A pool smaller than one round is low as soon as it is not full.
        assert!(nearly_empty(1, 2, 4));
        assert!(!nearly_empty(2, 2, 4));
    }

    #[test]
    fn an_empty_target_is_never_low() {
        assert!(!nearly_empty(0, 0, 4));
    }
}
