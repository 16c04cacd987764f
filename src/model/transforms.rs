//! e2b's per-host egress `rules`: for a host key (a name or one leading `*.` wildcard), headers
//! an egress proxy sets on each request to that host, replacing any of the same name. Values
//! may hold `${e2b.secrets.NAME}` placeholders, filled per request from the tenant's secrets by
//! the proxy, so that the secret never enters the sandbox. Checked with e2b's limits; looked up
//! exact key first, then the longest wildcard; rule sets are never merged.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::domains::Pattern;
use super::{Error, Result};

pub const MAX_DOMAINS: usize = 10;
pub const MAX_RULES_PER_DOMAIN: usize = 1;
pub const MAX_HEADERS: usize = 20;
pub const MAX_HEADER_NAME: usize = 64;
pub const MAX_HEADER_VALUE: usize = 2048;
pub const MAX_SECRETS_PER_DOMAIN: usize = 32;

const SECRET_PREFIX: &str = "e2b.secrets.";
const IDENTITY_PREFIX: &str = "e2b.identity.tokens.";

/// The headers one rule sets, by name as given.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transform {
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// One rule of a host (e2b allows one per host).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<Transform>,
}

/// A piece of a header value: text as is, or a placeholder to fill in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    /// `${e2b.secrets.NAME}`: the tenant's secret NAME (lowercased, as names are stored).
    Secret(String),
    /// `${e2b.identity.tokens.NAME}`: a workload identity token (not offered; refused).
    Identity(String),
}

/// Splits a header value into text and placeholders. Any `${` must open a placeholder of a
/// known kind that is closed, non-empty and not nested.
pub fn pieces(value: &str) -> Result<Vec<Piece>> {
    let malformed = || {
        Error::invalid("Network transform header contains a malformed E2B placeholder.".to_string())
    };
    let mut out = Vec::new();
    let mut rest = value;
    while let Some(at) = rest.find("${") {
        if at > 0 {
            out.push(Piece::Text(rest[..at].to_string()));
        }
        let inner_start = &rest[at + 2..];
        let end = inner_start.find('}').ok_or_else(malformed)?;
        let inner = &inner_start[..end];
        if inner.is_empty() || inner.contains("${") || inner.contains('{') {
            return Err(malformed());
        }
        let piece = if let Some(name) = inner.strip_prefix(SECRET_PREFIX) {
            let name = crate::secrets::normalize_name(name).map_err(|_| malformed())?;
            Piece::Secret(name)
        } else if let Some(name) = inner.strip_prefix(IDENTITY_PREFIX) {
            if name.is_empty() {
                return Err(malformed());
            }
            Piece::Identity(name.to_string())
        } else {
            // Not an e2b placeholder: e2b keeps other `${...}` text as it is.
            Piece::Text(format!("${{{inner}}}"))
        };
        out.push(piece);
        rest = &inner_start[end + 1..];
    }
    if !rest.is_empty() {
        out.push(Piece::Text(rest.to_string()));
    }
    Ok(out)
}

/// An HTTP token (RFC 9110 `tchar`s).
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A field value: visible ASCII and Latin-1 octets, spaces and tabs, no CR, LF or NUL.
fn is_field_value(s: &str) -> bool {
    s.bytes()
        .all(|b| b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80)
}

