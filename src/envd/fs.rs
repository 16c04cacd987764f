//! `filesystem.Filesystem`: stat, list, make, move and remove as the selected user (every call
//! runs on a blocking thread under that user's filesystem identity), plus the watchers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use connectrpc::{
    ConnectError, ErrorCode, RequestContext, Response, ServiceRequest, ServiceResult, ServiceStream,
};

use super::creds::{Identity, check_can_act_as, run_as};
use super::entry::entry_info;
use super::errors::{creds_err, invalid, io_err, not_found};
use super::paths::resolve;
use super::process::rpc_user;
use super::proto::filesystem::*;
use super::state::Envd;
use super::users::UserDb;
use super::watch;

pub struct FilesystemService {
    pub envd: Arc<Envd>,
}

/// A ListDir that would return more entries than this is refused rather than built in memory.
const MAX_LIST_ENTRIES: usize = 100_000;

/// What every filesystem call needs: who it runs as, their user database, and how to resolve
/// their paths.
pub struct Caller {
    pub id: Identity,
    pub db: UserDb,
    home: PathBuf,
    workdir: Option<PathBuf>,
}

impl Caller {
    pub fn of(envd: &Envd, ctx: &RequestContext) -> Result<Caller, ConnectError> {
        let (user, db) = rpc_user(envd, ctx)?;
        check_can_act_as(&user).map_err(creds_err)?;
        Ok(Caller {
            id: Identity::of(&user),
            db,
            home: user.home.clone(),
            workdir: envd.settings().default_workdir,
        })
    }

    pub fn path(&self, p: &str) -> Result<PathBuf, ConnectError> {
        resolve(p, &self.home, self.workdir.as_deref()).map_err(|e| invalid(e.to_string()))
    }

    /// Runs `f` as the caller on a blocking thread.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&UserDb) -> Result<T, ConnectError> + Send + 'static,
    ) -> Result<T, ConnectError> {
        let db = self.db.clone();
        run_as(self.id.clone(), move || f(&db))
            .await
            .map_err(creds_err)?
    }
}

pub fn entry(path: &Path, db: &UserDb) -> Result<EntryInfo, ConnectError> {
    entry_info(path, db).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => not_found(format!("file not found: {e}")),
        _ => io_err("error getting file info", &e),
    })
}

/// Creates the missing directories of `dir` (as the caller, so they are theirs).
fn ensure_dirs(dir: &Path) -> Result<(), ConnectError> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(invalid(format!("path is a file: {}", dir.display()))),
        Err(_) => {
            let mut b = std::fs::DirBuilder::new();
            std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o755);
            b.recursive(true)
                .create(dir)
                .map_err(|e| io_err("failed to create directory", &e))
        }
    }
}

/// Entries below `root` (reported under `shown`) down to `depth` levels, in lexical order,
/// without following symbolic links into other trees.
fn walk(
    root: &Path,
    shown: &Path,
    depth: u32,
    db: &UserDb,
    out: &mut Vec<EntryInfo>,
) -> Result<(), ConnectError> {
    let mut names: Vec<_> = std::fs::read_dir(root)
        .map_err(|e| io_err(format!("error reading directory {}", root.display()), &e))?
        .filter_map(|d| d.ok())
        .collect();
    names.sort_by_key(|d| d.file_name());
    for d in names {
        if out.len() >= MAX_LIST_ENTRIES {
            return Err(ConnectError::new(
                ErrorCode::ResourceExhausted,
                format!("more than {MAX_LIST_ENTRIES} entries; list a smaller depth"),
            ));
        }
        let name = d.file_name();
        let shown_path = shown.join(&name);
        let Ok(e) = entry_info(&shown_path, db) else {
            continue;
        };
        let is_dir = d.file_type().map(|t| t.is_dir()).unwrap_or(false);
        out.push(e);
        if is_dir && depth > 1 {
            walk(&root.join(&name), &shown_path, depth - 1, db, out)?;
        }
    }
    Ok(())
}

// The trait allows any encodable body; these return the owned messages.
#[allow(refining_impl_trait)]
impl Filesystem for FilesystemService {
    async fn stat(
        &self,
        ctx: RequestContext,
        req: ServiceRequest<'_, StatRequest>,
    ) -> ServiceResult<StatResponse> {
        let c = Caller::of(&self.envd, &ctx)?;
        let path = c.path(&req.to_owned_message().path)?;
        let e = c.run(move |db| entry(&path, db)).await?;
        Response::ok(StatResponse {
            entry: e.into(),
            ..Default::default()
        })
    }

