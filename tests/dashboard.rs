//! The web dashboard in a real headless browser (Debian's chromium-headless-shell driven by
//! Playwright 1.65.3) against `serve`, with sandboxes made by the e2b Python SDK:
//! tests/e2b/py/dashboard_scenarios.py says what each scenario shows. Its screenshots land in
//! target/dashboard-screenshots (README's picture is one of them).

mod common;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_in_a_real_browser() {
    ensure_sdks();
    let (tmp, _) = workspace();
    let mut gw = Gateway::start(tmp.path(), &["--pool", "base/egress=2"]);
    let fleet_token = std::fs::read_to_string(gw.data.join("node-token"))
        .expect("the gateway's fleet token")
        .trim()
        .to_string();
    let env = vec![
        ("E2B_API_URL", gw.url.clone()),
        ("E2B_SANDBOX_URL", gw.url.clone()),
        ("DASHBOARD_FLEET_TOKEN", fleet_token),
        (
            "DASHBOARD_KEYS_FILE",
            tmp.path().join("api-keys").display().to_string(),
        ),
        (
            "DASHBOARD_SCREENSHOTS",
            repo()
                .join("target/dashboard-screenshots")
                .display()
                .to_string(),
        ),
    ];
    tokio::task::block_in_place(|| {
        scenarios::pytest_in("py-browser", &["dashboard_scenarios.py"], &[], &env, &[]);
    });
    gw.proc.terminate();
    assert_no_leaks(tmp.path(), &[gw.data.join("node/sandboxes")]).await;
}
