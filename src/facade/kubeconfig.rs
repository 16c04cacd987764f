//! `sandbox-gateway kubeconfig`: a kubeconfig for talking to the facade directly with kubectl.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

/// A kubeconfig with the facade's CA, its address and a bearer token (an e2b API key).
pub fn render(server: &str, ca_pem: &str, token: &str, namespace: Option<&str>) -> String {
    let ca = STANDARD.encode(ca_pem.as_bytes());
    let ns = namespace
        .map(|n| format!("    namespace: {}\n", quoted(n)))
        .unwrap_or_default();
    let (server, token) = (quoted(server), quoted(token));
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: sandbox-gateway\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: sandbox-gateway\n  user:\n    token: {token}\ncontexts:\n- name: sandbox-gateway\n  context:\n    cluster: sandbox-gateway\n    user: sandbox-gateway\n{ns}current-context: sandbox-gateway\n"
    )
}

/// `s` as a YAML double-quoted scalar. A key file accepts any non-blank key, and a plain
/// scalar would turn one such as `*k`, `{k`, `k: v` or ` ` into an alias, a map or null.
/// Characters YAML does not allow raw (controls, DEL, C1, the Unicode line separators,
/// U+FFFE/U+FFFF) are written as `\u` escapes, so the value reads back exactly.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{0}'..='\u{1f}'
            | '\u{7f}'..='\u{9f}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{feff}'
            | '\u{fffe}'
            | '\u{ffff}' => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by tests/fuzz_parsers.rs (`kubeconfig/round-trip`): a token of one space was
    /// written as a plain scalar and read back as no token at all.
    #[test]
    fn values_read_back_exactly() {
        for token in [
            " ",
            "*alias",
            "&anchor",
            "{open",
            "k: v",
            "#c",
            "a\"b\\c",
            "é\u{85}\u{7f}\n",
        ] {
            let text = render("https://127.0.0.1:1", "ca", token, Some("team-a"));
            let doc: serde_json::Value = serde_saphyr::from_str(&text).unwrap_or_default();
            assert_eq!(doc["users"][0]["user"]["token"], token, "{text}");
            assert_eq!(doc["contexts"][0]["context"]["namespace"], "team-a");
            assert_eq!(
                doc["clusters"][0]["cluster"]["server"],
                "https://127.0.0.1:1"
            );
        }
    }
}
