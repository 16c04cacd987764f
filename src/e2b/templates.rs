//! `GET /templates` and `/v2/templates`: the templates the nodes advertise.

use std::collections::BTreeMap;

use actix_web::{HttpResponse, web};

use super::auth::Tenant;
use super::error::{ApiResult, ErrorBody};
use super::{E2b, wire};
use crate::agent::ENVD_VERSION;
use crate::model::pool::size_tier;

const MIB: u64 = 1024 * 1024;

/// One entry per template any reachable node offers. Size is the smallest pool size the
/// fleet keeps warm for it; counts and times are the nodes' own.
pub fn templates(e2b: &E2b) -> Vec<wire::Template> {
    let mut out: BTreeMap<String, wire::Template> = BTreeMap::new();
    for node in e2b.dispatcher.nodes().into_iter().filter(|n| n.up) {
        let Some(info) = node.info else { continue };
        for name in &info.templates {
            let sizes = info.pools.iter().filter(|p| &p.key.template == name);
            let tier = sizes
                .filter_map(|p| size_tier(&p.key.size))
                .min_by_key(|t| t.memory_bytes)
                .or_else(|| size_tier("small"));
            let (cpu, mem) = tier.map_or((1, 512 * MIB), |t| (t.cpu_count, t.memory_bytes));
            let usage = info.usage.iter().find(|u| &u.template == name);
            let e = out.entry(name.clone()).or_insert_with(|| wire::Template {
                template_id: name.clone(),
                build_id: name.clone(),
                cpu_count: cpu,
                memory_mb: mem / MIB,
                disk_size_mb: info.disk_bytes / MIB,
                public: true,
                aliases: Vec::new(),
                names: vec![name.clone()],
                created_at: info.started_at,
                updated_at: info.started_at,
                created_by: None,
                last_spawned_at: None,
                spawn_count: 0,
                build_count: 1,
                envd_version: ENVD_VERSION.to_string(),
                build_status: "ready",
            });
            e.created_at = e.created_at.min(info.started_at);
            e.updated_at = e.updated_at.max(info.started_at);
            if let Some(u) = usage {
                e.spawn_count += u.claims;
                e.last_spawned_at = e.last_spawned_at.max(u.last_claim);
            }
        }
    }
    out.into_values().collect()
}

#[utoipa::path(get, path = "/templates", tag = "templates",
    responses((status = 200, body = [wire::Template]), (status = 401, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn list(e2b: web::Data<E2b>, _tenant: Tenant) -> ApiResult<HttpResponse> {
    Ok(HttpResponse::Ok().json(templates(&e2b)))
}

#[utoipa::path(get, path = "/v2/templates", tag = "templates",
    responses((status = 200, body = [wire::Template]), (status = 401, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn list_v2(e2b: web::Data<E2b>, _tenant: Tenant) -> ApiResult<HttpResponse> {
    Ok(HttpResponse::Ok().json(templates(&e2b)))
}
