//! Runs a build in sandboxes of this node, e2b's phases in order: the base (the template it
//! is built from), the default user, each step, finalize. Every phase that writes runs in a
//! sandbox of its own booted on the layers so far, and what it wrote becomes a layer; the
//! team's cache remembers each phase's layer by the chain of keys before it, so an unchanged
//! step is not run again. The result is installed as a template of layers over its parent's
//! root, so it costs what its steps wrote.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::records::{BuildRecord, Cached};
use super::{Live, LogLevel};
use crate::model::builds::{BuildReason, BuildSpec};
use crate::model::{Error, PoolKey, Result, pool::SIZES};
use crate::node::Node;
use crate::node::agent_client::{AgentClient, Command, Exit, Stream};
use crate::node::runtime::{Instance, Runtime};
use crate::sandbox::spec::ENVD_PORT;
use crate::templates::build::steps::{self, Context, Phase};
use crate::templates::built::E2bIdentity;
use crate::templates::{Kind, Template};

/// What a sandbox writes that is not part of what it made: scratch (upstream's /tmp is a
/// tmpfs, COPY's archives go there), run-time state, the mount points of its kernel file
/// systems, and the names written at every boot.
const SKIP: &[&str] = &[
    "tmp",
    "run",
    "dev",
    "proc",
    "sys",
    "etc/hostname",
    "etc/hosts",
    "etc/resolv.conf",
];
/// Most layers a template may stack (the kernel allows 500; lookups slow with depth).
const MAX_LAYERS: usize = 120;
/// How long a template's ready command may take to succeed.
const READY_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest line of a command's output kept in the log.
const MAX_LINE: usize = 8192;

/// `alias[:tag]`, the tag `default` when none is named.
fn split_tag(name: &str) -> (String, String) {
    match name.split_once(':') {
        Some((a, t)) => (a.to_string(), t.to_string()),
        None => (name.to_string(), "default".to_string()),
    }
}

/// A failed phase: why, and which builder call it points at.
fn fail(step: &str, message: impl Into<String>) -> BuildReason {
    BuildReason {
        message: message.into(),
        step: Some(step.to_string()),
    }
}

/// The build in progress.
struct Job<'a, R: Runtime> {
    node: &'a Node<R>,
    rec: &'a BuildRecord,
    parent: Template,
    key: PoolKey,
    /// Layers so far, top first, over `parent.root`.
    layers: Vec<String>,
    ctx: Context,
    /// Whether this phase and every later one run again, cached or not.
    forced: bool,
    /// How many steps the build has.
    total: usize,
    /// The cache entries it used, marked used once it ends (one write, however it ends).
    hits: Vec<String>,
}

impl<R: Runtime> Drop for Job<'_, R> {
    fn drop(&mut self) {
        self.node.builds().touch(&self.rec.team, &self.hits);
    }
}

impl<R: Runtime> Node<R> {
    pub(super) async fn run_build(
        &self,
        rec: &BuildRecord,
        spec: &BuildSpec,
        live: &Live,
    ) -> std::result::Result<String, BuildReason> {
        let began = Instant::now();
        let b = self.builds();
        b.log(
            &rec.build_id,
            LogLevel::Info,
            None,
            format!("Building template {}/{}", rec.template_id, rec.build_id),
        );
        let outcome = tokio::select! {
            o = self.build_phases(rec, spec) => o,
            _ = live.cancel.cancelled() => Err(BuildReason {
                message: if self.shutdown_token().is_cancelled() {
                    "interrupted: the node stopped during the build; run it again".into()
                } else {
                    "build was cancelled".into()
                },
                step: None,
            }),
        };
        match &outcome {
            Ok(_) => b.log(
                &rec.build_id,
                LogLevel::Info,
                None,
                format!("Build finished, took {:.0}s", began.elapsed().as_secs_f64()),
            ),
            Err(r) => b.log(
                &rec.build_id,
                LogLevel::Error,
                None,
                format!("Build failed: {}", r.message),
            ),
        }
        outcome
    }

    /// The template a build starts from, as the team names it: its own (`alias[:tag]` or
    /// template id), another team's public one, or one of the node's own (`base`).
    fn resolve_parent(&self, team: &str, name: &str) -> Result<Template> {
        let name = name.trim().to_ascii_lowercase();
        if let Some(t) = self.resolve_built(team, &name)? {
            return Ok(t);
        }
        let (alias, tag) = split_tag(&name);
        self.templates()
            .into_iter()
            .filter(|t| t.meta.e2b.is_none())
            .find(|t| tag == "default" && (t.meta.name == alias || t.meta.aliases.contains(&alias)))
            .ok_or_else(|| Error::not_found(format!("template '{name}' not found")))
    }

