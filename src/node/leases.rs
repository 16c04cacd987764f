//! The reaper: destroys every sandbox at its deadline, running or paused.

use std::time::Duration;

use chrono::Utc;

use super::Node;
use super::runtime::Runtime;

const MAX_SLEEP: Duration = Duration::from_secs(1);
/// How often claimed instances are checked for having died on their own.
const LIVENESS_EVERY: Duration = Duration::from_secs(5);

impl<R: Runtime> Node<R> {
    pub(super) async fn reaper_loop(self) {
        let mut last_liveness = std::time::Instant::now();
        loop {
            let (expired, next) = {
                let st = self.state();
                let now = Utc::now();
                let expired: Vec<String> = st
                    .claims
                    .values()
                    .filter(|c| c.record.deadline <= now)
                    .map(|c| c.record.id.clone())
                    .collect();
                let next = st.claims.values().map(|c| c.record.deadline).min();
                (
                    expired,
                    next.map(|d| (d - now).to_std().unwrap_or_default()),
                )
            };
            for id in expired {
                // A renew may have moved the deadline since it was read.
                let due = |r: &crate::model::SandboxRecord| r.deadline <= Utc::now();
                match self.release_when(&id, "lease expired", due).await {
                    Ok(true) => tracing::info!(id, "reaped at its deadline"),
                    Ok(false) => {}
                    Err(e) => tracing::debug!(id, error = %e, "reaping skipped"),
                }
            }
            if last_liveness.elapsed() >= LIVENESS_EVERY {
                last_liveness = std::time::Instant::now();
                self.reap_dead().await;
            }
            let sleep = next.unwrap_or(MAX_SLEEP).min(MAX_SLEEP);
            tokio::select! {
                _ = tokio::time::sleep(sleep) => {}
                _ = self.inner.wake_reaper.notified() => {}
                _ = self.inner.shutdown.cancelled() => return,
            }
        }
    }
}

impl<R: Runtime> Node<R> {
    /// Releases claims whose instance died on its own (crashed, killed from outside) and
    /// remembers them as lost, so a later Get says what happened.
    async fn reap_dead(&self) {
        let dead: Vec<(String, String)> = {
            let st = self.state();
            st.claims
                .values()
                .filter(|c| !self.inner.runtime.is_alive(&c.instance))
                .map(|c| (c.record.id.clone(), c.record.claim_ref.clone()))
                .collect()
        };
        for (id, claim_ref) in dead {
            let still_dead = |_: &crate::model::SandboxRecord| true;
            if let Ok(true) = self.release_when(&id, "instance died", still_dead).await {
                tracing::warn!(id, "sandbox's instance died; released");
                self.state().remember_lost(crate::model::LostClaim {
                    id,
                    claim_ref,
                    reason: "its instance exited on its own".into(),
                    lost_at: Utc::now(),
                });
            }
        }
    }
}
