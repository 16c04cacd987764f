//! The unmodified e2b CLI (`@e2b/cli` 2.19.0, `E2B_API_URL`/`E2B_API_KEY`) against `serve`:
//! `sandbox list` (formats, metadata and state filters), `info`, `pause`, `resume`, `kill` of
//! several and `--all`, `logs` (every line one the CLI can parse; `--level`, `--loggers`,
//! `--follow` until the sandbox ends, and the log of a killed sandbox), `exec` (output, stdin,
//! exit code), `metrics`, `snapshot create/list/delete`, `template list`, `create --detach`,
//! and the interactive `connect` and attached `create` through a real pty, and `template
//! create` from a Dockerfile whose `FROM e2bdev/base` comes through the gateway's Docker Hub
//! mirror (a registry on loopback) (tests/e2b/py/cli_scenarios.py).

mod common;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_e2b_cli_works_unmodified() {
    ensure_sdks();
    let (tmp, _) = workspace();
    // Docker Hub for `FROM e2bdev/base`: a registry on loopback that the gateway mirrors it to.
    let image = images::make_image(&tmp.path().join("image"));
    let hub = images::Registry::start(&tmp.path().join("hub"), None, None);
    hub.push(&image, "e2bdev/base:latest");
    let mirror = format!("docker.io={}", hub.addr);
    let mut gw = Gateway::start(
        tmp.path(),
        &[
            "--pool",
            "base/egress=2",
            "--registry-insecure",
            &hub.addr,
            "--registry-mirror",
            &mirror,
        ],
    );
    let cli = repo().join("tests/e2b/js/node_modules/.bin/e2b");
    assert!(
        cli.exists(),
        "{} is missing (tests/e2b/setup.sh)",
        cli.display()
    );
    let env = vec![
        ("E2B_API_URL", gw.url.clone()),
        ("E2B_SANDBOX_URL", gw.url.clone()),
        ("E2B_CLI", cli.display().to_string()),
    ];
    tokio::task::block_in_place(|| {
        scenarios::pytest("2.63.0", &["cli_scenarios.py"], &[], &env, &[]);
    });
    gw.proc.terminate();
    drop(hub);
    assert_no_leaks(tmp.path(), &[gw.data.join("node/sandboxes")]).await;
}
