//! Contexts: each is a kernel with a language and a working directory, kept alive by a
//! supervisor task that starts it, restarts it when it dies (or when asked), and ends it when
//! the context is deleted. Executions on one context take turns; contexts run in parallel.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use super::kernel::{Kernel, Launch};
use super::languages::Family;

/// What a context's kernel is doing.
#[derive(Clone)]
pub enum KernelState {
    Starting,
    Ready(Arc<Kernel>),
    /// It could not be started; a restart tries again.
    Failed(String),
    /// The context was deleted.
    Closed,
}

/// What the supervisor is asked to do.
enum Intent {
    /// End the kernel and start a new one; answered once it is up (or failed).
    Restart(oneshot::Sender<Result<(), String>>),
    /// End the kernel for good.
    Close(oneshot::Sender<()>),
}

pub struct Context {
    pub id: String,
    pub language: String,
    pub cwd: PathBuf,
    pub family: Family,
    /// Executions take turns (tokio's mutex is fair: first come, first served).
    pub turn: tokio::sync::Mutex<()>,
    state: watch::Receiver<KernelState>,
    intents: mpsc::UnboundedSender<Intent>,
}

/// Grace a kernel gets to leave after a shutdown request before its group is killed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Pauses between restarts of a kernel that keeps dying.
const RESTART_BACKOFF: &[Duration] = &[
    Duration::ZERO,
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(5),
    Duration::from_secs(10),
];
/// A kernel that ran this long before it died counts as healthy: its restart pauses begin
/// again from the shortest.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

impl Context {
    /// Starts a context: its kernel starts in the background; `warm` is run silently after
    /// every start, before the kernel is offered to executions.
    pub fn start(
        id: String,
        language: String,
        launch: Launch,
        warm: Option<String>,
    ) -> Arc<Context> {
        let (state_tx, state) = watch::channel(KernelState::Starting);
        let (intents, rx) = mpsc::unbounded_channel();
        let ctx = Arc::new(Context {
            family: launch.spec.family(),
            id,
            language,
            cwd: launch.cwd.clone(),
            turn: tokio::sync::Mutex::new(()),
            state,
            intents,
        });
        tokio::spawn(supervise(ctx.id.clone(), launch, warm, state_tx, rx));
        ctx
    }

    /// The kernel once it is up; the reason when it could not start or the context is gone.
    /// A kernel that has died is not offered, even before the supervisor has noticed (an
    /// execution that saw it die may be followed at once by the next): the state changes
    /// when the supervisor starts the next one.
    pub async fn kernel(&self) -> Result<Arc<Kernel>, String> {
        let mut state = self.state.clone();
        let settled = state
            .wait_for(|s| match s {
                KernelState::Starting => false,
                KernelState::Ready(k) => k.exit().is_none(),
                _ => true,
            })
            .await
            .map(|s| s.clone());
        match settled {
            Ok(KernelState::Ready(k)) => Ok(k),
            Ok(KernelState::Failed(why)) => Err(why),
            Ok(KernelState::Closed) | Err(_) => Err(format!("context {} was removed", self.id)),
            Ok(KernelState::Starting) => Err("the kernel is starting".into()),
        }
    }