    /// The built template `name` (`alias[:tag]` or template id, lowercase) means for `team`:
    /// its own, else another team's public one; None when no team has one by that name.
    pub(crate) fn resolve_built(&self, team: &str, name: &str) -> Result<Option<Template>> {
        let (alias, tag) = split_tag(name);
        let records = &self.builds().records;
        let found = records
            .templates()
            .into_iter()
            .filter(|t| t.alias == alias || t.template_id == alias)
            .filter(|t| t.team == team || t.public)
            .min_by_key(|t| t.team != team);
        let Some(t) = found else {
            return Ok(None);
        };
        let build = t.tags.get(&tag).ok_or_else(|| {
            Error::not_found(format!("template '{name}' has no ready build tagged {tag}"))
        })?;
        self.template(&super::records::store_name(&t.template_id, &build.build_id))
            .map(Some)
    }

    async fn build_phases(
        &self,
        rec: &BuildRecord,
        spec: &BuildSpec,
    ) -> std::result::Result<String, BuildReason> {
        let base = |m: String| fail("base", m);
        if !self.inner.runtime.commits() {
            return Err(base(
                "this node cannot build templates (its startup log says why); build on another node".into(),
            ));
        }
        let (parent, root, ctx, mut chain, from) = match (&spec.from_template, &spec.from_image) {
            (Some(_), Some(_)) => {
                return Err(base(
                    "cannot specify both fromImage and fromTemplate".into(),
                ));
            }
            (None, None) => {
                return Err(base("must specify either fromImage or fromTemplate".into()));
            }
            (None, Some(image)) => {
                let image = image.trim();
                let (parent, root, ctx, chain) = self.image_base(rec, spec, image).await?;
                (parent, root, ctx, chain, format!("image {image}"))
            }
            (Some(from), None) => {
                let parent = self
                    .resolve_parent(&rec.team, from)
                    .map_err(|e| base(format!("error getting base template: {}", e.message)))?;
                if parent.meta.root_kind != crate::sandbox::spec::RootKind::Complete {
                    return Err(base(format!(
                        "template {from} is composed from the host's /usr and cannot be built on; build the Debian base first (`sandbox-gateway template build base --force`)"
                    )));
                }
                let root = self
                    .inner
                    .templates
                    .root_layer(&parent)
                    .map_err(|e| base(e.message))?;
                let ctx = Context {
                    user: parent.meta.user.clone().unwrap_or_else(|| "user".into()),
                    workdir: parent.meta.workdir.clone(),
                    env: parent.meta.env.clone(),
                };
                let chain =
                    steps::chain("v1", &[&rec.team, &format!("template:{}", parent.meta.id)]);
                self.builds().log(
                    &rec.build_id,
                    LogLevel::Info,
                    Some("base"),
                    format!("[base] FROM TEMPLATE {from} [{}]", &chain[..12]),
                );
                (parent, root, ctx, chain, format!("template {from}"))
            }
        };
        // The smallest size that fits what the build asked for.
        let tier = SIZES
            .iter()
            .find(|t| t.cpu_count >= rec.cpu_count && t.memory_bytes >= rec.memory_mb * 1024 * 1024)
            .or(SIZES.last())
            .map_or("small", |t| t.name);
        let net = self.default_net();
        let key = PoolKey::new(&parent.meta.name, net, tier).map_err(|e| base(e.message))?;
        let mut job = Job {
            node: self,
            rec,
            layers: parent.meta.layers.clone(),
            ctx,
            parent,
            key,
            forced: spec.force,
            total: spec.steps.len(),
            hits: Vec::new(),
        };

        // The default user, with passwordless sudo.
        chain = steps::chain(&chain, &["DEFAULT USER", "user"]);
        let user_phase = Phase::User {
            name: "user".into(),
            admin: true,
        };
        job.phase("base", "DEFAULT USER user", &chain, &user_phase)
            .await?;

        let total = spec.steps.len();
        for (i, step) in spec.steps.iter().enumerate() {
            let label = (i + 1).to_string();
            let phase = steps::phase_of(step).map_err(|e| fail(&label, e.message))?;
            chain = steps::step_key(&chain, step);
            if step.force {
                job.forced = true;
            }
            let what = format!("[builder {}/{total}] {}", i + 1, steps::describe(step));
            job.phase(&label, &what, &chain, &phase).await?;
        }

        // Finalize: the configuration every template gets, then the start and ready
        // commands proven once.
        job.forced = true;
        let configure = Phase::Run {
            cmd: steps::finalize_script(&rec.template_id, &rec.build_id),
            user: Some("root".into()),
        };
        job.log(
            Some("finalize"),
            "[finalize] Finalizing template build".into(),
        );
        job.execute("finalize", &configure).await?;
        let start_cmd = spec.start_cmd.clone().or(job.parent.meta.start_cmd.clone());
        let ready_cmd = spec.ready_cmd.clone().or(if spec.start_cmd.is_some() {
            None
        } else {
            job.parent.meta.ready_cmd.clone()
        });
        let mut meta = job.parent.meta.clone();
        meta.name = super::records::store_name(&rec.template_id, &rec.build_id);
        meta.id = crate::model::ids::random_hex(8);
        meta.kind = Kind::Built;
        meta.created_at = chrono::Utc::now();
        meta.source = format!("e2b build {} of {from}", rec.build_id);
        meta.aliases = Vec::new();
        meta.recipe = None;
        meta.size = Some(tier.to_string());
        meta.env = job.ctx.env.clone();
        meta.workdir = job.ctx.workdir.clone();
        meta.user = Some(job.ctx.user.clone());
        meta.start_cmd = start_cmd.clone();
        meta.ready_cmd = ready_cmd.clone();
        meta.layers = job.layers.clone();
        meta.size_bytes = job.layer_bytes(&job.parent.meta.layers);
        meta.e2b = Some(E2bIdentity {
            team: rec.team.clone(),
            template_id: rec.template_id.clone(),
            build_id: rec.build_id.clone(),
        });
        if start_cmd.is_some() || ready_cmd.is_some() {
            job.verify_start(&meta, start_cmd.as_deref(), ready_cmd.as_deref())
                .await?;
        }
        let installed = self
            .inner
            .templates
            .install_built(&meta, &root)
            .map_err(|e| fail("finalize", e.message))?;
        // Whatever the runtime does before a template's first boot is done now, inside the
        // build's time, not inside the first claim's deadline.
        if let Err(e) = self.inner.runtime.prepare_template(&installed).await {
            self.inner.templates.remove_built(&meta.name);
            return Err(fail("finalize", e.message));
        }
        Ok(meta.name)
    }

