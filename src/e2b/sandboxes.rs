//! Sandbox routes: create, get, list, kill, timeout/refresh, pause, connect/resume and fork
//! (snapshots and metrics have their own modules).

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::Utc;
use rand::Rng;

use super::auth::Tenant;
use super::body::{Body, OptionalBody};
use super::error::{ApiError, ApiResult, ErrorBody};
use super::idempotency::{self, Begin, Outcome};
use super::listed;
use super::listing::{self, Cursor, query_value};
use super::render::{self, ok_json};
use super::{E2b, network, wire};
use crate::dispatch::ClaimRequest;
use crate::dispatch::read_view::Entry;
use crate::model::{self, Phase, PoolKey, ids};

/// Lifetime of a sandbox created without a timeout on each API version.
pub const DEFAULT_TIMEOUT_V2: i64 = 300;
pub const DEFAULT_TIMEOUT_V1: i64 = 15;
/// Default lifetime of fork children, as the e2b API documents it.
pub const DEFAULT_FORK_TIMEOUT: i64 = 15;
/// Refreshes never set less than this.
pub const MIN_REFRESH: i64 = 15;
/// Lifetime a deprecated resume asks for when it names none.
pub const DEFAULT_RESUME_TIMEOUT: i64 = 15;

type Data = web::Data<E2b>;

/// Checks a lifetime in seconds: positive and within what the nodes grant.
fn lifetime(e2b: &E2b, what: &str, seconds: i64) -> ApiResult<u64> {
    if seconds <= 0 {
        return Err(ApiError::bad_request(format!(
            "{what} must be greater than 0, got {seconds}"
        )));
    }
    let seconds = seconds as u64;
    if let Some(max) = e2b.dispatcher.max_lease_seconds()
        && seconds > max
    {
        return Err(ApiError::bad_request(format!(
            "{what} cannot be greater than {max} seconds ({} hours)",
            max / 3600
        )));
    }
    Ok(seconds)
}

/// A name for an e2b sandbox in its namespace (the Kubernetes facade shows it under this).
fn e2b_name() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let suffix: String = (0..8)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    format!("e2b-{suffix}")
}

/// A create's `volumeMounts`, `[{name, path}]`, as mounts of the team's volumes: every name
/// must be one of its volumes (e2b's 400 otherwise).
async fn volume_mounts(
    e2b: &E2b,
    tenant: &str,
    asked: Option<&[serde_json::Value]>,
) -> ApiResult<Vec<model::VolumeMount>> {
    let Some(asked) = asked.filter(|a| !a.is_empty()) else {
        return Ok(Vec::new());
    };
    let store = e2b
        .volumes
        .clone()
        .ok_or_else(|| ApiError::bad_request("Volume mounts are not enabled."))?;
    let mut wanted = Vec::with_capacity(asked.len());
    for v in asked {
        let m: wire::VolumeMount = serde_json::from_value(v.clone()).map_err(|e| {
            ApiError::bad_request(format!("volumeMounts: each must be {{name, path}}: {e}"))
        })?;
        wanted.push(m);
    }
    // The paths are checked where they are mounted (the node's `volumes::check`).
    let tenant = tenant.to_string();
    super::error::off_thread("resolving volumes", move || {
        wanted
            .into_iter()
            .map(|m| {
                let v = store.resolve(&tenant, &m.name).map_err(|_| {
                    crate::model::Error::invalid(format!("volume {:?} not found", m.name))
                })?;
                Ok(model::VolumeMount {
                    source: store.data_dir(&tenant, &v.id)?.display().to_string(),
                    name: m.name,
                    path: m.path,
                })
            })
            .collect::<crate::model::Result<Vec<_>>>()
    })
    .await
}

fn refuse_unsupported(req: &wire::NewSandbox) -> ApiResult<()> {
    let refuse = |what: &str| {
        Err(ApiError::bad_request(format!(
            "{what} is not supported by this gateway"
        )))
    };
    if req.secure == Some(false) {
        return refuse("secure: false (every sandbox gets an envd access token)");
    }
    if req.mcp.as_ref().is_some_and(|v| !v.is_null()) {
        return refuse(
            "mcp (it needs the mcp-gateway template with e2b's mcp-gateway program, which this gateway does not have)",
        );
    }
    if req.iam.as_ref().is_some_and(|v| !v.is_null()) {
        return refuse("iam (this gateway mints no workload identity tokens)");
    }
    Ok(())
}

