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
    let gw = Gateway::start(tmp, &args);
    // The node is up (and has booted a sandbox) before the first build is asked for.
    gw.wait_warm(1, "base").await;
    gw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_build_with_the_sdks() {
    ensure_sdks();
    let (tmp, _) = workspace();
    let gw = gateway(tmp.path(), &[]).await;
    let env = vec![
        ("E2B_API_URL", gw.url.clone()),
        ("E2B_SANDBOX_URL", gw.url.clone()),
    ];
    tokio::task::block_in_place(|| {
        scenarios::pytest("2.63.0", &["template_scenarios.py"], &[], &env, &[]);
        scenarios::node("js e2b 2.51.0 templates", "templates.mjs", false, &env, &[]);
    });
    stop_clean(gw, tmp.path()).await;
}

/// A gVisor node killed in the middle of a step leaves the step's disk mounted on the host (its
/// sandbox ends with it, through the reaper); its next start unmounts it, reports the build as
/// interrupted, builds again, and leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gvisor_node_killed_mid_build_cleans_up_when_it_starts_again() {
    let (tmp, _) = workspace();
    let mut gv = gateway(tmp.path(), &["--runtime", "gvisor"]).await;
    let slow = json!([{"type": "RUN", "args": ["sleep 120"]}]);
    let (tid, bid) = start_build(&gv, "cut-short", slow).await;
    let disk_mounted = || {
        kernel_leftovers(tmp.path())
            .iter()
            .any(|l| l.starts_with("mount ") && l.contains("/build/disk "))
    };
    eventually(
        std::time::Duration::from_secs(60),
        "the step's disk is mounted",
        disk_mounted,
    )
    .await;
    gv.proc.kill();
    assert!(disk_mounted(), "nothing but the node unmounts it");
    let templates = tmp.path().join("templates").display().to_string();
    let args = [
        "--templates-dir",
        &templates,
        "--runtime",
        "gvisor",
        "--pool",
        "base=1",
        "--built-template-pool",
        "0",
    ];
    let gv = Gateway::start(tmp.path(), &args);
    gv.wait_warm(1, "base after the restart").await;
    assert!(!disk_mounted(), "{:?}", kernel_leftovers(tmp.path()));
    let s = status(&gv, &tid, &bid).await;
    assert_eq!(s["status"], "error", "{s}");
    assert!(
        s["reason"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("interrupted"),
        "{s}"
    );

    // The next build works, and its template is ready for gVisor's boots when the build says
    // ready (no warm pool here makes it): the first claim need not copy it within its deadline.
    let quick = json!([{"type": "RUN", "args": ["echo again > /home/user/again"]}]);
    let (tid, bid) = start_build(&gv, "after-restart", quick).await;
    let s = ended(&gv, &tid, &bid).await;
    assert_eq!(s["status"], "ready", "{s}");
    let built = tmp
        .path()
        .join("templates")
        .join(format!("{tid}.{}", &bid[..8]));
    let meta: Value =
        serde_json::from_slice(&std::fs::read(built.join("template.json")).unwrap()).unwrap();
    let plain = std::fs::read_to_string(built.join("rootfs-plain.id")).unwrap_or_default();
    assert_eq!(plain.trim(), meta["id"].as_str().unwrap(), "{built:?}");
    assert!(built.join("rootfs-plain/home/user/again").is_file());
    stop_clean(gv, tmp.path()).await;
}

