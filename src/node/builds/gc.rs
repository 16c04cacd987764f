//! Keeps what builds leave behind within a budget (`--build-cache-mib`): layers no template
//! stands on and no cache entry names are removed at once; while the teams' cached layers
//! (those no template uses) and uploads together exceed the budget, the least recently used
//! go first. Runs only while no build is under way, holding the records' write lock, so no
//! build starts meanwhile and no layer a build holds can be taken.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};

use super::Builds;
use crate::model::Result;
use crate::node::Node;
use crate::node::runtime::Runtime;
use crate::templates::TemplateStore;

/// How old a build layer nothing names must be before it is removed: another node sharing
/// the templates may be finishing the build that made it (its finalize layer is named only
/// once the template is installed).
const ORPHAN_AGE: Duration = Duration::from_secs(2 * 3600);

/// What one collection removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Collected {
    pub layers: usize,
    pub entries: usize,
    pub uploads: usize,
    pub bytes: u64,
}

/// Something the budget may remove, and when it was last used.
enum Candidate {
    Entry {
        file: usize,
        key: String,
        layer: String,
    },
    Upload(PathBuf),
}

impl Builds {
    /// Marks a team's cache entries used (a hit keeps them from being trimmed first).
    pub(super) fn touch(&self, team: &str, keys: &[String]) {
        if keys.is_empty() {
            return;
        }
        let _w = self.write_lock();
        if let Err(e) = self.records.touch_cached(team, keys) {
            tracing::warn!(error = %e, "could not mark a cache entry used");
        }
    }

    /// Marks an upload used.
    pub(super) fn touch_upload(path: &std::path::Path) {
        if let Ok(f) = std::fs::File::options().append(true).open(path) {
            let _ = f.set_modified(SystemTime::now());
        }
    }

    /// Removes what nothing uses (`released`: layers of a template just deleted, at once;
    /// other build layers once old), then trims to `budget` bytes; None when a build is under
    /// way (it runs after the build instead).
    pub(super) fn collect(
        &self,
        store: &TemplateStore,
        budget: u64,
        released: &HashSet<String>,
    ) -> Result<Option<Collected>> {
        let _w = self.write_lock();
        if !self.live().is_empty() {
            return Ok(None);
        }
        let in_use = store.layers_in_use()?;
        let mut caches = self.records.caches();
        let mut out = Collected::default();
        let size = |id: &str| crate::fsx::tree_disk_usage(&store.layer_path(id)).unwrap_or(0);

        // Entries whose layer is gone stand for nothing.
        let existing: HashSet<String> = store.layer_ids().into_iter().collect();
        let mut dirty = vec![false; caches.len()];
        for (i, (_, all)) in caches.iter_mut().enumerate() {
            let before = all.len();
            all.retain(|_, c| c.layer.as_ref().is_none_or(|l| existing.contains(l)));
            dirty[i] |= all.len() != before;
        }
        let named: HashSet<String> = caches
            .iter()
            .flat_map(|(_, all)| all.values().filter_map(|c| c.layer.clone()))
            .collect();
        let old = |id: &str| {
            std::fs::symlink_metadata(store.layer_path(id))
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > ORPHAN_AGE))
        };
        // Only build layers (`l-…`): a template's root layer is its own to remove, and may be
        // on its way into place.
        for id in existing.iter().filter(|id| {
            id.starts_with("l-")
                && !in_use.contains(*id)
                && !named.contains(*id)
                && (released.contains(*id) || old(id))
        }) {
            out.bytes += size(id);
            store.remove_layer(id)?;
            out.layers += 1;
        }

        // The budget: cached layers no template uses, and uploads; oldest first.
        let mut candidates: Vec<(DateTime<Utc>, u64, Candidate)> = Vec::new();
        for (file, (_, all)) in caches.iter().enumerate() {
            for (key, c) in all {
                let Some(layer) = c.layer.clone().filter(|l| !in_use.contains(l)) else {
                    continue;
                };
                let when = c.used_at.unwrap_or(DateTime::<Utc>::MIN_UTC);
                let candidate = Candidate::Entry {
                    file,
                    key: key.clone(),
                    layer: layer.clone(),
                };
                candidates.push((when, size(&layer), candidate));
            }
        }
        for path in self.records.uploads() {
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            let when = meta
                .modified()
                .map(DateTime::<Utc>::from)
                .unwrap_or(DateTime::<Utc>::MIN_UTC);
            candidates.push((when, meta.len(), Candidate::Upload(path)));
        }
        let mut total: u64 = candidates.iter().map(|c| c.1).sum();
        candidates.sort_by_key(|c| c.0);
        for (_, bytes, candidate) in candidates {
            if total <= budget {
                break;
            }
            match candidate {
                Candidate::Entry { file, key, layer } => {
                    caches[file].1.remove(&key);
                    dirty[file] = true;
                    out.entries += 1;
                    let still_named = caches
                        .iter()
                        .any(|(_, all)| all.values().any(|c| c.layer.as_deref() == Some(&layer)));
                    if !still_named {
                        store.remove_layer(&layer)?;
                        out.layers += 1;
                    }
                }
                Candidate::Upload(path) => {
                    std::fs::remove_file(&path).map_err(|e| {
                        crate::model::Error::io(format!("removing {}", path.display()), e)
                    })?;
                    out.uploads += 1;
                }
            }
            total = total.saturating_sub(bytes);
            out.bytes += bytes;
        }
        for ((path, all), dirty) in caches.iter().zip(dirty) {
            if dirty {
                self.records.save_cache(path, all)?;
            }
        }
        Ok(Some(out))
    }
}

