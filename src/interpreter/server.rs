//! The interpreter's state and the decisions the HTTP routes share: which kernel serves a
//! language, making contexts (within the limit), choosing the context of an execution, and
//! whether the server is ready (its default contexts are up).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::config::Config;
use super::contexts::{Context, Registry};
use super::envs::SandboxEnvs;
use super::kernel::{KernelSpec, Launch};
use super::languages;

/// What a new kernel takes of its own, about (an idle IPython kernel's anonymous memory).
const CONTEXT_MEMORY: u64 = 64 << 20;

/// How often a default context's kernel is tried at start.
const DEFAULT_ATTEMPTS: u32 = 3;

pub struct Server {
    pub cfg: Config,
    pub runtime_dir: PathBuf,
    pub kernel_env: Vec<(String, String)>,
    pub memory_bytes: Option<u64>,
    pub envs: SandboxEnvs,
    pub contexts: Registry,
    pub started: AtomicBool,
    /// Held while a context is admitted and registered.
    pub admitting: std::sync::Mutex<()>,
}

/// A context being created: removed and closed when dropped before `done`.
struct Unfinished<'a> {
    contexts: &'a Registry,
    ctx: Option<Arc<Context>>,
}

impl Unfinished<'_> {
    fn done(mut self) {
        self.ctx = None;
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(ctx) = self.ctx.take() {
            self.contexts.remove(&ctx.id);
            tokio::spawn(async move { ctx.close().await });
        }
    }
}

/// Why a request could not be served, with the status it answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    TooMany(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Failed(String),
}

impl Server {
    /// The kernelspec for a (normalised) language, or why there is none.
    fn spec_for(&self, language: &str) -> Result<KernelSpec, Refusal> {
        if let Some(why) = self.cfg.unavailable.get(language) {
            return Err(Refusal::Unavailable(format!(
                "language {language:?} is not available in this sandbox: {why}"
            )));
        }
        let name = self.cfg.kernel_for(language);
        KernelSpec::find(&self.cfg.data_dirs, &name).ok_or_else(|| {
            Refusal::BadRequest(format!(
                "unknown language {language:?}: this sandbox has kernels for {}",
                self.languages().join(", ")
            ))
        })
    }

    /// The languages this sandbox can run, for messages.
    pub fn languages(&self) -> Vec<String> {
        self.cfg
            .kernels
            .iter()
            .filter(|(_, k)| KernelSpec::find(&self.cfg.data_dirs, k).is_some())
            .map(|(l, _)| l.clone())
            .collect()
    }

    fn launch(&self, spec: KernelSpec, cwd: PathBuf) -> Launch {
        Launch {
            spec,
            cwd,
            runtime_dir: self.runtime_dir.clone(),
            env: self.kernel_env.clone(),
            start_timeout: Duration::from_secs(self.cfg.start_timeout_seconds),
        }
    }

    /// Whether another context fits: at most the configured number of contexts clients made
    /// (a language's default is not refused for them: `run_code` without a context must
    /// keep working whatever contexts were made, a fuzzer's run found), and only while the
    /// sandbox's memory has room for another kernel (rather than a kernel the OOM killer
    /// takes later, with some other context's state).
    fn admit(&self, default: bool) -> Result<(), Refusal> {
        const MIB: u64 = 1 << 20;
        if !default && self.contexts.made() >= self.cfg.max_contexts {
            return Err(Refusal::TooMany(format!(
                "this sandbox already has {} contexts besides its default ones, the most it keeps (each is a kernel with its own memory); remove one first",
                self.cfg.max_contexts
            )));
        }
        if let Some(total) = self.memory_bytes {
            let used = crate::envd::metrics::visible_anonymous();
            if used + CONTEXT_MEMORY > total {
                return Err(Refusal::TooMany(format!(
                    "not enough memory for another context: its processes hold {} MiB of this sandbox's {} MiB and a kernel needs about {} MiB; remove a context or use a larger sandbox",
                    used / MIB,
                    total / MIB,
                    CONTEXT_MEMORY / MIB
                )));
            }
        }
        Ok(())
    }

