//! What a data-plane request's credential is worth. The SDK holds the sandbox's
//! `envdAccessToken` (a JWT the gateway signs) and sends it as `X-Access-Token`, or signs file
//! URLs with it; the agent inside knows only the node's per-sandbox token. The gateway checks
//! the JWT (or the signature made with it) and swaps in the agent's token; anything else is
//! passed on without a token, for the agent to refuse. So a token of one sandbox never opens
//! another, whatever is sent.

use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What to do with `X-Access-Token` before forwarding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Valid for this sandbox: forward with the agent's token.
    Grant,
    /// No valid credential: forward without a token (the agent answers 401 where it needs one).
    Strip,
}

/// A signed `/files` URL's parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Signed {
    pub path: String,
    /// `read` for downloads, `write` for uploads.
    pub operation: &'static str,
    pub username: String,
    pub signature: String,
    pub expiration: Option<i64>,
}

impl Signed {
    /// The signature parameters of a `/files` request, if it carries a signature.
    pub fn from_request(method: &str, path: &str, query: &str) -> Option<Signed> {
        if path != "/files" {
            return None;
        }
        let operation = match method {
            "GET" | "HEAD" => "read",
            "POST" | "PUT" => "write",
            _ => return None,
        };
        let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        Some(Signed {
            path: get("path").unwrap_or_default(),
            operation,
            username: get("username").unwrap_or_default(),
            signature: get("signature")?,
            expiration: match get("signature_expiration") {
                Some(e) => Some(e.parse().ok()?),
                None => None,
            },
        })
    }
}

/// envd's signature of a file URL: `v1_` + unpadded base64 of the SHA-256 of
/// `path:operation:username:token[:expiration]`.
pub fn sign(
    path: &str,
    operation: &str,
    username: &str,
    token: &str,
    expiration: Option<i64>,
) -> String {
    let mut text = format!("{path}:{operation}:{username}:{token}");
    if let Some(e) = expiration {
        text.push_str(&format!(":{e}"));
    }
    let digest = Sha256::digest(text.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

fn same(a: &str, b: &str) -> bool {
    bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// Decides with the token presented (if any), the sandbox's JWT, and a signature (if any).
pub fn decide(presented: Option<&str>, jwt: &str, signed: Option<&Signed>, now: i64) -> Access {
    if let Some(t) = presented {
        return if same(t, jwt) {
            Access::Grant
        } else {
            Access::Strip
        };
    }
    if let Some(s) = signed {
        if s.expiration.is_some_and(|e| e < now) {
            return Access::Strip;
        }
        let want = sign(&s.path, s.operation, &s.username, jwt, s.expiration);
        if same(&s.signature, &want) {
            return Access::Grant;
        }
    }
    Access::Strip
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_follow_envd() {
        // Computed independently (Python's hashlib and base64).
        let s = sign("/tmp/a.txt", "read", "", "tok", None);
        assert_eq!(s, "v1_tRlsooM2hvGDgtWWsmSPYkbHGF1tnIIlZnLHK/9lpTk");
        assert_ne!(s, sign("/tmp/a.txt", "write", "", "tok", None));
        assert_ne!(s, sign("/tmp/a.txt", "read", "", "tok", Some(1)));
        assert_eq!(s, sign("/tmp/a.txt", "read", "", "tok", None));
    }

    #[test]
    fn only_the_sandboxs_credential_is_granted() {
        assert_eq!(decide(Some("jwt"), "jwt", None, 0), Access::Grant);
        assert_eq!(decide(Some("other"), "jwt", None, 0), Access::Strip);
        assert_eq!(decide(None, "jwt", None, 0), Access::Strip);
        let mut s = Signed {
            path: "/tmp/f".into(),
            operation: "read",
            username: "user".into(),
            signature: sign("/tmp/f", "read", "user", "jwt", Some(100)),
            expiration: Some(100),
        };
        assert_eq!(decide(None, "jwt", Some(&s), 50), Access::Grant);
        assert_eq!(decide(None, "jwt", Some(&s), 101), Access::Strip, "expired");
        assert_eq!(decide(None, "other-jwt", Some(&s), 50), Access::Strip);
        s.operation = "write";
        assert_eq!(
            decide(None, "jwt", Some(&s), 50),
            Access::Strip,
            "read-only signature"
        );
        // A wrong header token is not rescued by a signature.
        s.operation = "read";
        assert_eq!(decide(Some("bad"), "jwt", Some(&s), 50), Access::Strip);
    }

    #[test]
    fn signed_urls_parse() {
        let s = Signed::from_request(
            "GET",
            "/files",
            "path=%2Ftmp%2Fa%20b&username=user&signature=v1_x&signature_expiration=123",
        )
        .unwrap();
        assert_eq!(s.path, "/tmp/a b");
        assert_eq!(s.operation, "read");
        assert_eq!(s.expiration, Some(123));
        assert_eq!(
            Signed::from_request("POST", "/files", "path=a&signature=v1_x")
                .unwrap()
                .operation,
            "write"
        );
        assert!(Signed::from_request("GET", "/files", "path=a").is_none());
        assert!(Signed::from_request("GET", "/envs", "signature=x").is_none());
        assert!(
            Signed::from_request("GET", "/files", "signature=x&signature_expiration=soon")
                .is_none()
        );
    }
}
