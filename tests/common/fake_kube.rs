//! A wire-level fake of kube-apiserver for NodeInventory objects. There is no kube-apiserver
//! on these machines, so tests and the benchmark use this: an HTTPS server that stores
//! objects, answers server-side apply (PATCH with `application/apply-patch+yaml`), lists with a
//! resource version, streams watch events from one, and records who used which verb. It can
//! also be made unavailable and brought back (`FakeCluster::outage`, `refuse_connections`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};

pub const PATH: &str = "/apis/extensions.agents.x-k8s.io/v1beta1/nodeinventories";

#[derive(Debug, Clone)]
pub struct Apply {
    pub content_type: String,
    pub query: BTreeMap<String, String>,
    pub body: Value,
}

#[derive(Default)]
struct State {
    rv: u64,
    objects: BTreeMap<String, Value>,
    history: Vec<(u64, Value)>,
    applies: Vec<Apply>,
    /// (bearer token, RBAC verb) of every request.
    verbs: std::collections::BTreeSet<(String, String)>,
    /// Every request, in arrival order (also those answered 503).
    requests: Vec<Request>,
}

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Request {
    pub at: Instant,
    /// The bearer token (`node-sa`, `gateway-sa`).
    pub token: String,
    /// `list`, `watch` or `apply`.
    pub verb: String,
    /// What the fake answered.
    pub status: u16,
}

fn bearer(req: &HttpRequest) -> String {
    req.headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .to_string()
}

pub struct FakeKube {
    state: Mutex<State>,
    events: broadcast::Sender<(u64, Value)>,
    /// True while the apiserver is unavailable: every request gets 503 and open watches are
    /// cut (a `watch` channel so that each open stream learns it at once).
    down: watch::Sender<bool>,
}

/// The body kube-apiserver sends with a 503 (a `Status`), e.g. while etcd is unreachable.
fn unavailable() -> HttpResponse {
    HttpResponse::ServiceUnavailable().json(json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "reason": "ServiceUnavailable", "code": 503,
        "message": "the server is currently unable to handle the request",
    }))
}

impl FakeKube {
    pub fn new() -> Arc<Self> {
        Arc::new(FakeKube {
            state: Mutex::new(State::default()),
            events: broadcast::channel(1024).0,
            down: watch::channel(false).0,
        })
    }

    /// Makes the apiserver unavailable (`true`: every request is answered 503 and open
    /// watch streams are cut mid-stream) or available again (`false`). Stored objects and
    /// their history survive, as they would in etcd.
    pub fn set_unavailable(&self, down: bool) {
        self.down.send_replace(down);
    }

