//! The fault matrix: a gateway or a node killed in the middle of something, and a node
//! restarted with running and paused sandboxes and a snapshot. Each case records what the
//! client saw, what was lost, and whether anything was left behind.

use std::time::{Duration, Instant};

use crate::common::Res;
use crate::envd::{Envd, Via};
use crate::fleet::Fleet;
use crate::{Created, KEY, create_e2b};

pub struct Case {
    pub name: &'static str,
    pub saw: String,
    pub lost: String,
    pub left: String,
}

fn envd_via(gw: &str, c: &Created) -> Envd {
    Envd::new(Via::Gateway {
        addr: gw.trim_start_matches("http://").to_string(),
        id: c.0.clone(),
        token: c.1.clone(),
    })
}

pub async fn status(
    fleet: &Fleet,
    gw: usize,
    method: reqwest::Method,
    path: &str,
) -> Res<(u16, serde_json::Value)> {
    let r = fleet
        .http
        .request(method, format!("{}{path}", fleet.gateways[gw].address))
        .header("X-API-KEY", KEY)
        .send()
        .await?;
    let code = r.status().as_u16();
    let body = r.json().await.unwrap_or(serde_json::Value::Null);
    Ok((code, body))
}

/// Creates e2b sandboxes through `gw` until one lands on node `node`; kills the others.
async fn create_on(fleet: &Fleet, gw: usize, node: usize) -> Res<Created> {
    let want = format!("soak{node}");
    let mut others = Vec::new();
    let found = loop {
        let c = create_e2b(&fleet.http, &fleet.gateways[gw].address).await?;
        if c.2 == want {
            break c;
        }
        others.push(c);
        if others.len() > 24 {
            return Err(format!("no create landed on {want}").into());
        }
    };
    for o in others {
        status(
            fleet,
            gw,
            reqwest::Method::DELETE,
            &format!("/sandboxes/{}", o.0),
        )
        .await?;
    }
    Ok(found)
}

