//! Templates: an OCI image archive (`docker save` layout, made here from the test template's
//! own files plus a second layer with whiteouts) imported with `sandbox-gateway template
//! import`, a template built from another with more Debian packages, what nodes advertise
//! about templates, and snapshots that capture a sandbox's own layer, not its template.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use sandbox_gateway::dispatch::ClaimRequest;
use sandbox_gateway::dispatch::client::NodeConn;
use sandbox_gateway::model::PoolKey;
use sandbox_gateway::node::config::DEFAULT_UID_BASE;

fn claim_req(template: &str) -> ClaimRequest {
    ClaimRequest {
        namespace: "t".into(),
        name: template.into(),
        key: PoolKey::new(template, "none", "small").unwrap(),
        ttl_seconds: 300,
        metadata: Default::default(),
        env_vars: Default::default(),
        lifecycle: Default::default(),
        network: Default::default(),
        volume_mounts: Vec::new(),
    }
}

fn template_cli(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("template")
        .args(args)
        .arg("--templates-dir")
        .arg(templates_dir())
        .output()
        .expect("run sandbox-gateway template")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn images_import_and_templates_build_from_others() {
    let (tmp, token) = workspace();
    let suffix = std::process::id();
    let imported = format!("imported-{suffix}");
    let derived = format!("with-jq-{suffix}");
    let image = images::make_image(&tmp.path().join("image"));

    let out = template_cli(&["import", &imported, &image.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A bad archive is a clear error and leaves nothing behind.
    std::fs::write(tmp.path().join("junk.tar"), b"not a tar file at all").unwrap();
    let out = template_cli(&[
        "import",
        "junk",
        &tmp.path().join("junk.tar").display().to_string(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a usable image archive"));
    assert!(!templates_dir().join("junk").exists());

    let out = template_cli(&["build", &derived, "--packages", "jq", "--from", "base"]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = template_cli(&[
        "build",
        &derived,
        "--packages",
        "--not-a-package",
        "--from",
        "base",
    ]);
    assert!(!out.status.success());

    let node = NodeProc::start(
        "templates",
        &tmp.path().join("node"),
        &token,
        "127.0.0.1:0",
        &[
            "--pool",
            &format!("{imported}=1"),
            "--pool",
            &format!("{derived}=1"),
            "--pool",
            "base=1",
        ],
    );
    let d = dispatcher(TOKEN, &[&node]);
    d.wait_for_nodes(1, Duration::from_secs(30)).await.unwrap();

    // The image's layers, whiteouts, environment and working directory.
    let r = d.claim(claim_req(&imported)).await.unwrap().record;
    let c = SandboxClient::of(&r);
    let ran = c.run("pwd; ls /opt/a; ls /opt; echo imported=$IMPORTED; id -un");
    assert_eq!(
        ran.stdout, "/opt\nnew.txt\na\nimported=yes\nuser\n",
        "{ran:?}"
    );

    // The derived template has the extra package; base does not.
    let r = d.claim(claim_req(&derived)).await.unwrap().record;
    let jq = SandboxClient::of(&r).run("echo '{\"a\":7}' | jq .a");
    assert_eq!(jq.stdout, "7\n", "{jq:?}");

    // What the node advertises about them.
    let info = NodeConn::new(&node.addr, TOKEN)
        .unwrap()
        .info(Duration::from_secs(5))
        .await
        .unwrap();
    let base = info
        .template_info
        .iter()
        .find(|t| t.name == "base")
        .unwrap();
    assert!(
        base.size_bytes > 100 << 20 && base.packages.iter().any(|p| p == "python3"),
        "{base:?}"
    );
    let with_jq = info
        .template_info
        .iter()
        .find(|t| t.name == derived)
        .unwrap();
    assert!(
        with_jq.packages.iter().any(|p| p == "jq") && with_jq.kind == "derived",
        "{with_jq:?}"
    );
    assert_eq!(
        info.template_info
            .iter()
            .find(|t| t.name == imported)
            .unwrap()
            .kind,
        "oci"
    );

    // A snapshot holds the sandbox's layer, not the template under it.
    let r = d.claim(claim_req("base")).await.unwrap().record;
    let c = SandboxClient::of(&r);
    c.run("head -c 4194304 /dev/urandom > /home/user/four-mib");
    let ck = d
        .create_checkpoint(None, &r.id, "layer", false)
        .await
        .unwrap();
    assert!(
        ck.size_bytes >= 4 << 20 && ck.size_bytes < 64 << 20,
        "a checkpoint of {} bytes for a {} byte template",
        ck.size_bytes,
        base.size_bytes
    );
    let branch = d
        .claim_from_checkpoint(&ck.id, "", claim_req("base"))
        .await
        .unwrap()
        .record;
    let sum = "sha256sum < /home/user/four-mib";
    assert_eq!(
        SandboxClient::of(&branch).run(sum).stdout,
        c.run(sum).stdout
    );
    d.delete_checkpoint(&ck.id, "").await.unwrap();

    d.shutdown().await;
    let dir = node.sandboxes_dir();
    let mut node = node;
    node.proc.terminate();
    assert_no_leaks(tmp.path(), &[dir]).await;

    // `--if-missing` (how first starts and the tests make sure of a template) answers a
    // usable template as it is, and rebuilds one whose files lost their owners, as a copy
    // with `cp -r` leaves them; before, such a tree was kept and every sandbox on it failed.
    let build_again = || {
        template_cli(&[
            "build",
            &derived,
            "--packages",
            "jq",
            "--from",
            "base",
            "--if-missing",
        ])
    };
    let template_id = || {
        let meta = std::fs::read(templates_dir().join(&derived).join("template.json")).unwrap();
        serde_json::from_slice::<serde_json::Value>(&meta).unwrap()["id"].clone()
    };
    let first = template_id();
    let out = build_again();
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    assert_eq!(template_id(), first);
    // `rootfs` links to the tree (a root layer); what `cp -r` run by root does to its top.
    let root = templates_dir().join(&derived).join("rootfs");
    std::os::unix::fs::chown(&root, Some(0), Some(0)).unwrap();
    let out = build_again();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("damaged") && said.contains("rebuilding it now"),
        "{out:?}"
    );
    assert_ne!(template_id(), first);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&root).unwrap().uid(), DEFAULT_UID_BASE);

    for t in [&imported, &derived] {
        let dir = templates_dir().join(t);
        let tree = std::fs::canonicalize(dir.join("rootfs")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            tree.starts_with(templates_dir().join(".layers")),
            "{tree:?}"
        );
        std::fs::remove_dir_all(&tree).unwrap();
    }
}

/// The embedded default's first start as a newcomer has it: `base` is there, `code-interpreter`
/// is not. Its recipe builds in the background while `base` sandboxes are served; a create of
/// `code-interpreter-v1` meanwhile is told to come back (503, saying why); and stopping the
/// gateway in the middle of the build leaves no process or mount behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn base_is_served_while_a_recipe_builds_on_first_start() {
    let (tmp, _) = workspace();
    let templates = tmp.path().join("templates");
    std::fs::create_dir_all(&templates).unwrap();
    std::os::unix::fs::symlink(templates_dir().join("base"), templates.join("base")).unwrap();
    let dir = templates.display().to_string();
    let mut gw = Gateway::start(
        tmp.path(),
        &[
            "--templates-dir",
            &dir,
            "--pool",
            "base/egress=1",
            "--pool",
            "code-interpreter/egress/medium=1",
        ],
    );
    gw.proc.wait_line(
        "code-interpreter | building template code-interpreter in the background",
        Duration::from_secs(30),
    );
    for _ in 0..600 {
        if gw.warm().await >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sb = gw
        .create(KEY_A, serde_json::json!({"templateID": "base"}))
        .await;
    let id = sb["sandboxID"].as_str().unwrap().to_string();

    // Nodes report what they build with their info, every few seconds.
    let mut last = None;
    for _ in 0..300 {
        let r = gw
            .call(
                reqwest::Method::POST,
                "/v2/sandboxes",
                Some(KEY_A),
                Some(serde_json::json!({"templateID": "code-interpreter-v1"})),
            )
            .await;
        if r.status == reqwest::StatusCode::SERVICE_UNAVAILABLE {
            last = Some(r);
            break;
        }
        assert_eq!(r.status, reqwest::StatusCode::NOT_FOUND, "{:?}", r.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = last.expect("a create during the build was never told it is being built");
    let message = r.body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("\"code-interpreter-v1\" is being built") && message.contains("minutes"),
        "{message}"
    );
    assert!(r.headers.contains_key("retry-after"), "{:?}", r.headers);
    assert!(
        !gw.proc
            .seen
            .iter()
            .any(|l| l.contains("template code-interpreter is ready")),
        "the build was over before the checks"
    );
    assert_eq!(gw.kill(KEY_A, &id).await, reqwest::StatusCode::NO_CONTENT);
    gw.proc.terminate();
    // The build's copy, apt and the rest end with the gateway (its staging directory is
    // removed when the next start cleans up).
    assert_no_leaks(tmp.path(), &[gw.data.join("node/sandboxes")]).await;
    assert!(!templates.join("code-interpreter").exists());
}