/// The Python SDK's central scenarios again with a gVisor node doing the builds: every
/// instruction, start and ready commands, the cache, a template on a built template, and
/// `apt_install` (the rest is the same gateway code whatever the runtime).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_build_with_the_python_sdk_on_gvisor() {
    ensure_sdks();
    let (tmp, _) = workspace();
    let gw = gateway(tmp.path(), &["--runtime", "gvisor"]).await;
    let env = vec![
        ("E2B_API_URL", gw.url.clone()),
        ("E2B_SANDBOX_URL", gw.url.clone()),
    ];
    tokio::task::block_in_place(|| {
        let scenarios = [
            "test_a_build_with_every_instruction_makes_the_sandboxes_it_describes",
            "test_start_and_ready_commands_run_before_the_sandbox_is_handed_out",
            "test_an_unchanged_rebuild_comes_from_the_cache",
            "test_a_template_built_on_a_built_template_stacks_on_it",
            "test_apt_install_from_a_local_package_source",
        ]
        .map(|t| format!("template_scenarios.py::{t}"));
        let files: Vec<&str> = scenarios.iter().map(String::as_str).collect();
        scenarios::pytest("2.63.0", &files, &[], &env, &[]);
    });
    stop_clean(gw, tmp.path()).await;
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

/// Stops the gateway and checks that it left nothing behind.
async fn stop_clean(mut gw: Gateway, tmp: &Path) {
    gw.proc.terminate();
    assert_no_leaks(tmp, &[gw.data.join("node/sandboxes")]).await;
}

