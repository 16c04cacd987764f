//! The Kubernetes facade driven by the real `kubectl` and over HTTPS on the wire: the gateway
//! binary with its embedded node, a generated CA, and e2b API keys as bearer tokens.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const KEY_A: &str = "e2b_a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0";
const KEY_B: &str = "e2b_b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0";
const KEY_ADMIN: &str = "e2b_c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0";
const GV: &str = "/apis/agents.x-k8s.io/v1beta1";

struct Facade {
    proc: Proc,
    dir: PathBuf,
    kube_url: String,
    e2b_url: String,
    ca: String,
}

impl Facade {
    fn start(tmp: &Path, extra: &[&str]) -> Facade {
        let dir = tmp.join("gw");
        let keys = tmp.join("keys");
        std::fs::write(
            &keys,
            format!("{KEY_A} team-a\n{KEY_B} team-b\n{KEY_ADMIN} *\n"),
        )
        .unwrap();
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--e2b-listen".into(),
            "127.0.0.1:0".into(),
            "--kube-listen".into(),
            "127.0.0.1:0".into(),
            "--data-dir".into(),
            dir.display().to_string(),
            "--api-keys".into(),
            keys.display().to_string(),
            "--pool".into(),
            "base=4".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut proc = Proc::spawn(&args);
        let kube = proc.wait_line(
            "Kubernetes API listening on https://",
            Duration::from_secs(60),
        );
        let e2b = proc.wait_line("e2b API listening on http://", Duration::from_secs(5));
        let ca = std::fs::read_to_string(dir.join("tls/ca.crt")).unwrap();
        Facade {
            kube_url: kube.rsplit(' ').next().unwrap().trim().to_string(),
            e2b_url: e2b.rsplit(' ').next().unwrap().trim().to_string(),
            proc,
            dir,
            ca,
        }
    }

    /// A kubeconfig made by `sandbox-gateway kubeconfig` for `key`.
    fn kubeconfig(&self, tmp: &Path, key: &str, namespace: &str) -> PathBuf {
        let out = Command::new(BIN)
            .args([
                "kubeconfig",
                "--server",
                &self.kube_url,
                "--api-key",
                key,
                "--namespace",
                namespace,
                "--data-dir",
            ])
            .arg(&self.dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = tmp.join(format!("kubeconfig-{namespace}"));
        std::fs::write(&path, out.stdout).unwrap();
        path
    }

    fn http(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(self.ca.as_bytes()).unwrap())
            .build()
            .unwrap()
    }

    fn sandboxes_dir(&self) -> PathBuf {
        self.dir.join("node/sandboxes")
    }
}

struct Kubectl {
    config: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("kubectl");
        c.arg("--kubeconfig")
            .arg(&self.config)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args);
        c
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut c = self.cmd(args);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("kubectl on PATH");
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        drop(child.stdin.take());
        child.wait_with_output().unwrap()
    }

    fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run(args, stdin);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn fails(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run(args, stdin);
        assert!(
            !out.status.success(),
            "kubectl {args:?} should fail: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stderr).unwrap()
    }
}

fn manifest(name: &str, extra_meta: &str) -> String {
    format!(
        "apiVersion: agents.x-k8s.io/v1beta1\nkind: Sandbox\nmetadata:\n  name: {name}\n{extra_meta}spec:\n  podTemplate:\n    spec:\n      containers:\n      - name: main\n        image: base\n"
    )
}

