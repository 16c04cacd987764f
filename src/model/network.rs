//! A sandbox's network policy as e2b expresses it (`allowOut`/`denyOut` lists of IPv4
//! addresses and CIDRs, internet on or off, public ports or token-guarded ones), validated
//! once, and reduced to the two address sets a sandbox's firewall enforces.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use super::transforms::Rule;
use super::{Error, Result};

/// e2b's "all traffic" (`ALL_TRAFFIC` in the SDKs).
pub const ALL_TRAFFIC: &str = "0.0.0.0/0";
/// Most entries one list may hold: the firewall's sets stay small and a request bounded.
pub const MAX_RULES: usize = 256;

/// What a sandbox was given at create, or by its last network update. The lists are kept as
/// submitted, so that reads report what was asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkPolicy {
    #[serde(default)]
    pub allow_out: Vec<String>,
    #[serde(default)]
    pub deny_out: Vec<String>,
    /// `allow_internet_access` as submitted (false denies all traffic, as `0.0.0.0/0` does).
    #[serde(default)]
    pub allow_internet_access: Option<bool>,
    /// False: a request to one of the sandbox's own ports through the gateway needs the
    /// sandbox's traffic access token.
    #[serde(default = "yes")]
    pub allow_public_traffic: bool,
    /// e2b's `maskRequestHost`: the `Host` requests to the sandbox's own ports get, `${PORT}`
    /// standing for the port (the original host goes in `X-Forwarded-Host`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_request_host: Option<String>,
    /// e2b's `dnsServers`: the resolvers a sandbox whose `allowOut` names domains may reach
    /// (unset: 8.8.8.8, as e2b; empty: none). They do not change its `/etc/resolv.conf`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_servers: Option<Vec<String>>,
    /// e2b's `rules`: per host, the headers the egress proxy sets on its HTTP(S) requests
    /// (keys lowercased). They grant no access of their own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rules: BTreeMap<String, Vec<Rule>>,
}

/// The resolver a sandbox with domain rules may reach when it names none (e2b's default).
pub const DEFAULT_DNS_SERVER: &str = "8.8.8.8";

fn yes() -> bool {
    true
}

impl Default for NetworkPolicy {
    fn default() -> Self {
        NetworkPolicy {
            allow_out: Vec::new(),
            deny_out: Vec::new(),
            allow_internet_access: None,
            allow_public_traffic: true,
            mask_request_host: None,
            dns_servers: None,
            rules: BTreeMap::new(),
        }
    }
}

/// The addresses a sandbox's firewall lets out (`allow`, which wins) and turns away (`deny`),
/// as disjoint, merged CIDR prefixes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Egress {
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    /// Domain entries of `allowOut` (`example.com`, `*.example.com`): only an egress proxy,
    /// which sees the name a connection carries, can allow by them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// Hosts whose HTTP(S) requests get headers (`NetworkPolicy::rules`): only those that set
    /// some, since a host is intercepted only to set them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub transforms: BTreeMap<String, Vec<Rule>>,
    /// Whose secrets the transforms' placeholders name (the sandbox's tenant), set by the node.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tenant: String,
}

impl Egress {
    /// Whether connections must pass the egress proxy: it alone sees names and sets headers.
    pub fn needs_proxy(&self) -> bool {
        !self.names.is_empty() || !self.transforms.is_empty()
    }
}

impl NetworkPolicy {
    /// Checks every entry; the error names the first one that is not an IPv4 address or CIDR.
    pub fn validate(&self) -> Result<()> {
        if let Some(mask) = &self.mask_request_host {
            super::mask::validate(mask)?;
        }
        super::transforms::validate(&self.rules)?;
        for (field, list) in [("allowOut", &self.allow_out), ("denyOut", &self.deny_out)] {
            if list.len() > MAX_RULES {
                return Err(Error::invalid(format!(
                    "network.{field} has {} entries; at most {MAX_RULES} are allowed",
                    list.len()
                )));
            }
            for entry in list {
                if field == "allowOut" && is_name(entry) {
                    super::domains::Pattern::parse("network.allowOut", entry)?;
                } else {
                    parse_entry(field, entry)?;
                }
            }
        }
        // As e2b: a name can only be an exception to denying everything.
        if self.allow_out.iter().any(|e| is_name(e))
            && !self.deny_out.iter().any(|d| d == ALL_TRAFFIC)
            && self.allow_internet_access != Some(false)
        {
            return Err(Error::invalid(
                "When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out to block all other traffic.",
            ));
        }
        Ok(())
    }

