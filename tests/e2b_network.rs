//! Network policies through the real e2b SDKs (Python 2.63.0, JS 2.51.0) against `serve`:
//! egress allow/deny lists enforced from inside real sandboxes, updates that reach open
//! connections, private ports guarded by the traffic access token, and the refusals
//! (tests/e2b/py/network_scenarios.py, tests/e2b/js/network.mjs).
//!
//! The gateway, its node, the "outside" servers and the SDK clients all run in a network
//! namespace of the test's own, where the servers listen on two documentation addresses
//! (TEST-NET-2) of the namespace's loopback. A node blocks its host's own addresses by default;
//! `--sandbox-reachable` exempts these two, so a sandbox reaches them through its user-mode
//! network exactly as it would reach the internet, and nothing leaves the machine. The hosts
//! of header rules are HTTPS servers there, with certificates from a CA made here that the
//! node trusts (`--egress-ca-file`); the names are resolved by the node's `--egress-host` map.

mod common;

use std::path::Path;

use common::*;

const SERVER_A: &str = "198.51.100.7";
const SERVER_B: &str = "198.51.100.8";

/// Runs the scenarios against a gateway on `runtime` in a private network namespace; returns
/// the node's sandboxes directory for the leak check.
fn scenarios_in_private_network(
    root: &Path,
    runtime: &'static str,
    js: bool,
) -> std::path::PathBuf {
    let root = root.to_path_buf();
    std::thread::spawn(move || {
        private_network(&[SERVER_A, SERVER_B]);
        // The "real" hosts of header rules: HTTPS servers with certificates from a CA the
        // node is told to trust, and one from a CA nobody trusts.
        let upstream_ca = certs::ca("test-upstream-ca");
        let pem = |name: &str, text: &str| {
            let path = root.join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        };
        let ca_file = pem("upstream-ca.pem", &upstream_ca.pem);
        let (cert, key) = certs::named(&upstream_ca, &["api.secure.test", "bare.secure.test"]);
        let (trusted_cert, trusted_key) = (pem("trusted.crt", &cert), pem("trusted.key", &key));
        let (cert, key) = certs::named(&certs::ca("nobodys-ca"), &["untrusted.secure.test"]);
        let (untrusted_cert, untrusted_key) =
            (pem("untrusted.crt", &cert), pem("untrusted.key", &key));
        let mut gw = Gateway::start(
            &root,
            &[
                "--runtime",
                runtime,
                "--pool",
                "base/egress=2",
                "--sandbox-reachable",
                "198.51.100.0/24",
                // Names the egress proxy resolves (network_scenarios.py's domain rules).
                "--egress-host",
                "allowed.test=198.51.100.7",
                "--egress-host",
                "x.apps.test=198.51.100.7",
                "--egress-host",
                "private.test=127.0.0.1",
                "--egress-host",
                "api.secure.test=198.51.100.7",
                "--egress-host",
                "bare.secure.test=198.51.100.7",
                "--egress-host",
                "plain.test=198.51.100.7",
                "--egress-host",
                "untrusted.secure.test=198.51.100.8",
                "--egress-host",
                "loopback.secure.test=127.0.0.1",
                "--egress-ca-file",
                &ca_file,
            ],
        );
        let env = vec![
            ("E2B_API_URL", gw.url.clone()),
            ("E2B_SANDBOX_URL", gw.url.clone()),
            ("SERVER_A", SERVER_A.to_string()),
            ("SERVER_B", SERVER_B.to_string()),
            ("RUNTIME", runtime.to_string()),
            ("TRUSTED_CERT", trusted_cert),
            ("TRUSTED_KEY", trusted_key),
            ("UNTRUSTED_CERT", untrusted_cert),
            ("UNTRUSTED_KEY", untrusted_key),
        ];
        scenarios::pytest("2.63.0", &["network_scenarios.py"], &[], &env, &[]);
        if js {
            let script = repo().join("tests/e2b/js/network.mjs");
            scenarios::run(
                "js e2b 2.51.0 network",
                Path::new("node"),
                &[&script.display().to_string()],
                &env,
                &[],
            );
        }
        gw.proc.terminate();
        gw.data.join("node/sandboxes")
    })
    .join()
    .expect("the scenarios passed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_policies_with_the_sdks() {
    ensure_sdks();
    // Built (or found) before leaving the machine's network: the build downloads packages.
    templates_dir();
    let (tmp, _) = workspace();
    let sandboxes = scenarios_in_private_network(tmp.path(), "builtin", true);
    assert_no_leaks(tmp.path(), &[sandboxes]).await;
}

/// The same policies, domain allow-lists and header rules on gVisor, whose network stack
/// reaches the rules and the egress proxy through its router namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_policies_on_gvisor() {
    let runsc = std::process::Command::new("runsc")
        .arg("--version")
        .output();
    if !runsc.is_ok_and(|o| o.status.success()) {
        println!("skipped: runsc is not installed (apt-get install runsc); CI installs it");
        return;
    }
    ensure_sdks();
    templates_dir();
    let (tmp, _) = workspace();
    let sandboxes = scenarios_in_private_network(tmp.path(), "gvisor", false);
    assert_no_leaks(tmp.path(), &[sandboxes]).await;
}
