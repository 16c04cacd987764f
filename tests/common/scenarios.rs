//! Runs the SDK scenario programs (pytest files under tests/e2b/py, node scripts under
//! tests/e2b/js) against a gateway, failing with their output, or when they skipped a scenario
//! that is not on the caller's list of skips that cannot apply.

use std::path::Path;
use std::process::Command;

use super::{KEY_A, KEY_B, repo, sdk_dir};

/// Runs one scenario program with the SDK pointed at the gateway (keys KEY_A and KEY_B).
pub fn run(
    label: &str,
    program: &Path,
    args: &[&str],
    env: &[(&str, String)],
    allowed_skips: &[&str],
) {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(repo())
        .env("E2B_API_KEY", KEY_A)
        .env("E2B_OTHER_API_KEY", KEY_B)
        .env("E2B_ENVD_USER", "user")
        .env("PYTHONPATH", repo().join("tests/e2b/py"))
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_SANDBOX_URL")
        .env_remove("E2B_DOMAIN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the scenarios");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("--- {label} ---\n{text}");
    assert!(out.status.success(), "{label} failed:\n{text}");
    for line in text
        .lines()
        .filter(|l| l.contains("SKIPPED") || l.contains("# skipped"))
    {
        assert!(
            allowed_skips.iter().any(|a| line.contains(a)),
            "{label} skipped a scenario it should run: {line}"
        );
    }
}

/// Runs pytest files of tests/e2b/py with the Python SDK `version`.
pub fn pytest(
    version: &str,
    files: &[&str],
    plugins: &[&str],
    env: &[(&str, String)],
    allowed_skips: &[&str],
) {
    pytest_in(&format!("py-{version}"), files, plugins, env, allowed_skips);
}

/// Runs pytest files of tests/e2b/py in the venv `venv` of the SDK directory.
pub fn pytest_in(
    venv: &str,
    files: &[&str],
    plugins: &[&str],
    env: &[(&str, String)],
    allowed_skips: &[&str],
) {
    let py = sdk_dir().join(venv).join("bin/python");
    let mut args = vec!["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"];
    for p in plugins {
        args.extend(["-p", p]);
    }
    let files: Vec<String> = files
        .iter()
        .map(|f| repo().join("tests/e2b/py").join(f).display().to_string())
        .collect();
    args.extend(files.iter().map(String::as_str));
    run(
        &format!("python {venv} {files:?}"),
        &py,
        &args,
        env,
        allowed_skips,
    );
}

/// Runs the node script `script` of tests/e2b/js; with `resolve`, the SDK's host names are
/// resolved as `E2B_TEST_RESOLVE` says (tests/e2b/js/resolve.mjs, for the domain mode).
pub fn node(
    label: &str,
    script: &str,
    resolve: bool,
    env: &[(&str, String)],
    allowed_skips: &[&str],
) {
    let js = repo().join("tests/e2b/js");
    let script = js.join(script).display().to_string();
    let preload = format!("--import={}", js.join("resolve.mjs").display());
    let mut args = Vec::new();
    if resolve {
        args.push(preload.as_str());
    }
    args.push(script.as_str());
    run(label, Path::new("node"), &args, env, allowed_skips);
}
