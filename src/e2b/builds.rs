//! e2b's template build API (build system 2.0): request a build, upload the files its COPY
//! steps need (a signed URL on the gateway itself), start it, and follow its status and log.
//! The builds run on nodes; these routes check the caller and the input, then hand over.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use futures::StreamExt;
use serde::Deserialize;

use super::auth::Tenant;
use super::body::Body;
use super::error::{ApiError, ApiResult, ErrorBody};
use super::render::ok_json;
use super::template_names::{self, TemplateName};
use super::upload_url::{self, UploadGrant};
use super::{E2b, wire_templates as wire};
use crate::model::builds::{
    BuildQuery, BuildRef, BuildSpec, FilesRef, LogLevel, RequestBuild, StartBuild, TemplateOp,
    TemplateView,
};

type Data = web::Data<E2b>;

fn valid_build_id(id: &str) -> ApiResult<()> {
    if uuid::Uuid::parse_str(id).is_ok() {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "build id {id:?} is not a UUID"
        )))
    }
}

fn valid_template_id(id: &str) -> ApiResult<()> {
    if !id.is_empty() && id.len() <= 40 && id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        Ok(())
    } else {
        Err(ApiError::not_found(format!("template {id:?} not found")))
    }
}

/// The key that signs upload URLs: every replica has the fleet token.
fn upload_key(e2b: &E2b) -> Vec<u8> {
    let mut k = b"e2b-template-uploads\0".to_vec();
    k.extend_from_slice(e2b.dispatcher.fleet_token().as_bytes());
    k
}

#[utoipa::path(post, path = "/v3/templates", tag = "templates", operation_id = "request_build",
    request_body = wire::BuildRequestV3,
    responses((status = 202, body = wire::RequestedV3), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn request(
    e2b: Data,
    tenant: Tenant,
    body: Body<wire::BuildRequestV3>,
) -> ApiResult<HttpResponse> {
    let req = body.0;
    let raw = req
        .name
        .or(req.alias)
        .ok_or_else(|| ApiError::bad_request("Name is required"))?;
    let name: TemplateName = template_names::parse(&raw)?;
    template_names::check_namespace(&name, &tenant.namespace)?;
    let tags = template_names::build_tags(name.tag.as_deref(), &req.tags.unwrap_or_default())?;
    let (cpu_count, memory_mb) = template_names::validate_resources(req.cpu_count, req.memory_mb)?;
    let built = e2b
        .dispatcher
        .request_build(&RequestBuild {
            team: tenant.namespace.clone(),
            alias: name.alias.clone(),
            tags: tags.clone(),
            cpu_count,
            memory_mb,
        })
        .await?;
    Ok(ok_json(
        StatusCode::ACCEPTED,
        &wire::RequestedV3 {
            template_id: built.template_id,
            build_id: built.build_id,
            public: built.public,
            names: vec![format!("{}/{}", tenant.namespace, built.alias)],
            tags,
            aliases: vec![built.alias],
        },
    ))
}

/// Where the SDK reaches this gateway, as it addressed it.
fn public_base(http: &HttpRequest) -> String {
    let info = http.connection_info();
    format!("{}://{}", info.scheme(), info.host())
}

#[utoipa::path(get, path = "/templates/{templateID}/files/{hash}", tag = "templates",
    operation_id = "build_files",
    params(("templateID" = String, Path), ("hash" = String, Path, description = "SHA-256 of the COPY step's files")),
    responses((status = 201, body = wire::FileUpload), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn files(
    e2b: Data,
    tenant: Tenant,
    http: HttpRequest,
    path: web::Path<(String, String)>,
) -> ApiResult<HttpResponse> {
    let (template_id, hash) = path.into_inner();
    if !upload_url::valid_hash(&hash) {
        return Err(ApiError::bad_request("Invalid files hash"));
    }
    valid_template_id(&template_id)?;
    let present = e2b
        .dispatcher
        .has_build_files(&FilesRef {
            team: tenant.namespace.clone(),
            template_id: template_id.clone(),
            hash: hash.clone(),
        })
        .await?;
    let query = upload_url::sign(
        &upload_key(&e2b),
        &UploadGrant {
            team: tenant.namespace.clone(),
            template_id: template_id.clone(),
            hash: hash.clone(),
            expires: chrono::Utc::now().timestamp() + upload_url::VALID_FOR_SECS,
        },
    );
    let url = format!(
        "{}/_uploads/{template_id}/{hash}?{query}",
        public_base(&http)
    );
    Ok(ok_json(
        StatusCode::CREATED,
        &wire::FileUpload { present, url },
    ))
}

#[utoipa::path(put, path = "/_uploads/{templateID}/{hash}", tag = "templates",
    operation_id = "upload_build_files",
    params(("templateID" = String, Path), ("hash" = String, Path),
        ("team" = String, Query), ("exp" = i64, Query), ("sig" = String, Query)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream",
        description = "The COPY step's files: a tar archive, gzip-compressed or not"),
    responses((status = 200, description = "Stored"), (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn upload(
    e2b: Data,
    http: HttpRequest,
    path: web::Path<(String, String)>,
    mut payload: web::Payload,
) -> ApiResult<HttpResponse> {
    let (template_id, hash) = path.into_inner();
    let grant = upload_url::verify(
        &upload_key(&e2b),
        &template_id,
        &hash,
        http.query_string(),
        chrono::Utc::now().timestamp(),
    )?;
    let limit = e2b.upload_max_bytes;
    let declared = http
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the upload is larger than {limit} bytes"),
        ));
    }
    // The body goes to the node as it arrives. actix's payload stays on this task; a channel
    // carries it to the node call.
    let (tx, rx) = tokio::sync::mpsc::channel::<crate::model::Result<bytes::Bytes>>(8);
    let pump = async move {
        let mut seen = 0u64;
        while let Some(chunk) = payload.next().await {
            let item = match chunk {
                Ok(b) => {
                    seen += b.len() as u64;
                    if seen > limit {
                        Err(crate::model::Error::too_large(format!(
                            "the upload is larger than {limit} bytes"
                        )))
                    } else {
                        Ok(b)
                    }
                }
                Err(e) => Err(crate::model::Error::invalid(format!(
                    "the upload broke off: {e}"
                ))),
            };
            let stop = item.is_err();
            if tx.send(item).await.is_err() || stop {
                break;
            }
        }
        seen
    };
    let files = FilesRef {
        team: grant.team,
        template_id,
        hash,
    };
    let body = tokio_stream::wrappers::ReceiverStream::new(rx);
    let (seen, stored) = futures::join!(pump, e2b.dispatcher.put_build_files(&files, body));
    if seen > limit {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the upload is larger than {limit} bytes"),
        ));
    }
    stored?;
    Ok(HttpResponse::Ok().finish())
}

