//! `sandbox-gateway serve` with its embedded node: starts, answers health, and stops cleanly
//! on SIGTERM without leaving sandbox processes or directories behind.

mod common;

use std::time::Duration;

use common::*;

#[tokio::test]
async fn serve_starts_an_embedded_node_and_stops_clean() {
    let (tmp, _) = workspace();
    let data = tmp.path().join("data");
    let mut gw = Proc::spawn(&[
        "serve".into(),
        "--e2b-listen".into(),
        "127.0.0.1:0".into(),
        "--data-dir".into(),
        data.display().to_string(),
        "--pool".into(),
        "base=3".into(),
    ]);
    let line = gw.wait_line("e2b API listening on http://", Duration::from_secs(60));
    let addr = line.rsplit("http://").next().unwrap().trim().to_string();
    assert_eq!(
        http_get(&addr, "/health", Duration::from_secs(5)),
        Some(204)
    );
    assert_eq!(
        http_get(&addr, "/no-such-route", Duration::from_secs(5)),
        Some(404)
    );

    // The embedded node fills its warm pool with real agent processes.
    let sandboxes = data.join("node/sandboxes");
    eventually(Duration::from_secs(30), "three warm sandboxes", || {
        processes_under(&sandboxes).len() == 3 && dir_entries(&sandboxes).len() == 3
    })
    .await;
    // First start generated the fleet token with owner-only permissions.
    let token = data.join("node-token");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&token).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);

    gw.terminate();
    assert_no_leaks(tmp.path(), &[sandboxes]).await;
}

#[tokio::test]
async fn serve_with_nodes_requires_their_token() {
    let (tmp, _) = workspace();
    let mut gw = Proc::spawn(&[
        "serve".into(),
        "--e2b-listen".into(),
        "127.0.0.1:0".into(),
        "--data-dir".into(),
        tmp.path().join("data").display().to_string(),
        "--node".into(),
        "127.0.0.1:1".into(),
    ]);
    let status = gw.wait_exit(Duration::from_secs(30));
    assert!(
        !status.success(),
        "a gateway without the fleet token must refuse to start"
    );
}