/// Waits until `check` holds, up to `within`; answers how long it took.
async fn until(within: Duration, mut check: impl FnMut() -> bool) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < within {
        if check() {
            return Some(t.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// A gateway SIGKILLed while a command runs through it.
async fn gateway_killed_mid_command(fleet: &mut Fleet) -> Res<Case> {
    let c = create_e2b(&fleet.http, &fleet.gateways[0].address).await?;
    let mut envd = envd_via(&fleet.gateways[0].address, &c);
    let running = tokio::spawn(async move { envd.run("sleep 2; echo finished").await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    fleet.gateways[0].kill();
    let saw = match running.await? {
        Ok(r) => format!("the command completed (exit {})", r.exit_code),
        Err(e) => format!("the stream broke: {}", first_line(&e.to_string())),
    };
    // The other replica still serves the sandbox, and the restarted one does again.
    let (code, body) = status(
        fleet,
        1,
        reqwest::Method::GET,
        &format!("/sandboxes/{}", c.0),
    )
    .await?;
    let mut via_other = envd_via(&fleet.gateways[1].address, &c);
    let other_ok = via_other
        .run("echo alive")
        .await
        .is_ok_and(|r| r.stdout == b"alive\n");
    fleet.gateways[0].restart()?;
    let mut via_new = envd_via(&fleet.gateways[0].address, &c);
    let new_ok = via_new
        .run("echo again")
        .await
        .is_ok_and(|r| r.stdout == b"again\n");
    status(
        fleet,
        1,
        reqwest::Method::DELETE,
        &format!("/sandboxes/{}", c.0),
    )
    .await?;
    Ok(Case {
        name: "gateway SIGKILL during a streaming command",
        saw,
        lost: format!(
            "that command's stream only: the sandbox stayed {} (GET {code} on the other replica), commands through the other replica worked: {other_ok}, through a new replica (same envd secret): {new_ok}",
            body["state"].as_str().unwrap_or("?")
        ),
        left: "nothing (the replica holds no sandbox state)".into(),
    })
}

/// A node SIGKILLed while creates are in flight through both gateways.
async fn node_killed_during_claims(fleet: &mut Fleet) -> Res<Case> {
    let fleet_ref: &Fleet = fleet;
    let mut creates = Vec::new();
    for i in 0..24 {
        let url = fleet_ref.gateways[i % 2].address.clone();
        let http = fleet_ref.http.clone();
        creates.push(tokio::spawn(async move { create_e2b(&http, &url).await }));
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    fleet.nodes[2].kill();
    let mut created = Vec::new();
    let mut failed: std::collections::BTreeMap<String, usize> = Default::default();
    for c in creates {
        match c.await? {
            Ok(c) => created.push(c),
            Err(e) => *failed.entry(first_line(&e.to_string())).or_default() += 1,
        }
    }
    let on_dead = created.iter().filter(|c| c.2 == "soak2").count();
    let root = Fleet::node_root(&fleet.nodes[2]);
    let reaped = until(Duration::from_secs(15), || {
        crate::common::sandbox_processes(&root).is_empty()
    })
    .await;
    // Clean-up: the killed node's sandboxes are gone (404); a busy node gets a second try.
    for c in &created {
        for _ in 0..3 {
            let (code, _) = status(
                fleet,
                0,
                reqwest::Method::DELETE,
                &format!("/sandboxes/{}", c.0),
            )
            .await?;
            if code == 204 || code == 404 {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    fleet.nodes[2].restart()?;
    Ok(Case {
        name: "node SIGKILL during 24 concurrent creates",
        saw: format!(
            "{} created (201), {} of them on the killed node; failed: {}",
            created.len(),
            on_dead,
            if failed.is_empty() {
                "none".to_string()
            } else {
                format!("{failed:?}")
            }
        ),
        lost: format!("the {on_dead} sandboxes on the killed node (their processes end with it)"),
        left: match reaped {
            Some(t) => format!(
                "no sandbox process of the killed node after {:.1} s",
                t.as_secs_f64()
            ),
            None => "sandbox processes of the killed node remained after 15 s".into(),
        },
    })
}

/// A node SIGKILLed and restarted on its data directory with a running sandbox, a paused one
/// and a snapshot.
async fn node_restarted(fleet: &mut Fleet) -> Res<Case> {
    let running = create_on(fleet, 1, 1).await?;
    let paused = create_on(fleet, 1, 1).await?;
    let (p, _) = status(
        fleet,
        1,
        reqwest::Method::POST,
        &format!("/sandboxes/{}/pause", paused.0),
    )
    .await?;
    let (s, snap) = status(
        fleet,
        1,
        reqwest::Method::POST,
        &format!("/sandboxes/{}/snapshots", running.0),
    )
    .await?;
    let snapshot = snap["snapshotID"].as_str().unwrap_or_default().to_string();
    fleet.nodes[1].restart()?;
    // The gateways reconnect to the same address.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut r, mut q);
    loop {
        (r, _) = status(
            fleet,
            1,
            reqwest::Method::GET,
            &format!("/sandboxes/{}", running.0),
        )
        .await?;
        (q, _) = status(
            fleet,
            1,
            reqwest::Method::GET,
            &format!("/sandboxes/{}", paused.0),
        )
        .await?;
        if (r != 502 && r != 503) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (_, listed) = status(fleet, 1, reqwest::Method::GET, "/snapshots").await?;
    let kept = listed
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x["snapshotID"] == snapshot.as_str()));
    let from = fleet
        .http
        .post(format!("{}/v2/sandboxes", fleet.gateways[1].address))
        .header("X-API-KEY", KEY)
        .json(&serde_json::json!({"templateID": snapshot, "timeout": 120}))
        .send()
        .await?;
    let restored = from.status().as_u16();
    let body: serde_json::Value = from.json().await.unwrap_or_default();
    if let Some(id) = body["sandboxID"].as_str() {
        status(
            fleet,
            1,
            reqwest::Method::DELETE,
            &format!("/sandboxes/{id}"),
        )
        .await?;
    }
    status(
        fleet,
        1,
        reqwest::Method::DELETE,
        &format!("/templates/{snapshot}"),
    )
    .await?;
    Ok(Case {
        name: "node SIGKILL and restart with a running sandbox, a paused one and a snapshot",
        saw: format!(
            "before: pause {p}, snapshot {s}; after: GET running {r}, GET paused {q}, snapshot listed: {kept}, create from it {restored}"
        ),
        lost: "both sandboxes (their processes end with the node; the restarted node reports them gone); the snapshot survives".into(),
        left: "nothing: the restarted node removes what its predecessor left".into(),
    })
}

pub fn first_line(s: &str) -> String {
    s.lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(120)
        .collect()
}

pub async fn faults(fleet: &mut Fleet) -> Res<Vec<Case>> {
    let mut cases = vec![gateway_killed_mid_command(fleet).await?];
    fleet.settle(Duration::from_secs(60)).await?;
    cases.push(node_killed_during_claims(fleet).await?);
    fleet.settle(Duration::from_secs(90)).await?;
    cases.push(node_restarted(fleet).await?);
    fleet.settle(Duration::from_secs(90)).await?;
    cases.extend(crate::midway::cases(fleet).await?);
    Ok(cases)
}
