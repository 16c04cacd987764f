//! Template builds on a node (e2b's build system): registering a build of a team's template,
//! receiving the files its COPY steps need, starting it, and answering its status with a page
//! of its log. `run` executes a build in sandboxes of this node; what is kept is in `records`.

mod admin;
mod gc;
mod image;
mod records;
mod run;
mod warm;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use chrono::Utc;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use self::records::{BuildRecord, Records};
use super::Node;
use super::runtime::Runtime;
use crate::model::builds::{
    BuildLogEntry, BuildQuery, BuildReason, BuildRef, BuildState, BuildStatus, FilesRef, LogLevel,
    RequestBuild, RequestedBuild, StartBuild, TagRecord, TemplateRecord,
};
use crate::model::{Error, Result};
use crate::templates::Template;
use crate::templates::build::archive;

/// Most log entries one status answer carries, as e2b's API.
const PAGE: usize = 100;
/// Most bytes an uploaded archive unpacks to, and most members.
const MAX_UNPACKED: u64 = 8 << 30;
const MAX_MEMBERS: u64 = 1_000_000;

/// A build under way: its log as it grows, and how to stop it.
pub(crate) struct Live {
    log: Mutex<Vec<BuildLogEntry>>,
    cancel: CancellationToken,
    template_id: String,
}

pub(crate) struct Builds {
    records: Records,
    live: Mutex<HashMap<String, Arc<Live>>>,
    /// Serializes the read-modify-write of records.
    write: Mutex<()>,
    /// Largest upload accepted.
    max_upload: u64,
}

impl Builds {
    pub fn open(data: &Path, templates: &Path, max_upload: u64) -> Result<Builds> {
        let records = Records::open(data, templates)?;
        // Nothing is being received before the node serves.
        records.clean_partial_uploads();
        // Nothing runs a build that was under way when the node stopped: say so, and say that
        // a build never started after a restart will not be either.
        for mut b in records.builds() {
            if b.state == BuildState::Building {
                b.state = BuildState::Error;
                b.reason = Some(BuildReason {
                    message: "interrupted: the node restarted during the build; run it again"
                        .into(),
                    step: None,
                });
                b.finished_at = Some(Utc::now());
                records.save_build(&b)?;
            }
        }
        Ok(Builds {
            records,
            live: Mutex::new(HashMap::new()),
            write: Mutex::new(()),
            max_upload,
        })
    }

    fn write_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.write.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Live>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The team's template `template_id`: 404 when unknown, 403 when another team's.
    fn owned_template(&self, team: &str, template_id: &str) -> Result<TemplateRecord> {
        match self.records.template(template_id)? {
            Some(t) if t.team == team => Ok(t),
            Some(_) => Err(Error::forbidden(format!(
                "template {template_id} belongs to another team"
            ))),
            None => Err(Error::not_found(format!(
                "template {template_id} not found"
            ))),
        }
    }

    /// The team's build: 404 when unknown (or of another template), 403 when another team's.
    fn owned_build(&self, r: &BuildRef) -> Result<BuildRecord> {
        match self.records.build(&r.build_id)? {
            Some(b) if b.template_id != r.template_id => Err(Error::not_found(format!(
                "build {} of template {} not found",
                r.build_id, r.template_id
            ))),
            Some(b) if b.team != r.team => Err(Error::forbidden(format!(
                "build {} belongs to another team",
                r.build_id
            ))),
            Some(b) => Ok(b),
            None => Err(Error::not_found(format!(
                "build {} of template {} not found",
                r.build_id, r.template_id
            ))),
        }
    }

    /// Appends to a build's log (memory for the polls, disk for later).
    fn log(&self, build_id: &str, level: LogLevel, step: Option<&str>, message: String) {
        let entry = BuildLogEntry {
            timestamp: Utc::now(),
            level,
            message,
            step: step.map(str::to_string),
        };
        if let Err(e) = self.records.append_log(build_id, &entry) {
            tracing::warn!(build = build_id, error = %e, "could not keep a build's log line");
        }
        if let Some(live) = self.live().get(build_id) {
            live.log
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(entry);
        }
    }

