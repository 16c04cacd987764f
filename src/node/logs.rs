//! Sandbox logs on the node: each instance's ring, fed by the node's own lifecycle lines and by
//! the sandbox agent's stderr (envd's lines, each command's start and exit), read with bounds a
//! hostile sandbox cannot push past, and served to the log routes.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::model::logs::{LogEntry, LogLevel, LogQuery, LogRing, MAX_MESSAGE};

/// One instance's log, shared by its readers and writers.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<LogRing>>);

impl std::fmt::Debug for Logs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Logs")
    }
}

impl Logs {
    pub fn push(&self, entry: LogEntry) {
        if let Ok(mut ring) = self.0.lock() {
            ring.push(entry);
        }
    }

    /// A line of the node's own about the sandbox.
    pub fn note(&self, level: LogLevel, message: impl Into<String>) {
        self.push(LogEntry::new(level, message).field("source", "node"));
    }

    /// Keeps only the newest entries that fit in `bytes`.
    pub fn shrink_to(&self, bytes: usize) {
        if let Ok(mut ring) = self.0.lock() {
            ring.shrink_to(bytes);
        }
    }

    pub fn query(&self, q: &LogQuery) -> Vec<LogEntry> {
        self.0.lock().map(|r| r.query(q)).unwrap_or_default()
    }

    /// Reads the agent's stderr to its end into this log; with `echo`, also onto the node's
    /// stderr (`SANDBOX_GATEWAY_AGENT_STDERR`, for debugging).
    pub fn collect(&self, stream: impl AsyncRead + Unpin + Send + 'static, echo: bool) {
        let logs = self.clone();
        tokio::spawn(async move {
            read_lines(stream, |line| {
                let line = String::from_utf8_lossy(line);
                if echo {
                    eprintln!("{line}");
                }
                if !line.trim().is_empty() {
                    logs.push(parse_line(&line));
                }
            })
            .await
        });
    }
}

/// Splits a stream into lines of at most `MAX_MESSAGE` bytes; the rest of a longer line is
/// dropped, so a sandbox writing without newlines costs the node one buffer, not memory
/// without end.
async fn read_lines(mut r: impl AsyncRead + Unpin, mut each: impl FnMut(&[u8])) {
    let mut line: Vec<u8> = Vec::with_capacity(256);
    let mut overlong = false;
    let mut buf = [0u8; 8192];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for &b in &buf[..n] {
            if b == b'\n' {
                each(&line);
                line.clear();
                overlong = false;
            } else if line.len() < MAX_MESSAGE {
                line.push(b);
            } else if !overlong {
                overlong = true;
            }
        }
    }
    if !line.is_empty() {
        each(&line);
    }
}

/// Reads a line the agent's log format wrote (`LEVEL message key=value…`, see `main`); any
/// other line is kept whole at info level.
pub fn parse_line(line: &str) -> LogEntry {
    let trimmed = line.trim();
    if let Some((first, rest)) = trimmed.split_once(char::is_whitespace)
        && first.len() <= 5
        && first.chars().all(|c| c.is_ascii_uppercase())
        && let Ok(level) = LogLevel::parse(first)
    {
        return LogEntry::new(level, rest.trim_start()).field("source", "agent");
    }
    LogEntry::new(LogLevel::Info, trimmed).field("source", "agent")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_lines_carry_their_level() {
        let e = parse_line(" INFO process exited pid=7 exit_code=1");
        assert_eq!(e.level, LogLevel::Info);
        assert_eq!(e.message, "process exited pid=7 exit_code=1");
        assert_eq!(e.fields["source"], "agent");
        assert_eq!(parse_line("WARN x").level, LogLevel::Warn);
        assert_eq!(parse_line("ERROR boom").level, LogLevel::Error);
        let plain = parse_line("sandbox init: no such file");
        assert_eq!(
            (plain.level, plain.message.as_str()),
            (LogLevel::Info, "sandbox init: no such file")
        );
        assert_eq!(parse_line("LOUD x").message, "LOUD x");
    }

    #[tokio::test]
    async fn lines_are_bounded() {
        let mut input = b"short\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', MAX_MESSAGE * 3));
        input.extend(b"\nlast");
        let mut seen = Vec::new();
        read_lines(&input[..], |l| seen.push(l.len())).await;
        assert_eq!(seen, [5, MAX_MESSAGE, 4]);
    }
}
