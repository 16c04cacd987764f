//! The unmodified e2b CLI (`@e2b/cli` 2.19.0, `E2B_API_URL`/`E2B_API_KEY`) against `serve`:
//! `sandbox list` (formats, metadata and state filters), `info`, `pause`, `resume`, `kill` of
//! several and `--all`, `logs` (every line one the CLI can parse; `--level`, `--loggers`,
//! `--follow` until the sandbox ends, and the log of a killed sandbox), `exec` (output, stdin,
//! exit code), `metrics`, `snapshot create/list/delete`, `template list`, `create --detach`,
//! and the interactive `connect` and attached `create` through a real pty
//! (tests/e2b/py/cli_scenarios.py).

mod common;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_e2b_cli_works_unmodified() {
    ensure_sdks();
    let (tmp, _) = workspace();
    let mut gw = Gateway::start(tmp.path(), &["--pool", "base/egress=2"]);
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
    assert_no_leaks(tmp.path(), &[gw.data.join("node/sandboxes")]).await;
}
