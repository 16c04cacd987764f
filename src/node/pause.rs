//! Pause and resume. A full pause freezes the instance (its memory and processes stay); a
//! filesystem-only pause saves the instance's files under the node's `paused/` directory and
//! destroys the instance, and its resume (or any resume asked to be cold) boots a fresh
//! instance from those files and gives it the claim's identity again.

use std::path::PathBuf;

use chrono::Utc;

use super::Node;
use super::runtime::{Instance, Runtime};
use crate::model::logs::LogLevel;
use crate::model::{
    self, Error, InventoryChange, PauseChange, PauseMode, PausedSince, Phase, Result, SandboxRecord,
};

/// How long a filesystem-only pause waits for the sandbox's agent to answer.
const AGENT_ANSWERS_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// What a change does to a sandbox in `current`'s state: None when it is already there (not
/// an error: callers tell the two apart by the answer's `changed`).
fn plan(current: &SandboxRecord, change: PauseChange) -> Option<Step> {
    let paused = current.phase == Phase::Paused;
    match change {
        PauseChange::Pause(_) if paused => None,
        PauseChange::Resume { .. } if !paused => None,
        PauseChange::Pause(PauseMode::Full) => Some(Step::Freeze),
        PauseChange::Pause(PauseMode::Filesystem) => Some(Step::SaveFiles),
        // Files alone cannot be thawed: they always boot fresh.
        PauseChange::Resume { .. } if current.paused_on_disk() => Some(Step::BootFromFiles),
        PauseChange::Resume { cold: true } => Some(Step::SaveThenBoot),
        PauseChange::Resume { cold: false } => Some(Step::Thaw),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Freeze,
    Thaw,
    SaveFiles,
    BootFromFiles,
    /// A full pause resumed cold: its files are saved from the frozen instance first.
    SaveThenBoot,
}

impl<R: Runtime> Node<R> {
    /// Freezes (`pause = true`) or thaws the sandbox. Repeating either is not an error: the
    /// answer says whether the state changed.
    pub async fn set_paused(&self, id: &str, pause: bool) -> Result<(SandboxRecord, bool)> {
        let change = if pause {
            PauseChange::Pause(PauseMode::Full)
        } else {
            PauseChange::Resume { cold: false }
        };
        self.change_pause(id, change).await
    }

    /// Pauses or resumes as `change` says; repeating is not an error (see `set_paused`).
    pub async fn change_pause(
        &self,
        id: &str,
        change: PauseChange,
    ) -> Result<(SandboxRecord, bool)> {
        self.set_paused_when(id, change, |_| true).await
    }

    /// Pauses the sandbox as its lifecycle asks if `still` holds for its record once its verb
    /// lock is held; answers whether it paused it.
    pub(super) async fn pause_when(
        &self,
        id: &str,
        still: impl Fn(&SandboxRecord) -> bool,
    ) -> Result<bool> {
        let mode = self.record_of(id)?.lifecycle.pause_mode;
        let change = PauseChange::Pause(mode);
        Ok(self.set_paused_when(id, change, still).await?.1)
    }

    /// Where a sandbox paused on disk keeps its files.
    pub(super) fn saved_files(&self, id: &str) -> PathBuf {
        self.inner.paths.paused.join(id)
    }

    async fn set_paused_when(
        &self,
        id: &str,
        change: PauseChange,
        still: impl Fn(&SandboxRecord) -> bool,
    ) -> Result<(SandboxRecord, bool)> {
        let (_guard, current, inst) = self.lock_claim(id).await?;
        let Some(step) = plan(&current, change).filter(|_| still(&current)) else {
            return Ok((current, false));
        };
        let record = match step {
            Step::Freeze => {
                self.inner.runtime.pause(&inst).await?;
                let record = self.settle(id, Some(PauseMode::Full), None)?;
                self.ready_resume_later(id);
                record
            }
            Step::Thaw => {
                self.inner.runtime.resume(&inst).await?;
                self.settle(id, None, None)?
            }
            Step::SaveFiles => self.save_files(id, &inst, false).await?,
            Step::BootFromFiles => self.boot_from_files(id, &current).await?,
            Step::SaveThenBoot => {
                let saved = self.save_files(id, &inst, true).await?;
                self.boot_from_files(id, &saved).await?
            }
        };
        Ok((record, true))
    }

    /// Once the pause has answered, lets the runtime ready the sandbox's resume (see
    /// `Runtime::ready_resume`), under the sandbox's verb lock, so that no verb (a resume, a
    /// release) meets it half done: a resume that comes sooner waits for it.
    fn ready_resume_later(&self, id: &str) {
        let node = self.clone();
        let id = id.to_string();
        self.inner.tasks.spawn(async move {
            let Ok((_guard, record, inst)) = node.lock_claim(&id).await else {
                return;
            };
            if record.phase != Phase::Paused || record.paused_on_disk() {
                return;
            }
            if let Err(e) = node.inner.runtime.ready_resume(&inst).await {
                tracing::warn!(sandbox = %id, error = %e, "could not ready the paused sandbox's resume; it resumes without");
            }
        });
    }

    /// Saves the instance's files and destroys it; the claim stays, paused on disk.
    async fn save_files(
        &self,
        id: &str,
        inst: &Instance<R::Handle>,
        frozen: bool,
    ) -> Result<SandboxRecord> {
        self.inner.runtime.captures_files()?;
        if !frozen {
            // As on e2b, a sandbox whose agent does not answer is not paused this way (503):
            // its files may be mid-change by something that has hung it.
            self.agent_answers(inst, AGENT_ANSWERS_WITHIN)
                .await
                .map_err(|e| {
                    e.context(format!("sandbox {id} cannot be paused without its memory"))
                })?;
        }
        let dest = self.saved_files(id);
        let _ = tokio::fs::remove_dir_all(&dest).await;
        if let Err(e) = self.inner.runtime.capture_files(inst, frozen, &dest).await {
            let _ = tokio::fs::remove_dir_all(&dest).await;
            return Err(e.context("saving the sandbox's files"));
        }
        let record = self.settle(id, Some(PauseMode::Filesystem), None)?;
        // Its processes, memory, cgroups, network and mounts go now; retried until they do.
        self.destroy_later(inst.clone(), "paused to disk");
        Ok(record)
    }

    /// Boots a fresh instance from the files a filesystem-only pause saved and makes it the
    /// claim's: the same id, token, environment, network policy and lifecycle.
    async fn boot_from_files(&self, id: &str, current: &SandboxRecord) -> Result<SandboxRecord> {
        let saved = self.saved_files(id);
        let template = self.template(&current.key.template)?;
        let egress = self.egress_for(&current.key, &current.network, current.namespace())?;
        // The claim keeps its slot while paused, so nothing is reserved here.
        // Its volumes are mounted again before it is handed out.
        let inst = self
            .boot_mounted(
                &current.key,
                &template,
                Some(&saved),
                egress.as_ref(),
                &current.volume_mounts,
            )
            .await
            .map_err(|e| e.context(format!("booting sandbox {id} from its saved files")))?;
        if self.state().closing {
            self.destroy_later(inst, "node closing");
            return Err(Error::unavailable(format!(
                "node {:?} is shutting down",
                self.name()
            )));
        }
        let record = self.settle(id, None, Some(inst))?;
        let _ = tokio::fs::remove_dir_all(&saved).await;
        Ok(record)
    }

    /// Records a pause (`Some(mode)`) or a resume, with the instance a cold resume booted.
    fn settle(
        &self,
        id: &str,
        paused: Option<PauseMode>,
        booted: Option<Instance<R::Handle>>,
    ) -> Result<SandboxRecord> {
        let mut st = self.state();
        let Some(c) = st.claims.get_mut(id) else {
            let e = self.not_found(&st, id);
            drop(st);
            if let Some(inst) = booted {
                self.destroy_later(inst, "released while it resumed");
            }
            return Err(e);
        };
        let now = Utc::now();
        if let Some(inst) = booted {
            inst.logs.note(
                LogLevel::Info,
                "booted fresh from the files saved when it paused (its processes did not survive)",
            );
            c.record.state_dir = inst.dir.display().to_string();
            c.last_cpu = None;
            c.instance = inst;
        }
        match paused {
            Some(mode) => {
                c.record.phase = Phase::Paused;
                let until = model::lease::after(now, self.inner.cfg.paused_retention);
                c.record.paused = Some(PausedSince {
                    at: now,
                    until,
                    mode,
                });
                let what = match mode {
                    PauseMode::Full => "paused",
                    PauseMode::Filesystem => "paused with its files only",
                };
                c.instance.logs.note(
                    LogLevel::Info,
                    format!("{what}; kept until {} unless resumed", until.to_rfc3339()),
                );
                // Connections into a frozen or stopped sandbox would hang; close them, so
                // clients see it is not running.
                std::mem::replace(&mut c.tunnels, tokio_util::sync::CancellationToken::new())
                    .cancel();
            }
            None => {
                let cold = c.record.paused_on_disk();
                c.record.phase = Phase::Running;
                // Time spent paused does not count: the lease starts again.
                c.record.paused = None;
                c.record.deadline = self.inner.cfg.lease.deadline(now, c.record.lease_seconds);
                let secs = c.record.lease_seconds;
                c.instance.logs.note(
                    LogLevel::Info,
                    format!("resumed; lease of {secs} s granted again"),
                );
                if cold {
                    // The fresh agent knows nothing of the claim: /init again, as a claim does.
                    c.ready = self.identify(&c.record, &c.instance);
                }
            }
        }
        let record = c.record.clone();
        st.emit(
            &self.inner.events,
            InventoryChange::Modified(record.clone().without_token()),
        );
        drop(st);
        self.changed();
        Ok(record)
    }

    /// Removes the files of a sandbox that was paused on disk (it is being released).
    pub(super) fn discard_saved_files(&self, id: &str) {
        let dir = self.saved_files(id);
        self.inner.tasks.spawn(async move {
            if let Err(e) = tokio::fs::remove_dir_all(&dir).await
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::error!(dir = %dir.display(), error = %e, "could not remove a paused sandbox's files");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paused(mode: PauseMode) -> SandboxRecord {
        SandboxRecord {
            phase: Phase::Paused,
            paused: Some(PausedSince {
                at: chrono::DateTime::UNIX_EPOCH,
                until: chrono::DateTime::UNIX_EPOCH,
                mode,
            }),
            ..SandboxRecord::fixture("sb_1", "")
        }
    }

    #[test]
    fn a_pause_of_a_paused_sandbox_changes_nothing() {
        for mode in [PauseMode::Full, PauseMode::Filesystem] {
            for again in [PauseMode::Full, PauseMode::Filesystem] {
                assert_eq!(plan(&paused(mode), PauseChange::Pause(again)), None);
            }
        }
        let running = SandboxRecord::fixture("sb_1", "");
        for cold in [false, true] {
            assert_eq!(plan(&running, PauseChange::Resume { cold }), None);
        }
    }

    #[test]
    fn files_always_boot_fresh_and_memory_only_when_asked() {
        let on_disk = paused(PauseMode::Filesystem);
        assert!(on_disk.paused_on_disk());
        for cold in [false, true] {
            let step = plan(&on_disk, PauseChange::Resume { cold });
            assert_eq!(step, Some(Step::BootFromFiles));
        }
        let frozen = paused(PauseMode::Full);
        assert!(!frozen.paused_on_disk());
        let warm = plan(&frozen, PauseChange::Resume { cold: false });
        assert_eq!(warm, Some(Step::Thaw));
        let cold = plan(&frozen, PauseChange::Resume { cold: true });
        assert_eq!(cold, Some(Step::SaveThenBoot));
        let running = SandboxRecord::fixture("sb_1", "");
        let fs = plan(&running, PauseChange::Pause(PauseMode::Filesystem));
        assert_eq!(fs, Some(Step::SaveFiles));
        let full = plan(&running, PauseChange::Pause(PauseMode::Full));
        assert_eq!(full, Some(Step::Freeze));
    }

    #[test]
    fn the_pause_mode_shows_only_while_paused() {
        let mut r = paused(PauseMode::Filesystem);
        assert_eq!(r.pause_mode(), Some(PauseMode::Filesystem));
        r.phase = Phase::Running;
        assert_eq!(r.pause_mode(), None);
        assert!(!r.paused_on_disk());
    }
}
