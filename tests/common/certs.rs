//! Certificates made on the spot for fake cluster endpoints.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};

pub struct Ca {
    pub pem: String,
    pub key: KeyPair,
}

pub fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let pem = p.self_signed(&key).unwrap().pem();
    Ca { pem, key }
}

/// A certificate signed by `ca`: (certificate PEM, key PEM).
pub fn leaf(ca: &Ca, cn: &str, server: bool) -> (String, String) {
    let issuer = Issuer::from_ca_cert_pem(&ca.pem, &ca.key).unwrap();
    let mut p = CertificateParams::new(if server {
        vec!["localhost".to_string()]
    } else {
        vec![]
    })
    .unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    if server {
        p.subject_alt_names
            .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
    }
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, &issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A server certificate for the DNS `names`, signed by `ca`: (certificate PEM, key PEM).
pub fn named(ca: &Ca, names: &[&str]) -> (String, String) {
    let issuer = Issuer::from_ca_cert_pem(&ca.pem, &ca.key).unwrap();
    let mut p =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    p.distinguished_name.push(DnType::CommonName, names[0]);
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, &issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A TLS server configuration for a fake endpoint with a certificate from `leaf`.
pub fn tls_server((cert, key): &(String, String)) -> rustls::ServerConfig {
    sandbox_gateway::tlsx::install_crypto();
    rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            sandbox_gateway::tlsx::parse_certs(cert.as_bytes()).unwrap(),
            rustls_pemfile::private_key(&mut key.as_bytes())
                .unwrap()
                .unwrap(),
        )
        .unwrap()
}

/// Writes a kubeconfig for `server` (trusting `ca`) with a bearer token.
pub fn write_kubeconfig(path: &std::path::Path, server: &str, ca: &Ca, token: &str) {
    use base64::Engine;
    let ca_data = base64::engine::general_purpose::STANDARD.encode(&ca.pem);
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca_data}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
        ),
    )
    .unwrap();
}