/// `POST /v2/sandboxes` of `template` for team-a, which must answer 201.
async fn created(gw: &Gateway, template: &str) -> Reply {
    let made = gw
        .call(
            reqwest::Method::POST,
            "/v2/sandboxes",
            Some(KEY_A),
            Some(json!({"templateID": template, "timeout": 60})),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    made
}

fn uuid_like(s: &str) -> bool {
    s.len() == 36 && s.chars().filter(|&c| c == '-').count() == 4
}

/// Builds `steps` from `base` as `alias` over plain HTTP (team-a); answers the template id
/// once the build is ready.
async fn build(gw: &Gateway, alias: &str, steps: Value) -> String {
    let (tid, bid) = start_build(gw, alias, steps).await;
    let s = ended(gw, &tid, &bid).await;
    assert_eq!(s["status"], "ready", "{s}");
    tid
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_built_template_is_a_kubernetes_sandboxs_image_in_its_namespace_only() {
    let (tmp, _) = workspace();
    let mut gw = gateway(tmp.path(), &[]).await;
    let steps = json!([{"type": "RUN", "args": ["echo from-the-build > /home/user/k"]}]);
    let tid = build(&gw, "kube-image", steps).await;
    let k = Kubectl::for_gateway(&mut gw, tmp.path());
    k.run(
        &["create", "-f", "-"],
        Some(
            r#"{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                "metadata": {"name": "built"},
                "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "kube-image"}]}}}}"#,
        ),
    );
    let obj: Value =
        serde_json::from_str(&k.run(&["get", "sandbox", "built", "-o", "json"], None)).unwrap();
    let claim = obj["metadata"]["annotations"]["sandbox.cocoonstack.io/claim-id"]
        .as_str()
        .expect("claim id")
        .to_string();
    let detail = gw.get(KEY_A, &claim).await;
    assert_eq!(detail.status, StatusCode::OK, "{:?}", detail.body);
    let (code, out) = gw.run(&detail.body, "cat /home/user/k").await.unwrap();
    assert_eq!((code, out.trim()), (0, "from-the-build"));
    k.run(&["delete", "sandbox", "built"], None);

    // Another namespace's create of the same image is refused: the name is team-a's.
    let b = gw
        .call(
            reqwest::Method::POST,
            "/v2/sandboxes",
            Some(KEY_B),
            Some(json!({"templateID": "kube-image", "timeout": 30})),
        )
        .await;
    assert_eq!(b.status, StatusCode::NOT_FOUND, "{:?}", b.body);
    let by_id = gw
        .call(
            reqwest::Method::POST,
            "/v2/sandboxes",
            Some(KEY_B),
            Some(json!({"templateID": tid, "timeout": 30})),
        )
        .await;
    assert_eq!(by_id.status, StatusCode::NOT_FOUND, "{:?}", by_id.body);

    // The node says who owns it and what they call it (what its NodeInventory publishes).
    let nodes = gw
        .call(reqwest::Method::GET, "/templates", Some(KEY_A), None)
        .await;
    assert!(
        nodes
            .body
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["templateID"] == tid.as_str()),
        "{:?}",
        nodes.body
    );
    stop_clean(gw, tmp.path()).await;
}

/// Requests a build of `alias` and starts it with `steps`; answers (template id, build id).
async fn start_build(gw: &Gateway, alias: &str, steps: Value) -> (String, String) {
    start_build_of(gw, alias, json!({"fromTemplate": "base", "steps": steps})).await
}

/// Requests a build of `alias` and starts it with `spec`; answers (template id, build id).
async fn start_build_of(gw: &Gateway, alias: &str, spec: Value) -> (String, String) {
    let made = gw
        .call(
            reqwest::Method::POST,
            "/v3/templates",
            Some(KEY_A),
            Some(json!({"name": alias})),
        )
        .await;
    let tid = made.body["templateID"].as_str().unwrap().to_string();
    let bid = made.body["buildID"].as_str().unwrap().to_string();
    let started = gw
        .call(
            reqwest::Method::POST,
            &format!("/v2/templates/{tid}/builds/{bid}"),
            Some(KEY_A),
            Some(spec),
        )
        .await;
    assert_eq!(started.status, StatusCode::ACCEPTED, "{:?}", started.body);
    (tid, bid)
}

async fn status(gw: &Gateway, tid: &str, bid: &str) -> Value {
    gw.call(
        reqwest::Method::GET,
        &format!("/templates/{tid}/builds/{bid}/status"),
        Some(KEY_A),
        None,
    )
    .await
    .body
}

/// Polls until the build ends; answers its last status.
async fn ended(gw: &Gateway, tid: &str, bid: &str) -> Value {
    for _ in 0..600 {
        let s = status(gw, tid, bid).await;
        if matches!(s["status"].as_str(), Some("ready" | "error")) {
            return s;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    panic!("build {bid} did not end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builds_end_clearly_when_cancelled_out_of_room_or_interrupted() {
    let (tmp, _) = workspace();
    let gw = gateway(tmp.path(), &["--sandbox-disk-mib", "64"]).await;

    // A step that fills the build's disk fails with the reason.
    let fill =
        json!([{"type": "RUN", "args": ["dd if=/dev/zero of=/home/user/fill bs=1M count=200"]}]);
    let (tid, bid) = start_build(&gw, "fills", fill).await;
    let s = ended(&gw, &tid, &bid).await;
    assert_eq!(s["status"], "error", "{s}");
    assert_eq!(s["reason"]["step"], "1", "{s}");
    let why = s["reason"]["message"].as_str().unwrap();
    assert!(why.contains("disk is full"), "{why}");

    // A newer build of a template cancels the one under way.
    let slow = json!([{"type": "RUN", "args": ["sleep 60"]}]);
    let (tid, first) = start_build(&gw, "superseded", slow.clone()).await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let (again, second) = start_build(
        &gw,
        "superseded",
        json!([{"type": "RUN", "args": ["true"]}]),
    )
    .await;
    assert_eq!(again, tid);
    let s = ended(&gw, &tid, &first).await;
    assert_eq!(s["status"], "error");
    assert!(
        s["reason"]["message"]
            .as_str()
            .unwrap()
            .contains("cancelled"),
        "{s}"
    );
    assert_eq!(ended(&gw, &tid, &second).await["status"], "ready");

    // A build under way when its node stops is reported as interrupted after the restart,
    // never left building.
    let (tid, bid) = start_build(&gw, "interrupted", slow).await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(status(&gw, &tid, &bid).await["status"], "building");
    stop_clean(gw, tmp.path()).await;
    let gw = Gateway::start(
        tmp.path(),
        &[
            "--templates-dir",
            &tmp.path().join("templates").display().to_string(),
            "--pool",
            "base=1",
        ],
    );
    gw.wait_warm(1, "base after the restart").await;
    let s = status(&gw, &tid, &bid).await;
    assert_eq!(s["status"], "error", "{s}");
    assert!(
        s["reason"]["message"]
            .as_str()
            .unwrap()
            .contains("interrupted"),
        "{s}"
    );
    // What was built before is still there and starts.
    let made = gw
        .call(
            reqwest::Method::POST,
            "/v2/sandboxes",
            Some(KEY_A),
            Some(json!({"templateID": "superseded", "timeout": 30})),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    stop_clean(gw, tmp.path()).await;
}

/// A gVisor node builds too: each step's sandbox writes through to a host overlay of
/// id-mapped views of the layers, on a disk of its own, and what it wrote becomes a layer in
/// the same form the built-in runtime makes. The template then starts on either runtime, with
/// its files' owners, its deletions (whiteouts and opaque directories) and nothing of the
/// parent changed; a step that fills its disk fails with the reason; nothing stays mounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_build_on_gvisor_and_start_on_either_runtime() {
    let (tmp, _) = workspace();
    let gv = gateway(
        tmp.path(),
        &["--runtime", "gvisor", "--sandbox-disk-mib", "256"],
    )
    .await;
    let steps = json!([
        {"type": "RUN", "args": ["echo layered > /home/user/made && rm /home/user/.bashrc"]},
        {"type": "RUN", "args": [
            "echo again >> /home/user/made && rm -rf /usr/share/doc && mkdir -p /usr/share/doc \
             && echo fresh > /usr/share/doc/only && mkdir /opt/tool && echo hi > /opt/tool/x \
             && chown 4242:4343 /opt/tool/x", "root"]},
    ]);
    build(&gv, "on-gvisor", steps).await;
    let check = "cat /home/user/made; [ -e /home/user/.bashrc ] && echo present || echo absent; \
                 echo /usr/share/doc/*; find /home/user/made /opt/tool/x -printf '%u:%g %p\\n'";
    let want = "layered\nagain\nabsent\n/usr/share/doc/only\nuser:user /home/user/made\n4242:4343 /opt/tool/x\n";
    let made = created(&gv, "on-gvisor").await;
    let (code, out) = gv.run(&made.body, check).await.unwrap();
    assert_eq!((code, out.as_str()), (0, want), "on gVisor");
    // The mount points runsc made for the agent are not part of any layer.
    for layer in std::fs::read_dir(tmp.path().join("templates/.layers")).unwrap() {
        let own = layer.unwrap().path().join(".sandbox-gateway");
        assert!(!own.exists(), "{} was committed", own.display());
    }
    // The parent is as it was.
    let base = created(&gv, "base").await;
    let (_, out) = gv
        .run(
            &base.body,
            "find /usr/share/doc -mindepth 1 -maxdepth 1 | wc -l; [ -e /opt/tool ] || echo no-tool",
        )
        .await
        .unwrap();
    let docs: u32 = out.lines().next().unwrap_or("").trim().parse().unwrap_or(0);
    assert!(docs > 1 && out.contains("no-tool"), "{out}");

    // A step that fills the build's disk fails with the reason.
    let fill =
        json!([{"type": "RUN", "args": ["dd if=/dev/zero of=/home/user/fill bs=1M count=400"]}]);
    let (tid, bid) = start_build(&gv, "fills", fill).await;
    let s = ended(&gv, &tid, &bid).await;
    assert_eq!(s["status"], "error", "{s}");
    let why = s["reason"]["message"].as_str().unwrap();
    assert!(why.contains("disk is full"), "{why}");
    stop_clean(gv, tmp.path()).await;

    // The layers start on the built-in runtime as they are.
    let templates = tmp.path().join("templates").display().to_string();
    let gw = Gateway::start_named(
        tmp.path(),
        "builtin",
        &["--templates-dir", &templates, "--pool", "base=1"],
    );
    gw.wait_warm(1, "base on the built-in runtime").await;
    let made = created(&gw, "on-gvisor").await;
    let (code, out) = gw.run(&made.body, check).await.unwrap();
    assert_eq!((code, out.as_str()), (0, want), "on the built-in runtime");
    stop_clean(gw, tmp.path()).await;
}

/// `from_image`, `from_debian_image` and `from_dockerfile` through the Python SDK
/// (tests/e2b/py/image_scenarios.py) and `fromImage` through the JS SDK
/// (tests/e2b/js/images.mjs), pulling from real registries on loopback: one plain and
/// anonymous (also the node's mirror of Docker Hub), one behind TLS with a CA of the test's
/// own and a password. The node reaches them because its operator named them; a loopback
/// registry it was not told of is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_build_from_images_in_registries() {
    ensure_sdks();
    let (tmp, _) = workspace();
    let image = images::make_image(&tmp.path().join("image"));
    let plain = images::Registry::start(&tmp.path().join("plain"), None, None);
    plain.push(&image, "team/img:1");
    plain.push(&image, "library/debian:stable");
    let ca = certs::ca("test registries");
    let leaf = certs::leaf(&ca, "localhost", true);
    let secured = images::Registry::start(
        &tmp.path().join("secured"),
        Some(&leaf),
        Some(("puller", "s3cret-pw")),
    );
    secured.push(&image, "team/img:1");
    let ca_file = tmp.path().join("registry-ca.pem");
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let ca_file = ca_file.display().to_string();
    let mirror = format!("docker.io={}", plain.addr);
    let mut gw = gateway(
        tmp.path(),
        &[
            "--registry-insecure",
            &plain.addr,
            "--registry-mirror",
            &mirror,
            "--registry-private",
            &secured.addr,
            "--registry-ca",
            &ca_file,
        ],
    )
    .await;
    let private_port = plain.addr.rsplit(':').next().unwrap();
    let env = vec![
        ("E2B_API_URL", gw.url.clone()),
        ("E2B_SANDBOX_URL", gw.url.clone()),
        ("IMAGE_PLAIN", format!("{}/team/img:1", plain.addr)),
        ("IMAGE_AUTH", format!("{}/team/img:1", secured.addr)),
        ("REGISTRY_USER", "puller".into()),
        ("REGISTRY_PASSWORD", "s3cret-pw".into()),
        (
            "IMAGE_PRIVATE",
            format!("127.0.0.2:{private_port}/team/img:1"),
        ),
    ];
    tokio::task::block_in_place(|| {
        scenarios::pytest("2.63.0", &["image_scenarios.py"], &[], &env, &[]);
        scenarios::node("js e2b 2.51.0 images", "images.mjs", false, &env, &[]);
    });
    // Pulls leave nothing beside the layers they made.
    let layers = tmp.path().join("templates/.layers");
    let half_done: Vec<_> = std::fs::read_dir(&layers)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".new-"))
        .map(|e| e.file_name())
        .collect();
    assert!(half_done.is_empty(), "{half_done:?}");
    gw.proc.terminate();
    drop((plain, secured));
    assert_no_leaks(tmp.path(), &[gw.data.join("node/sandboxes")]).await;
}

/// A built template with a start command keeps a warm sandbox whose start command ran before
/// the create was asked for; the pool follows the `default` tag to a new build and goes with
/// the template.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn built_templates_keep_warm_pools_that_follow_their_default_tag() {
    let (tmp, _) = workspace();
    let gw = gateway(tmp.path(), &[]).await;
    let spec = |v: &str| {
        json!({
            "fromTemplate": "base",
            "steps": [{"type": "RUN", "args": [format!("echo {v} > /home/user/v")]}],
            "startCmd": "date +%s%N > /tmp/started; exec sleep infinity",
            "readyCmd": "test -s /tmp/started",
        })
    };
    let (tid, first) = start_build_of(&gw, "pooled", spec("v1")).await;
    assert_eq!(ended(&gw, &tid, &first).await["status"], "ready");
    let first_pool = format!("{tid}.{}", &first[..8]);
    gw.wait_warm_of(&first_pool, 1).await;

    let asked = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let made = created(&gw, "pooled").await;
    let (code, out) = gw
        .run(
            &made.body,
            "cat /tmp/started /home/user/v; pgrep -x sleep >/dev/null && echo serving",
        )
        .await
        .unwrap();
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    let started: u128 = lines[0].parse().unwrap();
    assert!(
        started < asked,
        "the start command ran before the create: {started} < {asked}"
    );
    assert_eq!(&lines[1..], ["v1", "serving"]);
    // The pool fills again.
    gw.wait_warm_of(&first_pool, 1).await;

    // A new build takes the tag, and the pool with it: the old build's warm sandbox goes.
    let (_, second) = start_build_of(&gw, "pooled", spec("v2")).await;
    assert_eq!(ended(&gw, &tid, &second).await["status"], "ready");
    let second_pool = format!("{tid}.{}", &second[..8]);
    gw.wait_warm_of(&second_pool, 1).await;
    gw.wait_warm_of(&first_pool, 0).await;
    let again = created(&gw, "pooled").await;
    let (_, out) = gw.run(&again.body, "cat /home/user/v").await.unwrap();
    assert_eq!(out.trim(), "v2");

    // Its sandboxes keep it from being deleted, its warm one does not; deleting it ends its
    // pool.
    let refused = gw
        .call(
            reqwest::Method::DELETE,
            &format!("/templates/{tid}"),
            Some(KEY_A),
            None,
        )
        .await;
    assert_eq!(
        refused.status,
        StatusCode::BAD_REQUEST,
        "{:?}",
        refused.body
    );
    for s in [&made.body, &again.body] {
        let id = s["sandboxID"].as_str().unwrap();
        assert_eq!(gw.kill(KEY_A, id).await, StatusCode::NO_CONTENT);
    }
    let deleted = gw
        .call(
            reqwest::Method::DELETE,
            &format!("/templates/{tid}"),
            Some(KEY_A),
            None,
        )
        .await;
    assert!(deleted.status.is_success(), "{:?}", deleted.body);
    gw.wait_warm_of(&format!("{tid}."), 0).await;
    stop_clean(gw, tmp.path()).await;
}

