//! `Idempotency-Key` on create: a replay of the same request under the same key gets the same
//! sandbox; a different request under a used key is refused. Keys are remembered per tenant
//! for a day, in this gateway replica.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use moka::sync::Cache;
use sha2::{Digest, Sha256};

use super::error::{ApiError, ApiResult};
use super::wire;

const REMEMBER: Duration = Duration::from_secs(24 * 3600);
const CAPACITY: u64 = 100_000;

#[derive(Clone)]
pub enum Outcome {
    Created(wire::Sandbox),
    /// The create may or may not have claimed a sandbox; replays get the same answer.
    Failed(ApiError),
}

enum Slot {
    InProgress,
    Done(Outcome),
}

struct Entry {
    fingerprint: [u8; 32],
    slot: Mutex<Slot>,
}

pub struct Idempotency {
    entries: Cache<(String, String), Arc<Entry>>,
}

impl Default for Idempotency {
    fn default() -> Self {
        Idempotency {
            entries: Cache::builder()
                .max_capacity(CAPACITY)
                .time_to_live(REMEMBER)
                .build(),
        }
    }
}

/// What the handler does with a keyed request.
pub enum Begin {
    /// First use of the key: run the create and report with `finish`.
    Run(Ticket),
    /// A replay of a finished request.
    Replay(Outcome),
}

pub struct Ticket {
    key: (String, String),
    entry: Arc<Entry>,
}

pub fn validate(key: &str) -> ApiResult<()> {
    let ok = (1..=255).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "Idempotency-Key must be 1-255 characters of a-z, 0-9 and '-'",
        ))
    }
}

pub fn fingerprint(route: &str, body: &serde_json::Value) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(route.as_bytes());
    h.update([0]);
    // serde_json's maps are sorted, so equal requests serialize equally.
    h.update(body.to_string().as_bytes());
    h.finalize().into()
}

impl Idempotency {
    pub fn begin(&self, namespace: &str, key: &str, fingerprint: [u8; 32]) -> ApiResult<Begin> {
        let cache_key = (namespace.to_string(), key.to_string());
        let entry = self.entries.entry(cache_key.clone()).or_insert_with(|| {
            Arc::new(Entry {
                fingerprint,
                slot: Mutex::new(Slot::InProgress),
            })
        });
        let fresh = entry.is_fresh();
        let entry = entry.into_value();
        if entry.fingerprint != fingerprint {
            return Err(ApiError::new(
                actix_web::http::StatusCode::UNPROCESSABLE_ENTITY,
                format!("Idempotency-Key {key:?} was already used with a different request"),
            )
            .with_code("idempotency_request_mismatch"));
        }
        if fresh {
            return Ok(Begin::Run(Ticket {
                key: cache_key,
                entry,
            }));
        }
        let slot = entry.slot.lock().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Slot::Done(outcome) => Ok(Begin::Replay(outcome.clone())),
            Slot::InProgress => {
                let mut e = ApiError::conflict(format!(
                    "a request with Idempotency-Key {key:?} is still in progress"
                ))
                .with_code("idempotency_in_progress");
                e.retry_after = Some(1);
                Err(e)
            }
        }
    }

    /// Records how a keyed create ended. Failures that certainly claimed nothing free the key
    /// for a retry; anything else is remembered and replayed.
    pub fn finish(&self, ticket: Ticket, outcome: &ApiResult<wire::Sandbox>) {
        match outcome {
            Ok(sandbox) => {
                *ticket.entry.slot.lock().unwrap_or_else(|p| p.into_inner()) =
                    Slot::Done(Outcome::Created(sandbox.clone()));
            }
            Err(e) if e.should_retry == Some(false) => {
                *ticket.entry.slot.lock().unwrap_or_else(|p| p.into_inner()) =
                    Slot::Done(Outcome::Failed(e.clone()));
            }
            Err(_) => self.entries.invalidate(&ticket.key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb(id: &str) -> wire::Sandbox {
        wire::Sandbox {
            template_id: "base".into(),
            sandbox_id: id.into(),
            client_id: "n".into(),
            envd_version: "0.2.4".into(),
            envd_access_token: None,
            traffic_access_token: None,
            domain: None,
        }
    }

    #[test]
    fn replays_mismatches_and_retries() {
        let i = Idempotency::default();
        let a = fingerprint("/v2/sandboxes", &serde_json::json!({"templateID": "base"}));
        let b = fingerprint("/v2/sandboxes", &serde_json::json!({"templateID": "other"}));
        let Begin::Run(t) = i.begin("ns", "k1", a).unwrap() else {
            panic!("first use runs")
        };
        assert!(i.begin("ns", "k1", a).is_err(), "in progress");
        i.finish(t, &Ok(sb("sb-1")));
        match i.begin("ns", "k1", a).unwrap() {
            Begin::Replay(Outcome::Created(s)) => assert_eq!(s.sandbox_id, "sb-1"),
            _ => panic!("replay"),
        }
        assert_eq!(i.begin("ns", "k1", b).err().unwrap().status.as_u16(), 422);
        // Another tenant's key space is separate.
        assert!(matches!(i.begin("other", "k1", b).unwrap(), Begin::Run(_)));
        // A failure that claimed nothing frees the key.
        let Begin::Run(t) = i.begin("ns", "k2", a).unwrap() else {
            panic!()
        };
        i.finish(t, &Err(ApiError::bad_request("no")));
        assert!(matches!(i.begin("ns", "k2", a).unwrap(), Begin::Run(_)));
        assert!(validate("abc-123").is_ok());
        assert!(validate("ABC").is_err());
        assert!(validate("").is_err());
    }
}
