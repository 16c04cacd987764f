//! Bounded exponential backoff with jitter for the loops that retry kube-apiserver (the node's
//! publisher, the gateway's list and watch). While the apiserver is down every node and every
//! gateway replica retries at once: growing the delay keeps their logs and the load on a
//! recovering apiserver small, the cap bounds how late they notice it is back, and the
//! jitter keeps a fleet that failed together from retrying in lockstep.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    /// Failures in a row since the last success.
    failures: u32,
}

impl Backoff {
    /// Delays start at `base` and double up to `cap` (never below `base`).
    pub fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap: cap.max(base),
            failures: 0,
        }
    }

    /// Records a failure and returns the wait before the next attempt: for the n-th failure in
    /// a row `min(base·2^(n−1), cap)`, spread over its upper half by `jitter` (0 gives half of
    /// it, 1 all of it; anything else is clamped). The upper half, not all of `[0, d]`, so that
    /// a retry is never much sooner than the schedule says.
    pub fn fail(&mut self, jitter: f64) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let jitter = if jitter.is_nan() {
            1.0
        } else {
            jitter.clamp(0.0, 1.0)
        };
        let ceiling = self.ceiling();
        // Not `mul_f64`: it panics when a ceiling near `Duration::MAX` rounds up past it.
        Duration::try_from_secs_f64(ceiling.as_secs_f64() * (0.5 + 0.5 * jitter))
            .map_or(ceiling, |d| d.min(ceiling))
    }

    /// The longest wait after the failures so far (zero before the first).
    pub fn ceiling(&self) -> Duration {
        let Some(doublings) = self.failures.checked_sub(1) else {
            return Duration::ZERO;
        };
        // 2^31 times any base is past any sensible cap; checked_mul catches the rest.
        1u32.checked_shl(doublings)
            .and_then(|factor| self.base.checked_mul(factor))
            .map_or(self.cap, |d| d.min(self.cap))
    }

    /// Records a success; returns how many failures in a row it ended.
    pub fn succeed(&mut self) -> u32 {
        std::mem::take(&mut self.failures)
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The longest wait ever.
    pub fn cap(&self) -> Duration {
        self.cap
    }
}

/// A jitter value for `Backoff::fail`.
pub fn jitter() -> f64 {
    rand::random::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn doubles_from_the_base_up_to_the_cap() {
        let mut b = Backoff::new(S, 10 * S);
        assert_eq!(b.ceiling(), Duration::ZERO);
        let waits: Vec<Duration> = (0..6).map(|_| b.fail(1.0)).collect();
        assert_eq!(waits, [S, 2 * S, 4 * S, 8 * S, 10 * S, 10 * S]);
        assert_eq!(b.failures(), 6);
        // Jitter only ever shortens, to no less than half.
        assert_eq!(b.fail(0.0), 5 * S);
        assert_eq!(b.fail(0.5), Duration::from_millis(7500));
    }

    #[test]
    fn a_success_starts_over() {
        let mut b = Backoff::new(S, 10 * S);
        for _ in 0..4 {
            b.fail(1.0);
        }
        assert_eq!(b.succeed(), 4);
        assert_eq!(b.succeed(), 0);
        assert_eq!(b.fail(1.0), S);
    }

    #[test]
    fn odd_inputs_stay_bounded() {
        // A cap below the base is the base.
        let mut b = Backoff::new(5 * S, S);
        assert_eq!(b.fail(1.0), 5 * S);
        // Thousands of failures (or a huge base) never overflow past the cap.
        let mut b = Backoff::new(Duration::from_secs(u64::MAX / 4), Duration::MAX);
        for _ in 0..4 {
            assert!(b.fail(1.0) <= Duration::MAX);
        }
        assert_eq!(b.ceiling(), Duration::MAX);
        let mut b = Backoff::new(S, 30 * S);
        for _ in 0..10_000 {
            assert!(b.fail(jitter()) <= 30 * S);
        }
        assert_eq!(b.fail(f64::NAN), 30 * S);
        assert_eq!(b.fail(-3.0), 15 * S);
        assert_eq!(b.fail(7.0), 30 * S);
        // A zero base never waits (and never panics).
        assert_eq!(Backoff::new(Duration::ZERO, S).fail(1.0), Duration::ZERO);
    }
}
