//! The gateway in the domain mode, as e2b's cloud is addressed: HTTPS on port 443 of a
//! loopback address of its own, sandboxes at `<port>-<id>.<domain>`, which the SDKs resolve to
//! that address through `E2B_TEST_RESOLVE` (tests/e2b/py/resolve_override.py,
//! tests/e2b/js/resolve.mjs).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Proc, api_keys_file};

/// A loopback address of its own for a test's port 443.
pub fn free_loopback_443() -> String {
    for n in 2..250u8 {
        let ip = format!("127.0.{}.{}", (std::process::id() % 200) as u8, n);
        if std::net::TcpListener::bind(format!("{ip}:443")).is_ok() {
            return ip;
        }
    }
    panic!("no loopback address with a free port 443");
}

pub struct DomainGateway {
    pub proc: Proc,
    pub ip: String,
    pub domain: String,
    pub data: PathBuf,
    /// The gateway's CA certificate (PEM file).
    pub ca: String,
}

impl DomainGateway {
    /// `serve` with TLS and `domain` on port 443, the tenants of `api_keys_file`, and `pool`.
    pub fn start(tmp: &Path, domain: &str, pool: &str) -> DomainGateway {
        let keys = api_keys_file(tmp);
        let data = tmp.join("gw");
        let ip = free_loopback_443();
        let mut proc = Proc::spawn(&[
            "serve".into(),
            "--e2b-listen".into(),
            format!("{ip}:443"),
            "--kube-listen".into(),
            "127.0.0.1:0".into(),
            "--data-dir".into(),
            data.display().to_string(),
            "--api-keys".into(),
            keys.display().to_string(),
            "--pool".into(),
            pool.into(),
            "--e2b-tls".into(),
            "--e2b-domain".into(),
            domain.into(),
        ]);
        proc.wait_line("export E2B_DOMAIN=", Duration::from_secs(60));
        let ca = data.join("tls/ca.crt").display().to_string();
        DomainGateway {
            proc,
            ip,
            domain: domain.to_string(),
            data,
            ca,
        }
    }

    /// What the SDKs are given: the API on 443, the domain, its resolution, the CA.
    pub fn sdk_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("E2B_API_URL", format!("https://{}", self.ip)),
            ("E2B_DOMAIN", self.domain.clone()),
            ("E2B_TEST_RESOLVE", format!("{}={}", self.domain, self.ip)),
            ("SSL_CERT_FILE", self.ca.clone()),
            ("NODE_EXTRA_CA_CERTS", self.ca.clone()),
        ]
    }
}
