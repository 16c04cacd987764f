//! The node's Prometheus metrics: counters and histograms kept as claims, boots, destroys and
//! tunnels happen, and gauges (pools, sandboxes) read from the node's state when scraped.
//! Served on the node's data-plane listener (`GET /metrics`) and, for the gateway's embedded
//! node, after the gateway's own on its `/metrics`.

use std::time::Duration;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::model::{Error, Result};

/// Claim latencies, in seconds: a warm claim takes well under a millisecond, a cold one a boot.
const CLAIM_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5,
];
/// Boot durations, in seconds: tens of milliseconds on the built-in runtime, seconds on gVisor.
const BOOT_BUCKETS: [f64; 10] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// How a claim was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// Handed over from the warm pool.
    Warm,
    /// Booted for the claim (the pool was empty).
    Cold,
    Failed,
}

impl ClaimOutcome {
    fn label(self) -> &'static str {
        match self {
            ClaimOutcome::Warm => "warm",
            ClaimOutcome::Cold => "cold",
            ClaimOutcome::Failed => "failed",
        }
    }
}

/// What the node's state holds at a scrape.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Per pool: (name, warm, booting, target).
    pub pools: Vec<(String, u32, u32, u32)>,
    /// Claimed sandboxes per state (`running`, `paused`).
    pub sandboxes: Vec<(&'static str, u32)>,
}

pub struct NodeMetrics {
    registry: Registry,
    claims: IntCounterVec,
    claim_seconds: HistogramVec,
    boots: IntCounterVec,
    boot_seconds: HistogramVec,
    destroys: IntCounterVec,
    tunnel_bytes: IntCounterVec,
    pool_warm: IntGaugeVec,
    pool_booting: IntGaugeVec,
    pool_target: IntGaugeVec,
    sandboxes: IntGaugeVec,
}

fn metric_err(e: prometheus::Error) -> Error {
    Error::internal(format!("registering the node's metrics: {e}"))
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec> {
    let c = IntCounterVec::new(Opts::new(name, help), labels).map_err(metric_err)?;
    registry.register(Box::new(c.clone())).map_err(metric_err)?;
    Ok(c)
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<IntGaugeVec> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).map_err(metric_err)?;
    registry.register(Box::new(g.clone())).map_err(metric_err)?;
    Ok(g)
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
    labels: &[&str],
) -> Result<HistogramVec> {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .map_err(metric_err)?;
    registry.register(Box::new(h.clone())).map_err(metric_err)?;
    Ok(h)
}

impl NodeMetrics {
    /// The node's metrics, each labelled with the node's name so that the series of several
    /// nodes (and of a gateway's embedded one) stay apart in one Prometheus.
    pub fn new(node: &str) -> Result<Self> {
        let mut labels = std::collections::HashMap::new();
        labels.insert("node".to_string(), node.to_string());
        let registry = Registry::new_custom(None, Some(labels)).map_err(metric_err)?;
        let r = &registry;
        let m = NodeMetrics {
            claims: counter(
                r,
                "sandbox_node_claims_total",
                "Claims by pool and outcome (warm: from the pool; cold: booted for the claim)",
                &["pool", "outcome"],
            )?,
            claim_seconds: histogram(
                r,
                "sandbox_node_claim_seconds",
                "Time to serve a claim, by outcome",
                &CLAIM_BUCKETS,
                &["outcome"],
            )?,
            boots: counter(
                r,
                "sandbox_node_refill_boots_total",
                "Sandboxes booted to refill a warm pool, by pool and outcome (ok, failed)",
                &["pool", "outcome"],
            )?,
            boot_seconds: histogram(
                r,
                "sandbox_node_refill_boot_seconds",
                "Time to boot a sandbox for a warm pool, by pool",
                &BOOT_BUCKETS,
                &["pool"],
            )?,
            destroys: counter(
                r,
                "sandbox_node_destroys_total",
                "Sandbox instances destroyed, by outcome (ok, failed: left for the next start)",
                &["outcome"],
            )?,
            tunnel_bytes: counter(
                r,
                "sandbox_node_data_plane_bytes_total",
                "Bytes through the node's data-plane tunnels, by direction, counted when a tunnel closes",
                &["direction"],
            )?,
            pool_warm: gauge(
                r,
                "sandbox_node_pool_warm",
                "Warm sandboxes ready to hand over, by pool",
                &["pool"],
            )?,
            pool_booting: gauge(
                r,
                "sandbox_node_pool_booting",
                "Sandboxes booting to refill a pool, by pool",
                &["pool"],
            )?,
            pool_target: gauge(
                r,
                "sandbox_node_pool_target",
                "The number of warm sandboxes a pool is kept at",
                &["pool"],
            )?,
            sandboxes: gauge(
                r,
                "sandbox_node_sandboxes",
                "Claimed sandboxes on the node, by state",
                &["state"],
            )?,
            registry,
        };
        // Series with known labels start at zero, so that rates and `increase` see their
        // first change and a dashboard shows a flat line rather than no data.
        for outcome in ["ok", "failed"] {
            m.destroys.with_label_values(&[outcome]);
        }
        m.tunnelled(0, 0);
        Ok(m)
    }

