//! e2b volumes: the control plane (`/volumes`, with the API key) and the volume content API
//! (`/volumecontent/{volumeID}/…`, with the volume's bearer token), on the store in
//! `crate::volumes`. File bodies stream both ways.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use utoipa::ToSchema;

use super::E2b;
use super::auth::Tenant;
use super::body::Body;
use super::error::{ApiError, ApiResult, ErrorBody, off_thread};
use super::render::ok_json;
use crate::volumes::VolumeStore;
use crate::volumes::content::{EntryStat, Meta, Root};

type Data = web::Data<E2b>;

/// Free space a volume write leaves on the volumes' file system: a full disk would take the
/// node's sandboxes and records down with it.
const DISK_RESERVE: u64 = 256 << 20;

/// e2b's `Volume`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    #[serde(rename = "volumeID")]
    pub volume_id: String,
    pub name: String,
}

/// e2b's `VolumeAndToken`: the bearer token opens the volume to the content API.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeAndToken {
    #[serde(rename = "volumeID")]
    pub volume_id: String,
    pub name: String,
    pub token: String,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct NewVolume {
    pub name: String,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct MetaUpdate {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mode: Option<u32>,
}

fn store(e2b: &Data) -> ApiResult<std::sync::Arc<VolumeStore>> {
    e2b.volumes.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "volumes are not enabled on this gateway",
        )
    })
}

/// Runs a store operation off the request's thread (it reads and writes files).
async fn blocking<T: Send + 'static>(
    store: std::sync::Arc<VolumeStore>,
    f: impl FnOnce(&VolumeStore) -> crate::model::Result<T> + Send + 'static,
) -> ApiResult<T> {
    off_thread("the volume store", move || f(&store)).await
}

fn with_token(
    s: &VolumeStore,
    tenant: &str,
    v: crate::volumes::Volume,
) -> crate::model::Result<VolumeAndToken> {
    Ok(VolumeAndToken {
        token: s.token(tenant, &v.id)?,
        volume_id: v.id,
        name: v.name,
    })
}

