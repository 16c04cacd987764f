//! Domain names in e2b's egress rules: `example.com` (that name, any case), `*.example.com`
//! (any name under it, at any depth, not the name itself) and `*` (every name). An egress
//! proxy matches them against the name a connection carries: an HTTP request's `Host` or a TLS
//! ClientHello's SNI.

use super::{Error, Result};

/// Longest name taken (e2b's limit for rule keys).
pub const MAX_NAME: usize = 128;

/// One domain entry, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// `*`: every name.
    Any,
    /// A name, lowercased.
    Exact(String),
    /// `*.suffix`: names ending in `.suffix` (the suffix lowercased, without the dot).
    Under(String),
}

impl Pattern {
    /// Parses `entry` (`what` names its field in the error).
    pub fn parse(what: &str, entry: &str) -> Result<Pattern> {
        if entry == "*" {
            return Ok(Pattern::Any);
        }
        let (wild, name) = match entry.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, entry),
        };
        check_name(what, entry, name)?;
        let name = name.to_ascii_lowercase();
        Ok(if wild {
            Pattern::Under(name)
        } else {
            Pattern::Exact(name)
        })
    }

    /// Whether `host` (a name as a connection carries it: any case, maybe a trailing dot, maybe
    /// a port) is one this pattern names.
    pub fn matches(&self, host: &str) -> bool {
        let host = normalize_host(host);
        match self {
            Pattern::Any => !host.is_empty(),
            Pattern::Exact(n) => host == *n,
            Pattern::Under(suffix) => host
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        }
    }

    /// How specific the pattern is, for "the longest wildcard wins": the suffix's length.
    pub fn specificity(&self) -> usize {
        match self {
            Pattern::Any => 0,
            Pattern::Exact(n) | Pattern::Under(n) => n.len(),
        }
    }
}

/// A name as a connection carries it, made comparable: without a port or a trailing dot,
/// lowercased. IPv6 literals (`[::1]:80`) keep their brackets.
pub fn normalize_host(host: &str) -> String {
    let h = host.trim();
    let h = if h.starts_with('[') {
        h.split(']')
            .next()
            .map(|s| format!("{s}]"))
            .unwrap_or_default()
    } else {
        match h.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name.to_string(),
            _ => h.to_string(),
        }
    };
    h.trim_end_matches('.').to_ascii_lowercase()
}

/// A DNS name: 1 to 128 characters in dot-separated labels of letters, digits, '-' and '_',
/// none empty, none longer than 63, none starting or ending with '-'; not an IP address.
fn check_name(what: &str, entry: &str, name: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::invalid(format!("{what}: {entry:?} {why}")));
    if name.is_empty() || name.len() > MAX_NAME {
        return bad(&format!(
            "must be a domain name of 1 to {MAX_NAME} characters"
        ));
    }
    if name.parse::<std::net::IpAddr>().is_ok() {
        return bad("is an address, not a domain name");
    }
    if !has_dns_labels(name) {
        return bad("is not a domain name (only one leading \"*.\" wildcard is allowed)");
    }
    Ok(())
}

/// Whether `name` is dot-separated labels of letters, digits, '-' and '_', none empty, none
/// longer than 63, none starting or ending with '-'.
pub fn has_dns_labels(name: &str) -> bool {
    name.split('.').all(|l| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Pattern {
        Pattern::parse("allowOut", s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn exact_names_match_in_any_case_with_a_port_or_a_trailing_dot() {
        let e = p("PyPI.org");
        assert_eq!(e, Pattern::Exact("pypi.org".into()));
        for host in [
            "pypi.org",
            "PYPI.ORG",
            "pypi.org:443",
            "pypi.org.",
            "pypi.org.:80",
        ] {
            assert!(e.matches(host), "{host}");
        }
        for host in [
            "files.pypi.org",
            "pypi.org.evil.example",
            "xpypi.org",
            "",
            "pypi.or",
        ] {
            assert!(!e.matches(host), "{host}");
        }
    }

    #[test]
    fn wildcards_match_any_depth_below_and_never_the_apex() {
        let w = p("*.github.com");
        for host in ["api.github.com", "a.b.c.github.com", "API.GitHub.com:443"] {
            assert!(w.matches(host), "{host}");
        }
        for host in [
            "github.com",
            "evilgithub.com",
            ".github.com",
            "github.com.evil.example",
        ] {
            assert!(!w.matches(host), "{host}");
        }
        assert!(p("*").matches("anything.example"));
        assert!(!p("*").matches(""));
        assert!(p("*.a.example").specificity() > p("*.example").specificity());
    }

    #[test]
    fn what_is_not_a_domain_is_refused() {
        for bad in [
            "",
            "*.",
            "**.example.com",
            "a.*.example",
            "*example.com",
            "exa mple.com",
            "-lead.example",
            "a..b",
            "1.2.3.4",
            "*.1.2.3.4x/",
            "http://example.com",
            "example.com/path",
            "ex\u{e4}mple.com",
        ] {
            assert!(Pattern::parse("allowOut", bad).is_err(), "{bad:?}");
        }
        assert!(Pattern::parse("allowOut", &"a".repeat(129)).is_err());
        let e = Pattern::parse("network.allowOut", "a..b").unwrap_err();
        assert!(e.message.contains("network.allowOut"), "{}", e.message);
    }

    #[test]
    fn hosts_are_normalized_as_connections_carry_them() {
        assert_eq!(normalize_host("Example.COM:8080"), "example.com");
        assert_eq!(normalize_host("example.com."), "example.com");
        assert_eq!(normalize_host("[::1]:443"), "[::1]");
        assert_eq!(normalize_host(" host "), "host");
    }
}
