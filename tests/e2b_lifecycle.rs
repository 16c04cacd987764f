//! Sandbox lifecycle through the real e2b SDKs (Python 2.63.0, JS 2.51.0) against `serve`:
//! pause at the end of the timeout, auto-resume on data-plane traffic, paused time not counted
//! against the timeout, paused retention, and the refusals (tests/e2b/py/lifecycle_scenarios.py,
//! tests/e2b/js/lifecycle.mjs).

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

/// Short enough to watch a paused sandbox be released, long enough for the other scenarios to
/// wait past a paused sandbox's old deadline.
const RETENTION: &str = "10";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_with_the_sdks() {
    ensure_sdks();
    let (tmp, _) = workspace();
    let keys = tmp.path().join("api-keys");
    std::fs::write(&keys, format!("{KEY_A} team-a\n{KEY_B} team-b\n")).unwrap();
    let data = tmp.path().join("gw");
    let mut gw = Proc::spawn(&serve_args(
        &data,
        &[
            "--api-keys",
            &keys.display().to_string(),
            "--pool",
            "base/egress=2",
            "--paused-retention-seconds",
            RETENTION,
        ],
    ));
    let line = gw.wait_line("export E2B_SANDBOX_URL=", Duration::from_secs(60));
    let url = line.rsplit('=').next().unwrap().trim().to_string();
    let env = vec![
        ("E2B_API_URL", url.clone()),
        ("E2B_SANDBOX_URL", url),
        ("PAUSED_RETENTION", RETENTION.to_string()),
    ];
    tokio::task::block_in_place(|| {
        scenarios::pytest("2.63.0", &["lifecycle_scenarios.py"], &[], &env, &[]);
        let script = repo().join("tests/e2b/js/lifecycle.mjs");
        scenarios::run(
            "js e2b 2.51.0 lifecycle",
            Path::new("node"),
            &[&script.display().to_string()],
            &env,
            &[],
        );
    });
    gw.terminate();
    assert_no_leaks(tmp.path(), &[data.join("node/sandboxes")]).await;
}
