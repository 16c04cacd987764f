//! What a node keeps of template builds, on disk so that a restart loses none of it: one record
//! and one log (JSON lines) per build in the data directory, one record per e2b template beside
//! the templates (nodes sharing the templates see the names), and the teams' uploads.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::model::builds::{BuildLogEntry, BuildReason, BuildState, TemplateRecord};
use crate::model::{Error, Result, ids};

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

/// One build of a template.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildRecord {
    pub build_id: String,
    pub template_id: String,
    pub team: String,
    pub state: BuildState,
    #[serde(default)]
    pub reason: Option<BuildReason>,
    pub created_at: DateTime<Utc>,
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub finished_at: Option<DateTime<Utc>>,
    pub cpu_count: u32,
    pub memory_mb: u64,
    /// The tags it takes once ready.
    pub tags: Vec<String>,
    /// The template it installed, once ready.
    #[serde(default)]
    pub store_name: Option<String>,
}

/// What a team's cache keeps of a phase it ran: the layer it wrote (None: it wrote nothing)
/// and the context after it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cached {
    pub layer: Option<String>,
    pub context: crate::templates::build::steps::Context,
    /// When a build last used it (made or found it): the cache is trimmed oldest first.
    #[serde(default)]
    pub used_at: Option<DateTime<Utc>>,
}

/// Where the records live.
#[derive(Debug, Clone)]
pub struct Records {
    builds: PathBuf,
    files: PathBuf,
    templates: PathBuf,
    cache: PathBuf,
}

/// Build ids are UUIDs; nothing else names a file here.
pub fn valid_build_id(id: &str) -> bool {
    uuid::Uuid::parse_str(id).is_ok_and(|u| u.hyphenated().to_string() == id)
}

/// The node template a ready build installs: named by the template and the build, so that
/// any node sharing the templates finds it from the template's record alone.
pub fn store_name(template_id: &str, build_id: &str) -> String {
    format!("{template_id}.{}", build_id.get(..8).unwrap_or(build_id))
}

/// Template ids are ours: lowercase letters and digits.
pub fn valid_template_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 40
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

impl Records {
    pub fn open(data: &Path, templates: &Path) -> Result<Records> {
        let r = Records {
            builds: data.join("builds"),
            files: data.join("build-files"),
            templates: templates.join(".e2b"),
            cache: templates.join(".e2b").join("cache"),
        };
        for d in [&r.builds, &r.files, &r.templates, &r.cache] {
            fs::create_dir_all(d).map_err(io(format!("creating {}", d.display())))?;
        }
        Ok(r)
    }

    fn build_path(&self, id: &str) -> PathBuf {
        self.builds.join(format!("{id}.json"))
    }

    fn log_path(&self, id: &str) -> PathBuf {
        self.builds.join(format!("{id}.log"))
    }

    pub fn build(&self, id: &str) -> Result<Option<BuildRecord>> {
        if !valid_build_id(id) {
            return Ok(None);
        }
        read_json(&self.build_path(id))
    }

    pub fn save_build(&self, b: &BuildRecord) -> Result<()> {
        write_json(&self.build_path(&b.build_id), b)
    }

    /// Every build record (for recovery after a restart).
    pub fn builds(&self) -> Vec<BuildRecord> {
        each_json(&self.builds, |id| self.build(id))
    }

