//! Request logs with a request id, and Prometheus metrics by route and status.

use std::sync::Arc;
use std::time::Instant;

use actix_web::Error;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use tracing::Instrument;

use std::collections::BTreeMap;

use crate::dispatch::Dispatcher;
use crate::httpx::Passthrough;
use crate::model::sandbox::split_claim_ref;
use crate::model::{Error as ModelError, Result, ids};
use crate::node::Node;
use crate::node::runtime::any::AnyRuntime;

pub const REQUEST_ID: &str = "x-request-id";

pub type Observed<B> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<ServiceResponse<B>, Error>>>>;

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
    nodes_up: IntGauge,
    nodes_known: IntGauge,
    warm: IntGaugeVec,
    sandboxes: IntGauge,
    sandboxes_by: IntGaugeVec,
    data_plane_bytes: IntCounterVec,
    /// The embedded node, whose metrics follow the gateway's.
    node: Option<Node<AnyRuntime>>,
}

fn metric_err(e: prometheus::Error) -> ModelError {
    ModelError::internal(format!("registering metrics: {e}"))
}

impl Metrics {
    pub fn new(node: Option<Node<AnyRuntime>>) -> Result<Arc<Self>> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "sandbox_gateway_http_requests_total",
                "HTTP requests by surface, route, method and status",
            ),
            &["surface", "route", "method", "status"],
        )
        .map_err(metric_err)?;
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "sandbox_gateway_http_request_seconds",
                "HTTP request latency",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
            ]),
            &["surface", "route", "method"],
        )
        .map_err(metric_err)?;
        let nodes_up = IntGauge::new("sandbox_gateway_nodes_up", "Nodes answering the dispatcher")
            .map_err(metric_err)?;
        let nodes_known = IntGauge::new(
            "sandbox_gateway_nodes_known",
            "Nodes the dispatcher routes to (configured or discovered), answering or not",
        )
        .map_err(metric_err)?;
        let warm = IntGaugeVec::new(
            Opts::new(
                "sandbox_gateway_warm_sandboxes",
                "Warm sandboxes by pool across the fleet",
            ),
            &["pool"],
        )
        .map_err(metric_err)?;
        let sandboxes = IntGauge::new(
            "sandbox_gateway_sandboxes",
            "Claimed sandboxes in the read view",
        )
        .map_err(metric_err)?;
        let sandboxes_by = IntGaugeVec::new(
            Opts::new(
                "sandbox_gateway_sandboxes_by_state",
                "Claimed sandboxes in the read view by state and team",
            ),
            &["state", "team"],
        )
        .map_err(metric_err)?;
        let data_plane_bytes = IntCounterVec::new(
            Opts::new(
                "sandbox_gateway_data_plane_bytes_total",
                "Bytes the data plane moved into and out of sandboxes (HTTP bodies and upgraded streams)",
            ),
            &["direction"],
        )
        .map_err(metric_err)?;
        for direction in ["to_sandbox", "from_sandbox"] {
            data_plane_bytes.with_label_values(&[direction]);
        }
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(sandboxes_by.clone()),
            Box::new(data_plane_bytes.clone()),
            Box::new(latency.clone()),
            Box::new(nodes_up.clone()),
            Box::new(nodes_known.clone()),
            Box::new(warm.clone()),
            Box::new(sandboxes.clone()),
        ] {
            registry.register(c).map_err(metric_err)?;
        }
        Ok(Arc::new(Metrics {
            registry,
            requests,
            latency,
            nodes_up,
            nodes_known,
            warm,
            sandboxes,
            sandboxes_by,
            data_plane_bytes,
            node,
        }))
    }

    /// The counters the data plane adds its bytes to.
    pub fn data_plane_bytes(&self) -> &IntCounterVec {
        &self.data_plane_bytes
    }

    fn observe(&self, surface: &str, route: &str, method: &str, status: u16, seconds: f64) {
        self.requests
            .with_label_values(&[surface, route, method, &status.to_string()])
            .inc();
        self.latency
            .with_label_values(&[surface, route, method])
            .observe(seconds);
    }

    /// The text exposition, with fleet gauges read at scrape time; sandboxes by team only
    /// when `tenants` (an admin's scrape).
    pub fn render(&self, dispatcher: &Dispatcher, tenants: bool) -> String {
        let nodes = dispatcher.nodes();
        self.nodes_up
            .set(nodes.iter().filter(|n| n.up).count() as i64);
        self.nodes_known.set(nodes.len() as i64);
        self.warm.reset();
        for (key, (warm, _)) in dispatcher.pools() {
            self.warm
                .with_label_values(&[&key.to_string()])
                .set(i64::from(warm));
        }
        self.sandboxes.set(dispatcher.view().len() as i64);
        let mut by: BTreeMap<(&'static str, String), i64> = BTreeMap::new();
        if tenants {
            let (entries, _) = dispatcher.view().all_entries();
            for e in entries.iter() {
                let team = split_claim_ref(&e.record.claim_ref).0.to_string();
                *by.entry((e.record.phase.as_str(), team)).or_default() += 1;
            }
        }
        self.sandboxes_by.reset();
        for ((state, team), n) in by {
            self.sandboxes_by.with_label_values(&[state, &team]).set(n);
        }
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "encoding metrics");
        }
        let mut text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(node) = &self.node {
            text.push_str(&node.metrics_text());
        }
        text
    }
}

