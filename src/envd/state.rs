//! What one envd holds: the access token and sandbox-wide settings `/init` may change, the
//! processes it started, the polling watchers, and how a request's user is chosen.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, RwLock};

use super::EnvdConfig;
use super::metrics::CpuSampler;
use super::process::table::ProcessTable;
use super::users::{User, UserDb, current_user, euid};
use super::watch::Watchers;

/// Settings `/init` replaces; read by every request.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub access_token: Option<String>,
    pub env_vars: BTreeMap<String, String>,
    pub default_user: Option<String>,
    pub default_workdir: Option<PathBuf>,
}

pub struct Envd {
    pub init_token: Option<String>,
    pub mem_total_bytes: Option<u64>,
    pub cpu_count: Option<u32>,
    /// Where the sandbox-wide variables are published for the code interpreter.
    envs_file: Option<PathBuf>,
    settings: RwLock<Settings>,
    pub processes: ProcessTable,
    pub watchers: Watchers,
    pub cpu: Mutex<CpuSampler>,
}

/// A request named a user the sandbox does not have.
#[derive(Debug, Clone, thiserror::Error)]
#[error("user '{0}' does not exist")]
pub struct UnknownUser(pub String);

impl Envd {
    pub fn new(cfg: EnvdConfig) -> Envd {
        Envd {
            init_token: cfg.init_token,
            mem_total_bytes: cfg.mem_total_bytes,
            cpu_count: cfg.cpu_count,
            envs_file: cfg.envs_file,
            settings: RwLock::new(Settings {
                access_token: cfg.access_token,
                env_vars: cfg.env_vars,
                default_user: cfg.default_user,
                default_workdir: cfg.default_workdir,
            }),
            processes: ProcessTable::default(),
            watchers: Watchers::default(),
            cpu: Mutex::new(CpuSampler::default()),
        }
    }

    /// A copy of the current settings (a poisoned lock still holds valid data).
    pub fn settings(&self) -> Settings {
        match self.settings.read() {
            Ok(s) => s.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    pub fn update_settings(&self, f: impl FnOnce(&mut Settings)) {
        let mut s = match self.settings.write() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        let before = s.env_vars.clone();
        f(&mut s);
        if s.env_vars != before {
            self.publish_envs(&s.env_vars);
        }
    }

    /// Hands the sandbox-wide variables to the code interpreter, whose kernels were started
    /// before them (see `crate::interpreter::envs`).
    pub fn publish_envs(&self, envs: &BTreeMap<String, String>) {
        if let Some(path) = &self.envs_file
            && let Err(e) = crate::interpreter::envs::publish(path, envs)
        {
            tracing::warn!(path = %path.display(), error = %e, "publishing the sandbox's variables");
        }
    }

    pub fn access_token(&self) -> Option<String> {
        self.settings().access_token
    }

    /// The user a request runs as: the one it names, else the sandbox default, else `user` when
    /// envd is root and the sandbox has one (e2b's convention), else envd's own user (a
    /// non-root envd cannot be anyone else).
    pub fn select_user(&self, requested: Option<&str>) -> Result<(User, UserDb), UnknownUser> {
        let db = UserDb::load();
        let name = match requested {
            Some(n) => Some(n.to_string()),
            None => self.settings().default_user,
        };
        let user = match name {
            Some(n) => db.user(&n).ok_or(UnknownUser(n))?,
            None if euid() == 0 => db.user("user").unwrap_or_else(|| current_user(&db)),
            None => current_user(&db),
        };
        Ok((user, db))
    }
}
