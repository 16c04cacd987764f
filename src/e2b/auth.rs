//! Tenancy: an API key maps to one namespace (or is an admin key that sees all). Keys come from
//! a file of `key namespace` lines (`#` comments; a key may be stored as `sha256:<hex>`), are
//! compared in constant time, and the file is re-read when it changes.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest, web};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use crate::model::{DEFAULT_NAMESPACE, Error, Result, ids};

pub const API_KEY_HEADER: &str = "X-API-KEY";
/// The namespace field that makes a key an admin key.
pub const ADMIN: &str = "*";
const RELOAD_EVERY: Duration = Duration::from_secs(2);

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// Where this tenant's sandboxes are created.
    pub namespace: String,
    /// Sees every namespace.
    pub admin: bool,
}

impl Tenant {
    /// The namespace reads are limited to (None for an admin).
    pub fn scope(&self) -> Option<&str> {
        (!self.admin).then_some(self.namespace.as_str())
    }
}

#[derive(Debug, Clone)]
struct Entry {
    digest: [u8; 32],
    tenant: Tenant,
}

/// SHA-256 of a key: how keys are stored and compared (and what a dashboard session keeps).
pub fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

pub fn valid_namespace(ns: &str) -> bool {
    !ns.is_empty()
        && ns.len() <= 63
        && ns
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !ns.starts_with('-')
        && !ns.ends_with('-')
}

fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
        let hi = (chunk[0] as char).to_digit(16)?;
        let lo = (chunk[1] as char).to_digit(16)?;
        out[i] = (hi * 16 + lo) as u8;
    }
    Some(out)
}

pub fn parse_keys(text: &str, origin: &Path) -> Result<Vec<(String, Tenant)>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let at = || format!("{} line {}", origin.display(), n + 1);
        let (key, ns) = match fields.as_slice() {
            [key] => (*key, DEFAULT_NAMESPACE),
            [key, ns] => (*key, *ns),
            _ => {
                return Err(Error::invalid(format!(
                    "{}: expected `KEY [NAMESPACE]`, found {} fields",
                    at(),
                    fields.len()
                )));
            }
        };
        let tenant = if ns == ADMIN {
            Tenant {
                namespace: DEFAULT_NAMESPACE.into(),
                admin: true,
            }
        } else if valid_namespace(ns) {
            Tenant {
                namespace: ns.into(),
                admin: false,
            }
        } else {
            return Err(Error::invalid(format!(
                "{}: namespace {ns:?} must be a DNS label (lowercase letters, digits, '-') or `*`",
                at()
            )));
        };
        out.push((key.to_string(), tenant));
    }
    Ok(out)
}

fn entries(parsed: Vec<(String, Tenant)>, origin: &Path) -> Result<Vec<Entry>> {
    parsed
        .into_iter()
        .map(|(key, tenant)| {
            let digest = match key.strip_prefix("sha256:") {
                Some(hex) => parse_hex32(&hex.to_ascii_lowercase()).ok_or_else(|| {
                    Error::invalid(format!(
                        "{}: `sha256:` must be followed by 64 hex characters",
                        origin.display()
                    ))
                })?,
                None => digest(&key),
            };
            Ok(Entry { digest, tenant })
        })
        .collect()
}

struct FileState {
    checked: Instant,
    modified: Option<SystemTime>,
}

