//! `envdAccessToken`: a JWT (HS256) the gateway signs for one sandbox. It is derived, not
//! stored: the same sandbox always gets the same token from any replica that shares the
//! secret, so create, connect and get agree. It names the sandbox and carries a digest of the
//! node's per-sandbox token, so it is bound to that very instance.

use hmac::{Hmac, KeyInit, Mac};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::model::{Error, Result};

#[derive(Serialize)]
struct Claims<'a> {
    /// The sandbox (claim id).
    sub: &'a str,
    aud: &'static str,
    /// Hex SHA-256 of the node's per-sandbox token.
    inst: String,
}

pub struct EnvdTokens {
    key: EncodingKey,
    header: Header,
    /// The same secret, for traffic access tokens.
    secret: Vec<u8>,
}

impl EnvdTokens {
    pub fn new(secret: &[u8]) -> Result<Self> {
        if secret.len() < 16 {
            return Err(Error::invalid(
                "the envd token secret must be at least 16 bytes",
            ));
        }
        Ok(EnvdTokens {
            key: EncodingKey::from_secret(secret)
                .map_err(|e| Error::invalid(format!("the envd token secret is unusable: {e}")))?,
            header: Header::new(Algorithm::HS256),
            secret: secret.to_vec(),
        })
    }

    pub fn issue(&self, sandbox_id: &str, node_token: &str) -> Result<String> {
        let inst = Sha256::digest(node_token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let claims = Claims {
            sub: sandbox_id,
            aud: "envd",
            inst,
        };
        jsonwebtoken::encode(&self.header, &claims, &self.key)
            .map_err(|e| Error::internal(format!("signing the envd access token: {e}")))
    }
}

impl EnvdTokens {
    /// The `trafficAccessToken` of a sandbox whose ports are not public: an HMAC of the
    /// sandbox and its node token, so every replica derives the same one and it dies with
    /// the instance.
    pub fn traffic(&self, sandbox_id: &str, node_token: &str) -> String {
        // Any key length is valid for HMAC.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.secret) else {
            return String::new();
        };
        mac.update(b"e2b-traffic\0");
        mac.update(sandbox_id.as_bytes());
        mac.update(b"\0");
        mac.update(node_token.as_bytes());
        mac.finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_stable_and_bound_to_the_sandbox() {
        let t = EnvdTokens::new(b"0123456789abcdef0123").unwrap();
        let a = t.issue("sb_0123456789abcdef", "tok-a").unwrap();
        assert_eq!(a, t.issue("sb_0123456789abcdef", "tok-a").unwrap());
        assert_ne!(a, t.issue("sb_0123456789abcdee", "tok-a").unwrap());
        assert_ne!(a, t.issue("sb_0123456789abcdef", "tok-b").unwrap());
        assert_eq!(a.split('.').count(), 3, "a JWT");
        let other = EnvdTokens::new(b"another-secret-value").unwrap();
        assert_ne!(a, other.issue("sb_0123456789abcdef", "tok-a").unwrap());
        assert!(EnvdTokens::new(b"short").is_err());
    }

    #[test]
    fn traffic_tokens_are_stable_per_instance_and_not_the_envd_token() {
        let t = EnvdTokens::new(b"0123456789abcdef0123").unwrap();
        let a = t.traffic("sb_1", "tok-a");
        assert_eq!(a.len(), 64);
        assert_eq!(a, t.traffic("sb_1", "tok-a"));
        assert_ne!(a, t.traffic("sb_2", "tok-a"));
        assert_ne!(a, t.traffic("sb_1", "tok-b"));
        assert_ne!(a, t.issue("sb_1", "tok-a").unwrap());
        let other = EnvdTokens::new(b"another-secret-value").unwrap();
        assert_ne!(a, other.traffic("sb_1", "tok-a"));
    }
}
