//! e2b's Code Interpreter through the gateway, on real sandboxes of the `code-interpreter`
//! template with real kernels:
//! - the unmodified SDKs with their defaults: Python `e2b-code-interpreter` 2.11.5 (sync and
//!   async, tests/e2b/py/code_interpreter_scenarios.py) and JS `@e2b/code-interpreter` 2.8.0
//!   (tests/e2b/js/code_interpreter.mjs), on the built-in runtime by `E2B_SANDBOX_URL` and in the
//!   domain mode (TLS, `https://49999-{id}.{domain}`), and on gVisor, where pause, snapshot
//!   and fork keep the kernels' state;
//! - what no SDK sends: bodies the server must refuse, a context too many, a run that prints a
//!   gibibyte (the gateway and the server stay small, a slow reader included);
//! - a sandbox made with `kubectl` (image `code-interpreter`) running code the same way.
//!
//! The gateways run one at a time: each keeps warm sandboxes with started kernels, and the
//! SDK scenarios time interrupts and parallel runs.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

const MIB: u64 = 1 << 20;

/// Skips a run may report: scenarios that cannot apply to the way it runs.
const ALLOWED_SKIPS: &[&str] = &["gvisor runtime only: memory is kept", "quick run"];

/// One gateway at a time (see the module's comment).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn pytest(env: &[(&str, String)], plugins: &[&str]) {
    scenarios::pytest(
        "ci-2.11.5",
        &["code_interpreter_scenarios.py"],
        plugins,
        env,
        ALLOWED_SKIPS,
    );
}

fn js(env: &[(&str, String)], preload: bool) {
    scenarios::node(
        "js @e2b/code-interpreter 2.8.0",
        "code_interpreter.mjs",
        preload,
        env,
        ALLOWED_SKIPS,
    );
}