pub struct ApiKeys {
    entries: RwLock<Vec<Entry>>,
    file: Option<PathBuf>,
    file_state: Mutex<FileState>,
    /// Where calls without a known key go, when anonymous use is allowed.
    anonymous: Option<Tenant>,
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl ApiKeys {
    pub fn new(file: Option<PathBuf>, allow_anonymous: bool) -> Result<Self> {
        let list = match &file {
            Some(p) => Self::load(p)?,
            None => Vec::new(),
        };
        if list.is_empty() && !allow_anonymous {
            return Err(Error::invalid(match &file {
                Some(p) => format!("{} holds no API keys", p.display()),
                None => "no API keys: pass --api-keys FILE or --allow-anonymous".to_string(),
            }));
        }
        let modified = file.as_deref().and_then(modified);
        Ok(ApiKeys {
            entries: RwLock::new(list),
            file,
            file_state: Mutex::new(FileState {
                checked: Instant::now(),
                modified,
            }),
            anonymous: allow_anonymous.then(|| Tenant {
                namespace: DEFAULT_NAMESPACE.into(),
                admin: false,
            }),
        })
    }

    fn load(path: &Path) -> Result<Vec<Entry>> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("reading API keys from {}", path.display()), e))?;
        entries(parse_keys(&text, path)?, path)
    }

    pub fn len(&self) -> usize {
        self.entries.read().map(|e| e.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the key with digest `d` is (still) in the key file.
    pub fn holds(&self, d: &[u8; 32]) -> bool {
        self.refresh();
        self.find_digest(d).is_some()
    }

    fn find(&self, key: &str) -> Option<Tenant> {
        self.find_digest(&digest(key))
    }

    fn find_digest(&self, d: &[u8; 32]) -> Option<Tenant> {
        let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
        // Every entry is compared, in constant time, whatever matches.
        let mut found = None;
        for e in entries.iter() {
            if bool::from(e.digest.ct_eq(d)) {
                found = Some(e.tenant.clone());
            }
        }
        found
    }

    /// Re-reads the key file if it changed (checked at most every couple of seconds).
    fn refresh(&self) {
        let Some(path) = &self.file else { return };
        {
            let mut st = self.file_state.lock().unwrap_or_else(|p| p.into_inner());
            if st.checked.elapsed() < RELOAD_EVERY {
                return;
            }
            st.checked = Instant::now();
            let now = modified(path);
            if now == st.modified {
                return;
            }
            st.modified = now;
        }
        match Self::load(path) {
            Ok(list) => {
                tracing::info!(path = %path.display(), keys = list.len(), "reloaded API keys");
                *self.entries.write().unwrap_or_else(|p| p.into_inner()) = list;
            }
            Err(e) => tracing::error!(error = %e, "keeping the previous API keys"),
        }
    }

    pub fn authenticate(&self, key: Option<&str>) -> std::result::Result<Tenant, ApiError> {
        if let Some(key) = key {
            // A key taken out of the file stops working within a reload interval (the check
            // is a clock read while the interval runs, and a stat after it).
            self.refresh();
            if let Some(t) = self.find(key) {
                return Ok(t);
            }
        }
        if let Some(t) = &self.anonymous {
            return Ok(t.clone());
        }
        Err(match key {
            None => {
                ApiError::unauthorized(format!("missing API key: send the {API_KEY_HEADER} header"))
            }
            Some(_) => ApiError::unauthorized("invalid API key"),
        })
    }
}

impl FromRequest for Tenant {
    type Error = actix_web::Error;
    type Future = std::future::Ready<std::result::Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let outcome = match req.app_data::<web::Data<ApiKeys>>() {
            Some(keys) => {
                let key = req
                    .headers()
                    .get(API_KEY_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::trim);
                match (key, dashboard_session(req, keys)) {
                    (None, Some(session)) => session
                        .map(|s| s.tenant)
                        .map_err(|e| ApiError::unauthorized(e.to_string()).into()),
                    _ => keys.authenticate(key).map_err(Into::into),
                }
            }
            None => Err(ApiError::new(
                actix_web::http::StatusCode::INTERNAL_SERVER_ERROR,
                "API keys are not configured",
            )
            .into()),
        };
        std::future::ready(outcome)
    }
}

/// The dashboard session a request without an API key comes with, if it has a cookie for one;
/// refused when the key it signed in with has left the key file (or the fleet token changed).
fn dashboard_session(
    req: &HttpRequest,
    keys: &ApiKeys,
) -> Option<
    std::result::Result<crate::dashboard::sessions::Session, crate::dashboard::sessions::Refused>,
