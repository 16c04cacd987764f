//! A sandbox's interception CA: made for one instance when its rules first set headers, trusted
//! by that sandbox alone (envd installs it), its key never leaving the node. It signs a leaf
//! certificate for each host name the sandbox connects to through an intercepted rule, made on
//! first use and kept while the instance lives.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{Datelike, Utc};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::model::{Error, Result};

/// Most leaf certificates one sandbox's CA keeps (the names it may intercept are at most ten
/// rules, but wildcards match many).
const MAX_LEAVES: usize = 256;

fn ca_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |e| Error::internal(format!("{what}: {e}"))
}

/// From yesterday to a year from now, in whole days (clocks inside sandboxes may lag a little).
fn validity(params: &mut CertificateParams) {
    let day =
        |d: chrono::DateTime<Utc>| rcgen::date_time_ymd(d.year(), d.month() as u8, d.day() as u8);
    let now = Utc::now();
    params.not_before = day(now - chrono::Duration::days(1));
    params.not_after = day(now + chrono::Duration::days(366));
}

pub struct SandboxCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// One key for every leaf of this CA: they all serve the same sandbox.
    leaf_key: KeyPair,
    leaf_signer: Arc<dyn rustls::sign::SigningKey>,
    leaves: Mutex<HashMap<String, Arc<CertifiedKey>>>,
    /// The server side of intercepted connections, made once.
    tls: std::sync::OnceLock<Arc<rustls::ServerConfig>>,
}

impl std::fmt::Debug for SandboxCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxCa").finish_non_exhaustive()
    }
}

impl SandboxCa {
    /// A new CA named after the sandbox instance it serves.
    pub fn new(instance: &str) -> Result<SandboxCa> {
        let key = KeyPair::generate().map_err(ca_err("generating the egress CA key"))?;
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(ca_err("egress CA parameters"))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "sandbox-gateway");
        dn.push(DnType::CommonName, format!("egress proxy of {instance}"));
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params);
        let issuer =
            CertifiedIssuer::self_signed(params, key).map_err(ca_err("signing the egress CA"))?;
        let leaf_key = KeyPair::generate().map_err(ca_err("generating the egress leaf key"))?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let leaf_signer = rustls::crypto::ring::sign::any_supported_type(&der)
            .map_err(|e| Error::internal(format!("loading the egress leaf key: {e}")))?;
        Ok(SandboxCa {
            issuer,
            leaf_key,
            leaf_signer,
            leaves: Mutex::new(HashMap::new()),
            tls: std::sync::OnceLock::new(),
        })
    }

    /// The CA certificate, for the sandbox to trust.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// The certificate chain and key that serve `name` (a DNS name), made on first use.
    pub fn leaf(&self, name: &str) -> Result<Arc<CertifiedKey>> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = leaves.get(name) {
            return Ok(k.clone());
        }
        let mut params = CertificateParams::new(vec![name.to_string()])
            .map_err(ca_err("egress certificate parameters"))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        validity(&mut params);
        let cert = params
            .signed_by(&self.leaf_key, &self.issuer)
            .map_err(ca_err("signing an egress certificate"))?;
        let chain: Vec<CertificateDer<'static>> =
            vec![cert.der().clone(), self.issuer.der().clone()];
        let key = Arc::new(CertifiedKey::new(chain, self.leaf_signer.clone()));
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(name.to_string(), key.clone());
        Ok(key)
    }

    /// The TLS server configuration that answers every name with this CA's leaf for it.
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>> {
        if let Some(cfg) = self.tls.get() {
            return Ok(cfg.clone());
        }
        let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::internal(format!("egress TLS versions: {e}")))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Leaves(Arc::downgrade(self))));
        // Requests are rewritten one by one: HTTP/1.1 only.
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(self.tls.get_or_init(|| Arc::new(cfg)).clone())
    }
}

/// Resolves a ClientHello's server name to its leaf. Weak: the CA keeps this configuration,
/// which must not keep the CA.
#[derive(Debug)]
struct Leaves(std::sync::Weak<SandboxCa>);

impl ResolvesServerCert for Leaves {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name()?;
        match self.0.upgrade()?.leaf(name) {
            Ok(k) => Some(k),
            Err(e) => {
                tracing::warn!(error = %e, "no egress certificate for an intercepted host");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;

    #[test]
    fn leaves_chain_to_the_sandboxs_ca_and_only_to_it() {
        let ca = SandboxCa::new("sb-test").unwrap();
        let other = SandboxCa::new("sb-other").unwrap();
        let leaf = ca.leaf("api.example.com").unwrap();
        assert!(
            Arc::ptr_eq(&leaf, &ca.leaf("api.example.com").unwrap()),
            "kept"
        );
        let verify = |ca: &SandboxCa, name: &str| {
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(crate::tlsx::parse_certs(ca.pem().as_bytes()).unwrap()[0].clone())
                .unwrap();
            let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                Arc::new(rustls::crypto::ring::default_provider()),
            )
            .build()
            .unwrap();
            verifier.verify_server_cert(
                &leaf.cert[0],
                &leaf.cert[1..],
                &rustls::pki_types::ServerName::try_from(name.to_string()).unwrap(),
                &[],
                rustls::pki_types::UnixTime::now(),
            )
        };
        verify(&ca, "api.example.com").expect("the sandbox trusts it");
        assert!(
            verify(&ca, "other.example.com").is_err(),
            "only its own name"
        );
        assert!(
            verify(&other, "api.example.com").is_err(),
            "another sandbox's CA does not"
        );
        // The configuration is made once and does not keep its CA alive.
        let ca = Arc::new(ca);
        let cfg = ca.server_config().unwrap();
        assert!(Arc::ptr_eq(&cfg, &ca.server_config().unwrap()));
        let weak = Arc::downgrade(&ca);
        drop(ca);
        assert!(
            weak.upgrade().is_none(),
            "no cycle through the cached configuration"
        );
    }
}