/// The lifecycle a create asks for: `autoPause` pauses at the end of the lease instead of
/// killing (the SDKs send it for `lifecycle.on_timeout`), `autoResume.enabled` resumes a
/// paused sandbox when its data plane is reached.
fn lifecycle(req: &wire::NewSandbox) -> ApiResult<model::Lifecycle> {
    let auto_resume = match &req.auto_resume {
        None => false,
        Some(v) if v.is_null() => false,
        Some(v) => v
            .get("enabled")
            .and_then(|e| e.as_bool())
            .ok_or_else(|| ApiError::bad_request("autoResume must be {\"enabled\": bool}"))?,
    };
    let on_timeout = if req.auto_pause == Some(true) {
        model::OnTimeout::Pause
    } else {
        model::OnTimeout::Kill
    };
    if auto_resume && on_timeout != model::OnTimeout::Pause {
        return Err(ApiError::bad_request(
            "autoResume needs autoPause: only a sandbox paused at its timeout can be resumed by traffic",
        ));
    }
    // e2b's own rules for a filesystem-only auto-pause come first, so a request that breaks
    // them hears why whatever this gateway offers.
    if req.auto_pause_memory == Some(false) && on_timeout != model::OnTimeout::Pause {
        return Err(ApiError::bad_request(
            "autoPauseMemory: false needs autoPause: true (it says how the sandbox pauses at its timeout)",
        ));
    }
    if req.auto_pause_memory == Some(false) && auto_resume {
        return Err(ApiError::bad_request(
            "autoPauseMemory: false cannot be combined with autoResume: a sandbox paused without its memory must be resumed with connect",
        ));
    }
    let pause_mode = if req.auto_pause_memory == Some(false) {
        model::PauseMode::Filesystem
    } else {
        model::PauseMode::Full
    };
    Ok(model::Lifecycle {
        on_timeout,
        auto_resume,
        pause_mode,
    })
}

async fn create(
    e2b: &E2b,
    tenant: &Tenant,
    req: wire::NewSandbox,
    default_timeout: i64,
) -> ApiResult<wire::Sandbox> {
    let template = req
        .template_id
        .clone()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::bad_request("templateID is required"))?;
    let ttl = lifetime(e2b, "Timeout", req.timeout.unwrap_or(default_timeout))?;
    refuse_unsupported(&req)?;
    let volume_mounts = volume_mounts(e2b, &tenant.namespace, req.volume_mounts.as_deref()).await?;
    let lifecycle = lifecycle(&req)?;
    let network = network::policy(req.network.as_ref(), req.allow_internet_access)?;
    // As on e2b, a sandbox has internet access unless the request turns it off; one that may
    // reach nothing at all gets no network.
    let net = if network.denies_everything() {
        "none"
    } else {
        "egress"
    };
    let metadata = req.metadata.unwrap_or_default();
    let env_vars = req.env_vars.unwrap_or_default();
    model::sandbox::validate_string_map("metadata", &metadata)?;
    model::sandbox::validate_string_map("envVars", &env_vars)?;
    let claim = |key: PoolKey| ClaimRequest {
        namespace: tenant.namespace.clone(),
        name: e2b_name(),
        key,
        ttl_seconds: ttl,
        metadata: metadata.clone(),
        env_vars: env_vars.clone(),
        lifecycle,
        network: network.clone(),
        volume_mounts: volume_mounts.clone(),
    };
    let claimed = if ids::is_checkpoint_id(&template) {
        let prefix = model::stamped_name(&tenant.namespace, "");
        let base = PoolKey::base();
        e2b.dispatcher
            .claim_from_checkpoint(&template, &prefix, claim(base))
            .await?
    } else {
        let template = e2b
            .dispatcher
            .template_for(&tenant.namespace, &template)
            .await?;
        let key = PoolKey::template_sized(&template, net)
            .map_err(|e| ApiError::bad_request(format!("templateID: {}", e.message)))?;
        e2b.dispatcher.claim(claim(key)).await.map_err(|e| {
            if e.kind == model::ErrorKind::NotFound {
                ApiError::not_found(format!("template {template:?} not found"))
            } else {
                e.into()
            }
        })?
    };
    e2b.sandbox(&claimed.record)
}

