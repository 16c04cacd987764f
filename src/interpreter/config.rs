//! What a template tells its code interpreter (`/etc/sandbox-gateway/code-interpreter.json`):
//! which kernel serves each language, which languages it cannot serve and why, the contexts
//! made at start, and code that warms their kernels (imports) before the first request.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Where a template keeps its interpreter configuration.
pub const TEMPLATE_CONFIG: &str = "/etc/sandbox-gateway/code-interpreter.json";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Language (as requests name it, normalised) to kernelspec name.
    #[serde(default = "default_kernels")]
    pub kernels: BTreeMap<String, String>,
    /// Languages this template knows it cannot serve, with the reason given to clients.
    #[serde(default)]
    pub unavailable: BTreeMap<String, String>,
    /// Languages whose default context exists from the start (python first, as upstream).
    #[serde(default = "default_contexts")]
    pub default_contexts: Vec<String>,
    /// Code run silently in a language's default context once its kernel is up (imports
    /// that make the first request fast). Runs in the user's namespace: keep it free of names.
    #[serde(default)]
    pub warm: BTreeMap<String, String>,
    /// The working directory of contexts that ask for none.
    #[serde(default = "default_cwd")]
    pub cwd: PathBuf,
    /// Most contexts clients may make (each is a kernel process with its own memory); each
    /// language's default context, which `run_code` without a context uses, comes on top.
    #[serde(default = "default_max_contexts")]
    pub max_contexts: usize,
    /// How long a kernel may take to start, in seconds.
    #[serde(default = "default_start_timeout")]
    pub start_timeout_seconds: u64,
    /// Jupyter data directories searched for `kernels/NAME/kernel.json`.
    #[serde(default = "default_data_dirs")]
    pub data_dirs: Vec<PathBuf>,
}

fn default_kernels() -> BTreeMap<String, String> {
    [("python", "python3")]
        .into_iter()
        .map(|(l, k)| (l.to_string(), k.to_string()))
        .collect()
}

fn default_contexts() -> Vec<String> {
    vec!["python".into()]
}

fn default_cwd() -> PathBuf {
    PathBuf::from("/home/user")
}

/// The longest a kernel may take to start (a day).
const MAX_START_TIMEOUT_SECONDS: u64 = 86_400;

fn default_max_contexts() -> usize {
    16
}

fn default_start_timeout() -> u64 {
    120
}

fn default_data_dirs() -> Vec<PathBuf> {
    ["/usr/local/share/jupyter", "/usr/share/jupyter"]
        .into_iter()
        .map(PathBuf::from)
        .collect()
}

impl Default for Config {
    fn default() -> Self {
        Config {
            kernels: default_kernels(),
            unavailable: BTreeMap::new(),
            default_contexts: default_contexts(),
            warm: BTreeMap::new(),
            cwd: default_cwd(),
            max_contexts: default_max_contexts(),
            start_timeout_seconds: default_start_timeout(),
            data_dirs: default_data_dirs(),
        }
    }
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let cfg: Config = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{} does not parse: {e}", path.display()))?;
        if cfg.max_contexts == 0 {
            return Err(format!("{}: max_contexts must be positive", path.display()));
        }
        // A deadline this far off is no deadline, and adding it to an instant would overflow.
        if !(1..=MAX_START_TIMEOUT_SECONDS).contains(&cfg.start_timeout_seconds) {
            return Err(format!(
                "{}: start_timeout_seconds must be 1 to {MAX_START_TIMEOUT_SECONDS}",
                path.display()
            ));
        }
        Ok(cfg)
    }

    /// The kernel that serves `language` (already normalised): the configured one, else a
    /// kernel of that very name (as upstream tries any name).
    pub fn kernel_for(&self, language: &str) -> String {
        self.kernels
            .get(language)
            .cloned()
            .unwrap_or_else(|| language.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_config_parses_and_fills_its_defaults() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.json");
        std::fs::write(
            &p,
            r#"{"kernels": {"python": "python3", "javascript": "deno", "typescript": "deno"},
                "unavailable": {"java": "no Java kernel"},
                "default_contexts": ["python", "javascript"],
                "warm": {"python": "import numpy"}}"#,
        )
        .unwrap();
        let c = Config::load(&p).unwrap();
        assert_eq!(c.kernel_for("typescript"), "deno");
        assert_eq!(c.kernel_for("ir"), "ir");
        assert_eq!(c.cwd, PathBuf::from("/home/user"));
        assert_eq!(c.max_contexts, 16);
        assert_eq!(c.default_contexts, ["python", "javascript"]);

        std::fs::write(&p, r#"{"kernel": {}}"#).unwrap();
        assert!(Config::load(&p).unwrap_err().contains("unknown field"));
        std::fs::write(&p, r#"{"max_contexts": 0}"#).unwrap();
        assert!(Config::load(&p).is_err());
        for t in ["0", "18446744073709551615"] {
            std::fs::write(&p, format!(r#"{{"start_timeout_seconds": {t}}}"#)).unwrap();
            assert!(
                Config::load(&p)
                    .unwrap_err()
                    .contains("start_timeout_seconds"),
                "{t}"
            );
        }
        assert!(Config::load(&d.path().join("none")).is_err());
    }
}
