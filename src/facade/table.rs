//! `meta.k8s.io/v1` Tables of sandboxes for `kubectl get`: the columns, rows with their
//! `PartialObjectMetadata`, and ages rendered as the API server renders them.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::objects::{Items, ListMeta, MetaJson, NumStr, meta_json, name, ready, sized_buffer};
use crate::dispatch::forms::{Form, Rendered, kept};
use crate::dispatch::read_view::Entry;
use crate::model::SandboxRecord;

/// Go's `duration.HumanDuration`, as the API server renders ages in tables.
pub fn human_duration(d: chrono::TimeDelta) -> String {
    let mut out = String::new();
    let _ = write_human_duration(&mut out, d);
    out
}

/// `human_duration` written into `out`: a Table list writes one per row, into the chunk it
/// is making, without a `String` of its own for each.
fn write_human_duration(out: &mut impl std::fmt::Write, d: chrono::TimeDelta) -> std::fmt::Result {
    let seconds = d.num_seconds();
    if seconds < -1 {
        return out.write_str("<invalid>");
    }
    if seconds < 0 {
        return out.write_str("0s");
    }
    if seconds < 120 {
        return write!(out, "{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            write!(out, "{minutes}m")
        } else {
            write!(out, "{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return write!(out, "{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            write!(out, "{hours}h")
        } else {
            write!(out, "{hours}h{m}m")
        };
    }
    if hours < 48 {
        return write!(out, "{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            write!(out, "{}d", hours / 24)
        } else {
            write!(out, "{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return write!(out, "{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            write!(out, "{}y", hours / 24 / 365)
        } else {
            write!(out, "{}y{dy}d", hours / 24 / 365)
        };
    }
    write!(out, "{}y", hours / 24 / 365)
}

/// A byte buffer as a `fmt::Write`: each piece of text appended as its UTF-8 bytes.
struct Appended<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Appended<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Column {
    name: &'static str,
    #[serde(rename = "type")]
    ty: &'static str,
    format: &'static str,
    description: &'static str,
    priority: i32,
}

const COLUMNS: [Column; 6] = [
    Column {
        name: "Name",
        ty: "string",
        format: "name",
        description: "Name must be unique within a namespace.",
        priority: 0,
    },
    Column {
        name: "Ready",
        ty: "string",
        format: "",
        description: "Ready condition status",
        priority: 0,
    },
    Column {
        name: "Reason",
        ty: "string",
        format: "",
        description: "Ready condition reason",
        priority: 0,
    },
    Column {
        name: "Age",
        ty: "string",
        format: "",
        description: "Time since the sandbox was claimed",
        priority: 0,
    },
    Column {
        name: "Node",
        ty: "string",
        format: "",
        description: "The node that runs the sandbox",
        priority: 1,
    },
    Column {
        name: "Template",
        ty: "string",
        format: "",
        description: "The template the sandbox started from",
        priority: 1,
    },
];

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PartialObjectMetadata<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: MetaJson<'a>,
}

#[derive(Serialize)]
struct Row<'a> {
    cells: (
        Cow<'a, str>,
        &'static str,
        &'static str,
        String,
        &'a str,
        &'a str,
    ),
    object: PartialObjectMetadata<'a>,
}

fn row(r: &SandboxRecord, revision: u64, now: DateTime<Utc>) -> Row<'_> {
    let (ready, reason) = ready(r);
    Row {
        cells: (
            name(r),
            ready,
            reason,
            human_duration(now - r.claimed_at),
            &r.node,
            &r.key.template,
        ),
        object: PartialObjectMetadata {
            api_version: "meta.k8s.io/v1",
            kind: "PartialObjectMetadata",
            metadata: meta_json(r, revision),
        },
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TableOut<I> {
    api_version: &'static str,
    kind: &'static str,
    metadata: ListMeta,
    column_definitions: &'static [Column; 6],
    rows: I,
}

/// A `meta.k8s.io/v1` Table of `entries` as of `revision`, serialized whole into one buffer
/// (gets and watch events; lists are streamed by `list_body`).
pub fn table(
    entries: &[Entry],
    revision: u64,
    continue_token: Option<String>,
    remaining: Option<i64>,
) -> Vec<u8> {
    table_at(entries, revision, continue_token, remaining, Utc::now())
}

/// `table` with ages as of `now`.
pub(super) fn table_at(
    entries: &[Entry],
    revision: u64,
    continue_token: Option<String>,
    remaining: Option<i64>,
    now: DateTime<Utc>,
) -> Vec<u8> {
    let t = TableOut {
        api_version: "meta.k8s.io/v1",
        kind: "Table",
        metadata: ListMeta {
            resource_version: NumStr(revision),
            continue_token,
            remaining_item_count: remaining,
        },
        column_definitions: &COLUMNS,
        rows: Items {
            entries,
            each: |e: &Entry| row(&e.record, e.revision, now),
        },
    };
    let mut out = sized_buffer(
        entries.first().map(|e| row(&e.record, e.revision, now)),
        entries.len(),
    );
    let _ = serde_json::to_writer(&mut out, &t);
    out
}

/// The start of a Table, up to the opening of its rows.
pub(super) fn head(out: &mut Vec<u8>, meta: &ListMeta) {
    out.extend_from_slice(b"{\"apiVersion\":\"meta.k8s.io/v1\",\"kind\":\"Table\",\"metadata\":");
    let _ = serde_json::to_writer(&mut *out, meta);
    out.extend_from_slice(b",\"columnDefinitions\":");
    let _ = serde_json::to_writer(&mut *out, &COLUMNS);
    out.extend_from_slice(b",\"rows\":[");
}

/// An entry's row without its age, rendered once per entry (the age changes with the clock,
/// so it is written per request at `mark`).
fn row_form(e: &Entry) -> &Rendered {
    e.forms
        .get_or_render(Form::KubeRow, || render_row(&e.record, e.revision))
}

/// The bytes `row` serializes to, less the age cell's string, in compact JSON.
fn render_row(r: &SandboxRecord, revision: u64) -> Rendered {
    let (ready, reason) = ready(r);
    let mut out = Vec::with_capacity(768);
    out.extend_from_slice(b"{\"cells\":[");
    let _ = serde_json::to_writer(&mut out, &name(r));
    out.push(b',');
    let _ = serde_json::to_writer(&mut out, ready);
    out.push(b',');
    let _ = serde_json::to_writer(&mut out, reason);
    out.push(b',');
    let at = out.len();
    out.push(b',');
    let _ = serde_json::to_writer(&mut out, &r.node);
    out.push(b',');
    let _ = serde_json::to_writer(&mut out, &r.key.template);
    out.extend_from_slice(
        b"],\"object\":{\"apiVersion\":\"meta.k8s.io/v1\",\"kind\":\"PartialObjectMetadata\",\"metadata\":",
    );
    let _ = serde_json::to_writer(&mut out, &meta_json(r, revision));
    out.extend_from_slice(b"}}");
    Rendered {
        bytes: kept(out),
        mark: at..at,
    }
}

/// One row as `row` serializes it, with its age as of `now`.
pub(super) fn write_row(out: &mut Vec<u8>, e: &Entry, now: DateTime<Utc>) {
    let form = row_form(e);
    let at = form.mark.start.min(form.bytes.len());
    out.extend_from_slice(&form.bytes[..at]);
    // An age is digits, letters and `<>`: nothing JSON escapes.
    out.push(b'"');
    let _ = write_human_duration(&mut Appended(out), now - e.record.claimed_at);
    out.push(b'"');
    out.extend_from_slice(&form.bytes[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;

    #[test]
    fn ages_read_like_kubectls() {
        for (secs, want) in [
            (-5, "<invalid>"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (125, "2m5s"),
            (600, "10m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60 * 7, "3h7m"),
            (30 * 3600, "30h"),
            (3 * 86400 + 3600 * 2, "3d2h"),
            (40 * 86400, "40d"),
            (3 * 365 * 86400 + 86400, "3y1d"),
            (9 * 365 * 86400, "9y"),
        ] {
            assert_eq!(human_duration(TimeDelta::seconds(secs)), want, "{secs}");
        }
    }
}
