//! Templates: read-only root filesystems that sandboxes start from, each a directory
//! `NAME/rootfs` with its description `NAME/template.json`, shared by every sandbox of the
//! template through an overlay. A template's files are owned by the node's unprivileged id
//! range (sandbox root = `uid_base`), so they look right from inside a sandbox's user
//! namespace. Built from Debian packages (mmdebstrap), imported from an OCI image archive, or,
//! when mmdebstrap is missing, composed from the host's `/usr`.

pub mod build;
pub mod built;
mod code_interpreter;
mod debian;
mod derive;
mod desktop;
mod host;
pub mod layers;
pub mod oci;
pub mod recipes;
pub mod registry;
pub mod shift;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::model::{Error, ErrorKind, Result, ids, pool::validate_template_name};
use crate::sandbox::spec::{IdMap, RootKind};

pub use debian::{BASE_PACKAGES, find_mmdebstrap};

const META: &str = "template.json";
const ROOTFS: &str = "rootfs";
/// A build's directory until it is complete: `STAGING<12 hex digits>-<template name>`.
const STAGING: &str = ".staging-";

/// The template a staging directory's name says is being built.
fn staging_name(file: &str) -> Option<&str> {
    let rest = file.strip_prefix(STAGING)?;
    let (hex, name) = rest.split_once('-')?;
    (hex.len() == 12 && hex.bytes().all(|b| b.is_ascii_hexdigit()) && !name.is_empty())
        .then_some(name)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Built from Debian packages with mmdebstrap.
    Debian,
    /// Another template plus packages installed with apt.
    Derived,
    /// Imported from an OCI image archive.
    Oci,
    /// Composed from the host's /usr (the fallback without mmdebstrap).
    Host,
    /// Built by an e2b `Template.build`: layers over its parent's.
    Built,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TemplateMeta {
    pub name: String,
    /// Changes with every build; checkpoints remember it, since their layers only fit it.
    pub id: String,
    pub kind: Kind,
    pub root_kind: RootKind,
    pub packages: Vec<String>,
    pub size_bytes: u64,
    pub created_at: DateTime<Utc>,
    pub uid_base: u32,
    /// How it was made, for people.
    pub source: String,
    /// Environment every command in the sandbox gets (an image's `Env`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory and user an image asks for.
    #[serde(default)]
    pub workdir: Option<String>,
    /// Other names the template answers to (e2b's SDKs ask for `code-interpreter-v1`).
    #[serde(default)]
    pub aliases: Vec<String>,
    /// What its sandboxes run beside envd, and wait for before they count as ready.
    #[serde(default)]
    pub services: Vec<crate::sandbox::services::Service>,
    /// The size tier of its sandboxes when a create names none (the smallest when unset).
    #[serde(default)]
    pub size: Option<String>,
    /// A digest of what the template was built from (its recipe), so that a build "if
    /// missing" also rebuilds one made from another recipe.
    #[serde(default)]
    pub recipe: Option<String>,
    /// A built template's layers over `rootfs`, top first (their ids under `.layers/`).
    #[serde(default)]
    pub layers: Vec<String>,
    /// The user its sandboxes' commands run as by default (`user` when unset).
    #[serde(default)]
    pub user: Option<String>,
    /// Started in each of its sandboxes before the sandbox is handed out; `ready_cmd` says when
    /// it is up.
    #[serde(default)]
    pub start_cmd: Option<String>,
    #[serde(default)]
    pub ready_cmd: Option<String>,
    /// Who built it and what e2b calls it, for templates built through the e2b API.
    #[serde(default)]
    pub e2b: Option<built::E2bIdentity>,
}

#[derive(Debug, Clone)]
pub struct Template {
    pub meta: TemplateMeta,
    /// Its root filesystem (links resolved).
    pub root: PathBuf,
    /// The layers stacked over `root`, top first.
    pub layers: Vec<PathBuf>,
}

/// What a templates directory holds under a name.
enum Found {
    Usable(Box<Template>),
    Missing,
    /// There, but no sandbox could start on it (its files lost their owners, its rootfs or
    /// description is gone or unreadable); only a rebuild helps.
    Damaged(Error),
}

/// Progress lines for people waiting on a build.
pub type Progress<'a> = &'a (dyn Fn(&str) + Sync);

/// The templates directory of a node.
#[derive(Debug, Clone)]
pub struct TemplateStore {
    dir: PathBuf,
    ids: IdMap,
}

/// What `template build` asks for.
#[derive(Debug, Clone, Default)]
pub struct BuildSpec {
    pub name: String,
    pub packages: Vec<String>,
    pub from: Option<String>,
    pub force: bool,
    /// Answer the existing template instead of refusing.
    pub if_missing: bool,
}

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

/// Holds the templates directory's build lock for as long as it lives.
struct BuildLock {
    _file: fs::File,
}

impl TemplateStore {
    pub fn new(dir: impl Into<PathBuf>, ids: IdMap) -> Result<TemplateStore> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        // Sandboxes find their template by this path from their own directory.
        let dir = dir
            .canonicalize()
            .map_err(io(format!("resolving {}", dir.display())))?;
        Ok(TemplateStore { dir, ids })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn ids(&self) -> IdMap {
        self.ids
    }

    fn lock(&self) -> Result<BuildLock> {
        self.lock_file(".lock")
    }

    /// An exclusive lock on `name` in the templates directory, held while the answer lives.
    fn lock_file(&self, name: &str) -> Result<BuildLock> {
        use std::os::fd::AsRawFd;
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join(name))
            .map_err(io("opening the templates lock"))?;
        // SAFETY: flock on a descriptor we own; blocks until other builders are done.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(Error::io(
                "locking the templates directory",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(BuildLock { _file: f })
    }

    pub fn get(&self, name: &str) -> Result<Template> {
        match self.find(name)? {
            Found::Usable(t) => Ok(*t),
            Found::Missing => Err(Error::not_found(format!(
                "template {name:?} is not in {}",
                self.dir.display()
            ))),
            Found::Damaged(e) => Err(e),
        }
    }

    /// What the directory holds under `name`. A template prepared for another uid base is
    /// an error rather than `Damaged`: it is usable by the nodes it was made for, which may
    /// share this directory, so it is not rebuilt on their behalf.
    fn find(&self, name: &str) -> Result<Found> {
        validate_template_name(name)?;
        let dir = self.dir.join(name);
        let meta_path = dir.join(META);
        let bytes = match fs::read(&meta_path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::Missing),
            Err(e) => return Err(Error::io(format!("reading {}", meta_path.display()), e)),
        };
        let damaged = |why: String| {
            Ok(Found::Damaged(Error::internal(format!(
                "template {name:?} is damaged: {why}; rebuild it (`sandbox-gateway template build {name} --force`)"
            ))))
        };
        let meta: TemplateMeta = match serde_json::from_slice(&bytes) {
            Ok(m) => m,
            Err(e) => return damaged(format!("{} does not parse ({e})", meta_path.display())),
        };
        if meta.uid_base != self.ids.base {
            return Err(Error::invalid(format!(
                "template {name:?} was prepared for uid base {}, this node uses {}; rebuild it (`sandbox-gateway template build {name} --force`)",
                meta.uid_base, self.ids.base
            )));
        }
        let root = dir.join(ROOTFS);
        // One stat finds the usual damage: a copy that did not keep owners (`cp -r`, an
        // archive unpacked as another user) gives every file to whoever copied it, and no
        // sandbox of this node could then start on the tree. The stat follows a link: a
        // rootfs may live on another disk.
        match fs::metadata(&root) {
            Ok(m) if m.is_dir() && m.uid() == meta.uid_base => {
                let root = fs::canonicalize(&root).unwrap_or(root);
                let mut layers = Vec::with_capacity(meta.layers.len());
                for id in &meta.layers {
                    let layer = self.layer_path(id);
                    if !layer.is_dir() {
                        return damaged(format!("its layer {id} is missing"));
                    }
                    layers.push(layer);
                }
                Ok(Found::Usable(Box::new(Template { meta, root, layers })))
            }
            Ok(m) if m.is_dir() => damaged(format!(
                "its files belong to uid {}, not to this node's uid base {} (copied without keeping owners? `cp -a` keeps them)",
                m.uid(),
                meta.uid_base
            )),
            Ok(_) => damaged(format!("{} is not a directory", root.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                damaged(format!("{} is missing", root.display()))
            }
            Err(e) => Err(Error::io(format!("reading {}", root.display()), e)),
        }
    }

    /// Every usable template, by name.
    pub fn list(&self) -> Vec<Template> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<Template> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| validate_template_name(n).is_ok())
            .filter_map(|n| self.get(&n).ok())
            .collect();
        out.sort_by(|a, b| a.meta.name.cmp(&b.meta.name));
        out
    }

    /// Makes sure `base` exists: built from Debian packages when mmdebstrap is installed,
    /// otherwise composed from the host's `/usr` (and the command that installs mmdebstrap is
    /// printed).
    pub fn ensure_base(&self, progress: Progress<'_>) -> Result<Template> {
        if let Found::Usable(t) = self.find("base")? {
            if t.meta.kind == Kind::Host && find_mmdebstrap().is_some() {
                progress(
                    "template base is composed from this machine's /usr; for the Debian template run `sandbox-gateway template build base --force`",
                );
            }
            return Ok(*t);
        }
        let _lock = self.lock()?;
        self.base_locked(progress)
    }

    /// `ensure_base` with the build lock held.
    fn base_locked(&self, progress: Progress<'_>) -> Result<Template> {
        // Looked at again under the lock: another process may have built it meanwhile.
        let damaged = match self.find("base")? {
            Found::Usable(t) => return Ok(*t),
            Found::Missing => false,
            Found::Damaged(e) => {
                progress(&format!("{e}: rebuilding it now"));
                true
            }
        };
        self.set_aside_legacy("base")?;
        match find_mmdebstrap() {
            Some(_) => self.build_locked(
                &BuildSpec {
                    name: "base".into(),
                    force: damaged,
                    ..Default::default()
                },
                progress,
            ),
            None => {
                progress(
                    "mmdebstrap is not installed: composing template base from this machine's /usr (read-only inside sandboxes)",
                );
                progress(
                    "  for the full Debian template (python3, nodejs, git, ...): apt-get install mmdebstrap, then `sandbox-gateway template build base --force`",
                );
                self.install("base", |staging| host::compose(staging, self.ids), progress)
            }
        }
    }

    /// A directory of the same name without a description (what older versions called a
    /// template) is moved aside rather than deleted.
    fn set_aside_legacy(&self, name: &str) -> Result<()> {
        let dir = self.dir.join(name);
        if dir.is_dir() && !dir.join(META).exists() {
            let aside = self
                .dir
                .join(format!(".legacy-{name}-{}", ids::random_hex(4)));
            fs::rename(&dir, &aside).map_err(io(format!("moving {} aside", dir.display())))?;
        }
        Ok(())
    }

    pub fn build(&self, spec: &BuildSpec, progress: Progress<'_>) -> Result<Template> {
        validate_template_name(&spec.name)?;
        let _lock = self.lock()?;
        self.build_locked(spec, progress)
    }

    fn build_locked(&self, spec: &BuildSpec, progress: Progress<'_>) -> Result<Template> {
        if spec.from.is_none()
            && let Some(recipe) = recipes::find(&spec.name)
        {
            return self.build_recipe(recipe, spec, progress);
        }
        let mut force = spec.force;
        if spec.if_missing {
            match self.find(&spec.name)? {
                Found::Usable(t) => return Ok(*t),
                Found::Missing => {}
                // "If missing" means "make sure it is usable": a damaged one is replaced.
                Found::Damaged(e) => {
                    progress(&format!("{e}: rebuilding it now"));
                    force = true;
                }
            }
        }
        self.refuse_existing(&spec.name, force)?;
        match &spec.from {
            None => {
                let mmdebstrap = find_mmdebstrap().ok_or_else(|| {
                    Error::invalid(
                        "building a template needs mmdebstrap (apt-get install mmdebstrap)",
                    )
                })?;
                let packages = debian::package_list(&spec.packages);
                self.install(
                    &spec.name,
                    |staging| {
                        debian::bootstrap(
                            &mmdebstrap,
                            staging,
                            &spec.name,
                            &packages,
                            self.ids,
                            progress,
                        )
                    },
                    progress,
                )
            }
            Some(from) => {
                let parent = self.get(from)?;
                if parent.meta.kind == Kind::Host {
                    return Err(Error::invalid(format!(
                        "template {from:?} is composed from the host's /usr and cannot take packages; build it with mmdebstrap first"
                    )));
                }
                if spec.packages.is_empty() {
                    return Err(Error::invalid("--packages names nothing to add"));
                }
                let steps = derive::Steps {
                    apt: spec.packages.clone(),
                    ..Default::default()
                };
                self.install(
                    &spec.name,
                    |staging| {
                        derive::derive(&parent, staging, &spec.name, &steps, self.ids, progress)
                    },
                    progress,
                )
            }
        }
    }

    /// Builds a built-in recipe on its parent (building `base` first when it is missing).
    /// "If missing" also rebuilds a template made from another version of the recipe.
    fn build_recipe(
        &self,
        recipe: &recipes::Recipe,
        spec: &BuildSpec,
        progress: Progress<'_>,
    ) -> Result<Template> {
        if !spec.packages.is_empty() {
            return Err(Error::invalid(format!(
                "{} is a built-in recipe and takes no --packages; add them to a template of another name with --from {}",
                recipe.name, recipe.name
            )));
        }
        let digest = recipe.digest();
        let mut force = spec.force;
        if spec.if_missing {
            match self.find(recipe.name)? {
                Found::Usable(t) if t.meta.recipe.as_deref() == Some(digest.as_str()) => {
                    return Ok(*t);
                }
                Found::Usable(_) => {
                    progress(&format!(
                        "template {} was made from another version of its recipe: rebuilding it",
                        recipe.name
                    ));
                    force = true;
                }
                Found::Missing => {}
                Found::Damaged(e) => {
                    progress(&format!("{e}: rebuilding it now"));
                    force = true;
                }
            }
        }
        self.refuse_existing(recipe.name, force)?;
        let parent = if recipe.from == "base" {
            self.base_locked(progress)?
        } else {
            self.get(recipe.from)?
        };
        if parent.meta.kind == Kind::Host {
            return Err(Error::invalid(format!(
                "template {} needs a Debian {} (apt-get install mmdebstrap, then `sandbox-gateway template build {} --force`)",
                recipe.name, recipe.from, recipe.from
            )));
        }
        progress(recipe.note);
        self.install(
            recipe.name,
            |staging| {
                let mut meta = derive::derive(
                    &parent,
                    staging,
                    recipe.name,
                    &recipe.steps(),
                    self.ids,
                    progress,
                )?;
                meta.aliases = recipe.aliases.iter().map(|a| a.to_string()).collect();
                meta.services = recipe.services.to_vec();
                meta.size = recipe.size.map(str::to_string);
                meta.recipe = Some(digest.clone());
                meta.source = format!("recipe {} on {}", recipe.name, parent.meta.name);
                Ok(meta)
            },
            progress,
        )
    }

    pub fn import(
        &self,
        name: &str,
        archive: &Path,
        force: bool,
        progress: Progress<'_>,
    ) -> Result<Template> {
        validate_template_name(name)?;
        let _lock = self.lock()?;
        self.refuse_existing(name, force)?;
        self.install(
            name,
            |staging| oci::import(archive, staging, name, self.ids, progress),
            progress,
        )
    }

    fn refuse_existing(&self, name: &str, force: bool) -> Result<()> {
        if !force && self.dir.join(name).join(META).exists() {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!(
                    "template {name:?} exists; pass --force to replace it (running sandboxes keep the old one)"
                ),
            ));
        }
        Ok(())
    }

    /// Builds into a staging directory with `make` (which fills `staging/rootfs` and returns
    /// the description), then swaps it in. The old template, if any, is removed only after the
    /// swap; sandboxes still running on it keep their bind mount of the old tree.
    fn install(
        &self,
        name: &str,
        make: impl FnOnce(&Path) -> Result<TemplateMeta>,
        progress: Progress<'_>,
    ) -> Result<Template> {
        let started = Instant::now();
        // Named so that `building` can tell which template is on its way.
        let staging = self
            .dir
            .join(format!("{STAGING}{}-{name}", ids::random_hex(6)));
        fs::create_dir_all(&staging).map_err(io(format!("creating {}", staging.display())))?;
        let made = make(&staging);
        let mut meta = match made {
            Ok(m) => m,
            Err(e) => {
                let _ = fs::remove_dir_all(&staging);
                return Err(e);
            }
        };
        let root = staging.join(ROOTFS);
        meta.size_bytes = crate::fsx::tree_disk_usage(&root).unwrap_or(0);
        // The tree itself lives on as a root layer, so that templates built on this one keep
        // theirs when this one is rebuilt.
        if let Err(e) = self.keep_root_as_layer(&staging, &meta.id) {
            let _ = fs::remove_dir_all(&staging);
            return Err(e);
        }
        let bytes = serde_json::to_vec_pretty(&meta)
            .map_err(|e| Error::internal(format!("encoding the template description: {e}")))?;
        crate::fsx::write_atomic(&staging.join(META), &bytes)
            .map_err(io("writing the template description"))?;
        let dest = self.dir.join(&meta.name);
        let old = self
            .dir
            .join(format!(".old-{}-{}", meta.name, ids::random_hex(4)));
        if dest.exists() {
            fs::rename(&dest, &old).map_err(io(format!("replacing {}", dest.display())))?;
        }
        fs::rename(&staging, &dest).map_err(io(format!("installing {}", dest.display())))?;
        if old.exists() {
            self.remove_replaced(&old);
        }
        progress(&format!(
            "template {} ready in {:.0} s ({} MiB)",
            meta.name,
            started.elapsed().as_secs_f64(),
            meta.size_bytes >> 20
        ));
        self.get(&meta.name)
    }

    /// The template's root with the image's own ids (root is 0), for runtimes that map ids
    /// themselves (gVisor's Sentry does). Made once per build of the template, beside it.
    /// A copy, never hard links into another template's tree: a gVisor filesystem-only pause
    /// finds what a sandbox changed by ctime against its tree's, and linking a file changes
    /// its ctime (tried: every sandbox of the parent then saved its whole root).
    pub fn plain_root(&self, t: &Template) -> Result<PathBuf> {
        let dir = self.dir.join(&t.meta.name);
        let plain = dir.join("rootfs-plain");
        let stamp = dir.join("rootfs-plain.id");
        let current = |s: &Path| fs::read_to_string(s).is_ok_and(|id| id.trim() == t.meta.id);
        if current(&stamp) && plain.is_dir() {
            return Ok(plain);
        }
        // A lock of its own: a build of another template (minutes) must not hold up boots.
        let _lock = self.lock_file(&format!(".plain-{}.lock", t.meta.name))?;
        if current(&stamp) && plain.is_dir() {
            return Ok(plain);
        }
        let tmp = dir.join(format!(".rootfs-plain-{}", ids::random_hex(4)));
        // A built template's layers are applied over the copy of its root, as an overlay
        // would show them: gVisor's root is one plain tree.
        let bottom_up: Vec<PathBuf> = t.layers.iter().rev().cloned().collect();
        layers::flatten(&t.root, &bottom_up, &tmp)
            .map_err(io(format!("copying the template {}", t.meta.name)))?;
        if let Err(e) = shift::shift_tree(&tmp, self.ids, shift::Shift::Out) {
            let _ = fs::remove_dir_all(&tmp);
            return Err(Error::io("giving the copy the image's ids", e));
        }
        let _ = fs::remove_dir_all(&plain);
        fs::rename(&tmp, &plain).map_err(io("installing the copy"))?;
        fs::write(&stamp, &t.meta.id).map_err(io("stamping the copy"))?;
        Ok(plain)
    }

    /// Removes staging directories an interrupted build left (waiting for builds under way:
    /// nodes may share the directory).
    /// The templates being built in this directory now, by this process or another: those
    /// with a staging directory (`clean_staging` removes what a stopped build left).
    pub fn building(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| staging_name(&e.file_name().to_string_lossy()).map(str::to_string))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    pub fn clean_staging(&self) {
        let Ok(_lock) = self.lock() else { return };
        self.clean_new_layers();
        if let Ok(entries) = fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let n = e.file_name().to_string_lossy().to_string();
                if n.starts_with(STAGING) || n.starts_with(".old-") {
                    let _ = fs::remove_dir_all(e.path());
                }
                // Half-made plain copies inside templates.
                for inner in fs::read_dir(e.path()).into_iter().flatten().flatten() {
                    if inner
                        .file_name()
                        .to_string_lossy()
                        .starts_with(".rootfs-plain-")
                    {
                        let _ = fs::remove_dir_all(inner.path());
                    }
                }
            }
        }
    }
}

