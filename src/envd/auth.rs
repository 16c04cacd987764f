//! envd's access rules: the access token (`X-Access-Token`, compared in constant time), signed
//! `/files` URLs, and the user a request selects (`Authorization: Basic base64("<user>:")`).

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub const ACCESS_TOKEN_HEADER: &str = "x-access-token";

/// Which side of `/files` a signature grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Read,
    Write,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
        }
    }
}

pub fn tokens_equal(a: &str, b: &str) -> bool {
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

/// `v1_` + base64 (standard alphabet, no padding) of
/// sha256(`{path}:{read|write}:{username or ''}:{token}[:{expiration}]`).
pub fn signature(
    path: &str,
    op: Operation,
    username: &str,
    token: &str,
    expiration: Option<i64>,
) -> String {
    let mut text = format!("{path}:{}:{username}:{token}", op.as_str());
    if let Some(exp) = expiration {
        text.push_str(&format!(":{exp}"));
    }
    let digest = Sha256::digest(text.as_bytes());
    format!("v1_{}", STANDARD_NO_PAD.encode(digest))
}

/// The parts of a `/files` request that authorize it.
#[derive(Debug, Default, Clone)]
pub struct FileAuth<'a> {
    pub header_token: Option<&'a str>,
    pub signature: Option<&'a str>,
    /// The raw `signature_expiration` parameter.
    pub expiration: Option<&'a str>,
    pub username: Option<&'a str>,
    pub path: &'a str,
}

/// Checks a `/files` request against the token in force: the header token when one is sent,
/// else a signature over path, operation, user and (when given) expiration. `Err` is the
/// message of the 401.
pub fn check_file_access(
    token: Option<&str>,
    req: &FileAuth<'_>,
    op: Operation,
    now_unix: i64,
) -> Result<(), String> {
    let Some(token) = token else { return Ok(()) };
    if let Some(h) = req.header_token.filter(|h| !h.is_empty()) {
        return if tokens_equal(h, token) {
            Ok(())
        } else {
            Err("access token present in header but does not match".into())
        };
    }
    let Some(sig) = req.signature else {
        return Err("missing signature query parameter".into());
    };
    let expiration = match req.expiration {
        None => None,
        Some(raw) => Some(
            raw.parse::<i64>()
                .map_err(|_| format!("invalid signature_expiration '{raw}'"))?,
        ),
    };
    let want = signature(req.path, op, req.username.unwrap_or(""), token, expiration);
    if !tokens_equal(&want, sig) {
        return Err("invalid signature".into());
    }
    if expiration.is_some_and(|exp| exp < now_unix) {
        return Err("signature is already expired".into());
    }
    Ok(())
}

/// The user named by `Authorization: Basic base64("<user>:<anything>")`. Anything that is not
/// a well-formed Basic credential counts as no user (the default applies), as envd's
/// `BasicAuth()` parsing does.
pub fn basic_auth_user(value: Option<&[u8]>) -> Option<String> {
    let v = std::str::from_utf8(value?).ok()?;
    let (scheme, rest) = v.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = STANDARD.decode(rest.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, _password) = text.split_once(':')?;
    Some(user.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_stable_and_bind_every_part() {
        // sha256("/tmp/a.txt:read::tok") in standard base64 without padding.
        let s = signature("/tmp/a.txt", Operation::Read, "", "tok", None);
        assert!(s.starts_with("v1_") && !s.ends_with('='));
        assert_eq!(s.len(), 3 + 43);
        let digest = Sha256::digest(b"/tmp/a.txt:read::tok");
        assert_eq!(s, format!("v1_{}", STANDARD_NO_PAD.encode(digest)));
        let exp = signature("/tmp/a.txt", Operation::Read, "", "tok", Some(100));
        let digest = Sha256::digest(b"/tmp/a.txt:read::tok:100");
        assert_eq!(exp, format!("v1_{}", STANDARD_NO_PAD.encode(digest)));
        assert_ne!(
            s,
            signature("/tmp/a.txt", Operation::Write, "", "tok", None)
        );
        assert_ne!(
            s,
            signature("/tmp/a.txt", Operation::Read, "user", "tok", None)
        );
        assert_ne!(s, signature("/tmp/b.txt", Operation::Read, "", "tok", None));
    }

    #[test]
    fn file_access_rules() {
        let good = signature("/f", Operation::Read, "user", "tok", Some(2000));
        let req = FileAuth {
            signature: Some(&good),
            expiration: Some("2000"),
            username: Some("user"),
            path: "/f",
            ..Default::default()
        };
        assert!(check_file_access(Some("tok"), &req, Operation::Read, 1000).is_ok());
        assert!(check_file_access(None, &FileAuth::default(), Operation::Read, 0).is_ok());
        // Expired, wrong operation, other user, tampered expiration, bad number.
        assert!(check_file_access(Some("tok"), &req, Operation::Read, 2001).is_err());
        assert!(check_file_access(Some("tok"), &req, Operation::Write, 1000).is_err());
        let other = FileAuth {
            username: None,
            ..req.clone()
        };
        assert!(check_file_access(Some("tok"), &other, Operation::Read, 1000).is_err());
        let later = FileAuth {
            expiration: Some("3000"),
            ..req.clone()
        };
        assert!(check_file_access(Some("tok"), &later, Operation::Read, 1000).is_err());
        let junk = FileAuth {
            expiration: Some("soon"),
            ..req.clone()
        };
        assert!(check_file_access(Some("tok"), &junk, Operation::Read, 1000).is_err());
        // The header token wins over a signature, and must match when sent.
        let header = FileAuth {
            header_token: Some("tok"),
            ..FileAuth::default()
        };
        assert!(check_file_access(Some("tok"), &header, Operation::Write, 0).is_ok());
        let wrong = FileAuth {
            header_token: Some("nope"),
            ..req.clone()
        };
        assert!(check_file_access(Some("tok"), &wrong, Operation::Read, 1000).is_err());
        assert!(check_file_access(Some("tok"), &FileAuth::default(), Operation::Read, 0).is_err());
    }

    #[test]
    fn basic_auth_selects_a_user() {
        let b = |s: &str| basic_auth_user(Some(s.as_bytes()));
        assert_eq!(b("Basic dXNlcjo="), Some("user".into())); // "user:"
        assert_eq!(b("basic cm9vdDo="), Some("root".into())); // "root:"
        assert_eq!(b("Basic cm9vdDpwdw=="), Some("root".into())); // "root:pw"
        assert_eq!(b("Basic !!notbase64"), None);
        assert_eq!(b("Basic dXNlcg=="), None); // "user" without a colon
        assert_eq!(b("Bearer dXNlcjo="), None);
        assert_eq!(b("Basic"), None);
        assert_eq!(basic_auth_user(None), None);
        assert_eq!(basic_auth_user(Some(&[0xff, 0xfe])), None);
    }
}
