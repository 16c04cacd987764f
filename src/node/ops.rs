//! The node's verbs: claim, branch from a checkpoint, release, renew, pause/resume, fork,
//! checkpoints and stats.

use std::time::Instant;

use chrono::{DateTime, Utc};

use super::metrics::ClaimOutcome;
use super::runtime::{Instance, Runtime};
use super::{ClaimSpec, Node, Origin, VerbLock};
use crate::model::CheckpointFilter;
use crate::model::{
    self, CheckpointRecord, Error, InventoryChange, Phase, PoolKey, Result, SandboxRecord,
    SandboxStats, ids,
};

impl<R: Runtime> Node<R> {
    /// Hands over a warm instance of `key` (nothing boots on that path). An empty pool
    /// cold-starts when the node allows it, else answers NoCapacity.
    /// Returns the record (with its token) and whether it came warm.
    pub async fn claim(&self, key: &PoolKey, spec: ClaimSpec) -> Result<(SandboxRecord, bool)> {
        let started = Instant::now();
        let claimed = self.claim_counted(key, spec).await;
        let outcome = match &claimed {
            Ok((_, true)) => ClaimOutcome::Warm,
            Ok((_, false)) => ClaimOutcome::Cold,
            Err(_) => ClaimOutcome::Failed,
        };
        // A failed claim may name any template; only pools the node has become a label, so
        // that made-up names cannot grow the metrics without bound.
        let pool = if outcome == ClaimOutcome::Failed && !self.state().pools.contains_key(key) {
            "other".to_string()
        } else {
            key.to_string()
        };
        self.metrics().claimed(&pool, outcome, started.elapsed());
        claimed
    }

