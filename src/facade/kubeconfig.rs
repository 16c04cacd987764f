//! `sandbox-gateway kubeconfig`: a kubeconfig for talking to the facade directly with kubectl.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

/// A kubeconfig with the facade's CA, its address and a bearer token (an e2b API key).
pub fn render(server: &str, ca_pem: &str, token: &str, namespace: Option<&str>) -> String {
    let ca = STANDARD.encode(ca_pem.as_bytes());
    let ns = namespace
        .map(|n| format!("    namespace: {n}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: sandbox-gateway\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: sandbox-gateway\n  user:\n    token: {token}\ncontexts:\n- name: sandbox-gateway\n  context:\n    cluster: sandbox-gateway\n    user: sandbox-gateway\n{ns}current-context: sandbox-gateway\n"
    )
}