> {
    use crate::dashboard::sessions::{self, CSRF_HEADER, Sessions};
    let sessions = req.app_data::<web::Data<Sessions>>()?;
    let cookies = req
        .headers()
        .get_all(actix_web::http::header::COOKIE)
        .filter_map(|v| v.to_str().ok());
    let id = match sessions::from_cookie_headers(
        cookies,
        sessions::cookie_name(req.app_config().secure()),
    ) {
        Ok(Some(id)) => id,
        Ok(None) => return None,
        Err(refused) => return Some(Err(refused)),
    };
    let csrf = req.headers().get(CSRF_HEADER).and_then(|v| v.to_str().ok());
    let fleet = req
        .app_data::<web::Data<super::E2b>>()
        .map(|e2b| digest(e2b.dispatcher.fleet_token()));
    Some(sessions.call(id, csrf, |s| {
        if s.fleet {
            fleet.is_some_and(|f| bool::from(f.ct_eq(&s.key)))
        } else {
            keys.holds(&s.key)
        }
    }))
}

/// A new key in the SDKs' format: `e2b_` + 40 hex characters.
pub fn new_key() -> String {
    format!("e2b_{}", ids::random_hex(20))
}

/// `sha256:<hex>` form of a key, for storing.
pub fn hashed(key: &str) -> String {
    let d = digest(key);
    let mut s = String::from("sha256:");
    for b in d {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Appends a key line for `namespace` to `path` (created with mode 0600 when missing).
pub fn append_key(path: &Path, stored: &str, namespace: &str, note: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if namespace != ADMIN && !valid_namespace(namespace) {
        return Err(Error::invalid(format!(
            "namespace {namespace:?} must be a DNS label (lowercase letters, digits, '-') or `*`"
        )));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    writeln!(f, "# {note}\n{stored} {namespace}")
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_map_keys_to_namespaces() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("keys");
        let plain = new_key();
        assert!(plain.starts_with("e2b_") && plain.len() == 44);
        let stored = new_key();
        std::fs::write(
            &p,
            format!(
                "# comment\n\n{plain} team-a\n{} team-b\nadminkey *\nlonely\n",
                hashed(&stored)
            ),
        )
        .unwrap();
        let keys = ApiKeys::new(Some(p.clone()), false).unwrap();
        assert_eq!(keys.authenticate(Some(&plain)).unwrap().namespace, "team-a");
        assert_eq!(
            keys.authenticate(Some(&stored)).unwrap().namespace,
            "team-b"
        );
        assert!(keys.authenticate(Some("adminkey")).unwrap().admin);
        assert_eq!(
            keys.authenticate(Some("lonely")).unwrap().namespace,
            "default"
        );
        assert_eq!(
            keys.authenticate(Some("nope")).unwrap_err().status.as_u16(),
            401
        );
        assert_eq!(keys.authenticate(None).unwrap_err().status.as_u16(), 401);

        std::fs::write(&p, "k a b\n").unwrap();
        assert!(
            ApiKeys::new(Some(p.clone()), false).is_err(),
            "three fields"
        );
        std::fs::write(&p, "k Bad_NS\n").unwrap();
        assert!(
            ApiKeys::new(Some(p.clone()), false).is_err(),
            "bad namespace"
        );
        std::fs::write(&p, "sha256:abcd ns\n").unwrap();
        assert!(
            ApiKeys::new(Some(p.clone()), false).is_err(),
            "short digest"
        );
        assert!(
            ApiKeys::new(None, false).is_err(),
            "no keys and no anonymous use"
        );
        let anon = ApiKeys::new(None, true).unwrap();
        assert_eq!(
            anon.authenticate(Some("anything")).unwrap().namespace,
            "default"
        );
    }

    #[test]
    fn a_key_taken_out_of_the_file_stops_working() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("keys");
        std::fs::write(
            &p,
            "kept team-a
going team-b
",
        )
        .unwrap();
        let keys = ApiKeys::new(Some(p.clone()), false).unwrap();
        assert!(keys.authenticate(Some("going")).is_ok());
        assert!(keys.holds(&digest("going")));
        std::fs::write(
            &p,
            "kept team-a
",
        )
        .unwrap();
        std::thread::sleep(RELOAD_EVERY + Duration::from_millis(100));
        assert_eq!(
            keys.authenticate(Some("going"))
                .unwrap_err()
                .status
                .as_u16(),
            401
        );
        assert!(!keys.holds(&digest("going")));
        assert!(keys.holds(&digest("kept")) && keys.authenticate(Some("kept")).is_ok());
    }
}
