//! Dashboard sessions: a login trades an API key (or the fleet token) for a random session id
//! kept in an HttpOnly, SameSite=Strict cookie. The key itself is never stored, in the browser
//! or here: a session holds the tenant the key stood for and the key's digest, so that a key
//! taken out of the key file ends its sessions. Every call a session makes must also carry the
//! session's CSRF token in a header, which another site's page cannot set.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use subtle::ConstantTimeEq;

use crate::e2b::auth::Tenant;
use crate::model::ids;

/// The session cookie on a plain HTTP listener.
pub const COOKIE: &str = "sgw_session";
/// The session cookie under TLS: a `__Host-` cookie cannot be set by a sandbox's host for the
/// parent domain (nor without `Secure`, nor for a path), so a sibling cannot plant one.
pub const SECURE_COOKIE: &str = "__Host-sgw_session";
/// The header every call a session makes carries its CSRF token in.
pub const CSRF_HEADER: &str = "x-dashboard-csrf";
/// A session nobody used for this long is gone.
pub const IDLE: Duration = Duration::from_secs(30 * 60);
/// And any session after this long, used or not.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at most (the oldest unused go first).
const MAX_SESSIONS: u64 = 10_000;
/// Live sessions one key may hold: a new sign-in beyond them ends the key's oldest, so one key
/// cannot crowd out everyone else's.
pub const PER_KEY: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub tenant: Tenant,
    pub csrf: String,
    /// Signed in with the fleet token (an operator): the tenant is an admin.
    pub fleet: bool,
    /// SHA-256 of the key it signed in with.
    pub key: [u8; 32],
}

/// Why a session's call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the dashboard session has expired; sign in again")]
    Expired,
    #[error("the dashboard session's call lacks its CSRF token ({CSRF_HEADER} header)")]
    Csrf,
    #[error("the key this dashboard session signed in with is no longer valid; sign in again")]
    Revoked,
    #[error("more than one dashboard session cookie came with the call")]
    Ambiguous,
}

pub struct Sessions {
    live: moka::sync::Cache<String, Session>,
    /// Each key's sessions, oldest first (ids of ended ones linger until pushed out).
    by_key: Mutex<HashMap<[u8; 32], VecDeque<String>>>,
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
                .time_to_live(LIFETIME.max(idle))
                .build(),
            by_key: Mutex::new(HashMap::new()),
        }
    }

    /// Starts a session for `tenant`, signed in with the key whose digest is `key`: answers
    /// its id (the cookie's value) and the session.
    pub fn start(&self, tenant: Tenant, fleet: bool, key: [u8; 32]) -> (String, Session) {
        let id = ids::random_hex(32);
        let session = Session {
            tenant,
            csrf: ids::random_hex(32),
            fleet,
            key,
        };
        self.live.insert(id.clone(), session.clone());
        let mut by_key = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        let mine = by_key.entry(key).or_default();
        mine.push_back(id.clone());
        mine.retain(|s| self.live.contains_key(s));
        while mine.len() > PER_KEY {
            if let Some(oldest) = mine.pop_front() {
                self.live.invalidate(&oldest);
            }
        }
        (id, session)
    }

    /// The session with `id`, for the page (no CSRF token needed to read it: the page is where
    /// the token comes from).
    pub fn page(&self, id: &str) -> Option<Session> {
        self.live.get(id)
    }

    /// The session a call with cookie `id` and CSRF header `csrf` acts for, while
    /// `key_valid` says the key it signed in with still is.
    pub fn call(
        &self,
        id: &str,
        csrf: Option<&str>,
        key_valid: impl FnOnce(&Session) -> bool,
    ) -> Result<Session, Refused> {
        let session = self.live.get(id).ok_or(Refused::Expired)?;
        let presented = csrf.ok_or(Refused::Csrf)?;
        if !bool::from(presented.as_bytes().ct_eq(session.csrf.as_bytes())) {
            return Err(Refused::Csrf);
        }
        if !key_valid(&session) {
            self.live.invalidate(id);
            return Err(Refused::Revoked);
        }
        Ok(session)
    }

    pub fn end(&self, id: &str) {
        self.live.invalidate(id);
    }
}

/// The session cookie's name on a listener that does (`secure`) or does not serve TLS.
pub fn cookie_name(secure: bool) -> &'static str {
    if secure { SECURE_COOKIE } else { COOKIE }
}

/// The session id the `Cookie` header values carry under `name`: none, one, or more than one
/// (a cookie planted beside ours, which is refused rather than guessed between).
pub fn from_cookie_headers<'a>(
    values: impl Iterator<Item = &'a str>,
    name: &str,
) -> Result<Option<&'a str>, Refused> {
    let mut found = None;
    for value in values {
        for pair in value.split(';') {
            let Some((n, v)) = pair.trim().split_once('=') else {
                continue;
            };
            if n == name {
                if found.is_some() {
                    return Err(Refused::Ambiguous);
                }
                found = Some(v);
            }
        }
    }
    Ok(found.filter(|v| !v.is_empty()))
}

fn is_ours(name: &str) -> bool {
    name == COOKIE || name == SECURE_COOKIE
}

/// A `Cookie` header's value without our session cookie (None when nothing else is left):
/// what a sandbox may see of a request the data plane forwards.
pub fn without_ours(value: &str) -> Option<String> {
    let rest: Vec<&str> = value
        .split(';')
        .map(str::trim)
        .filter(|p| !p.is_empty() && p.split_once('=').is_none_or(|(n, _)| !is_ours(n.trim())))
        .collect();
    (!rest.is_empty()).then(|| rest.join("; "))
}

