//! The lifecycle walk-through: every operation on both surfaces against a live gateway, one
//! line per step (what it did, the ids, the node, the time), so the output doubles as
//! acceptance evidence. It stops with a non-zero exit at the first answer that is not what the
//! contract says.
//!
//!     cargo run --example lifecycle -- --kubeconfig FILE --namespace default \
//!         --e2b-url http://127.0.0.1:3000 --e2b-key "$E2B_API_KEY"
//!
//! The Kubernetes half uses the kube crate as any Rust client would; the e2b half speaks plain
//! HTTP as an SDK does. Without `--e2b-url` only the Kubernetes half runs. The template comes
//! from the pools the fleet advertises (NodeInventory objects, the e2b template list), so no
//! image is named here. Everything the walk-through creates it deletes again.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use reqwest::{Method, StatusCode};
use sandbox_gateway::cluster::inventory::NodeInventory;
use serde::Deserialize;
use serde_json::{Value, json};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Parser)]
#[command(about = "Walk through every sandbox operation on both surfaces of a live gateway")]
struct Args {
    /// Kubeconfig for the Kubernetes API (kube-apiserver, or a local gateway's facade).
    #[arg(long)]
    kubeconfig: PathBuf,
    #[arg(long, default_value = "default")]
    namespace: String,
    /// The e2b API; without it only the Kubernetes half runs.
    #[arg(long)]
    e2b_url: Option<String>,
    #[arg(long, env = "E2B_API_KEY")]
    e2b_key: Option<String>,
}

const CLAIM_ID: &str = "sandbox.cocoonstack.io/claim-id";
const NODE_LABEL: &str = "sandbox.cocoonstack.io/node";
const PHASE_LABEL: &str = "sandbox.cocoonstack.io/phase";
const NET: &str = "sandbox.cocoonstack.io/net";

/// A deviation from the contract: the step and what was wrong.
fn deviation(step: &str, what: impl std::fmt::Display) -> Box<dyn std::error::Error + Send + Sync> {
    format!("{step}: {what}").into()
}

fn check(ok: bool, step: &str, what: impl std::fmt::Display) -> Res<()> {
    if ok {
        Ok(())
    } else {
        Err(deviation(step, what))
    }
}

fn step(name: &str, detail: impl std::fmt::Display, took: Duration) {
    println!(
        "  {name:<10} {detail} ({:.1} ms)",
        took.as_secs_f64() * 1000.0
    );
}

fn is_claim_id(s: &str) -> bool {
    is_id(s, "sb_")
}

fn is_id(s: &str, prefix: &str) -> bool {
    s.strip_prefix(prefix)
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn run_id() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros())
            % 0xffff_ffff
    )
}

// ----- the Kubernetes half -----

/// `SandboxSnapshotResult`, as a client reads it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SnapshotResult {
    kind: String,
    #[serde(rename = "snapshotID")]
    snapshot_id: String,
    name: String,
    node_name: String,
    creation_timestamp: String,
}

/// `SandboxForkResult`.
#[derive(Deserialize)]
struct ForkResult {
    kind: String,
    children: Vec<ForkChild>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ForkChild {
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    node_name: String,
    token: String,
}

fn annotation<'a>(o: &'a DynamicObject, key: &str) -> Option<&'a str> {
    o.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn label<'a>(o: &'a DynamicObject, key: &str) -> Option<&'a str> {
    o.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// A warm pool the fleet advertises: (template, net), preferring the fullest small pool.
async fn advertised_pool(client: &kube::Client) -> Res<(String, String)> {
    let nodes: Api<NodeInventory> = Api::all(client.clone());
    let list = nodes
        .list(&ListParams::default())
        .await
        .map_err(|e| deviation("discover", format!("listing NodeInventory objects: {e}")))?;
    list.items
        .iter()
        .flat_map(|n| n.pools.iter())
        .filter(|p| p.size.is_empty() || p.size == "small")
        .max_by_key(|p| (p.warm, p.target))
        .map(|p| (p.template.clone(), p.net.clone()))
        .ok_or_else(|| deviation("discover", "no node advertises a pool"))
}

