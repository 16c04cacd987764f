//! Regressions for what the hostile-input drivers (tests/fuzz_parsers.rs, tests/schema_fuzz.rs)
//! found on the wire, against the real gateway binary: each request here once got a panic or
//! a 5xx for a mistake that was the client's. The continue-token property runs `FUZZ_CASES`
//! cases (default 64).

mod common;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::kube_gateway::{GV, KEY_TEAM_A, KubeGateway};
use common::{assert_no_leaks, workspace};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};

/// Every byte outside the unreserved set percent-encoded, for a query value.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_mistakes_are_client_errors() {
    let (tmp, _) = workspace();
    let mut gw = KubeGateway::start(tmp.path(), &[]);
    let http = reqwest::Client::new();

    // schemathesis: TRACE and PUT on a template path were answered 501 "not supported" (a
    // server error) by the catch-all for the template build API; a method it has not is 405.
    for method in [&b"TRACE"[..], b"PUT"] {
        let method = reqwest::Method::from_bytes(method).expect("method");
        let r = http
            .request(method.clone(), format!("{}/templates/base", gw.e2b_url))
            .header("X-API-KEY", KEY_TEAM_A)
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 405, "{method}");
        let body: Value = r.json().await.expect("a JSON error");
        assert_eq!(body["code"], 405, "{body}");
    }
    // Any token is a method: each once became a label set of its own in the request
    // metrics, which keep every set they have seen, so a client could grow them without end.
    for i in 0..20 {
        let method = reqwest::Method::from_bytes(format!("ODD{i}").as_bytes()).expect("method");
        let r = http
            .request(method, format!("{}/v2/sandboxes", gw.e2b_url))
            .header("X-API-KEY", KEY_TEAM_A)
            .send()
            .await
            .expect("request");
        assert!(r.status().is_client_error(), "{}", r.status());
    }
    let metrics = common::gateway::metrics_at(&http, &gw.e2b_url).await;
    assert!(!metrics.contains("ODD"), "a client's method became a label");
    assert!(
        metrics.contains("method=\"other\""),
        "odd methods are counted together"
    );

    // The first build system's rebuild route is gone (410, naming Template.build).
    let r = http
        .post(format!("{}/templates/base", gw.e2b_url))
        .header("X-API-KEY", KEY_TEAM_A)
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status(), 410);

    // proptest review of the facade's list: `limit` plus a continue token's offset overflowed.
    let mut ids = Vec::new();
    for _ in 0..3 {
        let r = http
            .post(format!("{}/v2/sandboxes", gw.e2b_url))
            .header("X-API-KEY", KEY_TEAM_A)
            .json(&json!({"templateID": "base"}))
            .send()
            .await
            .expect("create");
        assert_eq!(r.status(), 201);
        let body: Value = r.json().await.expect("create body");
        ids.push(body["sandboxID"].as_str().unwrap_or_default().to_string());
    }
    let kube = gw.http();
    let list = |query: String| {
        let kube = kube.clone();
        let url = format!("{}{GV}/namespaces/team-a/sandboxes?{query}", gw.kube_url);
        async move {
            let r = kube
                .get(url)
                .bearer_auth(KEY_TEAM_A)
                .send()
                .await
                .expect("list");
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, first) = list("limit=1".into()).await;
    assert_eq!(status, 200, "{first}");
    let token = first["metadata"]["continue"]
        .as_str()
        .expect("a continue token");
    // offset + limit overflowed (a panic in a debug build, a bad slice in a release one).
    for limit in [u64::MAX.to_string(), (usize::MAX - 1).to_string()] {
        let (status, rest) = list(format!("limit={limit}&continue={token}")).await;
        assert_eq!(status, 200, "limit={limit}: {rest}");
        assert_eq!(rest["items"].as_array().map(Vec::len), Some(2), "{rest}");
        assert!(rest["metadata"]["continue"].is_null(), "{rest}");
    }

    // A watch's `timeoutSeconds` (schemathesis sends it fixed at 1, tests/fuzz/schemathesis.toml):
    // anything but a whole number of seconds is 400 with a Status, and 0 ends the watch at once.
    for bad in ["abc", "-1", "1.5", "99999999999999999999999", "%00", "1%20"] {
        let (status, body) = list(format!("watch=true&timeoutSeconds={bad}")).await;
        assert_eq!(status, 400, "timeoutSeconds={bad}: {body}");
        assert_eq!(body["kind"], "Status", "timeoutSeconds={bad}: {body}");
    }
    let watched = kube
        .get(format!(
            "{}{GV}/namespaces/team-a/sandboxes?watch=true&timeoutSeconds=0",
            gw.kube_url
        ))
        .bearer_auth(KEY_TEAM_A)
        .timeout(std::time::Duration::from_secs(10))
        .send()
        .await
        .expect("watch");
    assert_eq!(watched.status(), 200);
    // It ends (the body is read to its end within the timeout), with at most the three
    // sandboxes' ADDED events it managed to send first.
    let events = watched.text().await.expect("a watch that ends");
    assert!(events.lines().count() <= 3, "{events}");
    for line in events.lines() {
        let event: Value = serde_json::from_str(line).expect("a watch event");
        assert_eq!(event["type"], "ADDED", "{line}");
    }

    // Continue tokens as a property: paging with any limit gives the whole list once, and a
    // forged or mangled token is 410 Expired (list again), never a 5xx.
    let (_, all) = list(String::new()).await;
    let names = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
            .collect()
    };
    let everything = names(&all);
    assert_eq!(everything.len(), 3, "{all}");
    let raw = String::from_utf8(URL_SAFE_NO_PAD.decode(token).expect("base64")).expect("utf-8");
    let (snapshot, _) = raw.split_once(':').expect("id:offset");
    let forged = prop_oneof![
        any::<String>(),
        (any::<usize>(), ".{0,3}").prop_map({
            let snapshot = snapshot.to_string();
            move |(n, junk)| URL_SAFE_NO_PAD.encode(format!("{snapshot}:{n}{junk}"))
        }),
        (0usize..8).prop_map({
            let snapshot = snapshot.to_string();
            move |n| URL_SAFE_NO_PAD.encode(format!("{snapshot}:{n}"))
        }),
        "[A-Za-z0-9_=-]{0,24}",
    ];
    let cases = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64u32);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let handle = tokio::runtime::Handle::current();
    let ran = std::sync::atomic::AtomicUsize::new(0);
    let started = std::time::Instant::now();
    let outcome = runner.run(
        &(1usize..5, forged, any::<u64>()),
        |(limit, token, huge)| {
            ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::task::block_in_place(|| {
                handle.block_on(async {
                    let mut seen = Vec::new();
                    let mut query = format!("limit={limit}");
                    loop {
                        let (status, page) = list(query.clone()).await;
                        prop_assert_eq!(status, 200, "{}", page);
                        seen.extend(names(&page));
                        match page["metadata"]["continue"].as_str() {
                            Some(next) => query = format!("limit={limit}&continue={next}"),
                            None => break,
                        }
                    }
                    prop_assert_eq!(&seen, &everything);
                    let query = format!("limit={huge}&continue={}", urlencode(&token));
                    let (status, page) = list(query).await;
                    prop_assert!(
                        status == 200 || status == 410,
                        "{} for {:?}: {}",
                        status,
                        token,
                        page
                    );
                    Ok(())
                })
            })
        },
    );
    println!(
        "fuzz-figure target=continue-token/http cases={} secs={:.2}",
        ran.load(std::sync::atomic::Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    if let Err(e) = outcome {
        panic!("continue tokens: {e}");
    }
    for id in ids {
        let _ = http
            .delete(format!("{}/sandboxes/{id}", gw.e2b_url))
            .header("X-API-KEY", KEY_TEAM_A)
            .send()
            .await;
    }
    gw.proc.terminate();
    assert_no_leaks(tmp.path(), &[gw.sandboxes_dir()]).await;
}
