//! Hostile input over the wire: schemathesis (pinned in tests/e2b/setup.sh) generates requests
//! from `openapi/e2b.json` and from the OpenAPI v3 and v2 documents the facade serves, sends
//! them to the real gateway binary, and fails on any 5xx (`not_a_server_error`; the one
//! expected 501 is in tests/fuzz/schemathesis.toml). Then its stateful phase follows the e2b
//! document's OpenAPI links (src/e2b/openapi.rs) through sequences of calls on real sandboxes
//! and snapshots: create, then get, time out, pause, connect, fork, snapshot, list, delete,
//! with the ids the responses returned; there `use_after_free` also fails a deleted sandbox or
//! snapshot that still answers 2xx. A second test sends `openapi/interpreter.json` (the Code
//! Interpreter on port 49999) to a real code-interpreter sandbox through the data plane.
//! Bounded for CI: `SCHEMA_FUZZ_SECONDS` (default 40 per document, four documents),
//! `SCHEMA_FUZZ_STATEFUL_SECONDS` (default 30) and `SCHEMA_FUZZ_EXAMPLES` (default 20 per
//! operation) make it longer, `SCHEMA_FUZZ_SEED` replays a run. The `fuzz-figure` lines are
//! what `tests/reliability.sh fuzz` collects.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use common::kube_gateway::{KEY_ADMIN, KEY_TEAM_A, KubeGateway};
use common::{
    Gateway, KEY_A, assert_no_leaks, code_interpreter_templates, ensure_sdks, repo, sdk_dir,
    workspace,
};

/// One run at a time: both runs load both cores, and each has request timeouts to keep.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

/// What one schemathesis run reported.
struct Run {
    /// Its exit code: 0 passed, 1 a check failed, 2 the run itself could not do its job (see
    /// schemathesis's `cli/constants.py`).
    code: Option<i32>,
    output: String,
}

impl Run {
    fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// Whether the run failed inside schemathesis or Hypothesis and nothing else: no check
    /// failed, and every error it lists is its own "Runtime Error" (e.g. a Hypothesis
    /// `FlakyFailure` around a `KeyError` in schemathesis's strategies, seen after thousands of
    /// passing cases, or "Inconsistent results" while it generated coverage cases; the exit
    /// code is then 1 or 2). Network errors, unresponsive operations and anything else that
    /// could be the gateway's doing are not.
    fn failed_internally(&self) -> bool {
        if !matches!(self.code, Some(1 | 2)) || self.output.contains(" FAILURES ") {
            return false;
        }
        let mut lines = self.output.lines().map(str::trim);
        let errors: Vec<&str> = match lines.find(|l| *l == "Errors:") {
            Some(_) => lines.take_while(|l| !l.is_empty()).collect(),
            None => return false,
        };
        !errors.is_empty() && errors.iter().all(|l| l.contains("Runtime Error:"))
    }