    /// `claim`, before the metrics count it.
    async fn claim_counted(&self, key: &PoolKey, spec: ClaimSpec) -> Result<(SandboxRecord, bool)> {
        spec.validate()?;
        super::volumes::check(&spec.volume_mounts, self.inner.cfg.volumes_dir.as_deref())?;
        let egress = self.egress_for(key, &spec.network, spec.namespace())?;
        let template = 'pick: {
            let mut st = self.state();
            if st.closing {
                return Err(Error::unavailable(format!(
                    "node {:?} is shutting down",
                    self.name()
                )));
            }
            // A runtime that mounts volumes only at boot boots a sandbox that has them.
            let warm_fits =
                spec.volume_mounts.is_empty() || self.inner.runtime.mounts_volumes_live();
            if warm_fits && let Some(inst) = self.pop_live_warm(&mut st, key) {
                if egress.is_some() || !spec.volume_mounts.is_empty() {
                    // Counted as booting for a claim while its rules and volumes go in (see
                    // `adopt`).
                    st.booting_for_claims += 1;
                    break 'pick Err(inst);
                }
                let record = self.stamp(&inst, key, &spec, Origin::Pool);
                let record = self.insert_claim(&mut st, record, inst);
                drop(st);
                self.changed();
                self.inner.wake_refill.notify_one();
                return Ok((record, true));
            }
            if !self.inner.cfg.cold_start && warm_fits {
                return Err(Error::no_capacity(format!(
                    "node {:?} has no warm sandbox for {key} and does not cold-start",
                    self.name()
                )));
            }
            let template = self.template(&key.template)?;
            self.reserve(&mut st, 1)?;
            Ok(template)
        };
        let template = match template {
            Ok(t) => t,
            Err(warm) => {
                self.inner.wake_refill.notify_one();
                let equipped = self.with_egress(warm, egress.as_ref()).await;
                let equipped = self.with_volumes(equipped, &spec.volume_mounts).await;
                return Ok((self.adopt(equipped, key, &spec, Origin::Pool)?, true));
            }
        };
        let booted = self
            .boot_mounted(key, &template, None, egress.as_ref(), &spec.volume_mounts)
            .await;
        let record = self.adopt(booted, key, &spec, Origin::Pool)?;
        Ok((record, false))
    }

    /// The first warm instance of `key` that is still running; dead ones are cleaned up.
    fn pop_live_warm(
        &self,
        st: &mut super::State<R::Handle>,
        key: &PoolKey,
    ) -> Option<Instance<R::Handle>> {
        let pool = st.pools.get_mut(key)?;
        while let Some(inst) = pool.warm.pop_front() {
            if self.inner.runtime.is_alive(&inst) {
                return Some(inst);
            }
            tracing::warn!(instance = %inst.id, pool = %key, "a warm instance had died; discarding it");
            self.destroy_later(inst, "warm instance died");
        }
        None
    }

    /// Starts a fresh sandbox from a checkpoint: its own id, token and lease.
    pub async fn claim_checkpoint(
        &self,
        checkpoint_id: &str,
        spec: ClaimSpec,
    ) -> Result<SandboxRecord> {
        spec.validate()?;
        super::volumes::check(&spec.volume_mounts, self.inner.cfg.volumes_dir.as_deref())?;
        let ck = {
            let mut st = self.state();
            let ck = st.checkpoints.get(checkpoint_id).cloned().ok_or_else(|| {
                Error::not_found(format!(
                    "checkpoint {checkpoint_id:?} not found on node {:?}",
                    self.name()
                ))
            })?;
            self.reserve(&mut st, 1)?;
            ck
        };
        let template = match self.checkpoint_template(&ck) {
            Ok(t) => t,
            Err(e) => {
                self.state().booting_for_claims -= 1;
                return Err(e);
            }
        };
        let egress = match self.egress_for(&ck.key, &spec.network, spec.namespace()) {
            Ok(e) => e,
            Err(e) => {
                self.state().booting_for_claims -= 1;
                return Err(e);
            }
        };
        let seed = self.inner.paths.checkpoints.join(&ck.id);
        let booted = self
            .boot_mounted(
                &ck.key,
                &template,
                Some(&seed),
                egress.as_ref(),
                &spec.volume_mounts,
            )
            .await;
        self.adopt(booted, &ck.key, &spec, Origin::Checkpoint(ck.id))
    }

    /// The template a checkpoint's layer sits on, if it is still the same build.
    fn checkpoint_template(&self, ck: &CheckpointRecord) -> Result<crate::templates::Template> {
        let template = self.template(&ck.key.template)?;
        if !ck.template_id.is_empty() && ck.template_id != template.meta.id {
            return Err(Error::conflict(format!(
                "checkpoint {} was taken on an earlier build of template {:?}, which has been rebuilt since; its layer no longer fits",
                ck.id, ck.key.template
            )));
        }
        Ok(template)
    }

    /// Turns a booted instance (reserved with `reserve`) into a claim.
    fn adopt(
        &self,
        booted: Result<Instance<R::Handle>>,
        key: &PoolKey,
        spec: &ClaimSpec,
        origin: Origin,
    ) -> Result<SandboxRecord> {
        let mut st = self.state();
        st.booting_for_claims -= 1;
        let inst = booted?;
        if st.closing {
            drop(st);
            self.destroy_later(inst, "node closing");
            return Err(Error::unavailable(format!(
                "node {:?} is shutting down",
                self.name()
            )));
        }
        let record = self.stamp(&inst, key, spec, origin);
        let record = self.insert_claim(&mut st, record, inst);
        drop(st);
        self.changed();
        Ok(record)
    }

    /// The claim's verb lock and a copy of its instance.
    pub(super) fn claim_handle(&self, id: &str) -> Result<(VerbLock, Instance<R::Handle>)> {
        let st = self.state();
        match st.claims.get(id) {
            Some(c) => Ok((c.op.clone(), c.instance.clone())),
            None => Err(self.not_found(&st, id)),
        }
    }

    /// Takes a claim's verb lock, then reads its record and instance: what another verb did
    /// while this one waited is seen (a resume from disk boots a new instance and destroys
    /// the old one; a snapshot that had copied the old one beforehand froze a removed cgroup
    /// and answered 500, which the schema fuzzer found).
    pub(super) async fn lock_claim(
        &self,
        id: &str,
    ) -> Result<(
        tokio::sync::OwnedMutexGuard<()>,
        SandboxRecord,
        Instance<R::Handle>,
    )> {
        let (op, _) = self.claim_handle(id)?;
        let guard = op.lock_owned().await;
        let st = self.state();
        match st.claims.get(id) {
            Some(c) => Ok((guard, c.record.clone(), c.instance.clone())),
            None => Err(self.not_found(&st, id)),
        }
    }

    pub(super) fn record_of(&self, id: &str) -> Result<SandboxRecord> {
        self.get(id).map(|(r, _)| r)
    }

    /// Destroys a claimed sandbox: its processes and its state directory.
    pub async fn release(&self, id: &str) -> Result<()> {
        self.release_when(id, "released", |_| true)
            .await
            .map(|_| ())
    }

    /// Releases the sandbox if `still` holds for its record once its verb lock is held;
    /// answers whether it was released.
    pub(super) async fn release_when(
        &self,
        id: &str,
        why: &'static str,
        still: impl Fn(&SandboxRecord) -> bool,
    ) -> Result<bool> {
        let (op, _) = self.claim_handle(id)?;
        let _guard = op.lock_owned().await;
        let claim = {
            let mut st = self.state();
            match st.claims.get(id) {
                None => return Err(self.not_found(&st, id)),
                Some(c) if !still(&c.record) => return Ok(false),
                Some(_) => {}
            }
            let Some(c) = st.claims.remove(id) else {
                return Err(self.not_found(&st, id));
            };
            c.tunnels.cancel();
            st.remember_ended(&c.record, &c.instance.logs, why);
            st.emit(
                &self.inner.events,
                InventoryChange::Deleted(c.record.clone().without_token()),
            );
            c
        };
        tracing::info!(id, claim_ref = %claim.record.claim_ref, why, "sandbox released");
        self.changed();
        if claim.record.paused_on_disk() {
            // Its instance went at the pause; its files are all that is left.
            self.discard_saved_files(id);
        } else {
            self.destroy_later(claim.instance, why);
        }
        Ok(true)
    }

    /// Sets the deadline to `ttl_seconds` from now (0 = default, clamped to the maximum).
    /// A shorter deadline is applied only with `allow_shorter`; otherwise the current one stays.
    /// A paused sandbox has no running lease to renew (a conflict, as on e2b).
    pub fn renew(
        &self,
        id: &str,
        ttl_seconds: u64,
        allow_shorter: bool,
    ) -> Result<(DateTime<Utc>, bool)> {
        let wanted = self.inner.cfg.lease.deadline(Utc::now(), ttl_seconds);
        self.set_deadline(id, wanted, allow_shorter)
    }

    /// Ends the sandbox's lease now (e2b's `timeout: 0`): the reaper runs its on-timeout
    /// action (kill or pause) at once.
    pub fn expire(&self, id: &str) -> Result<(DateTime<Utc>, bool)> {
        self.set_deadline(id, Utc::now(), true)
    }

    fn set_deadline(
        &self,
        id: &str,
        wanted: DateTime<Utc>,
        allow_shorter: bool,
    ) -> Result<(DateTime<Utc>, bool)> {
        let mut st = self.state();
        let Some(c) = st.claims.get_mut(id) else {
            return Err(self.not_found(&st, id));
        };
        if c.record.phase == Phase::Paused {
            // Its lease does not run while it is paused; resuming grants it again.
            return Err(Error::conflict(format!(
                "sandbox {id} is paused: its lease starts again when it resumes"
            )));
        }
        if wanted < c.record.deadline && !allow_shorter {
            return Ok((c.record.deadline, false));
        }
        c.record.deadline = wanted;
        let record = c.record.clone().without_token();
        st.emit(&self.inner.events, InventoryChange::Modified(record));
        drop(st);
        self.changed();
        Ok((wanted, true))
    }

    /// Branches `count` children from the sandbox's current state, all or nothing. Children
    /// get their own leases from `ttl_seconds` and claim refs `prefix + child id`, in request
    /// order. The source keeps its state (a paused source stays paused).
    pub async fn fork(
        &self,
        id: &str,
        count: u32,
        ttl_seconds: u64,
        prefix: &str,
    ) -> Result<Vec<SandboxRecord>> {
        let limit = self.inner.cfg.fork_limit;
        if count < 1 || count > limit {
            return Err(Error::invalid(format!(
                "fork count {count} not in 1..{limit}"
            )));
        }
        let child_ref_len = prefix.len() + ids::new_claim_id().len();
        if child_ref_len > model::sandbox::MAX_CLAIM_REF {
            return Err(Error::invalid(format!(
                "claim ref prefix is {} characters; with a child id it must fit in {}",
                prefix.len(),
                model::sandbox::MAX_CLAIM_REF
            )));
        }
        let (_guard, parent, inst) = self.lock_claim(id).await?;
        refuse_on_disk(&parent, "forked")?;
        let template = self.template(&parent.key.template)?;
        // Children keep their parent's policy, in force before their first instruction.
        let egress = self.egress_for(&parent.key, &parent.network, parent.namespace())?;
        self.reserve(&mut self.state(), count)?;
        let scratch = self.inner.paths.scratch.join(ids::new_instance_id());
        // The children boot from the capture while the runtime brings the parent back.
        let boots = futures::future::join_all(
            (0..count).map(|_| self.boot(&parent.key, &template, Some(&scratch), egress.as_ref())),
        );
        let (captured, booted) = self
            .inner
            .runtime
            .capture_then(&inst, parent.phase == Phase::Paused, &scratch, boots)
            .await;
        let mut booted: Vec<Result<Instance<R::Handle>>> = booted.unwrap_or_default();
        if let Err(e) = captured {
            // Children that started from it go with the failure below, which names the
            // capture's (theirs only says it failed).
            booted.insert(0, Err(e));
        }
        let _ = tokio::fs::remove_dir_all(&scratch).await;

        let mut st = self.state();
        st.booting_for_claims -= count;
        let failure = booted.iter().find_map(|b| b.as_ref().err().cloned());
        let failure = failure.or_else(|| {
            st.closing
                .then(|| Error::unavailable(format!("node {:?} is shutting down", self.name())))
        });
        if let Some(err) = failure {
            drop(st);
            for inst in booted.into_iter().flatten() {
                self.destroy_later(inst, "fork failed");
            }
            return Err(err.context(format!("fork of {id}")));
        }
        let spec = ClaimSpec {
            ttl_seconds,
            claim_ref: String::new(),
            metadata: parent.metadata.clone(),
            env_vars: parent.env_vars.clone(),
            lifecycle: parent.lifecycle,
            network: parent.network.clone(),
            // A child is a copy of the parent's own disk; volumes are the tenant's, mounted
            // where a create asks for them.
            volume_mounts: Vec::new(),
        };
        let mut children = Vec::with_capacity(count as usize);
        for inst in booted.into_iter().flatten() {
            let origin = Origin::Fork {
                parent: parent.id.clone(),
                prefix: prefix.to_string(),
            };
            let record = self.stamp(&inst, &parent.key, &spec, origin);
            children.push(self.insert_claim(&mut st, record, inst));
        }
        drop(st);
        self.changed();
        Ok(children)
    }

    /// Copies the sandbox's state into a checkpoint (cost grows with the state's size).
    /// `memory`: the checkpoint must hold the sandbox's memory (refused where the runtime
    /// cannot capture it for the sandbox's net).
    pub async fn create_checkpoint(
        &self,
        id: &str,
        name: &str,
        memory: bool,
    ) -> Result<CheckpointRecord> {
        if !name.is_empty() {
            model::validate_checkpoint_name(name)?;
        }
        let (_guard, source, inst) = self.lock_claim(id).await?;
        refuse_on_disk(&source, "snapshotted")?;
        if memory && !self.inner.runtime.captures_memory(&source.key.net) {
            return Err(Error::invalid(format!(
                "memory snapshots are not available for sandbox {id}: the {} runtime captures {} (a snapshot holds the sandbox's files); omit memory or set it to false",
                self.inner.runtime.name(),
                if ["none", "egress"]
                    .iter()
                    .any(|n| self.inner.runtime.captures_memory(n))
                {
                    "memory only for sandboxes without internet access"
                } else {
                    "no memory"
                }
            )));
        }
        if self.state().closing {
            return Err(Error::unavailable(format!(
                "node {:?} is shutting down",
                self.name()
            )));
        }
        let budget = self.inner.cfg.checkpoint_budget_bytes;
        let over_budget = |used: u64| {
            Error::conflict(format!(
                "node {:?} has no room for this snapshot: its checkpoints may take {} MiB and take {} MiB; delete snapshots first",
                self.name(),
                budget >> 20,
                used >> 20
            ))
        };
        let used = self.checkpoint_bytes();
        if used >= budget {
            return Err(over_budget(used));
        }
        let ck_id = ids::new_checkpoint_id();
        let dest = self.inner.paths.checkpoints.join(&ck_id);
        let size = match self
            .inner
            .runtime
            .capture(&inst, source.phase == Phase::Paused, &dest)
            .await
        {
            Ok(size) => size,
            Err(e) => {
                // Runtimes remove a failed capture themselves; this makes sure no partial
                // image (a full disk's, typically) outlives the answer under checkpoints/.
                let _ = tokio::fs::remove_dir_all(&dest).await;
                tracing::warn!(id, checkpoint = %ck_id, error = %e, "snapshot failed; nothing was kept");
                return Err(e);
            }
        };
        if used + size > budget {
            let _ = tokio::fs::remove_dir_all(&dest).await;
            return Err(over_budget(used + size));
        }
        let template_id = self
            .template(&source.key.template)
            .map(|t| t.meta.id)
            .unwrap_or_default();
        let record = CheckpointRecord {
            id: ck_id,
            name: name.to_string(),
            sandbox_id: source.id,
            key: source.key,
            created_at: Utc::now(),
            size_bytes: size,
            node: self.name().to_string(),
            template_id,
        };
        // Listed only once the index on disk holds it: a record that could not be written
        // (a full disk) is never seen, and its data goes with it.
        if let Err(e) = self.persist_with(Some(record.clone())).await {
            let _ = tokio::fs::remove_dir_all(&dest).await;
            return Err(e.context("recording the checkpoint"));
        }
        Ok(record)
    }

    /// Bytes the node's checkpoints take together.
    fn checkpoint_bytes(&self) -> u64 {
        self.state()
            .checkpoints
            .values()
            .map(|c| c.size_bytes)
            .sum()
    }

    /// Checkpoints, newest first.
    pub fn list_checkpoints(&self, filter: &CheckpointFilter) -> Vec<CheckpointRecord> {
        let st = self.state();
        let (name_prefix, sandbox_id, id) = (&filter.name_prefix, &filter.sandbox_id, &filter.id);
        let mut out: Vec<CheckpointRecord> = st
            .checkpoints
            .values()
            .filter(|c| id.is_empty() || &c.id == id)
            .filter(|c| c.name.starts_with(name_prefix.as_str()))
            .filter(|c| sandbox_id.is_empty() || &c.sandbox_id == sandbox_id)
            .cloned()
            .collect();
        out.sort_by(|a, b| {
            b.created_at
                .cmp(&a.created_at)
                .then_with(|| b.id.cmp(&a.id))
        });
        out
    }

    pub async fn delete_checkpoint(&self, id: &str) -> Result<()> {
        let removed = self.state().checkpoints.remove(id);
        if removed.is_none() {
            return Err(Error::not_found(format!(
                "checkpoint {id:?} not found on node {:?}",
                self.name()
            )));
        }
        let persisted = self.persist_now().await;
        let dir = self.inner.paths.checkpoints.join(id);
        let removed = tokio::fs::remove_dir_all(&dir)
            .await
            .or_else(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .map_err(|e| Error::io(format!("removing {}", dir.display()), e));
        if let Err(e) = persisted {
            // Deleting is how space is freed on a full disk, so it must not depend on the
            // index write. The data is gone now; an older index that still names the
            // checkpoint is corrected on load (records without data are dropped), and the
            // write is retried with the space just freed.
            tracing::warn!(checkpoint = id, error = %e, "writing the index before removing a checkpoint failed; removing its data anyway");
            removed?;
            if let Err(e) = self.persist_now().await {
                tracing::warn!(checkpoint = id, error = %e, "the index still names a removed checkpoint until its next write");
            }
            return Ok(());
        }
        removed
    }

    /// Measured use of one sandbox: CPU since the previous call (or since the claim), its
    /// memory and its disk as the runtime measures them.
    /// Entries of the sandbox's log ring.
    /// The sandbox's log entries that `query` asks for, and its claim ref; a sandbox that
    /// ended lately still has its log (see `ENDED_LOGS`).
    pub fn logs(
        &self,
        id: &str,
        query: &model::logs::LogQuery,
    ) -> Result<(String, Vec<model::logs::LogEntry>)> {
        let st = self.state();
        if let Some(c) = st.claims.get(id) {
            return Ok((c.record.claim_ref.clone(), c.instance.logs.query(query)));
        }
        match st.ended_logs(id) {
            Some((claim_ref, logs)) => Ok((claim_ref.to_string(), logs.query(query))),
            None => Err(self.not_found(&st, id)),
        }
    }

    /// Adds a line of the node's own to the sandbox's log.
    pub(super) fn note(&self, id: &str, level: model::logs::LogLevel, message: impl Into<String>) {
        if let Some(c) = self.state().claims.get(id) {
            c.instance.logs.note(level, message);
        }
    }

    pub async fn stats(&self, id: &str) -> Result<SandboxStats> {
        let (_, inst) = self.claim_handle(id)?;
        let usage = if self.record_of(id)?.paused_on_disk() {
            // Nothing of it runs: it uses no CPU or memory.
            super::runtime::Usage::default()
        } else {
            self.inner.runtime.usage(&inst).await?
        };
        let (disk_used, disk_total) = (usage.disk_used, usage.disk_total);
        let now = Instant::now();
        let mut st = self.state();
        let Some(c) = st.claims.get_mut(id) else {
            return Err(self.not_found(&st, id));
        };
        let (since, cpu_before) = c.last_cpu.unwrap_or_else(|| {
            let age = (Utc::now() - c.record.claimed_at)
                .to_std()
                .unwrap_or_default();
            (now.checked_sub(age).unwrap_or(now), 0)
        });
        c.last_cpu = Some((now, usage.cpu_ns));
        let elapsed = now.duration_since(since).as_nanos().max(1) as f64;
        let used = usage.cpu_ns.saturating_sub(cpu_before) as f64;
        Ok(SandboxStats {
            id: id.to_string(),
            cpu_count: c.record.cpu_count,
            cpu_used_pct: (used / elapsed * 100.0).min(100.0 * c.record.cpu_count as f64),
            mem_used_bytes: usage.mem_bytes,
            mem_total_bytes: c.record.memory_bytes,
            mem_used_measured: usage.measured,
            disk_used_bytes: disk_used,
            disk_total_bytes: disk_total,
            measured_at: Utc::now(),
            phase: c.record.phase,
            process_count: usage.processes,
        })
    }
}

/// A sandbox paused on disk has no instance to capture from.
fn refuse_on_disk(r: &SandboxRecord, verb: &str) -> Result<()> {
    if r.paused_on_disk() {
        return Err(Error::conflict(format!(
            "sandbox {} is paused without its memory (filesystem-only) and cannot be {verb}; resume it first",
            r.id
        )));
    }
    Ok(())
}