/// Checks `rules` against e2b's limits. Identity-token placeholders are refused: this gateway
/// mints no workload identity tokens.
pub fn validate(rules: &BTreeMap<String, Vec<Rule>>) -> Result<()> {
    let bad = |m: String| Err(Error::invalid(m));
    if rules.len() > MAX_DOMAINS {
        return bad(format!(
            "network.rules names {} hosts; at most {MAX_DOMAINS} are allowed",
            rules.len()
        ));
    }
    for (host, list) in rules {
        if host == "*" {
            return bad("network.rules: \"*\" is not a host; name one (a leading \"*.\" wildcard is allowed)".into());
        }
        Pattern::parse("network.rules", host)?;
        if list.len() > MAX_RULES_PER_DOMAIN {
            return bad(format!(
                "network.rules[{host:?}] has {} rules; at most {MAX_RULES_PER_DOMAIN} is allowed",
                list.len()
            ));
        }
        for rule in list {
            let headers = rule.transform.as_ref().map(|t| &t.headers);
            let Some(headers) = headers else { continue };
            if headers.len() > MAX_HEADERS {
                return bad(format!(
                    "network.rules[{host:?}] sets {} headers; at most {MAX_HEADERS} are allowed",
                    headers.len()
                ));
            }
            let mut secrets = BTreeSet::new();
            for (name, value) in headers {
                if !is_token(name) || name.len() > MAX_HEADER_NAME {
                    return bad(format!(
                        "network.rules[{host:?}]: header name {name:?} must be an HTTP token of at most {MAX_HEADER_NAME} characters"
                    ));
                }
                if value.len() > MAX_HEADER_VALUE || !is_field_value(value) {
                    return bad(format!(
                        "network.rules[{host:?}]: the value of header {name:?} must be a valid header value of at most {MAX_HEADER_VALUE} characters"
                    ));
                }
                for piece in pieces(value)? {
                    match piece {
                        Piece::Secret(s) => {
                            secrets.insert(s);
                        }
                        Piece::Identity(_) => {
                            return bad(format!(
                                "network.rules[{host:?}]: ${{e2b.identity.tokens.*}} placeholders need workload identity tokens, which this gateway does not mint"
                            ));
                        }
                        Piece::Text(_) => {}
                    }
                }
            }
            if secrets.len() > MAX_SECRETS_PER_DOMAIN {
                return bad(format!(
                    "network.rules[{host:?}] uses {} secrets; at most {MAX_SECRETS_PER_DOMAIN} are allowed",
                    secrets.len()
                ));
            }
        }
    }
    Ok(())
}

/// Keys lowercased, as e2b stores them.
pub fn normalized(rules: BTreeMap<String, Vec<Rule>>) -> BTreeMap<String, Vec<Rule>> {
    rules
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect()
}

/// The rules an egress proxy must act on: all of them when some rule sets headers (a host's
/// own rule wins over a wildcard's even when it sets none), else none.
pub fn intercepted(rules: &BTreeMap<String, Vec<Rule>>) -> BTreeMap<String, Vec<Rule>> {
    if sets_headers(rules) {
        rules.clone()
    } else {
        BTreeMap::new()
    }
}

/// Whether some rule sets headers (so that some host is intercepted).
pub fn sets_headers(rules: &BTreeMap<String, Vec<Rule>>) -> bool {
    rules
        .values()
        .flatten()
        .any(|r| r.transform.as_ref().is_some_and(|t| !t.headers.is_empty()))
}

/// The headers requests to `host` get, if its rule (see `lookup`) sets any.
pub fn headers_for<'a>(
    rules: &'a BTreeMap<String, Vec<Rule>>,
    host: &str,
) -> Option<&'a BTreeMap<String, String>> {
    lookup(rules, host)?
        .iter()
        .filter_map(|r| r.transform.as_ref())
        .map(|t| &t.headers)
        .find(|h| !h.is_empty())
}

