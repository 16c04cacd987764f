//! Churn: create, use and kill sandboxes in cycles at a fixed concurrency, alternating the two
//! gateway replicas and the two surfaces (an e2b cycle creates, runs a command through the
//! data plane and kills; a Kubernetes cycle creates, reads and deletes), while the fleet's
//! memory is sampled against the cycles done.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::{Res, Summary, summarize};
use crate::envd::{Envd, Via};
use crate::fleet::{Fleet, Footprint, rss_kib};

pub struct ChurnRun {
    pub cycles: usize,
    pub concurrency: usize,
    pub took: Duration,
    pub latency: Summary,
    /// Failed cycles by what the client saw.
    pub errors: BTreeMap<String, usize>,
    /// The first failures, each with its cycle and the whole message.
    pub failures: Vec<(usize, String)>,
    /// Why the fleet did not settle after the churn (what stayed claimed), if it did not.
    pub unsettled: Option<String>,
    pub before: Footprint,
    pub after: Footprint,
    /// Per process: RSS at the start and the end (KiB), and the fitted slope in KiB per
    /// 1000 cycles over the run's second half.
    pub memory: Vec<(String, u64, u64, f64)>,
    /// Per gateway: the cycle from which its read view held a full window of changes
    /// (`read_view::HISTORY`), and the RSS slope from there on (None if the run ended first).
    pub windowed: Vec<Option<(usize, f64)>>,
}

/// Failures kept whole for the report.
const KEPT_FAILURES: usize = 20;

const KUBE: &str = "/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes";

/// A gateway's read-view revision, a list's `resourceVersion`: it starts from a base chosen
/// at the gateway's start and counts every change after (0 when the list fails; the sampler
/// tries again).
async fn revision(fleet: &Fleet, gw: usize) -> u64 {
    let Some(base) = fleet.gateways[gw].kube_address.as_ref() else {
        return 0;
    };
    let listed = async {
        let r = fleet.https[gw]
            .get(format!("{base}{KUBE}?limit=1"))
            .bearer_auth(crate::KEY)
            .send()
            .await?;
        let v: serde_json::Value = r.json().await?;
        Res::Ok(
            v["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
        )
    };
    listed.await.unwrap_or(0)
}

/// The slope of RSS (column `j`) over the samples from the first one in which gateway `gw`
/// had seen `window` changes since the first sample, with that sample's cycle; None if fewer
/// than 10 samples follow.
fn windowed_slope(samples: &[Sample], gw: usize, j: usize, window: u64) -> Option<(usize, f64)> {
    let base = samples.iter().map(|s| s.revisions[gw]).find(|r| *r > 0)?;
    let from = samples
        .iter()
        .position(|s| s.revisions[gw].saturating_sub(base) >= window)?;
    let points: Vec<(f64, f64)> = samples[from..]
        .iter()
        .map(|s| (s.done as f64, s.rss[j] as f64))
        .collect();
    (points.len() >= 10).then(|| (samples[from].done, slope_per_1000(&points)))
}

/// What the sampler saw at one moment: cycles done, each process's RSS (KiB), each gateway's
/// view revision.
struct Sample {
    done: usize,
    rss: Vec<u64>,
    revisions: Vec<u64>,
}

async fn e2b_cycle(fleet: &Fleet, gw: usize, i: usize) -> Res<()> {
    let url = &fleet.gateways[gw].address;
    let created = crate::create_tagged(&fleet.http, url, &format!("cycle {i}")).await?;
    let outcome = async {
        let mut envd = Envd::new(Via::Gateway {
            addr: url.trim_start_matches("http://").to_string(),
            id: created.0.clone(),
            token: created.1.clone(),
        });
        let ran = envd.run(&format!("echo {i}")).await?;
        if ran.exit_code != 0 || ran.stdout != format!("{i}\n").as_bytes() {
            return Err(format!(
                "command answered {} {:?}",
                ran.exit_code,
                String::from_utf8_lossy(&ran.stdout)
            )
            .into());
        }
        Res::Ok(())
    }
    .await;
    let killed = fleet
        .http
        .delete(format!("{url}/sandboxes/{}", created.0))
        .header("X-API-KEY", crate::KEY)
        .send()
        .await?;
    outcome?;
    if killed.status() != 204 {
        return Err(format!("kill answered {}", killed.status()).into());
    }
    Ok(())
}

async fn kube_cycle(fleet: &Fleet, gw: usize, i: usize) -> Res<()> {
    let base = fleet.gateways[gw]
        .kube_address
        .clone()
        .ok_or("no Kubernetes listener")?;
    let https = &fleet.https[gw];
    let name = format!("soak-{i}");
    let body = serde_json::json!({"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
        "metadata": {"name": name, "annotations": {"sandbox.cocoonstack.io/net": "egress"}},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "base"}]}}}});
    let r = https
        .post(format!("{base}{KUBE}"))
        .bearer_auth(crate::KEY)
        .json(&body)
        .send()
        .await?;
    if r.status() != 201 {
        return Err(answered("kube create", r).await);
    }
    let got = https
        .get(format!("{base}{KUBE}/{name}"))
        .bearer_auth(crate::KEY)
        .send()
        .await?;
    let read = if got.status() == 200 {
        None
    } else {
        Some(answered("kube get", got).await)
    };
    let deleted = https
        .delete(format!("{base}{KUBE}/{name}"))
        .bearer_auth(crate::KEY)
        .send()
        .await?;
    if let Some(e) = read {
        return Err(e);
    }
    if deleted.status() != 200 {
        return Err(answered("kube delete", deleted).await);
    }
    Ok(())
}

