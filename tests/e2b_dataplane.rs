//! The real e2b SDKs running commands, files and pty in real sandboxes through the gateway's
//! data plane, both ways the SDKs address sandboxes:
//! - `E2B_SANDBOX_URL` (headers) against a gateway over a fleet of two node processes, with the
//!   Python 2.63.0 scenarios run on a sandbox of the second node;
//! - the domain mode: TLS on port 443 with the wildcard certificate from the gateway's CA and
//!   `https://{port}-{id}.{domain}` host names, resolved to the gateway inside the test
//!   processes only (tests/e2b/py/resolve_override.py, tests/e2b/js/resolve.mjs).

mod common;

use std::time::Duration;

use common::*;

/// Skips a run may report: scenarios that cannot apply to the way it addresses sandboxes.
const ALLOWED_SKIPS: &[&str] = &[
    "the async client is built from the debug options",
    "signed URLs route by host name: domain mode only",
    "skipped: domain mode only",
];

fn pytest(version: &str, files: &[&str], plugins: &[&str], env: &[(&str, String)]) {
    scenarios::pytest(version, files, plugins, env, ALLOWED_SKIPS);
}

fn js(env: &[(&str, String)], preload: bool) {
    scenarios::node("js e2b 2.51.0", "envd.mjs", preload, env, ALLOWED_SKIPS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_work_through_the_gateway_on_a_two_node_fleet() {
    ensure_sdks();
    let (tmp, token) = workspace();
    let a = NodeProc::start(
        "node-a",
        &tmp.path().join("a"),
        &token,
        "127.0.0.1:0",
        &["--pool", "base/egress=2"],
    );
    let b = NodeProc::start(
        "node-b",
        &tmp.path().join("b"),
        &token,
        "127.0.0.1:0",
        &["--pool", "base/egress=2"],
    );
    let keys = api_keys_file(tmp.path());
    let data = tmp.path().join("gw");
    let mut gw = Proc::spawn(&serve_args(
        &data,
        &[
            "--node",
            &a.addr,
            "--node",
            &b.addr,
            "--node-token-file",
            &token.display().to_string(),
            "--api-keys",
            &keys.display().to_string(),
        ],
    ));
    let line = gw.wait_line("export E2B_SANDBOX_URL=", Duration::from_secs(60));
    let url = line.rsplit('=').next().unwrap().trim().to_string();
    let env = vec![
        ("E2B_API_URL", url.clone()),
        ("E2B_SANDBOX_URL", url.clone()),
    ];

    let mut second = env.clone();
    second.push(("E2B_TARGET_NODE", "node-b".to_string()));
    tokio::task::block_in_place(|| {
        pytest(
            "2.63.0",
            &["test_envd.py", "test_dataplane.py"],
            &[],
            &second,
        );
        pytest("2.50.0", &["test_envd.py"], &[], &env);
        js(&env, false);
    });

    gw.terminate();
    let mut nodes = [a, b];
    for n in nodes.iter_mut() {
        n.proc.terminate();
    }
    assert_no_leaks(
        tmp.path(),
        &[nodes[0].sandboxes_dir(), nodes[1].sandboxes_dir()],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_work_in_the_domain_mode() {
    ensure_sdks();
    let (tmp, _) = workspace();
    let mut gw = DomainGateway::start(tmp.path(), "sandboxes.test", "base/egress=2");
    let env = gw.sdk_env();
    tokio::task::block_in_place(|| {
        pytest(
            "2.63.0",
            &["test_envd.py", "test_dataplane.py"],
            &["resolve_override"],
            &env,
        );
        js(&env, true);
    });
    gw.proc.terminate();
    assert_no_leaks(tmp.path(), &[gw.data.join("node/sandboxes")]).await;
}
