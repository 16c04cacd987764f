//! PATCH, apply, edit and PUT on `sandboxes` through the real `kubectl` (the release the
//! dispatcher picks and older ones installed beside it), the wire, and the Python
//! `kubernetes` client: labels and annotations stored with the claim and shown by reads,
//! label-selected lists and watches; the lease and the operating mode changed through the
//! spec; the rest of the spec refused as immutable; unchanged applies that change nothing;
//! dry runs and other tenants refused.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use common::kube_gateway::{
    GV, KEY_ADMIN, KEY_TEAM_A, KEY_TEAM_B, KubeGateway, Kubectl, next_event,
};
use common::*;
use sandbox_gateway::dispatch::ClaimRequest;
use sandbox_gateway::dispatch::client::NodeConn;
use sandbox_gateway::model::{ErrorKind, PoolKey};
use serde_json::{Value, json};

fn manifest(name: &str, labels: &[(&str, &str)], until: &str) -> String {
    let labels: String = labels
        .iter()
        .map(|(k, v)| format!("    {k}: \"{v}\"\n"))
        .collect();
    format!(
        "apiVersion: agents.x-k8s.io/v1beta1\nkind: Sandbox\nmetadata:\n  name: {name}\n  labels:\n{labels}  annotations:\n    note: first\nspec:\n  shutdownTime: \"{until}\"\n  podTemplate:\n    spec:\n      containers:\n      - name: main\n        image: base\n"
    )
}

