//! Directory watching with inotify, as envd's (fsnotify-based) watcher reports it: event names
//! relative to the watched directory, one event per operation in the order create, rename,
//! chmod, write, remove, and for create/write/chmod optionally the entry. Recursive watches
//! follow new subdirectories. Served as a stream (WatchDir) or collected for polling
//! (CreateWatcher / GetWatcherEvents / RemoveWatcher).

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use connectrpc::{ConnectError, ErrorCode, ServiceStream};
use futures::StreamExt;
use inotify::{EventMask, EventStream, Inotify, WatchMask, Watches};

use super::errors::{internal, invalid, io_err, not_found};
use super::fs::{Caller, entry};
use super::proto::filesystem::__buffa::oneof::watch_dir_response::Event as WatchEvent;
use super::proto::filesystem::{EventType, FilesystemEvent, WatchDirResponse, watch_dir_response};

#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    pub recursive: bool,
    pub include_entry: bool,
    pub allow_network_mounts: bool,
}

/// Events a polling watcher keeps between two polls; older ones are dropped beyond this.
const MAX_PENDING_EVENTS: usize = 10_000;

// Filesystem magic numbers of network (and FUSE) mounts, from linux/magic.h.
const NETWORK_MAGICS: [i64; 5] = [0x6969, 0xFF53_4D42, 0x517B, 0xFE53_4D42, 0x6573_5546];

fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM
        | WatchMask::DELETE
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::MODIFY
        | WatchMask::ATTRIB
}

fn on_network_mount(path: &Path) -> std::io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: statfs fills the zeroed struct from a NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(NETWORK_MAGICS.contains(&(st.f_type as i64)))
}

/// Watches `dir` and, when recursive, every directory below it (not following links).
fn add_tree(
    watches: &mut Watches,
    dir: &Path,
    recursive: bool,
    out: &mut Vec<(i32, PathBuf)>,
) -> std::io::Result<()> {
    let wd = watches.add(dir, mask())?;
    out.push((wd.get_watch_descriptor_id(), dir.to_path_buf()));
    if recursive {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return Ok(());
        };
        for d in rd.flatten() {
            if d.file_type().is_ok_and(|t| t.is_dir()) {
                // A subdirectory the user cannot read is simply not watched.
                let _ = add_tree(watches, &d.path(), true, out);
            }
        }
    }
    Ok(())
}

pub struct Watcher {
    caller: Caller,
    root: PathBuf,
    opts: Options,
    stream: EventStream<Vec<u8>>,
    watches: Watches,
    dirs: HashMap<i32, PathBuf>,
    pending: VecDeque<FilesystemEvent>,
}

impl Watcher {
    pub async fn open(
        caller: Caller,
        root: PathBuf,
        opts: Options,
    ) -> Result<Watcher, ConnectError> {
        let check = root.clone();
        caller
            .run(move |_| {
                let m = std::fs::metadata(&check).map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => {
                        not_found(format!("path {} not found: {e}", check.display()))
                    }
                    _ => io_err(format!("error statting path {}", check.display()), &e),
                })?;
                if !m.is_dir() {
                    return Err(invalid(format!("path {} not a directory", check.display())));
                }
                let network = on_network_mount(&check)
                    .map_err(|e| io_err("error checking mount status", &e))?;
                if network && !opts.allow_network_mounts {
                    return Err(invalid(format!(
                        "cannot watch path on network filesystem: {}",
                        check.display()
                    )));
                }
                Ok(())
            })
            .await?;
        let inotify = Inotify::init().map_err(|e| io_err("error creating watcher", &e))?;
        let watches = inotify.watches();
        let mut w = watches.clone();
        let dir = root.clone();
        let added = caller
            .run(move |_| {
                let mut out = Vec::new();
                add_tree(&mut w, &dir, opts.recursive, &mut out).map_err(|e| {
                    io_err(
                        format!("error adding path {} to watcher", dir.display()),
                        &e,
                    )
                })?;
                Ok(out)
            })
            .await?;
        let stream = inotify
            .into_event_stream(vec![0u8; 64 * 1024])
            .map_err(|e| io_err("error creating watcher", &e))?;
        Ok(Watcher {
            caller,
            root,
            opts,
            stream,
            watches,
            dirs: added.into_iter().collect(),
            pending: VecDeque::new(),
        })
    }

    fn rel_name(&self, abs: &Path) -> String {
        match abs.strip_prefix(&self.root) {
            Ok(r) if r.as_os_str().is_empty() => ".".into(),
            Ok(r) => r.to_string_lossy().into_owned(),
            Err(_) => abs.to_string_lossy().into_owned(),
        }
    }

    async fn translate(&mut self, wd: i32, m: EventMask, name: Option<OsString>) {
        if m.contains(EventMask::IGNORED) {
            self.dirs.remove(&wd);
            return;
        }
        let Some(base) = self.dirs.get(&wd).cloned() else {
            return;
        };
        let is_self = m.intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF);
        // A watched subdirectory's own removal is already reported by its parent.
        if is_self && base != self.root {
            return;
        }
        let abs = match &name {
            Some(n) => base.join(n),
            None => base.clone(),
        };
        let ops = [
            (
                EventMask::CREATE | EventMask::MOVED_TO,
                EventType::EVENT_TYPE_CREATE,
            ),
            (
                EventMask::MOVE_SELF | EventMask::MOVED_FROM,
                EventType::EVENT_TYPE_RENAME,
            ),
            (EventMask::ATTRIB, EventType::EVENT_TYPE_CHMOD),
            (EventMask::MODIFY, EventType::EVENT_TYPE_WRITE),
            (
                EventMask::DELETE | EventMask::DELETE_SELF,
                EventType::EVENT_TYPE_REMOVE,
            ),
        ];
        if self.opts.recursive
            && m.contains(EventMask::ISDIR)
            && m.intersects(EventMask::CREATE | EventMask::MOVED_TO)
        {
            let mut w = self.watches.clone();
            let dir = abs.clone();
            if let Ok(added) = self
                .caller
                .run(move |_| {
                    let mut out = Vec::new();
                    let _ = add_tree(&mut w, &dir, true, &mut out);
                    Ok(out)
                })
                .await
            {
                self.dirs.extend(added);
            }
        }
        let name = self.rel_name(&abs);
        for (bits, ty) in ops {
            if !m.intersects(bits) {
                continue;
            }
            let mut ev = FilesystemEvent {
                name: name.clone(),
                r#type: ty.into(),
                ..Default::default()
            };
            // Only operations after which the entry still exists carry it (a remove or rename
            // would attach whatever now lives at the path); best effort.
            let carries = matches!(
                ty,
                EventType::EVENT_TYPE_CREATE
                    | EventType::EVENT_TYPE_WRITE
                    | EventType::EVENT_TYPE_CHMOD
            );
            if self.opts.include_entry && carries {
                let p = abs.clone();
                if let Ok(e) = self.caller.run(move |db| entry(&p, db)).await {
                    ev.entry = e.into();
                }
            }
            self.pending.push_back(ev);
        }
    }

    /// The next event; `Err` when the watch itself failed.
    pub async fn next(&mut self) -> Result<FilesystemEvent, ConnectError> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Ok(e);
            }
            match self.stream.next().await {
                Some(Ok(ev)) => {
                    let wd = ev.wd.get_watch_descriptor_id();
                    self.translate(wd, ev.mask, ev.name).await;
                }
                Some(Err(e)) => return Err(internal(format!("watcher error: {e}"))),
                None => return Err(internal("watcher event channel closed")),
            }
        }
    }
}

