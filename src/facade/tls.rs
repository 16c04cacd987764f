//! TLS for the facade (kubectl sends credentials only over TLS). By default a CA and a serving
//! certificate are generated into the data directory: the CA once, the serving certificate at
//! every start so that it always carries the configured names. A provided certificate and key
//! replace both. In cluster mode client certificates are requested (not required) so that
//! kube-apiserver's front-proxy certificate can be checked per request.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::PrivateKeyDer;
use rustls::server::WebPkiClientVerifier;

use crate::model::{Error, Result};
use crate::tlsx::{install_crypto, parse_certs};

#[derive(Debug, Clone)]
pub struct TlsConfig {
    /// Where a generated CA and serving certificate live.
    pub dir: PathBuf,
    /// A provided serving certificate chain and key (PEM).
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// Extra names for the generated serving certificate (e.g. `svc.ns.svc`, `*.example.com`,
    /// or an IP address).
    pub dns_names: Vec<String>,
}

pub struct Served {
    pub config: rustls::ServerConfig,
    /// The CA clients should trust (PEM), when this process generated the certificate.
    pub ca_pem: Option<String>,
}

fn tls_err(what: impl std::fmt::Display) -> impl FnOnce(rcgen::Error) -> Error {
    move |e| Error::internal(format!("{what}: {e}"))
}

pub fn ca_paths(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("ca.crt"), dir.join("ca.key"))
}

fn load_or_create_ca(dir: &Path) -> Result<(String, KeyPair)> {
    let (cert_path, key_path) = ca_paths(dir);
    if cert_path.exists() && key_path.exists() {
        let cert = std::fs::read_to_string(&cert_path)
            .map_err(|e| Error::io(format!("reading {}", cert_path.display()), e))?;
        let key = std::fs::read_to_string(&key_path)
            .map_err(|e| Error::io(format!("reading {}", key_path.display()), e))?;
        let key = KeyPair::from_pem(&key).map_err(tls_err("parsing the CA key"))?;
        return Ok((cert, key));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let key = KeyPair::generate().map_err(tls_err("generating the CA key"))?;
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(tls_err("CA parameters"))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "sandbox-gateway CA");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2100, 1, 1);
    let cert = params
        .self_signed(&key)
        .map_err(tls_err("signing the CA"))?;
    let pem = cert.pem();
    crate::fsx::write_atomic(&cert_path, pem.as_bytes())
        .map_err(|e| Error::io(format!("writing {}", cert_path.display()), e))?;
    crate::fsx::write_atomic(&key_path, key.serialize_pem().as_bytes())
        .map_err(|e| Error::io(format!("writing {}", key_path.display()), e))?;
    Ok((pem, key))
}

fn serving_cert(ca_pem: &str, ca_key: &KeyPair, dns_names: &[String]) -> Result<(String, KeyPair)> {
    let issuer = Issuer::from_ca_cert_pem(ca_pem, ca_key).map_err(tls_err("loading the CA"))?;
    // Names that are addresses become IP SANs; the rest DNS names (wildcards included).
    let (ips, names): (Vec<&String>, Vec<&String>) = dns_names
        .iter()
        .partition(|n| n.parse::<std::net::IpAddr>().is_ok());
    let mut dns: Vec<String> = vec!["localhost".into()];
    dns.extend(names.into_iter().filter(|n| *n != "localhost").cloned());
    let mut params =
        CertificateParams::new(dns).map_err(tls_err("serving certificate parameters"))?;
    for ip in ips {
        let defaults = [
            std::net::IpAddr::from(std::net::Ipv4Addr::LOCALHOST),
            std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        ];
        if let Ok(ip) = ip.parse::<std::net::IpAddr>()
            && !defaults.contains(&ip)
        {
            params.subject_alt_names.push(SanType::IpAddress(ip));
        }
    }
    params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
    params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::Ipv6Addr::LOCALHOST.into()));
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "sandbox-gateway");
    params.distinguished_name = dn;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2100, 1, 1);
    let key = KeyPair::generate().map_err(tls_err("generating the serving key"))?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(tls_err("signing the serving certificate"))?;
    Ok((cert.pem(), key))
}

