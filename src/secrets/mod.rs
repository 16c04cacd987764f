//! A tenant's secrets (e2b's Secrets API): named values that are written, never read back
//! through the API, and filled into egress requests by the node that runs the sandbox. Each
//! secret is one file per tenant, its value sealed with AES-256-GCM under the store's key and
//! bound to its tenant, id and version, so a file moved or replayed elsewhere does not open.

mod names;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

pub use names::{normalize_name, validate_metadata, validate_value};

use crate::fsx;
use crate::model::{Error, ErrorKind, Result, ids};

/// Prefix of secret ids, as e2b's.
pub const ID_PREFIX: &str = "sec_";
/// Most secrets one tenant keeps.
pub const MAX_PER_TENANT: usize = 1000;
/// Largest page of a list.
pub const MAX_PAGE: usize = 100;

/// What the API shows of a secret: everything but its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretInfo {
    pub id: String,
    pub name: String,
    pub current_version: u64,
    pub metadata: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// One secret on disk.
#[derive(Serialize, Deserialize)]
struct Sealed {
    #[serde(flatten)]
    info: SecretInfo,
    nonce: String,
    sealed: String,
}

/// The secrets of every tenant under one directory, sealed with one key.
pub struct SecretStore {
    dir: PathBuf,
    cipher: Aes256Gcm,
    /// Writers of this process one at a time (replicas sharing the directory rely on the
    /// file system: a name is taken by an exclusive link, a version by a rename).
    write: Mutex<()>,
}