    /// Ends a build: `ready` with the template it installed, or `error` with why.
    fn finish(&self, build_id: &str, outcome: std::result::Result<String, BuildReason>) {
        let _w = self.write_lock();
        let Ok(Some(mut b)) = self.records.build(build_id) else {
            return;
        };
        b.finished_at = Some(Utc::now());
        match outcome {
            Ok(store_name) => {
                b.state = BuildState::Ready;
                b.store_name = Some(store_name);
                // The build's tags now name it.
                if let Ok(Some(mut t)) = self.records.template(&b.template_id) {
                    for tag in &b.tags {
                        t.tags.insert(
                            tag.clone(),
                            TagRecord {
                                build_id: b.build_id.clone(),
                                assigned_at: Utc::now(),
                            },
                        );
                    }
                    t.updated_at = Utc::now();
                    if let Err(e) = self.records.save_template(&t) {
                        tracing::error!(build = build_id, error = %e, "could not tag a ready build");
                    }
                }
            }
            Err(reason) => {
                b.state = BuildState::Error;
                b.reason = Some(reason);
            }
        }
        if let Err(e) = self.records.save_build(&b) {
            tracing::error!(build = build_id, error = %e, "could not record a build's end");
        }
        self.live().remove(build_id);
    }

    /// What e2b calls a built template: its id and alias when its `default` tag names it,
    /// and `name:tag` for each of its tags.
    pub fn e2b_names(&self, t: &Template) -> Vec<String> {
        let Some(e2b) = &t.meta.e2b else {
            return Vec::new();
        };
        let Ok(Some(rec)) = self.records.template(&e2b.template_id) else {
            return Vec::new();
        };
        let mut names = Vec::new();
        for (tag, t) in &rec.tags {
            if t.build_id != e2b.build_id {
                continue;
            }
            if tag == "default" {
                names.push(rec.template_id.clone());
                names.push(rec.alias.clone());
            }
            names.push(format!("{}:{tag}", rec.template_id));
            names.push(format!("{}:{tag}", rec.alias));
        }
        names
    }

    pub fn is_public(&self, t: &Template) -> bool {
        t.meta.e2b.as_ref().is_some_and(|e| {
            self.records
                .template(&e.template_id)
                .ok()
                .flatten()
                .is_some_and(|r| r.public)
        })
    }
}

impl<R: Runtime> Node<R> {
    fn builds(&self) -> &Builds {
        &self.inner.builds
    }

    pub(crate) fn e2b_names(&self, t: &Template) -> Vec<String> {
        self.builds().e2b_names(t)
    }

    pub(crate) fn is_public(&self, t: &Template) -> bool {
        self.builds().is_public(t)
    }

    /// Registers a build of the team's template `alias` (a new template, or a rebuild of the
    /// one it has by that name), waiting for its start.
    pub fn request_build(&self, req: &RequestBuild) -> Result<RequestedBuild> {
        let b = self.builds();
        let _w = b.write_lock();
        let existing = b.records.by_alias(&req.team, &req.alias);
        if existing.is_none() {
            let taken = self.templates().iter().any(|t| {
                t.meta.e2b.is_none()
                    && (t.meta.name == req.alias || t.meta.aliases.contains(&req.alias))
            });
            if taken || b.records.template(&req.alias)?.is_some() {
                return Err(Error::conflict(format!(
                    "Alias '{}' is already used",
                    req.alias
                )));
            }
        }
        let now = Utc::now();
        let mut t = existing.unwrap_or_else(|| TemplateRecord {
            template_id: crate::e2b::template_names::new_template_id(),
            team: req.team.clone(),
            alias: req.alias.clone(),
            public: false,
            created_at: now,
            updated_at: now,
            tags: Default::default(),
            builds: Vec::new(),
            cpu_count: req.cpu_count,
            memory_mb: req.memory_mb,
        });
        // Earlier builds of the template that never started will not be.
        for id in &t.builds {
            if let Ok(Some(mut old)) = b.records.build(id)
                && old.state == BuildState::Waiting
            {
                old.state = BuildState::Error;
                old.reason = Some(BuildReason {
                    message: "superseded by a newer one".into(),
                    step: None,
                });
                old.finished_at = Some(now);
                b.records.save_build(&old)?;
            }
        }
        let build_id = uuid::Uuid::new_v4().to_string();
        b.records.save_build(&BuildRecord {
            build_id: build_id.clone(),
            template_id: t.template_id.clone(),
            team: req.team.clone(),
            state: BuildState::Waiting,
            reason: None,
            created_at: now,
            started_at: None,
            finished_at: None,
            cpu_count: req.cpu_count,
            memory_mb: req.memory_mb,
            tags: req.tags.clone(),
            store_name: None,
        })?;
        t.builds.push(build_id.clone());
        t.updated_at = now;
        t.cpu_count = req.cpu_count;
        t.memory_mb = req.memory_mb;
        b.records.save_template(&t)?;
        Ok(RequestedBuild {
            template_id: t.template_id,
            build_id,
            alias: t.alias,
            tags: req.tags.clone(),
            public: t.public,
        })
    }