/// A build step is hostile code like any sandbox's: run as root in the build, it tries to
/// write and read the host through /proc, reach the host's ports, mount, and leave links to
/// host files for the commit to follow. None of it reaches the host; what it made is the
/// template's, links kept as links.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_build_step_stays_in_its_sandbox() {
    hostile_build_step(&[]).await;
}

/// On gVisor the step's root is a host overlay the node mounted: the same attempts, the same
/// outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_build_step_stays_in_its_gvisor_sandbox() {
    hostile_build_step(&["--runtime", "gvisor"]).await;
}

/// A build step that tries to reach the host (its files, its processes' roots, mounts, the
/// node's and the gateway's ports) and leaves links to host paths in its layer.
async fn hostile_build_step(extra: &[&str]) {
    let (tmp, _) = workspace();
    let gw = gateway(tmp.path(), extra).await;
    let nonce = format!("{}-{}", std::process::id(), rand_suffix());
    let canary = tmp.path().join(format!("canary-{nonce}"));
    std::fs::write(&canary, "host secret").unwrap();
    let pwned = format!("/tmp/sgw-pwned-{nonce}");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let gw_port = gw.url.rsplit(':').next().unwrap().to_string();
    let c = canary.display();
    let attempt = format!(
        "exec > /home/user/attempts 2>&1; \
         echo pwned > /proc/1/root{pwned} && echo WROTE-PROC1; \
         cat /proc/1/root{c} && echo READ-PROC1; \
         cat {c} && echo READ-PATH; \
         mount -t tmpfs x /mnt && echo MOUNTED; \
         for t in 127.0.0.1/{port} 127.0.0.1/{gw_port} 10.0.2.2/{port} 10.0.2.2/{gw_port}; do \
           timeout 3 bash -c \"echo > /dev/tcp/${{t%/*}}/${{t#*/}}\" && echo OPEN $t; done; \
         ln -s {c} /home/user/to-canary; ln -s /etc/shadow /home/user/to-shadow; \
         ln -s / /home/user/to-root; mkdir -p /home/user/d && ln -s {c} /home/user/d/inner; \
         echo done"
    );
    let spec = json!({
        "fromTemplate": "base",
        "steps": [{"type": "RUN", "args": [attempt, "root"]}],
    });
    let (tid, bid) = start_build_of(&gw, "hostile", spec).await;
    let s = ended(&gw, &tid, &bid).await;
    assert_eq!(s["status"], "ready", "{s}");

    // Nothing crossed to the host.
    assert!(
        !std::path::Path::new(&pwned).exists(),
        "{pwned} was written"
    );
    assert_eq!(std::fs::read_to_string(&canary).unwrap(), "host secret");
    // The layer holds the links as links, never what they name.
    let layers = tmp.path().join("templates/.layers");
    let mut links = 0;
    for layer in std::fs::read_dir(&layers).unwrap().flatten() {
        for name in ["to-canary", "to-shadow", "to-root", "d/inner"] {
            let p = layer.path().join("home/user").join(name);
            if let Ok(m) = std::fs::symlink_metadata(&p) {
                assert!(m.file_type().is_symlink(), "{} was followed", p.display());
                links += 1;
            }
        }
    }
    // The step's layer has them (finalize's too: it gives them to `user`).
    assert!(links >= 4, "the step's links are in its layer ({links})");

    let made = created(&gw, "hostile").await;
    let (_, out) = gw
        .run(
            &made.body,
            "cat /home/user/attempts; echo ---; cat /home/user/to-canary 2>&1; \
             readlink /home/user/to-shadow /home/user/d/inner",
        )
        .await
        .unwrap();
    for crossed in [
        "WROTE-PROC1",
        "READ-PROC1",
        "READ-PATH",
        "MOUNTED",
        "OPEN",
        "host secret",
    ] {
        assert!(!out.contains(crossed), "{crossed}: {out}");
    }
    assert!(out.contains("done"), "{out}");
    assert!(out.contains("/etc/shadow\n"), "{out}");
    drop(listener);
    stop_clean(gw, tmp.path()).await;
}