impl std::fmt::Debug for SecretStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretStore")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl SecretStore {
    /// Opens the store in `dir` with the 256-bit key (64 hex digits) in `key_file`, which is
    /// made (mode 0600) when it does not exist. Answers whether the key was made.
    pub fn open(dir: &Path, key_file: &Path) -> Result<(SecretStore, bool)> {
        let (hex, made) = fsx::load_or_create_secret(key_file, || ids::random_hex(32))
            .map_err(|e| Error::io(format!("secrets key {}", key_file.display()), e))?;
        let key = Zeroizing::new(decode_key(&hex).ok_or_else(|| {
            Error::invalid(format!(
                "secrets key {}: expected 64 hex digits (a 256-bit key)",
                key_file.display()
            ))
        })?);
        let cipher = Aes256Gcm::new_from_slice(key.as_slice())
            .map_err(|_| Error::internal("the secrets key has the wrong length"))?;
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        Ok((
            SecretStore {
                dir: dir.to_path_buf(),
                cipher,
                write: Mutex::new(()),
            },
            made,
        ))
    }

    fn tenant_dir(&self, tenant: &str) -> Result<PathBuf> {
        // Namespaces are DNS labels; anything else must not become a path.
        if tenant.is_empty()
            || !tenant
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            || tenant.starts_with('.')
        {
            return Err(Error::internal(format!(
                "tenant {tenant:?} cannot hold secrets"
            )));
        }
        Ok(self.dir.join(tenant))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.write.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn seal(&self, tenant: &str, info: &SecretInfo, value: &str) -> Result<Sealed> {
        let nonce_bytes: [u8; 12] = rand::random();
        let aad = binding(tenant, &info.id, info.current_version);
        let sealed = self
            .cipher
            .encrypt(
                Nonce::from_slice(&nonce_bytes),
                Payload {
                    msg: value.as_bytes(),
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| Error::internal("sealing the secret failed"))?;
        Ok(Sealed {
            info: info.clone(),
            nonce: B64.encode(nonce_bytes),
            sealed: B64.encode(sealed),
        })
    }

    fn read(&self, path: &Path) -> Result<Option<Sealed>> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                Error::internal(format!("secret file {} is damaged: {e}", path.display()))
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
        }
    }

    /// Every secret of `tenant`, by name.
    fn all(&self, tenant: &str) -> Result<Vec<(PathBuf, Sealed)>> {
        let dir = self.tenant_dir(tenant)?;
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(format!("listing {}", dir.display()), e)),
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            if let Some(s) = self.read(&path)? {
                out.push((path, s));
            }
        }
        out.sort_by(|a, b| a.1.info.name.cmp(&b.1.info.name));
        Ok(out)
    }

    /// The secret `key` names: its id (`sec_…`) or its name.
    fn find(&self, tenant: &str, key: &str) -> Result<(PathBuf, Sealed)> {
        let missing = || Error::not_found(format!("secret {key:?} not found"));
        if key.starts_with(ID_PREFIX) {
            return self
                .all(tenant)?
                .into_iter()
                .find(|(_, s)| s.info.id == key)
                .ok_or_else(missing);
        }
        let name = normalize_name(key).map_err(|_| missing())?;
        let path = self.tenant_dir(tenant)?.join(format!("{name}.json"));
        match self.read(&path)? {
            Some(s) => Ok((path, s)),
            None => Err(missing()),
        }
    }

    /// Stores a new secret at version 1.
    pub fn create(
        &self,
        tenant: &str,
        name: &str,
        value: &str,
        metadata: BTreeMap<String, String>,
    ) -> Result<SecretInfo> {
        let name = normalize_name(name)?;
        validate_value(value)?;
        validate_metadata(&metadata)?;
        let _w = self.lock();
        let dir = self.tenant_dir(tenant)?;
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        // Counted by file name: opening every secret only to count them would be wasted.
        let held = std::fs::read_dir(&dir)
            .map_err(|e| Error::io(format!("listing {}", dir.display()), e))?
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .count();
        if held >= MAX_PER_TENANT {
            return Err(Error::invalid(format!(
                "a team keeps at most {MAX_PER_TENANT} secrets; delete one first"
            )));
        }
        let now = Utc::now();
        let info = SecretInfo {
            id: format!("{ID_PREFIX}{}", ids::random_hex(12)),
            name: name.clone(),
            current_version: 1,
            metadata,
            created_at: now,
            updated_at: now,
        };
        let sealed = self.seal(tenant, &info, value)?;
        let bytes = serde_json::to_vec(&sealed).map_err(|e| Error::internal(e.to_string()))?;
        let path = dir.join(format!("{name}.json"));
        let tmp = dir.join(format!(".{name}.{}.new", ids::random_hex(6)));
        fsx::write_atomic(&tmp, &bytes).map_err(|e| Error::io("writing the secret", e))?;
        // A hard link fails if the name is taken, here or by another replica.
        let linked = std::fs::hard_link(&tmp, &path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(info),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("a secret named {name:?} already exists"),
            )),
            Err(e) => Err(Error::io("storing the secret", e)),
        }
    }

    /// Stores `value` as the secret's next version; `metadata`, when given, replaces its
    /// metadata.
    pub fn update(
        &self,
        tenant: &str,
        key: &str,
        value: &str,
        metadata: Option<BTreeMap<String, String>>,
    ) -> Result<SecretInfo> {
        validate_value(value)?;
        if let Some(m) = &metadata {
            validate_metadata(m)?;
        }
        let _w = self.lock();
        let (path, old) = self.find(tenant, key)?;
        let mut info = old.info;
        info.current_version += 1;
        info.updated_at = Utc::now();
        if let Some(m) = metadata {
            info.metadata = m;
        }
        let sealed = self.seal(tenant, &info, value)?;
        let bytes = serde_json::to_vec(&sealed).map_err(|e| Error::internal(e.to_string()))?;
        fsx::write_atomic(&path, &bytes).map_err(|e| Error::io("writing the secret", e))?;
        Ok(info)
    }

    pub fn get(&self, tenant: &str, key: &str) -> Result<SecretInfo> {
        Ok(self.find(tenant, key)?.1.info)
    }

    pub fn delete(&self, tenant: &str, key: &str) -> Result<()> {
        let _w = self.lock();
        let (path, _) = self.find(tenant, key)?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Err(Error::not_found(format!("secret {key:?} not found")))
            }
            Err(e) => Err(Error::io("deleting the secret", e)),
        }
    }

    /// Up to `limit` secrets by name, starting after the name `after`; the second value is
    /// where the next page starts, when there is one.
    pub fn list(
        &self,
        tenant: &str,
        limit: usize,
        after: Option<&str>,
    ) -> Result<(Vec<SecretInfo>, Option<String>)> {
        let limit = limit.clamp(1, MAX_PAGE);
        let mut rest = self
            .all(tenant)?
            .into_iter()
            .map(|(_, s)| s.info)
            .filter(|i| after.is_none_or(|a| i.name.as_str() > a))
            .peekable();
        let page: Vec<SecretInfo> = rest.by_ref().take(limit).collect();
        let next = rest.peek().and(page.last()).map(|last| last.name.clone());
        Ok((page, next))
    }

    /// The current value of the secret named `name`, for the one place that fills it in.
    pub fn value(&self, tenant: &str, name: &str) -> Result<Zeroizing<String>> {
        let (_, s) = self.find(tenant, name)?;
        let damaged = || Error::internal(format!("secret {name:?} does not open with this key"));
        let nonce = B64.decode(&s.nonce).map_err(|_| damaged())?;
        let sealed = B64.decode(&s.sealed).map_err(|_| damaged())?;
        if nonce.len() != 12 {
            return Err(damaged());
        }
        let aad = binding(tenant, &s.info.id, s.info.current_version);
        let plain = self
            .cipher
            .decrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: &sealed,
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| damaged())?;
        String::from_utf8(plain)
            .map(Zeroizing::new)
            .map_err(|_| damaged())
    }
}

