//! Discovery: `/api`, `/apis` (aggregated v2 and legacy), the group, the group-version
//! resource list, `/version`, and the health endpoints.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Value, json};

use super::Facade;
use super::auth::{Attrs, Caller};
use super::inventories;
use super::openapi;
use super::status::KubeResult;
use super::types::{API_VERSION, GROUP, KIND, PLURAL, SINGULAR, SUBRESOURCES, VERSION};

pub const AGGREGATED_V2: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
const AGGREGATED_V2BETA1: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";

const VERBS: [&str; 7] = [
    "create", "delete", "get", "list", "patch", "update", "watch",
];

/// Which aggregated discovery version the client asked for, if any.
fn aggregated(req: &HttpRequest) -> Option<&'static str> {
    let accept = req.headers().get(header::ACCEPT)?.to_str().ok()?;
    if accept.contains("g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList") {
        Some(AGGREGATED_V2)
    } else if accept.contains("g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList") {
        Some(AGGREGATED_V2BETA1)
    } else {
        None
    }
}

fn discovery_list(version: &str, items: Value) -> Value {
    let api_version = if version == AGGREGATED_V2 {
        "apidiscovery.k8s.io/v2"
    } else {
        "apidiscovery.k8s.io/v2beta1"
    };
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": api_version, "metadata": {}, "items": items})
}

fn reply(content_type: &str, body: &Value) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header((header::VARY, "Accept"))
        .body(body.to_string())
}

fn group_discovery() -> Value {
    let subresources: Vec<Value> = SUBRESOURCES
        .iter()
        .map(|(sub, kind)| {
            json!({"subresource": sub, "responseKind": {"group": GROUP, "version": VERSION, "kind": kind},
                   "verbs": ["create"]})
        })
        .collect();
    json!({
        "metadata": {"name": GROUP, "creationTimestamp": null},
        "versions": [{"version": VERSION, "freshness": "Current", "resources": [{
            "resource": PLURAL, "singularResource": SINGULAR, "scope": "Namespaced",
            "responseKind": {"group": GROUP, "version": VERSION, "kind": KIND},
            "verbs": VERBS, "shortNames": [SINGULAR], "subresources": subresources
        }]}]
    })
}

fn group() -> Value {
    json!({"name": GROUP,
           "versions": [{"groupVersion": API_VERSION, "version": VERSION}],
           "preferredVersion": {"groupVersion": API_VERSION, "version": VERSION}})
}

/// Authorizes a GET of the request's path as a non-resource request; answers the caller.
pub(super) async fn path_caller(facade: &Facade, req: &HttpRequest) -> KubeResult<Caller> {
    facade.auth.authorize(req, &Attrs::path(req.path())).await
}

async fn path_allowed(facade: &Facade, req: &HttpRequest) -> KubeResult<()> {
    path_caller(facade, req).await.map(|_| ())
}

pub async fn api(facade: web::Data<Facade>, req: HttpRequest) -> KubeResult<HttpResponse> {
    path_allowed(&facade, &req).await?;
    Ok(match aggregated(&req) {
        Some(ct) => reply(ct, &discovery_list(ct, json!([]))),
        None => reply(
            "application/json",
            &json!({"kind": "APIVersions", "versions": [], "serverAddressByClientCIDRs": []}),
        ),
    })
}

pub async fn apis(facade: web::Data<Facade>, req: HttpRequest) -> KubeResult<HttpResponse> {
    path_allowed(&facade, &req).await?;
    Ok(match aggregated(&req) {
        Some(ct) => reply(
            ct,
            &discovery_list(
                ct,
                json!([group_discovery(), inventories::group_discovery()]),
            ),
        ),
        None => reply(
            "application/json",
            &json!({"kind": "APIGroupList", "apiVersion": "v1",
                    "groups": [group(), inventories::group()]}),
        ),
    })
}

pub async fn api_group(facade: web::Data<Facade>, req: HttpRequest) -> KubeResult<HttpResponse> {
    path_allowed(&facade, &req).await?;
    let mut g = group();
    if let Some(o) = g.as_object_mut() {
        o.insert("kind".into(), json!("APIGroup"));
        o.insert("apiVersion".into(), json!("v1"));
    }
    Ok(reply("application/json", &g))
}

pub async fn resources(facade: web::Data<Facade>, req: HttpRequest) -> KubeResult<HttpResponse> {
    path_allowed(&facade, &req).await?;
    let mut list = vec![
        json!({"name": PLURAL, "singularName": SINGULAR, "namespaced": true, "kind": KIND,
                               "verbs": VERBS, "shortNames": [SINGULAR]}),
    ];
    for (sub, kind) in SUBRESOURCES {
        list.push(
            json!({"name": format!("{PLURAL}/{sub}"), "singularName": "", "namespaced": true,
                         "kind": kind, "verbs": ["create"]}),
        );
    }
    Ok(reply(
        "application/json",
        &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": API_VERSION, "resources": list}),
    ))
}

pub async fn version() -> HttpResponse {
    reply(
        "application/json",
        &json!({"major": "1", "minor": "33", "gitVersion": format!("v1.33.0-sandbox-gateway-{}", env!("CARGO_PKG_VERSION")),
                "gitCommit": "", "gitTreeState": "clean", "buildDate": "", "goVersion": "",
                "compiler": "rustc", "platform": "linux/amd64"}),
    )
}

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .body("ok")
}

/// Ready once a node answers: without one, no request could be served.
pub async fn readyz(facade: web::Data<Facade>) -> HttpResponse {
    if facade.dispatcher.nodes().iter().any(|n| n.up) {
        healthz().await
    } else {
        HttpResponse::ServiceUnavailable()
            .content_type("text/plain; charset=utf-8")
            .body("no node is reachable")
    }
}

pub async fn openapi_v3(facade: web::Data<Facade>, req: HttpRequest) -> KubeResult<HttpResponse> {
    path_allowed(&facade, &req).await?;
    Ok(reply("application/json", &openapi::index()))
}

pub async fn openapi_v3_group_version(
    facade: web::Data<Facade>,
    req: HttpRequest,
) -> KubeResult<HttpResponse> {
    path_allowed(&facade, &req).await?;
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .insert_header((header::ETAG, format!("\"{}\"", openapi::hash())))
        .insert_header((header::CACHE_CONTROL, "public, immutable"))
        .body(openapi::group_version_bytes()))
}

/// The v2 document: as protobuf an empty gnostic `Document` (kubectl then validates nothing
/// client-side and reads the v3 document instead), as JSON the operations (see
/// `openapi::v2`). The real schema is in the v3 document.
pub async fn openapi_v2(facade: web::Data<Facade>, req: HttpRequest) -> KubeResult<HttpResponse> {
    path_allowed(&facade, &req).await?;
    let wants_protobuf = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("protobuf"));
    Ok(if wants_protobuf {
        HttpResponse::Ok()
            .content_type("application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
            .body(Vec::<u8>::new())
    } else {
        reply("application/json", openapi::v2())
    })
}
