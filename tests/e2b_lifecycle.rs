//! Sandbox lifecycle through the real e2b SDKs (Python 2.63.0, JS 2.51.0) against `serve`:
//! pause at the end of the timeout, auto-resume on data-plane traffic, paused time not counted
//! against the timeout, paused retention, the refusals, and volumes mounted in sandboxes
//! (tests/e2b/py/lifecycle_scenarios.py and test_volumes.py, tests/e2b/js/lifecycle.mjs).

mod common;

use std::path::Path;

use common::*;

/// Short enough to watch a paused sandbox be released, long enough for the other scenarios to
/// wait past a paused sandbox's old deadline.
const RETENTION: &str = "10";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_with_the_sdks() {
    ensure_sdks();
    let (tmp, _) = workspace();
    let mut gw = Gateway::start(
        tmp.path(),
        &[
            "--pool",
            "base/egress=2",
            "--paused-retention-seconds",
            RETENTION,
        ],
    );
    let env = vec![
        ("E2B_API_URL", gw.url.clone()),
        ("E2B_SANDBOX_URL", gw.url.clone()),
        ("PAUSED_RETENTION", RETENTION.to_string()),
        // Where the node keeps the files of sandboxes paused without their memory.
        (
            "PAUSED_DIR",
            gw.data.join("node/paused").display().to_string(),
        ),
    ];
    tokio::task::block_in_place(|| {
        scenarios::pytest("2.63.0", &["lifecycle_scenarios.py"], &[], &env, &[]);
        // Volumes mounted in sandboxes, with both Python SDKs.
        for version in ["2.63.0", "2.50.0"] {
            let mut env = env.clone();
            env.push(("E2B_SDK_VERSION", version.to_string()));
            scenarios::pytest(version, &["test_volumes.py"], &[], &env, &[]);
        }
        let script = repo().join("tests/e2b/js/lifecycle.mjs");
        scenarios::run(
            "js e2b 2.51.0 lifecycle",
            Path::new("node"),
            &[&script.display().to_string()],
            &env,
            &[],
        );
    });
    gw.proc.terminate();
    assert_no_leaks(
        tmp.path(),
        &[gw.data.join("node/sandboxes"), gw.data.join("node/paused")],
    )
    .await;
}