    /// The domain entries of `allowOut`.
    pub fn names(&self) -> Vec<String> {
        self.allow_out
            .iter()
            .filter(|e| is_name(e))
            .cloned()
            .collect()
    }

    /// Whether nothing may leave at all: everything denied, nothing allowed back.
    pub fn denies_everything(&self) -> bool {
        self.allow_out.is_empty()
            && (self.allow_internet_access == Some(false)
                || self
                    .deny_out
                    .iter()
                    .any(|d| parse_entry("denyOut", d).is_ok_and(|r| r == (0, u32::MAX))))
    }

    /// The firewall's sets, or None when nothing is denied (the default: all egress open).
    /// Allowed entries only carve exceptions out of denied ones, so they are cut to them.
    pub fn egress(&self) -> Result<Option<Egress>> {
        self.validate()?;
        let mut deny: Ranges = self
            .deny_out
            .iter()
            .filter_map(|d| parse_entry("denyOut", d).ok())
            .collect();
        if self.allow_internet_access == Some(false) {
            deny.push((0, u32::MAX));
        }
        let deny = merge(deny);
        let transforms = super::transforms::intercepted(&self.rules);
        if deny.is_empty() {
            // Headers to set still need the proxy, though every address may be reached.
            return Ok((!transforms.is_empty()).then(|| Egress {
                allow: Vec::new(),
                deny: Vec::new(),
                names: Vec::new(),
                transforms,
                tenant: String::new(),
            }));
        }
        let names = self.names();
        let mut allow: Ranges = self
            .allow_out
            .iter()
            .filter_map(|a| parse_entry("allowOut", a).ok())
            .collect();
        if !names.is_empty() {
            // As e2b: with names allowed, so are the resolvers that turn them into addresses.
            let dns = self
                .dns_servers
                .clone()
                .unwrap_or_else(|| vec![DEFAULT_DNS_SERVER.to_string()]);
            allow.extend(dns.iter().filter_map(|d| parse_cidr(d)));
        }
        let allow = intersect(&merge(allow), &deny);
        let deny = subtract(&deny, &allow);
        Ok(Some(Egress {
            allow: prefixes(&allow),
            deny: prefixes(&deny),
            names,
            transforms,
            tenant: String::new(),
        }))
    }
}

/// Inclusive IPv4 ranges.
pub type Ranges = Vec<(u32, u32)>;

/// Parses `a.b.c.d/n` (host bits are ignored, as routers do) or a bare address (a /32).
pub fn parse_cidr(cidr: &str) -> Option<(u32, u32)> {
    let (addr, bits) = match cidr.split_once('/') {
        Some((a, b)) => (a, b.parse::<u32>().ok().filter(|b| *b <= 32)?),
        None => (cidr, 32),
    };
    let ip = u32::from(addr.parse::<Ipv4Addr>().ok()?);
    let mask = if bits == 0 {
        0
    } else {
        u32::MAX << (32 - bits)
    };
    Some((ip & mask, (ip & mask) | !mask))
}

/// Checks an operator's list of IPv4 CIDRs (`what` names it in the error).
pub fn parse_cidrs(what: &str, list: &[String]) -> Result<Ranges> {
    list.iter()
        .map(|c| {
            parse_cidr(c.trim()).ok_or_else(|| {
                Error::invalid(format!("{what}: {c:?} is not an IPv4 address or CIDR"))
            })
        })
        .collect::<Result<Ranges>>()
        .map(merge)
}

/// Whether an `allowOut` entry is meant as a domain (it has a letter or a wildcard, and is
/// neither an address nor IPv6).
fn is_name(entry: &str) -> bool {
    parse_cidr(entry.trim()).is_none()
        && !entry.contains(':')
        && !entry.contains('/')
        && (entry.starts_with('*') || entry.bytes().any(|b| b.is_ascii_alphabetic()))
}

