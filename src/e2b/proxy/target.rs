//! Which sandbox port a data-plane request is for. The e2b SDKs say it two ways: the
//! `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers (with `E2B_SANDBOX_URL`), or the host name
//! `{port}-{sandboxID}.{domain}` (the default addressing, and the only one that signed file
//! URLs and `get_host()` carry).

use crate::model::ids;
use crate::sandbox::spec::ENVD_PORT;

pub const ID_HEADER: &str = "e2b-sandbox-id";
pub const PORT_HEADER: &str = "e2b-sandbox-port";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The claim id (`sb_…`).
    pub sandbox: String,
    /// As the client spelled it, for error bodies.
    pub published: String,
    pub port: u16,
}

impl Target {
    pub fn is_envd(&self) -> bool {
        self.port == ENVD_PORT
    }
}

/// A malformed data-plane address, answered with 400.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

/// The target of a request, None when the request is for the gateway itself.
pub fn target(
    host: Option<&str>,
    id_header: Option<&str>,
    port_header: Option<&str>,
    domain: Option<&str>,
) -> Option<Result<Target, Malformed>> {
    if let Some(id) = id_header {
        let port = match port_header {
            None => ENVD_PORT,
            Some(p) => match p.trim().parse::<u16>() {
                Ok(p) if p > 0 => p,
                _ => return Some(Err(Malformed(format!("invalid sandbox port {p:?}")))),
            },
        };
        return Some(sandbox(id.trim(), port));
    }
    let domain = domain?.trim_end_matches('.').to_ascii_lowercase();
    let host = host?.to_ascii_lowercase();
    // Drop a port, but not the colons of an IPv6 literal (which never matches a domain).
    let name = match host.rsplit_once(':') {
        Some((n, p)) if !n.contains(':') && p.bytes().all(|b| b.is_ascii_digit()) => n,
        _ => host.as_str(),
    };
    let label = name.strip_suffix(&domain)?.strip_suffix('.')?;
    if label.contains('.') {
        return None;
    }
    let (port, id) = label.split_once('-')?;
    let port = match port.parse::<u16>() {
        Ok(p) if p > 0 => p,
        _ => return None,
    };
    Some(sandbox(id, port))
}

fn sandbox(published: &str, port: u16) -> Result<Target, Malformed> {
    // The SDK accepts composite ids `<sandboxID>-<clientID>`; ours never end in a dash part
    // that is not hex, so only the plain id is taken.
    let id = ids::canonical_claim_id(published)
        .or_else(|| {
            let (head, _) = published.rsplit_once('-')?;
            ids::canonical_claim_id(head)
        })
        .ok_or_else(|| Malformed(format!("invalid sandbox id {published:?}")))?;
    Ok(Target {
        sandbox: id,
        published: published.to_string(),
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "sb-0123456789abcdef";
    const CLAIM: &str = "sb_0123456789abcdef";

    #[test]
    fn headers_name_the_sandbox() {
        let t = target(Some("127.0.0.1:3000"), Some(ID), None, Some("localhost"))
            .unwrap()
            .unwrap();
        assert_eq!((t.sandbox.as_str(), t.port), (CLAIM, 49983));
        assert!(t.is_envd());
        let t = target(None, Some(CLAIM), Some("8080"), None)
            .unwrap()
            .unwrap();
        assert_eq!(t.port, 8080);
        assert!(target(None, Some(ID), Some("nope"), None).unwrap().is_err());
        assert!(target(None, Some(ID), Some("0"), None).unwrap().is_err());
        assert!(target(None, Some("../etc"), None, None).unwrap().is_err());
        let composite = format!("{ID}-6532622b");
        let t = target(None, Some(&composite), None, None).unwrap().unwrap();
        assert_eq!(t.sandbox, CLAIM);
    }

    #[test]
    fn host_names_name_the_sandbox() {
        let host = format!("49983-{ID}.sandboxes.example.com");
        let t = target(Some(&host), None, None, Some("sandboxes.example.com"))
            .unwrap()
            .unwrap();
        assert_eq!((t.sandbox.as_str(), t.port), (CLAIM, 49983));
        let host = format!("8000-{ID}.Example.COM:443");
        let t = target(Some(&host), None, None, Some("example.com"))
            .unwrap()
            .unwrap();
        assert_eq!(t.port, 8000);
        // The gateway's own names are not data-plane requests.
        for h in [
            "example.com",
            "api.example.com",
            "127.0.0.1:3000",
            "localhost:3000",
            "[::1]:3000",
        ] {
            assert_eq!(
                target(Some(h), None, None, Some("example.com")),
                None,
                "{h}"
            );
        }
        let host = format!("a.49983-{ID}.example.com");
        assert_eq!(target(Some(&host), None, None, Some("example.com")), None);
        assert_eq!(
            target(Some("99999-x.example.com"), None, None, Some("example.com")),
            None
        );
        assert!(
            target(
                Some("80-notanid.example.com"),
                None,
                None,
                Some("example.com")
            )
            .unwrap()
            .is_err()
        );
        assert_eq!(target(Some("80-x.example.com"), None, None, None), None);
    }
}