/// Whether a `Set-Cookie` value (from a sandbox) would set a cookie of our session's name.
pub fn names_ours(set_cookie: &[u8]) -> bool {
    let text = String::from_utf8_lossy(set_cookie);
    let name = text.split(['=', ';']).next().unwrap_or_default().trim();
    name.eq_ignore_ascii_case(COOKIE) || name.eq_ignore_ascii_case(SECURE_COOKIE)
}

/// The `Set-Cookie` value that starts session `id` (`secure` when the listener serves TLS). No
/// `Max-Age`: the cookie lasts while the browser runs; the session's end is the server's.
pub fn set_cookie(id: &str, secure: bool) -> String {
    let name = cookie_name(secure);
    let secure = if secure { "; Secure" } else { "" };
    format!("{name}={id}; Path=/; HttpOnly; SameSite=Strict{secure}")
}

/// The `Set-Cookie` value that ends a session in the browser.
pub fn clear_cookie(secure: bool) -> String {
    let name = cookie_name(secure);
    let secure = if secure { "; Secure" } else { "" };
    format!("{name}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}")
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

    const KEY: [u8; 32] = [7; 32];

    #[test]
    fn a_call_needs_the_sessions_own_csrf_token() {
        let s = Sessions::default();
        let (id, session) = s.start(team(), false, KEY);
        assert_eq!(id.len(), 64);
        assert_ne!(id, session.csrf);
        let ok = |_: &Session| true;
        assert_eq!(s.call(&id, Some(&session.csrf), ok).unwrap().tenant, team());
        assert_eq!(s.call(&id, None, ok), Err(Refused::Csrf));
        assert_eq!(s.call(&id, Some(""), ok), Err(Refused::Csrf));
        let (other, other_session) = s.start(team(), false, KEY);
        assert_eq!(
            s.call(&id, Some(&other_session.csrf), ok),
            Err(Refused::Csrf)
        );
        assert_eq!(
            s.call("nope", Some(&session.csrf), ok),
            Err(Refused::Expired)
        );
        s.end(&id);
        assert_eq!(s.call(&id, Some(&session.csrf), ok), Err(Refused::Expired));
        assert!(s.page(&other).is_some());
    }

    #[test]
    fn a_revoked_key_ends_its_sessions() {
        let s = Sessions::default();
        let (id, session) = s.start(team(), false, KEY);
        assert_eq!(
            s.call(&id, Some(&session.csrf), |x| x.key != KEY),
            Err(Refused::Revoked)
        );
        assert_eq!(
            s.call(&id, Some(&session.csrf), |_| true),
            Err(Refused::Expired)
        );
    }

    #[test]
    fn one_key_holds_a_bounded_number_of_sessions() {
        let s = Sessions::default();
        let first = s.start(team(), false, KEY).0;
        let others: Vec<String> = (0..PER_KEY)
            .map(|_| s.start(team(), false, KEY).0)
            .collect();
        assert!(s.page(&first).is_none(), "the oldest went");
        assert!(others.iter().all(|o| s.page(o).is_some()));
        let elsewhere = s.start(team(), false, [8; 32]).0;
        assert!(s.page(&elsewhere).is_some() && s.page(&others[0]).is_some());
    }

    #[test]
    fn an_idle_session_expires() {
        let s = Sessions::with_idle(Duration::from_millis(50));
        let (id, session) = s.start(team(), false, KEY);
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(
            s.call(&id, Some(&session.csrf), |_| true),
            Err(Refused::Expired)
        );
    }

    #[test]
    fn our_cookie_is_found_once_and_taken_out() {
        let one = |v: &'static str| from_cookie_headers([v].into_iter(), COOKIE);
        assert_eq!(one("a=1; sgw_session=abc; b=2"), Ok(Some("abc")));
        assert_eq!(one("sgw_session="), Ok(None));
        assert_eq!(one("xsgw_session=abc"), Ok(None));
        assert_eq!(
            one("sgw_session=abc; sgw_session=planted"),
            Err(Refused::Ambiguous)
        );
        assert_eq!(
            from_cookie_headers(["sgw_session=abc", "sgw_session=x"].into_iter(), COOKIE),
            Err(Refused::Ambiguous)
        );
        // Under TLS only the __Host- cookie counts.
        assert_eq!(
            from_cookie_headers(["sgw_session=abc"].into_iter(), SECURE_COOKIE),
            Ok(None)
        );
        assert_eq!(
            without_ours("a=1; sgw_session=abc; b=2; __Host-sgw_session=x").as_deref(),
            Some("a=1; b=2")
        );
        assert_eq!(without_ours("sgw_session=abc"), None);
        assert_eq!(without_ours("flag; a=1").as_deref(), Some("flag; a=1"));
        assert!(names_ours(
            b"sgw_session=x; Domain=example.test; Path=/dashboard"
        ));
        assert!(names_ours(b" __Host-sgw_session=x"));
        assert!(!names_ours(b"theirs=1; Path=/"));
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_host_only_under_tls() {
        let c = set_cookie("abc", true);
        for part in [
            "__Host-sgw_session=abc",
            "HttpOnly",
            "SameSite=Strict",
            "Secure",
            "Path=/",
        ] {
            assert!(c.contains(part), "{c}");
        }
        assert!(!c.contains("Domain") && !c.contains("Max-Age"), "{c}");
        let plain = set_cookie("abc", false);
        assert!(plain.starts_with("sgw_session=abc;") && !plain.contains("Secure"));
        assert!(clear_cookie(false).contains("Max-Age=0"));
    }
}
