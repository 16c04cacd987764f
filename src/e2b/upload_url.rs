//! Signed upload URLs: the PUT of a COPY archive carries no API key, so its URL authorizes it.
//!
//! `GET /templates/{templateID}/files/{hash}` hands out
//! `PUT {api}/_uploads/{templateID}/{hash}?team=…&exp=…&sig=…` (contract `template-build.md`
//! §3.2). The signature is an HMAC-SHA256 over the team, the template ID, the hash and the
//! expiry, so the URL is good for exactly that one upload target until it expires, and any
//! gateway replica holding the same key can check it without shared state.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::model::{Error, Result};

/// How long a handed-out upload URL stays valid: 30 minutes, as upstream's signed PUT URLs.
pub const VALID_FOR_SECS: i64 = 1800;

/// Separates these MACs from any other use of the same key.
const DOMAIN: &[u8] = b"sandbox-gateway template upload v1\0";

/// What an upload URL grants: `team` may PUT the archive `hash` of template `template_id`
/// until `expires` (unix seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadGrant {
    pub team: String,
    pub template_id: String,
    pub hash: String,
    pub expires: i64,
}

/// A files hash as the SDKs send it: lowercase hex SHA-256, exactly 64 characters.
pub fn valid_hash(hash: &str) -> bool {
    hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The HMAC of a grant, or `None` if the key were refused (HMAC takes keys of any length,
/// so that does not happen).
fn mac(
    key: &[u8],
    team: &str,
    template_id: &str,
    hash: &str,
    expires: i64,
) -> Option<Hmac<Sha256>> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).ok()?;
    mac.update(DOMAIN);
    // Each field is length-prefixed, so no choice of team name (which may hold any
    // character) can shift bytes from one field into the next.
    for field in [team, template_id, hash] {
        mac.update(&(field.len() as u64).to_be_bytes());
        mac.update(field.as_bytes());
    }
    mac.update(&expires.to_be_bytes());
    Some(mac)
}

fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    out
}

/// Lowercase hex only: there is one spelling of a signature, so a URL cannot be re-encoded.
fn from_hex(text: &str) -> Option<Vec<u8>> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    let b = text.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    b.chunks_exact(2)
        .map(|p| Some((digit(p[0])? << 4) | digit(p[1])?))
        .collect()
}

/// The query string of the upload URL for `g`: `team=<urlencoded>&exp=<secs>&sig=<hex>`.
/// The template ID and hash are not repeated here: they are in the URL's path, which the
/// verifier passes in.
pub fn sign(key: &[u8], g: &UploadGrant) -> String {
    // An empty `sig` never verifies, so the unreachable failure cannot grant anything.
    let sig = mac(key, &g.team, &g.template_id, &g.hash, g.expires)
        .map(|m| to_hex(&m.finalize().into_bytes()))
        .unwrap_or_default();
    form_urlencoded::Serializer::new(String::new())
        .append_pair("team", &g.team)
        .append_pair("exp", &g.expires.to_string())
        .append_pair("sig", &sig)
        .finish()
}

fn refuse(why: impl std::fmt::Display) -> Error {
    Error::forbidden(format!("upload URL is not valid: {why}"))
}

