//! Whether an outbound TCP connection may leave, in e2b's order: an allowed name, then an
//! allowed address, then a denied address; anything else leaves. An allowed name is dialled
//! by the proxy itself (resolved on the node, never at the address the sandbox asked for), so
//! a sandbox that spoofs its resolver gains nothing; the dialled addresses must still not be
//! private or the node's own.

use std::net::Ipv4Addr;

use crate::model::domains::Pattern;
use crate::model::network::{Egress, NetworkPolicy, Ranges, merge, parse_cidr};
use crate::model::{Error, Result};

/// A sandbox's egress rules, parsed once per policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    names: Vec<Pattern>,
    allow: Ranges,
    deny: Ranges,
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

    /// Whether any entry is a name (then DNS servers must stay reachable).
    pub fn has_names(&self) -> bool {
        !self.names.is_empty()
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
        assert!(r.has_names());
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