    /// Makes a context and waits for its kernel. `default` marks it as its language's default
    /// context (and warms it).
    pub async fn create(
        &self,
        language: Option<&str>,
        cwd: Option<&str>,
        default: bool,
    ) -> Result<Arc<Context>, Refusal> {
        let language = languages::normalise(language);
        let spec = self.spec_for(&language)?;
        let cwd = match cwd.filter(|c| !c.is_empty()) {
            Some(c) => PathBuf::from(c),
            None => self.cfg.cwd.clone(),
        };
        if !cwd.is_absolute() {
            return Err(Refusal::BadRequest(format!(
                "cwd {:?} is not an absolute path",
                cwd.display()
            )));
        }
        if !Path::new(&cwd).is_dir() {
            return Err(Refusal::BadRequest(format!(
                "cwd {:?} is not a directory in this sandbox",
                cwd.display()
            )));
        }
        let warm = if default {
            self.cfg.warm.get(&language).cloned()
        } else {
            None
        };
        let ctx = {
            // Two creates at once must not both pass the limit.
            let _admitting = self
                .admitting
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.admit(default)?;
            let id = uuid::Uuid::new_v4().to_string();
            let ctx = Context::start(id, language.clone(), self.launch(spec, cwd), warm);
            self.contexts
                .insert(ctx.clone(), default.then_some(language.as_str()));
            ctx
        };
        // Undone if the kernel does not come up, and also if the request goes away while it
        // starts (a client's timeout): no half-made context stays listed or counted.
        let pending = Unfinished {
            contexts: &self.contexts,
            ctx: Some(ctx.clone()),
        };
        if let Err(why) = ctx.kernel().await {
            return Err(Refusal::Failed(format!("Failed to create context: {why}")));
        }
        pending.done();
        Ok(ctx)
    }

    /// The default context of `language`, made now if it has none (or it was deleted).
    pub async fn default_context(&self, language: Option<&str>) -> Result<Arc<Context>, Refusal> {
        let language = languages::normalise(language);
        if let Some(c) = self.contexts.default_of(&language) {
            return Ok(c);
        }
        // Only languages that exist get a lock (one per name a request sends would grow the
        // map without end).
        self.spec_for(&language)?;
        let lock = self.contexts.creation_lock(&language).await;
        let _held = lock.lock().await;
        if let Some(c) = self.contexts.default_of(&language) {
            return Ok(c);
        }
        self.create(Some(&language), None, true).await
    }

    /// The context an execution runs in: by id, by language, or python's default.
    pub async fn context_for(
        &self,
        context_id: Option<&str>,
        language: Option<&str>,
    ) -> Result<Arc<Context>, Refusal> {
        match (context_id, language) {
            (Some(_), Some(_)) => Err(Refusal::BadRequest(
                "Only one of context_id or language can be provided".into(),
            )),
            (Some(id), None) => self
                .contexts
                .get(id)
                .ok_or_else(|| Refusal::NotFound(format!("Context {id} not found"))),
            (None, lang) => self.default_context(lang).await,
        }
    }

    /// Starts the configured default contexts, in order (python first), then counts as
    /// started (a default that cannot start is logged, not waited for forever).
    /// Starts the default contexts, each tried a few times. `/health` answers 200 only once
    /// all whose kernels exist are up: a sandbox whose Python kernel cannot start is not
    /// handed out as warm (its node reboots it when the wait for health runs out). A default
    /// naming a language the sandbox has no kernel for (or no room for) is only logged.
    pub async fn start_defaults(&self) {
        for lang in &self.cfg.default_contexts {
            for attempt in 1..=DEFAULT_ATTEMPTS {
                match self.default_context(Some(lang)).await {
                    Ok(_) => break,
                    // Not the kernel's failing: no kernel for it, or no room in a small sandbox.
                    Err(
                        e
                        @ (Refusal::BadRequest(_) | Refusal::Unavailable(_) | Refusal::TooMany(_)),
                    ) => {
                        tracing::warn!(language = %lang, error = %e, "no default context for this language");
                        break;
                    }
                    Err(e) if attempt == DEFAULT_ATTEMPTS => {
                        tracing::error!(language = %lang, error = %e, "a default context did not start; the sandbox stays unhealthy");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(language = %lang, error = %e, attempt, "a default context did not start; trying again");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        }
        self.started.store(true, Ordering::SeqCst);
    }

    /// Whether the default contexts have been started (what `/health` waits for).
    pub fn started(&self) -> bool {
        self.started.load(Ordering::SeqCst)
    }
}