/// The rules for `host`: its exact key, else the longest wildcard key that matches it.
pub fn lookup<'a>(rules: &'a BTreeMap<String, Vec<Rule>>, host: &str) -> Option<&'a [Rule]> {
    let host = super::domains::normalize_host(host);
    if let Some(r) = rules.get(&host) {
        return Some(r);
    }
    rules
        .iter()
        .filter_map(|(k, v)| {
            let p = Pattern::parse("network.rules", k).ok()?;
            (matches!(p, Pattern::Under(_)) && p.matches(&host)).then(|| (p.specificity(), v))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, v)| v.as_slice())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(v: serde_json::Value) -> BTreeMap<String, Vec<Rule>> {
        normalized(serde_json::from_value(v).expect("rules"))
    }

    #[test]
    fn placeholders_split_values_and_bad_ones_are_refused() {
        assert_eq!(
            pieces("Bearer ${e2b.secrets.OpenAI}").unwrap(),
            vec![
                Piece::Text("Bearer ".into()),
                Piece::Secret("openai".into())
            ]
        );
        assert_eq!(
            pieces("${e2b.secrets.a}:${e2b.secrets.b}").unwrap(),
            vec![
                Piece::Secret("a".into()),
                Piece::Text(":".into()),
                Piece::Secret("b".into())
            ]
        );
        assert_eq!(
            pieces("cost ${HOME} $5").unwrap(),
            vec![
                Piece::Text("cost ".into()),
                Piece::Text("${HOME}".into()),
                Piece::Text(" $5".into())
            ]
        );
        for bad in [
            "${e2b.secrets.x",
            "${}",
            "${e2b.secrets.${e2b.secrets.x}}",
            "${e2b.secrets.}",
            "${e2b.secrets.a b}",
        ] {
            let e = pieces(bad).unwrap_err();
            assert!(e.message.contains("malformed E2B placeholder"), "{bad}");
        }
    }

    #[test]
    fn e2bs_limits_hold() {
        let ok = rules(serde_json::json!({
            "api.openai.com": [{"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.openai}"}}}],
            "*.github.com": [{}],
            "Example.COM": [{"transform": {}}],
        }));
        validate(&ok).unwrap();
        assert!(ok.contains_key("example.com"), "keys are lowercased");

        let eleven: serde_json::Map<String, serde_json::Value> = (0..11)
            .map(|i| (format!("h{i}.example"), serde_json::json!([{}])))
            .collect();
        let too_many = [
            serde_json::Value::Object(eleven),
            serde_json::json!({"a.example": [{}, {}]}),
            serde_json::json!({"*": [{}]}),
            serde_json::json!({"not a host": [{}]}),
            serde_json::json!({"a.example": [{"transform": {"headers": {"bad name": "v"}}}]}),
            serde_json::json!({"a.example": [{"transform": {"headers": {"X": "a\r\nInjected: 1"}}}]}),
            serde_json::json!({"a.example": [{"transform": {"headers": {"X": "v".repeat(2049)}}}]}),
            serde_json::json!({"a.example": [{"transform": {"headers": {"X".repeat(65): "v"}}}]}),
            serde_json::json!({"a.example": [{"transform": {"headers": {"X": "${e2b.identity.tokens.aws}"}}}]}),
        ];
        for body in too_many {
            assert!(validate(&rules(body.clone())).is_err(), "{body}");
        }
        let headers: serde_json::Map<String, serde_json::Value> = (0..21)
            .map(|i| (format!("X-{i}"), serde_json::json!("v")))
            .collect();
        let many_headers = serde_json::json!({"a.example": [{"transform": {"headers": headers}}]});
        assert!(validate(&rules(many_headers)).is_err());
        let value: String = (0..33).map(|i| format!("${{e2b.secrets.s{i}}}")).collect();
        let many_secrets =
            serde_json::json!({"a.example": [{"transform": {"headers": {"X": value}}}]});
        assert!(
            validate(&rules(many_secrets))
                .unwrap_err()
                .message
                .contains("secrets")
        );
    }

    #[test]
    fn the_exact_key_wins_then_the_longest_wildcard() {
        let r = rules(serde_json::json!({
            "api.example.com": [{"transform": {"headers": {"K": "exact"}}}],
            "*.example.com": [{"transform": {"headers": {"K": "short"}}}],
            "*.deep.example.com": [{"transform": {"headers": {"K": "long"}}}],
        }));
        let k = |host: &str| {
            lookup(&r, host).map(|rs| rs[0].transform.as_ref().unwrap().headers["K"].clone())
        };
        assert_eq!(k("API.example.com:443").as_deref(), Some("exact"));
        assert_eq!(k("x.deep.example.com").as_deref(), Some("long"));
        assert_eq!(k("deep.example.com").as_deref(), Some("short"));
        assert_eq!(k("other.example.com").as_deref(), Some("short"));
        assert_eq!(k("example.com"), None, "a wildcard never names its apex");
        assert_eq!(k("example.org"), None);
    }

    #[test]
    fn a_hosts_own_rule_wins_even_when_it_sets_nothing() {
        let r = rules(serde_json::json!({
            "quiet.example.com": [{}],
            "*.example.com": [{"transform": {"headers": {"K": "v"}}}],
        }));
        let r = intercepted(&r);
        assert_eq!(r.len(), 2);
        assert!(headers_for(&r, "quiet.example.com").is_none());
        assert_eq!(
            headers_for(&r, "loud.example.com").map(|h| h["K"].as_str()),
            Some("v")
        );
        let none = rules(serde_json::json!({"a.example": [{}], "b.example": [{"transform": {}}]}));
        assert!(
            intercepted(&none).is_empty(),
            "nothing to set: nothing intercepted"
        );
    }
}
