//! Process life over raw HTTP: a command outlives the client that started it (as in envd), is
//! killed when its Start call's deadline passes, is reachable again by tag, takes stdin; and a
//! fork bomb under a pid limit does not take envd down.

#[path = "envd_harness.rs"]
mod harness;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use harness::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn listed(e: &Envd) -> Vec<Value> {
    let (st, v) = e.unary("process.Process/List", json!({})).await;
    assert_eq!(st, StatusCode::OK);
    v["processes"].as_array().cloned().unwrap_or_default()
}

async fn wait_for(what: &str, timeout: Duration, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_outlives_its_client_and_dies_with_its_deadline() {
    let e = Envd::start(&[]);
    let marker = e.agent.dir.path().join("survived");
    let script = format!("sleep 1; echo yes > {}", marker.display());
    // Start, read the first message, then go away.
    let res = e
        .req(reqwest::Method::POST, "/process.Process/Start")
        .header("content-type", "application/connect+json")
        .header("authorization", "Basic cm9vdDo=")
        .body(envelope(
            0,
            json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}, "tag": "orphan"})
                .to_string()
                .as_bytes(),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    drop(res);
    wait_for(
        "the command to finish on its own",
        Duration::from_secs(10),
        async || marker.exists(),
    )
    .await;

    // With a deadline (Connect-Timeout-Ms), the command is killed when it passes.
    let t0 = Instant::now();
    let (msgs, _) = e
        .stream(
            "process.Process/Start",
            json!({"process": {"cmd": "/bin/sleep", "args": ["30"]}}),
            &[("connect-timeout-ms", "700")],
        )
        .await;
    assert!(t0.elapsed() < Duration::from_secs(10));
    let pid = msgs[0]["event"]["start"]["pid"].as_u64().unwrap();
    wait_for(
        "the deadline to kill it",
        Duration::from_secs(10),
        async || {
            !listed(&e)
                .await
                .iter()
                .any(|p| p["pid"].as_u64() == Some(pid))
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_stdin_and_reattaching() {
    let e = Envd::start(&[]);
    // stdin unset means an open stdin (older SDKs never send the field).
    let start = e
        .req(reqwest::Method::POST, "/process.Process/Start")
        .header("content-type", "application/connect+json")
        .body(envelope(
            0,
            json!({"process": {"cmd": "/bin/cat"}, "tag": "catter"})
                .to_string()
                .as_bytes(),
        ))
        .send();
    let started = tokio::spawn(start);
    wait_for("the tagged process", Duration::from_secs(10), async || {
        listed(&e).await.iter().any(|p| p["tag"] == "catter")
    })
    .await;
    let info = listed(&e)
        .await
        .into_iter()
        .find(|p| p["tag"] == "catter")
        .unwrap();
    assert_eq!(info["config"]["cmd"], "/bin/cat");
    // Reattach by tag while feeding it by tag.
    let attach = e
        .req(reqwest::Method::POST, "/process.Process/Connect")
        .header("content-type", "application/connect+json")
        .body(envelope(
            0,
            json!({"process": {"tag": "catter"}}).to_string().as_bytes(),
        ))
        .send();
    let attached = tokio::spawn(attach);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (st, v) = e
        .unary(
            "process.Process/SendInput",
            json!({"process": {"tag": "catter"}, "input": {"stdin": STANDARD.encode("echoed\n")}}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (st, _) = e
        .unary(
            "process.Process/CloseStdin",
            json!({"process": {"tag": "catter"}}),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    for h in [started, attached] {
        let body = h.await.unwrap().unwrap().bytes().await.unwrap();
        let msgs: Vec<Value> = frames(&body)
            .into_iter()
            .filter(|(f, _)| f & 2 == 0)
            .map(|(_, p)| serde_json::from_slice(&p).unwrap())
            .collect();
        assert!(msgs[0]["event"]["start"]["pid"].is_number());
        assert_eq!(stdout_of(&msgs), "echoed\n");
        // proto3 JSON leaves out the zero exit code.
        let end = &msgs.last().unwrap()["event"]["end"];
        assert_eq!(
            (end["status"].as_str(), end.get("exitCode")),
            (Some("exit status 0"), None)
        );
    }
    // Writing to a process that took no stdin is an error, not a hang.
    let (msgs, _) = e
        .stream(
            "process.Process/Start",
            json!({"process": {"cmd": "/bin/sh", "args": ["-c", "cat; echo eof"]}, "stdin": false}),
            &[],
        )
        .await;
    assert_eq!(stdout_of(&msgs), "eof\n");
}

/// A pids cgroup (v1 or v2) holding the agent, removed again when dropped.
struct PidLimit(PathBuf);

impl PidLimit {
    fn new(pid: u32, max: u32) -> Option<PidLimit> {
        let name = format!("sgw-envd-test-{}", std::process::id());
        for root in ["/sys/fs/cgroup/pids", "/sys/fs/cgroup"] {
            let dir = PathBuf::from(root).join(&name);
            if std::fs::create_dir(&dir).is_err() {
                continue;
            }
            if std::fs::write(dir.join("pids.max"), max.to_string()).is_ok()
                && std::fs::write(dir.join("cgroup.procs"), pid.to_string()).is_ok()
            {
                return Some(PidLimit(dir));
            }
            let _ = std::fs::remove_dir(&dir);
        }
        None
    }

    fn kill_all_but(&self, keep: u32) {
        for _ in 0..100 {
            let procs = std::fs::read_to_string(self.0.join("cgroup.procs")).unwrap_or_default();
            let others: Vec<i32> = procs
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .filter(|p| *p as u32 != keep)
                .collect();
            if others.is_empty() {
                return;
            }
            for p in others {
                // SAFETY: signalling processes of the test's own cgroup.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for PidLimit {
    fn drop(&mut self) {
        self.kill_all_but(0);
        for _ in 0..100 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_does_not_take_envd_down() {
    if !is_root() {
        eprintln!("skipped: a pid limit needs a cgroup, which needs root");
        return;
    }
    let mut e = Envd::start(&[]);
    let agent = e.agent.pid();
    let Some(limit) = PidLimit::new(agent, 96) else {
        eprintln!("skipped: no writable pids cgroup here");
        return;
    };
    let bomb = e
        .req(reqwest::Method::POST, "/process.Process/Start")
        .header("content-type", "application/connect+json")
        .header("authorization", "Basic cm9vdDo=")
        .body(envelope(
            0,
            json!({"process": {"cmd": "/bin/bash", "args": ["-c", "b() { b | b & }; b"]}})
                .to_string()
                .as_bytes(),
        ))
        .send();
    let bomb = tokio::spawn(bomb);
    // Let it fill the pid limit.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let current = std::fs::read_to_string(limit.0.join("pids.current")).unwrap_or_default();
    let events = std::fs::read_to_string(limit.0.join("pids.events")).unwrap_or_default();
    eprintln!(
        "pids in the sandbox during the bomb: {} ({})",
        current.trim(),
        events.trim()
    );
    // The limit was hit: forks were refused.
    if let Some(n) = events
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse::<u64>().ok())
    {
        assert!(n > 0, "the bomb reached the pid limit: {events}");
    }
    // envd answers: health, a file call (blocking pool), and a start that fails cleanly or runs.
    let http = client();
    let r = http.get(e.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (st, v) = e
        .unary("filesystem.Filesystem/Stat", json!({"path": "/tmp"}))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_msgs, end) = e.run("echo during").await;
    if let Some(code) = end["error"]["code"].as_str() {
        assert_eq!(code, "resource_exhausted", "{end}");
    }
    assert!(e.agent.alive(), "envd survived the bomb");
    limit.kill_all_but(agent);
    let _ = bomb.await;
    assert!(e.healthy().await);
    let (msgs, _) = e.run("echo after").await;
    assert_eq!(stdout_of(&msgs), "after\n");
    assert!(e.agent.alive());
}
