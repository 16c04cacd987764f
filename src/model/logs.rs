//! A sandbox's log: a bounded ring of entries on its node (the node's own lifecycle lines, the
//! sandbox agent's lines and each command's exit line), and the queries e2b's log routes ask.

use std::collections::{BTreeMap, VecDeque};

use chrono::{DateTime, Utc};

use super::{Error, Result};

/// Most entries a sandbox's ring keeps; older ones give way.
pub const RING_ENTRIES: usize = 2000;
/// Most bytes of messages and fields a ring keeps.
pub const RING_BYTES: usize = 512 * 1024;
/// Longest message kept; longer ones are cut (a sandbox writes what it likes).
pub const MAX_MESSAGE: usize = 4096;
/// Most entries one query returns.
pub const MAX_LIMIT: u32 = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }

    /// e2b's spellings, and tracing's (upper case, `trace`, `warning`).
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "trace" | "debug" => Ok(LogLevel::Debug),
            "info" => Ok(LogLevel::Info),
            "warn" | "warning" => Ok(LogLevel::Warn),
            "error" => Ok(LogLevel::Error),
            other => Err(Error::invalid(format!(
                "log level {other:?} is not one of debug, info, warn, error"
            ))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub at: DateTime<Utc>,
    pub level: LogLevel,
    pub message: String,
    pub fields: BTreeMap<String, String>,
}

impl LogEntry {
    pub fn new(level: LogLevel, message: impl Into<String>) -> Self {
        let mut message = message.into();
        cut(&mut message, MAX_MESSAGE);
        LogEntry {
            at: Utc::now(),
            level,
            message,
            fields: BTreeMap::new(),
        }
    }

    pub fn field(mut self, key: &str, value: impl Into<String>) -> Self {
        let mut value = value.into();
        cut(&mut value, MAX_MESSAGE);
        self.fields.insert(key.to_string(), value);
        self
    }

    fn bytes(&self) -> usize {
        self.message.len()
            + self
                .fields
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
    }
}

/// Cuts `s` to at most `max` bytes on a character boundary.
fn cut(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// Which entries a query wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogQuery {
    /// Forward: entries at or after this time; backward: at or before it.
    pub cursor: Option<DateTime<Utc>>,
    pub limit: u32,
    /// Oldest first from the cursor (forward) or newest first (backward).
    pub forward: bool,
    /// Entries at this level or above.
    pub min_level: Option<LogLevel>,
    /// Entries whose message contains this.
    pub search: Option<String>,
}

impl Default for LogQuery {
    fn default() -> Self {
        LogQuery {
            cursor: None,
            limit: MAX_LIMIT,
            forward: true,
            min_level: None,
            search: None,
        }
    }
}

#[derive(Debug, Default)]
pub struct LogRing {
    entries: VecDeque<LogEntry>,
    bytes: usize,
}

impl LogRing {
    pub fn push(&mut self, entry: LogEntry) {
        self.bytes += entry.bytes();
        self.entries.push_back(entry);
        while self.entries.len() > RING_ENTRIES || self.bytes > RING_BYTES {
            match self.entries.pop_front() {
                Some(old) => self.bytes -= old.bytes(),
                None => break,
            }
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Drops the oldest entries until what is left takes at most `bytes`.
    pub fn shrink_to(&mut self, bytes: usize) {
        while self.bytes > bytes {
            match self.entries.pop_front() {
                Some(old) => self.bytes -= old.bytes(),
                None => break,
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn query(&self, q: &LogQuery) -> Vec<LogEntry> {
        let wanted = |e: &&LogEntry| {
            q.min_level.is_none_or(|l| e.level >= l)
                && q.search.as_deref().is_none_or(|s| e.message.contains(s))
        };
        let limit = q.limit.min(MAX_LIMIT) as usize;
        if q.forward {
            self.entries
                .iter()
                .filter(|e| q.cursor.is_none_or(|c| e.at >= c))
                .filter(wanted)
                .take(limit)
                .cloned()
                .collect()
        } else {
            self.entries
                .iter()
                .rev()
                .filter(|e| q.cursor.is_none_or(|c| e.at <= c))
                .filter(wanted)
                .take(limit)
                .cloned()
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64, level: LogLevel, msg: &str) -> LogEntry {
        LogEntry {
            at: DateTime::from_timestamp_millis(ms).unwrap(),
            level,
            message: msg.into(),
            fields: BTreeMap::new(),
        }
    }

    #[test]
    fn the_ring_is_bounded_by_entries_and_bytes() {
        let mut r = LogRing::default();
        for i in 0..RING_ENTRIES + 10 {
            r.push(at(i as i64, LogLevel::Info, "x"));
        }
        assert_eq!(r.len(), RING_ENTRIES);
        assert_eq!(r.query(&LogQuery::default())[0].message, "x");
        assert_eq!(
            r.query(&LogQuery::default())[0].at.timestamp_millis(),
            10,
            "the oldest gave way"
        );
        let mut r = LogRing::default();
        for _ in 0..(RING_BYTES / MAX_MESSAGE) * 2 {
            r.push(LogEntry::new(LogLevel::Info, "y".repeat(MAX_MESSAGE * 3)));
        }
        assert!(r.bytes <= RING_BYTES && r.len() == RING_BYTES / MAX_MESSAGE);
        assert_eq!(r.query(&LogQuery::default())[0].message.len(), MAX_MESSAGE);
        let mut long = "é".repeat(MAX_MESSAGE);
        cut(&mut long, MAX_MESSAGE - 1);
        assert!(long.len() < MAX_MESSAGE && long.chars().all(|c| c == 'é'));
    }

    #[test]
    fn queries_follow_cursor_direction_level_and_search() {
        let mut r = LogRing::default();
        r.push(at(1, LogLevel::Debug, "boot"));
        r.push(at(2, LogLevel::Info, "started echo"));
        r.push(at(3, LogLevel::Warn, "exited 1"));
        r.push(at(4, LogLevel::Info, "started ls"));
        let msgs = |q: LogQuery| {
            r.query(&q)
                .into_iter()
                .map(|e| e.message)
                .collect::<Vec<_>>()
        };
        assert_eq!(msgs(LogQuery::default()).len(), 4);
        let from = |ms| Some(DateTime::from_timestamp_millis(ms).unwrap());
        let q = LogQuery {
            cursor: from(2),
            limit: 2,
            ..Default::default()
        };
        assert_eq!(msgs(q), ["started echo", "exited 1"]);
        let q = LogQuery {
            cursor: from(3),
            forward: false,
            ..Default::default()
        };
        assert_eq!(msgs(q), ["exited 1", "started echo", "boot"]);
        let q = LogQuery {
            min_level: Some(LogLevel::Info),
            search: Some("started".into()),
            ..Default::default()
        };
        assert_eq!(msgs(q), ["started echo", "started ls"]);
        let q = LogQuery {
            min_level: Some(LogLevel::Warn),
            ..Default::default()
        };
        assert_eq!(msgs(q), ["exited 1"]);
    }

    #[test]
    fn levels_parse_both_spellings() {
        assert_eq!(LogLevel::parse("WARN").unwrap(), LogLevel::Warn);
        assert_eq!(LogLevel::parse("trace").unwrap(), LogLevel::Debug);
        assert!(LogLevel::parse("loud").is_err());
        assert!(LogLevel::Error > LogLevel::Info);
    }
}
