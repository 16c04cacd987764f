//! `extensions.agents.x-k8s.io/v1beta1` NodeInventory, read-only, for a gateway that is not
//! behind kube-apiserver: the same objects a cluster holds, synthesized from what the
//! dispatcher knows (each node's info and its sandboxes in the read view), so that
//! `kubectl get nodeinventories` and clients that pick a template from the fleet's pools work
//! the same locally as in a cluster. Behind kube-apiserver the CRD serves these instead; the
//! APIService never routes this group here.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::Utc;
use serde_json::json;

use super::Facade;
use super::auth::Caller;
use super::status::{KubeError, KubeResult};
use crate::cluster::inventory::{self, NodeInventory};
use crate::model::SandboxRecord;

pub const GROUP_PATH: &str = "/apis/extensions.agents.x-k8s.io";
pub const GV_PATH: &str = "/apis/extensions.agents.x-k8s.io/v1beta1";

fn json_reply(body: &serde_json::Value) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .insert_header((header::VARY, "Accept"))
        .body(body.to_string())
}

/// The group for `/apis` (legacy discovery).
pub fn group() -> serde_json::Value {
    let gv = json!({"groupVersion": inventory::API_VERSION, "version": inventory::VERSION});
    json!({"name": inventory::GROUP, "versions": [gv.clone()], "preferredVersion": gv})
}

/// The group for `/apis` (aggregated discovery).
pub fn group_discovery() -> serde_json::Value {
    json!({
        "metadata": {"name": inventory::GROUP, "creationTimestamp": null},
        "versions": [{"version": inventory::VERSION, "freshness": "Current", "resources": [{
            "resource": inventory::PLURAL, "singularResource": "nodeinventory", "scope": "Cluster",
            "responseKind": {"group": inventory::GROUP, "version": inventory::VERSION, "kind": inventory::KIND},
            "verbs": ["get", "list"]
        }]}]
    })
}

async fn caller(facade: &Facade, req: &HttpRequest) -> KubeResult<Caller> {
    super::discovery::path_caller(facade, req).await
}

pub async fn api_group(facade: web::Data<Facade>, req: HttpRequest) -> KubeResult<HttpResponse> {
    caller(&facade, &req).await?;
    let mut g = group();
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    Ok(json_reply(&g))
}

pub async fn resources(facade: web::Data<Facade>, req: HttpRequest) -> KubeResult<HttpResponse> {
    caller(&facade, &req).await?;
    Ok(json_reply(&json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": inventory::API_VERSION,
        "resources": [{"name": inventory::PLURAL, "singularName": "nodeinventory",
                       "namespaced": false, "kind": inventory::KIND, "verbs": ["get", "list"]}]
    })))
}

/// The objects for every node that has answered, with the sandboxes `caller` may see.
fn objects(facade: &Facade, caller: &Caller) -> Vec<NodeInventory> {
    let visible = |r: &SandboxRecord| match caller {
        Caller::Key(t) => t.admin || r.namespace() == t.namespace,
        Caller::Delegated { .. } => true,
    };
    let now = Utc::now();
    let view = facade.dispatcher.view();
    let mut out: Vec<NodeInventory> = facade
        .dispatcher
        .nodes()
        .into_iter()
        .filter_map(|n| n.info)
        .map(|info| {
            let (records, _) = view.list(|r| r.node == info.name && visible(r));
            let records: Vec<SandboxRecord> = records.iter().map(|r| (**r).clone()).collect();
            let mut object = NodeInventory::snapshot(&info, &records, now);
            // The node's start stands in for the object's creation (kubectl's AGE).
            object.metadata.creation_timestamp =
                k8s_openapi::jiff::Timestamp::from_second(info.started_at.timestamp())
                    .ok()
                    .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time);
            object
        })
        .collect();
    out.sort_by(|a, b| a.node.cmp(&b.node));
    out
}

pub async fn list(facade: web::Data<Facade>, req: HttpRequest) -> KubeResult<HttpResponse> {
    let caller = caller(&facade, &req).await?;
    if req
        .query_string()
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1")
    {
        return Err(KubeError::new(
            405,
            "MethodNotAllowed",
            "this gateway serves NodeInventory read-only without watch; in a cluster, kube-apiserver serves the CRD",
        ));
    }
    let items = objects(&facade, &caller);
    Ok(json_reply(&json!({
        "apiVersion": inventory::API_VERSION,
        "kind": "NodeInventoryList",
        "metadata": {"resourceVersion": facade.dispatcher.view().revision().to_string()},
        "items": items,
    })))
}

pub async fn get(
    facade: web::Data<Facade>,
    req: HttpRequest,
    name: web::Path<String>,
) -> KubeResult<HttpResponse> {
    let caller = caller(&facade, &req).await?;
    let name = name.into_inner();
    let object = objects(&facade, &caller)
        .into_iter()
        .find(|o| o.node == name)
        .ok_or_else(|| {
            KubeError::new(
                404,
                "NotFound",
                format!(
                    "{}.{} {name:?} not found",
                    inventory::PLURAL,
                    inventory::GROUP
                ),
            )
        })?;
    Ok(json_reply(
        &serde_json::to_value(&object).map_err(KubeError::internal)?,
    ))
}