async fn create_route(
    e2b: Data,
    tenant: Tenant,
    http: HttpRequest,
    body: Body<serde_json::Value>,
    default_timeout: i64,
) -> ApiResult<HttpResponse> {
    let value = body.0;
    let req: wire::NewSandbox = serde_json::from_value(value.clone())
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))?;
    let key = http
        .headers()
        .get("Idempotency-Key")
        .map(|v| v.to_str().map(str::to_string))
        .transpose()
        .map_err(|_| ApiError::bad_request("Idempotency-Key must be ASCII"))?;
    let Some(key) = key else {
        let sandbox = create(&e2b, &tenant, req, default_timeout).await?;
        return Ok(ok_json(StatusCode::CREATED, &sandbox));
    };
    idempotency::validate(&key)?;
    let fp = idempotency::fingerprint(http.path(), &value);
    match e2b.idempotency.begin(&tenant.namespace, &key, fp)? {
        Begin::Replay(Outcome::Created(sandbox)) => Ok(ok_json(StatusCode::CREATED, &sandbox)),
        Begin::Replay(Outcome::Failed(e)) => Err(e),
        Begin::Run(ticket) => {
            let outcome = create(&e2b, &tenant, req, default_timeout).await;
            e2b.idempotency.finish(ticket, &outcome);
            Ok(ok_json(StatusCode::CREATED, &outcome?))
        }
    }
}

#[utoipa::path(post, path = "/v2/sandboxes", tag = "sandboxes",
    request_body = wire::NewSandbox,
    params(("Idempotency-Key" = Option<String>, Header, description = "replays return the same sandbox")),
    responses((status = 201, body = wire::Sandbox), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody, description = "the Idempotency-Key was used with a different request"),
        (status = 503, body = ErrorBody, description = "no node has capacity; Retry-After"),
        (status = 504, body = ErrorBody, description = "outcome unknown; Should-Retry: false"),
        (status = 507, body = ErrorBody, description = "from a snapshot: its node's data directory is full")),
    security(("ApiKeyAuth" = [])))]
pub async fn create_v2(
    e2b: Data,
    tenant: Tenant,
    http: HttpRequest,
    body: Body<serde_json::Value>,
) -> ApiResult<HttpResponse> {
    create_route(e2b, tenant, http, body, DEFAULT_TIMEOUT_V2).await
}

#[utoipa::path(post, path = "/sandboxes", tag = "sandboxes", request_body = wire::NewSandbox,
    responses((status = 201, body = wire::Sandbox), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "no such template"),
        (status = 503, body = ErrorBody),
        (status = 507, body = ErrorBody, description = "from a snapshot: its node's data directory is full")),
    security(("ApiKeyAuth" = [])))]
pub async fn create_v1(
    e2b: Data,
    tenant: Tenant,
    http: HttpRequest,
    body: Body<serde_json::Value>,
) -> ApiResult<HttpResponse> {
    create_route(e2b, tenant, http, body, DEFAULT_TIMEOUT_V1).await
}

