//! Hostile input over the wire: schemathesis (pinned in tests/e2b/setup.sh) generates requests
//! from `openapi/e2b.json` and from the OpenAPI v3 and v2 documents the facade serves, sends
//! them to the real gateway binary, and fails on any 5xx (`not_a_server_error`; the one
//! expected 501 is in tests/fuzz/schemathesis.toml). Then its stateful phase follows the e2b
//! document's OpenAPI links (src/e2b/openapi.rs) through sequences of calls on real sandboxes
//! and snapshots: create, then get, time out, pause, connect, fork, snapshot, list, delete,
//! with the ids the responses returned; there `use_after_free` also fails a deleted sandbox or
//! snapshot that still answers 2xx. Bounded for CI: `SCHEMA_FUZZ_SECONDS` (default 40 per
//! document, three documents), `SCHEMA_FUZZ_STATEFUL_SECONDS` (default 30) and
//! `SCHEMA_FUZZ_EXAMPLES` (default 20 per operation) make it longer, `SCHEMA_FUZZ_SEED` replays
//! a run. The `fuzz-figure` lines are what `tests/reliability.sh fuzz`
//! collects.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use common::kube_gateway::{KEY_ADMIN, KEY_TEAM_A, KubeGateway};
use common::{assert_no_leaks, ensure_sdks, repo, sdk_dir, workspace};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

/// What one schemathesis run reported.
struct Run {
    ok: bool,
    output: String,
}

impl Run {
    /// What follows `label` on the summary line that starts with it, e.g. "60 covered / 144
    /// selected / 144 total" after "API Links:".
    fn line(&self, label: &str) -> Option<&str> {
        let mut lines = self.output.lines().map(str::trim);
        lines.find_map(|l| l.strip_prefix(label)).map(str::trim)
    }

    /// The first number on that line.
    fn figure(&self, label: &str) -> Option<u64> {
        self.line(label)?.split_whitespace().next()?.parse().ok()
    }
}

/// Which phases a run has, and the checks they apply.
#[derive(Clone, Copy)]
enum Phases {
    /// Each operation on its own: `examples`, `coverage` and `fuzzing`.
    Operations,
    /// Sequences of calls that follow the document's links.
    Stateful,
}