fn at(from_now: TimeDelta) -> String {
    (Utc::now() + from_now).to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn rv(o: &Value) -> u64 {
    o["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("resourceVersion of {o}"))
}

fn deadline(o: &Value) -> DateTime<Utc> {
    let raw = o["metadata"]["annotations"]["sandbox.cocoonstack.io/deadline"]
        .as_str()
        .unwrap();
    DateTime::parse_from_rfc3339(raw)
        .unwrap()
        .with_timezone(&Utc)
}

fn near(a: DateTime<Utc>, b: &str, slack: i64) -> bool {
    let b = DateTime::parse_from_rfc3339(b).unwrap().with_timezone(&Utc);
    (a - b).num_seconds().abs() <= slack
}

/// An EDITOR for `kubectl edit`: runs `sed -i EXPR` on the file it is given.
fn editor(dir: &Path, expr: &str) -> PathBuf {
    let path = dir.join("editor.sh");
    std::fs::write(&path, format!("#!/bin/sh\nsed -i '{expr}' \"$1\"\n")).unwrap();
    let _ = Command::new("chmod").arg("+x").arg(&path).status();
    path
}

/// The next MODIFIED event of a watch that satisfies `want`.
async fn modified(
    res: &mut reqwest::Response,
    buf: &mut Vec<u8>,
    what: &str,
    want: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut seen = Vec::new();
    while tokio::time::Instant::now() < deadline {
        let Some(ev) = next_event(res, buf, Duration::from_secs(15)).await else {
            break;
        };
        if ev["type"] == "MODIFIED" && want(&ev["object"]) {
            return ev;
        }
        seen.push(ev["type"].clone());
    }
    panic!("no MODIFIED event with {what}; saw {seen:?}");
}

/// What one kubectl release must do against the facade (the rest runs with the default one).
fn client_side_round(k: &Kubectl, tmp: &Path, name: &str) {
    let until = at(TimeDelta::minutes(10));
    let m = manifest(name, &[("app", "web")], &until);
    let out = k.ok(&["apply", "-f", "-"], Some(&m));
    assert!(out.contains(&format!("{name} created")), "{out}");
    let out = k.ok(&["apply", "-f", "-"], Some(&m));
    assert!(out.contains(&format!("{name} unchanged")), "{out}");
    let out = k.ok(
        &["apply", "-f", "-"],
        Some(&manifest(name, &[("app", "db")], &until)),
    );
    assert!(out.contains(&format!("{name} configured")), "{out}");
    k.ok(&["label", "sandbox", name, "tier=gold"], None);
    k.ok(
        &[
            "patch",
            "sandbox",
            name,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"operatingMode":"Suspended"}}"#,
        ],
        None,
    );
    let o = k.json(&["sandbox", name]);
    assert_eq!(o["metadata"]["labels"]["app"], "db");
    assert_eq!(o["metadata"]["labels"]["tier"], "gold");
    assert_eq!(o["spec"]["operatingMode"], "Suspended");
    let script = editor(tmp, "s/note: first/note: edited/");
    let out = k
        .with_env("EDITOR", &script.display().to_string())
        .ok(&["edit", "sandbox", name], None);
    assert!(out.contains("edited"), "{out}");
    assert_eq!(
        k.json(&["sandbox", name])["metadata"]["annotations"]["note"],
        "edited"
    );
    k.ok(&["delete", "sandbox", name], None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_patches_applies_edits_and_replaces() {
    let (tmp, _) = workspace();
    let mut f = KubeGateway::start(tmp.path(), &[]);
    let k = f.kubectl(tmp.path(), KEY_TEAM_A, "team-a");
    let c = f.http();
    let item = format!("{}{GV}/namespaces/team-a/sandboxes/demo", f.kube_url);

    // Discovery says patch and update; kubectl would not try them otherwise.
    let resources = k.ok(
        &["api-resources", "--api-group=agents.x-k8s.io", "-o", "wide"],
        None,
    );
    let row = resources
        .lines()
        .find(|l| l.starts_with("sandboxes"))
        .unwrap_or_else(|| panic!("{resources}"));
    assert!(row.contains("patch") && row.contains("update"), "{row}");

    // Client-side apply: a create that keeps the last-applied configuration, then an
    // unchanged file is a no-op (no revision, no event).
    let until = at(TimeDelta::minutes(10));
    let first = manifest("demo", &[("app", "web")], &until);
    let out = k.ok(&["apply", "-f", "-"], Some(&first));
    assert!(
        out.contains("sandbox.agents.x-k8s.io/demo created"),
        "{out}"
    );
    let o = k.json(&["sandbox", "demo"]);
    let annotations = &o["metadata"]["annotations"];
    assert_eq!(annotations["note"], "first");
    assert!(
        annotations["kubectl.kubernetes.io/last-applied-configuration"]
            .as_str()
            .is_some_and(|a| a.contains("\"note\":\"first\"")),
        "{o}"
    );
    assert_eq!(o["spec"]["shutdownTime"], until.as_str(), "{o}");
    assert_eq!(
        o["spec"]["podTemplate"]["spec"]["containers"][0]["name"], "main",
        "reads echo the submitted spec: {o}"
    );
    let id = annotations["sandbox.cocoonstack.io/claim-id"]
        .as_str()
        .unwrap()
        .to_string();
    let rv0 = rv(&o);
    let mut watch = c
        .get(format!(
            "{}{GV}/namespaces/team-a/sandboxes?watch=true&fieldSelector=metadata.name%3Ddemo&resourceVersion={rv0}",
            f.kube_url
        ))
        .bearer_auth(KEY_TEAM_A)
        .send()
        .await
        .unwrap();
    assert_eq!(watch.status(), 200);
    let mut buf = Vec::new();
    let out = k.ok(&["apply", "-f", "-"], Some(&first));
    assert!(out.contains("demo unchanged"), "{out}");
    assert_eq!(rv(&k.json(&["sandbox", "demo"])), rv0);
    assert!(
        next_event(&mut watch, &mut buf, Duration::from_millis(1500))
            .await
            .is_none(),
        "an unchanged apply sends no event"
    );

    // A changed label: configured, seen by selectors and the watch.
    let out = k.ok(
        &["apply", "-f", "-"],
        Some(&manifest("demo", &[("app", "db")], &until)),
    );
    assert!(out.contains("demo configured"), "{out}");
    modified(&mut watch, &mut buf, "app=db", |o| {
        o["metadata"]["labels"]["app"] == "db"
    })
    .await;
    assert!(
        k.ok(&["get", "sandboxes", "-l", "app=db", "-o", "name"], None)
            .contains("sandbox.agents.x-k8s.io/demo")
    );
    assert!(
        !k.ok(&["get", "sandboxes", "-l", "app=web", "-o", "name"], None)
            .contains("demo")
    );

    // kubectl label and annotate (merge patches); lists show them too, and `kubectl get -w`
    // prints the change.
    let mut kw = k
        .cmd(&[
            "get",
            "sandboxes",
            "-l",
            "app=db",
            "-w",
            "--output-watch-events",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let stdout = kw.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let header = lines.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(header.contains("EVENT"), "{header}");
    let listed = lines.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(
        listed.contains("ADDED") && listed.contains("demo"),
        "{listed}"
    );
    let out = k.ok(&["label", "sandbox", "demo", "tier=gold"], None);
    assert!(out.contains("labeled"), "{out}");
    let printed = lines.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(
        printed.contains("MODIFIED") && printed.contains("demo"),
        "{printed}"
    );
    let _ = kw.kill();
    let _ = kw.wait();
    modified(&mut watch, &mut buf, "tier=gold", |o| {
        o["metadata"]["labels"]["tier"] == "gold"
    })
    .await;
    let out = k.ok(&["annotate", "sandbox", "demo", "owner=alice"], None);
    assert!(out.contains("annotated"), "{out}");
    let listed = k.json(&["sandboxes", "-l", "tier=gold"]);
    assert_eq!(
        listed["items"][0]["metadata"]["annotations"]["owner"], "alice",
        "{listed}"
    );
    k.ok(&["label", "sandbox", "demo", "tier-"], None);
    assert!(
        k.json(&["sandbox", "demo"])["metadata"]["labels"]
            .get("tier")
            .is_none()
    );

    // Created Suspended: paused before the create answers; Running resumes it.
    let asleep = manifest("asleep", &[("app", "nap")], &at(TimeDelta::minutes(10))).replacen(
        "spec:\n",
        "spec:\n  operatingMode: Suspended\n",
        1,
    );
    let out = k.ok(&["create", "-f", "-"], Some(&asleep));
    assert!(out.contains("asleep created"), "{out}");
    let o = k.json(&["sandbox", "asleep"]);
    assert_eq!(
        o["metadata"]["labels"]["sandbox.cocoonstack.io/phase"], "Paused",
        "{o}"
    );
    assert!(
        k.ok(&["get", "sandbox", "asleep"], None)
            .contains("SandboxSuspended")
    );
    k.ok(
        &[
            "patch",
            "sandbox",
            "asleep",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"operatingMode":"Running"}}"#,
        ],
        None,
    );
    assert_eq!(
        k.json(&["sandbox", "asleep"])["metadata"]["labels"]["sandbox.cocoonstack.io/phase"],
        "Running"
    );
    let err = k.fails(
        &["create", "-f", "-"],
        Some(
            &asleep
                .replace("asleep", "dozing")
                .replace("Suspended", "Asleep"),
        ),
    );
    assert!(err.contains("spec.operatingMode"), "{err}");
    k.ok(&["delete", "sandbox", "asleep"], None);

    // operatingMode pauses and resumes.
    let suspend = r#"{"spec":{"operatingMode":"Suspended"}}"#;
    let out = k.ok(
        &["patch", "sandbox", "demo", "--type", "merge", "-p", suspend],
        None,
    );
    assert!(out.contains("patched"), "{out}");
    let table = k.ok(&["get", "sandbox", "demo"], None);
    assert!(table.contains("SandboxSuspended"), "{table}");
    modified(&mut watch, &mut buf, "phase Paused", |o| {
        o["metadata"]["labels"]["sandbox.cocoonstack.io/phase"] == "Paused"
    })
    .await;
    let out = k.ok(
        &["patch", "sandbox", "demo", "--type", "merge", "-p", suspend],
        None,
    );
    assert!(
        out.contains("no change"),
        "repeating it changes nothing: {out}"
    );
    // Resuming and renewing in one patch: the resume comes first (a paused lease cannot be
    // renewed).
    let later = at(TimeDelta::minutes(20));
    let wake = format!(r#"{{"spec":{{"operatingMode":"Running","shutdownTime":"{later}"}}}}"#);
    k.ok(
        &["patch", "sandbox", "demo", "--type", "merge", "-p", &wake],
        None,
    );
    assert!(
        k.ok(&["get", "sandbox", "demo"], None)
            .contains("DependenciesReady")
    );
    assert!(near(deadline(&k.json(&["sandbox", "demo"])), &later, 2));

    // JSON patch, and kubectl's default strategic merge patch.
    k.ok(
        &[
            "patch",
            "sandbox",
            "demo",
            "--type",
            "json",
            "-p",
            r#"[{"op":"add","path":"/metadata/labels/via","value":"json-patch"}]"#,
        ],
        None,
    );
    assert_eq!(
        k.json(&["sandbox", "demo"])["metadata"]["labels"]["via"],
        "json-patch"
    );
    k.ok(
        &[
            "patch",
            "sandbox",
            "demo",
            "-p",
            r#"{"metadata":{"labels":{"via":"strategic"}}}"#,
        ],
        None,
    );
    assert_eq!(
        k.json(&["sandbox", "demo"])["metadata"]["labels"]["via"],
        "strategic"
    );

    // The rest of the spec is what the sandbox was claimed as.
    let image =
        r#"{"spec":{"podTemplate":{"spec":{"containers":[{"name":"main","image":"other"}]}}}}"#;
    let err = k.fails(
        &["patch", "sandbox", "demo", "--type", "merge", "-p", image],
        None,
    );
    assert!(
        err.contains("spec.podTemplate") && err.contains("field is immutable"),
        "{err}"
    );
    let r = c
        .patch(&item)
        .bearer_auth(KEY_TEAM_A)
        .header("Content-Type", "application/merge-patch+json")
        .body(image)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let s: Value = r.json().await.unwrap();
    assert_eq!(s["reason"], "Invalid");
    assert_eq!(
        s["details"]["causes"][0]["field"], "spec.podTemplate",
        "{s}"
    );
    let r = c
        .patch(&item)
        .bearer_auth(KEY_TEAM_A)
        .header("Content-Type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);

    // spec.shutdownTime renews the lease, later or sooner; e2b sees the same deadline.
    for minutes in [30, 5] {
        let when = at(TimeDelta::minutes(minutes));
        k.ok(
            &[
                "patch",
                "sandbox",
                "demo",
                "--type",
                "merge",
                "-p",
                &json!({"spec": {"shutdownTime": when}}).to_string(),
            ],
            None,
        );
        let o = k.json(&["sandbox", "demo"]);
        assert!(near(deadline(&o), &when, 2), "{when}: {o}");
        assert_eq!(o["spec"]["shutdownTime"], when.as_str());
        let e2b: Value = reqwest::Client::new()
            .get(format!("{}/sandboxes/{id}", f.e2b_url))
            .header("X-API-KEY", KEY_TEAM_A)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(
            near(
                DateTime::parse_from_rfc3339(e2b["endAt"].as_str().unwrap())
                    .unwrap()
                    .with_timezone(&Utc),
                &when,
                2
            ),
            "{e2b}"
        );
    }

    // kubectl edit, with an editor that changes an annotation.
    let script = editor(tmp.path(), "s/owner: alice/owner: bob/");
    let out = k
        .with_env("EDITOR", &script.display().to_string())
        .ok(&["edit", "sandbox", "demo"], None);
    assert!(out.contains("demo edited"), "{out}");
    assert_eq!(
        k.json(&["sandbox", "demo"])["metadata"]["annotations"]["owner"],
        "bob"
    );

    // PUT: kubectl replace, and a stale resourceVersion is a conflict.
    let mut o = k.json(&["sandbox", "demo"]);
    o["metadata"]["labels"]["replaced"] = json!("yes");
    let out = k.ok(&["replace", "-f", "-"], Some(&o.to_string()));
    assert!(out.contains("demo replaced"), "{out}");
    assert_eq!(
        k.json(&["sandbox", "demo"])["metadata"]["labels"]["replaced"],
        "yes"
    );
    o["metadata"]["labels"]["replaced"] = json!("again");
    let err = k.fails(&["replace", "-f", "-"], Some(&o.to_string()));
    assert!(
        err.contains("the object has been modified"),
        "stale resourceVersion: {err}"
    );

    // Dry runs are refused before anything is touched.
    let before = rv(&k.json(&["sandbox", "demo"]));
    let err = k.fails(
        &[
            "patch",
            "sandbox",
            "demo",
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"labels":{"dry":"run"}}}"#,
            "--dry-run=server",
        ],
        None,
    );
    assert!(err.contains("dry-run"), "{err}");
    let err = k.fails(
        &["apply", "--server-side", "--dry-run=server", "-f", "-"],
        Some(&first),
    );
    assert!(err.contains("dry-run"), "{err}");
    let o = k.json(&["sandbox", "demo"]);
    assert_eq!(rv(&o), before);
    assert!(o["metadata"]["labels"].get("dry").is_none());

    // Server-side apply: labels the manager applies are its own; dropping one from the
    // file removes it; an apply of a sandbox that does not exist creates it.
    let ssa = manifest("demo", &[("app", "db"), ("ssa", "1")], &until);
    let out = k.ok(&["apply", "--server-side", "-f", "-"], Some(&ssa));
    assert!(out.contains("demo serverside-applied"), "{out}");
    assert_eq!(
        k.json(&["sandbox", "demo"])["metadata"]["labels"]["ssa"],
        "1"
    );
    k.ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&manifest("demo", &[("app", "db")], &until)),
    );
    let labels = k.json(&["sandbox", "demo"])["metadata"]["labels"].clone();
    assert!(
        labels.get("ssa").is_none() && labels["app"] == "db",
        "{labels}"
    );
    // A second manager may not take a field the first applied, unless it forces; forcing
    // moves the field to it, so the first manager's next apply no longer removes it.
    let team = manifest("demo", &[("app", "db"), ("tier", "a")], &until);
    k.ok(&["apply", "--server-side", "-f", "-"], Some(&team));
    let rival = manifest("demo", &[("tier", "b")], &until);
    let apply_as = |who: &str| {
        vec![
            "apply".to_string(),
            "--server-side".into(),
            format!("--field-manager={who}"),
            "-f".into(),
            "-".into(),
        ]
    };
    let args = apply_as("rival");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = k.fails(&args, Some(&rival));
    assert!(
        err.contains("conflict") && err.contains(".metadata.labels.tier"),
        "{err}"
    );
    assert_eq!(
        k.json(&["sandbox", "demo"])["metadata"]["labels"]["tier"],
        "a"
    );
    // The same value is no conflict.
    let same = manifest("demo", &[("tier", "a")], &until);
    k.ok(&args, Some(&same));
    let mut forced = args.clone();
    forced.insert(2, "--force-conflicts");
    k.ok(&forced, Some(&rival));
    assert_eq!(
        k.json(&["sandbox", "demo"])["metadata"]["labels"]["tier"],
        "b"
    );
    k.ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&manifest("demo", &[("app", "db")], &until)),
    );
    let labels = k.json(&["sandbox", "demo"])["metadata"]["labels"].clone();
    assert_eq!(labels["tier"], "b", "the rival owns it now: {labels}");
    let out = k.ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&manifest(
            "by-apply",
            &[("app", "ssa")],
            &at(TimeDelta::minutes(10)),
        )),
    );
    assert!(out.contains("by-apply serverside-applied"), "{out}");
    assert_eq!(
        k.json(&["sandbox", "by-apply"])["metadata"]["labels"]["app"],
        "ssa"
    );
    k.ok(&["delete", "sandbox", "by-apply"], None);

    // Another tenant can neither patch nor label this one; an admin can.
    let other = f.kubectl(tmp.path(), KEY_TEAM_B, "team-b");
    let label = r#"{"metadata":{"labels":{"x":"y"}}}"#;
    let err = other.fails(
        &[
            "patch", "sandbox", "demo", "-n", "team-a", "--type", "merge", "-p", label,
        ],
        None,
    );
    assert!(err.contains("Forbidden"), "{err}");
    let err = other.fails(
        &["patch", "sandbox", "demo", "--type", "merge", "-p", label],
        None,
    );
    assert!(err.contains("NotFound"), "{err}");
    let admin = f.kubectl(tmp.path(), KEY_ADMIN, "team-a");
    admin.ok(
        &["label", "sandbox", "demo", "-n", "team-a", "by=admin"],
        None,
    );
    assert!(
        k.json(&["sandbox", "demo"])["metadata"]["labels"]
            .get("x")
            .is_none()
    );

    // Older kubectl releases (installed beside the dispatcher) manage the same.
    let releases = Path::new("/usr/lib/google-cloud-sdk/bin");
    for release in ["1.27", "1.30"] {
        let bin = releases.join(format!("kubectl.{release}"));
        if bin.exists() {
            client_side_round(
                &k.with_program(&bin),
                tmp.path(),
                &format!("old-{}", release.replace('.', "-")),
            );
        } else {
            println!("kubectl {release} is not installed; skipped");
        }
    }

    drop(watch);
    k.ok(&["delete", "sandbox", "demo"], None);
    f.proc.terminate();
    assert_no_leaks(tmp.path(), &[f.sandboxes_dir()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_kubernetes_client_patches() {
    ensure_sdks();
    let (tmp, _) = workspace();
    let mut f = KubeGateway::start(tmp.path(), &[]);
    let team_a = f.kubeconfig(tmp.path(), KEY_TEAM_A, "team-a");
    let admin = f.kubeconfig(tmp.path(), KEY_ADMIN, "default");
    let python = sdk_dir().join("py-kube/bin/python");
    let tests = repo().join("tests/kube/py-patch").display().to_string();
    let mut cmd = Command::new(python);
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider", &tests])
        .current_dir(repo())
        .env("KUBECONFIG", &team_a)
        .env("KUBE_ADMIN_KUBECONFIG", &admin)
        .env("KUBE_NAMESPACE", "team-a")
        .env("KUBE_OTHER_NAMESPACE", "team-b");
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
        "python kubernetes client patch scenarios failed:\n{text}"
    );
    f.proc.terminate();
    assert_no_leaks(tmp.path(), &[f.sandboxes_dir()]).await;
}

/// The node RPC underneath: metadata set and removed in one step, a revision spent (and the
/// view moved) only when something changed, the claim limits kept, other namespaces unseen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_metadata_updates_move_the_revision_only_on_change() {
    let (tmp, token) = workspace();
    let mut node = NodeProc::start(
        "meta",
        &tmp.path().join("meta"),
        &token,
        "127.0.0.1:0",
        &["--pool", "base=1"],
    );
    let d = dispatcher(TOKEN, &[&node]);
    d.wait_for_nodes(1, Duration::from_secs(30)).await.unwrap();
    let claimed = d
        .claim(ClaimRequest {
            namespace: "team-a".into(),
            name: "m".into(),
            key: PoolKey::base(),
            ttl_seconds: 300,
            metadata: [("job".to_string(), "1".to_string())].into(),
            env_vars: Default::default(),
            lifecycle: Default::default(),
            network: Default::default(),
            volume_mounts: Vec::new(),
        })
        .await
        .unwrap();
    let id = claimed.record.id.clone();
    let conn = NodeConn::new(&node.addr, TOKEN).unwrap();
    let revision = || async { conn.info(Duration::from_secs(5)).await.unwrap().revision };
    let view_rv = || d.view().entry(&id).map(|e| e.revision);

    let r0 = revision().await;
    let set = [("k8s.label/a".to_string(), "b".to_string())];
    let (r, changed) = d
        .update_metadata(Some("team-a"), &id, set.clone().into(), vec![])
        .await
        .unwrap();
    assert!(changed);
    assert_eq!(r.metadata.get("k8s.label/a").map(String::as_str), Some("b"));
    assert_eq!(r.metadata.get("job").map(String::as_str), Some("1"));
    assert!(r.token.is_empty(), "no credential in the answer");
    let r1 = revision().await;
    assert!(r1 > r0);
    let v1 = view_rv();
    assert!(v1.is_some());

    let (_, changed) = d
        .update_metadata(Some("team-a"), &id, set.into(), vec![])
        .await
        .unwrap();
    assert!(!changed, "the same values again are no change");
    assert_eq!(revision().await, r1);
    assert_eq!(view_rv(), v1);

    let (r, changed) = d
        .update_metadata(
            Some("team-a"),
            &id,
            Default::default(),
            vec!["k8s.label/a".into(), "absent".into()],
        )
        .await
        .unwrap();
    assert!(changed && !r.metadata.contains_key("k8s.label/a"));
    assert!(view_rv() > v1);
    assert_eq!(
        d.get(Some("team-a"), &id).await.unwrap().metadata,
        r.metadata
    );

    let big = [("big".to_string(), "x".repeat(70 * 1024))];
    let e = d
        .update_metadata(Some("team-a"), &id, big.into(), vec![])
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Invalid, "{e}");
    let e = d
        .update_metadata(Some("team-b"), &id, Default::default(), vec![])
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound, "{e}");

    d.release(Some("team-a"), &id).await.unwrap();
    d.shutdown().await;
    node.proc.terminate();
    assert_no_leaks(tmp.path(), &[node.sandboxes_dir()]).await;
}
