//! Tenant volumes in a claimed sandbox: where a claim's mounts may come from (the node's volumes
//! directory only), and mounting them into the instance before it is handed out.

use std::path::{Path, PathBuf};

use super::Node;
use super::runtime::{Instance, Runtime, mount_in};
use crate::model::{Error, Result, VolumeMount};

/// Most volumes one sandbox mounts.
pub const MAX_MOUNTS: usize = 16;

/// Checks a claim's mounts against the node's volumes directory: every source must be a
/// directory below it (the dispatcher names them; nothing else of the node may be mounted),
/// every path an absolute, clean path, each once.
pub fn check(mounts: &[VolumeMount], volumes_dir: Option<&Path>) -> Result<()> {
    if mounts.is_empty() {
        return Ok(());
    }
    if mounts.len() > MAX_MOUNTS {
        return Err(Error::invalid(format!(
            "{} volume mounts; at most {MAX_MOUNTS} are allowed",
            mounts.len()
        )));
    }
    let root = volumes_dir.ok_or_else(|| {
        Error::invalid(
            "this node has no volumes directory (--volumes-dir), so it mounts no volumes",
        )
    })?;
    let mut paths = std::collections::BTreeSet::new();
    for m in mounts {
        if mount_in::mount_point(&m.path).is_none() {
            return Err(Error::invalid(format!(
                "volume {:?}: mount path {:?} must be absolute and clean (no \".\" or \"..\")",
                m.name, m.path
            )));
        }
        if !paths.insert(m.path.as_str()) {
            return Err(Error::invalid(format!(
                "mount path {:?} is given more than once",
                m.path
            )));
        }
        let source = PathBuf::from(&m.source);
        let below = source.is_absolute()
            && source.starts_with(root)
            && source
                .components()
                .all(|c| !matches!(c, std::path::Component::ParentDir));
        if !below || !source.is_dir() {
            return Err(Error::invalid(format!(
                "volume {:?} is not in this node's volumes directory",
                m.name
            )));
        }
    }
    Ok(())
}

impl<R: Runtime> Node<R> {
    /// Mounts `mounts` into an instance about to be handed out; one that cannot take them is
    /// destroyed rather than handed out without them.
    pub(super) async fn with_volumes(
        &self,
        inst: Result<Instance<R::Handle>>,
        mounts: &[VolumeMount],
    ) -> Result<Instance<R::Handle>> {
        let inst = inst?;
        for m in mounts {
            if let Err(e) = self
                .inner
                .runtime
                .mount_volume(&inst, Path::new(&m.source), &m.path)
                .await
            {
                self.destroy_later(inst, "a volume could not be mounted");
                return Err(e.context(format!("volume {:?}", m.name)));
            }
        }
        Ok(inst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(source: &Path, path: &str) -> VolumeMount {
        VolumeMount {
            name: "work".into(),
            path: path.into(),
            source: source.display().to_string(),
        }
    }

    #[test]
    fn sources_stay_in_the_volumes_directory() {
        let dir = tempfile::tempdir().unwrap();
        let vols = dir.path().join("volumes");
        let data = vols.join("team-a/vol_1/data");
        std::fs::create_dir_all(&data).unwrap();
        check(&[mount(&data, "/mnt/work")], Some(&vols)).unwrap();
        check(&[], None).unwrap();
        let outside = [
            dir.path().to_path_buf(),
            vols.join("team-a/vol_1/data/../../../.."),
            vols.join("team-a/missing"),
        ];
        for s in outside {
            assert!(
                check(&[mount(&s, "/mnt/work")], Some(&vols)).is_err(),
                "{s:?}"
            );
        }
        assert!(check(&[mount(&data, "/mnt/work")], None).is_err());
        assert!(check(&[mount(&data, "relative")], Some(&vols)).is_err());
        let twice = [mount(&data, "/mnt/a"), mount(&data, "/mnt/a")];
        assert!(check(&twice, Some(&vols)).is_err());
    }
}
