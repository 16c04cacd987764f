//! Listing parameters shared by `GET /v2/sandboxes` and `GET /snapshots`: filters, the SDK's
//! metadata encoding, and opaque page cursors.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};

use super::error::{ApiError, ApiResult};

pub const MAX_LIMIT: usize = 100;

/// Go's `url.QueryUnescape`: `%XX` escapes and `+` as space; a malformed escape is an error.
/// The first value of `name` in a query.
pub fn query_value<'a>(q: &'a [(String, String)], name: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

pub fn query_unescape(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The `metadata` filter as the SDKs send it (after the framework decoded the parameter once):
/// the whole string is unescaped, split into `k=v` pairs on `&`, and each part unescaped again.
pub fn parse_metadata(raw: &str) -> ApiResult<BTreeMap<String, String>> {
    let bad =
        || ApiError::bad_request("Error parsing metadata: expected key=value pairs joined by &");
    let whole = query_unescape(raw).ok_or_else(bad)?;
    let mut out = BTreeMap::new();
    for pair in whole.split('&').filter(|p| !p.is_empty()) {
        let parts: Vec<&str> = pair.split('=').collect();
        let [k, v] = parts.as_slice() else {
            return Err(bad());
        };
        out.insert(
            query_unescape(k).ok_or_else(bad)?,
            query_unescape(v).ok_or_else(bad)?,
        );
    }
    Ok(out)
}

pub fn parse_limit(raw: Option<&str>) -> ApiResult<usize> {
    match raw {
        None => Ok(MAX_LIMIT),
        Some(s) => match s.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            _ => Err(ApiError::bad_request(format!(
                "limit must be an integer between 1 and {MAX_LIMIT}, got {s:?}"
            ))),
        },
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    Asc,
    Desc,
}

pub fn parse_order(raw: Option<&str>) -> ApiResult<Order> {
    match raw {
        None | Some("desc") => Ok(Order::Desc),
        Some("asc") => Ok(Order::Asc),
        Some(o) => Err(ApiError::bad_request(format!(
            "order must be asc or desc, got {o:?}"
        ))),
    }
}

pub fn parse_time(name: &str, raw: &str) -> ApiResult<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(raw)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| ApiError::bad_request(format!("{name} must be an RFC 3339 time: {e}")))
}

/// A position in a listing sorted by (time, id): the last item of the previous page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub at_ms: i64,
    pub id: String,
}

impl Cursor {
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(format!("{}|{}", self.at_ms, self.id))
    }

    pub fn decode(token: &str) -> ApiResult<Cursor> {
        let bad = || ApiError::bad_request("Invalid next token");
        let bytes = URL_SAFE_NO_PAD
            .decode(token.trim_end_matches('='))
            .map_err(|_| bad())?;
        let text = String::from_utf8(bytes).map_err(|_| bad())?;
        let (at, id) = text.split_once('|').ok_or_else(bad)?;
        Ok(Cursor {
            at_ms: at.parse().map_err(|_| bad())?,
            id: id.to_string(),
        })
    }
}

/// Whether `key` (time, id) lies beyond the cursor `after` in `order`; with no cursor,
/// everything does.
pub fn beyond(after: Option<&Cursor>, key: (i64, &str), order: Order) -> bool {
    after.is_none_or(|c| {
        let c = (c.at_ms, c.id.as_str());
        match order {
            Order::Asc => key > c,
            Order::Desc => key < c,
        }
    })
}

/// A page from up to `limit + 1` items past the cursor: the first `limit`, and the cursor
/// for the next page when there was one more.
pub fn finish<T>(
    mut items: Vec<T>,
    limit: usize,
    key: impl Fn(&T) -> (i64, &str),
) -> (Vec<T>, Option<String>) {
    let more = items.len() > limit;
    items.truncate(limit);
    let next = more.then(|| items.last()).flatten().map(|t| {
        let (at_ms, id) = key(t);
        Cursor {
            at_ms,
            id: id.to_string(),
        }
        .encode()
    });
    (items, next)
}

/// One page of `items` (already sorted in `order` by (time, id)) after `after`, and the
/// cursor for the next page when there is one.
pub fn page<T>(
    items: Vec<T>,
    key: impl Fn(&T) -> (i64, &str),
    order: Order,
    after: Option<&Cursor>,
    limit: usize,
) -> (Vec<T>, Option<String>) {
    let rest: Vec<T> = items
        .into_iter()
        .filter(|t| beyond(after, key(t), order))
        .take(limit.saturating_add(1))
        .collect();
    finish(rest, limit, key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_as_the_python_sdk_encodes_it() {
        // {"user": "a b"} arrives as `metadata=user%3Da%252520b`; the framework decodes once.
        let m = parse_metadata("user=a%2520b").unwrap();
        assert_eq!(m.get("user").map(String::as_str), Some("a b"));
        let m = parse_metadata("k%253D1=v%25261&x=y").unwrap();
        assert_eq!(m.get("k=1").map(String::as_str), Some("v&1"));
        assert_eq!(m.get("x").map(String::as_str), Some("y"));
        assert!(parse_metadata("novalue").is_err());
        assert!(parse_metadata("a=b=c").is_err());
        assert!(parse_metadata("a=%zz").is_err());
    }

    #[test]
    fn pages_follow_cursors_in_both_orders() {
        let items: Vec<(i64, String)> = (0..7).map(|i| (i / 2, format!("id{i}"))).collect();
        fn key(t: &(i64, String)) -> (i64, &str) {
            (t.0, t.1.as_str())
        }
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let (p, next) = page(items.clone(), key, Order::Asc, after.as_ref(), 3);
            seen.extend(p);
            match next {
                Some(t) => after = Some(Cursor::decode(&t).unwrap()),
                None => break,
            }
        }
        assert_eq!(seen, items);
        let mut desc = items.clone();
        desc.reverse();
        let (p, next) = page(desc.clone(), key, Order::Desc, None, 4);
        assert_eq!(p, desc[..4]);
        let (p, next) = page(
            desc.clone(),
            key,
            Order::Desc,
            Some(&Cursor::decode(&next.unwrap()).unwrap()),
            4,
        );
        assert_eq!(p, desc[4..]);
        assert!(next.is_none(), "no token on the last page");
        assert!(Cursor::decode("!!!").is_err());
        assert!(parse_limit(Some("0")).is_err());
        assert!(parse_limit(Some("101")).is_err());
        assert_eq!(parse_limit(Some("5")).unwrap(), 5);
        assert!(parse_order(Some("up")).is_err());
    }
}
