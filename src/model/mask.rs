//! e2b's `maskRequestHost`: the `Host` a request to one of a sandbox's own ports is given on its
//! way in, with `${PORT}` standing for the port it goes to. Checked once at create; applied by
//! the data-plane proxy to every request but envd's.

use super::{Error, Result};

/// What e2b's SDKs and docs write for the target port.
pub const PORT_PLACEHOLDER: &str = "${PORT}";
/// Longest mask taken (a host name is at most 253 characters; the port and placeholders fit).
const MAX_LEN: usize = 300;

/// Checks a mask: `host[:port]` in ASCII, where the host is a DNS name and the port a number,
/// either of them possibly holding `${PORT}`.
pub fn validate(mask: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::invalid(format!(
            "network.maskRequestHost {mask:?}: {why}"
        )))
    };
    if mask.is_empty() || mask.len() > MAX_LEN {
        return bad(&format!("must be 1 to {MAX_LEN} characters"));
    }
    if !mask.is_ascii() {
        return bad("must be ASCII (give an internationalized name in its xn-- form)");
    }
    // With a sample port in place of the placeholder, what is left must be a plain host[:port].
    let sample = mask.replace(PORT_PLACEHOLDER, "8080");
    let (host, port) = match sample.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (sample.as_str(), None),
    };
    if let Some(p) = port
        && !p.parse::<u16>().is_ok_and(|p| p > 0)
    {
        return bad("the port must be a number from 1 to 65535 or ${PORT}");
    }
    if host.is_empty() || host.len() > 253 {
        return bad("the host must be 1 to 253 characters");
    }
    if !super::domains::has_dns_labels(host) {
        return bad(
            "the host must be a DNS name (letters, digits, '-' and '_' in dot-separated labels)",
        );
    }
    Ok(())
}

/// The `Host` a request to `port` gets under `mask`.
pub fn apply(mask: &str, port: u16) -> String {
    mask.replace(PORT_PLACEHOLDER, &port.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_e2b_documents_are_taken_and_filled_in() {
        for ok in [
            "custom-host.example.com:${PORT}",
            "${PORT}-myapp.example.com",
            "localhost",
            "app.internal:3000",
            "under_score.example",
        ] {
            validate(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        assert_eq!(
            apply("custom-host.example.com:${PORT}", 8080),
            "custom-host.example.com:8080"
        );
        assert_eq!(apply("${PORT}-a.example.com", 3000), "3000-a.example.com");
        assert_eq!(apply("plain.example", 3000), "plain.example");
    }

    #[test]
    fn what_is_not_a_host_and_port_is_refused() {
        for bad in [
            "",
            "bücher.example",
            "a b.example",
            "evil.example\r\nX-Injected: 1",
            "host:0",
            "host:99999",
            "host:port",
            "-lead.example",
            "a..b",
            "a/b",
            ":8080",
            "[::1]:80",
        ] {
            let e = validate(bad).unwrap_err();
            assert!(
                e.message.contains("maskRequestHost"),
                "{bad}: {}",
                e.message
            );
        }
        assert!(validate(&"a".repeat(301)).is_err());
    }
}