#[utoipa::path(get, path = "/sandboxes/{sandboxID}", tag = "sandboxes",
    params(("sandboxID" = String, Path)),
    responses((status = 200, body = wire::SandboxDetail), (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn get(e2b: Data, tenant: Tenant, id: web::Path<String>) -> ApiResult<HttpResponse> {
    let record = e2b.dispatcher.get(tenant.scope(), &id).await?;
    Ok(ok_json(StatusCode::OK, &e2b.detail(&record)?))
}

#[utoipa::path(delete, path = "/sandboxes/{sandboxID}", tag = "sandboxes",
    params(("sandboxID" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn kill(e2b: Data, tenant: Tenant, id: web::Path<String>) -> ApiResult<HttpResponse> {
    e2b.dispatcher.release(tenant.scope(), &id).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Filters of a sandbox listing.
struct SandboxFilter {
    states: Option<Vec<Phase>>,
    metadata: BTreeMap<String, String>,
    template: Option<String>,
    started_after: Option<chrono::DateTime<Utc>>,
}

fn sandbox_filter(q: &[(String, String)]) -> ApiResult<SandboxFilter> {
    let mut states: Option<Vec<Phase>> = None;
    for (k, v) in q.iter().filter(|(k, _)| k == "state") {
        let _ = k;
        for s in v.split(',').filter(|s| !s.is_empty()) {
            let phase = match s {
                "running" => Phase::Running,
                "paused" => Phase::Paused,
                other => {
                    return Err(ApiError::bad_request(format!(
                        "state must be running or paused, got {other:?}"
                    )));
                }
            };
            states.get_or_insert_with(Vec::new).push(phase);
        }
    }
    Ok(SandboxFilter {
        states,
        metadata: match query_value(q, "metadata") {
            Some(m) => listing::parse_metadata(m)?,
            None => BTreeMap::new(),
        },
        template: query_value(q, "template").map(str::to_string),
        started_after: query_value(q, "startedAfter")
            .map(|t| listing::parse_time("startedAfter", t))
            .transpose()?,
    })
}

impl SandboxFilter {
    fn keeps(&self, r: &model::SandboxRecord) -> bool {
        self.states.as_ref().is_none_or(|s| s.contains(&r.phase))
            && self
                .metadata
                .iter()
                .all(|(k, v)| r.metadata.get(k) == Some(v))
            && self
                .template
                .as_ref()
                .is_none_or(|t| *t == render::template_id(r) || *t == r.key.template)
            && self.started_after.is_none_or(|t| r.claimed_at >= t)
    }
}

#[utoipa::path(get, path = "/v2/sandboxes", tag = "sandboxes",
    params(("state" = Option<String>, Query, description = "running,paused"),
        ("metadata" = Option<String>, Query), ("template" = Option<String>, Query),
        ("startedAfter" = Option<String>, Query), ("limit" = Option<u32>, Query),
        ("order" = Option<String>, Query), ("nextToken" = Option<String>, Query)),
    responses((status = 200, body = [wire::ListedSandbox],
        headers(("X-Next-Token" = String, description = "absent on the last page"))),
        (status = 400, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn list_v2(
    e2b: Data,
    tenant: Tenant,
    q: web::Query<Vec<(String, String)>>,
) -> ApiResult<HttpResponse> {
    let filter = sandbox_filter(&q)?;
    let limit = listing::parse_limit(query_value(&q, "limit"))?;
    let order = listing::parse_order(query_value(&q, "order"))?;
    let after = query_value(&q, "nextToken")
        .filter(|t| !t.is_empty())
        .map(Cursor::decode)
        .transpose()?;
    let (all, _) = e2b.dispatcher.settled_view().await.by_start();
    let scope = tenant.scope();
    let keep =
        |e: &Entry| scope.is_none_or(|ns| e.record.namespace() == ns) && filter.keeps(&e.record);
    let (page, next) = listed::page(&all, keep, order, after.as_ref(), limit);
    Ok(listed::reply(page, next))
}

#[utoipa::path(get, path = "/sandboxes", tag = "sandboxes",
    params(("metadata" = Option<String>, Query)),
    responses((status = 200, body = [wire::ListedSandbox], description = "running sandboxes")),
    security(("ApiKeyAuth" = [])))]
pub async fn list_v1(
    e2b: Data,
    tenant: Tenant,
    q: web::Query<Vec<(String, String)>>,
) -> ApiResult<HttpResponse> {
    let mut filter = sandbox_filter(&q)?;
    filter.states = Some(vec![Phase::Running]);
    let (all, _) = e2b.dispatcher.settled_view().await.by_start();
    let scope = tenant.scope();
    let newest_first = all
        .iter()
        .rev()
        .filter(|e| scope.is_none_or(|ns| e.record.namespace() == ns) && filter.keeps(&e.record))
        .cloned()
        .collect();
    Ok(listed::reply(newest_first, None))
}

#[utoipa::path(post, path = "/sandboxes/{sandboxID}/timeout", tag = "sandboxes",
    params(("sandboxID" = String, Path)), request_body = wire::TimeoutRequest,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "the sandbox is paused: its lease starts again when it resumes")),
    security(("ApiKeyAuth" = [])))]
pub async fn set_timeout(
    e2b: Data,
    tenant: Tenant,
    id: web::Path<String>,
    body: Body<wire::TimeoutRequest>,
) -> ApiResult<HttpResponse> {
    let t = body
        .0
        .timeout
        .ok_or_else(|| ApiError::bad_request("timeout is required"))?;
    if t <= 0 {
        // As e2b: the sandbox's time is up now, and its on-timeout action (kill or pause) runs.
        e2b.dispatcher.expire(tenant.scope(), &id).await?;
        return Ok(HttpResponse::NoContent().finish());
    }
    let ttl = lifetime(&e2b, "timeout", t)?;
    e2b.dispatcher.renew(tenant.scope(), &id, ttl, true).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(post, path = "/sandboxes/{sandboxID}/refreshes", tag = "sandboxes",
    params(("sandboxID" = String, Path)), request_body = wire::RefreshRequest,
    responses((status = 204), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "the sandbox is paused")),
    security(("ApiKeyAuth" = [])))]
