//! The e2b surface on the wire: the real gateway binary with its embedded node (or with
//! separate node processes), driven over HTTP. These check what SDKs cannot show directly:
//! exact status codes, headers, JSON shapes and error envelopes.

mod common;

use std::time::Duration;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// An error reply: JSON `{code, message}` with code equal to the status.
fn assert_error(r: &Reply, status: u16, needle: &str) {
    assert_eq!(r.status.as_u16(), status, "{:?}", r.body);
    let ct = r
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    assert!(ct.starts_with("application/json"), "content type {ct:?}");
    assert_eq!(r.body["code"], json!(status), "{:?}", r.body);
    let msg = r.body["message"].as_str().unwrap_or_default();
    assert!(
        msg.to_lowercase().contains(&needle.to_lowercase()),
        "{msg:?} should mention {needle:?}"
    );
}

fn secs_between(a: &Value, b: &Value) -> i64 {
    let p = |v: &Value| chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap()).unwrap();
    (p(b) - p(a)).num_seconds()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e2b_wire_contract() {
    let (tmp, _) = workspace();
    let mut gw = Gateway::start(tmp.path(), &["--pool", "base=3"]);
    let (a, b) = (Some(KEY_A), Some(KEY_B));

    // Health needs no key; everything else does, with a JSON 401.
    assert_eq!(
        gw.call(Method::GET, "/health", None, None).await.status,
        StatusCode::NO_CONTENT
    );
    assert_error(
        &gw.call(Method::GET, "/v2/sandboxes", None, None).await,
        401,
        "API key",
    );
    assert_error(
        &gw.call(Method::GET, "/v2/sandboxes", Some("e2b_wrong"), None)
            .await,
        401,
        "invalid API key",
    );

    // Bad requests lose nothing and say why.
    let raw = gw
        .http
        .post(format!("{}/v2/sandboxes", gw.url))
        .header("X-API-KEY", KEY_A)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);
    let big = vec![b'x'; 2 << 20];
    let raw = gw
        .http
        .post(format!("{}/v2/sandboxes", gw.url))
        .header("X-API-KEY", KEY_A)
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 413);
    assert_eq!(raw.json::<Value>().await.unwrap()["code"], 413);
    assert_error(
        &gw.call(Method::POST, "/v2/sandboxes", a, Some(json!({})))
            .await,
        400,
        "templateID",
    );
    assert_error(
        &gw.call(
            Method::POST,
            "/v2/sandboxes",
            a,
            Some(json!({"templateID": "base", "timeout": -5})),
        )
        .await,
        400,
        "greater than 0",
    );
    assert_error(
        &gw.call(
            Method::POST,
            "/v2/sandboxes",
            a,
            Some(json!({"templateID": "base", "timeout": 999_999_999})),
        )
        .await,
        400,
        "cannot be greater",
    );
    assert_error(
        &gw.call(
            Method::POST,
            "/v2/sandboxes",
            a,
            Some(json!({"templateID": "no-such-template"})),
        )
        .await,
        404,
        "no-such-template",
    );
    assert_error(
        &gw.call(
            Method::POST,
            "/v2/sandboxes",
            a,
            Some(json!({"templateID": "base", "autoResume": {"enabled": true}})),
        )
        .await,
        400,
        "autoResume needs autoPause",
    );
    assert_error(
        &gw.call(
            Method::POST,
            "/v2/sandboxes",
            a,
            Some(
                json!({"templateID": "base", "autoPause": true, "autoPauseMemory": false,
                "autoResume": {"enabled": true}}),
            ),
        )
        .await,
        400,
        "autoPauseMemory",
    );
    assert_error(
        &gw.call(
            Method::POST,
            "/v2/sandboxes",
            a,
            Some(json!({"templateID": "base", "metadata": {"k": 1}})),
        )
        .await,
        400,
        "invalid",
    );
    assert_error(
        &gw.call(
            Method::PUT,
            "/sandboxes/sb-0000000000000000/network",
            a,
            Some(json!({})),
        )
        .await,
        404,
        "not found",
    );
    assert_error(
        &gw.call(
            Method::PUT,
            "/sandboxes/sb-0000000000000000/network",
            a,
            Some(json!({"denyOut": ["example.com"]})),
        )
        .await,
        400,
        "domain name",
    );
    assert_error(
        &gw.call(Method::POST, "/v3/templates", a, Some(json!({})))
            .await,
        400,
        "Name is required",
    );
    assert_error(
        &gw.call(Method::POST, "/volumes", a, Some(json!({"name": "v w"})))
            .await,
        400,
        "letters, digits",
    );
    assert_error(
        &gw.call(Method::POST, "/templates", a, Some(json!({"alias": "x"})))
            .await,
        410,
        "Template.build",
    );
    assert_error(
        &gw.call(Method::GET, "/no/such/route", a, None).await,
        404,
        "no route",
    );

    // Create: 201 with every field the SDK requires; v2 defaults to 300 s.
    let created = gw.create(KEY_A, json!({"templateID": "base", "metadata": {"suite": "wire", "user": "a b"}, "envVars": {"GREETING": "hi"}})).await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    assert!(id.starts_with("sb-") && id.len() == 19, "DNS-safe id: {id}");
    assert_eq!(created["templateID"], "base");
    assert!(created["clientID"].is_string());
    assert_eq!(created["envdVersion"], sandbox_gateway::envd::ENVD_VERSION);
    assert_eq!(created["domain"], "localhost");
    let token = created["envdAccessToken"].as_str().unwrap().to_string();
    assert_eq!(token.split('.').count(), 3);

    let r = gw
        .call(Method::GET, &format!("/sandboxes/{id}"), a, None)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let d = &r.body;
    for field in [
        "templateID",
        "sandboxID",
        "clientID",
        "startedAt",
        "endAt",
        "cpuCount",
        "memoryMB",
        "diskSizeMB",
        "state",
        "envdVersion",
        "metadata",
        "lifecycle",
    ] {
        assert!(!d[field].is_null(), "{field} missing from {d}");
    }
    assert!(d.get("network").is_none(), "never network: null");
    assert_eq!(d["state"], "running");
    assert_eq!(d["memoryMB"], 512);
    assert_eq!(d["metadata"]["user"], "a b");
    assert_eq!(
        d["envdAccessToken"],
        token.as_str(),
        "the same token on get"
    );
    assert_eq!(
        d["lifecycle"],
        json!({"autoResume": false, "onTimeout": "kill"})
    );
    assert_eq!(secs_between(&d["startedAt"], &d["endAt"]), 300);
    // Both spellings of the id.
    let underscore = id.replacen("sb-", "sb_", 1);
    assert_eq!(
        gw.call(Method::GET, &format!("/sandboxes/{underscore}"), a, None)
            .await
            .status,
        StatusCode::OK
    );
    assert!(r.headers.get("x-request-id").is_some());

    // The same sandbox through the dispatcher (as the Kubernetes facade will see it): in the
    // tenant's namespace, under an e2b- name, and not in another namespace.
    let node_line = gw.proc.wait_line("embedded node", Duration::from_secs(5));
    let node_addr = node_line
        .split(" on ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let fleet = std::fs::read_to_string(gw.data.join("node-token")).unwrap();
    let d = sandbox_gateway::dispatch::Dispatcher::new(Default::default(), fleet.trim());
    d.add_node(&node_addr).unwrap();
    d.wait_for_nodes(1, Duration::from_secs(10)).await.unwrap();
    let rec = d.get(Some("team-a"), &id).await.unwrap();
    assert_eq!(rec.namespace(), "team-a");
    assert!(rec.name().starts_with("e2b-"), "{}", rec.claim_ref);
    assert_eq!(
        rec.env_vars.get("GREETING").map(String::as_str),
        Some("hi"),
        "envVars stored with the sandbox"
    );
    assert_eq!(
        d.find_by_name("team-a", rec.name()).await.unwrap()[0].id,
        rec.id
    );
    let e = d.get(Some("team-b"), &id).await.unwrap_err();
    assert_eq!(e.kind, sandbox_gateway::model::ErrorKind::NotFound);
    d.shutdown().await;

    // v1 create defaults to 15 s.
    let v1 = gw
        .call(
            Method::POST,
            "/sandboxes",
            a,
            Some(json!({"templateID": "base", "secure": true})),
        )
        .await;
    assert_eq!(v1.status, StatusCode::CREATED, "{:?}", v1.body);
    let v1_id = v1.body["sandboxID"].as_str().unwrap().to_string();
    let v1d = gw
        .call(Method::GET, &format!("/sandboxes/{v1_id}"), a, None)
        .await
        .body;
    assert_eq!(secs_between(&v1d["startedAt"], &v1d["endAt"]), 15);
    assert_error(
        &gw.call(
            Method::POST,
            "/sandboxes",
            a,
            Some(json!({"templateID": "base", "secure": false})),
        )
        .await,
        400,
        "secure",
    );

    // Another tenant sees nothing and can release nothing.
    assert_error(
        &gw.call(Method::GET, &format!("/sandboxes/{id}"), b, None)
            .await,
        404,
        "not found",
    );
    assert_error(
        &gw.call(Method::DELETE, &format!("/sandboxes/{id}"), b, None)
            .await,
        404,
        "not found",
    );
    assert_error(
        &gw.call(Method::POST, &format!("/sandboxes/{id}/pause"), b, None)
            .await,
        404,
        "not found",
    );
    let listed_b = gw.call(Method::GET, "/v2/sandboxes", b, None).await;
    assert_eq!(listed_b.body, json!([]));
    assert_eq!(
        gw.call(Method::GET, &format!("/sandboxes/{id}"), a, None)
            .await
            .status,
        StatusCode::OK,
        "still there"
    );

    // Timeout can shorten; refreshes only extend.
    assert_eq!(
        gw.call(
            Method::POST,
            &format!("/sandboxes/{id}/timeout"),
            a,
            Some(json!({"timeout": 120}))
        )
        .await
        .status,
        StatusCode::NO_CONTENT
    );
    let d = gw
        .call(Method::GET, &format!("/sandboxes/{id}"), a, None)
        .await
        .body;
    let left = (chrono::DateTime::parse_from_rfc3339(d["endAt"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc)
        - chrono::Utc::now())
    .num_seconds();
    assert!(
        (100..=121).contains(&left),
        "timeout 120 shortened the lease, {left} s left"
    );
    assert_eq!(
        gw.call(
            Method::POST,
            &format!("/sandboxes/{id}/refreshes"),
            a,
            Some(json!({"duration": 30}))
        )
        .await
        .status,
        StatusCode::NO_CONTENT
    );
    let d2 = gw
        .call(Method::GET, &format!("/sandboxes/{id}"), a, None)
        .await
        .body;
    assert_eq!(d2["endAt"], d["endAt"], "a refresh never shortens");
    assert_error(
        &gw.call(
            Method::POST,
            &format!("/sandboxes/{id}/timeout"),
            a,
            Some(json!({})),
        )
        .await,
        400,
        "timeout",
    );

    // A filesystem-only pause: 204, GET shows pauseMode, connect boots it again (201).
    let p = gw
        .call(
            Method::POST,
            &format!("/sandboxes/{id}/pause"),
            a,
            Some(json!({"memory": false})),
        )
        .await;
    assert_eq!(p.status, StatusCode::NO_CONTENT, "{:?}", p.body);
    let info = gw
        .call(Method::GET, &format!("/sandboxes/{id}"), a, None)
        .await;
    assert_eq!(info.body["pauseMode"], "filesystem", "{:?}", info.body);
    // A snapshot asked while the connect boots the sandbox from its files waits for it and
    // captures the new instance (it once captured the destroyed one and answered 500).
    let connect_path = format!("/v2/sandboxes/{id}/connect");
    let connect = gw.call(Method::POST, &connect_path, a, Some(json!({"timeout": 60})));
    let snapshot = async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        gw.call(
            Method::POST,
            &format!("/sandboxes/{id}/snapshots"),
            a,
            Some(json!({})),
        )
        .await
    };
    let (c, snap) = tokio::join!(connect, snapshot);
    assert_eq!(c.status, StatusCode::CREATED, "{:?}", c.body);
    assert!(
        [StatusCode::CREATED, StatusCode::CONFLICT].contains(&snap.status),
        "a snapshot beside a resume: {} {:?}",
        snap.status,
        snap.body
    );
    if let Some(snap_id) = snap.body["snapshotID"].as_str() {
        assert_eq!(
            gw.call(Method::DELETE, &format!("/templates/{snap_id}"), a, None)
                .await
                .status,
            StatusCode::NO_CONTENT
        );
    }
    assert_eq!(c.body["envdAccessToken"], token.as_str());
    let info = gw
        .call(Method::GET, &format!("/sandboxes/{id}"), a, None)
        .await;
    assert!(info.body.get("pauseMode").is_none(), "{:?}", info.body);
    // Pause: 204, then 409.
    assert_eq!(
        gw.call(Method::POST, &format!("/sandboxes/{id}/pause"), a, None)
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    assert_error(
        &gw.call(
            Method::POST,
            &format!("/sandboxes/{id}/pause"),
            a,
            Some(json!({})),
        )
        .await,
        409,
        "already paused",
    );
    assert_eq!(
        gw.call(Method::GET, &format!("/sandboxes/{id}"), a, None)
            .await
            .body["state"],
        "paused"
    );
    let paused = gw
        .call(Method::GET, "/v2/sandboxes?state=paused", a, None)
        .await
        .body;
    assert_eq!(paused.as_array().unwrap().len(), 1);
    // Connect resumes (201), then is a plain connect (200); the token stays the same.
    let c = gw
        .call(
            Method::POST,
            &format!("/v2/sandboxes/{id}/connect"),
            a,
            Some(json!({"timeout": 60})),
        )
        .await;
    assert_eq!(c.status, StatusCode::CREATED, "{:?}", c.body);
    assert_eq!(c.body["envdAccessToken"], token.as_str());
    let c = gw
        .call(
            Method::POST,
            &format!("/v2/sandboxes/{id}/connect"),
            a,
            None,
        )
        .await;
    assert_eq!(c.status, StatusCode::OK);
    assert_error(
        &gw.call(Method::POST, &format!("/sandboxes/{id}/resume"), a, None)
            .await,
        409,
        "already running",
    );
    // The deprecated resume's autoPause sets what the end of the timeout does.
    for (auto_pause, on_timeout) in [(true, "pause"), (false, "kill")] {
        let p = gw
            .call(Method::POST, &format!("/sandboxes/{id}/pause"), a, None)
            .await;
        assert_eq!(p.status, StatusCode::NO_CONTENT, "{:?}", p.body);
        let r = gw
            .call(
                Method::POST,
                &format!("/sandboxes/{id}/resume"),
                a,
                Some(json!({"timeout": 60, "autoPause": auto_pause})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
        let info = gw
            .call(Method::GET, &format!("/sandboxes/{id}"), a, None)
            .await;
        assert_eq!(info.body["state"], "running");
        assert_eq!(info.body["lifecycle"]["onTimeout"], on_timeout);
    }
    assert_error(
        &gw.call(
            Method::POST,
            &format!("/sandboxes/{id}/connect"),
            a,
            Some(json!({})),
        )
        .await,
        400,
        "timeout",
    );
    // memory: false only changes how a paused sandbox resumes; a running one stays.
    let c = gw
        .call(
            Method::POST,
            &format!("/v2/sandboxes/{id}/connect"),
            a,
            Some(json!({"memory": false})),
        )
        .await;
    assert_eq!(c.status, StatusCode::OK, "{:?}", c.body);

    // Listing: filters with the SDK's metadata encoding, and pagination.
    let q = "/v2/sandboxes?metadata=user%3Da%252520b";
    let r = gw.call(Method::GET, q, a, None).await;
    assert_eq!(r.body.as_array().unwrap().len(), 1, "{:?}", r.body);
    assert_eq!(r.body[0]["sandboxID"], id.as_str());
    let r = gw.call(Method::GET, "/v2/sandboxes?limit=1", a, None).await;
    assert_eq!(r.body.as_array().unwrap().len(), 1);
    let next = r
        .headers
        .get("x-next-token")
        .expect("a next token")
        .to_str()
        .unwrap()
        .to_string();
    let r = gw
        .call(
            Method::GET,
            &format!("/v2/sandboxes?limit=1&nextToken={next}"),
            a,
            None,
        )
        .await;
    assert_eq!(r.body.as_array().unwrap().len(), 1);
    assert!(
        r.headers.get("x-next-token").is_none(),
        "no token on the last page"
    );
    assert_error(
        &gw.call(Method::GET, "/v2/sandboxes?limit=0", a, None).await,
        400,
        "limit",
    );
    assert_error(
        &gw.call(Method::GET, "/v2/sandboxes?nextToken=%%%", a, None)
            .await,
        400,
        "token",
    );
    assert_error(
        &gw.call(Method::GET, "/v2/sandboxes?state=sleeping", a, None)
            .await,
        400,
        "state",
    );
    assert_error(
        &gw.call(Method::GET, "/v2/sandboxes?metadata=broken", a, None)
            .await,
        400,
        "metadata",
    );

    // Fork: count bounds come from the node and keep their meaning.
    assert_error(
        &gw.call(
            Method::POST,
            &format!("/sandboxes/{id}/fork"),
            a,
            Some(json!({"count": 0})),
        )
        .await,
        400,
        "count",
    );
    assert_error(
        &gw.call(
            Method::POST,
            &format!("/sandboxes/{id}/fork"),
            a,
            Some(json!({"count": 17})),
        )
        .await,
        400,
        "1..16",
    );
    let f = gw
        .call(
            Method::POST,
            &format!("/sandboxes/{id}/fork"),
            a,
            Some(json!({"count": 2, "timeout": 40})),
        )
        .await;
    assert_eq!(f.status, StatusCode::CREATED, "{:?}", f.body);
    let kids: Vec<String> = f
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["sandbox"]["sandboxID"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kids.len(), 2);
    for k in &kids {
        let d = gw
            .call(Method::GET, &format!("/sandboxes/{k}"), a, None)
            .await
            .body;
        assert_eq!(
            secs_between(&d["startedAt"], &d["endAt"]),
            40,
            "each child has its own lease"
        );
    }

    // Snapshots: stamped per tenant, listed without the stamp, branchable, deletable once.
    let too_long = "n".repeat(63 - "team-a/".len() + 1);
    assert_error(
        &gw.call(
            Method::POST,
            &format!("/sandboxes/{id}/snapshots"),
            a,
            Some(json!({"name": too_long})),
        )
        .await,
        400,
        "at most 56",
    );
    assert_error(
        &gw.call(
            Method::POST,
            &format!("/sandboxes/{id}/snapshots"),
            a,
            Some(json!({"memory": true})),
        )
        .await,
        400,
        "memory",
    );
    let s = gw
        .call(
            Method::POST,
            &format!("/sandboxes/{id}/snapshots"),
            a,
            Some(json!({"name": "before"})),
        )
        .await;
    assert_eq!(s.status, StatusCode::CREATED, "{:?}", s.body);
    assert_eq!(s.body["names"], json!(["before"]));
    let snap = s.body["snapshotID"].as_str().unwrap().to_string();
    let unnamed = gw
        .call(Method::POST, &format!("/sandboxes/{id}/snapshots"), a, None)
        .await;
    assert_eq!(unnamed.body["names"], json!([]));
    let l = gw
        .call(Method::GET, &format!("/snapshots?sandboxID={id}"), a, None)
        .await;
    assert_eq!(l.body.as_array().unwrap().len(), 2, "{:?}", l.body);
    let l = gw.call(Method::GET, "/snapshots?limit=1", a, None).await;
    assert_eq!(l.body.as_array().unwrap().len(), 1);
    assert!(l.headers.get("x-next-token").is_some());
    let l = gw
        .call(Method::GET, "/snapshots?name=before", a, None)
        .await;
    assert_eq!(
        l.body,
        json!([{"snapshotID": snap.as_str(), "names": ["before"]}])
    );
    assert_eq!(
        gw.call(Method::GET, "/snapshots", b, None).await.body,
        json!([]),
        "other tenant sees none"
    );
    assert_error(
        &gw.call(Method::DELETE, &format!("/templates/{snap}"), b, None)
            .await,
        404,
        "not found",
    );
    let branch = gw.create(KEY_A, json!({"templateID": snap})).await;
    assert_eq!(branch["templateID"], snap.as_str());
    assert_error(
        &gw.call(
            Method::POST,
            "/v2/sandboxes",
            b,
            Some(json!({"templateID": snap})),
        )
        .await,
        404,
        "not found",
    );
    assert_eq!(
        gw.call(Method::DELETE, &format!("/templates/{snap}"), a, None)
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    assert_error(
        &gw.call(Method::DELETE, &format!("/templates/{snap}"), a, None)
            .await,
        404,
        "not found",
    );
    assert_error(
        &gw.call(Method::DELETE, "/templates/base", a, None).await,
        400,
        "node configuration",
    );

    // Metrics are measurements.
    let m = gw
        .call(Method::GET, &format!("/sandboxes/{id}/metrics"), a, None)
        .await;
    assert_eq!(m.status, StatusCode::OK);
    let sample = &m.body[0];
    assert!(sample["memUsed"].as_u64().unwrap() > 0, "{sample}");
    assert_eq!(sample["memTotal"], 512u64 << 20);
    assert!(sample["diskTotal"].as_u64().unwrap() > 0);
    for f in [
        "timestamp",
        "timestampUnix",
        "cpuCount",
        "cpuUsedPct",
        "memCache",
        "diskUsed",
    ] {
        assert!(!sample[f].is_null(), "{f}");
    }
    let batch = gw
        .call(
            Method::GET,
            &format!("/sandboxes/metrics?sandbox_ids={id},{}", kids[0]),
            a,
            None,
        )
        .await;
    assert_eq!(
        batch.body["sandboxes"].as_object().unwrap().len(),
        2,
        "{:?}",
        batch.body
    );
    let many: Vec<String> = (0..101).map(|i| format!("sb-{i:016x}")).collect();
    assert_error(
        &gw.call(
            Method::GET,
            &format!("/sandboxes/metrics?sandbox_ids={}", many.join(",")),
            a,
            None,
        )
        .await,
        400,
        "at most 100",
    );

    // Templates come from the pools the node advertises, with the node's claim counts (which
    // reach the gateway with the node's next info report).
    let mut t = Value::Null;
    for _ in 0..100 {
        t = gw.call(Method::GET, "/v2/templates", a, None).await.body;
        if t[0]["spawnCount"].as_u64().unwrap_or(0) >= 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(t[0]["templateID"], "base", "{t:?}");
    assert!(t[0]["spawnCount"].as_u64().unwrap() >= 5, "{t:?}");
    assert!(t[0]["lastSpawnedAt"].is_string(), "{t:?}");

    // Idempotency-Key: a replay returns the same sandbox, a different body is refused.
    let once = |body: Value| {
        gw.http
            .post(format!("{}/v2/sandboxes", gw.url))
            .header("X-API-KEY", KEY_A)
            .header("Idempotency-Key", "retry-1")
            .json(&body)
            .send()
    };
    let first: Value = once(json!({"templateID": "base", "timeout": 30}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let again = once(json!({"timeout": 30, "templateID": "base"}))
        .await
        .unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(
        again.json::<Value>().await.unwrap()["sandboxID"],
        first["sandboxID"]
    );
    let other = once(json!({"templateID": "base", "timeout": 31}))
        .await
        .unwrap();
    assert_eq!(other.status(), 422);
    let bad = gw
        .http
        .post(format!("{}/v2/sandboxes", gw.url))
        .header("X-API-KEY", KEY_A)
        .header("Idempotency-Key", "Not Valid")
        .json(&json!({"templateID": "base"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);

    // Kill: 204, then 404.
    let all = gw.call(Method::GET, "/v2/sandboxes", a, None).await.body;
    for s in all.as_array().unwrap() {
        let sid = s["sandboxID"].as_str().unwrap();
        assert_eq!(
            gw.call(Method::DELETE, &format!("/sandboxes/{sid}"), a, None)
                .await
                .status,
            StatusCode::NO_CONTENT
        );
    }
    assert_error(
        &gw.call(Method::DELETE, &format!("/sandboxes/{id}"), a, None)
            .await,
        404,
        "not found",
    );
    assert_eq!(
        gw.call(Method::GET, "/v2/sandboxes", a, None).await.body,
        json!([])
    );

    // Prometheus metrics count requests by route pattern, not by raw path.
    let text = gw.metrics_text().await;
    assert!(text.contains(r#"route="/sandboxes/{id}""#), "{text}");
    assert!(text.contains("sandbox_gateway_nodes_up 1"));

    gw.proc.terminate();
    assert_no_leaks(tmp.path(), &[gw.data.join("node/sandboxes")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn capacity_and_unknown_outcomes_on_the_wire() {
    let (tmp, token) = workspace();
    let node = NodeProc::start(
        "tight",
        &tmp.path().join("tight"),
        &token,
        "127.0.0.1:0",
        &["--pool", "base/egress=1", "--no-cold-start"],
    );
    let token_arg = token.display().to_string();
    let mut gw = Gateway::start(
        tmp.path(),
        &[
            "--node",
            &node.addr,
            "--node-token-file",
            &token_arg,
            "--claim-timeout-seconds",
            "1",
        ],
    );
    let a = Some(KEY_A);
    // Wait until the gateway sees the node's warm sandbox.
    let mut first = None;
    for _ in 0..200 {
        let r = gw
            .call(
                Method::POST,
                "/v2/sandboxes",
                a,
                Some(json!({"templateID": "base"})),
            )
            .await;
        if r.status == StatusCode::CREATED {
            first = Some(r.body);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = first.expect("a first create succeeds");
    // The pool is empty and the node does not cold-start: 503 with Retry-After.
    let r = gw
        .call(
            Method::POST,
            "/v2/sandboxes",
            a,
            Some(json!({"templateID": "base"})),
        )
        .await;
    assert_error(&r, 503, "");
    assert!(r.headers.get("retry-after").is_some(), "{:?}", r.headers);
    assert_eq!(r.body["error_code"], "sandbox_capacity_unavailable");
    assert_eq!(
        gw.call(
            Method::DELETE,
            &format!("/sandboxes/{}", first["sandboxID"].as_str().unwrap()),
            a,
            None
        )
        .await
        .status,
        204
    );

    // A node that stops answering mid-claim: the outcome is unknown, so the gateway says not
    // to retry (and an Idempotency-Key replay gets the same answer instead of a second claim).
    eventually(Duration::from_secs(30), "pool refilled", || {
        dir_entries(&node.sandboxes_dir()).len() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    node.proc.signal(libc::SIGSTOP);
    let pid = node.proc.child.id();
    eventually(Duration::from_secs(10), "node stopped", || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .all(|t| {
                std::fs::read_to_string(t.unwrap().path().join("stat"))
                    .unwrap_or_default()
                    .rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('T'))
            })
    })
    .await;
    let res = gw
        .http
        .post(format!("{}/v2/sandboxes", gw.url))
        .header("X-API-KEY", KEY_A)
        .header("Idempotency-Key", "unknown-1")
        .json(&json!({"templateID": "base"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 504);
    assert_eq!(
        res.headers()
            .get("should-retry")
            .and_then(|v| v.to_str().ok()),
        Some("false")
    );
    let replay = gw
        .http
        .post(format!("{}/v2/sandboxes", gw.url))
        .header("X-API-KEY", KEY_A)
        .header("Idempotency-Key", "unknown-1")
        .json(&json!({"templateID": "base"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        replay.status(),
        504,
        "the replay is answered from memory, not claimed again"
    );
    node.proc.signal(libc::SIGCONT);

    gw.proc.terminate();
    let mut nodes = [node];
    for n in nodes.iter_mut() {
        n.proc.terminate();
    }
    assert_no_leaks(tmp.path(), &[nodes[0].sandboxes_dir()]).await;
}

#[tokio::test]
async fn openapi_document_is_current() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi/e2b.json");
    let current = sandbox_gateway::e2b::openapi::document_json();
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == current,
        "openapi/e2b.json is stale: run `cargo run -- openapi > openapi/e2b.json`"
    );
    let doc: Value = serde_json::from_str(&current).unwrap();
    for p in [
        "/v2/sandboxes",
        "/sandboxes/{sandboxID}",
        "/v2/sandboxes/{sandboxID}/connect",
        "/snapshots",
        "/templates/{templateID}",
    ] {
        assert!(doc["paths"].get(p).is_some(), "{p} documented");
    }
    assert!(doc["components"]["securitySchemes"]["ApiKeyAuth"].is_object());
}

/// `chattr +i` on a file until dropped (also when the test fails, so that the temporary
/// directory can be removed).
struct Immutable(std::path::PathBuf);

impl Immutable {
    fn set(path: std::path::PathBuf) -> Option<Immutable> {
        let ok = std::process::Command::new("chattr")
            .arg("+i")
            .arg(&path)
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Immutable(path))
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_destroy_that_fails_is_retried_until_nothing_is_left() {
    // An overloaded host can hold a released sandbox's processes past the runtime's wait; the
    // node must try again rather than leave the instance behind. Here the failure is an
    // immutable file in the instance directory, which makes its removal fail until lifted.
    let (tmp, _) = workspace();
    let mut gw = Gateway::start(tmp.path(), &["--pool", "base=1"]);
    let sandboxes = gw.data.join("node/sandboxes");
    let created = gw.create(KEY_A, json!({"templateID": "base"})).await;
    let id = created["sandboxID"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // The node's index says which instance holds the claim (its only one).
    let index = gw.data.join("node/index.json");
    let mut instance = None;
    eventually(
        Duration::from_secs(10),
        "the claim in the node's index",
        || {
            let v: Value = std::fs::read(&index)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default();
            instance = match v["claims"].as_array().map(Vec::as_slice) {
                Some([c]) => c["instance"]["id"].as_str().map(str::to_string),
                _ => None,
            };
            instance.is_some()
        },
    )
    .await;
    let instance = sandboxes.join(instance.unwrap_or_default());
    let Some(pinned) = Immutable::set(instance.join("boot.json")) else {
        eprintln!(
            "SKIPPED a_destroy_that_fails_is_retried_until_nothing_is_left: chattr +i is not supported under {}",
            tmp.path().display()
        );
        return;
    };
    assert_eq!(gw.kill(KEY_A, &id).await, StatusCode::NO_CONTENT);
    eventually(
        Duration::from_secs(30),
        "a failed destroy to be retried",
        || {
            gw.proc
                .stderr_lines()
                .iter()
                .any(|l| l.contains("destroying an instance failed; retrying"))
        },
    )
    .await;
    assert!(instance.exists(), "the instance went despite the failure");
    drop(pinned);
    eventually(
        Duration::from_secs(40),
        "the instance to be destroyed on a retry",
        || !instance.exists(),
    )
    .await;
    gw.proc.terminate();
    assert_no_leaks(tmp.path(), &[sandboxes]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_boot_slower_than_the_timeout_is_no_capacity_and_leaves_nothing() {
    // A host too loaded to boot a sandbox in time is out of room for now: the client gets
    // 503 with Retry-After (not a 500), and the half-booted instance is gone. A boot timeout
    // of 1 ms stands in for the load, since no sandbox reports ready that quickly.
    let (tmp, _) = workspace();
    let mut gw = Gateway::start(
        tmp.path(),
        &["--pool", "base=0", "--boot-timeout-seconds", "0.001"],
    );
    let sandboxes = gw.data.join("node/sandboxes");
    let r = gw
        .call(
            Method::POST,
            "/v2/sandboxes",
            Some(KEY_A),
            Some(json!({"templateID": "base"})),
        )
        .await;
    assert_error(&r, 503, "too busy to boot");
    assert!(r.headers.get("retry-after").is_some(), "{:?}", r.headers);
    assert_eq!(r.body["error_code"], "sandbox_capacity_unavailable");
    // Nothing was claimed, so nothing is listed.
    let listed = gw
        .call(Method::GET, "/v2/sandboxes", Some(KEY_A), None)
        .await;
    assert_eq!(listed.status, StatusCode::OK, "{:?}", listed.body);
    assert_eq!(listed.body, json!([]));
    eventually(
        Duration::from_secs(20),
        "the timed-out instance to be removed",
        || dir_entries(&sandboxes).is_empty(),
    )
    .await;
    gw.proc.terminate();
    assert_no_leaks(tmp.path(), &[sandboxes]).await;
}

/// A volume, its files and its token outlive the gateway: a second gateway on the same data
/// directory lists it and serves its files to the same token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_and_their_files_survive_a_restart() {
    let (tmp, _) = workspace();
    // Each volume is a file system of its own, 16 MiB here.
    let args = ["--pool", "base=0", "--volume-mib", "16"];
    let mut gw = Gateway::start(tmp.path(), &args);
    let made = gw
        .call(
            Method::POST,
            "/volumes",
            Some(KEY_A),
            Some(json!({"name": "kept"})),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    let id = made.body["volumeID"].as_str().unwrap().to_string();
    let token = made.body["token"].as_str().unwrap().to_string();
    let file = |url: &str| format!("{url}/volumecontent/{id}/file?path=/notes.txt");
    let put = gw
        .http
        .put(file(&gw.url))
        .bearer_auth(&token)
        .body("still here")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::CREATED);
    // More than the volume holds: 507, and the volume keeps what it had.
    let big = gw
        .http
        .put(format!("{}/volumecontent/{id}/file?path=/big", gw.url))
        .bearer_auth(&token)
        .body(vec![7u8; 17 << 20])
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), StatusCode::INSUFFICIENT_STORAGE);
    let data = gw.data.join("volumes/team-a").join(&id).join("data");
    let mounted = |p: &std::path::Path| {
        use std::os::unix::fs::MetadataExt;
        let dev = |p: &std::path::Path| std::fs::metadata(p).unwrap().dev();
        dev(p) != dev(p.parent().unwrap())
    };
    assert!(mounted(&data), "the volume is a file system of its own");
    gw.proc.terminate();
    assert!(
        !mounted(&data),
        "a stopped gateway leaves no volume mounted"
    );

    let again = Gateway::start(tmp.path(), &args);
    let listed = again.call(Method::GET, "/volumes", Some(KEY_A), None).await;
    assert_eq!(listed.body, json!([{"volumeID": id, "name": "kept"}]));
    let read = again
        .http
        .get(file(&again.url))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), StatusCode::OK);
    assert_eq!(read.text().await.unwrap(), "still here");
    let other = again
        .call(Method::GET, &format!("/volumes/{id}"), Some(KEY_B), None)
        .await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);
    let gone = again
        .call(Method::DELETE, &format!("/volumes/{id}"), Some(KEY_A), None)
        .await;
    assert_eq!(gone.status, StatusCode::NO_CONTENT);
    let read = again
        .http
        .get(file(&again.url))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(
        read.status(),
        StatusCode::NOT_FOUND,
        "a deleted volume's token opens nothing"
    );
    assert!(!data.exists());
    assert!(
        sandbox_gateway::sandbox::loopdev::attached_backing_files()
            .iter()
            .all(|f| !f.starts_with(tmp.path())),
        "a deleted volume's image is detached"
    );
}

/// Writes one HTTP/1.1 request to the gateway's e2b listener for the sandbox's envd, with a
/// body of `mib` MiB streamed from one block when given; answers the connection, the
/// status line and the headers read so far (lower-case), the rest of the body unread.
async fn envd_request(
    url: &str,
    sandbox: &Value,
    head: &str,
    mib: Option<u64>,
) -> (tokio::io::BufReader<tokio::net::TcpStream>, String) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("http://").trim_end_matches('/');
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "{head} HTTP/1.1\r\nHost: {addr}\r\nE2b-Sandbox-Id: {}\r\nE2b-Sandbox-Port: 49983\r\nX-Access-Token: {}\r\nConnection: close\r\n",
        sandbox["sandboxID"].as_str().unwrap(),
        sandbox["envdAccessToken"].as_str().unwrap_or_default(),
    );
    if let Some(mib) = mib {
        req.push_str(&format!(
            "Content-Type: application/octet-stream\r\nContent-Length: {}\r\n",
            mib << 20
        ));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    if let Some(mib) = mib {
        // Bytes that do not compress, the same mebibyte over and over.
        let block: Vec<u8> = (0..1u32 << 20)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for _ in 0..mib {
            s.write_all(&block).await.unwrap();
        }
    }
    let mut r = tokio::io::BufReader::new(s);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).await.unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
        head.push_str(&line.to_ascii_lowercase());
    }
    (r, head)
}

/// The largest resident size of `pid` seen while `work` runs, sampled every 5 ms.
async fn peak_rss_during<T>(pid: i32, work: impl std::future::Future<Output = T>) -> (u64, T) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_bytes(pid));
                std::thread::sleep(Duration::from_millis(5));
            }
            peak
        })
    };
    let out = work.await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    (sampler.join().unwrap(), out)
}

/// A gibibyte uploaded into a sandbox through the gateway and downloaded again keeps the
/// gateway's memory flat: envd's file bodies stream through the gateway, its embedded node's
/// data plane and the agent, never held whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gibibyte_up_and_down_keeps_the_gateways_memory_flat() {
    use tokio::io::AsyncReadExt;
    const MIB: u64 = 1024;
    let (tmp, _) = workspace();
    let gw = Gateway::start(
        tmp.path(),
        &["--pool", "base=1", "--sandbox-disk-mib", "2048"],
    );
    gw.wait_warm(1, "the pool").await;
    let sb = gw.create(KEY_A, json!({"templateID": "base"})).await;
    let pid = gw.proc.child.id() as i32;
    // Warm the path (first tunnel, buffers) before the baseline.
    let (mut r, head) = envd_request(
        &gw.url,
        &sb,
        "POST /files?path=/home/user/warm&username=user",
        Some(1),
    )
    .await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let _ = r.read_to_end(&mut Vec::new()).await;
    let before = rss_bytes(pid);

    let (up_peak, head) = peak_rss_during(pid, async {
        let (mut r, head) = envd_request(
            &gw.url,
            &sb,
            "POST /files?path=/home/user/big&username=user",
            Some(MIB),
        )
        .await;
        let _ = r.read_to_end(&mut Vec::new()).await;
        head
    })
    .await;
    assert!(head.starts_with("http/1.1 200"), "{head}");

    let (down_peak, (head, got)) = peak_rss_during(pid, async {
        let (mut r, head) = envd_request(
            &gw.url,
            &sb,
            "GET /files?path=/home/user/big&username=user",
            None,
        )
        .await;
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        loop {
            let n = r.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got += n as u64;
        }
        (head, got)
    })
    .await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    if head.contains(&format!("content-length: {}", MIB << 20)) {
        assert_eq!(got, MIB << 20);
    } else {
        // Chunked: the payload plus its framing.
        assert!(got >= MIB << 20, "{got} bytes");
    }
    let (up, down) = (
        up_peak.saturating_sub(before) >> 20,
        down_peak.saturating_sub(before) >> 20,
    );
    assert!(
        up < 64 && down < 64,
        "the gateway grew by {up} MiB during the upload and {down} MiB during the download (from {} MiB)",
        before >> 20
    );
    assert_eq!(
        gw.kill(KEY_A, sb["sandboxID"].as_str().unwrap()).await,
        StatusCode::NO_CONTENT
    );
}