/// Runs the Kubernetes half; answers the snapshot it took (the Kubernetes API has no way to
/// delete one; the e2b half does when it runs).
async fn kubernetes(args: &Args) -> Res<String> {
    println!("=== Kubernetes API ===");
    sandbox_gateway::tlsx::install_crypto();
    let client = sandbox_gateway::cluster::client(Some(&args.kubeconfig), "--kubeconfig").await?;
    let t = Instant::now();
    let (template, net) = advertised_pool(&client).await?;
    step(
        "discover",
        format!("template={template} net={net} (from the fleet's NodeInventory pools)"),
        t.elapsed(),
    );
    let gvk = GroupVersionKind::gvk("agents.x-k8s.io", "v1beta1", "Sandbox");
    let sandboxes: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &args.namespace,
        &ApiResource::from_gvk_with_plural(&gvk, "sandboxes"),
    );
    let name = format!("example-{}", run_id());
    let ns = &args.namespace;

    // create
    let body: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
        "metadata": {"name": name, "labels": {"app": "lifecycle-example"},
                     "annotations": {NET: net}},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": template}]}},
                 "shutdownTime": (chrono::Utc::now() + chrono::Duration::minutes(10)).to_rfc3339()}
    }))?;
    let t = Instant::now();
    let created = sandboxes
        .create(&PostParams::default(), &body)
        .await
        .map_err(|e| deviation("create", e))?;
    let took = t.elapsed();
    let claim = annotation(&created, CLAIM_ID)
        .unwrap_or_default()
        .to_string();
    check(is_claim_id(&claim), "create", format!("claim id {claim:?}"))?;
    step(
        "create",
        format!("Sandbox {ns}/{name} claimID={claim}"),
        took,
    );

    // get: straight after create, no waiting
    let t = Instant::now();
    let got = sandboxes
        .get(&name)
        .await
        .map_err(|e| deviation("get", e))?;
    let took = t.elapsed();
    let node = label(&got, NODE_LABEL).unwrap_or_default().to_string();
    check(
        annotation(&got, CLAIM_ID) == Some(claim.as_str()),
        "get",
        "another claim id",
    )?;
    check(!node.is_empty(), "get", "no node label")?;
    step("get", format!("node={node} claimID={claim}"), took);

    // list (eventually consistent: another replica may not have it yet)
    let t = Instant::now();
    let listed = sandboxes
        .list(&ListParams::default().labels("app=lifecycle-example"))
        .await
        .map_err(|e| deviation("list", e))?;
    let took = t.elapsed();
    let present = listed
        .items
        .iter()
        .any(|o| o.metadata.name.as_deref() == Some(name.as_str()));
    step(
        "list",
        format!(
            "{} sandboxes labelled app=lifecycle-example; this one {}",
            listed.items.len(),
            if present {
                "listed"
            } else {
                "not listed yet (lists are eventually consistent)"
            }
        ),
        took,
    );

    // snapshot
    let snap_name = format!("example-{}", run_id());
    let t = Instant::now();
    let snap: SnapshotResult = sandboxes
        .create_subresource(
            "snapshot",
            &name,
            &PostParams::default(),
            &json!({"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "SandboxSnapshotOptions", "name": snap_name}),
        )
        .await
        .map_err(|e| deviation("snapshot", e))?;
    let took = t.elapsed();
    check(snap.kind == "SandboxSnapshotResult", "snapshot", &snap.kind)?;
    check(
        is_id(&snap.snapshot_id, "ck_"),
        "snapshot",
        format!("id {:?}", snap.snapshot_id),
    )?;
    check(
        snap.name == snap_name && snap.node_name == node,
        "snapshot",
        "name or node",
    )?;
    check(
        !snap.creation_timestamp.is_empty(),
        "snapshot",
        "no creationTimestamp",
    )?;
    step(
        "snapshot",
        format!(
            "snapshotID={} name={} on node={}",
            snap.snapshot_id, snap.name, snap.node_name
        ),
        took,
    );

    // fork: the source keeps running, the child lands on its node
    let t = Instant::now();
    let fork: ForkResult = sandboxes
        .create_subresource(
            "fork",
            &name,
            &PostParams::default(),
            &json!({"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "SandboxForkOptions", "count": 1, "ttlSeconds": 120}),
        )
        .await
        .map_err(|e| deviation("fork", e))?;
    let took = t.elapsed();
    check(
        fork.kind == "SandboxForkResult" && fork.children.len() == 1,
        "fork",
        "one child",
    )?;
    let child = &fork.children[0];
    check(
        is_claim_id(&child.sandbox_id),
        "fork",
        format!("child id {:?}", child.sandbox_id),
    )?;
    check(
        child.node_name == node,
        "fork",
        "the child is not on the source's node",
    )?;
    check(!child.token.is_empty(), "fork", "the child has no token")?;
    step(
        "fork",
        format!(
            "child[0] sandboxID={} node={}",
            child.sandbox_id, child.node_name
        ),
        took,
    );
    // A child is named by its claim id in the parent's namespace, readable at once.
    let child_name = child.sandbox_id.replace('_', "-");
    sandboxes
        .get(&child_name)
        .await
        .map_err(|e| deviation("fork", format!("reading child {child_name}: {e}")))?;

    // pause and resume
    for (verb, phase, why) in [
        (
            "pause",
            "Paused",
            "freezes the sandbox's processes in place",
        ),
        ("resume", "Running", "thaws them"),
    ] {
        let t = Instant::now();
        let _: Value = sandboxes
            .create_subresource(verb, &name, &PostParams::default(), &json!({}))
            .await
            .map_err(|e| deviation(verb, e))?;
        let took = t.elapsed();
        let now = sandboxes.get(&name).await.map_err(|e| deviation(verb, e))?;
        check(
            label(&now, PHASE_LABEL) == Some(phase),
            verb,
            format!("phase {:?}, expected {phase}", label(&now, PHASE_LABEL)),
        )?;
        step(verb, format!("phase={phase} ({why})"), took);
    }

    // delete: the child and the source; both gone at once
    let t = Instant::now();
    for n in [&child_name, &name] {
        sandboxes
            .delete(n, &DeleteParams::default())
            .await
            .map_err(|e| deviation("delete", e))?;
    }
    let took = t.elapsed();
    for n in [&child_name, &name] {
        match sandboxes.get(n).await {
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            other => {
                return Err(deviation(
                    "delete",
                    format!("{n} still readable: {other:?}"),
                ));
            }
        }
    }
    step(
        "delete",
        format!("Sandbox {ns}/{name} and child {child_name}; both 404 now"),
        took,
    );
    Ok(snap.snapshot_id)
}

// ----- the e2b half -----

struct E2b {
    http: reqwest::Client,
    url: String,
    key: String,
}

impl E2b {
    /// One call: the status and the JSON body (Null when empty), and the time it took.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Res<(StatusCode, Value, Duration)> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.url))
            .header("X-API-KEY", &self.key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let t = Instant::now();
        let res = req.send().await?;
        let status = res.status();
        let text = res.text().await?;
        let took = t.elapsed();
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text)?
        };
        Ok((status, body, took))
    }

    /// A call that must answer `want`.
    async fn expect(
        &self,
        step: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
        want: StatusCode,
    ) -> Res<(Value, Duration)> {
        let (status, body, took) = self.call(method.clone(), path, body).await?;
        check(
            status == want,
            step,
            format!("{method} {path} answered {status}, expected {want}: {body}"),
        )?;
        Ok((body, took))
    }
}

fn str_field<'a>(v: &'a Value, field: &str, step: &str) -> Res<&'a str> {
    v[field]
        .as_str()
        .ok_or_else(|| deviation(step, format!("no {field} in {v}")))
}

