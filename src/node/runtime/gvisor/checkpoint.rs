//! Taking a gVisor sandbox's state: closing its door for a checkpoint, the checkpoint itself
//! (stopping the sandbox, or letting it run on where runsc can), what a restore of the image
//! needs beside it, what a capture takes, and the work left for after the answer.

use super::*;
use futures::future::OptionFuture;

impl GvisorRuntime {
    /// Asks the sandbox whether a checkpoint would succeed (see `gvisor_init::unsaveable`):
    /// None if so, else why not.
    pub(super) async fn unsaveable(&self, dir: &Path) -> Result<Option<String>> {
        if self.cfg.runsc.saves_watched_sockets {
            return Ok(None);
        }
        let answer = Self::ask(dir, "SAVEABLE").await?;
        match answer.trim().split_once(' ').unwrap_or((answer.trim(), "")) {
            ("OK", _) => Ok(None),
            ("NO", why) => Ok(Some(why.to_string())),
            _ => Err(Error::unavailable(format!(
                "the sandbox gave an unexpected answer: {:?}",
                answer.trim()
            ))),
        }
    }

    /// Closes the running sandbox's door and has runsc checkpoint it into `image` (see
    /// `Runsc::checkpoint` for `leave_running`): answers its container and runsc's answer.
    async fn checkpoint_with(
        &self,
        inst: &Instance<GvisorHandle>,
        image: &Path,
        leave_running: bool,
    ) -> Result<(String, Result<()>)> {
        let container = self
            .container(inst)
            .ok_or_else(|| Error::conflict(format!("sandbox {} is not running", inst.id)))?;
        // Made before the door closes: a door closed for a checkpoint that never runs would
        // not open again.
        std::fs::create_dir_all(image).map_err(io_err("creating the checkpoint directory"))?;
        self.quiesce(&inst.dir).await?;
        let made = self
            .cfg
            .runsc
            .checkpoint(image, &container, leave_running)
            .await;
        Ok((container, made))
    }

    /// Checkpoints the running sandbox into `image` (it stops) and forgets its container.
    pub(super) async fn checkpoint_to(
        &self,
        inst: &Instance<GvisorHandle>,
        image: &Path,
    ) -> Result<u64> {
        let (container, made) = self.checkpoint_with(inst, image, false).await?;
        if made.is_ok() {
            // The stopped Sentry lingers, holding the sandbox's memory, until runsc deletes
            // the container: it is ended now, so a pause has freed the memory when it
            // answers, and the rest of the delete happens after.
            Self::end_sentries(&inst.handle.cgroup).await;
            self.delete_later(&inst.id, container);
        } else {
            // It may still run: stopped before anything else happens.
            let _ = self.cfg.runsc.delete(&container).await;
        }
        if let Some(l) = self.live().get_mut(&inst.id) {
            l.container = None;
            // The stopped sandbox's namespace has served its start (see `netholder`).
            l.holder = None;
        }
        made?;
        Self::describe_image(inst, image)
    }

    /// Checkpoints the running sandbox into `image` and lets it run on in place (runsc builds
    /// with `resumes_after_checkpoint`): nothing is restarted, so it keeps its memory, its
    /// network namespace and its container, and answers again once its door reopens. If the
    /// checkpoint fails and the sandbox no longer answers, its container is deleted, so it is
    /// reported dead rather than running. `door` is the door's inode before (see `wait_door`).
    pub(super) async fn checkpoint_running(
        &self,
        inst: &Instance<GvisorHandle>,
        image: &Path,
        door: Option<u64>,
    ) -> Result<u64> {
        let (container, made) = self.checkpoint_with(inst, image, true).await?;
        // The door opens again (see `gvisor_init`), whatever the checkpoint did.
        Self::bump_generation(&inst.dir)?;
        if let Err(e) = made {
            if self
                .wait_door(&inst.dir, door, RUN_ON_WITHIN)
                .await
                .is_err()
            {
                let _ = self.cfg.runsc.delete(&container).await;
                if let Some(l) = self.live().get_mut(&inst.id) {
                    l.container = None;
                }
            }
            return Err(e);
        }
        Self::describe_image(inst, image)
    }