    /// Starts a waiting build: it is `building` when this returns, and runs in the background.
    pub fn start_build(&self, req: StartBuild) -> Result<()> {
        let b = self.builds();
        let live = {
            let _w = b.write_lock();
            let mut rec = b.owned_build(&req.build)?;
            if rec.state != BuildState::Waiting {
                return Err(Error::invalid(format!(
                    "build {} is {:?}, not waiting: a build starts once",
                    rec.build_id, rec.state
                )));
            }
            // A newer build of the template replaces one under way.
            for l in b.live().values() {
                if l.template_id == rec.template_id {
                    l.cancel.cancel();
                }
            }
            rec.state = BuildState::Building;
            rec.started_at = Some(Utc::now());
            b.records.save_build(&rec)?;
            let live = Arc::new(Live {
                log: Mutex::new(Vec::new()),
                cancel: self.shutdown_token().child_token(),
                template_id: rec.template_id.clone(),
            });
            b.live().insert(rec.build_id.clone(), live.clone());
            (rec, live)
        };
        let node = self.clone();
        self.inner.tasks.spawn(async move {
            let (rec, live) = live;
            let id = rec.build_id.clone();
            let outcome = node.run_build(&rec, &req.spec, &live).await;
            node.builds().finish(&id, outcome);
            node.sync_built_pools();
            node.collect_build_garbage(Default::default());
        });
        Ok(())
    }

    /// A build's status, then a page of its log (the status first: a client that sees the end
    /// also gets every line before it).
    pub fn get_build(&self, q: &BuildQuery) -> Result<BuildStatus> {
        let b = self.builds();
        let rec = b.owned_build(&q.build)?;
        let all = match b.live().get(&rec.build_id) {
            Some(live) => live.log.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            None => b.records.log(&rec.build_id),
        };
        let entries = all
            .into_iter()
            .filter(|e| q.level.is_none_or(|l| e.level >= l))
            .skip(q.offset)
            .take(q.limit.min(PAGE))
            .collect();
        Ok(BuildStatus {
            template_id: rec.template_id,
            build_id: rec.build_id,
            state: rec.state,
            entries,
            reason: rec.reason,
        })
    }

    /// Whether the team has uploaded the files of `hash` (for a template of its own).
    pub fn has_build_files(&self, f: &FilesRef) -> Result<bool> {
        let b = self.builds();
        b.owned_template(&f.team, &f.template_id)?;
        let path = b.records.files_path(&f.team, &f.hash);
        let present = path.is_file();
        if present {
            Builds::touch_upload(&path);
        }
        Ok(present)
    }

    /// Receives an upload: written beside its place, checked, then put there; nothing is
    /// kept of one that is too large or not a clean archive.
    pub async fn put_build_files(
        &self,
        f: &FilesRef,
        mut chunks: impl futures::Stream<Item = Result<bytes::Bytes>> + Unpin,
    ) -> Result<()> {
        use futures::StreamExt;
        let b = self.builds();
        b.owned_template(&f.team, &f.template_id)?;
        if !crate::e2b::upload_url::valid_hash(&f.hash) {
            return Err(Error::invalid("Invalid files hash"));
        }
        let tmp = b.records.files_staging(&f.team)?;
        let received = async {
            let mut file = tokio::fs::File::create(&tmp)
                .await
                .map_err(|e| Error::io("storing an upload", e))?;
            let mut size = 0u64;
            while let Some(chunk) = chunks.next().await {
                let chunk = chunk?;
                size += chunk.len() as u64;
                if size > b.max_upload {
                    return Err(Error::too_large(format!(
                        "the upload is larger than {} bytes",
                        b.max_upload
                    )));
                }
                file.write_all(&chunk)
                    .await
                    .map_err(|e| Error::io("storing an upload", e))?;
            }
            file.flush()
                .await
                .map_err(|e| Error::io("storing an upload", e))?;
            let path = tmp.clone();
            tokio::task::spawn_blocking(move || archive::check(&path, MAX_UNPACKED, MAX_MEMBERS))
                .await
                .map_err(|e| Error::internal(format!("checking an upload: {e}")))?
                .map_err(archive::ArchiveError::into_error)?;
            std::fs::rename(&tmp, b.records.files_path(&f.team, &f.hash))
                .map_err(|e| Error::io("storing an upload", e))
        }
        .await;
        if received.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        received
    }
}