fn parse_entry(field: &str, entry: &str) -> Result<(u32, u32)> {
    if let Some(r) = parse_cidr(entry.trim()) {
        return Ok(r);
    }
    let host = entry.split('/').next().unwrap_or(entry);
    Err(Error::invalid(if host.contains(':') {
        format!(
            "network.{field}: {entry:?} is IPv6; sandboxes have no IPv6 egress at all, so only IPv4 addresses and CIDRs are taken"
        )
    } else if !entry.is_empty() && host.chars().any(|c| c.is_ascii_alphabetic()) {
        format!(
            "network.{field}: {entry:?} is a domain name; only allowOut takes domain names (deny by address: IPv4 addresses and CIDRs)"
        )
    } else {
        format!("network.{field}: {entry:?} is not an IPv4 address or CIDR")
    }))
}

/// Sorts and joins overlapping or adjacent ranges.
pub fn merge(mut r: Ranges) -> Ranges {
    r.sort_unstable();
    let mut out: Ranges = Vec::with_capacity(r.len());
    for (a, b) in r {
        match out.last_mut() {
            Some(last) if a as u64 <= last.1 as u64 + 1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// The addresses not in `r` (merged input).
pub fn complement(r: &Ranges) -> Ranges {
    let mut out = Vec::new();
    let mut next: u64 = 0;
    for &(a, b) in r {
        if (a as u64) > next {
            out.push((next as u32, a - 1));
        }
        next = next.max(b as u64 + 1);
    }
    if next <= u32::MAX as u64 {
        out.push((next as u32, u32::MAX));
    }
    out
}

fn intersect(a: &Ranges, b: &Ranges) -> Ranges {
    let mut out = Vec::new();
    for &(x1, y1) in a {
        for &(x2, y2) in b {
            let (lo, hi) = (x1.max(x2), y1.min(y2));
            if lo <= hi {
                out.push((lo, hi));
            }
        }
    }
    merge(out)
}

/// The addresses of `a` that are not in `b` (both merged).
pub fn subtract(a: &Ranges, b: &Ranges) -> Ranges {
    intersect(a, &complement(b))
}

/// Merged ranges as the fewest CIDR prefixes.
pub fn prefixes(r: &Ranges) -> Vec<String> {
    let mut out = Vec::new();
    for &(from, to) in r {
        let (mut at, to) = (from as u64, to as u64);
        while at <= to {
            let mut size = if at == 0 {
                32
            } else {
                at.trailing_zeros().min(32)
            };
            while size > 0 && at + (1u64 << size) - 1 > to {
                size -= 1;
            }
            out.push(format!("{}/{}", Ipv4Addr::from(at as u32), 32 - size));
            at += 1u64 << size;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], deny: &[&str]) -> NetworkPolicy {
        NetworkPolicy {
            allow_out: allow.iter().map(|s| s.to_string()).collect(),
            deny_out: deny.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn covers(list: &[String], ip: &str) -> bool {
        let ip = u32::from(ip.parse::<Ipv4Addr>().expect("address"));
        list.iter()
            .filter_map(|p| parse_cidr(p))
            .any(|(a, b)| a <= ip && ip <= b)
    }

    #[test]
    fn nothing_denied_means_no_firewall() {
        assert_eq!(policy(&[], &[]).egress().unwrap(), None);
        assert_eq!(
            policy(&["1.1.1.1"], &[]).egress().unwrap(),
            None,
            "allowing without denying changes nothing"
        );
    }

    #[test]
    fn allow_wins_over_deny_and_is_cut_to_it() {
        let e = policy(&["8.8.8.8", "9.9.9.0/24"], &["8.8.0.0/16"])
            .egress()
            .unwrap()
            .unwrap();
        assert_eq!(e.allow, vec!["8.8.8.8/32"], "9.9.9.0/24 was never denied");
        assert!(covers(&e.deny, "8.8.4.4"));
        assert!(!covers(&e.deny, "8.8.8.8"));
        assert!(!covers(&e.deny, "9.9.9.9"));
    }

    #[test]
    fn internet_off_denies_everything_but_the_exceptions() {
        let p = NetworkPolicy {
            allow_internet_access: Some(false),
            ..policy(&["203.0.113.7"], &[])
        };
        let e = p.egress().unwrap().unwrap();
        assert_eq!(e.allow, vec!["203.0.113.7/32"]);
        assert!(covers(&e.deny, "1.1.1.1") && !covers(&e.deny, "203.0.113.7"));
        assert!(!p.denies_everything());
        assert!(policy(&[], &[ALL_TRAFFIC]).denies_everything());
        assert!(policy(&[], &["0.0.0.0/0", "1.2.3.4"]).denies_everything());
        assert!(!policy(&[], &["1.0.0.0/1"]).denies_everything());
        assert!(
            NetworkPolicy {
                allow_internet_access: Some(false),
                ..Default::default()
            }
            .denies_everything()
        );
    }

    #[test]
    fn overlapping_entries_merge_into_disjoint_prefixes() {
        let e = policy(&[], &["10.0.0.0/8", "10.1.2.3", "11.0.0.0/8", "1.2.3.4/24"])
            .egress()
            .unwrap()
            .unwrap();
        assert_eq!(e.deny, vec!["1.2.3.0/24", "10.0.0.0/7"]);
        assert!(e.allow.is_empty());
    }

    #[test]
    fn entries_that_are_not_ipv4_are_refused_with_the_reason() {
        let err = |allow: &[&str], deny: &[&str]| policy(allow, deny).validate().unwrap_err();
        // Names are exceptions to denying everything, as on e2b, and never denials.
        assert!(err(&["example.com"], &[]).message.contains("ALL_TRAFFIC"));
        assert!(
            err(&["*.example.com"], &["1.0.0.0/8"])
                .message
                .contains("ALL_TRAFFIC")
        );
        assert!(err(&[], &["example.com"]).message.contains("domain name"));
        assert!(err(&["a..b"], &[ALL_TRAFFIC]).message.contains("allowOut"));
        let named = policy(&["pypi.org", "*.github.com", "1.1.1.1"], &[ALL_TRAFFIC]);
        named.validate().unwrap();
        let e = named.egress().unwrap().unwrap();
        assert_eq!(e.names, vec!["pypi.org", "*.github.com"]);
        assert_eq!(
            e.allow,
            vec!["1.1.1.1/32", "8.8.8.8/32"],
            "names bring e2b's resolver"
        );
        let own_dns = NetworkPolicy {
            dns_servers: Some(vec!["9.9.9.9".into()]),
            ..named.clone()
        };
        assert_eq!(
            own_dns.egress().unwrap().unwrap().allow,
            vec!["1.1.1.1/32", "9.9.9.9/32"]
        );
        let no_dns = NetworkPolicy {
            dns_servers: Some(Vec::new()),
            ..named
        };
        assert_eq!(no_dns.egress().unwrap().unwrap().allow, vec!["1.1.1.1/32"]);
        let addresses_only = NetworkPolicy {
            dns_servers: Some(vec!["9.9.9.9".into()]),
            ..policy(&["1.1.1.1"], &[ALL_TRAFFIC])
        };
        assert_eq!(
            addresses_only.egress().unwrap().unwrap().allow,
            vec!["1.1.1.1/32"]
        );
        assert!(err(&[], &["::/0"]).message.contains("IPv6"));
        assert!(err(&[], &["10.0.0.0/33"]).message.contains("not an IPv4"));
        assert!(err(&[], &[""]).message.contains("not an IPv4"));
        assert!(err(&[], &["1.2.3"]).message.contains("denyOut"));
        let many: Vec<String> = (0..=MAX_RULES)
            .map(|i| format!("1.0.{}.{}", i / 256, i % 256))
            .collect();
        let p = NetworkPolicy {
            deny_out: many,
            ..Default::default()
        };
        assert!(p.validate().unwrap_err().message.contains("at most"));
    }

    #[test]
    fn ranges_partition_the_address_space() {
        let r = merge(vec![
            (5, 9),
            (0, 2),
            (8, 20),
            (22, 22),
            (u32::MAX, u32::MAX),
        ]);
        assert_eq!(r, vec![(0, 2), (5, 20), (22, 22), (u32::MAX, u32::MAX)]);
        let c = complement(&r);
        assert_eq!(c, vec![(3, 4), (21, 21), (23, u32::MAX - 1)]);
        assert_eq!(complement(&vec![]), vec![(0, u32::MAX)]);
        assert_eq!(prefixes(&vec![(0, u32::MAX)]), vec!["0.0.0.0/0"]);
        assert_eq!(prefixes(&vec![(0, 2)]), vec!["0.0.0.0/31", "0.0.0.2/32"]);
    }

    #[test]
    fn policies_read_back_with_public_traffic_on_by_default() {
        let p: NetworkPolicy = serde_json::from_str("{}").unwrap();
        assert_eq!(p, NetworkPolicy::default());
        assert!(p.allow_public_traffic);
    }
}