pub async fn refresh(
    e2b: Data,
    tenant: Tenant,
    id: web::Path<String>,
    body: OptionalBody<wire::RefreshRequest>,
) -> ApiResult<HttpResponse> {
    let d = body.0.duration.unwrap_or(MIN_REFRESH).max(MIN_REFRESH);
    let ttl = lifetime(&e2b, "duration", d)?;
    e2b.dispatcher
        .renew(tenant.scope(), &id, ttl, false)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(post, path = "/sandboxes/{sandboxID}/pause", tag = "sandboxes",
    params(("sandboxID" = String, Path)), request_body = wire::PauseRequest,
    responses((status = 204), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody, description = "already paused"),
        (status = 503, body = ErrorBody, description = "a filesystem-only pause of a sandbox whose agent does not answer")),
    security(("ApiKeyAuth" = [])))]
pub async fn pause(
    e2b: Data,
    tenant: Tenant,
    id: web::Path<String>,
    body: OptionalBody<wire::PauseRequest>,
) -> ApiResult<HttpResponse> {
    // memory: false keeps only the sandbox's files; its next resume boots fresh from them.
    let mode = if body.0.memory == Some(false) {
        model::PauseMode::Filesystem
    } else {
        model::PauseMode::Full
    };
    let (record, changed) = e2b
        .dispatcher
        .change_pause(tenant.scope(), &id, model::PauseChange::Pause(mode))
        .await?;
    if !changed {
        return Err(ApiError::conflict(format!(
            "sandbox {} is already paused",
            render::sandbox_id(&record)
        )));
    }
    Ok(HttpResponse::NoContent().finish())
}

/// Resumes a paused sandbox (answering 201) or keeps a running one (200), then extends its
/// lease to at least `timeout` seconds; a lease is never shortened here.
async fn connect(
    e2b: &E2b,
    tenant: &Tenant,
    id: &str,
    timeout: i64,
    memory: Option<bool>,
    running_is_conflict: bool,
) -> ApiResult<HttpResponse> {
    let ttl = lifetime(e2b, "timeout", timeout)?;
    let current = e2b.dispatcher.get(tenant.scope(), id).await?;
    let (record, status) = if current.phase == Phase::Paused {
        // memory: false boots fresh from the sandbox's files even after a full pause (a
        // filesystem-only pause always does).
        let cold = memory == Some(false);
        let resume = model::PauseChange::Resume { cold };
        let (record, _) = e2b
            .dispatcher
            .change_pause(tenant.scope(), id, resume)
            .await?;
        (record, StatusCode::CREATED)
    } else if running_is_conflict {
        return Err(ApiError::conflict(format!(
            "sandbox {} is already running",
            render::sandbox_id(&current)
        )));
    } else {
        (current, StatusCode::OK)
    };
    e2b.dispatcher.renew(tenant.scope(), id, ttl, false).await?;
    Ok(ok_json(status, &e2b.sandbox(&record)?))
}