fn claims_on_node(f: &Facade) -> usize {
    dir_entries(&f.sandboxes_dir()).len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_drives_sandboxes() {
    let (tmp, _) = workspace();
    let mut f = Facade::start(tmp.path(), &[]);
    let k = Kubectl {
        config: f.kubeconfig(tmp.path(), KEY_A, "team-a"),
        cache: tmp.path().join("kube-cache"),
    };

    // Discovery: the resource, and its four subresources in the group-version list.
    let resources = k.ok(&["api-resources"], None);
    let row = resources
        .lines()
        .find(|l| l.starts_with("sandboxes"))
        .expect("sandboxes listed");
    assert!(
        row.contains("sandbox")
            && row.contains("agents.x-k8s.io/v1beta1")
            && row.contains("Sandbox"),
        "{row}"
    );
    let gv: Value = serde_json::from_str(&k.ok(&["get", "--raw", GV], None)).unwrap();
    let names: Vec<&str> = gv["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    for sub in ["pause", "resume", "fork", "snapshot"] {
        assert!(
            names.contains(&format!("sandboxes/{sub}").as_str()),
            "{names:?}"
        );
    }
    assert!(
        k.ok(&["explain", "sandboxes.spec"], None)
            .contains("podTemplate")
    );
    assert!(
        k.ok(
            &["explain", "sandboxes.spec.podTemplate.spec.containers"],
            None
        )
        .contains("image")
    );

    // Create with kubectl's default (strict) validation.
    let before = claims_on_node(&f);
    let created = k.ok(
        &["create", "-f", "-"],
        Some(&manifest("demo", "  labels:\n    app: web\n")),
    );
    assert!(
        created.contains("sandbox.agents.x-k8s.io/demo created"),
        "{created}"
    );
    let strict = k.fails(
        &["create", "-f", "-"],
        Some(&manifest("typo", "").replace("image: base", "image: base\n        imagee: x")),
    );
    assert!(
        strict.contains("unknown field") && strict.contains("imagee"),
        "{strict}"
    );

    // Tables: Ready and Age columns; Node and Template with -o wide.
    let table = k.ok(&["get", "sandboxes"], None);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "REASON", "AGE"], "{table}");
    let demo: Vec<&str> = table
        .lines()
        .find(|l| l.starts_with("demo "))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(&demo[..3], ["demo", "True", "DependenciesReady"]);
    assert!(
        demo[3].ends_with('s') && demo[3][..demo[3].len() - 1].parse::<u32>().is_ok(),
        "age like 3s: {demo:?}"
    );
    let wide = k.ok(&["get", "sandboxes", "-o", "wide"], None);
    assert!(
        wide.lines().next().unwrap().contains("NODE")
            && wide.contains("embedded")
            && wide.contains("base"),
        "{wide}"
    );
    let yaml = k.ok(&["get", "sandbox", "demo", "-o", "yaml"], None);
    assert!(
        yaml.contains("sandbox.cocoonstack.io/claim-id: sb_"),
        "{yaml}"
    );
    assert!(
        yaml.contains("sandbox.cocoonstack.io/deadline: \""),
        "{yaml}"
    );
    let obj: Value =
        serde_json::from_str(&k.ok(&["get", "sandbox", "demo", "-o", "json"], None)).unwrap();
    assert_eq!(obj["kind"], "Sandbox");
    assert_eq!(obj["metadata"]["labels"]["app"], "web");
    assert_eq!(obj["status"]["nodeName"], "embedded");
    let deadline = obj["metadata"]["annotations"]["sandbox.cocoonstack.io/deadline"]
        .as_str()
        .unwrap();
    assert!(chrono::DateTime::parse_from_rfc3339(deadline).is_ok());
    assert!(
        k.ok(&["get", "sandboxes", "-l", "app=web", "-o", "name"], None)
            .contains("sandbox.agents.x-k8s.io/demo")
    );
    assert!(
        !k.ok(&["get", "sandboxes", "-l", "app=db", "-o", "name"], None)
            .contains("demo")
    );

    // A watch prints a sandbox created while it runs, once.
    let mut watch = k
        .cmd(&["get", "sandboxes", "-w", "--output-watch-events"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let out = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the watch's first lines");
    assert!(first.contains("EVENT") || first.contains("NAME"), "{first}");
    k.ok(&["create", "-f", "-"], Some(&manifest("watched", "")));
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
            seen.push(l);
        }
        if seen.iter().any(|l| l.contains("watched")) {
            // Give a duplicate the chance to show up.
            while let Ok(l) = rx.recv_timeout(Duration::from_millis(700)) {
                seen.push(l);
            }
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let watched: Vec<&String> = seen.iter().filter(|l| l.contains("watched")).collect();
    assert_eq!(watched.len(), 1, "printed once as it was created: {seen:?}");
    assert!(watched[0].contains("ADDED"), "{watched:?}");

    // The four verbs answer with their documented bodies.
    let raw = |verb: &str, body: &str| {
        let path = format!("{GV}/namespaces/team-a/sandboxes/demo/{verb}");
        serde_json::from_str::<Value>(&k.ok(&["create", "--raw", &path, "-f", "-"], Some(body)))
            .unwrap()
    };
    let snap = raw(
        "snapshot",
        r#"{"apiVersion":"agents.x-k8s.io/v1beta1","kind":"SandboxSnapshotOptions","name":"before-migration"}"#,
    );
    assert_eq!(snap["kind"], "SandboxSnapshotResult");
    assert!(snap["snapshotID"].as_str().unwrap().starts_with("ck_"));
    assert_eq!(snap["name"], "before-migration");
    assert_eq!(snap["nodeName"], "embedded");
    assert!(snap["creationTimestamp"].is_string());
    let fork = raw("fork", r#"{"count":2,"ttlSeconds":90}"#);
    assert_eq!(fork["kind"], "SandboxForkResult");
    let children = fork["children"].as_array().unwrap();
    assert_eq!(children.len(), 2);
    for c in children {
        let id = c["sandboxID"].as_str().unwrap();
        assert!(
            id.starts_with("sb_")
                && c["token"].as_str().unwrap().len() == 32
                && c["nodeName"] == "embedded"
        );
        // Readable at once, named by its claim id in the parent's namespace.
        let child: Value = serde_json::from_str(&k.ok(
            &["get", "sandbox", &id.replace('_', "-"), "-o", "json"],
            None,
        ))
        .unwrap();
        assert_eq!(child["metadata"]["namespace"], "team-a");
        assert_eq!(
            child["metadata"]["annotations"]["sandbox.cocoonstack.io/claim-id"],
            id
        );
    }
    assert_eq!(raw("pause", "{}")["kind"], "SandboxPauseOptions");
    let paused = k.ok(&["get", "sandbox", "demo"], None);
    assert!(
        paused.contains("False") && paused.contains("SandboxSuspended"),
        "{paused}"
    );
    assert_eq!(raw("resume", "{}")["kind"], "SandboxResumeOptions");
    assert!(
        k.ok(&["get", "sandbox", "demo"], None)
            .contains("DependenciesReady")
    );
    // A filesystem-only pause (e2b's `pause(mode="filesystem")`): the object says how it was
    // paused until it runs again.
    let bad_mode = k.fails(
        &[
            "create",
            "--raw",
            &format!("{GV}/namespaces/team-a/sandboxes/demo/pause"),
            "-f",
            "-",
        ],
        Some(r#"{"mode":"Memory"}"#),
    );
    assert!(
        bad_mode.contains("BadRequest") && bad_mode.contains("Filesystem"),
        "{bad_mode}"
    );
    assert_eq!(
        raw("pause", r#"{"mode":"Filesystem"}"#)["mode"],
        "Filesystem"
    );
    let paused: Value =
        serde_json::from_str(&k.ok(&["get", "sandbox", "demo", "-o", "json"], None)).unwrap();
    assert_eq!(
        paused["metadata"]["annotations"]["sandbox.cocoonstack.io/pause-mode"],
        "Filesystem"
    );
    assert_eq!(paused["spec"]["operatingMode"], "Suspended");
    let ready = &paused["status"]["conditions"][0];
    assert!(
        ready["status"] == "False"
            && ready["message"]
                .as_str()
                .unwrap()
                .contains("files are kept"),
        "{ready}"
    );
    raw("resume", "{}");
    let resumed: Value =
        serde_json::from_str(&k.ok(&["get", "sandbox", "demo", "-o", "json"], None)).unwrap();
    assert!(
        resumed["metadata"]["annotations"]
            .get("sandbox.cocoonstack.io/pause-mode")
            .is_none(),
        "{resumed}"
    );
    assert_eq!(resumed["status"]["conditions"][0]["status"], "True");
    let too_many = k.fails(
        &[
            "create",
            "--raw",
            &format!("{GV}/namespaces/team-a/sandboxes/demo/fork"),
            "-f",
            "-",
        ],
        Some(r#"{"count":17}"#),
    );
    assert!(
        too_many.contains("BadRequest") && too_many.contains("1..16"),
        "{too_many}"
    );
    let long_name = format!(r#"{{"name":"{}"}}"#, "x".repeat(63));
    let too_long = k.fails(
        &[
            "create",
            "--raw",
            &format!("{GV}/namespaces/team-a/sandboxes/demo/snapshot"),
            "-f",
            "-",
        ],
        Some(&long_name),
    );
    assert!(
        too_long.contains("BadRequest") && too_long.contains("at most 56"),
        "{too_long}"
    );

    // Server-side dry run: refused, nothing claimed or released.
    let claims = claims_on_node(&f);
    let dry = k.fails(
        &["create", "-f", "-", "--dry-run=server"],
        Some(&manifest("dry", "")),
    );
    assert!(
        dry.contains("BadRequest") && dry.contains("dry-run"),
        "{dry}"
    );
    let dry = k.fails(&["delete", "sandbox", "demo", "--dry-run=server"], None);
    assert!(dry.contains("BadRequest"), "{dry}");
    let dry = k.fails(
        &[
            "create",
            "--raw",
            &format!("{GV}/namespaces/team-a/sandboxes/demo/pause?dryRun=All"),
            "-f",
            "-",
        ],
        Some("{}"),
    );
    assert!(dry.contains("BadRequest"), "{dry}");
    assert_eq!(claims_on_node(&f), claims, "dry runs touch no sandbox");
    assert!(k.ok(&["get", "sandbox", "demo"], None).contains("demo"));

    // Another namespace is forbidden for this key; an admin key sees everything.
    let forbidden = k.fails(&["get", "sandboxes", "-n", "team-b"], None);
    assert!(forbidden.contains("Forbidden"), "{forbidden}");
    assert!(
        k.fails(&["get", "sandboxes", "-A"], None)
            .contains("Forbidden")
    );
    let admin = Kubectl {
        config: f.kubeconfig(tmp.path(), KEY_ADMIN, "default"),
        cache: tmp.path().join("kube-cache-admin"),
    };
    let all = admin.ok(&["get", "sandboxes", "-A"], None);
    assert!(all.contains("team-a") && all.contains("demo"), "{all}");

    // A sandbox created through e2b shows up in its tenant's namespace.
    let e2b: Value = reqwest::Client::new()
        .post(format!("{}/v2/sandboxes", f.e2b_url))
        .header("X-API-KEY", KEY_A)
        .json(&json!({"templateID": "base", "allow_internet_access": false}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let e2b_id = e2b["sandboxID"].as_str().unwrap().replace('-', "_");
    let listed: Value =
        serde_json::from_str(&k.ok(&["get", "sandboxes", "-o", "json"], None)).unwrap();
    let found = listed["items"].as_array().unwrap().iter().find(|i| {
        i["metadata"]["annotations"]["sandbox.cocoonstack.io/claim-id"] == e2b_id.as_str()
    });
    let found = found.expect("the e2b sandbox is listed");
    assert!(
        found["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("e2b-")
    );

    // The fleet as NodeInventory objects, as a cluster would hold them: the node, its pools,
    // and the sandboxes this key may see.
    let inventories: Value = serde_json::from_str(&k.ok(
        &[
            "get",
            "nodeinventories.extensions.agents.x-k8s.io",
            "-o",
            "json",
        ],
        None,
    ))
    .unwrap();
    let items = inventories["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{inventories}");
    let node = &items[0];
    assert_eq!(node["metadata"]["name"], "embedded");
    assert!(
        node["pools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["template"] == "base" && p["target"].as_u64() > Some(0)),
        "{node}"
    );
    let entries = node["entries"].as_array().unwrap();
    assert!(entries.iter().any(|e| e["name"] == "team-a/demo"), "{node}");
    assert!(entries.iter().any(|e| e["id"] == e2b_id.as_str()), "{node}");
    let team_b = Kubectl {
        config: f.kubeconfig(tmp.path(), KEY_B, "team-b"),
        cache: tmp.path().join("kube-cache-b"),
    };
    let theirs: Value =
        serde_json::from_str(&team_b.ok(&["get", "nodeinventory", "embedded", "-o", "json"], None))
            .unwrap();
    assert!(theirs["pools"].is_array(), "{theirs}");
    assert!(
        theirs.get("entries").is_none(),
        "another tenant's sandboxes are not shown: {theirs}"
    );
    assert!(
        k.fails(&["get", "nodeinventory", "elsewhere"], None)
            .contains("NotFound")
    );
    assert!(
        k.fails(
            &[
                "get",
                "--raw",
                "/apis/extensions.agents.x-k8s.io/v1beta1/nodeinventories?watch=true"
            ],
            None
        )
        .contains("MethodNotAllowed")
    );

    // Delete releases the sandbox; it is gone at once.
    let deleted = k.ok(&["delete", "sandbox", "demo"], None);
    assert!(deleted.contains("\"demo\" deleted"), "{deleted}");
    let gone = k.fails(&["get", "sandbox", "demo"], None);
    assert!(gone.contains("NotFound"), "{gone}");
    let _ = before;

    f.proc.terminate();
    assert_no_leaks(tmp.path(), &[f.sandboxes_dir()]).await;
}

async fn get(
    c: &reqwest::Client,
    url: &str,
    key: &str,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = c.get(url).bearer_auth(key).send().await.unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap();
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn sandbox_body(meta: Value, spec_extra: Value) -> Value {
    let mut spec =
        json!({"podTemplate": {"spec": {"containers": [{"name": "main", "image": "base"}]}}});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), spec_extra.as_object()) {
        s.extend(e.clone());
    }
    json!({"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "metadata": meta, "spec": spec})
}

/// Reads newline-delimited watch events from a streaming response.
async fn next_event(
    res: &mut reqwest::Response,
    buf: &mut Vec<u8>,
    wait: Duration,
) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            return serde_json::from_slice(&line).ok();
        }
        match tokio::time::timeout_at(deadline, res.chunk()).await {
            Ok(Ok(Some(chunk))) => buf.extend_from_slice(&chunk),
            _ => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_wire_protocol() {
    let (tmp, _) = workspace();
    let mut f = Facade::start(tmp.path(), &[]);
    let c = f.http();
    let base = format!("{}{GV}/namespaces/team-a/sandboxes", f.kube_url);

    // Health is open; everything else wants a key, and answers a Status.
    assert_eq!(
        c.get(format!("{}/healthz", f.kube_url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        c.get(format!("{}/readyz", f.kube_url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let (code, _, body) = get(&c, &base, "e2b_wrong").await;
    assert_eq!(code, 401);
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "Unauthorized");
    let (code, _, body) = get(
        &c,
        &format!("{}{GV}/namespaces/team-b/sandboxes", f.kube_url),
        KEY_A,
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (403, Some("Forbidden")));
    let (code, _, body) = get(&c, &format!("{base}/nope"), KEY_A).await;
    assert_eq!((code, body["reason"].as_str()), (404, Some("NotFound")));
    assert_eq!(body["details"]["kind"], "sandboxes");
    let r = c
        .post(format!("{base}/nope"))
        .bearer_auth(KEY_A)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(
        r.json::<Value>().await.unwrap()["reason"],
        "MethodNotAllowed"
    );
    let (code, _, body) = get(&c, &format!("{base}?fieldSelector=spec.foo%3D1"), KEY_A).await;
    assert_eq!((code, body["reason"].as_str()), (400, Some("BadRequest")));

    // Aggregated discovery with the exact content type.
    let r = c
        .get(format!("{}/apis", f.kube_url))
        .bearer_auth(KEY_A)
        .header(
            "Accept",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers()["content-type"],
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    );
    let d: Value = r.json().await.unwrap();
    assert_eq!(d["kind"], "APIGroupDiscoveryList");
    assert_eq!(
        d["items"][0]["versions"][0]["resources"][0]["subresources"]
            .as_array()
            .unwrap()
            .len(),
        4
    );

    // Create: lifetime checks come before any claim.
    let claims = dir_entries(&f.sandboxes_dir()).len();
    let post = |body: Value| c.post(&base).bearer_auth(KEY_A).json(&body).send();
    let past = (chrono::Utc::now() - chrono::TimeDelta::seconds(10)).to_rfc3339();
    let r = post(sandbox_body(
        json!({"name": "late"}),
        json!({"shutdownTime": past}),
    ))
    .await
    .unwrap();
    assert_eq!(r.status(), 400);
    let r = post(sandbox_body(
        json!({"name": "bad-ttl", "annotations": {"sandbox.cocoonstack.io/ttl-seconds": "-3"}}),
        json!({}),
    ))
    .await
    .unwrap();
    assert_eq!(r.status(), 400);
    assert!(
        r.json::<Value>().await.unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("ttl-seconds")
    );
    assert_eq!(
        dir_entries(&f.sandboxes_dir()).len(),
        claims,
        "nothing was claimed"
    );
    // The granted deadline, the claim id, address and token; the spec echoed untouched.
    let asked = (chrono::Utc::now() + chrono::TimeDelta::milliseconds(120_300)).to_rfc3339();
    let spec_extra = json!({"shutdownTime": asked, "shutdownPolicy": "Retain"});
    let r = post(sandbox_body(
        json!({"name": "keep", "labels": {"tier": "a"}}),
        spec_extra.clone(),
    ))
    .await
    .unwrap();
    assert_eq!(r.status(), 201);
    let created: Value = r.json().await.unwrap();
    let a = &created["metadata"]["annotations"];
    assert!(
        a["sandbox.cocoonstack.io/claim-id"]
            .as_str()
            .unwrap()
            .starts_with("sb_")
    );
    assert_eq!(
        a["sandbox.cocoonstack.io/token"].as_str().unwrap().len(),
        32
    );
    assert!(
        a["sandbox.cocoonstack.io/address"]
            .as_str()
            .unwrap()
            .contains(':')
    );
    let granted = chrono::DateTime::parse_from_rfc3339(
        a["sandbox.cocoonstack.io/deadline"].as_str().unwrap(),
    )
    .unwrap();
    let secs = (granted.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_seconds();
    assert!(
        (115..=122).contains(&secs),
        "shutdownTime rounded up to a 121 s lease: {secs}"
    );
    assert_eq!(
        created["spec"]["shutdownTime"],
        asked.as_str(),
        "the submitted spec is echoed untouched"
    );
    assert_eq!(created["spec"]["shutdownPolicy"], "Retain");
    assert_eq!(
        created["status"]["conditions"][0]["reason"],
        "DependenciesReady"
    );
    // A repeated create under one name claims a second sandbox.
    let again: Value = post(sandbox_body(json!({"name": "keep"}), json!({})))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_ne!(
        again["metadata"]["annotations"]["sandbox.cocoonstack.io/claim-id"],
        a["sandbox.cocoonstack.io/claim-id"]
    );
    let generated: Value = post(sandbox_body(json!({"generateName": "gen-"}), json!({})))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        generated["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("gen-")
    );

    // Get is live and stamps the deadline.
    let (code, _, got) = get(
        &c,
        &format!(
            "{base}/gen-{}",
            &generated["metadata"]["name"].as_str().unwrap()[4..]
        ),
        KEY_A,
    )
    .await;
    assert_eq!(code, 200);
    assert!(got["metadata"]["annotations"]["sandbox.cocoonstack.io/deadline"].is_string());

    // Lists: Table rows with ages and objects; pagination over one snapshot.
    let r = c
        .get(&base)
        .bearer_auth(KEY_A)
        .header(
            "Accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .send()
        .await
        .unwrap();
    let t: Value = r.json().await.unwrap();
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["columnDefinitions"][4]["priority"], 1);
    assert_eq!(t["rows"].as_array().unwrap().len(), 3);
    assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    let rv: u64 = t["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let (_, _, page1) = get(&c, &format!("{base}?limit=2"), KEY_A).await;
    assert_eq!(page1["items"].as_array().unwrap().len(), 2);
    assert_eq!(page1["metadata"]["remainingItemCount"], 1);
    let token = page1["metadata"]["continue"].as_str().unwrap().to_string();
    let (_, _, page2) = get(&c, &format!("{base}?limit=2&continue={token}"), KEY_A).await;
    assert_eq!(page2["items"].as_array().unwrap().len(), 1);
    assert!(page2["metadata"].get("continue").is_none());
    let (code, _, _) = get(&c, &format!("{base}?limit=2&continue=bm9wZTox"), KEY_A).await;
    assert_eq!(code, 410, "an unknown continue token is expired");

    // Watch: from a version, only later changes; from "0", initial ADDED first; old versions
    // are 410; bookmarks only on request; timeoutSeconds closes the stream.
    let mut w = c
        .get(format!("{base}?watch=true&resourceVersion={rv}"))
        .bearer_auth(KEY_A)
        .send()
        .await
        .unwrap();
    let mut buf = Vec::new();
    let r = post(sandbox_body(json!({"name": "later"}), json!({})))
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let ev = next_event(&mut w, &mut buf, Duration::from_secs(10))
        .await
        .expect("an event");
    assert_eq!(ev["type"], "ADDED");
    assert_eq!(ev["object"]["metadata"]["name"], "later");
    assert!(
        ev["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > rv
    );
    let r = c
        .delete(format!("{base}/later"))
        .bearer_auth(KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let ev = next_event(&mut w, &mut buf, Duration::from_secs(10))
        .await
        .expect("a delete event");
    assert_eq!(ev["type"], "DELETED");
    drop(w);
    let mut w = c
        .get(format!("{base}?watch=1&resourceVersion=0&timeoutSeconds=2"))
        .bearer_auth(KEY_A)
        .send()
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut kinds = Vec::new();
    while let Some(ev) = next_event(&mut w, &mut buf, Duration::from_secs(10)).await {
        kinds.push(ev["type"].as_str().unwrap().to_string());
    }
    assert_eq!(
        kinds,
        ["ADDED", "ADDED", "ADDED"],
        "initial events, no bookmark, then the stream ends"
    );
    let mut w = c
        .get(format!("{base}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=2"))
        .bearer_auth(KEY_A)
        .send()
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut evs = Vec::new();
    while let Some(ev) = next_event(&mut w, &mut buf, Duration::from_secs(10)).await {
        evs.push(ev);
    }
    let last = evs.last().unwrap();
    assert_eq!(last["type"], "BOOKMARK");
    assert_eq!(last["object"]["kind"], "Sandbox");
    assert_eq!(
        last["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    let mut w = c
        .get(format!("{base}?watch=true&resourceVersion=1"))
        .bearer_auth(KEY_A)
        .send()
        .await
        .unwrap();
    let mut buf = Vec::new();
    // Version 1 was never this gateway's (its versions start from its start time): the watch
    // answers 410 Expired, and the client lists again.
    let ev = next_event(&mut w, &mut buf, Duration::from_secs(10))
        .await
        .expect("an error event");
    assert_eq!(ev["type"], "ERROR");
    assert_eq!(ev["object"]["code"], 410);
    assert_eq!(ev["object"]["reason"], "Expired");
    drop(w);
    // A name-pinned watch starts from a live lookup.
    let mut w = c
        .get(format!("{base}?watch=true&fieldSelector=metadata.name%3Dkeep&resourceVersion=0&timeoutSeconds=1"))
        .bearer_auth(KEY_A)
        .send()
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut names = Vec::new();
    while let Some(ev) = next_event(&mut w, &mut buf, Duration::from_secs(10)).await {
        names.push(
            ev["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(names, ["keep", "keep"], "both claims under the pinned name");

    // Delete without a name that resolves: 404; with a stale precondition: 409.
    let r = c
        .delete(format!("{base}/nope"))
        .bearer_auth(KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = c
        .delete(format!("{base}/keep"))
        .bearer_auth(KEY_A)
        .json(&json!({"preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);

    f.proc.terminate();
    assert_no_leaks(tmp.path(), &[f.sandboxes_dir()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_capacity_is_503_with_retry_after() {
    let (tmp, token) = workspace();
    let node = NodeProc::start(
        "full",
        &tmp.path().join("full"),
        &token,
        "127.0.0.1:0",
        &["--pool", "base=0", "--no-cold-start"],
    );
    let token_arg = token.display().to_string();
    let mut f = Facade::start(
        tmp.path(),
        &["--node", &node.addr, "--node-token-file", &token_arg],
    );
    let c = f.http();
    let base = format!("{}{GV}/namespaces/team-a/sandboxes", f.kube_url);
    let mut last = None;
    for _ in 0..100 {
        let r = c
            .post(&base)
            .bearer_auth(KEY_A)
            .json(&sandbox_body(json!({"name": "x"}), json!({})))
            .send()
            .await
            .unwrap();
        if r.status() == 503 {
            last = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = last.expect("503 once the node is known");
    assert_eq!(r.headers()["retry-after"], "1");
    let s: Value = r.json().await.unwrap();
    assert_eq!(s["reason"], "ServiceUnavailable");
    assert_eq!(s["details"]["retryAfterSeconds"], 1);
    f.proc.terminate();
    let mut nodes = [node];
    nodes[0].proc.terminate();
    assert_no_leaks(tmp.path(), &[nodes[0].sandboxes_dir()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_kubernetes_client() {
    ensure_sdks();
    let (tmp, _) = workspace();
    let mut f = Facade::start(tmp.path(), &[]);
    let team_a = f.kubeconfig(tmp.path(), KEY_A, "team-a");
    let admin = f.kubeconfig(tmp.path(), KEY_ADMIN, "default");
    let python = sdk_dir().join("py-kube/bin/python");
    let tests = repo().join("tests/kube/py").display().to_string();
    let mut cmd = Command::new(python);
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider", &tests])
        .current_dir(repo())
        .env("KUBECONFIG", &team_a)
        .env("KUBE_ADMIN_KUBECONFIG", &admin)
        .env("KUBE_NAMESPACE", "team-a")
        .env("KUBE_OTHER_NAMESPACE", "team-b")
        .env("E2B_API_URL", &f.e2b_url);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(
        out.status.success(),
        "python kubernetes client scenarios failed:\n{text}"
    );
    f.proc.terminate();
    assert_no_leaks(tmp.path(), &[f.sandboxes_dir()]).await;
}
