//! The facade behind kube-apiserver (`--delegate-auth`). There is no kube-apiserver on these
//! machines, so this test fakes it at the wire: an HTTPS server in the test answers the two
//! calls the gateway makes (the `extension-apiserver-authentication` ConfigMap and
//! SubjectAccessReviews), and the test plays the aggregator's front proxy with real
//! certificates made here: a front-proxy CA, its client certificate, one with a name that is
//! not allowed, and one from a CA nobody trusts.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{App, HttpResponse, HttpServer, web};
use common::certs::*;
use common::*;
use serde_json::{Value, json};

const GV: &str = "/apis/agents.x-k8s.io/v1beta1";
const KEY_A: &str = "e2b_a1b2a1b2a1b2a1b2a1b2a1b2a1b2a1b2a1b2a1b2";

#[derive(Default)]
struct FakeApiserver {
    reviews: Mutex<Vec<Value>>,
}

async fn configmap(front_proxy_ca: web::Data<String>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
        "data": {
            "requestheader-client-ca-file": front_proxy_ca.as_str(),
            "requestheader-allowed-names": "[\"front-proxy-client\"]",
            "requestheader-username-headers": "[\"X-Remote-User\"]",
            "requestheader-group-headers": "[\"X-Remote-Group\"]",
            "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]"
        }
    }))
}