    pub fn append_log(&self, id: &str, entry: &BuildLogEntry) -> Result<()> {
        let mut line = serde_json::to_vec(entry)
            .map_err(|e| Error::internal(format!("encoding a log line: {e}")))?;
        line.push(b'\n');
        let mut f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(id))
            .map_err(io("opening a build log"))?;
        f.write_all(&line).map_err(io("writing a build log"))
    }

    pub fn log(&self, id: &str) -> Vec<BuildLogEntry> {
        fs::read_to_string(self.log_path(id))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn template_path(&self, id: &str) -> PathBuf {
        self.templates.join(format!("{id}.json"))
    }

    pub fn template(&self, id: &str) -> Result<Option<TemplateRecord>> {
        if !valid_template_id(id) {
            return Ok(None);
        }
        read_json(&self.template_path(id))
    }

    pub fn save_template(&self, t: &TemplateRecord) -> Result<()> {
        write_json(&self.template_path(&t.template_id), t)
    }

    pub fn remove_template(&self, id: &str) -> Result<()> {
        if !valid_template_id(id) {
            return Ok(());
        }
        match fs::remove_file(self.template_path(id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::io(format!("removing template {id}"), e))
            }
            _ => Ok(()),
        }
    }

    pub fn templates(&self) -> Vec<TemplateRecord> {
        each_json(&self.templates, |id| self.template(id))
    }

    /// The team's template called `alias`.
    pub fn by_alias(&self, team: &str, alias: &str) -> Option<TemplateRecord> {
        self.templates()
            .into_iter()
            .find(|t| t.team == team && t.alias == alias)
    }

    fn cache_path(&self, team: &str) -> PathBuf {
        self.cache.join(format!("{}.json", team_dir(team)))
    }

    /// The team's cache entry for the phase `key`.
    pub fn cached(&self, team: &str, key: &str) -> Option<Cached> {
        let all: HashMap<String, Cached> = read_json(&self.cache_path(team)).ok().flatten()?;
        all.get(key).cloned()
    }

    /// Remembers what the phase `key` left (one writer at a time: the caller holds the
    /// builds' write lock).
    pub fn cache(&self, team: &str, key: &str, entry: Cached) -> Result<()> {
        let path = self.cache_path(team);
        let mut all: HashMap<String, Cached> = read_json(&path)?.unwrap_or_default();
        all.insert(key.to_string(), entry);
        write_json(&path, &all)
    }

    /// Marks the team's entries `keys` used now (the caller holds the builds' write lock).
    pub fn touch_cached(&self, team: &str, keys: &[String]) -> Result<()> {
        let path = self.cache_path(team);
        let mut all: HashMap<String, Cached> = read_json(&path)?.unwrap_or_default();
        let now = Utc::now();
        let mut found = false;
        for k in keys {
            if let Some(e) = all.get_mut(k) {
                e.used_at = Some(now);
                found = true;
            }
        }
        if found {
            write_json(&path, &all)?;
        }
        Ok(())
    }

    /// Every team's cache, by the file it is kept in.
    pub fn caches(&self) -> Vec<(PathBuf, HashMap<String, Cached>)> {
        fs::read_dir(&self.cache)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .filter_map(|p| Some((p.clone(), read_json(&p).ok().flatten()?)))
            .collect()
    }

    /// Writes back a team's cache read with `caches`.
    pub fn save_cache(&self, path: &Path, all: &HashMap<String, Cached>) -> Result<()> {
        write_json(path, all)
    }

    /// Every kept upload (not those being received).
    pub fn uploads(&self) -> Vec<PathBuf> {
        fs::read_dir(&self.files)
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|team| fs::read_dir(team.path()).into_iter().flatten().flatten())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| !n.to_string_lossy().starts_with('.'))
            })
            .collect()
    }

    /// Removes uploads a stopped node was receiving.
    pub fn clean_partial_uploads(&self) {
        for team in fs::read_dir(&self.files).into_iter().flatten().flatten() {
            for e in fs::read_dir(team.path()).into_iter().flatten().flatten() {
                if e.file_name().to_string_lossy().starts_with(".upload-") {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }

    /// Where a team's upload of `hash` is kept (the team's name hashed: it may hold anything).
    pub fn files_path(&self, team: &str, hash: &str) -> PathBuf {
        self.files.join(team_dir(team)).join(hash)
    }

    /// A file to receive an upload in, beside where it will be kept.
    pub fn files_staging(&self, team: &str) -> Result<PathBuf> {
        let dir = self.files.join(team_dir(team));
        fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        Ok(dir.join(format!(".upload-{}", ids::random_hex(8))))
    }
}

/// A team's directory name: its name hashed, since a namespace may hold anything.
fn team_dir(team: &str) -> String {
    crate::templates::build::steps::chain("team", &[team])
}

/// Every record of `dir` (`<id>.json`), read with `read`; unreadable ones are skipped.
fn each_json<T>(dir: &Path, read: impl Fn(&str) -> Result<Option<T>>) -> Vec<T> {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            read(name.strip_suffix(".json")?).ok().flatten()
        })
        .collect()
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match fs::read(path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| Error::internal(format!("{} does not parse: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
    }
}

fn write_json<T: Serialize>(path: &Path, v: &T) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(v)
        .map_err(|e| Error::internal(format!("encoding a record: {e}")))?;
    crate::fsx::write_atomic(path, &bytes).map_err(io(format!("writing {}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_ids_name_files() {
        assert!(valid_build_id("6f1c2b8e-0d3a-4c55-9f0e-2a7d1b3c4d5e"));
        assert!(!valid_build_id("6F1C2B8E-0D3A-4C55-9F0E-2A7D1B3C4D5E"));
        assert!(!valid_build_id("../x"));
        assert!(!valid_build_id("6f1c2b8e0d3a4c559f0e2a7d1b3c4d5e"));
        assert!(valid_template_id("k3x9"));
        assert!(!valid_template_id("../k"));
        assert!(!valid_template_id("K3"));
        assert!(!valid_template_id(""));
    }

    #[test]
    fn records_and_logs_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let r = Records::open(&dir.path().join("data"), &dir.path().join("t")).unwrap();
        let id = uuid::Uuid::new_v4().to_string();
        assert!(r.build(&id).unwrap().is_none());
        let b = BuildRecord {
            build_id: id.clone(),
            template_id: "abc".into(),
            team: "team-a".into(),
            state: BuildState::Waiting,
            reason: None,
            created_at: Utc::now(),
            started_at: None,
            finished_at: None,
            cpu_count: 2,
            memory_mb: 1024,
            tags: vec!["default".into()],
            store_name: None,
        };
        r.save_build(&b).unwrap();
        assert_eq!(r.build(&id).unwrap().unwrap().template_id, "abc");
        assert_eq!(r.builds().len(), 1);
        for m in ["one", "two"] {
            r.append_log(
                &id,
                &BuildLogEntry {
                    timestamp: Utc::now(),
                    level: crate::model::builds::LogLevel::Info,
                    message: m.into(),
                    step: None,
                },
            )
            .unwrap();
        }
        let log: Vec<String> = r.log(&id).into_iter().map(|e| e.message).collect();
        assert_eq!(log, ["one", "two"]);
        assert_ne!(r.files_path("a", "h"), r.files_path("b", "h"));
    }
}