/// A fresh description for a template being made now.
pub(crate) fn new_meta(
    name: &str,
    kind: Kind,
    root_kind: RootKind,
    ids: IdMap,
    source: String,
) -> TemplateMeta {
    TemplateMeta {
        name: name.to_string(),
        id: ids::random_hex(8),
        kind,
        root_kind,
        packages: Vec::new(),
        size_bytes: 0,
        created_at: Utc::now(),
        uid_base: ids.base,
        source,
        env: BTreeMap::new(),
        workdir: None,
        aliases: Vec::new(),
        services: Vec::new(),
        size: None,
        recipe: None,
        layers: Vec::new(),
        user: None,
        start_cmd: None,
        ready_cmd: None,
        e2b: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quiet(_: &str) {}

    /// A directory holding `base` composed from the host for uid base 400000 (fast: /usr is
    /// not copied), or `None` when not root (chown needs it).
    fn composed_base() -> Option<(tempfile::TempDir, TemplateStore)> {
        if !crate::node::runtime::sys::is_root() {
            eprintln!("skipped: templates are chowned into the id range, which needs root");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let store = TemplateStore::new(dir.path(), IdMap::new(400_000).unwrap()).unwrap();
        store
            .install("base", |staging| host::compose(staging, store.ids), &quiet)
            .unwrap();
        Some((dir, store))
    }

    #[test]
    fn a_template_whose_files_lost_their_owners_is_damaged_not_usable() {
        let Some((dir, store)) = composed_base() else {
            return;
        };
        assert_eq!(store.get("base").unwrap().meta.uid_base, 400_000);
        assert_eq!(store.list().len(), 1);

        // The tree lives on as a root layer; `rootfs` links to it.
        let link = dir.path().join("base").join(ROOTFS);
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let root = fs::canonicalize(&link).unwrap();
        assert!(root.starts_with(dir.path().join(built::LAYERS)), "{root:?}");
        // A rootfs that is a link to a tree elsewhere (another disk) is followed.
        let target = fs::read_link(&link).unwrap();
        let elsewhere = dir.path().join("elsewhere");
        fs::rename(&root, &elsewhere).unwrap();
        fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        assert!(store.get("base").is_ok());
        fs::remove_file(&link).unwrap();
        fs::rename(&elsewhere, &root).unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();

        // What `cp -r` run by root does to the tree's top.
        std::os::unix::fs::lchown(&root, Some(0), Some(0)).unwrap();
        let e = store.get("base").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Internal);
        assert!(
            e.message
                .contains("belong to uid 0, not to this node's uid base 400000")
                && e.message.contains("template build base --force"),
            "{e}"
        );
        assert!(matches!(store.find("base").unwrap(), Found::Damaged(_)));
        assert!(store.list().is_empty(), "a damaged template is not offered");

        // A rootfs that is gone, and a description that does not parse, are damage too.
        fs::remove_dir_all(&root).unwrap();
        assert!(matches!(store.find("base").unwrap(), Found::Damaged(_)));
        fs::write(dir.path().join("base").join(META), "{").unwrap();
        assert!(matches!(store.find("base").unwrap(), Found::Damaged(_)));
        assert!(matches!(store.find("other").unwrap(), Found::Missing));
    }

    #[test]
    fn a_template_for_another_uid_base_is_refused_not_rebuilt() {
        let Some((dir, theirs)) = composed_base() else {
            return;
        };
        let ours = TemplateStore::new(dir.path(), IdMap::new(500_000).unwrap()).unwrap();
        let e = ours.find("base").err().expect("refused");
        assert_eq!(e.kind, ErrorKind::Invalid);
        assert!(e.message.contains("prepared for uid base 400000"), "{e}");
        // Starting a node with the other base says so instead of replacing their template.
        let e = ours.ensure_base(&quiet).unwrap_err();
        assert!(e.message.contains("prepared for uid base 400000"), "{e}");
        assert!(theirs.get("base").is_ok());
    }

    #[test]
    fn staging_directories_say_what_is_being_built() {
        let hex = crate::model::ids::random_hex(6);
        assert_eq!(
            staging_name(&format!("{STAGING}{hex}-code-interpreter")),
            Some("code-interpreter")
        );
        assert_eq!(staging_name(".staging-00ff00aa11bb-a.b_c"), Some("a.b_c"));
        // Directories of older builds (no name), other files, and malformed names.
        assert_eq!(staging_name(".staging-00ff00aa11bb"), None);
        assert_eq!(staging_name(".staging-00ff00aa11bb-"), None);
        assert_eq!(staging_name(".staging-0a1b2c-base"), None);
        assert_eq!(staging_name(".staging-xyz123xyz123-base"), None);
        assert_eq!(staging_name(".old-base-1234"), None);
        assert_eq!(staging_name("base"), None);

        let dir = tempfile::tempdir().unwrap();
        let store = TemplateStore::new(dir.path(), IdMap::new(400_000).unwrap()).unwrap();
        assert!(store.building().is_empty());
        fs::create_dir(dir.path().join(".staging-00ff00aa11bb-code-interpreter")).unwrap();
        fs::create_dir(dir.path().join("base")).unwrap();
        assert_eq!(store.building(), ["code-interpreter"]);
        store.clean_staging();
        assert!(store.building().is_empty());
    }
}
