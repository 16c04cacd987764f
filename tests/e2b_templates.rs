//! Template builds (e2b's build system 2.0) through the real e2b SDKs against `serve`: every
//! instruction, start and ready commands, failures and the step they name, the cache,
//! background builds, names and tenancy (tests/e2b/py/template_scenarios.py), and the bad
//! input the routes refuse. Built templates are stacks of layers over their parent's root.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A templates directory of the test's own holding `base` (its root is the shared test
/// template's, linked), so that what the builds write stays with the test.
fn private_templates(tmp: &Path) -> PathBuf {
    let shared = templates_dir().join("base");
    let dir = tmp.join("templates");
    let base = dir.join("base");
    std::fs::create_dir_all(&base).unwrap();
    std::fs::copy(shared.join("template.json"), base.join("template.json")).unwrap();
    let root = std::fs::canonicalize(shared.join("rootfs")).unwrap();
    std::os::unix::fs::symlink(root, base.join("rootfs")).unwrap();
    dir
}

async fn gateway(tmp: &Path, extra: &[&str]) -> Gateway {
    let templates = private_templates(tmp);
    let mut args = vec![
        "--templates-dir".to_string(),
        templates.display().to_string(),
        "--pool".to_string(),
        "base=1".to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Gateway::start(tmp, &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_build_with_the_sdks() {
    ensure_sdks();
    let (tmp, _) = workspace();
    let mut gw = gateway(tmp.path(), &[]).await;
    let env = vec![
        ("E2B_API_URL", gw.url.clone()),
        ("E2B_SANDBOX_URL", gw.url.clone()),
    ];
    tokio::task::block_in_place(|| {
        scenarios::pytest("2.63.0", &["template_scenarios.py"], &[], &env, &[]);
        scenarios::node("js e2b 2.51.0 templates", "templates.mjs", false, &env, &[]);
    });
    gw.proc.terminate();
    assert_no_leaks(tmp.path(), &[gw.data.join("node/sandboxes")]).await;
}

/// A tar archive of `members` (name, bytes), built by hand so that it may be hostile.
fn tar_of(members: &[(&str, u8, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, kind, data) in members {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..108].copy_from_slice(b"0000644\0");
        h[108..116].copy_from_slice(b"0000000\0");
        h[116..124].copy_from_slice(b"0000000\0");
        let size = format!("{:011o}\0", data.len());
        h[124..136].copy_from_slice(size.as_bytes());
        h[136..148].copy_from_slice(b"00000000000\0");
        h[156] = *kind;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_build_input_is_refused_and_nothing_is_kept() {
    let (tmp, _) = workspace();
    let mut gw = gateway(tmp.path(), &["--template-upload-max-mib", "1"]).await;
    let http = reqwest::Client::new();
    let call = |method: reqwest::Method, path: &str, key: &str, body: Option<Value>| {
        let mut r = http
            .request(method, format!("{}{path}", gw.url))
            .header("X-API-KEY", key);
        if let Some(b) = body {
            r = r.json(&b);
        }
        r.send()
    };
    // Names, tags and resources.
    for body in [
        json!({}),
        json!({"name": "Bad Name"}),
        json!({"name": "ok:"}),
        json!({"name": "ok", "tags": ["6f1c2b8e-0d3a-4c55-9f0e-2a7d1b3c4d5e"]}),
        json!({"name": "ok", "cpuCount": 3}),
        json!({"name": "ok", "memoryMB": 127}),
        json!({"name": "team-b/ok"}),
    ] {
        let r = call(
            reqwest::Method::POST,
            "/v3/templates",
            KEY_A,
            Some(body.clone()),
        )
        .await
        .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{body}");
    }
    // An alias that is a node template's name is taken.
    let r = call(
        reqwest::Method::POST,
        "/v3/templates",
        KEY_A,
        Some(json!({"name": "base"})),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);

    let r = call(
        reqwest::Method::POST,
        "/v3/templates",
        KEY_A,
        Some(json!({"name": "bad-input"})),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let made: Value = r.json().await.unwrap();
    let tid = made["templateID"].as_str().unwrap().to_string();
    let bid = made["buildID"].as_str().unwrap().to_string();
    assert!(uuid_like(&bid), "{made}");

    // Hashes, builds and teams.
    let hash = "a".repeat(64);
    let get = |path: String, key: &'static str| call(reqwest::Method::GET, &path, key, None);
    assert_eq!(
        get(format!("/templates/{tid}/files/{}", "A".repeat(64)), KEY_A)
            .await
            .unwrap()
            .status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        get(format!("/templates/{tid}/files/abc"), KEY_A)
            .await
            .unwrap()
            .status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        get(format!("/templates/{tid}/files/{hash}"), KEY_B)
            .await
            .unwrap()
            .status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        get(format!("/templates/nosuch/files/{hash}"), KEY_A)
            .await
            .unwrap()
            .status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(format!("/templates/{tid}/builds/not-a-uuid/status"), KEY_A)
            .await
            .unwrap()
            .status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        get(
            format!("/templates/{tid}/builds/6f1c2b8e-0d3a-4c55-9f0e-2a7d1b3c4d5e/status"),
            KEY_A
        )
        .await
        .unwrap()
        .status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(format!("/templates/{tid}/builds/{bid}/status"), KEY_B)
            .await
            .unwrap()
            .status(),
        StatusCode::FORBIDDEN
    );
    let status: Value = get(format!("/templates/{tid}/builds/{bid}/status"), KEY_A)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["status"], "waiting", "{status}");

    // The upload: the signed URL is the only credential, and it is for this hash only.
    let files: Value = get(format!("/templates/{tid}/files/{hash}"), KEY_A)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(files["present"], false);
    let url = files["url"].as_str().unwrap().to_string();
    let put = |url: String, body: Vec<u8>| http.put(url).body(body).send();
    let tampered = url.replace(&hash, &"b".repeat(64));
    assert_eq!(
        put(tampered, tar_of(&[])).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    let unsigned = url.split('?').next().unwrap().to_string();
    assert_eq!(
        put(unsigned, tar_of(&[])).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    for (label, archive) in [
        ("parent dir", tar_of(&[("../escape", b'0', b"x")])),
        ("absolute", tar_of(&[("/etc/escape", b'0', b"x")])),
        ("device", tar_of(&[("dev", b'3', b"")])),
        ("fifo", tar_of(&[("fifo", b'6', b"")])),
        ("not a tar", b"this is not an archive".to_vec()),
    ] {
        let r = put(url.clone(), archive).await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{label}");
    }
    let big = vec![0u8; 2 << 20];
    assert_eq!(
        put(url.clone(), big).await.unwrap().status(),
        StatusCode::PAYLOAD_TOO_LARGE
    );
    // None of it was kept, and nothing was written outside the uploads.
    let files: Value = get(format!("/templates/{tid}/files/{hash}"), KEY_A)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(files["present"], false, "a refused upload is not kept");
    assert!(!tmp.path().join("escape").exists());
    let good = tar_of(&[("files/a.txt", b'0', b"a")]);
    assert_eq!(
        put(url.clone(), good).await.unwrap().status(),
        StatusCode::OK
    );
    let files: Value = get(format!("/templates/{tid}/files/{hash}"), KEY_A)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(files["present"], true);

    // Starting: another team's build, then twice.
    let spec = json!({"fromTemplate": "base", "steps": [{"type": "RUN", "args": ["true"]}]});
    let start = format!("/v2/templates/{tid}/builds/{bid}");
    assert_eq!(
        call(reqwest::Method::POST, &start, KEY_B, Some(spec.clone()))
            .await
            .unwrap()
            .status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(reqwest::Method::POST, &start, KEY_A, Some(spec.clone()))
            .await
            .unwrap()
            .status(),
        StatusCode::ACCEPTED
    );
    assert_eq!(
        call(reqwest::Method::POST, &start, KEY_A, Some(spec))
            .await
            .unwrap()
            .status(),
        StatusCode::BAD_REQUEST
    );
    gw.proc.terminate();
}

fn uuid_like(s: &str) -> bool {
    s.len() == 36 && s.chars().filter(|&c| c == '-').count() == 4
}
