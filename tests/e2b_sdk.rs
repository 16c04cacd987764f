//! The real e2b SDKs against the real gateway: Python `e2b` 2.63.0 (v2 routes), Python 2.50.0
//! (the v1 create and connect routes) and JS `e2b` 2.51.0, installed from the registries by
//! `tests/e2b/setup.sh`, each running its scripted scenarios (tests/e2b/py, tests/e2b/js).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

const KEY_A: &str = "e2b_a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1";
const KEY_B: &str = "e2b_b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2";

struct Gateway {
    proc: Proc,
    url: String,
    sandboxes: PathBuf,
}

fn start_gateway(tmp: &Path) -> Gateway {
    let data = tmp.join("gw");
    let keys = tmp.join("api-keys");
    std::fs::write(&keys, format!("{KEY_A} team-a\n{KEY_B} team-b\n")).unwrap();
    let mut proc = Proc::spawn(&[
        "serve".into(),
        "--e2b-listen".into(),
        "127.0.0.1:0".into(),
        "--kube-listen".into(),
        "127.0.0.1:0".into(),
        "--data-dir".into(),
        data.display().to_string(),
        "--api-keys".into(),
        keys.display().to_string(),
        "--pool".into(),
        "base/egress=4".into(),
        "--pool".into(),
        "base=2".into(),
    ]);
    let line = proc.wait_line("e2b API listening on http://", Duration::from_secs(60));
    Gateway {
        url: line.rsplit(' ').next().unwrap().trim().to_string(),
        proc,
        sandboxes: data.join("node/sandboxes"),
    }
}

/// Runs one scenario program against a fresh gateway and checks that it passed and left
/// nothing running.
async fn scenario(label: &str, program: &Path, args: &[&str], extra_env: &[(&str, &str)]) {
    ensure_sdks();
    let (tmp, _) = workspace();
    let mut gw = start_gateway(tmp.path());
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(repo())
        .env("E2B_API_URL", &gw.url)
        .env("E2B_API_KEY", KEY_A)
        .env("E2B_OTHER_API_KEY", KEY_B)
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .expect("run the scenario");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("--- {label} ---\n{text}");
    assert!(out.status.success(), "{label} scenarios failed:\n{text}");
    gw.proc.terminate();
    assert_no_leaks(tmp.path(), &[gw.sandboxes]).await;
}

async fn python(version: &str) {
    let py = sdk_dir().join(format!("py-{version}/bin/python"));
    let tests = repo().join("tests/e2b/py");
    let tests = tests.display().to_string();
    scenario(
        &format!("python e2b {version}"),
        &py,
        &["-m", "pytest", "-q", "-p", "no:cacheprovider", &tests],
        &[("E2B_SDK_VERSION", version)],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_2_63_0() {
    python("2.63.0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_2_50_0_v1_routes() {
    python("2.50.0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_sdk_2_51_0() {
    let script = repo().join("tests/e2b/js/scenario.mjs");
    let script = script.display().to_string();
    scenario("js e2b 2.51.0", Path::new("node"), &[&script], &[]).await;
}
