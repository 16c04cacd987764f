//! Dashboard sessions: a login trades an API key (or the fleet token) for a random session id
//! kept in an HttpOnly, SameSite=Strict cookie. The key itself is never stored, in the browser
//! or here: a session holds the tenant the key stood for. Every call a session makes must also
//! carry the session's CSRF token in a header, which another site's page cannot set.

use std::time::Duration;

use subtle::ConstantTimeEq;

use crate::e2b::auth::Tenant;
use crate::model::ids;

/// The session cookie.
pub const COOKIE: &str = "sgw_session";
/// The header every call a session makes carries its CSRF token in.
pub const CSRF_HEADER: &str = "x-dashboard-csrf";
/// A session nobody used for this long is gone.
pub const IDLE: Duration = Duration::from_secs(30 * 60);
/// Sessions kept at most (the oldest unused go first).
const MAX_SESSIONS: u64 = 10_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub tenant: Tenant,
    pub csrf: String,
    /// Signed in with the fleet token (an operator): the tenant is an admin.
    pub fleet: bool,
}

/// Why a session's call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the dashboard session has expired; sign in again")]
    Expired,
    #[error("the dashboard session's call lacks its CSRF token ({CSRF_HEADER} header)")]
    Csrf,
}

pub struct Sessions {
    live: moka::sync::Cache<String, Session>,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions::with_idle(IDLE)
    }
}

impl Sessions {
    pub fn with_idle(idle: Duration) -> Self {
        Sessions {
            live: moka::sync::Cache::builder()
                .max_capacity(MAX_SESSIONS)
                .time_to_idle(idle)
                .build(),
        }
    }

    /// Starts a session for `tenant`: answers its id (the cookie's value) and the session.
    pub fn start(&self, tenant: Tenant, fleet: bool) -> (String, Session) {
        let id = ids::random_hex(32);
        let session = Session {
            tenant,
            csrf: ids::random_hex(32),
            fleet,
        };
        self.live.insert(id.clone(), session.clone());
        (id, session)
    }

    /// The session with `id`, for the page (no CSRF token needed to read it: the page is where
    /// the token comes from).
    pub fn page(&self, id: &str) -> Option<Session> {
        self.live.get(id)
    }

    /// The session a call with cookie `id` and CSRF header `csrf` acts for.
    pub fn call(&self, id: &str, csrf: Option<&str>) -> Result<Session, Refused> {
        let session = self.live.get(id).ok_or(Refused::Expired)?;
        let presented = csrf.ok_or(Refused::Csrf)?;
        if bool::from(presented.as_bytes().ct_eq(session.csrf.as_bytes())) {
            Ok(session)
        } else {
            Err(Refused::Csrf)
        }
    }

    pub fn end(&self, id: &str) {
        self.live.invalidate(id);
    }
}

/// The session id in a `Cookie` header's value, if ours is there.
pub fn from_cookie_header(value: &str) -> Option<&str> {
    value.split(';').find_map(|pair| {
        let (name, v) = pair.trim().split_once('=')?;
        (name == COOKIE && !v.is_empty()).then_some(v)
    })
}

/// A `Cookie` header's value without our session cookie (None when nothing else is left):
/// what a sandbox may see of a request the data plane forwards.
pub fn without_ours(value: &str) -> Option<String> {
    let rest: Vec<&str> = value
        .split(';')
        .map(str::trim)
        .filter(|p| !p.is_empty() && p.split_once('=').is_none_or(|(n, _)| n != COOKIE))
        .collect();
    (!rest.is_empty()).then(|| rest.join("; "))
}

/// The `Set-Cookie` value that starts session `id` (`secure` when the listener serves TLS).
pub fn set_cookie(id: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        IDLE.as_secs()
    )
}

/// The `Set-Cookie` value that ends a session in the browser.
pub fn clear_cookie(secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn team() -> Tenant {
        Tenant {
            namespace: "team-a".into(),
            admin: false,
        }
    }

    #[test]
    fn a_call_needs_the_sessions_own_csrf_token() {
        let s = Sessions::default();
        let (id, session) = s.start(team(), false);
        assert_eq!(id.len(), 64);
        assert_ne!(id, session.csrf);
        assert_eq!(s.call(&id, Some(&session.csrf)).unwrap().tenant, team());
        assert_eq!(s.call(&id, None), Err(Refused::Csrf));
        assert_eq!(s.call(&id, Some("")), Err(Refused::Csrf));
        let (other, other_session) = s.start(team(), false);
        assert_eq!(s.call(&id, Some(&other_session.csrf)), Err(Refused::Csrf));
        assert_eq!(s.call("nope", Some(&session.csrf)), Err(Refused::Expired));
        s.end(&id);
        assert_eq!(s.call(&id, Some(&session.csrf)), Err(Refused::Expired));
        assert!(s.page(&other).is_some());
    }

    #[test]
    fn an_idle_session_expires() {
        let s = Sessions::with_idle(Duration::from_millis(50));
        let (id, session) = s.start(team(), false);
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(s.call(&id, Some(&session.csrf)), Err(Refused::Expired));
    }

    #[test]
    fn our_cookie_is_found_and_taken_out() {
        assert_eq!(from_cookie_header("a=1; sgw_session=abc; b=2"), Some("abc"));
        assert_eq!(from_cookie_header("sgw_session="), None);
        assert_eq!(from_cookie_header("xsgw_session=abc"), None);
        assert_eq!(
            without_ours("a=1; sgw_session=abc; b=2").as_deref(),
            Some("a=1; b=2")
        );
        assert_eq!(without_ours("sgw_session=abc"), None);
        assert_eq!(without_ours("flag; a=1").as_deref(), Some("flag; a=1"));
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_secure_under_tls() {
        let c = set_cookie("abc", true);
        for part in [
            "sgw_session=abc",
            "HttpOnly",
            "SameSite=Strict",
            "Secure",
            "Path=/",
        ] {
            assert!(c.contains(part), "{c}");
        }
        assert!(!set_cookie("abc", false).contains("Secure"));
        assert!(clear_cookie(false).contains("Max-Age=0"));
    }
}