    /// Writes what a restore of `image` needs beside it; answers the image's size.
    pub(super) fn describe_image(inst: &Instance<GvisorHandle>, image: &Path) -> Result<u64> {
        let meta = serde_json::to_vec(&ImageMeta {
            init_token: inst.handle.init_token.clone(),
        })
        .map_err(|e| Error::internal(format!("encoding the image description: {e}")))?;
        std::fs::write(image.join(IMAGE_META), meta)
            .map_err(io_err("describing the checkpoint"))?;
        Ok(crate::fsx::tree_disk_usage(image).unwrap_or(0))
    }

    /// What a capture of `inst` into `dest` takes, or why it cannot be made; a paused
    /// sandbox's image is copied into `dest` here (nothing is left to stop).
    pub(super) async fn capturable(
        &self,
        inst: &Instance<GvisorHandle>,
        paused: bool,
        dest: &Path,
    ) -> Result<Capture> {
        let frozen = self.live().get(&inst.id).is_some_and(|l| l.frozen);
        if inst.handle.egress && !self.cfg.runsc.saves_connections {
            return Err(Error::conflict(format!(
                "sandbox {} has internet access, and this runsc ({}) cannot save a sandbox's internet connections: snapshots and forks on the gvisor runtime need a sandbox without internet access (e2b allow_internet_access=False, net none)",
                inst.id, self.cfg.runsc.version
            )));
        }
        if inst.handle.volumes {
            return Err(Error::conflict(format!(
                "sandbox {} has volumes mounted, which a gVisor checkpoint would take with it: snapshots and forks on the gvisor runtime need a sandbox without volume mounts",
                inst.id
            )));
        }
        if frozen {
            return Err(Error::conflict(format!(
                "sandbox {} is paused in memory (it could not be checkpointed); resume it first",
                inst.id
            )));
        }
        if !paused && let Some(why) = self.unsaveable(&inst.dir).await? {
            return Err(Error::conflict(format!(
                "sandbox {} cannot be checkpointed now: {why}",
                inst.id
            )));
        }
        if paused {
            // The pause's own image is the state to branch from.
            let src = inst.dir.join(IMAGE_DIR);
            std::fs::create_dir(dest).map_err(io_err("creating the checkpoint directory"))?;
            let copied = (|| {
                let mut total = 0;
                for e in std::fs::read_dir(&src).map_err(io_err("reading the paused image"))? {
                    let e = e.map_err(io_err("reading the paused image"))?;
                    total += std::fs::copy(e.path(), dest.join(e.file_name()))
                        .map_err(io_err("copying the paused image"))?;
                }
                Ok(total)
            })();
            if copied.is_err() {
                // A partial copy (the disk filled up) is no checkpoint.
                let _ = std::fs::remove_dir_all(dest);
            }
            return copied.map(Capture::Copied);
        }
        // An image cut short by a full disk is no snapshot, and where runsc stops the sandbox
        // to checkpoint it, cannot restart it either. So a data directory with less room than
        // the sandbox's memory (what the image holds, at most) refuses before anything starts.
        let needed = Cgroups::measure(&inst.handle.cgroup)
            .memory_bytes
            .unwrap_or(0);
        let parent = dest.parent().unwrap_or(dest);
        if let Ok(free) = crate::fsx::filesystem_free(parent)
            && free < needed
        {
            return Err(Error::storage_full(format!(
                "the node's data directory is full: a snapshot of sandbox {} needs up to {} MiB and {} MiB are free",
                inst.id,
                needed.div_ceil(1 << 20),
                free >> 20
            )));
        }
        Ok(Capture::Checkpoint)
    }