/// Checks the query of an upload PUT to `/_uploads/{template_id}/{hash}` at time `now` (unix
/// seconds) and returns what it grants. Anything missing, repeated, malformed, tampered with
/// or expired is refused as forbidden.
pub fn verify(
    key: &[u8],
    template_id: &str,
    hash: &str,
    query: &str,
    now: i64,
) -> Result<UploadGrant> {
    if !valid_hash(hash) {
        return Err(refuse("the files hash is not 64 lowercase hex characters"));
    }
    let query = query.strip_prefix('?').unwrap_or(query);
    let (mut team, mut exp, mut sig) = (None, None, None);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        let slot = match k.as_ref() {
            "team" => &mut team,
            "exp" => &mut exp,
            "sig" => &mut sig,
            // Other parameters (a cache buster, say) are not signed and grant nothing.
            _ => continue,
        };
        // A repeated parameter could be read differently by different parsers.
        if slot.replace(v.into_owned()).is_some() {
            return Err(refuse(format!("'{k}' is given more than once")));
        }
    }
    let team = team.ok_or_else(|| refuse("'team' is missing"))?;
    let exp = exp.ok_or_else(|| refuse("'exp' is missing"))?;
    let sig = sig.ok_or_else(|| refuse("'sig' is missing"))?;
    if exp.is_empty() || !exp.bytes().all(|b| b.is_ascii_digit()) {
        return Err(refuse("'exp' is not a number"));
    }
    let expires: i64 = exp.parse().map_err(|_| refuse("'exp' is out of range"))?;
    let sig = from_hex(&sig)
        .filter(|s| s.len() == 32)
        .ok_or_else(|| refuse("'sig' is not 64 lowercase hex characters"))?;
    let mac = mac(key, &team, template_id, hash, expires)
        .ok_or_else(|| refuse("the signing key is unusable"))?;
    // Constant-time comparison: timing must not reveal how much of a guess was right.
    mac.verify_slice(&sig).map_err(|_| {
        refuse("the signature does not match (it is for another template, file or team, or was altered)")
    })?;
    // Checked after the signature, so that an authentic but stale URL is reported as such.
    if now > expires {
        return Err(refuse(format!(
            "it expired {} seconds ago; ask for the file's upload URL again",
            now - expires
        )));
    }
    Ok(UploadGrant {
        team,
        template_id: template_id.to_string(),
        hash: hash.to_string(),
        expires,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ErrorKind;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
    const HASH: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
    const NOW: i64 = 1_700_000_000;

    fn grant(team: &str) -> UploadGrant {
        UploadGrant {
            team: team.to_string(),
            template_id: "k3xabcdefghij0123456".to_string(),
            hash: HASH.to_string(),
            expires: NOW + VALID_FOR_SECS,
        }
    }

    fn refused(r: Result<UploadGrant>, needle: &str) {
        let e = r.expect_err(needle);
        assert_eq!(e.kind, ErrorKind::Forbidden, "{e}");
        assert!(e.message.starts_with("upload URL is not valid: "), "{e}");
        assert!(e.message.contains(needle), "wanted {needle:?} in {e}");
    }

    #[test]
    fn a_signed_url_round_trips() {
        for team in ["default", "team a&b=c/ü?%+#\0\n", ""] {
            let g = grant(team);
            let q = sign(KEY, &g);
            assert!(q.starts_with("team="), "{q}");
            assert!(q.contains(&format!("&exp={}&sig=", g.expires)), "{q}");
            assert_eq!(verify(KEY, &g.template_id, HASH, &q, NOW).unwrap(), g);
            // Still good at the last second, and with a leading '?'.
            let at_end = verify(KEY, &g.template_id, HASH, &format!("?{q}"), g.expires);
            assert_eq!(at_end.unwrap(), g);
        }
    }

    #[test]
    fn it_is_bound_to_template_hash_team_and_key() {
        let g = grant("default");
        let q = sign(KEY, &g);
        refused(
            verify(KEY, "k3xabcdefghij0123457", HASH, &q, NOW),
            "does not match",
        );
        let other_hash = HASH.replace("0f1e", "0f1f");
        refused(
            verify(KEY, &g.template_id, &other_hash, &q, NOW),
            "does not match",
        );
        let other_team = q.replace("team=default", "team=defaulu");
        refused(
            verify(KEY, &g.template_id, HASH, &other_team, NOW),
            "does not match",
        );
        refused(
            verify(b"another key", &g.template_id, HASH, &q, NOW),
            "does not match",
        );
    }

    #[test]
    fn fields_cannot_be_shifted_between_each_other() {
        // Same concatenation of team + template ID, split differently.
        let a = UploadGrant {
            team: "ab".into(),
            template_id: "c".into(),
            ..grant("")
        };
        let b = UploadGrant {
            team: "a".into(),
            template_id: "bc".into(),
            ..grant("")
        };
        let sig = |q: String| q.rsplit_once("sig=").map(|(_, s)| s.to_string());
        assert_ne!(sig(sign(KEY, &a)), sig(sign(KEY, &b)));
    }

    #[test]
    fn tampered_exp_or_sig_is_refused() {
        let g = grant("default");
        let q = sign(KEY, &g);
        let later = q.replace(
            &format!("exp={}", g.expires),
            &format!("exp={}", g.expires + 3600),
        );
        refused(
            verify(KEY, &g.template_id, HASH, &later, NOW),
            "does not match",
        );
        let (head, sig) = q.rsplit_once("sig=").unwrap();
        let flipped: String = sig
            .chars()
            .enumerate()
            .map(|(i, c)| {
                if i == 10 {
                    if c == '0' { '1' } else { '0' }
                } else {
                    c
                }
            })
            .collect();
        refused(
            verify(
                KEY,
                &g.template_id,
                HASH,
                &format!("{head}sig={flipped}"),
                NOW,
            ),
            "does not match",
        );
        refused(
            verify(
                KEY,
                &g.template_id,
                HASH,
                &format!("{head}sig={}", sig.to_uppercase()),
                NOW,
            ),
            "'sig' is not",
        );
        refused(
            verify(
                KEY,
                &g.template_id,
                HASH,
                &format!("{head}sig={}", &sig[..62]),
                NOW,
            ),
            "'sig' is not",
        );
        refused(
            verify(KEY, &g.template_id, HASH, &format!("{head}sig="), NOW),
            "'sig' is not",
        );
        refused(
            verify(KEY, &g.template_id, HASH, &format!("{q}&sig={sig}"), NOW),
            "more than once",
        );
        refused(
            verify(KEY, &g.template_id, HASH, &format!("team=other&{q}"), NOW),
            "more than once",
        );
    }

    #[test]
    fn expired_urls_are_refused() {
        let g = grant("default");
        let q = sign(KEY, &g);
        refused(
            verify(KEY, &g.template_id, HASH, &q, g.expires + 1),
            "expired 1 seconds ago",
        );
        let old = UploadGrant {
            expires: NOW - 10,
            ..grant("default")
        };
        refused(
            verify(KEY, &old.template_id, HASH, &sign(KEY, &old), NOW),
            "expired",
        );
    }

    #[test]
    fn missing_or_garbage_queries_are_refused() {
        let g = grant("default");
        let q = sign(KEY, &g);
        let t = g.template_id.as_str();
        refused(verify(KEY, t, HASH, "", NOW), "'team' is missing");
        refused(verify(KEY, t, HASH, "%%%&&&==", NOW), "missing");
        refused(verify(KEY, t, HASH, "\u{0}\u{1}garbage", NOW), "missing");
        let no_exp = q.replace(&format!("exp={}&", g.expires), "");
        refused(verify(KEY, t, HASH, &no_exp, NOW), "'exp' is missing");
        let no_sig = q.split("&sig=").next().unwrap().to_string();
        refused(verify(KEY, t, HASH, &no_sig, NOW), "'sig' is missing");
        let exp = format!("exp={}", g.expires);
        for bad in ["exp=", "exp=-5", "exp=1e9", "exp=+1800", "exp=abc"] {
            refused(
                verify(KEY, t, HASH, &q.replace(&exp, bad), NOW),
                "'exp' is not a number",
            );
        }
        refused(
            verify(
                KEY,
                t,
                HASH,
                &q.replace(&exp, "exp=99999999999999999999"),
                NOW,
            ),
            "out of range",
        );
        refused(verify(KEY, t, &HASH.to_uppercase(), &q, NOW), "files hash");
    }

    #[test]
    fn valid_hash_is_exactly_64_lowercase_hex() {
        assert!(valid_hash(HASH));
        assert!(valid_hash(&"0".repeat(64)));
        assert!(!valid_hash(&HASH.to_uppercase()));
        assert!(!valid_hash(&HASH[..63]));
        assert!(!valid_hash(&format!("{HASH}0")));
        assert!(!valid_hash(""));
        assert!(!valid_hash(&"g".repeat(64)));
        assert!(!valid_hash(&format!("{}/", &HASH[..63])));
    }
}
