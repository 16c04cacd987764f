//! Regressions for what the hostile-input drivers (tests/fuzz_parsers.rs, tests/schema_fuzz.rs)
//! found on the wire, against the real gateway binary: each request here once got a panic or
//! a 5xx for a mistake that was the client's.

mod common;

use common::kube_gateway::{GV, KEY_TEAM_A, KubeGateway};
use common::workspace;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_mistakes_are_client_errors() {
    let (tmp, _) = workspace();
    let gw = KubeGateway::start(tmp.path(), &[]);
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
    // The build API itself stays a deliberate, documented 501.
    let r = http
        .post(format!("{}/templates/base", gw.e2b_url))
        .header("X-API-KEY", KEY_TEAM_A)
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status(), 501);

    // proptest review of the facade's list: `limit` plus a continue token's offset overflowed.
    let mut ids = Vec::new();
    for _ in 0..2 {
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
        assert_eq!(rest["items"].as_array().map(Vec::len), Some(1), "{rest}");
        assert!(rest["metadata"]["continue"].is_null(), "{rest}");
    }
    for id in ids {
        let _ = http
            .delete(format!("{}/sandboxes/{id}", gw.e2b_url))
            .header("X-API-KEY", KEY_TEAM_A)
            .send()
            .await;
    }
}