#[utoipa::path(get, path = "/volumes", tag = "volumes", operation_id = "list_volumes",
    responses((status = 200, body = [Volume]), (status = 401, body = ErrorBody),
        (status = 501, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn list(e2b: Data, tenant: Tenant) -> ApiResult<HttpResponse> {
    let ns = tenant.namespace.clone();
    let all = blocking(store(&e2b)?, move |s| s.list(&ns)).await?;
    let out: Vec<Volume> = all
        .into_iter()
        .map(|v| Volume {
            volume_id: v.id,
            name: v.name,
        })
        .collect();
    Ok(ok_json(StatusCode::OK, &out))
}

#[utoipa::path(post, path = "/volumes", tag = "volumes", operation_id = "create_volume",
    request_body = NewVolume,
    responses((status = 201, body = VolumeAndToken),
        (status = 400, body = ErrorBody, description = "a bad name, or one the team has"),
        (status = 401, body = ErrorBody), (status = 501, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn create(e2b: Data, tenant: Tenant, body: Body<NewVolume>) -> ApiResult<HttpResponse> {
    let ns = tenant.namespace.clone();
    let name = body.0.name;
    let made = blocking(store(&e2b)?, move |s| {
        let v = s.create(&ns, &name)?;
        with_token(s, &ns, v)
    })
    .await?;
    tracing::info!(tenant = %tenant.namespace, volume = %made.volume_id, name = %made.name, "volume created");
    Ok(ok_json(StatusCode::CREATED, &made))
}

#[utoipa::path(get, path = "/volumes/{volumeID}", tag = "volumes", operation_id = "get_volume",
    params(("volumeID" = String, Path)),
    responses((status = 200, body = VolumeAndToken), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 501, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn get(e2b: Data, tenant: Tenant, id: web::Path<String>) -> ApiResult<HttpResponse> {
    let ns = tenant.namespace.clone();
    let id = id.into_inner();
    let v = blocking(store(&e2b)?, move |s| {
        let v = s.get(&ns, &id)?;
        with_token(s, &ns, v)
    })
    .await?;
    Ok(ok_json(StatusCode::OK, &v))
}

#[utoipa::path(delete, path = "/volumes/{volumeID}", tag = "volumes", operation_id = "delete_volume",
    params(("volumeID" = String, Path)),
    responses((status = 204, description = "the volume and its files are gone"),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 501, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn delete(e2b: Data, tenant: Tenant, id: web::Path<String>) -> ApiResult<HttpResponse> {
    let ns = tenant.namespace.clone();
    let id = id.into_inner();
    let gone = id.clone();
    blocking(store(&e2b)?, move |s| s.delete(&ns, &id)).await?;
    tracing::info!(tenant = %tenant.namespace, volume = %gone, "volume deleted");
    Ok(HttpResponse::NoContent().finish())
}

/// The query of a content call.
#[derive(Debug, Default, Deserialize)]
pub struct ContentQuery {
    #[serde(default)]
    path: String,
    depth: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
    force: Option<bool>,
}

impl ContentQuery {
    fn meta(&self) -> Meta {
        Meta {
            uid: self.uid,
            gid: self.gid,
            mode: self.mode,
        }
    }
}

/// The volume a content call's bearer token opens (401 without a valid one).
async fn files(e2b: &Data, req: &HttpRequest, id: String) -> ApiResult<Root> {
    let store = store(e2b)?;
    let token = req
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
        .trim()
        .to_string();
    let unauthorized = || {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "a volume's content needs its token: Authorization: Bearer <token>",
        )
    };
    let tenant = store.check_token(&token, &id).ok_or_else(unauthorized)?;
    blocking(store, move |s| s.files(&tenant, &id)).await
}

async fn on_files<T: Send + 'static>(
    root: Root,
    f: impl FnOnce(&Root) -> crate::model::Result<T> + Send + 'static,
) -> ApiResult<T> {
    off_thread("the volume's files", move || f(&root)).await
}

type Q = web::Query<ContentQuery>;

/// Runs `f` on the files of the volume the request's token opens.
async fn on_volume<T: Send + 'static>(
    e2b: &Data,
    req: &HttpRequest,
    id: web::Path<String>,
    f: impl FnOnce(&Root) -> crate::model::Result<T> + Send + 'static,
) -> ApiResult<T> {
    let root = files(e2b, req, id.into_inner()).await?;
    on_files(root, f).await
}

#[utoipa::path(get, path = "/volumecontent/{volumeID}/dir", tag = "volumes",
    operation_id = "list_volume_dir",
    params(("volumeID" = String, Path), ("path" = String, Query), ("depth" = Option<u32>, Query)),
    responses((status = 200, body = [EntryStat]), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("VolumeToken" = [])))]
pub async fn list_dir(
    e2b: Data,
    req: HttpRequest,
    id: web::Path<String>,
    q: Q,
) -> ApiResult<HttpResponse> {
    let (path, depth) = (q.path.clone(), q.depth.unwrap_or(1));
    let entries = on_volume(&e2b, &req, id, move |r| r.list(&path, depth)).await?;
    Ok(ok_json(StatusCode::OK, &entries))
}

#[utoipa::path(post, path = "/volumecontent/{volumeID}/dir", tag = "volumes",
    operation_id = "make_volume_dir",
    params(("volumeID" = String, Path), ("path" = String, Query), ("uid" = Option<u32>, Query),
        ("gid" = Option<u32>, Query), ("mode" = Option<u32>, Query),
        ("force" = Option<bool>, Query, description = "make missing parents; take one that exists")),
    responses((status = 201, body = EntryStat), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)),
    security(("VolumeToken" = [])))]
pub async fn make_dir(
    e2b: Data,
    req: HttpRequest,
    id: web::Path<String>,
    q: Q,
) -> ApiResult<HttpResponse> {
    let (path, meta, force) = (q.path.clone(), q.meta(), q.force.unwrap_or(false));
    let made = on_volume(&e2b, &req, id, move |r| r.make_dir(&path, meta, force)).await?;
    Ok(ok_json(StatusCode::CREATED, &made))
}

#[utoipa::path(get, path = "/volumecontent/{volumeID}/file", tag = "volumes",
    operation_id = "read_volume_file",
    params(("volumeID" = String, Path), ("path" = String, Query)),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("VolumeToken" = [])))]
pub async fn read_file(
    e2b: Data,
    req: HttpRequest,
    id: web::Path<String>,
    q: Q,
) -> ApiResult<HttpResponse> {
    let path = q.path.clone();
    let file = on_volume(&e2b, &req, id, move |r| r.read_file(&path)).await?;
    let len = file.metadata().map(|m| m.len()).ok();
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file));
    let mut res = HttpResponse::Ok();
    res.content_type("application/octet-stream");
    if let Some(len) = len {
        res.no_chunking(len);
    }
    Ok(res.streaming(stream))
}

