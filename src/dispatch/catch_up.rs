//! Monotonic reads across a replica's two paths: a live read from a node (a get, a list by
//! name) sees the node's inventory as of some revision, and a list made from the read view
//! after it waits, briefly, until the view has applied that revision from the node's stream.
//! Without it a client that saw a sandbox paused through a get could list it as running.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

/// The newest inventory revision live reads saw, per node, and a wake-up for lists waiting
/// for the view to reach them.
#[derive(Default)]
pub struct CatchUp {
    seen: Mutex<HashMap<String, u64>>,
    moved: Notify,
}

impl CatchUp {
    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A live read saw `node` at `revision`.
    pub fn observe(&self, node: &str, revision: u64) {
        let mut seen = self.seen();
        match seen.get_mut(node) {
            Some(r) => *r = (*r).max(revision),
            None => {
                seen.insert(node.to_string(), revision);
            }
        }
    }

    /// `node`'s stream started again: its revisions may have restarted with the node, and
    /// the snapshot it sends first is newer than anything read from it before.
    pub fn restart(&self, node: &str) {
        self.seen().remove(node);
        self.moved.notify_waiters();
    }

    /// The view applied something: waiting lists look again.
    pub fn moved(&self) {
        self.moved.notify_waiters();
    }

    /// Waits until `behind` says the view holds everything live reads had seen when this was
    /// called, for at most `timeout`. Answers whether it caught up (a list that could not
    /// wait longer is served from the view as it is).
    pub async fn wait(&self, timeout: Duration, behind: impl Fn(&[(String, u64)]) -> bool) -> bool {
        let targets: Vec<(String, u64)> = {
            let seen = self.seen();
            if seen.is_empty() {
                return true;
            }
            seen.iter().map(|(n, r)| (n.clone(), *r)).collect()
        };
        let until = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.moved.notified();
            tokio::pin!(notified);
            // Registered before looking, so a change between the look and the await wakes us.
            notified.as_mut().enable();
            if !behind(&targets) {
                return true;
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                return !behind(&targets);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[tokio::test]
    async fn nothing_seen_means_no_wait() {
        let c = CatchUp::default();
        assert!(c.wait(Duration::ZERO, |_| true).await);
    }

    #[tokio::test]
    async fn waits_for_the_newest_revision_seen_and_wakes_when_the_view_moves() {
        let c = Arc::new(CatchUp::default());
        c.observe("n1", 7);
        c.observe("n1", 5);
        let applied = Arc::new(AtomicU64::new(3));
        let behind = {
            let applied = applied.clone();
            move |t: &[(String, u64)]| {
                assert_eq!(t, [("n1".to_string(), 7)], "the newest revision seen");
                applied.load(Ordering::SeqCst) < t[0].1
            }
        };
        assert!(
            !c.wait(Duration::from_millis(20), &behind).await,
            "times out"
        );

        let mover = {
            let (c, applied) = (c.clone(), applied.clone());
            tokio::spawn(async move {
                for r in 4..=7 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    applied.store(r, Ordering::SeqCst);
                    c.moved();
                }
            })
        };
        let started = std::time::Instant::now();
        assert!(c.wait(Duration::from_secs(10), &behind).await);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "woken, not timed out"
        );
        mover.await.expect("the mover ran");
    }

    #[tokio::test]
    async fn a_restarted_stream_forgets_what_was_seen() {
        let c = CatchUp::default();
        c.observe("n1", 9);
        c.observe("n2", 1);
        c.restart("n1");
        let left = std::sync::Mutex::new(Vec::new());
        assert!(
            c.wait(Duration::ZERO, |t| {
                left.lock().expect("lock").extend(t.iter().cloned());
                false
            })
            .await
        );
        assert_eq!(*left.lock().expect("lock"), [("n2".to_string(), 1)]);
    }
}