fn is_e2b_id(s: &str) -> bool {
    is_id(s, "sb-")
}

async fn e2b(url: &str, key: &str, kube_snapshot: &str) -> Res<()> {
    println!("=== e2b-compatible REST API ===");
    let api = E2b {
        http: reqwest::Client::new(),
        url: url.trim_end_matches('/').to_string(),
        key: key.to_string(),
    };
    let mut to_delete: Vec<String> = Vec::new();

    // templates: what the fleet offers
    let (templates, took) = api
        .expect("templates", Method::GET, "/templates", None, StatusCode::OK)
        .await?;
    let names: Vec<&str> = templates
        .as_array()
        .ok_or_else(|| deviation("templates", "not a list"))?
        .iter()
        .filter_map(|t| t["templateID"].as_str())
        .collect();
    let template = names
        .iter()
        .find(|t| **t == "base")
        .or(names.first())
        .ok_or_else(|| deviation("templates", "the fleet offers no template"))?
        .to_string();
    step(
        "templates",
        format!("{} offered; using templateID={template}", names.len()),
        took,
    );

    // create
    let run = run_id();
    let (created, took) = api
        .expect(
            "create",
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": template, "timeout": 300, "metadata": {"example": run}})),
            StatusCode::CREATED,
        )
        .await?;
    let id = str_field(&created, "sandboxID", "create")?.to_string();
    check(
        is_e2b_id(&id),
        "create",
        format!("sandboxID {id:?} is not DNS-safe"),
    )?;
    to_delete.push(id.clone());
    let envd = str_field(&created, "envdVersion", "create")?;
    let node = str_field(&created, "clientID", "create")?.to_string();
    step(
        "create",
        format!("sandboxID={id} envdVersion={envd} node={node}"),
        took,
    );

    // get, at once
    let (got, took) = api
        .expect(
            "get",
            Method::GET,
            &format!("/sandboxes/{id}"),
            None,
            StatusCode::OK,
        )
        .await?;
    check(
        got["sandboxID"] == id.as_str() && got["state"] == "running",
        "get",
        &got,
    )?;
    check(
        got["metadata"]["example"] == run.as_str(),
        "get",
        "metadata lost",
    )?;
    step(
        "get",
        format!("state=running endAt={}", str_field(&got, "endAt", "get")?),
        took,
    );

    // list (eventually consistent)
    let (listed, took) = api
        .expect(
            "list",
            Method::GET,
            &format!("/v2/sandboxes?metadata=example%3D{run}"),
            None,
            StatusCode::OK,
        )
        .await?;
    let present = listed
        .as_array()
        .ok_or_else(|| deviation("list", "not a list"))?
        .iter()
        .any(|s| s["sandboxID"] == id.as_str());
    step(
        "list",
        format!(
            "this one {}",
            if present {
                "listed"
            } else {
                "not listed yet (lists are eventually consistent)"
            }
        ),
        took,
    );

    // metrics
    let (metrics, took) = api
        .expect(
            "metrics",
            Method::GET,
            &format!("/sandboxes/{id}/metrics"),
            None,
            StatusCode::OK,
        )
        .await?;
    let m = metrics
        .as_array()
        .and_then(|a| a.last())
        .ok_or_else(|| deviation("metrics", format!("no sample in {metrics}")))?;
    check(m["cpuCount"].as_u64().is_some_and(|c| c > 0), "metrics", m)?;
    step(
        "metrics",
        format!("cpuCount={} memTotal={}", m["cpuCount"], m["memTotal"]),
        took,
    );

    // pause, and the 409 on repeat
    let (_, took) = api
        .expect(
            "pause",
            Method::POST,
            &format!("/sandboxes/{id}/pause"),
            None,
            StatusCode::NO_CONTENT,
        )
        .await?;
    let (again, _) = api
        .expect(
            "pause",
            Method::POST,
            &format!("/sandboxes/{id}/pause"),
            None,
            StatusCode::CONFLICT,
        )
        .await?;
    check(again["code"] == 409, "pause", "the repeat's error body")?;
    step(
        "pause",
        "204, then 409 on repeat — the already-paused contract holds",
        took,
    );

    // connect resumes it
    let (connected, took) = api
        .expect(
            "connect",
            Method::POST,
            &format!("/sandboxes/{id}/connect"),
            Some(json!({"timeout": 300})),
            StatusCode::CREATED,
        )
        .await?;
    check(connected["sandboxID"] == id.as_str(), "connect", &connected)?;
    let (state, _) = api
        .expect(
            "connect",
            Method::GET,
            &format!("/sandboxes/{id}"),
            None,
            StatusCode::OK,
        )
        .await?;
    check(
        state["state"] == "running",
        "connect",
        "not running after connect",
    )?;
    step("connect", "201 — resumed, running again", took);

    // fork
    let (forked, took) = api
        .expect(
            "fork",
            Method::POST,
            &format!("/sandboxes/{id}/fork"),
            Some(json!({"count": 1, "timeout": 120})),
            StatusCode::CREATED,
        )
        .await?;
    let child = forked
        .as_array()
        .and_then(|a| a.first())
        .and_then(|c| c["sandbox"]["sandboxID"].as_str())
        .ok_or_else(|| deviation("fork", format!("no child in {forked}")))?
        .to_string();
    check(is_e2b_id(&child), "fork", format!("child id {child:?}"))?;
    to_delete.push(child.clone());
    step("fork", format!("child[0] sandboxID={child}"), took);

    // snapshot, listed, and a sandbox from it
    let (snap, took) = api
        .expect(
            "snapshot",
            Method::POST,
            &format!("/sandboxes/{id}/snapshots"),
            Some(json!({"name": format!("example-{run}")})),
            StatusCode::CREATED,
        )
        .await?;
    let snap_id = str_field(&snap, "snapshotID", "snapshot")?.to_string();
    check(
        snap["names"] == json!([format!("example-{run}")]),
        "snapshot",
        &snap,
    )?;
    step("snapshot", format!("snapshotID={snap_id}"), took);
    let (snaps, took) = api
        .expect(
            "snapshots",
            Method::GET,
            &format!("/snapshots?sandboxID={id}"),
            None,
            StatusCode::OK,
        )
        .await?;
    check(
        snaps
            .as_array()
            .is_some_and(|a| a.iter().any(|s| s["snapshotID"] == snap_id.as_str())),
        "snapshots",
        &snaps,
    )?;
    step(
        "snapshots",
        format!("listing for sandboxID={id} has {snap_id}"),
        took,
    );
    let (branch, took) = api
        .expect(
            "branch",
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": snap_id, "timeout": 120})),
            StatusCode::CREATED,
        )
        .await?;
    let branch_id = str_field(&branch, "sandboxID", "branch")?.to_string();
    check(branch["templateID"] == snap_id.as_str(), "branch", &branch)?;
    to_delete.push(branch_id.clone());
    step(
        "branch",
        format!("sandboxID={branch_id} from templateID={snap_id}"),
        took,
    );

    // timeout and keepalive move the end
    let (_, took) = api
        .expect(
            "timeout",
            Method::POST,
            &format!("/sandboxes/{id}/timeout"),
            Some(json!({"timeout": 120})),
            StatusCode::NO_CONTENT,
        )
        .await?;
    let (after, _) = api
        .expect(
            "timeout",
            Method::GET,
            &format!("/sandboxes/{id}"),
            None,
            StatusCode::OK,
        )
        .await?;
    let end = chrono::DateTime::parse_from_rfc3339(str_field(&after, "endAt", "timeout")?)?;
    let left = (end.to_utc() - chrono::Utc::now()).num_seconds();
    check(
        (60..=130).contains(&left),
        "timeout",
        format!("{left} s left, expected about 120"),
    )?;
    step("timeout", format!("endAt={end} ({left} s left)"), took);
    let (_, took) = api
        .expect(
            "keepalive",
            Method::POST,
            &format!("/sandboxes/{id}/refreshes"),
            Some(json!({"duration": 60})),
            StatusCode::NO_CONTENT,
        )
        .await?;
    step("keepalive", "204 — refreshed", took);

    // delete everything, then the snapshot
    let t = Instant::now();
    for s in &to_delete {
        api.expect(
            "delete",
            Method::DELETE,
            &format!("/sandboxes/{s}"),
            None,
            StatusCode::NO_CONTENT,
        )
        .await?;
    }
    for s in &to_delete {
        api.expect(
            "delete",
            Method::GET,
            &format!("/sandboxes/{s}"),
            None,
            StatusCode::NOT_FOUND,
        )
        .await?;
    }
    api.expect(
        "delete",
        Method::DELETE,
        &format!("/templates/{snap_id}"),
        None,
        StatusCode::NO_CONTENT,
    )
    .await?;
    let mut snapshots = snap_id.clone();
    // The Kubernetes half's snapshot, when this key's tenant is that namespace.
    let (status, _, _) = api
        .call(Method::DELETE, &format!("/templates/{kube_snapshot}"), None)
        .await?;
    if status == StatusCode::NO_CONTENT {
        snapshots = format!("{snapshots} and {kube_snapshot}");
    }
    step(
        "delete",
        format!(
            "{} sandboxes and snapshot {snapshots}; all 404 now",
            to_delete.len()
        ),
        t.elapsed(),
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lifecycle: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let outcome = rt.block_on(async {
        let kube_snapshot = kubernetes(&args).await?;
        match &args.e2b_url {
            None => println!(
                "  note       snapshot {kube_snapshot} stays (the Kubernetes API cannot delete snapshots; the e2b API can)"
            ),
            Some(url) => {
            let key = args
                .e2b_key
                .as_deref()
                .ok_or_else(|| deviation("e2b", "--e2b-url needs --e2b-key (or E2B_API_KEY)"))?;
            println!();
            e2b(url, key, &kube_snapshot).await?;
            }
        }
        Res::Ok(())
    });
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lifecycle: deviation at {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
