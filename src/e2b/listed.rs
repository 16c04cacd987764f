//! Sandbox listings (`GET /v2/sandboxes`, `GET /sandboxes`) from the read view's entries:
//! each listed sandbox is serialized once per entry (kept with it, see `dispatch::forms`) and
//! a long listing is streamed in chunks instead of being built whole.

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use bytes::Bytes;

use super::listing::{Cursor, Order, beyond, finish};
use super::render;
use crate::dispatch::forms::{Form, Rendered, kept};
use crate::dispatch::read_view::Entry;
use crate::httpx::{BODY_CHUNK as CHUNK, chunked_reply};

/// The entry's listed sandbox as `render::listed` serializes it, rendered once per entry.
pub fn listed_form(e: &Entry) -> &Rendered {
    e.forms.get_or_render(Form::E2bListed, || Rendered {
        bytes: kept(serde_json::to_vec(&render::listed(&e.record)).unwrap_or_default()),
        mark: 0..0,
    })
}

/// The cursor key of an entry: start time in milliseconds and id.
fn cursor_key(e: &Entry) -> (i64, &str) {
    (e.record.claimed_at.timestamp_millis(), e.record.id.as_str())
}

/// One page of `oldest_first` (ordered by start time, then id) read in `order`: the entries
/// `keep` accepts after the cursor `after`, at most `limit`, and the cursor for the next page
/// when there is one. Only the page is copied; the view is walked, not sorted.
pub fn page(
    oldest_first: &[Entry],
    keep: impl Fn(&Entry) -> bool,
    order: Order,
    after: Option<&Cursor>,
    limit: usize,
) -> (Vec<Entry>, Option<String>) {
    let walk: Box<dyn Iterator<Item = &Entry>> = match order {
        Order::Asc => Box::new(oldest_first.iter()),
        Order::Desc => Box::new(oldest_first.iter().rev()),
    };
    let out: Vec<Entry> = walk
        .filter(|e| beyond(after, cursor_key(e), order) && keep(e))
        .take(limit.saturating_add(1))
        .cloned()
        .collect();
    finish(out, limit, cursor_key)
}

/// A JSON array of the entries' listed forms, in chunks of about `CHUNK` bytes.
struct ArrayChunks {
    entries: std::vec::IntoIter<Entry>,
    started: bool,
    /// Bytes per chunk: `CHUNK`, smaller in tests so that a few entries span several chunks.
    chunk: usize,
    done: bool,
}

impl Iterator for ArrayChunks {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        let mut out = Vec::with_capacity(self.chunk + self.chunk / 4);
        if !self.started {
            out.push(b'[');
        }
        while out.len() < self.chunk {
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

fn chunks(entries: Vec<Entry>, chunk: usize) -> ArrayChunks {
    ArrayChunks {
        entries: entries.into_iter(),
        started: false,
        chunk,
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
    chunked_reply(res, chunks(entries, CHUNK))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use chrono::{DateTime, TimeDelta, Utc};

    use super::*;
    use crate::model::{Phase, SandboxRecord};

    fn entry(i: usize, at: i64) -> Entry {
        let t0 = DateTime::<Utc>::from_timestamp(1_790_000_000, 0).unwrap_or_default();
        let mut metadata = std::collections::BTreeMap::new();
        metadata.insert("user".to_string(), format!("u\"{i}é"));
        metadata.insert("k8s.spec".to_string(), "{}".into());
        let r = SandboxRecord {
            claimed_at: t0 + TimeDelta::seconds(at),
            deadline: t0 + TimeDelta::seconds(600),
            phase: if i.is_multiple_of(2) {
                Phase::Running
            } else {
                Phase::Paused
            },
            metadata,
            cpu_count: 2,
            memory_bytes: 1 << 30,
            ..SandboxRecord::fixture(&format!("sb_{i:016x}"), &format!("default/box-{i}"))
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
            let parts: Vec<Bytes> = chunks(entries.clone(), 8 * 1024).collect();
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
    fn pages_follow_cursors_like_the_generic_pager() {
        // Oldest first, with start times shared by several entries.
        let all: Vec<Entry> = (0..23).map(|i| entry(i, (i / 3) as i64)).collect();
        let keep = |e: &Entry| e.revision % 4 != 1;
        for order in [Order::Asc, Order::Desc] {
            let mut ordered: Vec<Entry> = all.iter().filter(|e| keep(e)).cloned().collect();
            if order == Order::Desc {
                ordered.reverse();
            }
            let mut after: Option<Cursor> = None;
            loop {
                let (mine, next) = page(&all, keep, order, after.as_ref(), 4);
                let (theirs, their_next) = crate::e2b::listing::page(
                    ordered.clone(),
                    cursor_key,
                    order,
                    after.as_ref(),
                    4,
                );
                let ids = |v: &[Entry]| v.iter().map(|e| e.revision).collect::<Vec<_>>();
                assert_eq!(ids(&mine), ids(&theirs), "{order:?} after {after:?}");
                assert_eq!(next, their_next);
                match next {
                    Some(t) => after = Some(Cursor::decode(&t).expect("a cursor")),
                    None => break,
                }
            }
        }
        let (first, _) = page(&all, |_| true, Order::Desc, None, 2);
        let ids: Vec<u64> = first.iter().map(|e| e.revision).collect();
        assert_eq!(ids, [22, 21], "newest first");
        let (none, next) = page(&all, |_| false, Order::Asc, None, 5);
        assert!(none.is_empty() && next.is_none());
    }
}
