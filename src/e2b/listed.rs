//! Sandbox listings (`GET /v2/sandboxes`, `GET /sandboxes`) from the read view's entries:
//! each listed sandbox is serialized once per entry (kept with it, see `dispatch::forms`) and
//! a long listing is streamed in chunks instead of being built whole.

use std::cmp::Ordering;

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use bytes::Bytes;

use super::listing::Order;
use super::render;
use crate::dispatch::forms::{Form, Rendered};
use crate::dispatch::read_view::Entry;

/// Bytes gathered before a chunk is handed to the connection.
const CHUNK: usize = 64 * 1024;

/// The entry's listed sandbox as `render::listed` serializes it, rendered once per entry.
pub fn listed_form(e: &Entry) -> &Rendered {
    e.forms.get_or_render(Form::E2bListed, || Rendered {
        bytes: Bytes::from(serde_json::to_vec(&render::listed(&e.record)).unwrap_or_default()),
        mark: 0..0,
    })
}

/// Orders entries by (start time, id), oldest first for `Asc`, newest first for `Desc`,
/// comparing in place (no key is copied per comparison).
pub fn order_by_start(entries: &mut [Entry], order: Order) {
    let by_start = |a: &Entry, b: &Entry| -> Ordering {
        (a.record.claimed_at, &a.record.id).cmp(&(b.record.claimed_at, &b.record.id))
    };
    match order {
        Order::Asc => entries.sort_unstable_by(by_start),
        Order::Desc => entries.sort_unstable_by(|a, b| by_start(b, a)),
    }
}

/// The cursor key of an entry: start time in milliseconds and id.
pub fn cursor_key(e: &Entry) -> (i64, &str) {
    (e.record.claimed_at.timestamp_millis(), e.record.id.as_str())
}

/// A JSON array of the entries' listed forms, in chunks of about `CHUNK` bytes.
struct ArrayChunks {
    entries: std::vec::IntoIter<Entry>,
    started: bool,
    done: bool,
}

impl Iterator for ArrayChunks {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        let mut out = Vec::with_capacity(CHUNK + CHUNK / 4);
        if !self.started {
            out.push(b'[');
        }
        while out.len() < CHUNK {
            let Some(e) = self.entries.next() else {
                out.push(b']');
                self.done = true;
                break;
            };
            if self.started {
                out.push(b',');
            }
            self.started = true;
            out.extend_from_slice(&listed_form(&e).bytes);
        }
        Some(Bytes::from(out))
    }
}

fn chunks(entries: Vec<Entry>) -> ArrayChunks {
    ArrayChunks {
        entries: entries.into_iter(),
        started: false,
        done: false,
    }
}

/// A 200 reply with the listed sandboxes as a JSON array (one sized body when it fits one
/// chunk, else streamed); `next` becomes the `X-Next-Token` header.
pub fn reply(entries: Vec<Entry>, next: Option<String>) -> HttpResponse {
    let mut res = HttpResponse::build(StatusCode::OK);
    res.content_type("application/json");
    if let Some(t) = next {
        res.insert_header(("X-Next-Token", t));
    }
    let mut chunks = chunks(entries);
    let first = chunks.next().unwrap_or_default();
    if chunks.done {
        return res.body(first);
    }
    let body = std::iter::once(first)
        .chain(chunks)
        .map(Ok::<_, std::io::Error>);
    res.streaming(futures::stream::iter(body))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use chrono::{DateTime, TimeDelta, Utc};

    use super::*;
    use crate::model::{Phase, PoolKey, SandboxRecord};

    fn entry(i: usize, at: i64) -> Entry {
        let t0 = DateTime::<Utc>::from_timestamp(1_790_000_000, 0).unwrap_or_default();
        let mut metadata = std::collections::BTreeMap::new();
        metadata.insert("user".to_string(), format!("u\"{i}é"));
        metadata.insert("k8s.spec".to_string(), "{}".into());
        let r = SandboxRecord {
            id: format!("sb_{i:016x}"),
            token: String::new(),
            key: PoolKey::base(),
            claim_ref: format!("default/box-{i}"),
            claimed_at: t0 + TimeDelta::seconds(at),
            deadline: t0 + TimeDelta::seconds(600),
            phase: if i % 2 == 0 {
                Phase::Running
            } else {
                Phase::Paused
            },
            address: String::new(),
            metadata,
            env_vars: Default::default(),
            from_checkpoint: None,
            forked_from: None,
            node: "n1".into(),
            cpu_count: 2,
            memory_bytes: 1 << 30,
            state_dir: String::new(),
            disk_bytes: 0,
            lifecycle: Default::default(),
            lease_seconds: 0,
            paused: None,
        };
        Entry::new(Arc::new(r), i as u64)
    }

    #[test]
    fn streamed_listing_is_the_plain_serialization() {
        for n in [0, 1, 3, 400] {
            let entries: Vec<Entry> = (0..n).map(|i| entry(i, i as i64)).collect();
            let plain = serde_json::to_vec(
                &entries
                    .iter()
                    .map(|e| render::listed(&e.record))
                    .collect::<Vec<_>>(),
            )
            .unwrap_or_default();
            let parts: Vec<Bytes> = chunks(entries.clone()).collect();
            assert_eq!(
                parts.len() > 1,
                n == 400,
                "{n} entries in {} chunks",
                parts.len()
            );
            let streamed: Vec<u8> = parts.concat();
            assert_eq!(
                String::from_utf8_lossy(&streamed),
                String::from_utf8_lossy(&plain)
            );
            // Listing again reuses what the first listing rendered.
            if let Some(e) = entries.first() {
                assert!(e.forms.get(Form::E2bListed).is_some());
            }
        }
    }

    #[test]
    fn order_is_by_start_then_id() {
        let mut es = vec![entry(3, 5), entry(1, 5), entry(2, 1)];
        order_by_start(&mut es, Order::Asc);
        let ids: Vec<usize> = es.iter().map(|e| e.revision as usize).collect();
        assert_eq!(ids, [2, 1, 3]);
        order_by_start(&mut es, Order::Desc);
        let ids: Vec<usize> = es.iter().map(|e| e.revision as usize).collect();
        assert_eq!(ids, [3, 1, 2]);
        assert_eq!(cursor_key(&es[2]).1, "sb_0000000000000002");
    }
}
