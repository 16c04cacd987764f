//! Watches: newline-delimited `WatchEvent`s from the read view. `resourceVersion` unset or "0"
//! starts with ADDED for every current match; N resumes after N (410 Expired when the view no
//! longer remembers N); bookmarks only when asked; `timeoutSeconds` ends the stream cleanly.
//! A watch pinned to one name in a namespace starts from a live lookup, like Get.

use std::sync::Arc;
use std::time::Duration;

use actix_web::HttpResponse;
use actix_web::web::Bytes;
use serde_json::json;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use super::objects;
use super::sandboxes::param;
use super::selectors::{FieldSelector, LabelSelector};
use super::status::{KubeError, KubeResult};
use super::types::{API_VERSION, KIND};
use super::{Facade, ListSnapshot};
use crate::dispatch::read_view::{Entry, ViewEvent, ViewEventKind};
use crate::model::SandboxRecord;

type Tx = mpsc::Sender<Result<Bytes, std::io::Error>>;

struct Filter {
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn keeps(&self, r: &SandboxRecord) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| r.namespace() == ns)
            && super::sandboxes::selectable(r, &self.labels, &self.fields)
    }
}

fn event_line(kind: &str, r: &Arc<SandboxRecord>, revision: u64, table: bool) -> Bytes {
    let object = if table {
        let entry = Entry::new(r.clone(), revision);
        super::table::table(std::slice::from_ref(&entry), revision, None, None)
    } else {
        serde_json::to_vec(&objects::sandbox(r, revision)).unwrap_or_default()
    };
    let mut line = Vec::with_capacity(object.len() + 32);
    line.extend_from_slice(b"{\"type\":\"");
    line.extend_from_slice(kind.as_bytes());
    line.extend_from_slice(b"\",\"object\":");
    line.extend_from_slice(&object);
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
}

fn bookmark(revision: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": revision.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let line = json!({"type": "BOOKMARK", "object": {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta}});
    Bytes::from(format!("{line}\n"))
}

fn expired_line(message: &str) -> Bytes {
    let status = KubeError::expired(message).status();
    let line = json!({"type": "ERROR", "object": status});
    Bytes::from(format!("{line}\n"))
}

fn kind_name(k: ViewEventKind) -> &'static str {
    match k {
        ViewEventKind::Added => "ADDED",
        ViewEventKind::Modified => "MODIFIED",
        ViewEventKind::Deleted => "DELETED",
    }
}

/// How often a watch that asked for bookmarks gets one.
pub const BOOKMARK_EVERY: Duration = Duration::from_secs(60);

enum Start {
    /// Current state first (as ADDED), then changes after `snapshot.revision`.
    Initial(ListSnapshot),
    /// Only changes after this revision.
    After(u64),
}

pub fn serve(
    facade: Arc<Facade>,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    table: bool,
    q: Vec<(String, String)>,
) -> KubeResult<HttpResponse> {
    let send_initial = param(&q, "sendInitialEvents") == Some("true");
    if send_initial && param(&q, "resourceVersionMatch") != Some("NotOlderThan") {
        return Err(KubeError::invalid(
            "",
            "resourceVersionMatch",
            "Forbidden: sendInitialEvents requires resourceVersionMatch=NotOlderThan",
        ));
    }
    let bookmarks = param(&q, "allowWatchBookmarks") == Some("true");
    let timeout = match param(&q, "timeoutSeconds") {
        None | Some("") => None,
        Some(t) => Some(Duration::from_secs(t.parse::<u64>().map_err(|_| {
            KubeError::bad_request(format!(
                "timeoutSeconds must be a non-negative integer, got {t:?}"
            ))
        })?)),
    };
    let rv = param(&q, "resourceVersion").unwrap_or("");
    let resume = match rv {
        "" | "0" => None,
        n => Some(n.parse::<u64>().map_err(|_| {
            KubeError::bad_request(format!(
                "resourceVersion {n:?} is not valid for this server"
            ))
        })?),
    };
    let filter = Filter {
        namespace,
        labels,
        fields,
    };
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    tokio::spawn(async move {
        let start = match resume {
            Some(n) if !send_initial => Start::After(n),
            _ => match facade
                .snapshot(filter.namespace.as_deref(), &filter.labels, &filter.fields)
                .await
            {
                Ok(s) => Start::Initial(s),
                Err(e) => {
                    let line = json!({"type": "ERROR", "object": e.status()});
                    let _ = tx.send(Ok(Bytes::from(format!("{line}\n")))).await;
                    return;
                }
            },
        };
        let work = stream(&facade, &filter, start, table, bookmarks, send_initial, &tx);
        let limit = async {
            match timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        let closing = facade.closing();
        tokio::select! {
            _ = work => {}
            _ = limit => {}
            _ = closing.cancelled() => {}
        }
    });
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .streaming(ReceiverStream::new(rx)))
}

async fn stream(
    facade: &Facade,
    filter: &Filter,
    start: Start,
    table: bool,
    periodic_bookmarks: bool,
    initial_end_bookmark: bool,
    tx: &Tx,
) {
    let view = facade.dispatcher.view();
    let from = match &start {
        Start::Initial(s) => s.revision,
        Start::After(n) => *n,
    };
    let (backlog, mut rx) = match view.watch(from) {
        Ok(w) => w,
        Err(expired) => {
            let msg = format!(
                "too old resource version: {from} ({})",
                expired.oldest.saturating_sub(1)
            );
            let _ = tx.send(Ok(expired_line(&msg))).await;
            return;
        }
    };
    if let Start::Initial(s) = &start {
        for e in s.entries.iter() {
            if tx
                .send(Ok(event_line("ADDED", &e.record, e.revision, table)))
                .await
                .is_err()
            {
                return;
            }
        }
        if initial_end_bookmark && tx.send(Ok(bookmark(s.revision, true))).await.is_err() {
            return;
        }
    }
    let mut last = from;
    let mut deliver = |ev: &ViewEvent| -> Option<Bytes> {
        if ev.revision <= last {
            return None;
        }
        last = ev.revision;
        let now = filter.keeps(&ev.sandbox);
        // A change that moves an object into or out of the selection is, for this watch, its
        // arrival or its departure.
        let kind = match ev.kind {
            ViewEventKind::Modified => {
                let before = ev.previous.as_ref().is_some_and(|p| filter.keeps(p));
                match (before, now) {
                    (true, true) => "MODIFIED",
                    (false, true) => "ADDED",
                    (true, false) => "DELETED",
                    (false, false) => return None,
                }
            }
            k if now => kind_name(k),
            _ => return None,
        };
        Some(event_line(kind, &ev.sandbox, ev.revision, table))
    };
    for ev in &backlog {
        if let Some(line) = deliver(ev)
            && tx.send(Ok(line)).await.is_err()
        {
            return;
        }
    }
    let mut ticker = tokio::time::interval(BOOKMARK_EVERY);
    ticker.tick().await;
    loop {
        tokio::select! {
            got = rx.recv() => match got {
                Ok(ev) => {
                    if let Some(line) = deliver(&ev)
                        && tx.send(Ok(line)).await.is_err()
                    {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // The watcher fell too far behind to be given every change: make it relist.
                    let _ = tx.send(Ok(expired_line("the watch fell behind; list again"))).await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = ticker.tick(), if periodic_bookmarks => {
                if tx.send(Ok(bookmark(view.revision(), false))).await.is_err() {
                    return;
                }
            }
            _ = tx.closed() => return,
        }
    }
}