    /// The part of the output that says what went wrong: the FAILURES or ERRORS section (at
    /// most 60 lines of it) and the seed that replays the run.
    fn what_failed(&self) -> String {
        let lines: Vec<&str> = self.output.lines().collect();
        let start = lines
            .iter()
            .position(|l| l.contains("= FAILURES =") || l.contains("= ERRORS ="))
            .unwrap_or(0);
        let end = lines[start..]
            .iter()
            .position(|l| l.contains("= SUMMARY ="))
            .map_or(lines.len(), |n| start + n);
        let mut excerpt: Vec<&str> = lines[start..end].iter().take(60).copied().collect();
        excerpt.extend(lines.iter().filter(|l| l.starts_with("Seed:")));
        excerpt.join("\n")
    }

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
/// is printed as it is, followed by one `fuzz-figure` line. A run that failed inside
/// schemathesis itself (`Run::failed_internally`) is made once more, with a new seed unless
/// SCHEMA_FUZZ_SEED gives one: it says nothing about the gateway, which a second run tests.
fn schemathesis(
    name: &str,
    phases: Phases,
    schema: &Path,
    url: &str,
    extra: &[&str],
    report: &Path,
) -> Run {
    let (phase_list, checks, seconds) = match phases {
        // The e2b document declares every status each route answers (SDK generators and
        // clients rely on it), so an undeclared one fails the run there.
        Phases::Operations if name == "e2b" => (
            "examples,coverage,fuzzing",
            "not_a_server_error,status_code_conformance",
            env_number("SCHEMA_FUZZ_SECONDS", 40),
        ),
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
    let mut cmd = Command::new(sdk_dir().join("py-schemathesis/bin/schemathesis"));
    cmd.arg("--config-file")
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
        .env("NO_COLOR", "1");
    let run = run_once(name, &mut cmd);
    if !run.failed_internally() {
        return run;
    }
    println!(
        "schemathesis failed internally on {name}, not on an answer of the gateway; running it once more:\n{}",
        run.what_failed()
    );
    run_once(name, &mut cmd)
}

/// Runs `cmd` (a `schemathesis run`) and prints what it said and its `fuzz-figure` line.
fn run_once(name: &str, cmd: &mut Command) -> Run {
    let started = Instant::now();
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run {:?}: {e}", cmd.get_program()));
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
        code: out.status.code(),
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

// The test answers an error rather than panicking when a run fails, so that what failed is
// the last thing it prints (a panic's backtrace would come after it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_server_errors_for_generated_requests() -> Result<(), String> {
    let _one = ONE_AT_A_TIME.lock().await;
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
    //
    // A sandbox's log stays readable to its team for 15 minutes after the sandbox ends
    // (killed, expired or died), as e2b's does: `e2b sandbox logs --follow` polls the log of a
    // sandbox someone kills and must read its last lines, not a 404 (tests/e2b_cli.rs). So a
    // 200 from the logs routes after DELETE is the documented behaviour, and those two routes
    // sit out this phase (the operations phase above still sends them generated requests).
    // (A per-operation `checks.use_after_free.enabled = false` in tests/fuzz/schemathesis.toml
    // did not stop the check in a CI run, where the command line names it.)
    let stateful_args: Vec<&str> = e2b_args
        .iter()
        .copied()
        .chain(["--exclude-path-regex", "/logs$"])
        .collect();
    let stateful = schemathesis(
        "e2b-stateful",
        Phases::Stateful,
        &e2b_doc,
        &gw.e2b_url,
        &stateful_args,
        &report,
    );
    // Links that resolve to nothing would make this phase pass without a single sequence of
    // real calls: it must have followed some.
    let followed = stateful.figure("API Links:").unwrap_or(0);
    assert!(
        !stateful.ok() || followed >= 5,
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

    let failed: Vec<&(&str, Run)> = runs.iter().filter(|(_, run)| !run.ok()).collect();
    if !failed.is_empty() {
        for (name, run) in &failed {
            eprintln!(
                "schemathesis failed on {name} (exit {:?}):\n{}\n",
                run.code,
                run.what_failed()
            );
        }
        let names: Vec<&str> = failed.iter().map(|(name, _)| *name).collect();
        return Err(format!("schemathesis failed on {}", names.join(", ")));
    }
    // Whatever the generated requests created is gone with the gateway.
    gw.proc.terminate();
    assert_no_leaks(tmp.path(), &[gw.sandboxes_dir()]).await;
    Ok(())
}

/// The Code Interpreter's document (`openapi/interpreter.json`), sent to port 49999 of a real
/// code-interpreter sandbox through the gateway's data plane as the SDKs reach it: generated
/// contexts, restarts, deletes and executions whose generated code real kernels run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_server_errors_from_the_code_interpreter() -> Result<(), String> {
    let _one = ONE_AT_A_TIME.lock().await;
    ensure_sdks();
    code_interpreter_templates();
    let (tmp, _) = workspace();
    let mut gw = Gateway::start(tmp.path(), &["--pool", "code-interpreter/none/medium=1"]);
    let mut warm = 0;
    for _ in 0..1800 {
        warm = gw.warm_of("code-interpreter/").await;
        if warm == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        warm, 1,
        "the code-interpreter pool did not fill within 3 minutes"
    );
    let sb = gw
        .create(
            KEY_A,
            serde_json::json!({"templateID": "code-interpreter", "timeout": 900, "allowInternetAccess": false}),
        )
        .await;
    let id = sb["sandboxID"].as_str().expect("a sandbox id").to_string();
    let report = tmp.path().join("schemathesis");
    std::fs::create_dir_all(&report).unwrap();
    let args = [
        "--header".to_string(),
        format!("E2b-Sandbox-Id: {id}"),
        "--header".to_string(),
        "E2b-Sandbox-Port: 49999".to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let doc = repo().join("openapi/interpreter.json");
    let run = schemathesis(
        "interpreter",
        Phases::Operations,
        &doc,
        &gw.url,
        &args,
        &report,
    );
    if !run.ok() {
        eprintln!(
            "schemathesis failed on interpreter (exit {:?}):\n{}\n",
            run.code,
            run.what_failed()
        );
        return Err("schemathesis failed on interpreter".into());
    }
    // The sandbox still runs code after all of it.
    let after = gw
        .http
        .post(format!("{}/execute", gw.url))
        .header("E2b-Sandbox-Id", &id)
        .header("E2b-Sandbox-Port", "49999")
        .json(&serde_json::json!({"code": "6 * 7"}))
        .send()
        .await
        .map_err(|e| format!("execute after the run: {e}"))?
        .text()
        .await
        .unwrap_or_default();
    assert!(after.contains(r#""text":"42""#), "after the run: {after}");
    assert_eq!(gw.kill(KEY_A, &id).await, reqwest::StatusCode::NO_CONTENT);
    gw.proc.terminate();
    assert_no_leaks(tmp.path(), &[gw.data.join("node/sandboxes")]).await;
    Ok(())
}

mod reading_runs {
    //! `Run`'s reading of schemathesis's output, on outputs shaped as schemathesis 4.32 prints
    //! them.

    use super::Run;

    fn run(code: i32, tail: &str) -> Run {
        Run {
            code: Some(code),
            output: format!(
                "Schemathesis v4.32.5\n\n ✅  Fuzzing (in 33.90s)\n\n{tail}\nSeed: 1234\n\n== 1 error in 40.02s ==\n"
            ),
        }
    }

    const INTERNAL: &str = "=================== ERRORS ===================\n\
        ___ GET /apis/agents.x-k8s.io/v1beta1/sandboxes ___\n\
        FlakyFailure: Hypothesis found 2 distinct failures\n\
        KeyError: 'schema'\n\
        =================== SUMMARY ===================\n\n\
        Errors:\n  🚫 Runtime Error: 1\n\n\
        Test cases:\n  6261 generated, 6261 passed\n";

    #[test]
    fn only_its_own_runtime_errors_are_internal() {
        assert!(run(2, INTERNAL).failed_internally());
        // As CI saw it: an error while generating coverage cases, exit code 1.
        let generating = INTERNAL.replace(
            "FlakyFailure: Hypothesis found 2 distinct failures\nKeyError: 'schema'",
            "Runtime Error\n\nInconsistent results: A test case failed on the first run but now succeeds",
        );
        assert!(run(1, &generating).failed_internally());
        let network = INTERNAL.replace("Runtime Error: 1", "Network Error: 3");
        assert!(!run(2, &network).failed_internally());
        let both = INTERNAL.replace(
            "Runtime Error: 1\n",
            "Runtime Error: 1\n  🚫 Unresponsive Operation: 1\n",
        );
        assert!(!run(2, &both).failed_internally());
        // A failed check is never internal, whatever else went wrong.
        let failed = INTERNAL.replace("== ERRORS ==", "== FAILURES ==");
        assert!(!run(1, &failed).failed_internally());
        assert!(!run(2, &failed).failed_internally());
        assert!(!run(0, "Test cases:\n  10 generated, 10 passed\n").failed_internally());
        assert!(!run(101, INTERNAL).failed_internally());
        // An error without the summary that names it: nothing says it was schemathesis's own.
        assert!(!run(2, "Error: something went wrong\n").failed_internally());
    }

    #[test]
    fn what_failed_is_the_section_and_the_seed() {
        let said = run(2, INTERNAL).what_failed();
        assert!(said.starts_with("=================== ERRORS"), "{said}");
        assert!(said.contains("KeyError: 'schema'"), "{said}");
        assert!(!said.contains("Test cases:"), "{said}");
        assert!(said.ends_with("Seed: 1234"), "{said}");
        let long = format!(
            "== FAILURES ==\n{}== SUMMARY ==\n",
            "a failing case\n".repeat(100)
        );
        assert_eq!(run(1, &long).what_failed().lines().count(), 61);
    }
}