/// What a sealed value is bound to: it opens only as this tenant's secret, at this version.
fn binding(tenant: &str, id: &str, version: u64) -> String {
    format!("sandbox-gateway secret v1\n{tenant}\n{id}\n{version}")
}

fn decode_key(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &Path) -> SecretStore {
        SecretStore::open(&dir.join("secrets"), &dir.join("secrets-key"))
            .unwrap()
            .0
    }

    #[test]
    fn values_are_sealed_versioned_and_never_on_disk_in_the_clear() {
        let tmp = tempfile::tempdir().unwrap();
        let s = store(tmp.path());
        let meta = BTreeMap::from([("team".to_string(), "infra".to_string())]);
        let a = s
            .create("team-a", "OpenAI", "sk-live-123456", meta.clone())
            .unwrap();
        assert!(a.id.starts_with(ID_PREFIX));
        assert_eq!((a.name.as_str(), a.current_version), ("openai", 1));
        assert_eq!(*s.value("team-a", "openai").unwrap(), "sk-live-123456");
        let b = s.update("team-a", &a.id, "sk-live-abcdef", None).unwrap();
        assert_eq!(b.current_version, 2);
        assert_eq!(b.metadata, meta, "metadata kept when not given");
        assert_eq!(*s.value("team-a", "OPENAI").unwrap(), "sk-live-abcdef");
        let c = s
            .update("team-a", "openai", "v3", Some(BTreeMap::new()))
            .unwrap();
        assert!(c.metadata.is_empty());
        for entry in walk(tmp.path()) {
            let bytes = std::fs::read(&entry).unwrap();
            let text = String::from_utf8_lossy(&bytes);
            assert!(
                !text.contains("sk-live"),
                "{} holds a value",
                entry.display()
            );
        }
        // Other tenants neither see it nor can take its name from it.
        assert_eq!(
            s.get("team-b", "openai").unwrap_err().kind,
            ErrorKind::NotFound
        );
        assert_eq!(
            s.get("team-b", &a.id).unwrap_err().kind,
            ErrorKind::NotFound
        );
        s.create("team-b", "openai", "theirs", BTreeMap::new())
            .unwrap();
        assert_eq!(*s.value("team-a", "openai").unwrap(), "v3");
    }

    #[test]
    fn a_sealed_file_opens_only_as_its_own_tenant_and_version() {
        let tmp = tempfile::tempdir().unwrap();
        let s = store(tmp.path());
        s.create("team-a", "k", "one", BTreeMap::new()).unwrap();
        let s1 = std::fs::read(tmp.path().join("secrets/team-a/k.json")).unwrap();
        s.update("team-a", "k", "two", None).unwrap();
        // Replaying version 1's sealed value under version 2's record does not open.
        let mut now: serde_json::Value = serde_json::from_slice(
            &std::fs::read(tmp.path().join("secrets/team-a/k.json")).unwrap(),
        )
        .unwrap();
        let old: serde_json::Value = serde_json::from_slice(&s1).unwrap();
        now["nonce"] = old["nonce"].clone();
        now["sealed"] = old["sealed"].clone();
        std::fs::write(
            tmp.path().join("secrets/team-a/k.json"),
            serde_json::to_vec(&now).unwrap(),
        )
        .unwrap();
        assert_eq!(
            s.value("team-a", "k").unwrap_err().kind,
            ErrorKind::Internal
        );
        // Copied into another tenant's directory, it does not open either.
        std::fs::create_dir_all(tmp.path().join("secrets/team-b")).unwrap();
        std::fs::write(tmp.path().join("secrets/team-b/k.json"), &s1).unwrap();
        assert!(s.value("team-b", "k").is_err());
        // Nor with another key.
        let other = SecretStore::open(&tmp.path().join("secrets"), &tmp.path().join("other-key"))
            .unwrap()
            .0;
        std::fs::write(tmp.path().join("secrets/team-a/k.json"), &s1).unwrap();
        assert!(other.value("team-a", "k").is_err());
        assert_eq!(*s.value("team-a", "k").unwrap(), "one");
    }

    #[test]
    fn names_are_unique_per_tenant_and_pages_follow_names() {
        let tmp = tempfile::tempdir().unwrap();
        let s = store(tmp.path());
        for n in ["c", "a", "e", "b", "d"] {
            s.create("team-a", n, "v", BTreeMap::new()).unwrap();
        }
        let dup = s.create("team-a", "A", "v", BTreeMap::new()).unwrap_err();
        assert_eq!(dup.kind, ErrorKind::AlreadyExists);
        let (p1, next) = s.list("team-a", 2, None).unwrap();
        assert_eq!(
            p1.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        let (p2, next) = s.list("team-a", 2, next.as_deref()).unwrap();
        assert_eq!(
            p2.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
            ["c", "d"]
        );
        let (p3, next) = s.list("team-a", 2, next.as_deref()).unwrap();
        assert_eq!(
            p3.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
            ["e"]
        );
        assert_eq!(next, None);
        let (exact, next) = s.list("team-a", 5, None).unwrap();
        assert_eq!((exact.len(), next), (5, None));
        s.delete("team-a", "c").unwrap();
        assert_eq!(
            s.delete("team-a", "c").unwrap_err().kind,
            ErrorKind::NotFound
        );
        assert_eq!(s.list("team-b", 10, None).unwrap().0, Vec::new());
    }

    #[test]
    fn keys_and_tenants_that_are_not_what_they_should_be_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("short-key"), "abcd\n").unwrap();
        let e =
            SecretStore::open(&tmp.path().join("s"), &tmp.path().join("short-key")).unwrap_err();
        assert!(e.message.contains("64 hex digits"), "{}", e.message);
        let s = store(tmp.path());
        for t in ["", "../x", ".hidden", "a/b"] {
            assert!(s.create(t, "n", "v", BTreeMap::new()).is_err(), "{t:?}");
        }
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
        out
    }
}