fn request_id(req: &ServiceRequest) -> String {
    req.headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
        .unwrap_or_else(|| ids::random_hex(8))
}

/// Wraps a surface's service: one log line per request with its id, the id echoed in the
/// response, and the request counted and timed by route pattern (never by raw path, which
/// would make one series per sandbox).
pub fn observed<S, B>(
    metrics: Arc<Metrics>,
    surface: &'static str,
) -> impl Fn(ServiceRequest, &S) -> Observed<B> + Clone
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error>,
    S::Future: 'static,
    B: 'static,
{
    move |req: ServiceRequest, srv: &S| {
        let id = request_id(&req);
        let route = req
            .match_pattern()
            .unwrap_or_else(|| "unmatched".to_string());
        let method = method_label(req.method());
        let raw_method = req.method().clone();
        let path = req.path().to_string();
        let start = Instant::now();
        let span = tracing::info_span!("request", id = %id);
        let fut = {
            let _enter = span.enter();
            srv.call(req)
        };
        let metrics = metrics.clone();
        Box::pin(
            async move {
                let mut res = fut.await?;
                let status = res.status().as_u16();
                // A sandbox's answer through the data plane is not one of the gateway's routes.
                let route = if res.response().extensions().contains::<Passthrough>() {
                    "data-plane".to_string()
                } else {
                    route
                };
                let took = start.elapsed();
                if let Ok(v) = HeaderValue::from_str(&id) {
                    res.headers_mut()
                        .insert(HeaderName::from_static(REQUEST_ID), v);
                }
                metrics.observe(surface, &route, method, status, took.as_secs_f64());
                tracing::info!(method = %raw_method, %path, status, ms = took.as_secs_f64() * 1000.0, "request");
                Ok(res)
            }
            .instrument(span),
        )
    }
}

/// A request's method as a metrics label: the standard ones by name, any other as "other".
/// A client may send any token as a method, and a label set per token would grow the
/// registry, which keeps every set it has seen, without bound.
fn method_label(m: &actix_web::http::Method) -> &'static str {
    use actix_web::http::Method;
    const KNOWN: [(Method, &str); 9] = [
        (Method::GET, "GET"),
        (Method::POST, "POST"),
        (Method::PUT, "PUT"),
        (Method::PATCH, "PATCH"),
        (Method::DELETE, "DELETE"),
        (Method::HEAD, "HEAD"),
        (Method::OPTIONS, "OPTIONS"),
        (Method::TRACE, "TRACE"),
        (Method::CONNECT, "CONNECT"),
    ];
    KNOWN
        .iter()
        .find(|(k, _)| k == m)
        .map_or("other", |(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::Method;

    #[test]
    fn methods_outside_the_standard_ones_share_one_label() {
        assert_eq!(method_label(&Method::GET), "GET");
        assert_eq!(method_label(&Method::PATCH), "PATCH");
        for odd in [&b"FOO"[..], b"get", b"PROPFIND", b"X-1234567890"] {
            let m = Method::from_bytes(odd).expect("a token is a method");
            assert_eq!(method_label(&m), "other", "{m}");
        }
    }
}
