//! The Secrets API (`/secrets`): a tenant's named values, written here and never returned;
//! only an egress rule's `${e2b.secrets.NAME}` placeholder ever uses one.

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::E2b;
use super::auth::Tenant;
use super::body::Body;
use super::error::{ApiError, ApiResult, ErrorBody, off_thread};
use super::listing::{self, query_value};
use super::render::ok_json;
use crate::secrets::{SecretInfo, SecretStore};

type Data = web::Data<E2b>;

/// e2b's `Secret`: everything but the value.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Secret {
    #[serde(rename = "secretID")]
    pub secret_id: String,
    pub name: String,
    pub current_version: u64,
    pub metadata: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<SecretInfo> for Secret {
    fn from(i: SecretInfo) -> Secret {
        Secret {
            secret_id: i.id,
            name: i.name,
            current_version: i.current_version,
            metadata: i.metadata,
            created_at: i.created_at,
            updated_at: i.updated_at,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NewSecret {
    pub name: String,
    pub value: String,
    pub metadata: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretUpdate {
    pub value: String,
    /// Replaces the stored metadata when given.
    pub metadata: Option<BTreeMap<String, String>>,
}

/// Runs a store operation off the request's thread (it reads and writes files).
async fn blocking<T: Send + 'static>(
    e2b: &Data,
    f: impl FnOnce(&SecretStore) -> crate::model::Result<T> + Send + 'static,
) -> ApiResult<T> {
    let store = e2b.secrets.clone();
    off_thread("the secrets store", move || f(&store)).await
}

#[utoipa::path(get, path = "/secrets", tag = "secrets", operation_id = "list_secrets",
    params(("limit" = Option<u32>, Query), ("nextToken" = Option<String>, Query)),
    responses((status = 200, body = [Secret],
        headers(("X-Next-Token" = String, description = "absent on the last page"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn list(
    e2b: Data,
    tenant: Tenant,
    q: web::Query<Vec<(String, String)>>,
) -> ApiResult<HttpResponse> {
    let limit = listing::parse_limit(query_value(&q, "limit"))?;
    // The token is the last name of the page before: names are what pages follow.
    let after = query_value(&q, "nextToken")
        .filter(|t| !t.is_empty())
        .map(str::to_string);
    let ns = tenant.namespace.clone();
    let (page, next) = blocking(&e2b, move |s| s.list(&ns, limit, after.as_deref())).await?;
    let mut res = HttpResponse::Ok();
    if let Some(t) = next {
        res.insert_header(("X-Next-Token", t));
    }
    Ok(res.json(page.into_iter().map(Secret::from).collect::<Vec<_>>()))
}

#[utoipa::path(post, path = "/secrets", tag = "secrets", operation_id = "create_secret", request_body = NewSecret,
    responses((status = 201, body = Secret), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "the team has a secret of this name")),
    security(("ApiKeyAuth" = [])))]
pub async fn create(e2b: Data, tenant: Tenant, body: Body<NewSecret>) -> ApiResult<HttpResponse> {
    let b = body.0;
    let ns = tenant.namespace.clone();
    let info = blocking(&e2b, move |s| {
        s.create(&ns, &b.name, &b.value, b.metadata.unwrap_or_default())
    })
    .await?;
    tracing::info!(tenant = %tenant.namespace, secret = %info.id, name = %info.name, "secret created");
    Ok(ok_json(StatusCode::CREATED, &Secret::from(info)))
}

#[utoipa::path(get, path = "/secrets/{secretID}", tag = "secrets", operation_id = "get_secret",
    params(("secretID" = String, Path, description = "the secret's id or name")),
    responses((status = 200, body = Secret), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn get(e2b: Data, tenant: Tenant, key: web::Path<String>) -> ApiResult<HttpResponse> {
    let ns = tenant.namespace.clone();
    let key = key.into_inner();
    let info = blocking(&e2b, move |s| s.get(&ns, &key)).await?;
    Ok(ok_json(StatusCode::OK, &Secret::from(info)))
}

#[utoipa::path(post, path = "/secrets/{secretID}", tag = "secrets", operation_id = "update_secret",
    params(("secretID" = String, Path, description = "the secret's id or name")),
    request_body = SecretUpdate,
    responses((status = 200, body = Secret, description = "stored as the next version"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn update(
    e2b: Data,
    tenant: Tenant,
    key: web::Path<String>,
    body: Body<SecretUpdate>,
) -> ApiResult<HttpResponse> {
    let b = body.0;
    let ns = tenant.namespace.clone();
    let key = key.into_inner();
    let info = blocking(&e2b, move |s| s.update(&ns, &key, &b.value, b.metadata)).await?;
    tracing::info!(tenant = %tenant.namespace, secret = %info.id, version = info.current_version, "secret updated");
    Ok(ok_json(StatusCode::OK, &Secret::from(info)))
}

#[utoipa::path(delete, path = "/secrets/{secretID}", tag = "secrets", operation_id = "delete_secret",
    params(("secretID" = String, Path, description = "the secret's id or name")),
    responses((status = 204), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn delete(e2b: Data, tenant: Tenant, key: web::Path<String>) -> ApiResult<HttpResponse> {
    let ns = tenant.namespace.clone();
    let key = key.into_inner();
    blocking(&e2b, move |s| s.delete(&ns, &key)).await?;
    tracing::info!(tenant = %tenant.namespace, "secret deleted");
    Ok(HttpResponse::NoContent().finish())
}

/// Any other method or path under `/secrets`: 405 on the API's own paths, 404 elsewhere.
pub async fn other(req: actix_web::HttpRequest) -> ApiResult<HttpResponse> {
    let rest = req.path().trim_start_matches("/secrets");
    let own = rest.is_empty() || rest.strip_prefix('/').is_some_and(|k| !k.contains('/'));
    Err(ApiError::not_served(&req, own))
}
