//! `sandbox-gateway serve` with its embedded node: starts, answers health, and stops cleanly
//! on SIGTERM without leaving sandbox processes or directories behind.

mod common;

use std::time::Duration;

use common::*;

#[tokio::test]
async fn serve_starts_an_embedded_node_and_stops_clean() {
    let (tmp, _) = workspace();
    let data = tmp.path().join("data");
    let mut gw = Proc::spawn(&serve_args(&data, &["--pool", "base=3"]));
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

    // The local default made an API key, printed it, and keeps it owner-only.
    let key_line = gw.wait_line("export E2B_API_KEY=", Duration::from_secs(5));
    let key = key_line.rsplit('=').next().unwrap().trim().to_string();
    assert!(key.starts_with("e2b_") && key.len() == 44, "{key}");
    let keys_file = data.join("api-keys");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&keys_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let client = reqwest::Client::new();
    let list = |k: &str| {
        client
            .get(format!("http://{addr}/v2/sandboxes"))
            .header("X-API-KEY", k.to_string())
            .send()
    };
    assert_eq!(list(&key).await.unwrap().status(), 200);
    assert_eq!(list("e2b_wrong").await.unwrap().status(), 401);

    // `keys create` adds a hashed key the running gateway picks up without a restart.
    let out = std::process::Command::new(BIN)
        .args(["keys", "create", "--namespace", "team-c", "--file"])
        .arg(&keys_file)
        .output()
        .unwrap();
    assert!(out.status.success());
    let new_key = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(
        new_key.starts_with("e2b_") && new_key.len() == 44,
        "{new_key}"
    );
    let stored = std::fs::read_to_string(&keys_file).unwrap();
    assert!(!stored.contains(&new_key), "the new key is stored hashed");
    assert!(stored.contains("sha256:") && stored.contains(" team-c"));
    let mut ok = false;
    for _ in 0..60 {
        if list(&new_key).await.unwrap().status() == 200 {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "the gateway reloads the key file");
    let bad = std::process::Command::new(BIN)
        .args(["keys", "create", "--namespace", "Not_A_Namespace", "--file"])
        .arg(&keys_file)
        .output()
        .unwrap();
    assert!(!bad.status.success());

    // The embedded node fills its warm pool with real sandboxes.
    let sandboxes = data.join("node/sandboxes");
    eventually(Duration::from_secs(30), "three warm sandboxes", || {
        sandboxes_running(&sandboxes) == 3 && dir_entries(&sandboxes).len() == 3
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
    let mut gw = Proc::spawn(&serve_args(
        &tmp.path().join("data"),
        &["--node", "127.0.0.1:1"],
    ));
    let status = gw.wait_exit(Duration::from_secs(30));
    assert!(
        !status.success(),
        "a gateway without the fleet token must refuse to start"
    );

    // With the token but neither --api-keys nor --allow-anonymous it refuses too: only the
    // local default (embedded node) makes a key by itself.
    let token = tmp.path().join("token");
    std::fs::write(&token, "t0k3n").unwrap();
    let mut gw = Proc::spawn(&[
        "serve".into(),
        "--e2b-listen".into(),
        "127.0.0.1:0".into(),
        "--kube-listen".into(),
        "127.0.0.1:0".into(),
        "--data-dir".into(),
        tmp.path().join("data2").display().to_string(),
        "--node".into(),
        "127.0.0.1:1".into(),
        "--node-token-file".into(),
        token.display().to_string(),
    ]);
    let status = gw.wait_exit(Duration::from_secs(30));
    assert!(
        !status.success(),
        "no keys and no anonymous use: refuse to start"
    );
    assert!(!tmp.path().join("data2/api-keys").exists());
}
