//! Snapshot routes: take one of a sandbox (`POST /sandboxes/{id}/snapshots`), list the
//! tenant's (`GET /snapshots`), delete one (`DELETE /templates/{snapshotID}`).

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};

use super::auth::Tenant;
use super::body::OptionalBody;
use super::error::{ApiError, ApiResult, ErrorBody};
use super::listing::{self, Cursor, Order, query_value};
use super::render::{self, ok_json};
use super::{E2b, wire};
use crate::model::{self, CheckpointFilter, ids};

type Data = web::Data<E2b>;

fn checkpoint_key(c: &model::CheckpointRecord) -> (i64, &str) {
    (c.created_at.timestamp_millis(), c.id.as_str())
}

#[utoipa::path(post, path = "/sandboxes/{sandboxID}/snapshots", tag = "snapshots",
    params(("sandboxID" = String, Path)), request_body = wire::SnapshotRequest,
    responses((status = 201, body = wire::SnapshotInfo), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "the sandbox is paused without its memory (connect it first), or its node's snapshots have no room left"),
        (status = 507, body = ErrorBody, description = "the sandbox's node's data directory is full; nothing was kept")),
    security(("ApiKeyAuth" = [])))]
pub async fn snapshot(
    e2b: Data,
    tenant: Tenant,
    id: web::Path<String>,
    body: OptionalBody<wire::SnapshotRequest>,
) -> ApiResult<HttpResponse> {
    let b = body.0;
    let name = b.name.unwrap_or_default();
    let stamped = model::stamped_name(&tenant.namespace, &name);
    if stamped.len() > model::MAX_CHECKPOINT_NAME {
        let room = model::MAX_CHECKPOINT_NAME.saturating_sub(tenant.namespace.len() + 1);
        return Err(ApiError::bad_request(format!(
            "snapshot name {name:?}: at most {room} characters in namespace {:?}",
            tenant.namespace
        )));
    }
    if !name.is_empty() {
        model::validate_checkpoint_name(&stamped).map_err(|_| {
            ApiError::bad_request(format!(
                "snapshot name {name:?} must contain only letters, digits and . _ : / -"
            ))
        })?;
    }
    // A snapshot is taken in the tenant's namespace whatever the sandbox's (an admin key may
    // snapshot any sandbox, and the snapshot is then the admin's).
    let ck = e2b
        .dispatcher
        .create_checkpoint(tenant.scope(), &id, &stamped, b.memory == Some(true))
        .await?;
    let prefix = model::stamped_name(&tenant.namespace, "");
    Ok(ok_json(
        StatusCode::CREATED,
        &render::snapshot(&ck, &prefix),
    ))
}

#[utoipa::path(get, path = "/snapshots", tag = "snapshots",
    params(("sandboxID" = Option<String>, Query), ("name" = Option<String>, Query),
        ("limit" = Option<u32>, Query), ("nextToken" = Option<String>, Query)),
    responses((status = 200, body = [wire::SnapshotInfo],
        headers(("X-Next-Token" = String, description = "absent on the last page")))),
    security(("ApiKeyAuth" = [])))]
pub async fn list_snapshots(
    e2b: Data,
    tenant: Tenant,
    q: web::Query<Vec<(String, String)>>,
) -> ApiResult<HttpResponse> {
    let prefix = model::stamped_name(&tenant.namespace, "");
    let limit = listing::parse_limit(query_value(&q, "limit"))?;
    let after = query_value(&q, "nextToken")
        .filter(|t| !t.is_empty())
        .map(Cursor::decode)
        .transpose()?;
    let sandbox_id = match query_value(&q, "sandboxID").filter(|s| !s.is_empty()) {
        // An id that is not a sandbox id matches nothing.
        Some(s) => ids::canonical_claim_id(s).unwrap_or_else(|| format!("invalid:{s}")),
        None => String::new(),
    };
    let filter = CheckpointFilter {
        name_prefix: prefix.clone(),
        sandbox_id,
        id: String::new(),
    };
    let listing = e2b.dispatcher.list_checkpoints(&filter).await;
    if !listing.unreachable.is_empty() {
        tracing::warn!(nodes = ?listing.unreachable, "snapshot listing is missing unreachable nodes");
    }
    // `name` takes a snapshot's name (with or without the namespace stamp) or its id.
    let name = query_value(&q, "name").filter(|n| !n.is_empty());
    let mut cks = listing.checkpoints;
    cks.retain(|c| {
        name.is_none_or(|n| c.id == n || c.name == n || c.name.strip_prefix(&prefix) == Some(n))
    });
    let (page, next) = listing::page(cks, checkpoint_key, Order::Desc, after.as_ref(), limit);
    let body: Vec<wire::SnapshotInfo> = page.iter().map(|c| render::snapshot(c, &prefix)).collect();
    let mut res = HttpResponse::Ok();
    if let Some(t) = next {
        res.insert_header(("X-Next-Token", t));
    }
    Ok(res.json(body))
}

#[utoipa::path(delete, path = "/templates/{templateID}", tag = "snapshots",
    params(("templateID" = String, Path, description = "a snapshot id")),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn delete_template(
    e2b: Data,
    tenant: Tenant,
    id: web::Path<String>,
) -> ApiResult<HttpResponse> {
    let id = id.into_inner();
    if ids::is_checkpoint_id(&id) {
        let prefix = model::stamped_name(&tenant.namespace, "");
        e2b.dispatcher.delete_checkpoint(&id, &prefix).await?;
        return Ok(HttpResponse::NoContent().finish());
    }
    if super::template_admin::delete_built(&e2b, &tenant, &id)
        .await?
        .is_some()
    {
        return Ok(HttpResponse::NoContent().finish());
    }
    if e2b.dispatcher.pools().keys().any(|k| k.template == id) {
        return Err(ApiError::bad_request(format!(
            "template {id:?} comes from node configuration and cannot be deleted through the API"
        )));
    }
    Err(ApiError::not_found(format!("template {id:?} not found")))
}