fn parse_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>> {
    rustls_pemfile::private_key(&mut &pem[..])
        .map_err(|e| Error::invalid(format!("parsing the private key: {e}")))?
        .ok_or_else(|| Error::invalid("no private key found in PEM data"))
}

/// Roots built from PEM bundles.
pub fn roots(bundles: &[&[u8]]) -> Result<rustls::RootCertStore> {
    let mut store = rustls::RootCertStore::empty();
    for bundle in bundles {
        for cert in parse_certs(bundle)? {
            store
                .add(cert)
                .map_err(|e| Error::invalid(format!("adding a CA certificate: {e}")))?;
        }
    }
    Ok(store)
}

/// The server configuration. `client_cas` (PEM bundles) asks clients for a certificate that
/// chains to one of them, without requiring one.
pub fn server_config(cfg: &TlsConfig, client_cas: &[&[u8]]) -> Result<Served> {
    install_crypto();
    let (chain_pem, key_pem, ca_pem) = match (&cfg.cert_file, &cfg.key_file) {
        (Some(c), Some(k)) => {
            let chain =
                std::fs::read(c).map_err(|e| Error::io(format!("reading {}", c.display()), e))?;
            let key =
                std::fs::read(k).map_err(|e| Error::io(format!("reading {}", k.display()), e))?;
            (chain, key, None)
        }
        (None, None) => {
            let (ca, ca_key) = load_or_create_ca(&cfg.dir)?;
            let (cert, key) = serving_cert(&ca, &ca_key, &cfg.dns_names)?;
            (
                cert.into_bytes(),
                key.serialize_pem().into_bytes(),
                Some(ca),
            )
        }
        _ => {
            return Err(Error::invalid(
                "--tls-cert-file and --tls-key-file go together",
            ));
        }
    };
    let builder = rustls::ServerConfig::builder();
    let builder = if client_cas.is_empty() {
        builder.with_no_client_auth()
    } else {
        let verifier = WebPkiClientVerifier::builder(Arc::new(roots(client_cas)?))
            .allow_unauthenticated()
            .build()
            .map_err(|e| Error::invalid(format!("client certificate verifier: {e}")))?;
        builder.with_client_cert_verifier(verifier)
    };
    let config = builder
        .with_single_cert(parse_certs(&chain_pem)?, parse_key(&key_pem)?)
        .map_err(|e| Error::invalid(format!("serving certificate: {e}")))?;
    Ok(Served { config, ca_pem })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ca_is_reused_and_serving_certs_chain_to_it() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = TlsConfig {
            dir: tmp.path().to_path_buf(),
            cert_file: None,
            key_file: None,
            dns_names: vec!["gw.sandbox-system.svc".into()],
        };
        let a = server_config(&cfg, &[]).unwrap();
        let (ca, key) = load_or_create_ca(tmp.path()).unwrap();
        let names = vec!["*.sandbox.test".to_string(), "192.0.2.7".into()];
        let (pem, _) = serving_cert(&ca, &key, &names).unwrap();
        let der = parse_certs(pem.as_bytes()).unwrap();
        let (_, parsed) = x509_parser::parse_x509_certificate(&der[0]).unwrap();
        let names = &parsed
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names;
        use x509_parser::extensions::GeneralName;
        let dns: Vec<&str> = names
            .iter()
            .filter_map(|n| match n {
                GeneralName::DNSName(d) => Some(*d),
                _ => None,
            })
            .collect();
        let ips: Vec<&[u8]> = names
            .iter()
            .filter_map(|n| match n {
                GeneralName::IPAddress(a) => Some(*a),
                _ => None,
            })
            .collect();
        assert!(
            dns.contains(&"*.sandbox.test") && dns.contains(&"localhost"),
            "{dns:?}"
        );
        assert!(ips.contains(&[192u8, 0, 2, 7].as_slice()), "{ips:?}");
        let b = server_config(&cfg, &[]).unwrap();
        assert_eq!(a.ca_pem, b.ca_pem, "the CA is made once");
        assert!(a.ca_pem.unwrap().contains("BEGIN CERTIFICATE"));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(tmp.path().join("ca.key"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
    }
}
