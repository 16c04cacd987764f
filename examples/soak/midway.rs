//! Faults in the middle of one operation: a node SIGKILLed during a streaming command, a file
//! upload, a snapshot and a fork, and a node that stops answering (SIGSTOP) for longer than
//! the gateway's call deadline. Each case records what the client saw, what was lost, and what
//! the restarted node left behind.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;

use crate::common::Res;
use crate::envd::{Envd, Via};
use crate::faults::{Case, first_line, status};
use crate::fleet::Fleet;
use crate::{Created, KEY, create_e2b};

/// What a sandbox holds before the operation, so that copies take long enough to be hit.
const FILL_MIB: u32 = 192;
const KUBE: &str = "/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes";

fn envd(fleet: &Fleet, c: &Created) -> Envd {
    Envd::new(Via::Gateway {
        addr: fleet.gateways[0]
            .address
            .trim_start_matches("http://")
            .to_string(),
        id: c.0.clone(),
        token: c.1.clone(),
    })
}

/// The fleet index of the node named in a create's answer.
fn node_index(c: &Created) -> Res<usize> {
    c.2.strip_prefix("soak")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("unexpected node name {:?}", c.2).into())
}

/// A sandbox with `FILL_MIB` of data on its disk.
async fn filled(fleet: &Fleet) -> Res<(Created, usize)> {
    let c = create_e2b(&fleet.http, &fleet.gateways[0].address).await?;
    let ran = envd(fleet, &c)
        .run(&format!(
            "dd if=/dev/zero of=$HOME/fill bs=1M count={FILL_MIB} status=none && sync"
        ))
        .await?;
    if ran.exit_code != 0 {
        return Err(format!(
            "filling the sandbox failed: {}",
            String::from_utf8_lossy(&ran.stderr)
        )
        .into());
    }
    let node = node_index(&c)?;
    Ok((c, node))
}

/// How an interrupted call ended, for the report.
fn outcome<T>(r: &Res<T>, ok: impl FnOnce(&T) -> String) -> String {
    match r {
        Ok(v) => ok(v),
        Err(e) => format!("an error: {}", first_line(&e.to_string())),
    }
}

