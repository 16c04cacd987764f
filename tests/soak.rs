//! The soak and chaos driver's short variant (`examples/soak`, built by `cargo test` with the
//! other examples): a few hundred churn cycles across 3 nodes and 2 gateway replicas with e2b
//! and Kubernetes clients mixed, then the fault matrix. The driver fails on any failed cycle
//! and on anything left behind; its report must say so too. The full run (10 000 cycles) is
//! `cargo run --release --example soak -- --out RELIABILITY.md`.

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
        report.contains("instance directories +0, sandbox processes +0, mounts +0, loop devices +0, checkpoints +0"),
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
}