/// `schemathesis run` of `schema` against `url` with `extra` options; the run's own summary
/// is printed as it is, followed by one `fuzz-figure` line.
fn schemathesis(
    name: &str,
    phases: Phases,
    schema: &Path,
    url: &str,
    extra: &[&str],
    report: &Path,
) -> Run {
    let (phase_list, checks, seconds) = match phases {
        Phases::Operations => (
            "examples,coverage,fuzzing",
            "not_a_server_error",
            env_number("SCHEMA_FUZZ_SECONDS", 40),
        ),
        // `ensure_resource_availability` is left out: a 404 after a create is often right
        // here, since a sandbox's lease may be as short as the generated timeout (1 s), and
        // the check took a sandbox created at /v2/sandboxes and then deleted at
        // /sandboxes/{id} for one that was never there.
        Phases::Stateful => (
            "stateful",
            "not_a_server_error,use_after_free",
            env_number("SCHEMA_FUZZ_STATEFUL_SECONDS", 30),
        ),
    };
    let seconds = seconds.to_string();
    let examples = env_number("SCHEMA_FUZZ_EXAMPLES", 20).to_string();
    // A failing run prints its seed; SCHEMA_FUZZ_SEED replays it.
    let seed = std::env::var("SCHEMA_FUZZ_SEED")
        .ok()
        .filter(|s| !s.is_empty());
    let bin = sdk_dir().join("py-schemathesis/bin/schemathesis");
    let started = Instant::now();
    let out = Command::new(&bin)
        .arg("--config-file")
        .arg(repo().join("tests/fuzz/schemathesis.toml"))
        .arg("run")
        .arg(schema)
        .args(["--url", url])
        .args(["--checks", checks])
        .args(["--phases", phase_list])
        .args(["--max-examples", &examples])
        .args(["--max-time", &seconds])
        .args(["--workers", "2"])
        .args(["--request-timeout", "30"])
        .args(["--suppress-health-check", "all"])
        .args(["--report", "junit"])
        .arg("--report-dir")
        .arg(report)
        .args(seed.iter().flat_map(|s| ["--seed", s.as_str()]))
        .args(extra)
        // Schemathesis writes its Hypothesis database into the working directory.
        .current_dir(report)
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()));
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{output}");
    // The summary, e.g. "Test cases:" and then "2862 generated, 2862 passed".
    let mut lines = output.lines().map(str::trim);
    let cases = lines
        .by_ref()
        .find(|l| l.starts_with("Test cases:"))
        .and_then(|_| lines.find(|l| !l.is_empty()))
        .unwrap_or_default()
        .to_string();
    let run = Run {
        ok: out.status.success(),
        output,
    };
    // A stateful run also says how many sequences it ran and how many links they followed.
    let summary = match (run.figure("Scenarios:"), run.line("API Links:")) {
        (Some(scenarios), Some(links)) => format!("{cases}; {scenarios} sequences, links {links}"),
        _ => cases,
    };
    println!(
        "fuzz-figure target=schemathesis/{name} secs={:.1} summary={summary:?} exit={}",
        started.elapsed().as_secs_f64(),
        out.status.code().unwrap_or(-1)
    );
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_server_errors_for_generated_requests() {
    ensure_sdks();
    let (tmp, _) = workspace();
    let mut gw = KubeGateway::start(tmp.path(), &[]);
    let report = tmp.path().join("schemathesis");
    std::fs::create_dir_all(&report).unwrap();

    let e2b_doc = repo().join("openapi/e2b.json");
    let e2b_args = ["--header", &format!("X-API-KEY: {KEY_TEAM_A}")];
    let mut runs = vec![(
        "e2b",
        schemathesis(
            "e2b",
            Phases::Operations,
            &e2b_doc,
            &gw.e2b_url,
            &e2b_args,
            &report,
        ),
    )];
    // The same gateway, as the SDKs use it: sequences of calls on sandboxes that exist. Every
    // create claims a real sandbox (the warm pool of 4, then cold starts, well below the
    // node's 512); those not deleted in a sequence end with their lease or the gateway.
    let stateful = schemathesis(
        "e2b-stateful",
        Phases::Stateful,
        &e2b_doc,
        &gw.e2b_url,
        &e2b_args,
        &report,
    );
    // Links that resolve to nothing would make this phase pass without a single sequence of
    // real calls: it must have followed some.
    let followed = stateful.figure("API Links:").unwrap_or(0);
    assert!(
        !stateful.ok || followed >= 5,
        "the stateful phase followed {followed} links:\n{}",
        stateful.output
    );
    runs.push(("e2b-stateful", stateful));

    // The facade's own documents, as kubectl and client generators fetch them: v3 carries
    // the schemas and every list parameter, v2 is what kube-apiserver merges.
    let ca = gw.dir.join("tls/ca.crt");
    let facade_args = [
        "--header".to_string(),
        format!("Authorization: Bearer {KEY_ADMIN}"),
        "--tls-verify".to_string(),
        ca.display().to_string(),
    ];
    let facade_args: Vec<&str> = facade_args.iter().map(String::as_str).collect();
    for (name, path) in [
        ("facade-v3", "/openapi/v3/apis/agents.x-k8s.io/v1beta1"),
        ("facade-v2", "/openapi/v2"),
    ] {
        let doc = gw
            .http()
            .get(format!("{}{path}", gw.kube_url))
            .bearer_auth(KEY_ADMIN)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
            .text()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        let file = tmp.path().join(format!("{name}.json"));
        std::fs::write(&file, doc).unwrap();
        runs.push((
            name,
            schemathesis(
                name,
                Phases::Operations,
                &file,
                &gw.kube_url,
                &facade_args,
                &report,
            ),
        ));
    }

    for (name, run) in runs {
        assert!(run.ok, "schemathesis failed on {name}:\n{}", run.output);
    }
    // Whatever the generated requests created is gone with the gateway.
    gw.proc.terminate();
    assert_no_leaks(tmp.path(), &[gw.sandboxes_dir()]).await;
}
