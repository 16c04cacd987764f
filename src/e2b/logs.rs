//! `GET /sandboxes/{id}/logs` (v1: `start`, `limit`) and `GET /v2/sandboxes/{id}/logs` (v2:
//! `cursor`, `limit`, `direction`, `level`, `search`): the sandbox's log ring on its node, in
//! e2b's shapes.

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::E2b;
use super::auth::Tenant;
use super::error::{ApiError, ApiResult, ErrorBody};
use super::render::ok_json;
use crate::model::logs::{LogEntry, LogLevel, LogQuery, MAX_LIMIT};

/// One entry as v2 (and v1's `logEntries`) carry it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SandboxLogEntry {
    pub timestamp: DateTime<Utc>,
    /// `debug`, `info`, `warn` or `error`.
    pub level: &'static str,
    pub message: String,
    pub fields: BTreeMap<String, String>,
}

/// One line as v1's `logs` carry it: `line` is a JSON object, as e2b's structured logs are
/// (`level`, `logger`, `message` and the entry's other fields), which the e2b CLI parses.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SandboxLog {
    pub timestamp: DateTime<Utc>,
    pub line: String,
}

/// Keys a v1 line never takes from an entry's fields: the line's own, and `timestamp`, which
/// the CLI would show in place of the entry's time.
const LINE_KEYS: [&str; 4] = ["level", "logger", "message", "timestamp"];

/// An entry as a v1 line: the e2b CLI (`e2b sandbox logs`) parses each line as a JSON object
/// with a `level` and filters by its `logger` (here the entry's source, `node` or `agent`),
/// and stopped at the first line in plain text.
fn line(e: &LogEntry) -> String {
    let mut o = serde_json::Map::new();
    o.insert("level".into(), e.level.as_str().into());
    if let Some(source) = e.fields.get("source") {
        o.insert("logger".into(), source.as_str().into());
    }
    o.insert("message".into(), e.message.as_str().into());
    for (k, v) in &e.fields {
        if k != "source" && !LINE_KEYS.contains(&k.as_str()) {
            o.insert(k.clone(), v.as_str().into());
        }
    }
    serde_json::Value::Object(o).to_string()
}

/// v1's answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxLogs {
    pub logs: Vec<SandboxLog>,
    pub log_entries: Vec<SandboxLogEntry>,
}

/// v2's answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SandboxLogsV2 {
    pub logs: Vec<SandboxLogEntry>,
}

fn entry(e: &LogEntry) -> SandboxLogEntry {
    SandboxLogEntry {
        timestamp: e.at,
        level: e.level.as_str(),
        message: e.message.clone(),
        fields: e.fields.clone(),
    }
}

/// The one value of query parameter `key`, if given.
fn param<'a>(q: &'a [(String, String)], key: &str) -> ApiResult<Option<&'a str>> {
    let mut values = q.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str());
    let first = values.next();
    if values.next().is_some() {
        return Err(ApiError::bad_request(format!(
            "{key} is given more than once"
        )));
    }
    Ok(first)
}

fn millis(q: &[(String, String)], key: &str) -> ApiResult<Option<DateTime<Utc>>> {
    param(q, key)?
        .map(|v| {
            v.parse::<i64>()
                .ok()
                .filter(|ms| *ms >= 0)
                .and_then(DateTime::from_timestamp_millis)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "{key} must be a time in milliseconds since the epoch, got {v:?}"
                    ))
                })
        })
        .transpose()
}

fn limit(q: &[(String, String)]) -> ApiResult<u32> {
    match param(q, "limit")? {
        None => Ok(MAX_LIMIT),
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                ApiError::bad_request(format!("limit must be 1..{MAX_LIMIT}, got {v:?}"))
            }),
    }
}

/// v1's query: entries from `start` on, oldest first.
pub fn v1_query(q: &[(String, String)]) -> ApiResult<LogQuery> {
    Ok(LogQuery {
        cursor: millis(q, "start")?,
        limit: limit(q)?,
        ..Default::default()
    })
}

/// v2's query: from `cursor` forward (default) or backward, at `level` or above, matching
/// `search`.
pub fn v2_query(q: &[(String, String)]) -> ApiResult<LogQuery> {
    let forward = match param(q, "direction")? {
        None | Some("forward") => true,
        Some("backward") => false,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "direction must be forward or backward, got {other:?}"
            )));
        }
    };
    let min_level = param(q, "level")?
        .map(|l| LogLevel::parse(l).map_err(|e| ApiError::bad_request(e.message)))
        .transpose()?;
    Ok(LogQuery {
        cursor: millis(q, "cursor")?,
        limit: limit(q)?,
        forward,
        min_level,
        search: param(q, "search")?
            .filter(|s| !s.is_empty())
            .map(str::to_string),
    })
}

