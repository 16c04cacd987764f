//! Templates as stacks: every template's root tree lives on under `.layers/` as a root layer
//! (its `rootfs` is a link to it), and a built template is a description plus the layers its
//! steps wrote, over the root of the template it was built from. Rebuilding a template never
//! takes a tree from under the templates built on it.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{META, ROOTFS, STAGING, Template, TemplateMeta, TemplateStore, io};
use crate::model::{Error, Result, ids};

/// Where layers live, inside the templates directory.
pub(super) const LAYERS: &str = ".layers";
/// A layer being written: renamed to its id once complete.
const NEW_LAYER: &str = ".new-";

/// Who built a template through the e2b API and what e2b calls it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct E2bIdentity {
    /// The namespace of the API key's team.
    pub team: String,
    pub template_id: String,
    pub build_id: String,
}

impl TemplateStore {
    pub fn layer_path(&self, id: &str) -> PathBuf {
        self.dir.join(LAYERS).join(id)
    }

    /// The id of the root layer a template's `rootfs` links to, moving a tree installed
    /// before layers existed into one first.
    pub fn root_layer(&self, t: &Template) -> Result<String> {
        let link = self.dir.join(&t.meta.name).join(ROOTFS);
        if fs::symlink_metadata(&link).is_ok_and(|m| !m.file_type().is_symlink()) {
            let _lock = self.lock()?;
            self.keep_root_as_layer(&self.dir.join(&t.meta.name), &t.meta.id)?;
        }
        let target = fs::read_link(&link).map_err(io(format!("reading {}", link.display())))?;
        if let Some(id) = target
            .strip_prefix(Path::new("..").join(LAYERS))
            .ok()
            .and_then(|p| p.to_str())
            .filter(|id| !id.contains('/'))
        {
            return Ok(id.to_string());
        }
        // A root kept elsewhere (another disk, a directory shared with other nodes): a layer
        // that links to it stands for it.
        let tree = fs::canonicalize(&link).map_err(io(format!("resolving {}", link.display())))?;
        let id = format!("root-{}", t.meta.id);
        let layer = self.layer_path(&id);
        if fs::symlink_metadata(&layer).is_err() {
            fs::create_dir_all(self.dir.join(LAYERS)).map_err(io("creating the layers"))?;
            std::os::unix::fs::symlink(&tree, &layer)
                .map_err(io(format!("linking {}", layer.display())))?;
        }
        Ok(id)
    }

    /// Moves `dir/rootfs` (a tree) to `.layers/root-<id>` and leaves a link in its place.
    pub(super) fn keep_root_as_layer(&self, dir: &Path, id: &str) -> Result<()> {
        let tree = dir.join(ROOTFS);
        match fs::symlink_metadata(&tree) {
            Ok(m) if m.is_dir() => {}
            // Already a link (a built template's), or nothing to keep.
            _ => return Ok(()),
        }
        let layers = self.dir.join(LAYERS);
        fs::create_dir_all(&layers).map_err(io(format!("creating {}", layers.display())))?;
        let name = format!("root-{id}");
        let dest = layers.join(&name);
        fs::rename(&tree, &dest).map_err(io(format!("moving {}", tree.display())))?;
        std::os::unix::fs::symlink(Path::new("..").join(LAYERS).join(&name), &tree)
            .map_err(io(format!("linking {}", tree.display())))
    }

    /// Removes a replaced template's directory, and its root layer when no other template
    /// stands on it.
    pub(super) fn remove_replaced(&self, old: &Path) {
        let root = fs::read_link(old.join(ROOTFS))
            .ok()
            .map(|t| old.join(t))
            .and_then(|p| fs::canonicalize(p).ok());
        let _ = fs::remove_dir_all(old);
        let Some(root) = root else { return };
        if !root.starts_with(self.dir.join(LAYERS)) || self.root_in_use(&root) {
            return;
        }
        let _ = fs::remove_dir_all(&root);
    }

    /// Whether any template's `rootfs` is `root`.
    fn root_in_use(&self, root: &Path) -> bool {
        fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .any(|e| fs::canonicalize(e.path().join(ROOTFS)).is_ok_and(|r| r == root))
    }