/// Restarts node `node` and waits until a gateway answers for `id` with something other than
/// "node unreachable"; answers that status.
async fn restart_and_look(fleet: &mut Fleet, node: usize, id: &str) -> Res<u16> {
    fleet.nodes[node].restart()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, _) = status(fleet, 0, reqwest::Method::GET, &format!("/sandboxes/{id}")).await?;
        if (code != 502 && code != 503) || Instant::now() > deadline {
            return Ok(code);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Checkpoint directories on node `node` that no listed snapshot accounts for.
async fn unlisted_checkpoints(fleet: &Fleet, node: usize) -> Res<usize> {
    let (_, listed) = status(fleet, 0, reqwest::Method::GET, "/snapshots").await?;
    let known: Vec<String> = listed
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s["snapshotID"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let dir = Fleet::node_root(&fleet.nodes[node]).join("checkpoints");
    Ok(std::fs::read_dir(dir)
        .map(|r| {
            r.filter_map(Result::ok)
                .filter(|e| !known.contains(&e.file_name().to_string_lossy().to_string()))
                .count()
        })
        .unwrap_or(0))
}

/// Deletes every listed snapshot (a case's snapshot may have completed before the kill).
async fn delete_snapshots(fleet: &Fleet) -> Res<()> {
    let (_, listed) = status(fleet, 0, reqwest::Method::GET, "/snapshots").await?;
    for s in listed.as_array().into_iter().flatten() {
        if let Some(id) = s["snapshotID"].as_str() {
            status(
                fleet,
                0,
                reqwest::Method::DELETE,
                &format!("/templates/{id}"),
            )
            .await?;
        }
    }
    Ok(())
}

fn left_after(unlisted: usize) -> String {
    if unlisted == 0 {
        "nothing: no checkpoint directory without a listed snapshot".into()
    } else {
        format!("{unlisted} checkpoint directories without a listed snapshot")
    }
}

/// A node SIGKILLed while a command streams its output through the gateway.
async fn during_command(fleet: &mut Fleet) -> Res<Case> {
    let c = create_e2b(&fleet.http, &fleet.gateways[0].address).await?;
    let node = node_index(&c)?;
    let mut e = envd(fleet, &c);
    let running = tokio::spawn(async move {
        e.run("for i in $(seq 1 30); do echo $i; sleep 0.1; done")
            .await
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    fleet.nodes[node].kill();
    let saw = outcome(&running.await?, |r| {
        format!(
            "the stream ended with exit {} after {} lines",
            r.exit_code,
            r.stdout.iter().filter(|b| **b == b'\n').count()
        )
    });
    let after = restart_and_look(fleet, node, &c.0).await?;
    Ok(Case {
        name: "node SIGKILL during a streaming command",
        saw: format!("{saw}; GET after the restart: {after}"),
        lost: "the sandbox (its processes end with the node; the restarted node reports it gone)"
            .into(),
        left: "nothing: the restarted node removes its predecessor's instances".into(),
    })
}

/// A node SIGKILLed while a 64 MiB upload trickles in.
async fn during_upload(fleet: &mut Fleet) -> Res<Case> {
    let c = create_e2b(&fleet.http, &fleet.gateways[0].address).await?;
    let node = node_index(&c)?;
    let mut e = envd(fleet, &c);
    const CHUNKS: u64 = 64;
    let chunks = futures::stream::iter(0..CHUNKS).then(|_| async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok::<_, std::io::Error>(Frame::data(Bytes::from(vec![7u8; 1 << 20])))
    });
    let body = StreamBody::new(chunks).boxed_unsync();
    let uploading =
        tokio::spawn(async move { e.upload("/home/user/upload.bin", CHUNKS << 20, body).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    fleet.nodes[node].kill();
    let saw = outcome(&uploading.await?, |code| format!("{code}"));
    let after = restart_and_look(fleet, node, &c.0).await?;
    Ok(Case {
        name: "node SIGKILL during a 64 MiB file upload",
        saw: format!("{saw}; GET after the restart: {after}"),
        lost: "the upload and the sandbox it went to".into(),
        left: "nothing: the partial file was on the sandbox's disk, removed with it".into(),
    })
}

/// A node SIGKILLed while it copies a sandbox into a snapshot.
async fn during_snapshot(fleet: &mut Fleet) -> Res<Case> {
    let (c, node) = filled(fleet).await?;
    let (http, url, id) = (
        fleet.http.clone(),
        fleet.gateways[0].address.clone(),
        c.0.clone(),
    );
    let snapping = tokio::spawn(async move {
        let r = http
            .post(format!("{url}/sandboxes/{id}/snapshots"))
            .header("X-API-KEY", KEY)
            .send()
            .await?;
        Res::Ok(r.status().as_u16())
    });
    tokio::time::sleep(Duration::from_millis(60)).await;
    fleet.nodes[node].kill();
    let saw = outcome(&snapping.await?, |code| format!("{code}"));
    let after = restart_and_look(fleet, node, &c.0).await?;
    let unlisted = unlisted_checkpoints(fleet, node).await?;
    delete_snapshots(fleet).await?;
    Ok(Case {
        name: "node SIGKILL during a snapshot",
        saw: format!("{saw}; GET after the restart: {after}"),
        lost: "the snapshot in progress and the sandbox; a snapshot is recorded only once complete"
            .into(),
        left: left_after(unlisted),
    })
}

/// The Kubernetes name of e2b sandbox `id` (its claim reference).
async fn kube_name(fleet: &Fleet, id: &str) -> Res<String> {
    let base = fleet.gateways[0]
        .kube_address
        .clone()
        .ok_or("no Kubernetes listener")?;
    let list: serde_json::Value = fleet.https[0]
        .get(format!("{base}{KUBE}"))
        .bearer_auth(KEY)
        .send()
        .await?
        .json()
        .await?;
    list["items"]
        .as_array()
        .and_then(|items| {
            // The e2b id is the claim id made DNS-safe (`_` becomes `-`).
            items.iter().find(|s| {
                s["metadata"]["annotations"]["sandbox.cocoonstack.io/claim-id"]
                    .as_str()
                    .is_some_and(|c| c.replace('_', "-") == id)
            })
        })
        .and_then(|s| s["metadata"]["name"].as_str())
        .map(str::to_string)
        .ok_or_else(|| format!("sandbox {id} is not listed on the Kubernetes surface").into())
}

/// A node SIGKILLed while it forks a sandbox into four.
async fn during_fork(fleet: &mut Fleet) -> Res<Case> {
    let (c, node) = filled(fleet).await?;
    let name = kube_name(fleet, &c.0).await?;
    let before = fleet.claimed().await?.len();
    let base = fleet.gateways[0]
        .kube_address
        .clone()
        .ok_or("no Kubernetes listener")?;
    let https = fleet.https[0].clone();
    let forking = tokio::spawn(async move {
        let r = https
            .post(format!("{base}{KUBE}/{name}/fork"))
            .bearer_auth(KEY)
            .json(&serde_json::json!({"count": 4, "ttlSeconds": 120}))
            .send()
            .await?;
        Res::Ok(r.status().as_u16())
    });
    tokio::time::sleep(Duration::from_millis(80)).await;
    fleet.nodes[node].kill();
    let saw = outcome(&forking.await?, |code| format!("{code}"));
    let after = restart_and_look(fleet, node, &c.0).await?;
    let listed = fleet.claimed().await?.len();
    let unlisted = unlisted_checkpoints(fleet, node).await?;
    delete_snapshots(fleet).await?;
    Ok(Case {
        name: "node SIGKILL during a fork into 4",
        saw: format!(
            "{saw}; GET of the parent after the restart: {after}; sandboxes listed before {before}, after {listed}"
        ),
        lost: "the parent and any children on the killed node".into(),
        left: left_after(unlisted),
    })
}

/// SIGSTOP or SIGCONT to a node.
fn signal(fleet: &Fleet, node: usize, sig: nix::sys::signal::Signal) -> Res<()> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(fleet.nodes[node].pid()), sig)?;
    Ok(())
}

/// Status, `Retry-After` and time taken of one e2b call.
async fn timed(
    fleet: &Fleet,
    method: reqwest::Method,
    path: &str,
) -> Res<(u16, Option<String>, Duration)> {
    let t = Instant::now();
    let r = fleet
        .http
        .request(method, format!("{}{path}", fleet.gateways[0].address))
        .header("X-API-KEY", KEY)
        .timeout(Duration::from_secs(60))
        .send()
        .await?;
    let retry = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    Ok((r.status().as_u16(), retry, t.elapsed()))
}

fn describe(what: &str, r: &Res<(u16, Option<String>, Duration)>) -> String {
    match r {
        Ok((code, retry, took)) => format!(
            "{what} {code}{} in {:.1} s",
            retry
                .as_ref()
                .map(|s| format!(" (Retry-After {s})"))
                .unwrap_or_default(),
            took.as_secs_f64()
        ),
        Err(e) => format!("{what}: {}", first_line(&e.to_string())),
    }
}

/// A node that stops answering for 15 s (SIGSTOP: connections open but nothing is read), longer
/// than the gateway's 10 s call deadline, while clients read, kill and create.
async fn slow_node(fleet: &mut Fleet) -> Res<Case> {
    let victim = create_e2b(&fleet.http, &fleet.gateways[0].address).await?;
    let node = node_index(&victim)?;
    let other = create_e2b(&fleet.http, &fleet.gateways[0].address).await?;
    let before = fleet.claimed().await?.len();
    signal(fleet, node, nix::sys::signal::Signal::SIGSTOP)?;
    let stopped = Instant::now();
    let fleet_ref: &Fleet = fleet;
    let (victim_path, other_path) = (
        format!("/sandboxes/{}", victim.0),
        format!("/sandboxes/{}", other.0),
    );
    let get = timed(fleet_ref, reqwest::Method::GET, &victim_path);
    let kill = timed(fleet_ref, reqwest::Method::DELETE, &victim_path);
    let creates = async {
        let mut by: BTreeMap<String, usize> = BTreeMap::new();
        let mut made = Vec::new();
        let mut slowest = Duration::ZERO;
        for _ in 0..6 {
            let t = Instant::now();
            match create_e2b(&fleet_ref.http, &fleet_ref.gateways[0].address).await {
                Ok(c) => {
                    *by.entry(format!("201 on {}", c.2)).or_default() += 1;
                    made.push(c.0);
                }
                Err(e) => *by.entry(first_line(&e.to_string())).or_default() += 1,
            }
            slowest = slowest.max(t.elapsed());
        }
        (by, made, slowest)
    };
    let other_get = timed(fleet_ref, reqwest::Method::GET, &other_path);
    let (get, kill, (by, made, slowest), other_get) = tokio::join!(get, kill, creates, other_get);
    // Keep it stopped for the whole window, then let it go on.
    if let Some(rest) = Duration::from_secs(15).checked_sub(stopped.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    signal(fleet, node, nix::sys::signal::Signal::SIGCONT)?;
    // After it resumes: did the kill it may have received happen, and did anything run twice?
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (after_code, _) = status(
        fleet,
        0,
        reqwest::Method::GET,
        &format!("/sandboxes/{}", victim.0),
    )
    .await?;
    let listed = fleet.claimed().await?.len();
    let expected = before + made.len() - usize::from(after_code == 404);
    for id in made.iter().chain([&other.0, &victim.0]) {
        status(
            fleet,
            0,
            reqwest::Method::DELETE,
            &format!("/sandboxes/{id}"),
        )
        .await?;
    }
    Ok(Case {
        name: "a node that stops answering for 15 s (SIGSTOP)",
        saw: format!(
            "{}; {}; a sandbox on another node: {}; 6 creates one after another: {by:?}, slowest {:.1} s",
            describe("GET of its sandbox", &get),
            describe("DELETE of its sandbox", &kill),
            describe("GET", &other_get),
            slowest.as_secs_f64()
        ),
        lost: format!(
            "after it resumed: GET of its sandbox {after_code}; sandboxes listed before {before}, after {listed}, {} creates answered 201: {}",
            made.len(),
            if listed == expected {
                "no sandbox the clients were not told of".to_string()
            } else {
                format!(
                    "{} sandboxes no client was told of",
                    listed as i64 - expected as i64
                )
            }
        ),
        left: "nothing beyond what the clean-up deleted".into(),
    })
}

pub async fn cases(fleet: &mut Fleet) -> Res<Vec<Case>> {
    let mut out = Vec::new();
    out.push(during_command(fleet).await?);
    fleet.settle(Duration::from_secs(90)).await?;
    out.push(during_upload(fleet).await?);
    fleet.settle(Duration::from_secs(90)).await?;
    out.push(during_snapshot(fleet).await?);
    fleet.settle(Duration::from_secs(90)).await?;
    out.push(during_fork(fleet).await?);
    fleet.settle(Duration::from_secs(90)).await?;
    out.push(slow_node(fleet).await?);
    fleet.settle(Duration::from_secs(90)).await?;
    Ok(out)
}
