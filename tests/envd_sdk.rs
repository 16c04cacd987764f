//! The real e2b SDKs against the real agent's envd server: Python `e2b` 2.63.0 and 2.50.0
//! (tests/e2b/py/test_envd.py) and JS `e2b` 2.51.0 (tests/e2b/js/envd.mjs) in the SDKs'
//! debug mode, which talks to `http://localhost:49983` with no control plane. The agent runs
//! with an access token and as root with a non-root `user`, as in a sandbox.

mod common;
#[path = "envd_harness.rs"]
mod harness;

use std::path::Path;
use std::process::Command;

use harness::{Agent, lock_port};

const DEBUG_PORT: u16 = 49983;
const TOKEN: &str = "envd-sdk-test-token";

fn run_scenarios(label: &str, program: &Path, args: &[&str]) {
    common::ensure_sdks();
    let _lock = lock_port(DEBUG_PORT);
    let agent = Agent::start(DEBUG_PORT, &["--access-token", TOKEN]);
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(common::repo())
        .env("E2B_DEBUG", "true")
        .env("E2B_ENVD_VERSION", sandbox_gateway::envd::ENVD_VERSION)
        .env("E2B_ENVD_ACCESS_TOKEN", TOKEN)
        .env_remove("E2B_SANDBOX_URL")
        .env_remove("E2B_DOMAIN");
    if agent.has_user {
        cmd.env("E2B_ENVD_USER", "user");
    }
    let out = cmd.output().expect("run the scenarios");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("--- {label} ---\n{text}");
    assert!(
        out.status.success(),
        "{label} envd scenarios failed:\n{text}"
    );
    assert!(
        !text.contains(" skipped") || !agent.has_user,
        "{label}: scenarios were skipped:\n{text}"
    );
}

fn python(version: &str) {
    let py = common::sdk_dir().join(format!("py-{version}/bin/python"));
    let file = common::repo().join("tests/e2b/py/test_envd.py");
    run_scenarios(
        &format!("python e2b {version}"),
        &py,
        &[
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            &file.display().to_string(),
        ],
    );
}

#[test]
fn python_sdk_2_63_0_envd() {
    python("2.63.0");
}

#[test]
fn python_sdk_2_50_0_envd() {
    python("2.50.0");
}

#[test]
fn js_sdk_2_51_0_envd() {
    let script = common::repo().join("tests/e2b/js/envd.mjs");
    run_scenarios(
        "js e2b 2.51.0",
        Path::new("node"),
        &[&script.display().to_string()],
    );
}
