//! A team's built templates through e2b's management routes: tags (assign, remove, list), a
//! template with its builds, publish, delete. The listing merges them with the nodes' own
//! templates (`templates.rs`).

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::Tenant;
use super::body::Body;
use super::error::{ApiError, ApiResult, ErrorBody};
use super::render::ok_json;
use super::{E2b, template_names, wire};
use crate::agent::ENVD_VERSION;
use crate::model::builds::{BuildState, TagsAssigned, TemplateOp, TemplateView};

type Data = web::Data<E2b>;
const MIB: u64 = 1024 * 1024;

/// `POST /templates/tags`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct AssignTags {
    /// `name:tag`: the build the tag names gets the new tags (`name` alone: its default).
    pub target: String,
    pub tags: Vec<String>,
}

/// `DELETE /templates/tags`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct RemoveTags {
    /// The template's name, without a tag.
    pub name: String,
    pub tags: Vec<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AssignedTags {
    pub tags: Vec<String>,
    #[serde(rename = "buildID")]
    pub build_id: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TagInfo {
    pub tag: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// A build of a template (`TemplateBuild`).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuildItem {
    #[serde(rename = "buildID")]
    pub build_id: String,
    #[schema(value_type = String)]
    pub status: BuildState,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub envd_version: String,
}

/// `TemplateWithBuilds`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateWithBuilds {
    #[serde(flatten)]
    pub template: wire::Template,
    pub builds: Vec<BuildItem>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct Publish {
    pub public: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Published {
    pub names: Vec<String>,
}

/// How the e2b listing shows a team's built template: its newest build, and the status of
/// that build.
pub fn listed(v: &TemplateView, namespace: &str) -> wire::Template {
    let r = &v.record;
    let newest = v.builds.last();
    let ready = v.builds.iter().rev().find(|b| b.state == BuildState::Ready);
    let status = match newest.map(|b| b.state) {
        Some(BuildState::Ready) => "ready",
        Some(BuildState::Error) => "error",
        Some(BuildState::Waiting) => "waiting",
        Some(BuildState::Building) | None => "building",
    };
    wire::Template {
        template_id: r.template_id.clone(),
        build_id: ready
            .or(newest)
            .map(|b| b.build_id.clone())
            .unwrap_or_default(),
        cpu_count: r.cpu_count,
        memory_mb: r.memory_mb,
        disk_size_mb: ready.map_or(0, |b| b.layer_bytes / MIB),
        public: r.public,
        aliases: vec![r.alias.clone()],
        names: vec![format!("{namespace}/{}", r.alias)],
        created_at: r.created_at,
        updated_at: r.updated_at,
        created_by: None,
        last_spawned_at: v.last_spawned_at,
        spawn_count: v.spawn_count,
        build_count: v.builds.len() as u64,
        envd_version: ENVD_VERSION.to_string(),
        build_status: status,
        size_bytes: ready.map_or(0, |b| b.layer_bytes),
        packages: Vec::new(),
        kind: "built".into(),
        captures_memory: false,
    }
}

/// The tags a request names, checked; at least one.
fn tags_of(tags: &[String]) -> ApiResult<Vec<String>> {
    if tags.is_empty() {
        return Err(ApiError::bad_request("tags must name at least one tag"));
    }
    Ok(tags
        .iter()
        .map(|t| template_names::parse_tag(t))
        .collect::<crate::model::Result<Vec<_>>>()?)
}

#[utoipa::path(post, path = "/templates/tags", tag = "templates", operation_id = "assign_tags",
    request_body = AssignTags,
    responses((status = 201, body = AssignedTags), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn assign_tags(
    e2b: Data,
    tenant: Tenant,
    body: Body<AssignTags>,
) -> ApiResult<HttpResponse> {
    let req = body.0;
    let target = template_names::parse(&req.target)?;
    template_names::check_namespace(&target, &tenant.namespace)?;
    let tags = tags_of(&req.tags)?;
    let done: TagsAssigned = e2b
        .dispatcher
        .template_op(&TemplateOp::AssignTags {
            team: tenant.namespace.clone(),
            name: target.alias,
            tag: target.tag.unwrap_or_else(|| "default".into()),
            tags,
        })
        .await?;
    Ok(ok_json(
        StatusCode::CREATED,
        &AssignedTags {
            tags: done.tags,
            build_id: done.build_id,
        },
    ))
}

#[utoipa::path(delete, path = "/templates/tags", tag = "templates", operation_id = "remove_tags",
    request_body = RemoveTags,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn remove_tags(
    e2b: Data,
    tenant: Tenant,
    body: Body<RemoveTags>,
) -> ApiResult<HttpResponse> {
    let req = body.0;
    if req.name.contains(':') {
        return Err(ApiError::bad_request(
            "name must not carry a tag; list the tags to remove in tags",
        ));
    }
    let name = template_names::parse(&req.name)?;
    template_names::check_namespace(&name, &tenant.namespace)?;
    let tags = tags_of(&req.tags)?;
    if tags.iter().any(|t| t == "default") {
        return Err(ApiError::bad_request("the default tag cannot be removed"));
    }
    let _: () = e2b
        .dispatcher
        .template_op(&TemplateOp::RemoveTags {
            team: tenant.namespace.clone(),
            name: name.alias,
            tags,
        })
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn describe(e2b: &E2b, tenant: &Tenant, name: &str) -> ApiResult<TemplateView> {
    let name = name.trim().to_ascii_lowercase();
    Ok(e2b
        .dispatcher
        .template_op(&TemplateOp::Describe {
            team: tenant.namespace.clone(),
            name,
        })
        .await?)
}

#[utoipa::path(get, path = "/templates/{templateID}/tags", tag = "templates",
    operation_id = "template_tags",
    params(("templateID" = String, Path, description = "a template id or name")),
    responses((status = 200, body = [TagInfo]), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn tags(e2b: Data, tenant: Tenant, id: web::Path<String>) -> ApiResult<HttpResponse> {
    let v = describe(&e2b, &tenant, &id).await?;
    let tags: Vec<TagInfo> = v
        .record
        .tags
        .into_iter()
        .map(|(tag, t)| TagInfo {
            tag,
            build_id: t.build_id,
            created_at: t.assigned_at,
        })
        .collect();
    Ok(ok_json(StatusCode::OK, &tags))
}

#[utoipa::path(get, path = "/templates/{templateID}", tag = "templates",
    operation_id = "get_template",
    params(("templateID" = String, Path, description = "a template id or name")),
    responses((status = 200, body = TemplateWithBuilds), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn get(e2b: Data, tenant: Tenant, id: web::Path<String>) -> ApiResult<HttpResponse> {
    let v = describe(&e2b, &tenant, &id).await?;
    let builds = v
        .builds
        .iter()
        .map(|b| BuildItem {
            build_id: b.build_id.clone(),
            status: b.state,
            created_at: b.created_at,
            updated_at: b.updated_at,
            finished_at: b.finished_at,
            cpu_count: b.cpu_count,
            memory_mb: b.memory_mb,
            disk_size_mb: b.layer_bytes / MIB,
            envd_version: ENVD_VERSION.to_string(),
        })
        .collect();
    Ok(ok_json(
        StatusCode::OK,
        &TemplateWithBuilds {
            template: listed(&v, &tenant.namespace),
            builds,
        },
    ))
}

async fn publish(e2b: &E2b, tenant: &Tenant, id: &str, public: bool) -> ApiResult<Vec<String>> {
    Ok(e2b
        .dispatcher
        .template_op(&TemplateOp::Publish {
            team: tenant.namespace.clone(),
            name: id.trim().to_ascii_lowercase(),
            public,
        })
        .await?)
}

#[utoipa::path(patch, path = "/v2/templates/{templateID}", tag = "templates",
    operation_id = "publish_template",
    params(("templateID" = String, Path)), request_body = Publish,
    responses((status = 200, body = Published), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn publish_v2(
    e2b: Data,
    tenant: Tenant,
    id: web::Path<String>,
    body: Body<Publish>,
) -> ApiResult<HttpResponse> {
    let names = publish(&e2b, &tenant, &id, body.0.public).await?;
    Ok(ok_json(StatusCode::OK, &Published { names }))
}

#[utoipa::path(patch, path = "/templates/{templateID}", tag = "templates",
    operation_id = "publish_template_v1",
    params(("templateID" = String, Path)), request_body = Publish,
    responses((status = 200), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn publish_v1(
    e2b: Data,
    tenant: Tenant,
    id: web::Path<String>,
    body: Body<Publish>,
) -> ApiResult<HttpResponse> {
    publish(&e2b, &tenant, &id, body.0.public).await?;
    Ok(HttpResponse::Ok().finish())
}

/// Deletes a team's built template; answers None when the team has none by that name (the
/// caller then tries snapshots and node templates).
pub async fn delete_built(e2b: &E2b, tenant: &Tenant, id: &str) -> ApiResult<Option<()>> {
    let op = TemplateOp::Delete {
        team: tenant.namespace.clone(),
        name: id.trim().to_ascii_lowercase(),
    };
    match e2b.dispatcher.template_op::<()>(&op).await {
        Ok(()) => Ok(Some(())),
        Err(e) if e.kind == crate::model::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}
