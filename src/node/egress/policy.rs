//! Whether an outbound TCP connection may leave, in e2b's order: an allowed name, then an
//! allowed address, then a denied address; anything else leaves. An allowed name is dialled
//! by the proxy itself (resolved on the node, never at the address the sandbox asked for), so
//! a sandbox that spoofs its resolver gains nothing; the dialled addresses must still not be
//! private or the node's own.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use crate::model::domains::Pattern;
use crate::model::network::{Egress, NetworkPolicy, Ranges, merge, parse_cidr};
use crate::model::transforms::{self, Rule};
use crate::model::{Error, Result};

/// A sandbox's egress rules, parsed once per policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    names: Vec<Pattern>,
    allow: Ranges,
    deny: Ranges,
    /// Hosts whose requests get headers (see `model::transforms`).
    transforms: BTreeMap<String, Vec<Rule>>,
    /// Whose secrets those headers name.
    tenant: String,
}

/// What the proxy does with one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Close it without a byte.
    Deny,
    /// Connect to the address the sandbox asked for.
    Address,
    /// Resolve this name on the node and connect there (the connection matched by name).
    Name(String),
}

impl Rules {
    /// The rules a firewall's sets and names say (see `NetworkPolicy::egress`).
    pub fn from_egress(e: &Egress) -> Result<Rules> {
        let ranges = |what: &str, list: &[String]| -> Result<Ranges> {
            list.iter()
                .map(|c| {
                    parse_cidr(c)
                        .ok_or_else(|| Error::invalid(format!("{what}: {c:?} is not a CIDR")))
                })
                .collect::<Result<Ranges>>()
                .map(merge)
        };
        Ok(Rules {
            names: e
                .names
                .iter()
                .map(|n| Pattern::parse("network.allowOut", n))
                .collect::<Result<_>>()?,
            allow: ranges("allow", &e.allow)?,
            deny: ranges("deny", &e.deny)?,
            transforms: e.transforms.clone(),
            tenant: e.tenant.clone(),
        })
    }

    /// The rules of `policy` (through `NetworkPolicy::egress`, the one place that reads it);
    /// `None` when it restricts nothing (every connection leaves).
    pub fn of(policy: &NetworkPolicy) -> Result<Option<Rules>> {
        policy.egress()?.map(|e| Rules::from_egress(&e)).transpose()
    }

    /// The verdict on a connection to `dst` that carries `name` (an HTTP `Host` or a TLS SNI,
    /// when it has one).
    pub fn decide(&self, name: Option<&str>, dst: Ipv4Addr) -> Verdict {
        if let Some(n) = name
            && self.names.iter().any(|p| p.matches(n))
        {
            return Verdict::Name(crate::model::domains::normalize_host(n));
        }
        let ip = u32::from(dst);
        let within = |r: &Ranges| r.iter().any(|&(a, b)| a <= ip && ip <= b);
        if within(&self.allow) {
            Verdict::Address
        } else if within(&self.deny) {
            Verdict::Deny
        } else {
            Verdict::Address
        }
    }

    /// Whether connections on ports 80 and 443 must show their name: it decides whether
    /// they leave, or whether they get headers.
    pub fn reads_names(&self) -> bool {
        !self.names.is_empty() || !self.transforms.is_empty()
    }

    /// The headers requests to `host` get, when its rule sets some (then it is intercepted).
    pub fn headers_for(&self, host: &str) -> Option<&BTreeMap<String, String>> {
        transforms::headers_for(&self.transforms, host)
    }

    /// Whose secrets the headers name.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &[&str], deny: &[&str]) -> Option<Rules> {
        Rules::of(&NetworkPolicy {
            allow_out: allow.iter().map(|s| s.to_string()).collect(),
            deny_out: deny.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .expect("rules")
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().expect("address")
    }

    #[test]
    fn no_denial_means_no_rules() {
        assert_eq!(rules(&[], &[]), None);
        assert_eq!(rules(&["1.1.1.1"], &[]), None);
        // A name is only ever an exception to denying everything (e2b's 400 otherwise).
        let named = NetworkPolicy {
            allow_out: vec!["pypi.org".into()],
            ..Default::default()
        };
        assert!(Rules::of(&named).is_err());
        let closed = Rules::of(&NetworkPolicy {
            allow_internet_access: Some(false),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(
            closed.decide(Some("pypi.org"), ip("151.101.0.223")),
            Verdict::Deny
        );
    }

    #[test]
    fn names_then_allowed_then_denied_addresses_decide_in_e2bs_order() {
        let r = rules(&["pypi.org", "*.github.com", "1.1.1.1"], &["0.0.0.0/0"]).unwrap();
        assert!(r.reads_names());
        let far = ip("203.0.113.50");
        assert_eq!(
            r.decide(Some("PyPI.org:443"), far),
            Verdict::Name("pypi.org".into())
        );
        assert_eq!(
            r.decide(Some("api.github.com"), far),
            Verdict::Name("api.github.com".into())
        );
        assert_eq!(
            r.decide(Some("github.com"), far),
            Verdict::Deny,
            "not the apex"
        );
        assert_eq!(
            r.decide(None, far),
            Verdict::Deny,
            "no name: the address decides"
        );
        assert_eq!(r.decide(None, ip("1.1.1.1")), Verdict::Address);
        assert_eq!(
            r.decide(Some("evil.example"), ip("1.1.1.1")),
            Verdict::Address
        );
        // Only some addresses denied: the rest leave.
        let some = rules(&[], &["8.8.8.0/24"]).unwrap();
        assert_eq!(some.decide(None, ip("8.8.8.8")), Verdict::Deny);
        assert_eq!(
            some.decide(Some("dns.google"), ip("8.8.4.4")),
            Verdict::Address
        );
    }

    #[test]
    fn header_rules_grant_nothing_but_make_names_read() {
        let policy = NetworkPolicy {
            deny_out: vec!["203.0.113.0/24".into()],
            rules: transforms::normalized(
                serde_json::from_value(serde_json::json!({
                    "API.test": [{"transform": {"headers": {"X-Key": "v"}}}]
                }))
                .unwrap(),
            ),
            ..Default::default()
        };
        let r = Rules::of(&policy).unwrap().unwrap();
        assert!(r.reads_names());
        assert_eq!(
            r.headers_for("api.test:443").map(|h| h["X-Key"].as_str()),
            Some("v")
        );
        assert!(r.headers_for("other.test").is_none());
        // A host with a rule is still judged by the addresses.
        assert_eq!(r.decide(Some("api.test"), ip("203.0.113.9")), Verdict::Deny);
        assert_eq!(
            r.decide(Some("api.test"), ip("198.51.100.9")),
            Verdict::Address
        );
    }

    #[test]
    fn denied_entries_must_be_addresses() {
        let e = Rules::of(&NetworkPolicy {
            deny_out: vec!["example.com".into()],
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.message.contains("denyOut"), "{}", e.message);
        assert!(
            Rules::of(&NetworkPolicy {
                allow_out: vec!["not a name".into()],
                deny_out: vec!["0.0.0.0/0".into()],
                ..Default::default()
            })
            .is_err()
        );
    }
}