    /// A name for a new layer and where to write it (not created): `adopt_layer` names it
    /// once complete.
    pub fn new_layer_path(&self) -> Result<(String, PathBuf)> {
        let layers = self.dir.join(LAYERS);
        fs::create_dir_all(&layers).map_err(io(format!("creating {}", layers.display())))?;
        let id = format!("l-{}", ids::random_hex(12));
        let staging = layers.join(format!("{NEW_LAYER}{id}"));
        Ok((id, staging))
    }

    /// Gives a complete layer written at `staging` its name.
    pub fn adopt_layer(&self, id: &str, staging: &Path) -> Result<()> {
        fs::rename(staging, self.layer_path(id)).map_err(io("naming a layer"))
    }

    /// Installs a built template: `meta` (its name unique to the build) with `meta.layers`
    /// over the root layer `root`.
    pub fn install_built(&self, meta: &TemplateMeta, root: &str) -> Result<Template> {
        let staging = self
            .dir
            .join(format!("{STAGING}{}-{}", ids::random_hex(6), meta.name));
        let made = (|| {
            fs::create_dir_all(&staging).map_err(io(format!("creating {}", staging.display())))?;
            std::os::unix::fs::symlink(
                Path::new("..").join(LAYERS).join(root),
                staging.join(ROOTFS),
            )
            .map_err(io("linking the root"))?;
            let bytes = serde_json::to_vec_pretty(meta)
                .map_err(|e| Error::internal(format!("encoding the template description: {e}")))?;
            crate::fsx::write_atomic(&staging.join(META), &bytes)
                .map_err(io("writing the template description"))?;
            let dest = self.dir.join(&meta.name);
            fs::rename(&staging, &dest).map_err(io(format!("installing {}", dest.display())))
        })();
        if let Err(e) = made {
            let _ = fs::remove_dir_all(&staging);
            return Err(e);
        }
        self.get(&meta.name)
    }

    /// Removes a built template (its description, and its gVisor copy if any); its layers
    /// stay with the team's cache.
    pub fn remove_built(&self, name: &str) {
        if self
            .get(name)
            .is_ok_and(|t| t.meta.kind == super::Kind::Built)
        {
            let _ = fs::remove_dir_all(self.dir.join(name));
        }
    }

    /// The layers some template stands on: its root's and its own. Errs when a template's
    /// description cannot be read, so that nothing is taken from under it.
    pub fn layers_in_use(&self) -> Result<std::collections::HashSet<String>> {
        #[derive(Deserialize)]
        struct Uses {
            #[serde(default)]
            id: String,
            #[serde(default)]
            layers: Vec<String>,
        }
        let mut used = std::collections::HashSet::new();
        let entries = fs::read_dir(&self.dir).map_err(io("listing the templates"))?;
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let dir = e.path();
            let meta = dir.join(META);
            let uses: Uses = match fs::read(&meta) {
                Ok(bytes) => serde_json::from_slice(&bytes).map_err(|err| {
                    Error::internal(format!("{} does not parse: {err}", meta.display()))
                })?,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                Err(err) => return Err(Error::io(format!("reading {}", meta.display()), err)),
            };
            used.extend(uses.layers);
            used.insert(format!("root-{}", uses.id));
            if let Ok(target) = fs::read_link(dir.join(ROOTFS))
                && let Ok(id) = target.strip_prefix(Path::new("..").join(LAYERS))
            {
                used.insert(id.to_string_lossy().into_owned());
            }
        }
        Ok(used)
    }

    /// The layers there are (not those being written), by id.
    pub fn layer_ids(&self) -> Vec<String> {
        fs::read_dir(self.dir.join(LAYERS))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect()
    }

    /// Removes a layer (a link, for a root kept elsewhere, is removed, not followed).
    pub fn remove_layer(&self, id: &str) -> Result<()> {
        let path = self.layer_path(id);
        match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => fs::remove_dir_all(&path),
            Ok(_) => fs::remove_file(&path),
            Err(_) => Ok(()),
        }
        .map_err(io(format!("removing {}", path.display())))
    }

    /// Removes layers an interrupted commit left half-written.
    pub(super) fn clean_new_layers(&self) {
        for e in fs::read_dir(self.dir.join(LAYERS))
            .into_iter()
            .flatten()
            .flatten()
        {
            if e.file_name().to_string_lossy().starts_with(NEW_LAYER) {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
}
