//! The reaper: destroys every sandbox at its deadline, running or paused.

use std::time::Duration;

use chrono::Utc;

use super::Node;
use super::runtime::Runtime;

const MAX_SLEEP: Duration = Duration::from_secs(1);

impl<R: Runtime> Node<R> {
    pub(super) async fn reaper_loop(self) {
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
            let sleep = next.unwrap_or(MAX_SLEEP).min(MAX_SLEEP);
            tokio::select! {
                _ = tokio::time::sleep(sleep) => {}
                _ = self.inner.wake_reaper.notified() => {}
                _ = self.inner.shutdown.cancelled() => return,
            }
        }
    }
}