    pub fn claimed(&self, pool: &str, outcome: ClaimOutcome, took: Duration) {
        self.claims
            .with_label_values(&[pool, outcome.label()])
            .inc();
        self.claim_seconds
            .with_label_values(&[outcome.label()])
            .observe(took.as_secs_f64());
    }

    pub fn refill_booted(&self, pool: &str, ok: bool, took: Duration) {
        let outcome = if ok { "ok" } else { "failed" };
        self.boots.with_label_values(&[pool, outcome]).inc();
        if ok {
            self.boot_seconds
                .with_label_values(&[pool])
                .observe(took.as_secs_f64());
        }
    }

    pub fn destroyed(&self, ok: bool) {
        let outcome = if ok { "ok" } else { "failed" };
        self.destroys.with_label_values(&[outcome]).inc();
    }

    /// A closed tunnel's bytes: `to` went into the sandbox, `from` came out of it.
    pub fn tunnelled(&self, to: u64, from: u64) {
        self.tunnel_bytes
            .with_label_values(&["to_sandbox"])
            .inc_by(to);
        self.tunnel_bytes
            .with_label_values(&["from_sandbox"])
            .inc_by(from);
    }

    /// The text exposition, with the gauges set from `now`. A pool that went away since the
    /// last scrape leaves no stale series.
    pub fn render(&self, now: &Snapshot) -> String {
        for g in [&self.pool_warm, &self.pool_booting, &self.pool_target] {
            g.reset();
        }
        for (pool, warm, booting, target) in &now.pools {
            self.pool_warm
                .with_label_values(&[pool])
                .set(i64::from(*warm));
            self.pool_booting
                .with_label_values(&[pool])
                .set(i64::from(*booting));
            self.pool_target
                .with_label_values(&[pool])
                .set(i64::from(*target));
        }
        self.sandboxes.reset();
        for (state, n) in &now.sandboxes {
            self.sandboxes
                .with_label_values(&[state])
                .set(i64::from(*n));
        }
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "encoding the node's metrics");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `series`, written with its labels in the order the encoder uses (the
    /// series' own, sorted, then the node's).
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit_once(' '))
            .and_then(|(_, v)| v.parse().ok())
    }

    #[test]
    fn counts_and_gauges_carry_the_node_and_their_labels() {
        let m = NodeMetrics::new("n1").expect("metrics");
        m.claimed(
            "base/egress/small",
            ClaimOutcome::Warm,
            Duration::from_micros(300),
        );
        m.claimed(
            "base/egress/small",
            ClaimOutcome::Warm,
            Duration::from_micros(300),
        );
        m.claimed(
            "base/egress/small",
            ClaimOutcome::Cold,
            Duration::from_millis(30),
        );
        m.refill_booted("base/egress/small", true, Duration::from_millis(30));
        m.refill_booted("base/egress/small", false, Duration::from_millis(5));
        m.destroyed(true);
        m.tunnelled(10, 20);
        let text = m.render(&Snapshot {
            pools: vec![("base/egress/small".into(), 3, 1, 4)],
            sandboxes: vec![("running", 2), ("paused", 1)],
        });
        let pool = "pool=\"base/egress/small\"";
        assert_eq!(
            sample(
                &text,
                &format!("sandbox_node_claims_total{{outcome=\"warm\",{pool},node=\"n1\"}}")
            ),
            Some(2.0),
            "{text}"
        );
        assert_eq!(
            sample(
                &text,
                &format!("sandbox_node_pool_warm{{{pool},node=\"n1\"}}")
            ),
            Some(3.0)
        );
        assert_eq!(
            sample(
                &text,
                "sandbox_node_sandboxes{state=\"paused\",node=\"n1\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "sandbox_node_data_plane_bytes_total{direction=\"from_sandbox\",node=\"n1\"}"
            ),
            Some(20.0)
        );
        assert_eq!(
            sample(
                &text,
                &format!(
                    "sandbox_node_refill_boots_total{{outcome=\"failed\",{pool},node=\"n1\"}}"
                )
            ),
            Some(1.0)
        );
    }

    #[test]
    fn a_pool_gone_since_the_last_scrape_leaves_no_series() {
        let m = NodeMetrics::new("n1").expect("metrics");
        let before = m.render(&Snapshot {
            pools: vec![("old".into(), 1, 0, 1)],
            sandboxes: vec![],
        });
        assert!(before.contains("pool=\"old\""));
        let after = m.render(&Snapshot::default());
        assert!(!after.contains("pool=\"old\""), "{after}");
    }
}
