//! `GET /templates` and `/v2/templates`: the templates the nodes advertise.

use std::collections::BTreeMap;

use actix_web::{HttpResponse, web};

use super::auth::Tenant;
use super::error::{ApiResult, ErrorBody};
use super::{E2b, wire};
use crate::agent::ENVD_VERSION;
use crate::model::pool::size_tier;

const MIB: u64 = 1024 * 1024;

/// One entry per template any reachable node offers, with its size and packages. CPU and
/// memory are the smallest pool size the fleet keeps warm for it; counts and times are the
/// nodes' own.
pub fn templates(e2b: &E2b) -> Vec<wire::Template> {
    let mut out: BTreeMap<String, wire::Template> = BTreeMap::new();
    for node in e2b.dispatcher.nodes().into_iter().filter(|n| n.up) {
        let Some(info) = node.info else { continue };
        // Built templates are listed from their records, by team.
        let built: Vec<&String> = info
            .template_info
            .iter()
            .filter(|t| !t.owner.is_empty())
            .map(|t| &t.name)
            .collect();
        for name in info.templates.iter().filter(|n| !built.contains(n)) {
            let sizes = info.pools.iter().filter(|p| &p.key.template == name);
            let tier = sizes
                .filter_map(|p| size_tier(&p.key.size))
                .min_by_key(|t| t.memory_bytes)
                .or_else(|| size_tier("small"));
            let (cpu, mem) = tier.map_or((1, 512 * MIB), |t| (t.cpu_count, t.memory_bytes));
            let usage = info.usage.iter().find(|u| &u.template == name);
            let described = info.template_info.iter().find(|t| &t.name == name);
            let built = described
                .and_then(|t| t.created_at)
                .unwrap_or(info.started_at);
            let e = out.entry(name.clone()).or_insert_with(|| wire::Template {
                template_id: name.clone(),
                build_id: name.clone(),
                cpu_count: cpu,
                memory_mb: mem / MIB,
                disk_size_mb: tier.map_or(info.disk_bytes, |t| t.disk_bytes) / MIB,
                public: true,
                aliases: described.map(|t| t.aliases.clone()).unwrap_or_default(),
                names: std::iter::once(name.clone())
                    .chain(
                        described
                            .into_iter()
                            .flat_map(|t| t.aliases.iter().cloned()),
                    )
                    .collect(),
                created_at: built,
                updated_at: built,
                created_by: None,
                last_spawned_at: None,
                spawn_count: 0,
                build_count: 1,
                envd_version: ENVD_VERSION.to_string(),
                build_status: "ready",
                size_bytes: described.map_or(0, |t| t.size_bytes),
                packages: described.map(|t| t.packages.clone()).unwrap_or_default(),
                kind: described.map(|t| t.kind.clone()).unwrap_or_default(),
                captures_memory: info.captures_memory,
            });
            e.created_at = e.created_at.min(built);
            e.updated_at = e.updated_at.max(built);
            if let Some(u) = usage {
                e.spawn_count += u.claims;
                e.last_spawned_at = e.last_spawned_at.max(u.last_claim);
            }
        }
    }
    out.into_values().collect()
}

// Named for what they list: `list_v2` is the sandbox listing's, and operation ids are unique.
#[utoipa::path(get, path = "/templates", tag = "templates", operation_id = "list_templates",
    responses((status = 200, body = [wire::Template]), (status = 401, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn list(e2b: web::Data<E2b>, tenant: Tenant) -> ApiResult<HttpResponse> {
    Ok(HttpResponse::Ok().json(with_built(&e2b, &tenant).await))
}

/// The nodes' own templates, then the team's built ones (and others' public ones).
async fn with_built(e2b: &E2b, tenant: &Tenant) -> Vec<wire::Template> {
    let mut out: Vec<wire::Template> = templates(e2b)
        .into_iter()
        .filter(|t| !t.kind.eq_ignore_ascii_case("built"))
        .collect();
    for v in e2b.dispatcher.list_built(&tenant.namespace).await {
        out.push(super::template_admin::listed(&v, &v.record.team));
    }
    out
}

#[utoipa::path(get, path = "/v2/templates", tag = "templates", operation_id = "list_templates_v2",
    responses((status = 200, body = [wire::Template]), (status = 401, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn list_v2(e2b: web::Data<E2b>, tenant: Tenant) -> ApiResult<HttpResponse> {
    Ok(HttpResponse::Ok().json(with_built(&e2b, &tenant).await))
}