#[utoipa::path(post, path = "/v2/templates/{templateID}/builds/{buildID}", tag = "templates",
    operation_id = "start_build",
    params(("templateID" = String, Path), ("buildID" = String, Path)),
    request_body(content = Object, description = "TemplateBuildStartV2: fromTemplate or fromImage, steps, startCmd, readyCmd, force"),
    responses((status = 202, description = "Building"), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn start(
    e2b: Data,
    tenant: Tenant,
    path: web::Path<(String, String)>,
    body: Body<BuildSpec>,
) -> ApiResult<HttpResponse> {
    let (template_id, build_id) = path.into_inner();
    valid_build_id(&build_id)?;
    valid_template_id(&template_id)?;
    // Credentials it cannot use are the caller's mistake, told now rather than mid-build.
    crate::model::builds::ImageAuth::parse(body.0.from_image_registry.as_ref())?;
    e2b.dispatcher
        .start_build(&StartBuild {
            build: BuildRef {
                team: tenant.namespace.clone(),
                template_id,
                build_id,
            },
            spec: body.0,
        })
        .await?;
    Ok(HttpResponse::Accepted().finish())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
pub struct StatusQuery {
    /// Index of the first log entry wanted.
    logs_offset: Option<usize>,
    /// Entries wanted, at most 100.
    limit: Option<usize>,
    /// The lowest level wanted: debug, info, warn or error.
    level: Option<String>,
}

#[utoipa::path(get, path = "/templates/{templateID}/builds/{buildID}/status", tag = "templates",
    operation_id = "build_status",
    params(("templateID" = String, Path), ("buildID" = String, Path), StatusQuery),
    responses((status = 200, body = wire::BuildInfo), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn status(
    e2b: Data,
    tenant: Tenant,
    path: web::Path<(String, String)>,
    query: web::Query<StatusQuery>,
) -> ApiResult<HttpResponse> {
    let (template_id, build_id) = path.into_inner();
    valid_build_id(&build_id)?;
    valid_template_id(&template_id)?;
    let q = query.into_inner();
    let level = match q.level.as_deref() {
        None | Some("") => None,
        Some(l) => Some(
            serde_json::from_value::<LogLevel>(serde_json::Value::String(l.to_string())).map_err(
                |_| {
                    ApiError::bad_request(format!(
                        "level {l:?} is not one of debug, info, warn, error"
                    ))
                },
            )?,
        ),
    };
    if q.limit.is_some_and(|l| l > 100) {
        return Err(ApiError::bad_request("limit is at most 100"));
    }
    let s = e2b
        .dispatcher
        .get_build(&BuildQuery {
            build: BuildRef {
                team: tenant.namespace.clone(),
                template_id,
                build_id,
            },
            offset: q.logs_offset.unwrap_or(0),
            limit: q.limit.unwrap_or(100),
            level,
        })
        .await?;
    let step_warnings = |step: &Option<String>| -> Vec<wire::LogEntry> {
        s.entries
            .iter()
            .filter(|e| e.level >= LogLevel::Warn && &e.step == step)
            .cloned()
            .map(Into::into)
            .collect()
    };
    let reason = s.reason.as_ref().map(|r| wire::Reason {
        message: r.message.clone(),
        step: r.step.clone(),
        log_entries: step_warnings(&r.step),
    });
    Ok(ok_json(
        StatusCode::OK,
        &wire::BuildInfo {
            template_id: s.template_id,
            build_id: s.build_id,
            status: s.state,
            log_entries: s.entries.into_iter().map(Into::into).collect(),
            logs: Vec::new(),
            reason,
        },
    ))
}

#[utoipa::path(get, path = "/templates/aliases/{alias}", tag = "templates",
    operation_id = "template_alias",
    params(("alias" = String, Path)),
    responses((status = 200, body = wire::AliasInfo), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn alias(e2b: Data, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let name = template_names::parse(&path.into_inner())?;
    template_names::check_namespace(&name, &tenant.namespace)?;
    if name.tag.is_none()
        && let Some(t) = e2b.dispatcher.node_template(&name.alias)
    {
        return Ok(ok_json(
            StatusCode::OK,
            &wire::AliasInfo {
                template_id: t,
                public: true,
            },
        ));
    }
    let view: TemplateView = e2b
        .dispatcher
        .template_op(&TemplateOp::Describe {
            team: tenant.namespace.clone(),
            name: name.alias.clone(),
        })
        .await?;
    if let Some(tag) = &name.tag
        && !view.record.tags.contains_key(tag)
    {
        return Err(ApiError::not_found(format!(
            "template '{}' has no tag {tag}",
            name.alias
        )));
    }
    Ok(ok_json(
        StatusCode::OK,
        &wire::AliasInfo {
            template_id: view.record.template_id,
            public: view.record.public,
        },
    ))
}

/// The build routes of e2b's first build system (a Dockerfile pushed to e2b's registry by the
/// v1 CLI, and the earliest 2.x SDKs): gone here, in favour of build system 2.0.
async fn legacy(req: HttpRequest) -> ApiResult<HttpResponse> {
    Err(ApiError::new(
        StatusCode::GONE,
        format!(
            "{} {} belongs to e2b's first build system, which this gateway does not offer; build with Template.build (e2b SDK 2.3 or later, or `e2b template create`)",
            req.method(),
            req.path()
        ),
    ))
}

// The legacy routes, one documented operation each; all answer 410 to anyone (no key needed
// to learn that a route is gone).

#[utoipa::path(post, path = "/templates", tag = "templates", operation_id = "legacy_create_template",
    description = "e2b's first build system (a Dockerfile pushed to e2b's registry): gone; build with Template.build.",
    responses((status = 410, body = ErrorBody)))]
pub async fn legacy_create_v1(req: HttpRequest) -> ApiResult<HttpResponse> {
    legacy(req).await
}

#[utoipa::path(post, path = "/v2/templates", tag = "templates", operation_id = "legacy_create_template_v2",
    description = "e2b's first build system, as the earliest 2.x SDKs call it: gone; build with Template.build.",
    responses((status = 410, body = ErrorBody)))]
pub async fn legacy_create_v2(req: HttpRequest) -> ApiResult<HttpResponse> {
    legacy(req).await
}

#[utoipa::path(post, path = "/templates/{templateID}", tag = "templates", operation_id = "legacy_rebuild_template",
    description = "A rebuild in e2b's first build system: gone; build with Template.build.",
    params(("templateID" = String, Path)),
    responses((status = 410, body = ErrorBody)))]
pub async fn legacy_rebuild(req: HttpRequest) -> ApiResult<HttpResponse> {
    legacy(req).await
}

#[utoipa::path(post, path = "/templates/{templateID}/builds/{buildID}", tag = "templates",
    operation_id = "legacy_start_build",
    description = "Starting a build of e2b's first build system: gone; build with Template.build.",
    params(("templateID" = String, Path), ("buildID" = String, Path)),
    responses((status = 410, body = ErrorBody)))]
pub async fn legacy_start(req: HttpRequest) -> ApiResult<HttpResponse> {
    legacy(req).await
}

/// A method the template routes do not take (TRACE, PUT on a template): the client's mistake.
pub async fn no_method(req: HttpRequest) -> ApiResult<HttpResponse> {
    Err(ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not a method of {}", req.method(), req.path()),
    ))
}
