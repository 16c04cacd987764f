//! A gateway process driven over the e2b REST API, with two tenants.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::Proc;

pub const KEY_A: &str = "e2b_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
pub const KEY_B: &str = "e2b_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

/// `dir/api-keys` naming the two tenants: KEY_A for team-a, KEY_B for team-b.
pub fn api_keys_file(dir: &std::path::Path) -> std::path::PathBuf {
    let keys = dir.join("api-keys");
    std::fs::write(
        &keys,
        format!("# tenants\n{KEY_A} team-a\n{KEY_B} team-b\n"),
    )
    .unwrap();
    keys
}

pub struct Gateway {
    pub proc: Proc,
    pub url: String,
    pub data: std::path::PathBuf,
    pub http: reqwest::Client,
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Gateway {
    /// A gateway on a free port with two tenants (team-a, team-b); `extra` adds flags.
    pub fn start(tmp: &std::path::Path, extra: &[&str]) -> Gateway {
        Self::start_named(tmp, "gw", extra)
    }

    /// Like `start`, with its data in `tmp/name` (for several replicas side by side).
    pub fn start_named(tmp: &std::path::Path, name: &str, extra: &[&str]) -> Gateway {
        let data = tmp.join(name);
        std::fs::create_dir_all(&data).unwrap();
        let keys = api_keys_file(tmp);
        let mut args: Vec<String> = [
            "serve",
            "--e2b-listen",
            "127.0.0.1:0",
            "--kube-listen",
            "127.0.0.1:0",
            "--data-dir",
            &data.display().to_string(),
            "--api-keys",
            &keys.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut proc = Proc::spawn(&args);
        let line = proc.wait_line("e2b API listening on http://", Duration::from_secs(60));
        let url = line.rsplit(' ').next().unwrap().trim().to_string();
        Gateway {
            proc,
            url,
            data,
            http: reqwest::Client::new(),
        }
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> Reply {
        let mut req = self.http.request(method, format!("{}{path}", self.url));
        if let Some(k) = key {
            req = req.header("X-API-KEY", k);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.expect("request");
        let status = res.status();
        let headers = res.headers().clone();
        let text = res.text().await.unwrap_or_default();
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Reply {
            status,
            headers,
            body,
        }
    }

    pub async fn create(&self, key: &str, body: Value) -> Value {
        let r = self
            .call(Method::POST, "/v2/sandboxes", Some(key), Some(body))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
        r.body
    }
}

impl Gateway {
    /// The Prometheus text at /metrics.
    pub async fn metrics_text(&self) -> String {
        metrics_at(&self.http, &self.url).await
    }

    /// Warm `base` sandboxes the gateway sees, summed over its pools.
    pub async fn warm(&self) -> i64 {
        self.warm_of("base/").await
    }

    /// Warm sandboxes of the pools whose key starts with `prefix`, summed.
    pub async fn warm_of(&self, prefix: &str) -> i64 {
        self.metrics_text()
            .await
            .lines()
            .filter(|l| l.starts_with(&format!("sandbox_gateway_warm_sandboxes{{pool=\"{prefix}")))
            .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
            .map(|v| v as i64)
            .sum()
    }

    /// Waits (up to a minute) until `warm` is `n`.
    pub async fn wait_warm(&self, n: i64, what: &str) {
        for _ in 0..600 {
            if self.warm().await == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("timed out waiting for {what} ({n} warm)");
    }

    /// Waits (up to a minute) until the pools whose key starts with `prefix` hold `n` warm.
    pub async fn wait_warm_of(&self, prefix: &str, n: i64) {
        for _ in 0..600 {
            if self.warm_of(prefix).await == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("timed out waiting for {n} warm in {prefix}");
    }

    /// The value of an unlabelled gauge or counter (-1 when absent).
    pub async fn metric(&self, name: &str) -> i64 {
        self.metrics_text()
            .await
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(-1)
    }
}

impl Gateway {
    /// `DELETE /sandboxes/{id}`: the status.
    pub async fn kill(&self, key: &str, id: &str) -> StatusCode {
        self.call(Method::DELETE, &format!("/sandboxes/{id}"), Some(key), None)
            .await
            .status
    }

    /// Runs `bash -c cmd` in the sandbox through the gateway's data plane (envd's Connect
    /// protocol, as the SDKs call it); answers the exit code and stdout.
    pub async fn run(&self, sandbox: &Value, cmd: &str) -> Result<(i64, String), String> {
        let body = super::sandbox::start_body(&["-c", cmd]);
        let res = self
            .http
            .post(format!("{}/process.Process/Start", self.url))
            .header(
                "E2b-Sandbox-Id",
                sandbox["sandboxID"].as_str().unwrap_or_default(),
            )
            .header("E2b-Sandbox-Port", "49983")
            .header(
                "X-Access-Token",
                sandbox["envdAccessToken"].as_str().unwrap_or_default(),
            )
            .header("Content-Type", "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .timeout(Duration::from_secs(60))
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = res.status();
        let bytes = res.bytes().await.map_err(|e| e.to_string())?;
        if status != StatusCode::OK {
            return Err(format!("{status}: {}", String::from_utf8_lossy(&bytes)));
        }
        let ran = super::sandbox::parse_start_stream(&bytes)?;
        if ran.end.is_null() {
            return Err("the command's stream had no end".to_string());
        }
        Ok((ran.exit_code, ran.stdout))
    }

    /// `GET /sandboxes/{id}`.
    pub async fn get(&self, key: &str, id: &str) -> Reply {
        self.call(Method::GET, &format!("/sandboxes/{id}"), Some(key), None)
            .await
    }
}

/// kubectl against a gateway's Kubernetes API, as team-a (KEY_A, namespace `team-a`).
pub struct Kubectl {
    config: std::path::PathBuf,
}

impl Kubectl {
    /// Writes a kubeconfig for `gw` under `tmp`.
    pub fn for_gateway(gw: &mut Gateway, tmp: &std::path::Path) -> Kubectl {
        let line = gw.proc.wait_line(
            "Kubernetes API listening on https://",
            Duration::from_secs(5),
        );
        let kube = line.rsplit(' ').next().unwrap().trim().to_string();
        let out = std::process::Command::new(super::BIN)
            .args(["kubeconfig", "--server", &kube, "--api-key", KEY_A])
            .args(["--namespace", "team-a", "--data-dir"])
            .arg(&gw.data)
            .output()
            .unwrap();
        assert!(out.status.success());
        let config = tmp.join("kubeconfig");
        std::fs::write(&config, out.stdout).unwrap();
        Kubectl { config }
    }

    /// Runs kubectl with `args` (and `stdin`), which must succeed; answers its stdout.
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> String {
        use std::io::Write;
        let mut c = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.config)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl");
        if let Some(s) = stdin {
            c.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
        }
        drop(c.stdin.take());
        let o = c.wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }
}

/// The Prometheus text at `{base}/metrics` (a gateway's e2b listener).
pub async fn metrics_at(http: &reqwest::Client, base: &str) -> String {
    http.get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text")
}
