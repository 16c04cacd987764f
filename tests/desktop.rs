//! Computer-use sandboxes: the `desktop` template with the unmodified `e2b_desktop` 2.7.2 and
//! `@e2b/desktop` 2.4.0, in the domain mode (the stream's URL is
//! `https://6080-<id>.<domain>/vnc.html`), and the stream opened in Debian's headless
//! chromium. tests/e2b/py/desktop_scenarios.py and tests/e2b/js/desktop.mjs say what each
//! scenario shows.

mod common;

use common::domain::DomainGateway;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_desktop_works_unmodified() {
    ensure_sdks();
    desktop_templates();
    let (tmp, _) = workspace();
    let mut gw = DomainGateway::start(tmp.path(), "desktops.test", "desktop/egress/large=1");
    let mut env = gw.sdk_env();
    env.push((
        "DESKTOP_SCREENSHOTS",
        repo()
            .join("target/dashboard-screenshots")
            .display()
            .to_string(),
    ));
    tokio::task::block_in_place(|| {
        scenarios::pytest_in(
            "py-browser",
            &["desktop_scenarios.py"],
            &["resolve_override"],
            &env,
            &[],
        );
        // Node 20 has WebSocket behind a flag; the scenario uses it for noVNC's bridge.
        let mut js_env = gw.sdk_env();
        js_env.push(("NODE_OPTIONS", "--experimental-websocket".to_string()));
        scenarios::node("js @e2b/desktop 2.4.0", "desktop.mjs", true, &js_env, &[]);
    });
    gw.proc.terminate();
    assert_no_leaks(tmp.path(), &[gw.data.join("node/sandboxes")]).await;
}
