//! Streamed list bodies: a `SandboxList` or a `Table` written in chunks from each entry's
//! cached object form, so that listing 50,000 sandboxes neither serializes 50,000 objects
//! again nor holds the whole body at once.

use std::ops::Range;
use std::sync::Arc;

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::ListSnapshot;
use super::objects::{self, ListMeta, NumStr};
use super::table;

use crate::httpx::{BODY_CHUNK as CHUNK, chunked_reply};

/// What a list body holds.
#[derive(Debug, Clone, Copy)]
pub enum Shape {
    /// A `SandboxList` of objects.
    Objects,
    /// A `meta.k8s.io/v1` Table, with ages as of `now`.
    Table { now: DateTime<Utc> },
}

/// One page of a list snapshot, as an iterator of body chunks (the list's head, its items in
/// groups of about `CHUNK` bytes, the closing brackets).
pub struct Chunks {
    snapshot: Arc<ListSnapshot>,
    items: Range<usize>,
    next: usize,
    head: Option<Vec<u8>>,
    shape: Shape,
    /// Bytes per chunk: `CHUNK`, smaller in tests so that a few objects span several chunks.
    chunk: usize,
    done: bool,
}

impl Chunks {
    /// `range` of `snapshot` (clamped to it), with the list metadata given.
    pub fn new(
        snapshot: Arc<ListSnapshot>,
        range: Range<usize>,
        shape: Shape,
        continue_token: Option<String>,
        remaining: Option<i64>,
    ) -> Chunks {
        let end = range.end.min(snapshot.entries.len());
        let items = range.start.min(end)..end;
        let meta = ListMeta {
            resource_version: NumStr(snapshot.revision),
            continue_token,
            remaining_item_count: remaining,
        };
        let mut head = Vec::with_capacity(CHUNK + CHUNK / 4);
        match shape {
            Shape::Objects => objects::list_head(&mut head, &meta),
            Shape::Table { .. } => table::head(&mut head, &meta),
        }
        Chunks {
            snapshot,
            next: items.start,
            items,
            head: Some(head),
            shape,
            chunk: CHUNK,
            done: false,
        }
    }

    #[cfg(test)]
    fn in_chunks_of(self, chunk: usize) -> Chunks {
        Chunks { chunk, ..self }
    }
}

impl Iterator for Chunks {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        let mut out = self
            .head
            .take()
            .unwrap_or_else(|| Vec::with_capacity(self.chunk + self.chunk / 4));
        while self.next < self.items.end && out.len() < self.chunk {
            if self.next > self.items.start {
                out.push(b',');
            }
            let e = &self.snapshot.entries[self.next];
            match self.shape {
                Shape::Objects => out.extend_from_slice(&objects::object_form(e).bytes),
                Shape::Table { now } => table::write_row(&mut out, e, now),
            }
            self.next += 1;
        }
        if self.next >= self.items.end {
            out.extend_from_slice(b"]}");
            self.done = true;
        }
        Some(Bytes::from(out))
    }
}

/// A 200 reply with the list (see `httpx::chunked_reply`).
pub fn reply(chunks: Chunks) -> HttpResponse {
    let mut res = HttpResponse::build(StatusCode::OK);
    res.content_type("application/json");
    chunked_reply(res, chunks)
}

