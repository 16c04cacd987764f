//! How envd words a process's end and reads the stream headers: the end event's `status` is
//! Go's `ProcessState.String()` (`exit status 1`, `signal: killed`), keepalives follow the
//! `Keepalive-Ping-Interval` header (seconds; envd's default is 90).

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use crate::envd::proto::process::process_event::EndEvent;

pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

/// Seconds from the header; anything unparseable or not positive is the default.
pub fn keepalive_interval(header: Option<&str>) -> Duration {
    match header.and_then(|h| h.trim().parse::<u64>().ok()) {
        // Capped so a huge value cannot overflow the timer.
        Some(s) if s > 0 => Duration::from_secs(s.min(365 * 24 * 3600)),
        _ => DEFAULT_KEEPALIVE,
    }
}

/// Go's names of Linux signals (`syscall.Signal.String()`).
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        1 => "hangup",
        2 => "interrupt",
        3 => "quit",
        4 => "illegal instruction",
        5 => "trace/breakpoint trap",
        6 => "aborted",
        7 => "bus error",
        8 => "floating point exception",
        9 => "killed",
        10 => "user defined signal 1",
        11 => "segmentation fault",
        12 => "user defined signal 2",
        13 => "broken pipe",
        14 => "alarm clock",
        15 => "terminated",
        16 => "stack fault",
        17 => "child exited",
        18 => "continued",
        19 => "stopped (signal)",
        20 => "stopped",
        21 => "stopped (tty input)",
        22 => "stopped (tty output)",
        23 => "urgent I/O condition",
        24 => "CPU time limit exceeded",
        25 => "file size limit exceeded",
        26 => "virtual timer expired",
        27 => "profiling timer expired",
        28 => "window changed",
        29 => "I/O possible",
        30 => "power failure",
        31 => "bad system call",
        n => return format!("signal {n}"),
    };
    name.to_string()
}

/// The end event for a wait status: `exitCode` is -1 when a signal ended the process (Go's
/// `ExitCode()`), `exited` only for a normal exit, `error` set whenever it did not exit 0.
pub fn end_event(status: ExitStatus) -> EndEvent {
    let (text, code, exited) = match (status.code(), status.signal()) {
        (Some(c), _) => (format!("exit status {c}"), c, true),
        (None, Some(s)) => {
            let mut t = format!("signal: {}", signal_name(s));
            if status.core_dumped() {
                t.push_str(" (core dumped)");
            }
            (t, -1, false)
        }
        (None, None) => ("unknown".to_string(), -1, false),
    };
    let error = (!(exited && code == 0)).then(|| text.clone());
    EndEvent {
        exit_code: code,
        exited,
        status: text,
        error,
        ..Default::default()
    }
}

/// The end event when waiting itself failed.
pub fn failed_end(why: &str) -> EndEvent {
    EndEvent {
        exit_code: -1,
        exited: false,
        status: "unknown".into(),
        error: Some(why.to_string()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_strings_as_envd_prints_them() {
        let ok = end_event(ExitStatus::from_raw(0));
        assert_eq!(
            (ok.exit_code, ok.exited, ok.status.as_str()),
            (0, true, "exit status 0")
        );
        assert_eq!(ok.error, None);
        let one = end_event(ExitStatus::from_raw(1 << 8));
        assert_eq!((one.exit_code, one.status.as_str()), (1, "exit status 1"));
        assert_eq!(one.error.as_deref(), Some("exit status 1"));
        let killed = end_event(ExitStatus::from_raw(9));
        assert_eq!(
            (killed.exit_code, killed.exited, killed.status.as_str()),
            (-1, false, "signal: killed")
        );
        let term = end_event(ExitStatus::from_raw(15));
        assert_eq!(term.status, "signal: terminated");
        let core = end_event(ExitStatus::from_raw(11 | 0x80));
        assert_eq!(core.status, "signal: segmentation fault (core dumped)");
        assert_eq!(signal_name(64), "signal 64");
    }

    #[test]
    fn keepalive_header_parsing() {
        assert_eq!(keepalive_interval(Some("50")), Duration::from_secs(50));
        assert_eq!(keepalive_interval(Some(" 2 ")), Duration::from_secs(2));
        assert_eq!(keepalive_interval(Some("0")), DEFAULT_KEEPALIVE);
        assert_eq!(keepalive_interval(Some("-5")), DEFAULT_KEEPALIVE);
        assert_eq!(keepalive_interval(Some("soon")), DEFAULT_KEEPALIVE);
        assert_eq!(keepalive_interval(None), DEFAULT_KEEPALIVE);
        assert_eq!(
            keepalive_interval(Some("99999999999999")),
            Duration::from_secs(365 * 24 * 3600)
        );
    }
}
