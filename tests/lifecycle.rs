//! The lifecycle walk-through (`examples/lifecycle.rs`) against a gateway started here, on
//! both surfaces. The example checks each answer itself and exits non-zero at the first
//! deviation; this test checks that it ran every step, in order, with ids of the right shape,
//! and that it left nothing behind.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// The example's binary (cargo builds examples before it runs tests).
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target profile dir");
    let bin = dir.join("examples").join("lifecycle");
    assert!(
        bin.exists(),
        "{} is missing: `cargo test` builds examples; alone, run `cargo build --example lifecycle` first",
        bin.display()
    );
    bin
}

const KUBE_STEPS: [&str; 9] = [
    "discover", "create", "get", "list", "snapshot", "fork", "pause", "resume", "delete",
];
const E2B_STEPS: [&str; 14] = [
    "templates",
    "create",
    "get",
    "list",
    "metrics",
    "pause",
    "connect",
    "fork",
    "snapshot",
    "snapshots",
    "branch",
    "timeout",
    "keepalive",
    "delete",
];

/// The steps under `header`, in order, with their lines.
fn steps<'a>(out: &'a str, header: &str) -> Vec<(&'a str, &'a str)> {
    out.lines()
        .skip_while(|l| *l != header)
        .skip(1)
        .take_while(|l| !l.starts_with("==="))
        .filter(|l| l.starts_with("  ") && !l.trim_start().starts_with("note"))
        .map(|l| (l.split_whitespace().next().unwrap_or_default(), l))
        .collect()
}

fn has_id(line: &str, key: &str, prefix: &str) -> bool {
    line.split_whitespace().any(|w| {
        w.strip_prefix(key)
            .and_then(|v| v.strip_prefix(prefix))
            .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
    })
}

fn check_timed(lines: &[(&str, &str)]) {
    for (_, line) in lines {
        assert!(
            line.trim_end().ends_with(" ms)"),
            "every step prints its time: {line:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_walk_through_runs_green_on_both_surfaces() {
    let (tmp, _) = workspace();
    let mut gw = Gateway::start(tmp.path(), &["--pool", "base=2", "--pool", "base/egress=2"]);
    let kube_line = gw.proc.wait_line(
        "Kubernetes API listening on https://",
        Duration::from_secs(30),
    );
    let kube_url = kube_line.rsplit(' ').next().unwrap().trim().to_string();
    let kubeconfig = |key: &str, ns: &str| {
        let out = Command::new(BIN)
            .args(["kubeconfig", "--data-dir"])
            .arg(&gw.data)
            .args(["--server", &kube_url, "--api-key", key, "--namespace", ns])
            .output()
            .unwrap();
        assert!(out.status.success());
        let path = tmp.path().join(format!("kubeconfig-{ns}"));
        std::fs::write(&path, out.stdout).unwrap();
        path
    };
    let team_a = kubeconfig(KEY_A, "team-a");

    // Both halves.
    let out = Command::new(example())
        .arg("--kubeconfig")
        .arg(&team_a)
        .args([
            "--namespace",
            "team-a",
            "--e2b-url",
            &gw.url,
            "--e2b-key",
            KEY_A,
        ])
        .output()
        .expect("run the lifecycle example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let kube = steps(&stdout, "=== Kubernetes API ===");
    let e2b = steps(&stdout, "=== e2b-compatible REST API ===");
    assert_eq!(
        kube.iter().map(|s| s.0).collect::<Vec<_>>(),
        KUBE_STEPS,
        "{stdout}"
    );
    assert_eq!(
        e2b.iter().map(|s| s.0).collect::<Vec<_>>(),
        E2B_STEPS,
        "{stdout}"
    );
    check_timed(&kube);
    check_timed(&e2b);
    let find = |lines: &Vec<(&str, &str)>, name: &str| {
        lines
            .iter()
            .find(|s| s.0 == name)
            .map(|s| s.1.to_string())
            .unwrap()
    };
    assert!(
        has_id(&find(&kube, "create"), "claimID=", "sb_"),
        "{stdout}"
    );
    assert!(find(&kube, "get").contains("node=embedded"), "{stdout}");
    assert!(
        find(&kube, "list").contains("this one listed"),
        "one replica lists its own create at once: {stdout}"
    );
    assert!(
        has_id(&find(&kube, "snapshot"), "snapshotID=", "ck_"),
        "{stdout}"
    );
    assert!(
        has_id(&find(&kube, "fork"), "sandboxID=", "sb_"),
        "{stdout}"
    );
    assert!(
        has_id(&find(&e2b, "create"), "sandboxID=", "sb-"),
        "{stdout}"
    );
    assert!(find(&e2b, "pause").contains("409 on repeat"), "{stdout}");
    assert!(
        find(&e2b, "connect").starts_with("  connect    201"),
        "{stdout}"
    );
    assert!(
        has_id(&find(&e2b, "branch"), "sandboxID=", "sb-"),
        "{stdout}"
    );
    let deleted = find(&e2b, "delete");
    assert!(
        deleted.contains("3 sandboxes") && deleted.matches("ck_").count() == 2,
        "both snapshots deleted: {deleted}"
    );

    // Only the Kubernetes half without --e2b-url.
    let out = Command::new(example())
        .arg("--kubeconfig")
        .arg(&team_a)
        .args(["--namespace", "team-a"])
        .env_remove("E2B_API_KEY")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert_eq!(
        steps(&stdout, "=== Kubernetes API ===")
            .iter()
            .map(|s| s.0)
            .collect::<Vec<_>>(),
        KUBE_STEPS
    );
    assert!(!stdout.contains("e2b-compatible"));
    assert!(stdout.contains("  note       snapshot ck_"), "{stdout}");

    // A deviation stops it with a non-zero exit naming the step: this key may not create in
    // another tenant's namespace.
    let out = Command::new(example())
        .arg("--kubeconfig")
        .arg(&team_a)
        .args(["--namespace", "team-b"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("deviation at create"), "{stderr}");

    // Every sandbox it made is gone.
    assert_eq!(gw.metric("sandbox_gateway_sandboxes").await, 0);
    gw.proc.terminate();
    assert_no_leaks(tmp.path(), &[gw.data.join("node/sandboxes")]).await;
}
