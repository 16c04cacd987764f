//! Hostile input over the wire: schemathesis (pinned in tests/e2b/setup.sh) generates requests
//! from `openapi/e2b.json` and from the OpenAPI v2 document the facade serves, sends them to
//! the real gateway binary, and fails on any 5xx (`not_a_server_error`). Bounded for CI:
//! `SCHEMA_FUZZ_SECONDS` (default 60 per document) and `SCHEMA_FUZZ_EXAMPLES` (default 20 per
//! operation) make it longer. The figures lines are what tests/fuzz/report.sh collects.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use common::kube_gateway::{KEY_ADMIN, KEY_TEAM_A, KubeGateway};
use common::{ensure_sdks, repo, sdk_dir, workspace};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

/// What one schemathesis run reported.
struct Run {
    ok: bool,
    output: String,
}

/// `schemathesis run` of `schema` against `url` with `extra` options; the run's own summary
/// is printed as it is, followed by one `fuzz-figure` line.
fn schemathesis(name: &str, schema: &Path, url: &str, extra: &[&str], report: &Path) -> Run {
    let seconds = env_number("SCHEMA_FUZZ_SECONDS", 60).to_string();
    let examples = env_number("SCHEMA_FUZZ_EXAMPLES", 20).to_string();
    let bin = sdk_dir().join("py-schemathesis/bin/schemathesis");
    let started = Instant::now();
    let out = Command::new(&bin)
        .arg("run")
        .arg(schema)
        .args(["--url", url])
        .args(["--checks", "not_a_server_error"])
        .args(["--phases", "examples,coverage,fuzzing"])
        .args(["--max-examples", &examples])
        .args(["--max-time", &seconds])
        .args(["--workers", "2"])
        .args(["--request-timeout", "30"])
        .args(["--suppress-health-check", "all"])
        .args(["--report", "junit"])
        .arg("--report-dir")
        .arg(report)
        .args(extra)
        // Schemathesis writes its Hypothesis database into the working directory.
        .current_dir(report)
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()));
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{output}");
    // The summary line, e.g. "Test cases: 1234 generated, 1234 passed in 58.1s".
    let cases = output
        .lines()
        .find(|l| l.trim_start().starts_with("Test cases:"))
        .map(|l| l.trim().to_string())
        .unwrap_or_default();
    println!(
        "fuzz-figure target=schemathesis/{name} secs={:.1} summary={cases:?} exit={}",
        started.elapsed().as_secs_f64(),
        out.status.code().unwrap_or(-1)
    );
    Run {
        ok: out.status.success(),
        output,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_server_errors_for_generated_requests() {
    ensure_sdks();
    let (tmp, _) = workspace();
    let gw = KubeGateway::start(tmp.path(), &[]);
    let report = tmp.path().join("schemathesis");
    std::fs::create_dir_all(&report).unwrap();

    let e2b = schemathesis(
        "e2b",
        &repo().join("openapi/e2b.json"),
        &gw.e2b_url,
        &["--header", &format!("X-API-KEY: {KEY_TEAM_A}")],
        &report,
    );

    // The facade's own document, as kubectl and client generators fetch it.
    let doc = gw
        .http()
        .get(format!("{}/openapi/v2", gw.kube_url))
        .bearer_auth(KEY_ADMIN)
        .send()
        .await
        .expect("GET /openapi/v2")
        .text()
        .await
        .expect("openapi v2 body");
    let facade_doc = tmp.path().join("facade-openapi-v2.json");
    std::fs::write(&facade_doc, doc).unwrap();
    let ca = gw.dir.join("tls/ca.crt");
    let facade = schemathesis(
        "facade",
        &facade_doc,
        &gw.kube_url,
        &[
            "--header",
            &format!("Authorization: Bearer {KEY_ADMIN}"),
            "--tls-verify",
            &ca.display().to_string(),
        ],
        &report,
    );

    assert!(
        e2b.ok,
        "schemathesis found server errors on the e2b API:\n{}",
        e2b.output
    );
    assert!(
        facade.ok,
        "schemathesis found server errors on the Kubernetes facade:\n{}",
        facade.output
    );
}