/// A gateway with code-interpreter pools (with and without internet), waited until warm.
async fn gateway(tmp: &Path, extra: &[&str]) -> Gateway {
    code_interpreter_templates();
    let mut args = vec![
        "--pool",
        "code-interpreter/egress/medium=2",
        "--pool",
        "code-interpreter/none/medium=1",
    ];
    args.extend_from_slice(extra);
    let gw = Gateway::start(tmp, &args);
    for _ in 0..1800 {
        if gw.warm_of("code-interpreter/").await == 3 {
            return gw;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the code-interpreter pools did not fill within 3 minutes");
}

/// A request to port 49999 of `sandbox` through the gateway's data plane (headers).
fn interp(
    gw: &Gateway,
    sandbox: &str,
    method: reqwest::Method,
    path: &str,
) -> reqwest::RequestBuilder {
    gw.http
        .request(method, format!("{}{path}", gw.url))
        .header("E2b-Sandbox-Id", sandbox)
        .header("E2b-Sandbox-Port", "49999")
}

/// The lines of an `/execute` answer.
async fn execute(gw: &Gateway, sandbox: &str, body: Value) -> (StatusCode, Vec<Value>) {
    let res = interp(gw, sandbox, reqwest::Method::POST, "/execute")
        .json(&body)
        .send()
        .await
        .expect("execute");
    let status = res.status();
    let text = res.text().await.unwrap_or_default();
    let lines = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or(Value::String(l.to_string())))
        .collect();
    (status, lines)
}

/// The `text` of the main result among `lines`.
fn main_text(lines: &[Value]) -> Option<String> {
    lines
        .iter()
        .find(|l| l["type"] == "result" && l["is_main_result"] == true)
        .and_then(|l| l["text"].as_str().map(str::to_string))
}

/// Refusals the SDKs never provoke but any client could.
async fn bad_input_is_refused(gw: &Gateway, sb: &str) {
    let post = |body: &str| {
        interp(gw, sb, reqwest::Method::POST, "/execute")
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    for body in [
        r#"{"code": {"context": "x"}}"#,
        r#"{"code": 7}"#,
        r#"{"language": "python"}"#,
        "",
        "[1]",
        "{not json",
        r#"{"code": "1", "env_vars": {"A": 1}}"#,
        r#"{"code": "1", "env_vars": "A=1"}"#,
        r#"{"code": "1", "language": 3}"#,
    ] {
        let r = post(body).await.unwrap();
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let detail: Value = r.json().await.unwrap();
        assert!(detail["detail"][0]["loc"].is_array(), "{body}: {detail}");
    }
    let r = post(r#"{"code": "1", "context_id": "abc", "language": "python"}"#)
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("Only one of context_id or language can be provided")
    );
    let r = post(r#"{"code": "1", "context_id": "nope"}"#)
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(r.text().await.unwrap(), "Context nope not found");
    let r = post(r#"{"code": "1", "env_vars": {"A=B": "x"}}"#)
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = post(r#"{"code": "1", "env_vars": {"A": "x\u0000y"}}"#)
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().contains("NUL byte"));
    // Languages that do not exist are refused alike, however many a client makes up.
    for n in 0..200 {
        let r = post(&format!(r#"{{"code": "1", "language": "made-up-{n}"}}"#))
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    }
    // Empty strings count as absent, unknown query parameters are ignored.
    let (status, lines) = execute(
        gw,
        sb,
        json!({"code": "6 * 7", "context_id": "", "language": "", "env_vars": null}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(main_text(&lines).as_deref(), Some("42"));
    assert_eq!(lines.last().unwrap()["type"], "end_of_execution");
    for (method, path, status) in [
        (reqwest::Method::POST, "/contexts/nope/restart", 404),
        (reqwest::Method::DELETE, "/contexts/nope", 404),
        (reqwest::Method::GET, "/nowhere", 404),
        (reqwest::Method::GET, "/health?source=ci", 200),
    ] {
        let r = interp(gw, sb, method.clone(), path).send().await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{method} {path}");
    }
    let health = interp(gw, sb, reqwest::Method::GET, "/health")
        .send()
        .await
        .unwrap();
    assert_eq!(health.text().await.unwrap(), "\"OK\"");
    let r = interp(gw, sb, reqwest::Method::POST, "/contexts")
        .json(&json!({"cwd": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

/// Contexts are kernels with their own memory: past what the sandbox has, a new one is a
/// clear 429, the others keep working, and removing one makes room again.
async fn too_many_contexts_is_a_clear_limit(gw: &Gateway, sb: &str) {
    let mut made = Vec::new();
    let refusal = loop {
        let r = interp(gw, sb, reqwest::Method::POST, "/contexts")
            .json(&json!({"language": "python"}))
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            break r.text().await.unwrap();
        }
        assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
        made.push(
            r.json::<Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
        assert!(made.len() <= 16, "no limit after {} contexts", made.len());
    };
    assert!(
        refusal.contains("contexts") || refusal.contains("memory"),
        "{refusal}"
    );
    assert!(!made.is_empty(), "room for at least one more context");
    for id in &made {
        let (_, lines) = execute(gw, sb, json!({"code": "'alive'", "context_id": id})).await;
        assert_eq!(main_text(&lines).as_deref(), Some("alive"));
    }
    let last = made.pop().unwrap();
    let r = interp(
        gw,
        sb,
        reqwest::Method::DELETE,
        &format!("/contexts/{last}"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.text().await.unwrap(), "null");
    let r = interp(gw, sb, reqwest::Method::POST, "/contexts")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "room again after a removal");
    made.push(
        r.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string(),
    );
    for id in made {
        interp(gw, sb, reqwest::Method::DELETE, &format!("/contexts/{id}"))
            .send()
            .await
            .unwrap();
    }
}

/// Samples the resident memory of `pids` every 50 ms until stopped; returns the peak of each.
fn sample_peaks(pids: Vec<i32>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<u64>> {
    std::thread::spawn(move || {
        let peaks: Vec<AtomicU64> = pids.iter().map(|_| AtomicU64::new(0)).collect();
        while !stop.load(Ordering::SeqCst) {
            for (i, &p) in pids.iter().enumerate() {
                peaks[i].fetch_max(rss_bytes(p), Ordering::SeqCst);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        peaks.iter().map(|p| p.load(Ordering::SeqCst)).collect()
    })
}

/// A cell that prints a gibibyte streams through with bounded memory in the gateway and in
/// the sandbox's server, also when its reader stops for a while.
async fn a_gibibyte_of_output_streams_in_bounded_memory(gw: &Gateway, sb: &str, tmp: &Path) {
    let gateway_pid = gw.proc.child.id() as i32;
    let servers: Vec<i32> = processes_under(tmp)
        .into_iter()
        .filter(|&p| process_name(p) == "interpreter")
        .collect();
    assert!(!servers.is_empty(), "the sandboxes' interpreter processes");
    let baseline: Vec<u64> = std::iter::once(gateway_pid)
        .chain(servers.iter().copied())
        .map(rss_bytes)
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_peaks(
        std::iter::once(gateway_pid)
            .chain(servers.iter().copied())
            .collect(),
        stop.clone(),
    );
    let code = "import sys\nchunk = 'x' * 65535 + '\\n'\nfor _ in range(16384):\n    sys.stdout.write(chunk)\n";
    let started = std::time::Instant::now();
    let mut res = interp(gw, sb, reqwest::Method::POST, "/execute")
        .json(&json!({ "code": code }))
        .timeout(Duration::from_secs(600))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut total = 0u64;
    let mut paused = false;
    let mut tail = Vec::new();
    while let Some(chunk) = res.chunk().await.unwrap() {
        total += chunk.len() as u64;
        tail.extend_from_slice(&chunk);
        if tail.len() > 4096 {
            tail.drain(..tail.len() - 4096);
        }
        if !paused && total > 64 * MIB {
            // A reader that stops: everything upstream holds still instead of buffering.
            paused = true;
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
    }
    let took = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let peaks = sampler.join().unwrap();
    assert!(total > 1024 * MIB, "only {} MiB arrived", total / MIB);
    let tail = String::from_utf8_lossy(&tail);
    assert!(
        tail.trim_end().ends_with(r#"{"type":"end_of_execution"}"#) && !tail.contains("\"error\""),
        "the run did not end cleanly: {tail}"
    );
    let grew = |i: usize| peaks[i].saturating_sub(baseline[i]) / MIB;
    println!(
        "1 GiB of output in {:.1} s: gateway {} MiB -> peak {} MiB, servers' peak {} MiB",
        took.as_secs_f64(),
        baseline[0] / MIB,
        peaks[0] / MIB,
        peaks[1..].iter().max().copied().unwrap_or(0) / MIB
    );
    assert!(grew(0) < 64, "the gateway grew by {} MiB", grew(0));
    for peak in &peaks[1..] {
        assert!(
            *peak < 128 * MIB,
            "an interpreter server reached {} MiB",
            peak / MIB
        );
    }
}

/// `kubectl` makes a sandbox of image `code-interpreter`; its port 49999 runs code the same
/// way (the data plane knows it by its claim id).
async fn a_kubectl_sandbox_runs_code(gw: &mut Gateway, tmp: &Path) {
    let k = Kubectl::for_gateway(gw, tmp);
    let kubectl = |args: &[&str], stdin: Option<&str>| k.run(args, stdin);
    kubectl(
        &["create", "-f", "-"],
        Some(
            r#"{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                "metadata": {"name": "kube-interpreter"},
                "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "code-interpreter"}]}}}}"#,
        ),
    );
    let obj: Value = serde_json::from_str(&kubectl(
        &["get", "sandbox", "kube-interpreter", "-o", "json"],
        None,
    ))
    .unwrap();
    let claim = obj["metadata"]["annotations"]["sandbox.cocoonstack.io/claim-id"]
        .as_str()
        .expect("claim id")
        .to_string();
    let (status, lines) = execute(gw, &claim, json!({"code": "import os\nos.getcwd()"})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(main_text(&lines).as_deref(), Some("/home/user"));
    let (_, lines) = execute(gw, &claim, json!({"code": "1 + 1", "language": "js"})).await;
    assert_eq!(main_text(&lines).as_deref(), Some("2"));
    kubectl(&["delete", "sandbox", "kube-interpreter"], None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_and_raw_clients_run_code_on_the_builtin_runtime() {
    let _one = ONE_AT_A_TIME.lock().await;
    ensure_sdks();
    let (tmp, _) = workspace();
    let mut gw = gateway(tmp.path(), &[]).await;
    let env = vec![
        ("E2B_API_URL", gw.url.clone()),
        ("E2B_SANDBOX_URL", gw.url.clone()),
    ];
    tokio::task::block_in_place(|| {
        pytest(&env, &[]);
        js(&env, false);
    });

    let sb = gw
        .create(
            KEY_A,
            json!({"templateID": "code-interpreter-v1", "timeout": 600}),
        )
        .await;
    let id = sb["sandboxID"].as_str().unwrap().to_string();
    bad_input_is_refused(&gw, &id).await;
    too_many_contexts_is_a_clear_limit(&gw, &id).await;
    a_gibibyte_of_output_streams_in_bounded_memory(&gw, &id, tmp.path()).await;
    a_kubectl_sandbox_runs_code(&mut gw, tmp.path()).await;
    assert_eq!(gw.kill(KEY_A, &id).await, StatusCode::NO_CONTENT);
    // Port 49999 of a sandbox that is gone answers as e2b's edge does (the SDKs' "killed").
    let r = interp(&gw, &id, reqwest::Method::GET, "/health")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_GATEWAY);

    gw.proc.terminate();
    assert_no_leaks(tmp.path(), &[gw.data.join("node/sandboxes")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_run_code_in_the_domain_mode() {
    let _one = ONE_AT_A_TIME.lock().await;
    ensure_sdks();
    code_interpreter_templates();
    let (tmp, _) = workspace();
    let mut gw = DomainGateway::start(
        tmp.path(),
        "interpreters.test",
        "code-interpreter/egress/medium=2",
    );
    let http = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&gw.ca).unwrap()).unwrap(),
        )
        .build()
        .unwrap();
    let metrics = format!("https://{}", gw.ip);
    let mut warm = 0;
    for _ in 0..1800 {
        warm = metrics_at(&http, &metrics)
            .await
            .lines()
            .filter(|l| l.starts_with("sandbox_gateway_warm_sandboxes{pool=\"code-interpreter/"))
            .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
            .sum::<f64>() as i64;
        if warm == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(warm, 2, "the code-interpreter pool did not fill");
    let mut env = gw.sdk_env();
    env.push(("CI_QUICK", "1".to_string()));
    tokio::task::block_in_place(|| {
        pytest(&env, &["resolve_override"]);
        js(&env, true);
    });
    gw.proc.terminate();
    assert_no_leaks(tmp.path(), &[gw.data.join("node/sandboxes")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_run_code_on_gvisor_and_kernels_survive_pause_snapshot_and_fork() {
    if !sandbox_gateway::node::runtime::sys::is_root()
        || sandbox_gateway::node::runtime::builtin::which("runsc").is_none()
    {
        eprintln!("skipped: needs root and runsc (.ci/run installs it)");
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    ensure_sdks();
    let (tmp, _) = workspace();
    let mut gw = gateway(tmp.path(), &["--runtime", "gvisor"]).await;
    let env = vec![
        ("E2B_API_URL", gw.url.clone()),
        ("E2B_SANDBOX_URL", gw.url.clone()),
        ("CI_RUNTIME", "gvisor".to_string()),
    ];
    tokio::task::block_in_place(|| {
        pytest(&env, &[]);
        js(&env, false);
    });
    gw.proc.terminate();
    assert_no_leaks(tmp.path(), &[gw.data.join("node/sandboxes")]).await;
}