    /// A sandbox of `t` with its services off (a build runs only its own commands), counted
    /// against the node's limit while it lives.
    async fn build_instance(&self, t: &Template, key: &PoolKey) -> Result<Slot<R>> {
        {
            let mut st = self.state();
            self.reserve(&mut st, 1)?;
        }
        let mut quiet = t.clone();
        quiet.meta.services.clear();
        quiet.meta.start_cmd = None;
        quiet.meta.ready_cmd = None;
        match self.boot_as(key, &quiet, None, None, true, &[]).await {
            Ok(inst) => Ok(Slot {
                node: self.clone(),
                inst: Some(inst),
            }),
            Err(e) => {
                self.state().booting_for_claims -= 1;
                Err(e)
            }
        }
    }

    /// A client of the instance's agent.
    pub(crate) fn agent(&self, inst: &Instance<R::Handle>) -> AgentClient {
        let node = self.clone();
        let inst = inst.clone();
        AgentClient::new(Arc::new(move || {
            let node = node.clone();
            let inst = inst.clone();
            Box::pin(async move { node.inner.runtime.dial(&inst, ENVD_PORT).await })
        }))
    }

    /// Starts a template's start command in `inst` and waits until its ready command
    /// succeeds (at once when it has none).
    pub(crate) async fn start_command(
        &self,
        inst: &Instance<R::Handle>,
        t: &Template,
        timeout: Duration,
        mut out: impl FnMut(&str) + Send,
    ) -> Result<()> {
        let agent = self.agent(inst);
        let user = t.meta.user.clone().unwrap_or_else(|| "user".into());
        let env = steps::command_env(&Context {
            user: user.clone(),
            workdir: t.meta.workdir.clone(),
            env: t.meta.env.clone(),
        });
        let cwd = t.meta.workdir.as_deref();
        let mut started = None;
        if let Some(start) = &t.meta.start_cmd {
            out(&format!("Running start command: {start}"));
            started = Some(
                agent
                    .spawn(&Command {
                        cmd: start,
                        user: &user,
                        cwd,
                        env: &env,
                        timeout: Duration::from_secs(0),
                    })
                    .await?,
            );
        }
        let Some(ready) = &t.meta.ready_cmd else {
            return Ok(());
        };
        out(&format!("Waiting for template to be ready: {ready}"));
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(50);
        loop {
            let exit = agent
                .run(
                    &Command {
                        cmd: ready,
                        user: &user,
                        cwd,
                        env: &env,
                        timeout: Duration::from_secs(60),
                    },
                    |_, _| {},
                )
                .await?;
            if exit.code == 0 {
                out("Template is ready");
                return Ok(());
            }
            // A start command that failed will not become ready (one that ended well may
            // have started something that will).
            if let Some(end) = started.as_mut().and_then(|s| s.ended())
                && end.code != 0
            {
                return Err(Error::invalid(format!(
                    "the start command failed: {}",
                    exit_status(&end)
                )));
            }
            if Instant::now() >= deadline {
                return Err(Error::unavailable(format!(
                    "ready command timed out after {}s",
                    timeout.as_secs()
                )));
            }
            // Often at first (a server is up within a moment), then every second.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }
}

/// A build's instance: destroyed, and its place given back, when dropped.
struct Slot<R: Runtime> {
    node: Node<R>,
    inst: Option<Instance<R::Handle>>,
}

impl<R: Runtime> Slot<R> {
    fn inst(&self) -> Result<&Instance<R::Handle>> {
        self.inst
            .as_ref()
            .ok_or_else(|| Error::internal("the build's instance is gone"))
    }
}

impl<R: Runtime> Drop for Slot<R> {
    fn drop(&mut self) {
        self.node.state().booting_for_claims -= 1;
        if let Some(inst) = self.inst.take() {
            self.node.destroy_later(inst, "a build phase ended");
        }
    }
}

impl<R: Runtime> Job<'_, R> {
    fn log(&self, step: Option<&str>, message: String) {
        self.node
            .builds()
            .log(&self.rec.build_id, LogLevel::Info, step, message);
    }

    /// The template as it stands after the layers so far.
    fn current(&self) -> Template {
        let mut t = self.parent.clone();
        let store = &self.node.inner.templates;
        t.layers = self.layers.iter().map(|id| store.layer_path(id)).collect();
        t.meta.layers = self.layers.clone();
        t
    }

    /// What the layers above `below` hold.
    fn layer_bytes(&self, below: &[String]) -> u64 {
        let store = &self.node.inner.templates;
        self.layers
            .iter()
            .filter(|l| !below.contains(l))
            .map(|l| crate::fsx::tree_disk_usage(&store.layer_path(l)).unwrap_or(0))
            .sum()
    }

    /// One phase: from the team's cache when it ran before on the same chain (and nothing
    /// forces it), otherwise run, and remembered.
    async fn phase(
        &mut self,
        label: &str,
        what: &str,
        key: &str,
        phase: &Phase,
    ) -> std::result::Result<(), BuildReason> {
        let b = self.node.builds();
        let store = &self.node.inner.templates;
        let short = &key[..12];
        if !self.forced
            && let Some(hit) = b.records.cached(&self.rec.team, key)
            && hit
                .layer
                .as_ref()
                .is_none_or(|l| store.layer_path(l).is_dir())
        {
            self.log(Some(label), format!("CACHED {what} [{short}]"));
            self.hits.push(key.to_string());
            self.layers.splice(0..0, hit.layer);
            self.ctx = hit.context;
            return Ok(());
        }
        self.log(Some(label), format!("{what} [{short}]"));
        let layer = self.execute(label, phase).await?;
        let _w = b.write_lock();
        if let Err(e) = b.records.cache(
            &self.rec.team,
            key,
            Cached {
                layer,
                context: self.ctx.clone(),
                used_at: Some(chrono::Utc::now()),
            },
        ) {
            tracing::warn!(build = %self.rec.build_id, error = %e, "could not cache a phase");
        }
        Ok(())
    }

    /// Runs a phase in a sandbox of its own (ENV needs none) and keeps what it wrote as a
    /// layer; answers the layer's id (None when it wrote nothing).
    async fn execute(
        &mut self,
        label: &str,
        phase: &Phase,
    ) -> std::result::Result<Option<String>, BuildReason> {
        let err = |e: Error| fail(label, e.message);
        if let Phase::Env(pairs) = phase
            && !pairs.iter().any(|(_, v)| steps::needs_expansion(v))
        {
            self.ctx.env.extend(pairs.iter().cloned());
            return Ok(None);
        }
        if self.layers.len() + 1 > MAX_LAYERS {
            return Err(fail(
                label,
                format!(
                    "the template would stack more than {MAX_LAYERS} layers; build from its parent with fewer steps"
                ),
            ));
        }
        let slot = self
            .node
            .build_instance(&self.current(), &self.key)
            .await
            .map_err(err)?;
        let inst = slot.inst().map_err(err)?;
        let root = "root".to_string();
        match phase {
            Phase::Env(pairs) => {
                // As upstream: expanded against a root login shell's environment (not the
                // earlier ENV values), so a sandbox is needed; it writes nothing.
                let out = self.script(inst, label, "env -0", &root).await?;
                let login = steps::parse_env0(out.as_bytes());
                self.ctx.env.extend(
                    pairs
                        .iter()
                        .map(|(k, v)| (k.clone(), steps::expand(v, &login))),
                );
                return Ok(None);
            }
            Phase::Run { cmd, user } => {
                let user = user.clone().unwrap_or_else(|| self.ctx.user.clone());
                let exit = self.command(inst, label, cmd, &user, true).await?;
                if exit.code != 0 {
                    let full = self.disk_full(inst).await.unwrap_or_default();
                    return Err(fail(
                        label,
                        format!(
                            "failed to run command '{cmd}': {}{full}",
                            exit_status(&exit)
                        ),
                    ));
                }
            }
            Phase::User { name, admin } => {
                self.script(inst, label, &steps::user_script(name, *admin), &root)
                    .await?;
                self.ctx.user = name.clone();
            }
            Phase::Workdir(path) => {
                let out = self
                    .script(
                        inst,
                        label,
                        &steps::workdir_script(path, self.ctx.workdir.as_deref(), &self.ctx.user),
                        &root,
                    )
                    .await?;
                let dir = out.lines().last().unwrap_or("").trim().to_string();
                if !dir.starts_with('/') {
                    return Err(fail(label, format!("could not make the directory {path}")));
                }
                self.ctx.workdir = Some(dir);
            }
            Phase::Copy {
                src,
                dest,
                owner,
                mode,
                hash,
            } => {
                let files = self.node.builds().records.files_path(&self.rec.team, hash);
                super::Builds::touch_upload(&files);
                if !files.is_file() {
                    return Err(fail(
                        label,
                        format!("the files of COPY {src} were not uploaded (hash {hash})"),
                    ));
                }
                let archive = format!("{}/{hash}", steps::SCRATCH);
                self.node
                    .agent(inst)
                    .write_file(&archive, "root", &files)
                    .await
                    .map_err(err)?;
                let home = if self.ctx.user == "root" {
                    "/root".to_string()
                } else {
                    format!("/home/{}", self.ctx.user)
                };
                let workdir = self.ctx.workdir.clone().unwrap_or(home);
                let owner = owner.clone().unwrap_or_else(|| self.ctx.user.clone());
                let script =
                    steps::copy_script(&archive, src, dest, &owner, mode.as_deref(), &workdir);
                self.script(inst, label, &script, &root).await?;
            }
        }
        let store = &self.node.inner.templates;
        let (id, staging) = store.new_layer_path().map_err(err)?;
        let committed = self.node.inner.runtime.commit(inst, &staging, SKIP).await;
        drop(slot);
        match committed {
            Ok(Some(_)) => {
                store.adopt_layer(&id, &staging).map_err(err)?;
                self.layers.insert(0, id.clone());
                Ok(Some(id))
            }
            Ok(None) => Ok(None),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&staging);
                Err(err(e))
            }
        }
    }

    /// Says so when the build's disk is (nearly) full: the likely reason a step failed.
    async fn disk_full(&self, inst: &Instance<R::Handle>) -> Option<String> {
        let u = self.node.inner.runtime.usage(inst).await.ok()?;
        (u.disk_total > 0 && u.disk_used.saturating_mul(100) >= u.disk_total.saturating_mul(95))
            .then(|| {
                format!(
                    " (the build's disk is full: {} of {} MiB used)",
                    u.disk_used >> 20,
                    u.disk_total >> 20
                )
            })
    }

    /// Runs a script of ours as `user`, failing the phase when it fails; answers its stdout.
    async fn script(
        &self,
        inst: &Instance<R::Handle>,
        label: &str,
        script: &str,
        user: &str,
    ) -> std::result::Result<String, BuildReason> {
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let exit = self
            .node
            .agent(inst)
            .run(
                &Command {
                    cmd: script,
                    user,
                    cwd: Some("/"),
                    env: &BTreeMap::new(),
                    timeout: Duration::from_secs(steps::STEP_TIMEOUT_SECS),
                },
                |s, b| match s {
                    Stream::Stdout => stdout.extend_from_slice(b),
                    Stream::Stderr => stderr.extend_from_slice(b),
                },
            )
            .await
            .map_err(|e| fail(label, e.message))?;
        if exit.code != 0 {
            let why = String::from_utf8_lossy(&stderr).trim().to_string();
            return Err(fail(label, format!("{why} ({})", exit_status(&exit))));
        }
        Ok(String::from_utf8_lossy(&stdout).to_string())
    }

    /// Runs a user's command in the context, its output going to the log line by line.
    async fn command(
        &self,
        inst: &Instance<R::Handle>,
        label: &str,
        cmd: &str,
        user: &str,
        show: bool,
    ) -> std::result::Result<Exit, BuildReason> {
        let b = self.node.builds();
        let prefix = if label == "finalize" {
            "finalize".to_string()
        } else {
            format!("builder {label}/{}", self.total)
        };
        let mut pending: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
        let env = steps::command_env(&self.ctx);
        let emit = |s: usize, line: &[u8]| {
            if !show {
                return;
            }
            let name = if s == 0 { "stdout" } else { "stderr" };
            let text = String::from_utf8_lossy(&line[..line.len().min(MAX_LINE)]).to_string();
            b.log(
                &self.rec.build_id,
                LogLevel::Info,
                Some(label),
                format!("[{prefix}] [{name}]: {}", text.trim_end_matches('\r')),
            );
        };
        let exit = self
            .node
            .agent(inst)
            .run(
                &Command {
                    cmd,
                    user,
                    cwd: self.ctx.workdir.as_deref(),
                    env: &env,
                    timeout: Duration::from_secs(steps::STEP_TIMEOUT_SECS),
                },
                |s, bytes| {
                    let i = usize::from(s == Stream::Stderr);
                    pending[i].extend_from_slice(bytes);
                    while let Some(n) = pending[i].iter().position(|&c| c == b'\n') {
                        let line: Vec<u8> = pending[i].drain(..=n).collect();
                        emit(i, &line[..line.len() - 1]);
                    }
                },
            )
            .await
            .map_err(|e| {
                fail(
                    label,
                    format!("failed to run command '{cmd}': {}", e.message),
                )
            })?;
        for (i, rest) in pending.iter().enumerate() {
            if !rest.is_empty() {
                emit(i, rest);
            }
        }
        Ok(exit)
    }

    /// Proves the start and ready commands on a sandbox of the finished layers.
    async fn verify_start(
        &self,
        meta: &crate::templates::TemplateMeta,
        start: Option<&str>,
        ready: Option<&str>,
    ) -> std::result::Result<(), BuildReason> {
        let mut t = self.current();
        t.meta = meta.clone();
        // As upstream: without a ready command, give a start command 20 s.
        if start.is_some() && ready.is_none() {
            t.meta.ready_cmd = Some("sleep 20".into());
        }
        let slot = self
            .node
            .build_instance(&t, &self.key)
            .await
            .map_err(|e| fail("finalize", e.message))?;
        let inst = slot.inst().map_err(|e| fail("finalize", e.message))?;
        self.node
            .start_command(inst, &t, READY_TIMEOUT, |line| {
                self.log(Some("finalize"), format!("[finalize] {line}"))
            })
            .await
            .map_err(|e| fail("finalize", e.message))
    }
}

fn exit_status(e: &Exit) -> String {
    if e.status.is_empty() {
        format!("exit status {}", e.code)
    } else {
        e.status.clone()
    }
}
