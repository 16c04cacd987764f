//! Lease rules: ttl 0 means the node default, anything larger is clamped to the node maximum.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasePolicy {
    pub default: Duration,
    pub max: Duration,
}

impl Default for LeasePolicy {
    fn default() -> Self {
        LeasePolicy {
            default: Duration::from_secs(300),
            max: Duration::from_secs(24 * 3600),
        }
    }
}

impl LeasePolicy {
    /// The lease granted for a requested ttl in seconds.
    pub fn grant(&self, ttl_seconds: u64) -> Duration {
        if ttl_seconds == 0 {
            self.default.min(self.max)
        } else {
            Duration::from_secs(ttl_seconds).min(self.max)
        }
    }
}

impl LeasePolicy {
    /// The deadline of a lease granted at `now` for `ttl_seconds`. A lease too long to
    /// represent ends at the latest representable time instead of failing.
    pub fn deadline(&self, now: DateTime<Utc>, ttl_seconds: u64) -> DateTime<Utc> {
        after(now, self.grant(ttl_seconds))
    }
}

/// `now + d`, or the latest representable time when that is too far.
pub fn after(now: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    TimeDelta::from_std(d)
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_maximums_do_not_overflow() {
        let p = LeasePolicy {
            default: Duration::from_secs(1),
            max: Duration::from_secs(u64::MAX),
        };
        assert_eq!(p.deadline(Utc::now(), u64::MAX), DateTime::<Utc>::MAX_UTC);
        let now = Utc::now();
        assert_eq!(p.deadline(now, 10), now + TimeDelta::seconds(10));
    }

    #[test]
    fn zero_is_default_and_large_is_clamped() {
        let p = LeasePolicy::default();
        assert_eq!(p.grant(0), Duration::from_secs(300));
        assert_eq!(p.grant(7), Duration::from_secs(7));
        assert_eq!(p.grant(999_999_999), Duration::from_secs(86_400));
        let tight = LeasePolicy {
            default: Duration::from_secs(600),
            max: Duration::from_secs(60),
        };
        assert_eq!(tight.grant(0), Duration::from_secs(60));
    }
}