#[utoipa::path(put, path = "/volumecontent/{volumeID}/file", tag = "volumes",
    operation_id = "write_volume_file",
    params(("volumeID" = String, Path), ("path" = String, Query), ("uid" = Option<u32>, Query),
        ("gid" = Option<u32>, Query), ("mode" = Option<u32>, Query),
        ("force" = Option<bool>, Query, description = "replace a file that exists")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = EntryStat), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 503, body = ErrorBody),
        (status = 507, body = ErrorBody, description = "the volume is full")),
    security(("VolumeToken" = [])))]
pub async fn write_file(
    e2b: Data,
    req: HttpRequest,
    id: web::Path<String>,
    q: Q,
    mut body: web::Payload,
) -> ApiResult<HttpResponse> {
    let root = files(&e2b, &req, id.into_inner()).await?;
    let volumes = store(&e2b)?.dir().to_path_buf();
    let room = || crate::fsx::filesystem_free(&volumes).map_or(true, |free| free > DISK_RESERVE);
    if !room() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the volumes' disk is full",
        ));
    }
    let (path, meta, force) = (q.path.clone(), q.meta(), q.force.unwrap_or(false));
    let root = std::sync::Arc::new(root);
    let (r, p) = (root.clone(), path.clone());
    let file = off_thread("the volume's files", move || r.create_file(&p, meta, force)).await?;
    let mut file = tokio::fs::File::from_std(file);
    let mut written: u64 = 0;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
        written += chunk.len() as u64;
        if written % (64 << 20) < chunk.len() as u64 && !room() {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the volumes' disk is full",
            ));
        }
        file.write_all(&chunk)
            .await
            .map_err(|e| ApiError::from(crate::model::Error::io("writing to the volume", e)))?;
    }
    file.flush()
        .await
        .map_err(|e| ApiError::from(crate::model::Error::io("writing to the volume", e)))?;
    drop(file);
    let stat = off_thread("the volume's files", move || root.stat(&path)).await?;
    Ok(ok_json(StatusCode::CREATED, &stat))
}

#[utoipa::path(get, path = "/volumecontent/{volumeID}/path", tag = "volumes",
    operation_id = "stat_volume_path",
    params(("volumeID" = String, Path), ("path" = String, Query)),
    responses((status = 200, body = EntryStat), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("VolumeToken" = [])))]
pub async fn stat(
    e2b: Data,
    req: HttpRequest,
    id: web::Path<String>,
    q: Q,
) -> ApiResult<HttpResponse> {
    let path = q.path.clone();
    let st = on_volume(&e2b, &req, id, move |r| r.stat(&path)).await?;
    Ok(ok_json(StatusCode::OK, &st))
}

#[utoipa::path(patch, path = "/volumecontent/{volumeID}/path", tag = "volumes",
    operation_id = "update_volume_path",
    params(("volumeID" = String, Path), ("path" = String, Query)), request_body = MetaUpdate,
    responses((status = 200, body = EntryStat), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("VolumeToken" = [])))]
pub async fn update(
    e2b: Data,
    req: HttpRequest,
    id: web::Path<String>,
    q: Q,
    body: Body<MetaUpdate>,
) -> ApiResult<HttpResponse> {
    let path = q.path.clone();
    let meta = Meta {
        uid: body.0.uid,
        gid: body.0.gid,
        mode: body.0.mode,
    };
    let st = on_volume(&e2b, &req, id, move |r| r.set_meta(&path, meta)).await?;
    Ok(ok_json(StatusCode::OK, &st))
}

#[utoipa::path(delete, path = "/volumecontent/{volumeID}/path", tag = "volumes",
    operation_id = "remove_volume_path",
    params(("volumeID" = String, Path), ("path" = String, Query)),
    responses((status = 204, description = "removed (a directory with everything in it)"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)),
    security(("VolumeToken" = [])))]
pub async fn remove(
    e2b: Data,
    req: HttpRequest,
    id: web::Path<String>,
    q: Q,
) -> ApiResult<HttpResponse> {
    let path = q.path.clone();
    on_volume(&e2b, &req, id, move |r| r.remove(&path)).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Any other method or path under `/volumes` or `/volumecontent`: 405 on the API's own paths,
/// 404 elsewhere.
pub async fn other(req: HttpRequest) -> ApiResult<HttpResponse> {
    let path = req.path();
    let own = if let Some(rest) = path.strip_prefix("/volumes") {
        rest.is_empty() || rest.strip_prefix('/').is_some_and(|k| !k.contains('/'))
    } else {
        let parts: Vec<&str> = path
            .trim_start_matches("/volumecontent/")
            .split('/')
            .collect();
        parts.len() == 2 && ["dir", "file", "path"].contains(&parts[1])
    };
    Err(ApiError::not_served(&req, own))
}