/// "`what` answered STATUS: message", from a Kubernetes Status body.
async fn answered(what: &str, r: reqwest::Response) -> Box<dyn std::error::Error + Send + Sync> {
    let status = r.status();
    let body: serde_json::Value = r.json().await.unwrap_or_default();
    format!("{what} answered {status}: {}", body["message"]).into()
}

/// An error with its causes ("a: b: c"), which reqwest keeps out of its message.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// A short label for an error, so that counts group.
fn kind(e: &str) -> String {
    // Ids would make every error its own group: cut them out.
    e.split_whitespace()
        .filter(|w| !w.contains("sb-") && !w.contains("sb_") && !w.contains("in_"))
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(200)
        .collect()
}

/// Least-squares slope of `y` over `x`, scaled to per-1000 `x`.
pub fn slope_per_1000(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
        (a + (x - mx) * (y - my), b + (x - mx) * (x - mx))
    });
    if den == 0.0 { 0.0 } else { num / den * 1000.0 }
}

pub async fn churn(fleet: Arc<Fleet>, cycles: usize, concurrency: usize) -> Res<ChurnRun> {
    let before = fleet.footprint();
    let procs = fleet.processes();
    let start_rss: Vec<u64> = procs.iter().map(|(_, p)| rss_kib(*p)).collect();
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let sampler = {
        let (done, procs, fleet) = (done.clone(), procs.clone(), fleet.clone());
        tokio::spawn(async move {
            let mut samples: Vec<Sample> = Vec::new();
            loop {
                let d = done.load(Ordering::Relaxed);
                let rss = procs.iter().map(|(_, p)| rss_kib(*p)).collect();
                let mut revisions = Vec::new();
                for gw in 0..fleet.gateways.len() {
                    revisions.push(revision(&fleet, gw).await);
                }
                samples.push(Sample {
                    done: d,
                    rss,
                    revisions,
                });
                if d >= cycles {
                    return samples;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (fleet, next, done) = (fleet.clone(), next.clone(), done.clone());
        workers.spawn(async move {
            let mut latency = Vec::new();
            let mut errors: BTreeMap<String, usize> = BTreeMap::new();
            let mut failures = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= cycles {
                    return (latency, errors, failures);
                }
                let gw = i % crate::fleet::GATEWAYS;
                let t = Instant::now();
                // Alternate surfaces on every other pair, so both gateways serve both.
                let outcome = if (i / 2) % 2 == 0 {
                    e2b_cycle(&fleet, gw, i).await
                } else {
                    kube_cycle(&fleet, gw, i).await
                };
                latency.push(t.elapsed());
                if let Err(e) = outcome {
                    *errors.entry(kind(&e.to_string())).or_default() += 1;
                    if failures.len() < KEPT_FAILURES {
                        failures.push((i, chain(e.as_ref())));
                    }
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    let mut latency = Vec::new();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    while let Some(w) = workers.join_next().await {
        let (l, e, f) = w?;
        latency.extend(l);
        failures.extend(f);
        for (k, n) in e {
            *errors.entry(k).or_default() += n;
        }
    }
    let took = started.elapsed();
    let samples = sampler.await?;
    failures.sort();
    failures.truncate(KEPT_FAILURES);
    // A fleet that does not settle is reported with the rest, not instead of it.
    let unsettled = fleet
        .settle(Duration::from_secs(120))
        .await
        .err()
        .map(|e| e.to_string());
    // Give the processes a moment to close what the last requests opened (up to 10 s: a
    // descriptor still open then is kept, and judged).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut after = fleet.footprint();
    let until = Instant::now() + Duration::from_secs(10);
    while after.own_fds() != before.own_fds() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(500)).await;
        after = fleet.footprint();
    }
    let half = cycles / 2;
    let memory = procs
        .iter()
        .enumerate()
        .map(|(j, (label, pid))| {
            let points: Vec<(f64, f64)> = samples
                .iter()
                .filter(|s| s.done >= half)
                .map(|s| (s.done as f64, s.rss[j] as f64))
                .collect();
            (
                label.clone(),
                start_rss[j],
                rss_kib(*pid),
                slope_per_1000(&points),
            )
        })
        .collect();
    // Gateways come first in `procs`.
    let window = sandbox_gateway::dispatch::read_view::HISTORY as u64;
    let windowed = (0..fleet.gateways.len())
        .map(|gw| windowed_slope(&samples, gw, gw, window))
        .collect();
    Ok(ChurnRun {
        cycles,
        concurrency,
        took,
        latency: summarize(latency),
        errors,
        failures,
        unsettled,
        before,
        after,
        memory,
        windowed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slopes_fit_a_line() {
        let flat: Vec<(f64, f64)> = (0..10).map(|i| (i as f64 * 100.0, 50.0)).collect();
        assert_eq!(slope_per_1000(&flat), 0.0);
        let rising: Vec<(f64, f64)> = (0..10).map(|i| (i as f64 * 100.0, i as f64)).collect();
        assert!((slope_per_1000(&rising) - 10.0).abs() < 1e-9);
    }

    #[test]
    fn the_windowed_slope_starts_where_the_window_is_full() {
        // RSS rises until the revision reaches the window, then stays flat.
        let samples: Vec<Sample> = (0..40)
            .map(|i| Sample {
                done: i * 100,
                rss: vec![(i.min(20) * 10) as u64],
                revisions: vec![1_000_000 + i as u64 * 50],
            })
            .collect();
        assert_eq!(windowed_slope(&samples, 0, 0, 1000), Some((2000, 0.0)));
        // A window never reached, or reached too late to fit, gives no slope.
        assert_eq!(windowed_slope(&samples, 0, 0, 5000), None);
        assert_eq!(windowed_slope(&samples, 0, 0, 1900), None);
        // A failed read (0) counts neither as the base nor as the window reached.
        let mut failed = samples;
        failed[0].revisions[0] = 0;
        failed[25].revisions[0] = 0;
        assert_eq!(windowed_slope(&failed, 0, 0, 950), Some((2000, 0.0)));
    }
}
