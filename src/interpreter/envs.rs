//! The sandbox-wide environment variables (a create's `envs`, set by the node through envd's
//! `/init`): envd writes them to a file only root can read whenever they change, and every
//! execution brings its kernel up to date with them. Kernels started before the sandbox was
//! claimed (a warm pool's) thereby still see the claim's variables.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// Where envd writes them inside a sandbox.
pub const SANDBOX_ENVS_FILE: &str = "/run/sandbox-gateway/envs.json";

/// A file's modification time and length: what says it changed.
type Stamp = (SystemTime, u64);

pub struct SandboxEnvs {
    path: Option<PathBuf>,
    /// The file's stamp when last read, and what it held.
    cache: Mutex<Option<(Stamp, BTreeMap<String, String>)>>,
}

impl SandboxEnvs {
    pub fn new(path: Option<PathBuf>) -> SandboxEnvs {
        SandboxEnvs {
            path,
            cache: Mutex::new(None),
        }
    }

    /// The variables as they are now; none when there is no file (or it does not parse).
    pub fn current(&self) -> BTreeMap<String, String> {
        let Some(path) = &self.path else {
            return BTreeMap::new();
        };
        let Ok(meta) = std::fs::metadata(path) else {
            return BTreeMap::new();
        };
        let stamp = (
            meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            meta.len(),
        );
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((seen, envs)) = cache.as_ref()
            && *seen == stamp
        {
            return envs.clone();
        }
        let envs = read(path);
        *cache = Some((stamp, envs.clone()));
        envs
    }
}

fn read(path: &Path) -> BTreeMap<String, String> {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Writes `envs` for the interpreter (envd's side), atomically, readable by root only.
pub fn publish(path: &Path, envs: &BTreeMap<String, String>) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let bytes = serde_json::to_vec(envs).map_err(std::io::Error::other)?;
    crate::fsx::write_atomic(path, &bytes)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

/// What changes take a kernel from `applied` to `wanted`: `Some` sets, `None` removes.
pub fn changes(
    applied: &BTreeMap<String, String>,
    wanted: &BTreeMap<String, String>,
) -> BTreeMap<String, Option<String>> {
    let mut out = BTreeMap::new();
    for (k, v) in wanted {
        if applied.get(k) != Some(v) {
            out.insert(k.clone(), Some(v.clone()));
        }
    }
    for k in applied.keys() {
        if !wanted.contains_key(k) {
            out.insert(k.clone(), None);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn changes_set_what_differs_and_remove_what_is_gone() {
        let applied = map(&[("A", "1"), ("B", "2"), ("C", "3")]);
        let wanted = map(&[("A", "1"), ("B", "20"), ("D", "4")]);
        let c = changes(&applied, &wanted);
        assert_eq!(c.len(), 3);
        assert_eq!(c["B"], Some("20".into()));
        assert_eq!(c["C"], None);
        assert_eq!(c["D"], Some("4".into()));
        assert!(changes(&wanted, &wanted).is_empty());
    }

    #[test]
    fn published_variables_are_read_back_and_follow_changes() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("sub/envs.json");
        let envs = SandboxEnvs::new(Some(path.clone()));
        assert!(envs.current().is_empty(), "no file yet");
        publish(&path, &map(&[("A", "1")])).unwrap();
        assert_eq!(envs.current(), map(&[("A", "1")]));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        publish(&path, &map(&[("A", "2"), ("B", "x")])).unwrap();
        assert_eq!(envs.current(), map(&[("A", "2"), ("B", "x")]));
        std::fs::write(&path, "not json").unwrap();
        assert!(envs.current().is_empty());
        assert!(SandboxEnvs::new(None).current().is_empty());
    }
}
