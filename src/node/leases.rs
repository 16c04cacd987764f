//! The reaper: ends every sandbox's lease as the sandbox asked (release or pause) and
//! releases paused sandboxes at the end of their retention.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Node;
use super::runtime::Runtime;
use crate::model::logs::LogLevel;
use crate::model::{OnTimeout, Phase, SandboxRecord};

const MAX_SLEEP: Duration = Duration::from_secs(1);
/// How often claimed instances are checked for having died on their own.
const LIVENESS_EVERY: Duration = Duration::from_secs(5);

impl<R: Runtime> Node<R> {
    pub(super) async fn reaper_loop(self) {
        let mut last_liveness = std::time::Instant::now();
        loop {
            let (due, next) = {
                let st = self.state();
                let now = Utc::now();
                let due: Vec<(String, Ending)> = st
                    .claims
                    .values()
                    .filter_map(|c| ending(&c.record, now).map(|e| (c.record.id.clone(), e)))
                    .collect();
                let next = st.claims.values().map(|c| c.record.ends_at()).min();
                (due, next.map(|d| (d - now).to_std().unwrap_or_default()))
            };
            for (id, how) in due {
                self.end(&id, how).await;
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

/// What the reaper does with a sandbox whose time is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// The lease ended and the sandbox asked to be killed then.
    Release,
    /// The lease ended and the sandbox asked to be paused instead.
    Pause,
    /// A paused sandbox's retention ended.
    Retention,
}

/// Whether `r`'s time is up at `now`, and what ends it. A paused sandbox's lease does not
/// run; only its retention does.
fn ending(r: &SandboxRecord, now: DateTime<Utc>) -> Option<Ending> {
    match r.phase {
        Phase::Paused => (r.ends_at() <= now).then_some(Ending::Retention),
        Phase::Running if r.deadline > now => None,
        Phase::Running => Some(match r.lifecycle.on_timeout {
            OnTimeout::Kill => Ending::Release,
            OnTimeout::Pause => Ending::Pause,
        }),
    }
}

impl<R: Runtime> Node<R> {
    async fn end(&self, id: &str, how: Ending) {
        // A renew, pause or resume may have moved the sandbox on since it was read.
        let still = move |r: &SandboxRecord| ending(r, Utc::now()) == Some(how);
        match how {
            Ending::Release | Ending::Retention => {
                let why = if how == Ending::Release {
                    "lease expired"
                } else {
                    "paused retention ended"
                };
                match self.release_when(id, why, still).await {
                    Ok(true) => tracing::info!(id, why, "reaped"),
                    Ok(false) => {}
                    Err(e) => tracing::debug!(id, error = %e, "reaping skipped"),
                }
            }
            Ending::Pause => match self.pause_when(id, still).await {
                Ok(true) => {
                    tracing::info!(id, "paused at the end of its lease");
                    self.note(
                        id,
                        LogLevel::Info,
                        "the lease ended: paused (on_timeout: pause)",
                    );
                }
                Ok(false) => {}
                Err(e) => {
                    // A sandbox that cannot be paused must still not outlive its lease.
                    tracing::warn!(id, error = %e, "pausing at the end of the lease failed; releasing");
                    let _ = self
                        .release_when(id, "lease expired (pause failed)", |_| true)
                        .await;
                }
            },
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
                // A sandbox paused on disk has no instance to die.
                .filter(|c| !c.record.paused_on_disk())
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
