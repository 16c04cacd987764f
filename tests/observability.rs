//! What operators watch the system with, in deploy/: the Prometheus alert rules and the Grafana
//! dashboard. Debian's `promtool` checks the rules and runs their unit tests
//! (deploy/prometheus/alerts.test.yaml: each alert fires on the series that should raise it
//! and not on the others), and parses every PromQL expression of the dashboard; every metric
//! they name must be exported by a live gateway (with its embedded node) after real creates,
//! commands and kills, and a standalone node serves its own on its data-plane listener. The
//! dashboard's layout is checked too (ids, grid, data source, variables), and the dashboard is
//! type-checked against Grafana's own schema: the TypeScript types `@grafana/schema` 13.2.3
//! generates from Grafana's CUE schema, with TypeScript's compiler (both from npm, in
//! tests/e2b/js), so an unknown field or a wrong type fails.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::gateway::{Gateway, KEY_A};
use common::*;
use serde_json::{Value, json};

fn promtool(args: &[&str], dir: &Path) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool runs (Debian's `promtool`; .ci/run installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

fn dashboard() -> Value {
    let path = repo().join("deploy/grafana/sandbox-gateway.json");
    serde_json::from_str(&std::fs::read_to_string(&path).expect("the dashboard")).expect("JSON")
}

/// Every target expression of the dashboard's panels.
fn dashboard_exprs(d: &Value) -> Vec<String> {
    d["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().expect("a target's expr").to_string())
        .collect()
}

/// The metric families an expression names (a histogram's `_bucket` series by its family).
fn families(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("sandbox_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        let name = &expr[start..end];
        // A name, not part of a longer identifier or of a label value.
        let before = start.checked_sub(1).map(|b| bytes[b]);
        if !before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'"') {
            out.insert(name.strip_suffix("_bucket").unwrap_or(name).to_string());
        }
        i = end.max(start + 1);
    }
    out
}

/// The value of the first series of `family` carrying all of `labels`, in any order.
fn value(text: &str, family: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(family)?.strip_prefix('{')?;
        let (set, v) = rest.rsplit_once("} ")?;
        let pairs: Vec<&str> = set.split(',').collect();
        labels
            .iter()
            .all(|(k, want)| pairs.contains(&format!("{k}=\"{want}\"").as_str()))
            .then(|| v.trim().parse().ok())?
    })
}

/// The families a scrape has (`# TYPE` lines).
fn exported_families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect()
}

/// /metrics as Prometheus scrapes it with a bearer credential.
async fn scrape(gw: &Gateway, key: &str) -> String {
    gw.http
        .get(format!("{}/metrics", gw.url))
        .bearer_auth(key)
        .send()
        .await
        .expect("a scrape")
        .text()
        .await
        .expect("the text")
}