fn rand_suffix() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// What builds leave stays within `--build-cache-mib`: once a template is deleted, the layers
/// only its team's cache still names are trimmed (its rebuild runs every step again), while
/// the layers a template stands on stay whatever the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_build_cache_is_trimmed_to_its_budget() {
    let (tmp, _) = workspace();
    let gw = gateway(tmp.path(), &["--build-cache-mib", "1"]).await;
    let layers = tmp.path().join("templates/.layers");
    let listing = || -> std::collections::BTreeSet<String> {
        std::fs::read_dir(&layers)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect()
    };
    let write = |name: &str| json!([{"type": "RUN", "args": [format!("head -c 3M /dev/urandom > /home/user/{name}")]}]);
    build(&gw, "kept", write("kept")).await;
    let before = listing();
    let dropped = build(&gw, "dropped", write("dropped")).await;
    let its_layers: Vec<String> = listing().difference(&before).cloned().collect();
    assert!(!its_layers.is_empty());

    let deleted = gw
        .call(
            reqwest::Method::DELETE,
            &format!("/templates/{dropped}"),
            Some(KEY_A),
            None,
        )
        .await;
    assert!(deleted.status.is_success(), "{:?}", deleted.body);
    let mut left = its_layers.clone();
    for _ in 0..100 {
        let now = listing();
        left.retain(|l| now.contains(l));
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        left.is_empty(),
        "the deleted template's layers stay: {left:?}"
    );
    assert!(before.is_subset(&listing()), "a template's own layers went");

    // The kept template still starts; the dropped one's steps are no longer cached.
    created(&gw, "kept").await;
    let (tid, bid) = start_build(&gw, "dropped", write("dropped")).await;
    let s = ended(&gw, &tid, &bid).await;
    assert_eq!(s["status"], "ready", "{s}");
    let cached = s["logEntries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["message"]
                .as_str()
                .unwrap_or("")
                .starts_with("CACHED [builder")
        })
        .count();
    assert_eq!(cached, 0, "{s}");
    stop_clean(gw, tmp.path()).await;
}