/// Alice may do anything in team-a and read discovery; nobody else may do anything.
async fn review(state: web::Data<Arc<FakeApiserver>>, body: web::Json<Value>) -> HttpResponse {
    let mut sar = body.into_inner();
    let spec = sar["spec"].clone();
    state.reviews.lock().unwrap().push(spec.clone());
    let alice = spec["user"] == "alice";
    let allowed = alice
        && (spec.get("nonResourceAttributes").is_some()
            || spec["resourceAttributes"]["namespace"] == "team-a");
    sar["status"] = json!({"allowed": allowed, "reason": if allowed { "" } else { "RBAC: not in this test's policy" }});
    HttpResponse::Created().json(sar)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn front_proxy_identity_and_subject_access_reviews() {
    sandbox_gateway::tlsx::install_crypto();
    let (tmp, _) = workspace();
    let cluster_ca = ca("fake-cluster-ca");
    let front_proxy_ca = ca("front-proxy-ca");
    let rogue_ca = ca("rogue-ca");

    // The fake kube-apiserver.
    let state = Arc::new(FakeApiserver::default());
    let tls = tls_server(&leaf(&cluster_ca, "kube-apiserver", true));
    let (s, fp_pem) = (state.clone(), front_proxy_ca.pem.clone());
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(s.clone()))
            .app_data(web::Data::new(fp_pem.clone()))
            .route(
                "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication",
                web::get().to(configmap),
            )
            .route(
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                web::post().to(review),
            )
    })
    .workers(1)
    .disable_signals()
    .bind_rustls_0_23("127.0.0.1:0", tls)
    .unwrap();
    let api_addr = server.addrs()[0];
    let api = server.run();
    let api_handle = api.handle();
    tokio::spawn(api);

    let kubeconfig = tmp.path().join("sa-kubeconfig");
    write_kubeconfig(
        &kubeconfig,
        &format!("https://{api_addr}"),
        &cluster_ca,
        "gateway-service-account",
    );
    let keys = tmp.path().join("keys");
    std::fs::write(&keys, format!("{KEY_A} team-a\n")).unwrap();
    let data = tmp.path().join("gw");
    let mut gw = Proc::spawn(&[
        "serve".into(),
        "--e2b-listen".into(),
        "127.0.0.1:0".into(),
        "--kube-listen".into(),
        "127.0.0.1:0".into(),
        "--data-dir".into(),
        data.display().to_string(),
        "--api-keys".into(),
        keys.display().to_string(),
        "--pool".into(),
        "base=1".into(),
        "--delegate-auth".into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
    ]);
    let line = gw.wait_line(
        "Kubernetes API listening on https://",
        Duration::from_secs(60),
    );
    let url = line.rsplit(' ').next().unwrap().trim().to_string();
    let gateway_ca = std::fs::read_to_string(data.join("tls/ca.crt")).unwrap();
    let client = |identity: Option<(String, String)>| {
        let mut b = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(gateway_ca.as_bytes()).unwrap());
        if let Some((cert, key)) = identity {
            b = b.identity(reqwest::Identity::from_pem(format!("{cert}{key}").as_bytes()).unwrap());
        }
        b.build().unwrap()
    };
    let proxy = client(Some(leaf(&front_proxy_ca, "front-proxy-client", false)));
    let reviews = || state.reviews.lock().unwrap().clone();
    let team_a = format!("{url}{GV}/namespaces/team-a/sandboxes");

    // Through the front proxy as alice: allowed by the review, which names the resource.
    let r = proxy
        .get(&team_a)
        .header("X-Remote-User", "alice")
        .header("X-Remote-Group", "devs")
        .header("X-Remote-Extra-Scopes", "read")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let spec = reviews().last().cloned().expect("a review was made");
    assert_eq!(spec["user"], "alice");
    assert_eq!(spec["groups"], json!(["devs", "system:authenticated"]));
    assert_eq!(spec["extra"]["scopes"], json!(["read"]));
    let ra = &spec["resourceAttributes"];
    assert_eq!(
        (
            ra["verb"].as_str(),
            ra["namespace"].as_str(),
            ra["resource"].as_str(),
            ra["group"].as_str()
        ),
        (
            Some("list"),
            Some("team-a"),
            Some("sandboxes"),
            Some("agents.x-k8s.io")
        )
    );
    // The decision is cached: the same request makes no new review.
    let n = reviews().len();
    let r = proxy
        .get(&team_a)
        .header("X-Remote-User", "alice")
        .header("X-Remote-Group", "devs")
        .header("X-Remote-Extra-Scopes", "read")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(reviews().len(), n, "answered from the 10 s decision cache");

    // Denied by the review: 403 with the reviewer's reason.
    let r = proxy
        .get(format!("{url}{GV}/namespaces/team-b/sandboxes"))
        .header("X-Remote-User", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["reason"], "Forbidden");
    assert!(body["message"].as_str().unwrap().contains("RBAC"), "{body}");
    // Subresources are reviewed as such.
    let r = proxy
        .post(format!("{team_a}/x/pause"))
        .header("X-Remote-User", "alice")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        404,
        "allowed, and then the sandbox does not exist"
    );
    let ra = reviews().last().unwrap()["resourceAttributes"].clone();
    assert_eq!(
        (
            ra["verb"].as_str(),
            ra["subresource"].as_str(),
            ra["name"].as_str()
        ),
        (Some("create"), Some("pause"), Some("x"))
    );
    // Discovery is a non-resource review.
    let r = proxy
        .get(format!("{url}/apis"))
        .header("X-Remote-User", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        reviews().last().unwrap()["nonResourceAttributes"],
        json!({"path": "/apis", "verb": "get"})
    );
    // system:masters (the aggregator's own probes) is allowed without a review.
    let n = reviews().len();
    let r = proxy
        .get(format!("{url}{GV}"))
        .header("X-Remote-User", "system:kube-aggregator")
        .header("X-Remote-Group", "system:masters")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(reviews().len(), n);

    // Headers are believed only with a verified front-proxy certificate of an allowed name.
    let intruder = client(Some(leaf(&front_proxy_ca, "intruder", false)));
    let r = intruder
        .get(&team_a)
        .header("X-Remote-User", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        401,
        "a name outside requestheader-allowed-names is not the proxy"
    );
    let bare = client(None);
    let r = bare
        .get(&team_a)
        .header("X-Remote-User", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "no certificate, no trust in X-Remote-User");
    let rogue = client(Some(leaf(&rogue_ca, "front-proxy-client", false)));
    // The TLS handshake may refuse a certificate from an unknown CA outright; if it lets the
    // connection through, the headers must still not be believed.
    if let Ok(r) = rogue
        .get(&team_a)
        .header("X-Remote-User", "alice")
        .send()
        .await
    {
        assert_eq!(r.status(), 401);
    }
    // An e2b API key still works as a bearer token for its namespace.
    let r = bare.get(&team_a).bearer_auth(KEY_A).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // Health needs nothing.
    assert_eq!(
        bare.get(format!("{url}/livez"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    gw.terminate();
    api_handle.stop(false).await;
    assert_no_leaks(tmp.path(), &[data.join("node/sandboxes")]).await;
}