    async fn make_dir(
        &self,
        ctx: RequestContext,
        req: ServiceRequest<'_, MakeDirRequest>,
    ) -> ServiceResult<MakeDirResponse> {
        let c = Caller::of(&self.envd, &ctx)?;
        let path = c.path(&req.to_owned_message().path)?;
        let e = c
            .run(move |db| {
                match std::fs::metadata(&path) {
                    Ok(m) if m.is_dir() => {
                        return Err(ConnectError::new(
                            ErrorCode::AlreadyExists,
                            format!("directory already exists: {}", path.display()),
                        ));
                    }
                    Ok(_) => {
                        return Err(invalid(format!(
                            "path already exists but it is not a directory: {}",
                            path.display()
                        )));
                    }
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(io_err("error getting file info", &e));
                    }
                    Err(_) => {}
                }
                ensure_dirs(&path)?;
                entry(&path, db)
            })
            .await?;
        Response::ok(MakeDirResponse {
            entry: e.into(),
            ..Default::default()
        })
    }

    async fn r#move(
        &self,
        ctx: RequestContext,
        req: ServiceRequest<'_, MoveRequest>,
    ) -> ServiceResult<MoveResponse> {
        let c = Caller::of(&self.envd, &ctx)?;
        let req = req.to_owned_message();
        let (src, dst) = (c.path(&req.source)?, c.path(&req.destination)?);
        let e = c
            .run(move |db| {
                if let Some(parent) = dst.parent() {
                    ensure_dirs(parent)?;
                }
                std::fs::rename(&src, &dst).map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => {
                        not_found(format!("source file not found: {e}"))
                    }
                    _ => io_err("error renaming", &e),
                })?;
                entry(&dst, db)
            })
            .await?;
        Response::ok(MoveResponse {
            entry: e.into(),
            ..Default::default()
        })
    }

    async fn list_dir(
        &self,
        ctx: RequestContext,
        req: ServiceRequest<'_, ListDirRequest>,
    ) -> ServiceResult<ListDirResponse> {
        let c = Caller::of(&self.envd, &ctx)?;
        let req = req.to_owned_message();
        let depth = req.depth.max(1);
        let path = c.path(&req.path)?;
        let entries = c
            .run(move |db| {
                let resolved =
                    std::fs::canonicalize(&path).map_err(|e| match e.raw_os_error() {
                        Some(libc::ENOENT) => not_found(format!("directory not found: {e}")),
                        Some(libc::ELOOP) => ConnectError::new(
                            ErrorCode::FailedPrecondition,
                            format!(
                                "cyclic symlink or chain >255 links at {:?}",
                                path.display().to_string()
                            ),
                        ),
                        _ => io_err("error resolving symlink", &e),
                    })?;
                if !resolved.is_dir() {
                    return Err(invalid(format!(
                        "path is not a directory: {}",
                        path.display()
                    )));
                }
                let mut out = Vec::new();
                walk(&resolved, &path, depth, db, &mut out)?;
                Ok(out)
            })
            .await?;
        Response::ok(ListDirResponse {
            entries,
            ..Default::default()
        })
    }

    async fn remove(
        &self,
        ctx: RequestContext,
        req: ServiceRequest<'_, RemoveRequest>,
    ) -> ServiceResult<RemoveResponse> {
        let c = Caller::of(&self.envd, &ctx)?;
        let path = c.path(&req.to_owned_message().path)?;
        c.run(move |_| {
            let res = match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path),
                Ok(_) => std::fs::remove_file(&path),
                // Removing what is not there succeeds, as Go's RemoveAll does.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
            };
            res.map_err(|e| io_err("error removing file or directory", &e))
        })
        .await?;
        Response::ok(RemoveResponse::default())
    }

    async fn watch_dir(
        &self,
        ctx: RequestContext,
        req: ServiceRequest<'_, WatchDirRequest>,
    ) -> ServiceResult<ServiceStream<WatchDirResponse>> {
        let req = req.to_owned_message();
        let c = Caller::of(&self.envd, &ctx)?;
        let opts = watch::Options {
            recursive: req.recursive,
            include_entry: req.include_entry,
            allow_network_mounts: req.allow_network_mounts,
        };
        let path = c.path(&req.path)?;
        let s = watch::stream(c, path, opts, super::process::keepalive_of(&ctx)).await?;
        Ok(Response::new(s))
    }

    async fn create_watcher(
        &self,
        ctx: RequestContext,
        req: ServiceRequest<'_, CreateWatcherRequest>,
    ) -> ServiceResult<CreateWatcherResponse> {
        let req = req.to_owned_message();
        let c = Caller::of(&self.envd, &ctx)?;
        let opts = watch::Options {
            recursive: req.recursive,
            include_entry: req.include_entry,
            allow_network_mounts: req.allow_network_mounts,
        };
        let path = c.path(&req.path)?;
        let id = self.envd.watchers.create(c, path, opts).await?;
        Response::ok(CreateWatcherResponse {
            watcher_id: id,
            ..Default::default()
        })
    }

    async fn get_watcher_events(
        &self,
        _ctx: RequestContext,
        req: ServiceRequest<'_, GetWatcherEventsRequest>,
    ) -> ServiceResult<GetWatcherEventsResponse> {
        let id = req.to_owned_message().watcher_id;
        let events = self.envd.watchers.take_events(&id)?;
        Response::ok(GetWatcherEventsResponse {
            events,
            ..Default::default()
        })
    }

    async fn remove_watcher(
        &self,
        _ctx: RequestContext,
        req: ServiceRequest<'_, RemoveWatcherRequest>,
    ) -> ServiceResult<RemoveWatcherResponse> {
        let id = req.to_owned_message().watcher_id;
        self.envd.watchers.remove(&id)?;
        Response::ok(RemoveWatcherResponse::default())
    }
}