    /// Kills the Sentry processes in `cg` and waits (up to a second) until they are gone.
    pub(super) async fn end_sentries(cg: &CgroupSet) {
        let sentries = || {
            Cgroups::pids(cg)
                .into_iter()
                .filter(|&p| is_sentry(p))
                .collect::<Vec<_>>()
        };
        for pid in sentries() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        for _ in 0..100 {
            if sentries().is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Deletes a container a checkpoint stopped after the caller has its answer (`runsc
    /// delete` takes about a second here, waiting on what the stopped sandbox left): once
    /// its Sentry is ended, what is left is runsc's state under a name no later start
    /// reuses, and runsc leaves the cgroups to the node (`--ignore-cgroups`), so a restore
    /// runs beside it. The sandbox's destroy waits for it, so nothing is left behind.
    pub(super) fn delete_later(&self, id: &str, container: String) {
        let runsc = self.cfg.runsc.clone();
        self.later(id, async move {
            let _ = runsc.delete(&container).await;
        });
    }

    /// Runs `work` once the caller has its answer, after the sandbox's earlier such work; the
    /// sandbox's destroy waits for all of it before removing its directory.
    pub(super) fn later(&self, id: &str, work: impl Future<Output = ()> + Send + 'static) {
        let mut live = self.live();
        let before = live.get_mut(id).and_then(|l| l.pending.take());
        let task = tokio::spawn(async move {
            if let Some(b) = before {
                let _ = b.await;
            }
            work.await;
        });
        if let Some(l) = live.get_mut(id) {
            l.pending = Some(task);
        }
    }

    /// Restores `image` into the (stopped) sandbox `inst` and records the new container: into
    /// its standby if it has one (see `standby`), else, or if that fails, into a new one.
    pub(super) async fn restore_into(
        &self,
        inst: &Instance<GvisorHandle>,
        image: &Path,
    ) -> Result<()> {
        let rules = self.live().get(&inst.id).and_then(|l| l.egress.clone());
        let launch = |start| {
            self.launch(
                &inst.id,
                &inst.dir,
                start,
                &inst.handle.cgroup,
                inst.handle.egress,
                rules.as_ref(),
            )
        };
        let launched = match self.take_standby(&inst.id) {
            Some(s) => match launch(Start::Into(image, Box::new(s))).await {
                Ok(l) => Ok(l),
                Err(e) => {
                    tracing::warn!(instance = %inst.id, error = %e, "restoring into the sandbox's standby failed; restoring into a new container");
                    launch(Start::Restore(image)).await
                }
            },
            None => launch(Start::Restore(image)).await,
        };
        let (container, holder) = launched?;
        if let Some(l) = self.live().get_mut(&inst.id) {
            l.container = Some(container);
            l.holder = holder;
            l.paused = false;
        }
        Ok(())
    }

    /// Captures `inst` into `dest` (the runtime's `capture_then`) and runs `meanwhile` beside
    /// it; with `meanwhile` (boots from `dest`) the image is announced as pending while it is
    /// written, so that those boots start ahead (see `pending`).
    pub(super) async fn capture_beside<T: Send>(
        &self,
        inst: &Instance<GvisorHandle>,
        paused: bool,
        dest: &Path,
        meanwhile: Option<impl Future<Output = T> + Send>,
    ) -> (Result<u64>, Option<T>) {
        let _busy = self.busy(&inst.id);
        match self.capturable(inst, paused, dest).await {
            Ok(Capture::Copied(size)) => return (Ok(size), OptionFuture::from(meanwhile).await),
            Ok(Capture::Checkpoint) => {}
            Err(e) => return (Err(e), None),
        }
        if !self.cfg.runsc.resumes_after_checkpoint {
            // This runsc stops what it checkpoints, and restores only into a new container;
            // the source continues from the very image, restored beside the copies.
            let size = self.checkpoint_to(inst, dest).await;
            let (restored, out) = if size.is_ok() {
                futures::future::join(self.restore_into(inst, dest), OptionFuture::from(meanwhile))
                    .await
            } else {
                (self.restore_into(inst, dest).await, None)
            };
            let result = size.and_then(|s| restored.map(|()| s));
            if result.is_err() {
                let _ = std::fs::remove_dir_all(dest);
            }
            return (result, out);
        }
        // The copies start now: each makes its container while the image is written and
        // reads the image once it is complete (see `pending`), where runsc can restore into
        // a made container.
        let writing = (meanwhile.is_some() && self.cfg.runsc.restores_into_created)
            .then(|| self.pending.announce(dest, &inst.handle.init_token));
        let capture = async {
            let door = Self::door_inode(&inst.dir);
            let size = self.checkpoint_running(inst, dest, door).await;
            if let Some(w) = writing {
                w.finish(size.is_ok());
            }
            // Its door reopens while the copies load.
            match size {
                Ok(size) => self
                    .wait_door(&inst.dir, door, self.cfg.boot_timeout)
                    .await
                    .map(|()| size),
                Err(e) => Err(e),
            }
        };
        let (result, out) = futures::future::join(capture, OptionFuture::from(meanwhile)).await;
        if result.is_err() {
            let _ = std::fs::remove_dir_all(dest);
        }
        (result, out)
    }
}