fn response(e: WatchEvent) -> WatchDirResponse {
    WatchDirResponse {
        event: Some(e),
        ..Default::default()
    }
}

/// WatchDir: a start event once the watch is in place, then events and keepalives.
pub async fn stream(
    caller: Caller,
    root: PathBuf,
    opts: Options,
    every: Duration,
) -> Result<ServiceStream<WatchDirResponse>, ConnectError> {
    let w = Watcher::open(caller, root, opts).await?;
    let start = futures::stream::once(async {
        Ok(response(watch_dir_response::StartEvent::default().into()))
    });
    let mut ka = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ka.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let rest = futures::stream::unfold(Some((w, ka)), |state| async move {
        let (mut w, mut ka) = state?;
        tokio::select! {
            r = w.next() => match r {
                Ok(ev) => {
                    ka.reset();
                    Some((Ok(response(WatchEvent::Filesystem(Box::new(ev)))), Some((w, ka))))
                }
                Err(e) => Some((Err(e), None)),
            },
            _ = ka.tick() => Some((Ok(response(watch_dir_response::KeepAlive::default().into())), Some((w, ka)))),
        }
    });
    Ok(start.chain(rest).boxed())
}

struct Polled {
    events: Mutex<VecDeque<FilesystemEvent>>,
    error: Mutex<Option<ConnectError>>,
    task: tokio::task::AbortHandle,
}

/// The polling watchers, by id.
#[derive(Default)]
pub struct Watchers {
    map: Mutex<HashMap<String, Arc<Polled>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Watchers {
    pub async fn create(
        &self,
        caller: Caller,
        root: PathBuf,
        opts: Options,
    ) -> Result<String, ConnectError> {
        let mut w = Watcher::open(caller, root, opts).await?;
        let id = format!("w{:016x}", rand::random::<u64>());
        let polled = Arc::new_cyclic(|weak: &std::sync::Weak<Polled>| {
            let weak = weak.clone();
            let task = tokio::spawn(async move {
                loop {
                    let r = w.next().await;
                    let Some(p) = weak.upgrade() else { return };
                    match r {
                        Ok(ev) => {
                            let mut q = lock(&p.events);
                            if q.len() >= MAX_PENDING_EVENTS {
                                q.pop_front();
                            }
                            q.push_back(ev);
                        }
                        Err(e) => {
                            *lock(&p.error) = Some(e);
                            return;
                        }
                    }
                }
            });
            Polled {
                events: Mutex::new(VecDeque::new()),
                error: Mutex::new(None),
                task: task.abort_handle(),
            }
        });
        lock(&self.map).insert(id.clone(), polled);
        Ok(id)
    }

    fn get(&self, id: &str) -> Result<Arc<Polled>, ConnectError> {
        lock(&self.map)
            .get(id)
            .cloned()
            .ok_or_else(|| not_found(format!("watcher with id {id} not found")))
    }

    pub fn take_events(&self, id: &str) -> Result<Vec<FilesystemEvent>, ConnectError> {
        let p = self.get(id)?;
        if let Some(e) = lock(&p.error).clone() {
            return Err(e);
        }
        Ok(lock(&p.events).drain(..).collect())
    }

    pub fn remove(&self, id: &str) -> Result<(), ConnectError> {
        let p = lock(&self.map)
            .remove(id)
            .ok_or_else(|| not_found(format!("watcher with id {id} not found")))?;
        p.task.abort();
        Ok(())
    }
}

#[allow(dead_code)]
fn _assert_code(_: ErrorCode) {}
