//! Metric routes: one sandbox's current measurement (`GET /sandboxes/{id}/metrics`) and a
//! batch of them (`GET /sandboxes/metrics`), as the nodes measure them.

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};

use super::auth::Tenant;
use super::error::{ApiError, ApiResult, ErrorBody};
use super::listing::query_value;
use super::render::{self, ok_json};
use super::{E2b, wire};
use crate::model;

type Data = web::Data<E2b>;

fn within(q: &[(String, String)], now: i64) -> ApiResult<bool> {
    let bound = |name: &str| -> ApiResult<Option<i64>> {
        query_value(q, name)
            .map(|v| {
                v.parse::<i64>().map_err(|_| {
                    ApiError::bad_request(format!("{name} must be a Unix time in seconds"))
                })
            })
            .transpose()
    };
    let (start, end) = (bound("start")?, bound("end")?);
    // Clients round their bounds to whole seconds; a second of slack keeps a sample taken in
    // the same second as a bound.
    // Saturating: any i64 is a valid bound to ask for (`end=9223372036854775807` overflowed).
    Ok(start.is_none_or(|s| s <= now.saturating_add(1))
        && end.is_none_or(|e| now <= e.saturating_add(1)))
}

#[utoipa::path(get, path = "/sandboxes/{sandboxID}/metrics", tag = "sandboxes",
    params(("sandboxID" = String, Path), ("start" = Option<i64>, Query), ("end" = Option<i64>, Query)),
    responses((status = 200, body = [wire::SandboxMetric], description = "the current measurement"),
        (status = 404, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn metrics(
    e2b: Data,
    tenant: Tenant,
    id: web::Path<String>,
    q: web::Query<Vec<(String, String)>>,
) -> ApiResult<HttpResponse> {
    let stats = e2b.dispatcher.stats(tenant.scope(), &id).await?;
    let samples = if within(&q, stats.measured_at.timestamp())? {
        vec![render::metric(&stats)]
    } else {
        Vec::new()
    };
    Ok(ok_json(StatusCode::OK, &samples))
}

/// Most sandboxes one batch metrics call may name.
pub const MAX_METRICS_IDS: usize = 100;

#[utoipa::path(get, path = "/sandboxes/metrics", tag = "sandboxes",
    params(("sandbox_ids" = String, Query, description = "comma-separated, at most 100")),
    responses((status = 200, body = wire::SandboxesWithMetrics), (status = 400, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn metrics_batch(
    e2b: Data,
    tenant: Tenant,
    q: web::Query<Vec<(String, String)>>,
) -> ApiResult<HttpResponse> {
    let ids: Vec<&str> = q
        .iter()
        .filter(|(k, _)| k == "sandbox_ids")
        .flat_map(|(_, v)| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if ids.is_empty() {
        return Err(ApiError::bad_request("sandbox_ids is required"));
    }
    if ids.len() > MAX_METRICS_IDS {
        return Err(ApiError::bad_request(format!(
            "at most {MAX_METRICS_IDS} sandbox_ids, got {}",
            ids.len()
        )));
    }
    let asks = ids.iter().map(|id| {
        let d = &e2b.dispatcher;
        let scope = tenant.scope();
        async move { (id.to_string(), d.stats(scope, id).await) }
    });
    let mut sandboxes = BTreeMap::new();
    for (id, r) in futures::future::join_all(asks).await {
        match r {
            Ok(s) => {
                sandboxes.insert(id, render::metric(&s));
            }
            Err(e) if e.kind == model::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(ok_json(
        StatusCode::OK,
        &wire::SandboxesWithMetrics { sandboxes },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by tests/schema_fuzz.rs: `end=i64::MAX` on the metrics route panicked.
    #[test]
    fn metric_bounds_may_be_any_integer() {
        let q = |pairs: &[(&str, i64)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let now = 1_800_000_000;
        assert!(within(&q(&[("start", i64::MIN), ("end", i64::MAX)]), now).unwrap_or(false));
        assert!(!within(&q(&[("end", i64::MIN)]), now).unwrap_or(true));
        assert!(!within(&q(&[("start", i64::MAX)]), now).unwrap_or(true));
        assert!(within(&q(&[("start", now)]), i64::MAX).unwrap_or(false));
    }
}