    /// Restarts the kernel in place (same id, language and working directory); answers once
    /// the new kernel is up.
    pub async fn restart(&self) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        self.intents
            .send(Intent::Restart(tx))
            .map_err(|_| format!("context {} was removed", self.id))?;
        rx.await
            .unwrap_or_else(|_| Err(format!("context {} was removed", self.id)))
    }

    /// Asks for a restart without waiting for it (a kernel that ignores interrupts).
    pub fn restart_later(&self) {
        let (tx, _) = oneshot::channel();
        let _ = self.intents.send(Intent::Restart(tx));
    }

    /// Ends the kernel for good.
    pub async fn close(&self) {
        let (tx, rx) = oneshot::channel();
        if self.intents.send(Intent::Close(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

async fn sleep_opt(pause: Option<Duration>) {
    match pause {
        Some(p) => tokio::time::sleep(p).await,
        None => std::future::pending().await,
    }
}

async fn supervise(
    id: String,
    launch: Launch,
    warm: Option<String>,
    state: watch::Sender<KernelState>,
    mut intents: mpsc::UnboundedReceiver<Intent>,
) {
    let mut failures = 0usize;
    // Who waits for the kernel being started now (a restart's caller).
    let mut waiting: Option<oneshot::Sender<Result<(), String>>> = None;
    // Whether a kernel of this context has run: then a failed start is retried by itself
    // (the context lives on); a first start that fails is the creator's to report.
    let mut has_run = false;
    loop {
        state.send_replace(KernelState::Starting);
        let started = Kernel::start(&id, &launch).await;
        let kernel = match started {
            Ok(k) => k,
            Err(e) => {
                let why = e.to_string();
                tracing::warn!(context = %id, error = %why, "the kernel did not start");
                state.send_replace(KernelState::Failed(why.clone()));
                if let Some(w) = waiting.take() {
                    let _ = w.send(Err(why));
                }
                // Wait to be asked again (a restart) or to be closed; a context whose kernel
                // has run also tries again by itself, after a pause that grows.
                let retry = has_run.then(|| {
                    let pause = RESTART_BACKOFF[failures.min(RESTART_BACKOFF.len() - 1)];
                    failures += 1;
                    pause
                });
                let intent = tokio::select! {
                    intent = intents.recv() => intent,
                    _ = sleep_opt(retry) => continue,
                };
                match intent {
                    Some(Intent::Restart(w)) => {
                        waiting = Some(w);
                        continue;
                    }
                    Some(Intent::Close(done)) => {
                        state.send_replace(KernelState::Closed);
                        let _ = done.send(());
                        return;
                    }
                    None => return,
                }
            }
        };
        if let Some(code) = &warm
            && let Err(e) = kernel.run_silently(code, launch.start_timeout).await
        {
            tracing::warn!(context = %id, error = %e, "warming the kernel failed");
        }
        state.send_replace(KernelState::Ready(kernel.clone()));
        has_run = true;
        let ready_at = tokio::time::Instant::now();
        if let Some(w) = waiting.take() {
            let _ = w.send(Ok(()));
        }
        tokio::select! {
            _ = kernel.ended() => {
                // A kernel that ran a good while before it died starts the pauses afresh.
                if ready_at.elapsed() > HEALTHY_RUN {
                    failures = 0;
                }
                let why = kernel.exit().map(|e| e.0).unwrap_or_default();
                let pause = RESTART_BACKOFF[failures.min(RESTART_BACKOFF.len() - 1)];
                failures += 1;
                tracing::warn!(context = %id, %why, ?pause, "the kernel died; restarting it");
                drop(kernel);
                state.send_replace(KernelState::Starting);
                tokio::time::sleep(pause).await;
            }
            intent = intents.recv() => {
                failures = 0;
                // No execution takes the turn with a kernel that is shutting down.
                state.send_replace(KernelState::Starting);
                kernel.shutdown(SHUTDOWN_GRACE).await;
                drop(kernel);
                match intent {
                    Some(Intent::Restart(w)) => waiting = Some(w),
                    Some(Intent::Close(done)) => {
                        state.send_replace(KernelState::Closed);
                        let _ = done.send(());
                        return;
                    }
                    None => {
                        state.send_replace(KernelState::Closed);
                        return;
                    }
                }
            }
        }
    }
}

/// Every context, in creation order, and the default one of each language.
#[derive(Default)]
pub struct Registry {
    inner: Mutex<Inner>,
    /// Serialises the lazy creation of each language's default context.
    creating: tokio::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

#[derive(Default)]
struct Inner {
    order: Vec<Arc<Context>>,
    defaults: HashMap<String, String>,
}

impl Registry {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn list(&self) -> Vec<Arc<Context>> {
        self.inner().order.clone()
    }

    /// Contexts that are not a language's default (the ones clients made).
    pub fn made(&self) -> usize {
        let inner = self.inner();
        inner.order.len().saturating_sub(inner.defaults.len())
    }

    pub fn get(&self, id: &str) -> Option<Arc<Context>> {
        self.inner().order.iter().find(|c| c.id == id).cloned()
    }

    pub fn insert(&self, ctx: Arc<Context>, default_for: Option<&str>) {
        let mut inner = self.inner();
        if let Some(lang) = default_for {
            inner.defaults.insert(lang.to_string(), ctx.id.clone());
        }
        inner.order.push(ctx);
    }

    pub fn remove(&self, id: &str) -> Option<Arc<Context>> {
        let mut inner = self.inner();
        let pos = inner.order.iter().position(|c| c.id == id)?;
        inner.defaults.retain(|_, v| v != id);
        Some(inner.order.remove(pos))
    }

    /// The default context of `language`, if it has one.
    pub fn default_of(&self, language: &str) -> Option<Arc<Context>> {
        let inner = self.inner();
        let id = inner.defaults.get(language)?;
        inner.order.iter().find(|c| &c.id == id).cloned()
    }

    /// A lock held while `language`'s default context is being made.
    pub async fn creation_lock(&self, language: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.creating
            .lock()
            .await
            .entry(language.to_string())
            .or_default()
            .clone()
    }
}