#[test]
fn alert_rules_pass_promtool_and_their_unit_tests() {
    let dir = repo().join("deploy/prometheus");
    let checked = promtool(&["check", "rules", "alerts.yaml"], &dir);
    assert!(checked.contains("SUCCESS: 7 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "alerts.test.yaml"], &dir);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn the_dashboard_is_laid_out_soundly_and_its_queries_parse() {
    let d = dashboard();
    assert_eq!(d["uid"], "sandbox-gateway");
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .expect("variables")
        .iter()
        .map(|v| v["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(vars, ["datasource", "instance", "node"]);
    let panels = d["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    let mut cells = BTreeSet::new();
    for p in panels {
        assert!(
            ids.insert(p["id"].as_u64().expect("an id")),
            "id repeats: {p}"
        );
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().expect("x"),
            g["y"].as_u64().expect("y"),
            g["w"].as_u64().expect("w"),
            g["h"].as_u64().expect("h"),
        );
        assert!(
            w > 0 && h > 0 && x + w <= 24,
            "{} overflows the grid",
            p["title"]
        );
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(
                    cells.insert((cx, cy)),
                    "{} overlaps another panel",
                    p["title"]
                );
            }
        }
        if p["type"] == "row" {
            continue;
        }
        assert!(
            ["timeseries", "stat"].contains(&p["type"].as_str().unwrap_or_default()),
            "{}",
            p["type"]
        );
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        assert!(
            !p["targets"].as_array().expect("targets").is_empty(),
            "{} has no query",
            p["title"]
        );
    }
    // promtool parses each query as a recording rule, with Grafana's variables as they expand.
    let rules: Vec<Value> = dashboard_exprs(&d)
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let expr = e
                .replace("$__rate_interval", "5m")
                .replace("$instance", ".*")
                .replace("$node", ".*");
            json!({"record": format!("dashboard:query_{i}"), "expr": expr})
        })
        .collect();
    let tmp = tempfile::tempdir().expect("tmp");
    let file = tmp.path().join("dashboard-queries.yaml");
    let doc = json!({"groups": [{"name": "dashboard", "rules": rules}]});
    std::fs::write(&file, serde_json::to_string(&doc).expect("json")).expect("write");
    let checked = promtool(&["check", "rules", "dashboard-queries.yaml"], tmp.path());
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", rules.len())),
        "{checked}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_alerts_name_is_exported() {
    let mut named = BTreeSet::new();
    for e in dashboard_exprs(&dashboard()) {
        named.extend(families(&e));
    }
    let alerts = std::fs::read_to_string(repo().join("deploy/prometheus/alerts.yaml"))
        .expect("the alert rules");
    let from_alerts: BTreeSet<String> = alerts
        .lines()
        .filter(|l| l.trim_start().starts_with("expr:") || l.starts_with("          "))
        .flat_map(families)
        .collect();
    assert!(
        from_alerts.contains("sandbox_node_pool_warm"),
        "{from_alerts:?}"
    );
    named.extend(from_alerts);
    assert!(named.len() >= 15, "{named:?}");

    let tmp = tempfile::tempdir().expect("tmp");
    let gw = Gateway::start(tmp.path(), &["--pool", "base/egress=2"]);
    gw.wait_warm(2, "the pool").await;
    // Real traffic, so that every counter has a series: a warm claim, a command through the
    // data plane, a kill (and the destroy behind it), the refill's boots.
    let sandbox = gw.create(KEY_A, json!({"templateID": "base"})).await;
    let (code, out) = gw.run(&sandbox, "echo metered").await.expect("a command");
    assert_eq!((code, out.trim()), (0, "metered"));
    let id = sandbox["sandboxID"].as_str().expect("an id");
    let paused = gw
        .call(
            reqwest::Method::POST,
            &format!("/sandboxes/{id}/pause"),
            Some(KEY_A),
            None,
        )
        .await;
    assert_eq!(
        paused.status,
        reqwest::StatusCode::NO_CONTENT,
        "{:?}",
        paused.body
    );
    let text = gw.metrics_text().await;
    let mut exported: BTreeSet<String> = exported_families(&text);
    // Tenant names only for an admin's scrape: not for an open one, nor for a tenant's key.
    let by = [("state", "paused"), ("team", "team-a")];
    let family = "sandbox_gateway_sandboxes_by_state";
    assert_eq!(value(&text, family, &by), None, "{text}");
    assert_eq!(value(&scrape(&gw, KEY_A).await, family, &by), None);
    let admin = format!("e2b_{}", "c".repeat(40));
    let keys = tmp.path().join("api-keys");
    let mut file = std::fs::read_to_string(&keys).expect("the keys file");
    file.push_str(&format!("{admin} *\n"));
    std::fs::write(&keys, file).expect("an admin key");
    let mut as_admin = String::new();
    for _ in 0..100 {
        // The gateway reloads its keys file every 2 s.
        as_admin = scrape(&gw, &admin).await;
        if value(&as_admin, family, &by).is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(value(&as_admin, family, &by), Some(1.0), "{as_admin}");
    exported.extend(exported_families(&as_admin));
    let on_node = [("node", "embedded"), ("state", "paused")];
    assert_eq!(
        value(&text, "sandbox_node_sandboxes", &on_node),
        Some(1.0),
        "{text}"
    );
    assert_eq!(gw.kill(KEY_A, id).await, reqwest::StatusCode::NO_CONTENT);
    let mut text = String::new();
    for _ in 0..100 {
        text = gw.metrics_text().await;
        if value(&text, "sandbox_node_destroys_total", &[("outcome", "ok")]).is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A gauge of sandboxes by state has no series once the last one is gone, so the scrape
    // with the paused sandbox counts too.
    exported.extend(exported_families(&text));
    let missing: Vec<&String> = named.difference(&exported).collect();
    assert!(missing.is_empty(), "not exported: {missing:?}\n{text}");
    let moved = |direction: &str| {
        value(
            &text,
            "sandbox_gateway_data_plane_bytes_total",
            &[("direction", direction)],
        )
        .unwrap_or(0.0)
    };
    assert!(
        moved("to_sandbox") > 0.0 && moved("from_sandbox") > 0.0,
        "{text}"
    );
    let warm = [
        ("node", "embedded"),
        ("outcome", "warm"),
        ("pool", "base/egress/small"),
    ];
    assert_eq!(
        value(&text, "sandbox_node_claims_total", &warm),
        Some(1.0),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_serves_its_metrics_on_its_data_plane() {
    let (tmp, token) = workspace();
    let node = NodeProc::start(
        "metered",
        &tmp.path().join("metered"),
        &token,
        "127.0.0.1:0",
        &["--pool", "base=1"],
    );
    let url = format!("http://{}/metrics", node.data_addr);
    let mut text = String::new();
    for _ in 0..300 {
        text = reqwest::get(&url)
            .await
            .expect("a scrape")
            .text()
            .await
            .expect("the text");
        if value(&text, "sandbox_node_pool_warm", &[("node", "metered")]) == Some(1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pool = [("node", "metered"), ("pool", "base/none/small")];
    assert_eq!(
        value(&text, "sandbox_node_pool_target", &pool),
        Some(1.0),
        "{text}"
    );
    let booted = [
        ("node", "metered"),
        ("outcome", "ok"),
        ("pool", "base/none/small"),
    ];
    assert!(
        value(&text, "sandbox_node_refill_boots_total", &booted) >= Some(1.0),
        "{text}"
    );
    // Anything else on the data plane is still refused as before.
    let other = reqwest::get(format!("http://{}/", node.data_addr)).await;
    assert!(other.map(|r| r.status() == 400).unwrap_or(true));
}

/// Type-checks `dashboard` as Grafana's `Dashboard` type; the compiler's complaints on failure.
fn grafana_typecheck(dashboard: &Value, dir: &Path) -> Result<(), String> {
    let js = repo().join("tests/e2b/js");
    // An object literal, not an imported JSON file: literal types and excess-property checks
    // then apply as they would to a dashboard written in TypeScript.
    let source = format!(
        "import type {{ Dashboard }} from '@grafana/schema';\nexport const dashboard: Dashboard = {};\n",
        serde_json::to_string_pretty(dashboard).unwrap()
    );
    let file = dir.join("dashboard.ts");
    std::fs::write(&file, source).unwrap();
    let out = Command::new(js.join("node_modules/.bin/tsc"))
        .args([
            "--noEmit",
            "--strict",
            "--skipLibCheck",
            "--module",
            "esnext",
            "--moduleResolution",
            "bundler",
            "--target",
            "es2022",
            "--typeRoots",
            "[]",
            "--baseUrl",
        ])
        .arg(js.join("node_modules"))
        .arg(&file)
        .output()
        .expect("tsc runs (tests/e2b/setup.sh installs it)");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[test]
fn the_dashboard_is_a_grafana_dashboard_by_grafanas_schema() {
    ensure_sdks();
    let tmp = tempfile::tempdir().unwrap();
    let d = dashboard();
    grafana_typecheck(&d, tmp.path()).unwrap_or_else(|e| panic!("{e}"));
    // The check can fail: a misspelt panel field, a grid position of the wrong type.
    let mut misspelt = d.clone();
    misspelt["panels"][0]["titel"] = json!("x");
    let e = grafana_typecheck(&misspelt, tmp.path()).unwrap_err();
    assert!(e.contains("titel"), "{e}");
    let mut mistyped = d;
    mistyped["panels"][0]["gridPos"]["h"] = json!("8");
    let e = grafana_typecheck(&mistyped, tmp.path()).unwrap_err();
    assert!(
        e.contains("gridPos") || e.contains("'string' is not assignable"),
        "{e}"
    );
}

#[test]
fn families_are_read_from_expressions() {
    let f = families(
        r#"histogram_quantile(0.9, sum by (le) (rate(sandbox_node_claim_seconds_bucket{x="sandbox_not_me"}[5m]))) / sandbox_gateway_nodes_up"#,
    );
    assert_eq!(
        f.into_iter().collect::<Vec<_>>(),
        ["sandbox_gateway_nodes_up", "sandbox_node_claim_seconds"]
    );
}