/// The whole body at once (tests, and the bench's side-by-side).
pub fn collect(chunks: Chunks) -> Vec<u8> {
    let mut out = Vec::new();
    for c in chunks {
        out.extend_from_slice(&c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::read_view::Entry;
    use crate::model::{Phase, SandboxRecord};
    use actix_web::body::MessageBody;

    fn rec(i: usize) -> SandboxRecord {
        let t0 = DateTime::<Utc>::from_timestamp(1_790_000_000, 0).unwrap_or_default();
        let mut metadata = std::collections::BTreeMap::new();
        metadata.insert("user".to_string(), format!("u\"{i}\\é"));
        if i.is_multiple_of(3) {
            metadata.insert(format!("{}team", objects::LABEL_PREFIX), "blue".into());
        }
        if i.is_multiple_of(4) {
            metadata.insert(
                super::super::stored::SPEC_KEY.to_string(),
                r#"{"podTemplate":{"spec":{"containers":[{"name":"m","image":"base"}]}},"shutdownTime":"2030-01-01T00:00:00Z"}"#.into(),
            );
        }
        let claim_ref = if i.is_multiple_of(5) {
            format!("ns-{}/sb_{i:016x}", i % 2)
        } else {
            format!("ns-{}/box-{i}", i % 2)
        };
        SandboxRecord {
            claimed_at: t0 - chrono::TimeDelta::seconds(i as i64 * 977),
            deadline: t0 + chrono::TimeDelta::seconds(600),
            phase: if i.is_multiple_of(2) {
                Phase::Running
            } else {
                Phase::Paused
            },
            address: if i.is_multiple_of(7) {
                String::new()
            } else {
                format!("10.0.0.{i}:49983")
            },
            metadata,
            node: format!("node-{}", i % 3),
            memory_bytes: 1 << 29,
            ..SandboxRecord::fixture(&format!("sb_{i:016x}"), &claim_ref)
        }
    }

    /// A chunk size that splits the tests' lists into many chunks.
    const SMALL: usize = 8 * 1024;

    fn snapshot(n: usize) -> Arc<ListSnapshot> {
        Arc::new(ListSnapshot {
            entries: (0..n)
                .map(|i| Entry::new(Arc::new(rec(i)), 1000 + i as u64))
                .collect(),
            revision: 5000,
        })
    }

    #[test]
    fn streamed_lists_are_the_plain_serialization_byte_for_byte() {
        // Enough objects for several chunks, and the pages of a paginated list.
        let snap = snapshot(300);
        let now = DateTime::<Utc>::from_timestamp(1_790_000_100, 0).unwrap_or_default();
        for (range, token, remaining) in [
            (0..300, None, None),
            (0..7, Some("abc".to_string()), Some(293)),
            (7..300, None, None),
            (300..300, None, None),
        ] {
            let page = &snap.entries[range.clone()];
            let chunks = Chunks::new(
                snap.clone(),
                range.clone(),
                Shape::Objects,
                token.clone(),
                remaining,
            )
            .in_chunks_of(SMALL);
            let streamed = collect(chunks);
            let plain = objects::list(page, snap.revision, token.clone(), remaining);
            assert_eq!(
                String::from_utf8_lossy(&streamed),
                String::from_utf8_lossy(&plain),
                "objects {range:?}"
            );
            let chunks = Chunks::new(
                snap.clone(),
                range.clone(),
                Shape::Table { now },
                token.clone(),
                remaining,
            )
            .in_chunks_of(SMALL);
            let streamed = collect(chunks);
            let plain = table::table_at(page, snap.revision, token, remaining, now);
            assert_eq!(
                String::from_utf8_lossy(&streamed),
                String::from_utf8_lossy(&plain),
                "table {range:?}"
            );
            let v: serde_json::Value = serde_json::from_slice(&streamed).expect("valid JSON");
            assert_eq!(v["rows"].as_array().map(Vec::len), Some(range.len()));
        }
    }

    #[actix_web::test]
    async fn a_reply_made_ahead_carries_every_chunk_in_order() {
        let snap = snapshot(400);
        let chunks = || Chunks::new(snap.clone(), 0..400, Shape::Objects, None, None);
        let res = reply(chunks().in_chunks_of(SMALL));
        assert_eq!(
            res.body().size(),
            actix_web::body::BodySize::Stream,
            "many chunks are streamed"
        );
        let sent = actix_web::body::to_bytes(res.into_body()).await;
        let sent = sent.map_err(|e| e.to_string()).expect("the body is whole");
        assert_eq!(&sent[..], &collect(chunks())[..]);
    }

    #[test]
    fn large_lists_come_in_bounded_chunks() {
        let snap = snapshot(400);
        let chunks: Vec<Bytes> = Chunks::new(snap.clone(), 0..400, Shape::Objects, None, None)
            .in_chunks_of(SMALL)
            .collect();
        assert!(chunks.len() > 2, "{} chunks", chunks.len());
        let largest = chunks.iter().map(Bytes::len).max().unwrap_or(0);
        let object = objects::object_form(&snap.entries[0]).bytes.len();
        assert!(
            largest < SMALL + 2 * object + 16,
            "a chunk of {largest} bytes"
        );
        // A page well under `CHUNK` is a single chunk, which `reply` sends with its length.
        let mut one = Chunks::new(snap, 0..400, Shape::Objects, None, None);
        assert!(one.next().is_some());
        assert!(one.next().is_none());
    }

    #[test]
    fn a_changed_record_is_listed_as_it_is_now() {
        let view = crate::dispatch::read_view::ReadView::new();
        view.replace("node-0", vec![rec(0), rec(3)], Utc::now());
        let list = |view: &crate::dispatch::read_view::ReadView| {
            let (entries, revision) = view.all_entries();
            let snap = Arc::new(ListSnapshot { entries, revision });
            let n = snap.entries.len();
            let body = collect(Chunks::new(snap, 0..n, Shape::Objects, None, None));
            serde_json::from_slice::<serde_json::Value>(&body).expect("valid JSON")
        };
        let before = list(&view);
        assert_eq!(before["items"][0]["spec"]["operatingMode"], "Running");
        let mut paused = rec(0);
        paused.phase = Phase::Paused;
        view.replace("node-0", vec![paused, rec(3)], Utc::now());
        let after = list(&view);
        assert_eq!(after["items"][0]["spec"]["operatingMode"], "Suspended");
        assert_ne!(
            before["items"][0]["metadata"]["resourceVersion"],
            after["items"][0]["metadata"]["resourceVersion"]
        );
        assert_eq!(
            before["items"][1], after["items"][1],
            "an unchanged record keeps its cached form"
        );
    }
}