/// A sandbox's log (v1). A sandbox that ended (killed, expired or died) keeps its log
/// readable to its team for 15 minutes, ending with the line that says why it ended.
#[utoipa::path(get, path = "/sandboxes/{sandboxID}/logs", tag = "sandboxes",
    params(("sandboxID" = String, Path), ("start" = Option<i64>, Query, description = "ms since the epoch"),
        ("limit" = Option<u32>, Query)),
    responses((status = 200, body = SandboxLogs), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn v1(
    e2b: web::Data<E2b>,
    tenant: Tenant,
    id: web::Path<String>,
    q: web::Query<Vec<(String, String)>>,
) -> ApiResult<HttpResponse> {
    let query = v1_query(&q)?;
    let entries = e2b.dispatcher.logs(tenant.scope(), &id, &query).await?;
    let body = SandboxLogs {
        logs: entries
            .iter()
            .map(|e| SandboxLog {
                timestamp: e.at,
                line: line(e),
            })
            .collect(),
        log_entries: entries.iter().map(entry).collect(),
    };
    Ok(ok_json(StatusCode::OK, &body))
}

/// A sandbox's log (v2), paged by cursor. A sandbox that ended keeps its log readable to its
/// team for 15 minutes, ending with the line that says why it ended.
#[utoipa::path(get, path = "/v2/sandboxes/{sandboxID}/logs", tag = "sandboxes",
    params(("sandboxID" = String, Path), ("cursor" = Option<i64>, Query, description = "ms since the epoch"),
        ("limit" = Option<u32>, Query), ("direction" = Option<String>, Query, description = "forward or backward"),
        ("level" = Option<String>, Query), ("search" = Option<String>, Query)),
    responses((status = 200, body = SandboxLogsV2), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn v2(
    e2b: web::Data<E2b>,
    tenant: Tenant,
    id: web::Path<String>,
    q: web::Query<Vec<(String, String)>>,
) -> ApiResult<HttpResponse> {
    let query = v2_query(&q)?;
    let entries = e2b.dispatcher.logs(tenant.scope(), &id, &query).await?;
    let body = SandboxLogsV2 {
        logs: entries.iter().map(entry).collect(),
    };
    Ok(ok_json(StatusCode::OK, &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn v2_queries_read_every_parameter() {
        let d = v2_query(&q(&[])).unwrap();
        assert_eq!(d, LogQuery::default());
        let full = v2_query(&q(&[
            ("cursor", "1700000000000"),
            ("limit", "5"),
            ("direction", "backward"),
            ("level", "warn"),
            ("search", "exited"),
        ]))
        .unwrap();
        assert_eq!(full.cursor.unwrap().timestamp_millis(), 1_700_000_000_000);
        assert_eq!(
            (
                full.limit,
                full.forward,
                full.min_level,
                full.search.as_deref()
            ),
            (5, false, Some(LogLevel::Warn), Some("exited"))
        );
        for bad in [
            &[("cursor", "soon")][..],
            &[("cursor", "-1")],
            &[("limit", "0")],
            &[("limit", "1001")],
            &[("direction", "sideways")],
            &[("level", "loud")],
            &[("limit", "1"), ("limit", "2")],
        ] {
            assert_eq!(
                v2_query(&q(bad)).unwrap_err().status.as_u16(),
                400,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn v1_lines_are_json_objects_with_a_level_and_a_logger() {
        let mut fields = BTreeMap::new();
        fields.insert("source".to_string(), "agent".to_string());
        fields.insert("pid".to_string(), "7".to_string());
        fields.insert("timestamp".to_string(), "not the time".to_string());
        let e = LogEntry {
            at: Utc::now(),
            level: LogLevel::Warn,
            message: "process exited \"x\"\n".to_string(),
            fields,
        };
        let v: serde_json::Value = serde_json::from_str(&line(&e)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "level": "warn",
                "logger": "agent",
                "message": "process exited \"x\"\n",
                "pid": "7",
            })
        );
        let bare = LogEntry {
            fields: BTreeMap::new(),
            ..e
        };
        let v: serde_json::Value = serde_json::from_str(&line(&bare)).unwrap();
        assert_eq!(v["level"], "warn");
        assert!(v.get("logger").is_none());
    }

    #[test]
    fn v1_queries_take_start_and_limit() {
        let v = v1_query(&q(&[("start", "5"), ("limit", "7")])).unwrap();
        assert_eq!((v.cursor.unwrap().timestamp_millis(), v.limit), (5, 7));
        assert!(v.forward);
        assert!(v1_query(&q(&[("start", "x")])).is_err());
    }
}
