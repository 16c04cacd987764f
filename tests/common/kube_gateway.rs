//! The gateway's Kubernetes facade as the kube tests drive it: the binary with its embedded
//! node and e2b keys for three tenants, a kubeconfig per key from `sandbox-gateway
//! kubeconfig`, `kubectl` with its own discovery cache, and watch streams read over HTTPS.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::{BIN, Proc};

pub const KEY_TEAM_A: &str = "e2b_a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0";
pub const KEY_TEAM_B: &str = "e2b_b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0";
pub const KEY_ADMIN: &str = "e2b_c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0";
pub const GV: &str = "/apis/agents.x-k8s.io/v1beta1";

pub struct KubeGateway {
    pub proc: Proc,
    pub dir: PathBuf,
    pub kube_url: String,
    pub e2b_url: String,
    pub ca: String,
}

impl KubeGateway {
    /// `serve` with keys for `team-a`, `team-b` and an admin, and a pool of 4 `base`.
    pub fn start(tmp: &Path, extra: &[&str]) -> KubeGateway {
        let dir = tmp.join("gw");
        let keys = tmp.join("keys");
        std::fs::write(
            &keys,
            format!("{KEY_TEAM_A} team-a\n{KEY_TEAM_B} team-b\n{KEY_ADMIN} *\n"),
        )
        .unwrap();
        let mut args = super::serve_args(
            &dir,
            &[
                "--api-keys",
                &keys.display().to_string(),
                "--pool",
                "base=4",
            ],
        );
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut proc = Proc::spawn(&args);
        let kube = proc.wait_line(
            "Kubernetes API listening on https://",
            Duration::from_secs(60),
        );
        let e2b = proc.wait_line("e2b API listening on http://", Duration::from_secs(5));
        let ca = std::fs::read_to_string(dir.join("tls/ca.crt")).unwrap();
        KubeGateway {
            kube_url: kube.rsplit(' ').next().unwrap().trim().to_string(),
            e2b_url: e2b.rsplit(' ').next().unwrap().trim().to_string(),
            proc,
            dir,
            ca,
        }
    }

    /// A kubeconfig made by `sandbox-gateway kubeconfig` for `key`.
    pub fn kubeconfig(&self, tmp: &Path, key: &str, namespace: &str) -> PathBuf {
        let out = Command::new(BIN)
            .args([
                "kubeconfig",
                "--server",
                &self.kube_url,
                "--api-key",
                key,
                "--namespace",
                namespace,
                "--data-dir",
            ])
            .arg(&self.dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = tmp.join(format!("kubeconfig-{namespace}-{}", &key[4..8]));
        std::fs::write(&path, out.stdout).unwrap();
        path
    }

    /// kubectl for `key` in `namespace`, with a discovery cache of its own.
    pub fn kubectl(&self, tmp: &Path, key: &str, namespace: &str) -> Kubectl {
        let config = self.kubeconfig(tmp, key, namespace);
        Kubectl {
            cache: tmp.join(format!("kube-cache-{namespace}-{}", &key[4..8])),
            config,
            program: "kubectl".into(),
            env: Vec::new(),
        }
    }

    pub fn http(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(self.ca.as_bytes()).unwrap())
            .build()
            .unwrap()
    }

    pub fn sandboxes_dir(&self) -> PathBuf {
        self.dir.join("node/sandboxes")
    }
}

#[derive(Clone)]
pub struct Kubectl {
    pub config: PathBuf,
    pub cache: PathBuf,
    /// `kubectl`, or one release's binary (`kubectl.1.27`).
    pub program: PathBuf,
    pub env: Vec<(String, String)>,
}

impl Kubectl {
    /// The same client with another kubectl binary (and discovery cache).
    pub fn with_program(&self, program: &Path) -> Kubectl {
        let tag = program
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Kubectl {
            program: program.to_path_buf(),
            cache: self.cache.with_extension(tag),
            ..self.clone()
        }
    }

    pub fn with_env(&self, key: &str, value: &str) -> Kubectl {
        let mut k = self.clone();
        k.env.push((key.into(), value.into()));
        k
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.program);
        c.arg("--kubeconfig")
            .arg(&self.config)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut c = self.cmd(args);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("kubectl on PATH");
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        drop(child.stdin.take());
        child.wait_with_output().unwrap()
    }

    /// stdout of a command that must succeed; it must not warn either.
    pub fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run(args, stdin);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{} {args:?} failed: {}{stderr}",
            self.program.display(),
            String::from_utf8_lossy(&out.stdout),
        );
        assert!(
            !stderr.to_lowercase().contains("warning"),
            "{} {args:?} warned: {stderr}",
            self.program.display()
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// stderr of a command that must fail.
    pub fn fails(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run(args, stdin);
        assert!(
            !out.status.success(),
            "{} {args:?} should fail: {}",
            self.program.display(),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stderr).unwrap()
    }

    /// `get -o json` of one object.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.ok(&all, None)).unwrap()
    }
}

/// The next newline-delimited JSON event of a streaming response, within `wait`.
pub async fn next_event(
    res: &mut reqwest::Response,
    buf: &mut Vec<u8>,
    wait: Duration,
) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            return serde_json::from_slice(&line).ok();
        }
        match tokio::time::timeout_at(deadline, res.chunk()).await {
            Ok(Ok(Some(chunk))) => buf.extend_from_slice(&chunk),
            _ => return None,
        }
    }
}