impl<R: Runtime> Node<R> {
    /// Collects what builds left, in the background, logging what it removed; `released`
    /// are the layers of templates just deleted.
    pub(crate) fn collect_build_garbage(&self, released: HashSet<String>) {
        let node = self.clone();
        self.inner.tasks.spawn_blocking(move || {
            let budget = node.inner.cfg.build_cache_bytes;
            match node
                .builds()
                .collect(&node.inner.templates, budget, &released)
            {
                Ok(Some(c)) if c != Collected::default() => tracing::info!(
                    layers = c.layers,
                    cache_entries = c.entries,
                    uploads = c.uploads,
                    mib = c.bytes >> 20,
                    "removed what template builds left"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "could not collect what template builds left"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::builds::records::Cached;
    use crate::sandbox::spec::IdMap;
    use crate::templates::build::steps::Context;

    fn aged(path: &std::path::Path, secs: u64) {
        let f = std::fs::File::open(path).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(secs))
            .unwrap();
    }

    fn layer(store: &TemplateStore, id: &str, bytes: usize) {
        let dir = store.layer_path(id);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("data"), vec![7u8; bytes]).unwrap();
    }

    #[test]
    fn unused_layers_go_and_the_budget_takes_the_oldest_first() {
        let tmp = tempfile::tempdir().unwrap();
        let store =
            TemplateStore::new(tmp.path().join("templates"), IdMap::new(1 << 30).unwrap()).unwrap();
        let b = Builds::open(
            &tmp.path().join("data"),
            &tmp.path().join("templates"),
            1 << 20,
        )
        .unwrap();
        // A template standing on l-used; cache entries for l-old and l-new; orphans.
        let t = tmp.path().join("templates/tpl.abc");
        std::fs::create_dir_all(&t).unwrap();
        std::fs::write(
            t.join("template.json"),
            r#"{"id": "x", "layers": ["l-used"]}"#,
        )
        .unwrap();
        for (id, size) in [
            ("l-used", 65536),
            ("l-old", 65536),
            ("l-new", 65536),
            ("l-orphan", 4096),
            ("l-young", 4096),
            ("root-y", 4096),
        ] {
            layer(&store, id, size);
        }
        aged(&store.layer_path("l-orphan"), 3 * 3600);
        aged(&store.layer_path("root-y"), 3 * 3600);
        let entry = |layer: &str, age_s: i64| Cached {
            layer: Some(layer.into()),
            context: Context {
                user: "user".into(),
                workdir: None,
                env: Default::default(),
            },
            used_at: Some(Utc::now() - chrono::Duration::seconds(age_s)),
        };
        for (team, key, l, age) in [
            ("team", "k-used", "l-used", 9000),
            ("team", "k-old", "l-old", 600),
            ("other", "k-new", "l-new", 10),
            ("team", "k-gone", "l-missing", 1),
        ] {
            b.records.cache(team, key, entry(l, age)).unwrap();
        }
        let upload = b.records.files_staging("team").unwrap();
        std::fs::write(&upload, vec![1u8; 65536]).unwrap();
        let upload_kept = upload.with_file_name("abc123");
        std::fs::rename(&upload, &upload_kept).unwrap();
        aged(&upload_kept, 60);

        // Within budget: only what nothing names (and is old enough) goes.
        let c = b
            .collect(&store, 1 << 30, &HashSet::new())
            .unwrap()
            .unwrap();
        assert_eq!((c.layers, c.entries, c.uploads), (1, 0, 0));
        assert!(!store.layer_path("l-orphan").exists());
        for kept in ["l-young", "root-y", "l-used", "l-old", "l-new"] {
            assert!(store.layer_path(kept).exists(), "{kept}");
        }
        assert!(
            b.records.cached("team", "k-gone").is_none(),
            "an entry without its layer"
        );

        // Over budget: the oldest cached layer, then the upload; never a used layer.
        let c = b
            .collect(&store, 100 << 10, &HashSet::new())
            .unwrap()
            .unwrap();
        assert_eq!((c.layers, c.entries, c.uploads), (1, 1, 1));
        assert!(!store.layer_path("l-old").exists());
        assert!(b.records.cached("team", "k-old").is_none());
        assert!(!upload_kept.exists());
        assert!(store.layer_path("l-new").exists());
        assert!(store.layer_path("l-used").exists());
        assert!(b.records.cached("team", "k-used").is_some());

        // Nothing is collected while a build is under way.
        b.live().insert(
            "build".into(),
            std::sync::Arc::new(super::super::Live {
                log: Default::default(),
                cancel: Default::default(),
                template_id: "t".into(),
            }),
        );
        assert_eq!(b.collect(&store, 0, &HashSet::new()).unwrap(), None);
        assert!(store.layer_path("l-new").exists());
    }
}
