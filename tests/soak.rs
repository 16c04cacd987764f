//! The soak and chaos driver's short variant (`examples/soak`, built by `cargo test` with the
//! other examples): a few hundred churn cycles across 3 nodes and 2 gateway replicas with e2b
//! and Kubernetes clients mixed, then the fault matrix (kills mid-operation, a restart with
//! state, a node that stops answering). The driver fails on any failed cycle and on anything
//! left behind (descriptors too, less the fleet's ends of the driver's own connections); its
//! report must say so too. The full run (10 000 cycles) is `tests/reliability.sh soak`.

mod common;

use std::process::Command;

use common::*;

#[test]
fn a_short_soak_leaves_nothing_behind() {
    // Built before the driver starts nodes that need it.
    templates_dir();
    let exe = std::env::current_exe().expect("the test binary");
    let driver = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("examples/soak"))
        .expect("the target directory");
    assert!(
        driver.exists(),
        "{} is missing: `cargo test` builds the examples",
        driver.display()
    );
    let out = Command::new(&driver)
        .args(["--cycles", "300", "--concurrency", "8"])
        .env("SANDBOX_GATEWAY_BIN", env!("CARGO_BIN_EXE_sandbox-gateway"))
        .env("SANDBOX_GATEWAY_TEMPLATES_DIR", templates_dir())
        .output()
        .expect("run the soak driver");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the soak failed:\n{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report.contains("| failed cycles | 0 |"), "{report}");
    assert!(
        report.contains("instance directories +0, sandbox processes +0, mounts +0, loop devices +0, checkpoints +0, fleet file descriptors +0"),
        "{report}"
    );
    for fault in [
        "gateway SIGKILL",
        "node SIGKILL during",
        "node SIGKILL and restart",
    ] {
        assert!(report.contains(fault), "{fault} missing from\n{report}");
    }
    assert!(report.contains("snapshot listed: true"), "{report}");
    // The cases in the middle of one operation: each row is the case's own line.
    let row = |name: &str| {
        report
            .lines()
            .find(|l| l.starts_with(&format!("| {name}")))
            .unwrap_or_else(|| panic!("{name} missing from\n{report}"))
            .to_string()
    };
    for name in [
        "node SIGKILL during a streaming command",
        "node SIGKILL during a 64 MiB file upload",
    ] {
        let r = row(name);
        assert!(r.contains("GET after the restart: 404"), "{r}");
    }
    let upload = row("node SIGKILL during a 64 MiB file upload");
    assert!(
        upload.contains("502") && upload.contains("node broke"),
        "a broken tunnel is not a missing sandbox: {upload}"
    );
    for name in [
        "node SIGKILL during a snapshot",
        "node SIGKILL during a fork",
    ] {
        let r = row(name);
        assert!(
            r.contains("nothing: no checkpoint directory without a listed snapshot"),
            "{r}"
        );
    }
    let slow = row("a node that stops answering");
    assert!(
        slow.contains("GET of its sandbox 503 (Retry-After 1)")
            && slow.contains("DELETE of its sandbox 503 (Retry-After 1)")
            && slow.contains("GET of its sandbox 200")
            && slow.contains("no sandbox the clients were not told of"),
        "{slow}"
    );
}