#[utoipa::path(post, path = "/v2/sandboxes/{sandboxID}/connect", tag = "sandboxes",
    params(("sandboxID" = String, Path)), request_body = wire::ConnectRequest,
    responses((status = 200, body = wire::Sandbox, description = "was running"),
        (status = 201, body = wire::Sandbox, description = "resumed"),
        (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn connect_v2(
    e2b: Data,
    tenant: Tenant,
    id: web::Path<String>,
    body: OptionalBody<wire::ConnectRequest>,
) -> ApiResult<HttpResponse> {
    let b = body.0;
    connect(
        &e2b,
        &tenant,
        &id,
        b.timeout.unwrap_or(DEFAULT_TIMEOUT_V2),
        b.memory,
        false,
    )
    .await
}

#[utoipa::path(post, path = "/sandboxes/{sandboxID}/connect", tag = "sandboxes",
    params(("sandboxID" = String, Path)), request_body = wire::ConnectRequest,
    responses((status = 200, body = wire::Sandbox), (status = 201, body = wire::Sandbox),
        (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn connect_v1(
    e2b: Data,
    tenant: Tenant,
    id: web::Path<String>,
    body: Body<wire::ConnectRequest>,
) -> ApiResult<HttpResponse> {
    let b = body.0;
    let timeout = b
        .timeout
        .ok_or_else(|| ApiError::bad_request("timeout is required"))?;
    connect(&e2b, &tenant, &id, timeout, b.memory, false).await
}

#[utoipa::path(post, path = "/sandboxes/{sandboxID}/resume", tag = "sandboxes",
    params(("sandboxID" = String, Path)), request_body = wire::ResumeRequest,
    responses((status = 201, body = wire::Sandbox), (status = 409, body = ErrorBody, description = "already running"),
        (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn resume(
    e2b: Data,
    tenant: Tenant,
    id: web::Path<String>,
    body: OptionalBody<wire::ResumeRequest>,
) -> ApiResult<HttpResponse> {
    let b = body.0;
    let timeout = b.timeout.unwrap_or(DEFAULT_RESUME_TIMEOUT);
    let resumed = connect(&e2b, &tenant, &id, timeout, b.memory, true).await?;
    // The deprecated flag sets what the end of the resumed sandbox's timeout does, as
    // `lifecycle.on_timeout` does at create.
    if let Some(pause) = b.auto_pause {
        let on_timeout = if pause {
            model::OnTimeout::Pause
        } else {
            model::OnTimeout::Kill
        };
        e2b.dispatcher
            .set_on_timeout(tenant.scope(), &id, on_timeout)
            .await?;
    }
    Ok(resumed)
}

#[utoipa::path(post, path = "/sandboxes/{sandboxID}/fork", tag = "sandboxes",
    params(("sandboxID" = String, Path)), request_body = wire::ForkRequest,
    responses((status = 201, body = [wire::ForkResult]), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody),
        (status = 507, body = ErrorBody, description = "the sandbox's node's data directory is full")),
    security(("ApiKeyAuth" = [])))]
pub async fn fork(
    e2b: Data,
    tenant: Tenant,
    id: web::Path<String>,
    body: OptionalBody<wire::ForkRequest>,
) -> ApiResult<HttpResponse> {
    let b = body.0;
    let count = b.count.unwrap_or(1);
    if count < 1 {
        return Err(ApiError::bad_request(format!(
            "count must be at least 1, got {count}"
        )));
    }
    let count = u32::try_from(count)
        .map_err(|_| ApiError::bad_request(format!("count {count} is too large")))?;
    let ttl = lifetime(&e2b, "timeout", b.timeout.unwrap_or(DEFAULT_FORK_TIMEOUT))?;
    let children = e2b.dispatcher.fork(tenant.scope(), &id, count, ttl).await?;
    let results = children
        .iter()
        .map(|c| {
            Ok(wire::ForkResult {
                sandbox: Some(e2b.sandbox(c)?),
                error: None,
            })
        })
        .collect::<ApiResult<Vec<_>>>()?;
    Ok(ok_json(StatusCode::CREATED, &results))
}

/// Routes the SDKs know that this gateway does not serve: a clear JSON error, never a fake
/// success.
pub async fn not_supported(req: HttpRequest) -> ApiResult<HttpResponse> {
    // A method the e2b API does not use on these paths (TRACE, or PUT on a template) is the
    // client's mistake, not a missing feature: 405, as the routes this gateway serves answer
    // (found by schemathesis). The template API uses GET, POST and PATCH only.
    use actix_web::http::Method;
    let methods: &[Method] = if req.path().starts_with("/templates/") {
        &[Method::GET, Method::POST, Method::PATCH]
    } else {
        &[
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
        ]
    };
    if !methods.contains(req.method()) {
        return Err(ApiError::new(
            actix_web::http::StatusCode::METHOD_NOT_ALLOWED,
            format!("{} is not a method of {}", req.method(), req.path()),
        ));
    }
    Err(ApiError::not_implemented(format!(
        "{} {} is not supported by this gateway",
        req.method(),
        req.path()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filesystem_only_auto_pause_follows_e2bs_rules() {
        let req = |v: serde_json::Value| -> wire::NewSandbox {
            serde_json::from_value(v).expect("a create body")
        };
        let why = |v: serde_json::Value| lifecycle(&req(v)).unwrap_err().message;
        assert!(why(serde_json::json!({"autoPauseMemory": false})).contains("needs autoPause"));
        assert!(
            why(
                serde_json::json!({"autoPause": true, "autoPauseMemory": false,
                "autoResume": {"enabled": true}})
            )
            .contains("autoResume")
        );
        let files = lifecycle(&req(
            serde_json::json!({"autoPause": true, "autoPauseMemory": false}),
        ))
        .unwrap();
        assert_eq!(files.on_timeout, model::OnTimeout::Pause);
        assert_eq!(files.pause_mode, model::PauseMode::Filesystem);
        let kept = lifecycle(&req(
            serde_json::json!({"autoPause": true, "autoPauseMemory": true}),
        ))
        .unwrap();
        assert_eq!(kept.on_timeout, model::OnTimeout::Pause);
        assert_eq!(kept.pause_mode, model::PauseMode::Full);
        let unsaid = lifecycle(&req(serde_json::json!({"autoPause": true}))).unwrap();
        assert_eq!(unsaid.pause_mode, model::PauseMode::Full);
    }

    #[test]
    fn unsupported_options_are_named() {
        let mut r = wire::NewSandbox {
            template_id: Some("base".into()),
            ..Default::default()
        };
        assert!(refuse_unsupported(&r).is_ok());
        r.mcp = Some(serde_json::json!({"x": {}}));
        assert!(refuse_unsupported(&r).unwrap_err().message.contains("mcp"));
        assert!(e2b_name().starts_with("e2b-") && e2b_name().len() == 12);
    }

    fn lifecycle_of(body: serde_json::Value) -> ApiResult<model::Lifecycle> {
        lifecycle(&serde_json::from_value(body).unwrap())
    }

    #[test]
    fn lifecycle_follows_the_sdks_fields() {
        use model::OnTimeout::{Kill, Pause};
        let l = lifecycle_of(serde_json::json!({})).unwrap();
        assert_eq!((l.on_timeout, l.auto_resume), (Kill, false));
        let l = lifecycle_of(serde_json::json!({"autoPause": true})).unwrap();
        assert_eq!((l.on_timeout, l.auto_resume), (Pause, false));
        let body = serde_json::json!({"autoPause": true, "autoResume": {"enabled": true}});
        let l = lifecycle_of(body).unwrap();
        assert_eq!((l.on_timeout, l.auto_resume), (Pause, true));
        let l =
            lifecycle_of(serde_json::json!({"autoPause": false, "autoResume": {"enabled": false}}));
        assert_eq!(l.unwrap().on_timeout, Kill);
        for bad in [
            serde_json::json!({"autoResume": {"enabled": true}}),
            serde_json::json!({"autoPause": true, "autoResume": true}),
            serde_json::json!({"autoPauseMemory": false}),
        ] {
            assert_eq!(
                lifecycle_of(bad.clone()).unwrap_err().status.as_u16(),
                400,
                "{bad}"
            );
        }
        let full = serde_json::json!({"autoPause": true, "autoPauseMemory": true});
        assert_eq!(lifecycle_of(full).unwrap().on_timeout, Pause);
    }
}