    pub fn is_unavailable(&self) -> bool {
        *self.down.borrow()
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Request> {
        self.state.lock().unwrap().requests.clone()
    }

    /// The resource version of the last change.
    pub fn resource_version(&self) -> u64 {
        self.state.lock().unwrap().rv
    }

    fn change(&self, st: &mut State, kind: &str, mut obj: Value) -> Value {
        st.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if kind == "DELETED" {
            st.objects.remove(&name);
        } else {
            st.objects.insert(name, obj.clone());
        }
        let ev = json!({"type": kind, "object": obj});
        st.history.push((st.rv, ev.clone()));
        let _ = self.events.send((st.rv, ev));
        obj
    }

    /// Stores an object as if some client had applied it.
    pub fn put(&self, obj: Value) {
        let mut st = self.state.lock().unwrap();
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        let kind = if st.objects.contains_key(&name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.change(&mut st, kind, obj);
    }

    pub fn delete(&self, name: &str) {
        let mut st = self.state.lock().unwrap();
        if let Some(obj) = st.objects.get(name).cloned() {
            self.change(&mut st, "DELETED", obj);
        }
    }

    pub fn object(&self, name: &str) -> Option<Value> {
        self.state.lock().unwrap().objects.get(name).cloned()
    }

    pub fn applies(&self) -> Vec<Apply> {
        self.state.lock().unwrap().applies.clone()
    }

    /// The RBAC verbs the holder of `token` used.
    pub fn verbs_of(&self, token: &str) -> std::collections::BTreeSet<String> {
        let st = self.state.lock().unwrap();
        st.verbs
            .iter()
            .filter(|(t, _)| t == token)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

type Query = web::Query<BTreeMap<String, String>>;

pub async fn list_or_watch(
    kube: web::Data<Arc<FakeKube>>,
    q: Query,
    req: HttpRequest,
) -> HttpResponse {
    let watching = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    let mut st = kube.state.lock().unwrap();
    let verb = if watching { "watch" } else { "list" };
    let down = kube.is_unavailable();
    st.requests.push(Request {
        at: Instant::now(),
        token: bearer(&req),
        verb: verb.to_string(),
        status: if down { 503 } else { 200 },
    });
    if down {
        return unavailable();
    }
    st.verbs.insert((bearer(&req), verb.to_string()));
    if !watching {
        return HttpResponse::Ok().json(json!({
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "NodeInventoryList",
            "metadata": {"resourceVersion": st.rv.to_string()},
            "items": st.objects.values().collect::<Vec<_>>(),
        }));
    }
    let since: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(st.rv);
    let backlog: Vec<(u64, Value)> = st
        .history
        .iter()
        .filter(|(rv, _)| *rv > since)
        .cloned()
        .collect();
    let last = backlog.last().map_or(since, |(rv, _)| *rv);
    let live = tokio_stream::wrappers::BroadcastStream::new(kube.events.subscribe())
        .filter_map(move |e| async move { e.ok().filter(|(rv, _)| *rv > last) });
    drop(st);
    // An outage cuts the stream with an error, so the connection is aborted mid-body the way
    // a dying apiserver (or a load balancer losing it) would, not ended cleanly.
    let mut down = kube.down.subscribe();
    let cut = async move {
        let _ = down.wait_for(|d| *d).await;
    };
    let lines = futures::stream::iter(backlog)
        .chain(live)
        .map(|(_, ev)| Ok::<_, actix_web::Error>(web::Bytes::from(format!("{ev}\n"))))
        .take_until(cut)
        .chain(futures::stream::once(async {
            Err(actix_web::error::ErrorServiceUnavailable(
                "apiserver went away",
            ))
        }));
    HttpResponse::Ok()
        .content_type("application/json")
        .streaming(lines)
}

pub async fn apply(
    kube: web::Data<Arc<FakeKube>>,
    name: web::Path<String>,
    q: Query,
    req: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let mut st = kube.state.lock().unwrap();
    if kube.is_unavailable() {
        st.requests.push(Request {
            at: Instant::now(),
            token: bearer(&req),
            verb: "apply".into(),
            status: 503,
        });
        return unavailable();
    }
    let Ok(parsed) = serde_json::from_slice::<Value>(&body) else {
        return HttpResponse::BadRequest().finish();
    };
    st.requests.push(Request {
        at: Instant::now(),
        token: bearer(&req),
        verb: "apply".into(),
        status: 200,
    });
    // Server-side apply that creates the object is authorized as create (upstream rule).
    let verb = if st.objects.contains_key(name.as_str()) {
        "patch"
    } else {
        "create"
    };
    st.verbs.insert((bearer(&req), verb.to_string()));
    st.applies.push(Apply {
        content_type,
        query: q.into_inner(),
        body: parsed.clone(),
    });
    if parsed["metadata"]["name"] != json!(name.as_str()) {
        return HttpResponse::BadRequest().finish();
    }
    let created = !st.objects.contains_key(name.as_str());
    let kind = if created { "ADDED" } else { "MODIFIED" };
    let stored = kube.change(&mut st, kind, parsed);
    if created {
        HttpResponse::Created().json(stored)
    } else {
        HttpResponse::Ok().json(stored)
    }
}

/// A running fake kube-apiserver and a kubeconfig for it.
pub struct FakeCluster {
    pub kube: Arc<FakeKube>,
    /// Credentials of the nodes' service account (token `node-sa`).
    pub node_kubeconfig: std::path::PathBuf,
    /// Credentials of the gateways' service account (token `gateway-sa`).
    pub gateway_kubeconfig: std::path::PathBuf,
    pub handle: actix_web::dev::ServerHandle,
    /// Where it listens (kept across `refuse_connections`, so the kubeconfigs stay right).
    pub addr: std::net::SocketAddr,
    tls: rustls::ServerConfig,
}

/// Serves `kube` on `listener`; the handle stops it.
fn serve(
    kube: &Arc<FakeKube>,
    listener: std::net::TcpListener,
    tls: rustls::ServerConfig,
) -> actix_web::dev::ServerHandle {
    let k = kube.clone();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(k.clone()))
            .route(PATH, web::get().to(list_or_watch))
            .route(&format!("{}/{{name}}", PATH), web::patch().to(apply))
    })
    .workers(2)
    .disable_signals()
    // Stopping is an outage, not a graceful drain: open watches are cut at once.
    .shutdown_timeout(0)
    .listen_rustls_0_23(listener, tls)
    .unwrap()
    .run();
    let handle = server.handle();
    tokio::spawn(server);
    handle
}

pub fn start(dir: &std::path::Path) -> FakeCluster {
    let ca = super::certs::ca("fake-cluster-ca");
    let tls = super::certs::tls_server(&super::certs::leaf(&ca, "kube-apiserver", true));
    let kube = FakeKube::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = serve(&kube, listener, tls.clone());
    let node_kubeconfig = dir.join("node-kubeconfig");
    super::certs::write_kubeconfig(&node_kubeconfig, &format!("https://{addr}"), &ca, "node-sa");
    let gateway_kubeconfig = dir.join("gateway-kubeconfig");
    super::certs::write_kubeconfig(
        &gateway_kubeconfig,
        &format!("https://{addr}"),
        &ca,
        "gateway-sa",
    );
    FakeCluster {
        kube,
        node_kubeconfig,
        gateway_kubeconfig,
        handle,
        addr,
        tls,
    }
}

impl FakeCluster {
    /// The apiserver answers every request 503 and cuts open watches (`true`), or serves
    /// again (`false`).
    pub fn outage(&self, down: bool) {
        self.kube.set_unavailable(down);
    }

    /// The apiserver process is gone: the listener closes, open connections (watches) are
    /// dropped, and new connections are refused until `accept_connections`.
    pub async fn refuse_connections(&self) {
        self.handle.stop(false).await;
    }

    /// The apiserver is back on the same address with the same objects and history.
    pub async fn accept_connections(&mut self) {
        // The old listener is closed; its port is free unless something raced for it.
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        let listener = loop {
            match std::net::TcpListener::bind(self.addr) {
                Ok(l) => break l,
                Err(e) => {
                    assert!(Instant::now() < deadline, "rebinding {}: {e}", self.addr);
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        };
        self.handle = serve(&self.kube, listener, self.tls.clone());
    }
}
