//! Imports an image built elsewhere: an archive from `docker save` (legacy `manifest.json`, or
//! the OCI layout newer Docker writes) or an OCI image layout tarball. Layers are applied in
//! order with their whiteouts; paths are unpacked with `tar`'s containment checks so that no
//! entry, link or symlink lands outside the new root. The image's `Env` and `WorkingDir`
//! become the template's; a user `user` (uid 1000) is added when the image has none, since
//! e2b runs commands as `user`.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use super::shift::{Shift, shift_tree};
use super::{Kind, Progress, TemplateMeta, new_meta};
use crate::model::{Error, Result};
use crate::sandbox::spec::{IdMap, RootKind};

#[derive(Deserialize)]
struct DockerManifest {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

#[derive(Deserialize)]
struct Descriptor {
    digest: String,
    #[serde(rename = "mediaType", default)]
    media_type: String,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct OciManifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Deserialize, Default)]
struct ImageConfig {
    #[serde(default)]
    config: Option<RunConfig>,
}

#[derive(Deserialize, Default)]
struct RunConfig {
    #[serde(rename = "Env", default)]
    env: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    working_dir: Option<String>,
}

fn bad(archive: &Path, why: impl std::fmt::Display) -> Error {
    Error::invalid(format!(
        "{} is not a usable image archive: {why}",
        archive.display()
    ))
}

fn read_json<T: for<'de> Deserialize<'de>>(archive: &Path, path: &Path) -> Result<T> {
    let bytes = fs::read(path).map_err(|e| bad(archive, format!("{}: {e}", path.display())))?;
    serde_json::from_slice(&bytes).map_err(|e| bad(archive, format!("{}: {e}", path.display())))
}

/// A blob path inside an OCI layout for a digest such as `sha256:abc…`.
fn blob(dir: &Path, archive: &Path, digest: &str) -> Result<PathBuf> {
    let (algo, hex) = digest
        .split_once(':')
        .ok_or_else(|| bad(archive, format!("digest {digest:?}")))?;
    let ok = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric());
    if !ok(algo) || !ok(hex) {
        return Err(bad(archive, format!("digest {digest:?}")));
    }
    Ok(dir.join("blobs").join(algo).join(hex))
}

/// The config and layer files of the image in the unpacked archive `dir`.
fn locate(dir: &Path, archive: &Path) -> Result<(PathBuf, Vec<PathBuf>)> {
    let inside = |rel: &str| -> Result<PathBuf> {
        let rel = Path::new(rel);
        if rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(bad(archive, format!("path {}", rel.display())));
        }
        Ok(dir.join(rel))
    };
    if dir.join("manifest.json").is_file() {
        let manifests: Vec<DockerManifest> = read_json(archive, &dir.join("manifest.json"))?;
        let m = manifests
            .into_iter()
            .next()
            .ok_or_else(|| bad(archive, "manifest.json lists no image"))?;
        let layers = m.layers.iter().map(|l| inside(l)).collect::<Result<_>>()?;
        return Ok((inside(&m.config)?, layers));
    }
    if dir.join("index.json").is_file() {
        let mut index: Index = read_json(archive, &dir.join("index.json"))?;
        // An index may point at a further index (one manifest per platform).
        for _ in 0..4 {
            let pick = index
                .manifests
                .iter()
                .find(|d| {
                    d.platform
                        .as_ref()
                        .is_none_or(|p| p.os == "linux" && p.architecture == "amd64")
                })
                .or(index.manifests.first())
                .ok_or_else(|| bad(archive, "index.json lists no manifest"))?;
            let path = blob(dir, archive, &pick.digest)?;
            if pick.media_type.contains("index") || pick.media_type.contains("manifest.list") {
                index = read_json(archive, &path)?;
                continue;
            }
            let m: OciManifest = read_json(archive, &path)?;
            let layers = m
                .layers
                .iter()
                .map(|l| blob(dir, archive, &l.digest))
                .collect::<Result<_>>()?;
            return Ok((blob(dir, archive, &m.config.digest)?, layers));
        }
        return Err(bad(archive, "index.json nests too deeply"));
    }
    Err(bad(
        archive,
        "neither manifest.json (docker save) nor index.json (OCI layout)",
    ))
}

/// A layer as a tar stream, gunzipped when it is compressed.
fn layer_reader(path: &Path, archive: &Path) -> Result<Box<dyn Read>> {
    let mut f = File::open(path).map_err(|e| bad(archive, format!("{}: {e}", path.display())))?;
    let mut magic = [0u8; 4];
    let n = f
        .read(&mut magic)
        .map_err(|e| Error::io("reading a layer", e))?;
    let f = File::open(path).map_err(|e| Error::io("reading a layer", e))?;
    match &magic[..n] {
        [0x1f, 0x8b, ..] => Ok(Box::new(flate2::read::GzDecoder::new(BufReader::new(f)))),
        [0x28, 0xb5, 0x2f, 0xfd] => Err(bad(
            archive,
            "zstd-compressed layers are not supported; save the image with gzip or uncompressed layers",
        )),
        _ => Ok(Box::new(BufReader::new(f))),
    }
}

/// The entry's path relative to the root, or None when it tries to leave it.
fn relative(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Removes `rel` under `root`, but only if its parent really is inside `root` (a symlinked
/// parent could point anywhere).
fn remove_inside(root: &Path, rel: &Path) -> Result<()> {
    let target = root.join(rel);
    let Some(parent) = target.parent() else {
        return Ok(());
    };
    let (Ok(parent), Ok(root)) = (parent.canonicalize(), root.canonicalize()) else {
        return Ok(()); // nothing there to remove
    };
    if !parent.starts_with(&root) {
        return Ok(());
    }
    let Some(name) = target.file_name() else {
        return Ok(());
    };
    let victim = parent.join(name);
    match fs::symlink_metadata(&victim) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(&victim),
        Ok(_) => fs::remove_file(&victim),
        Err(_) => Ok(()),
    }
    .map_err(|e| Error::io(format!("applying a whiteout for {}", rel.display()), e))
}

fn apply_layer(root: &Path, reader: Box<dyn Read>, archive: &Path) -> Result<()> {
    let mut tar = tar::Archive::new(reader);
    tar.set_preserve_permissions(true);
    tar.set_preserve_ownerships(true);
    tar.set_unpack_xattrs(false);
    tar.set_overwrite(true);
    let entries = tar
        .entries()
        .map_err(|e| bad(archive, format!("layer: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(archive, format!("layer entry: {e}")))?;
        let Ok(path) = entry.path().map(|p| p.into_owned()) else {
            continue;
        };
        let Some(rel) = relative(&path) else {
            continue; // ../ paths are dropped, never followed
        };
        let name = rel.file_name().map(|n| n.to_string_lossy().to_string());
        if let Some(name) = name.as_deref().filter(|n| n.starts_with(".wh.")) {
            let dir = rel.parent().unwrap_or(Path::new(""));
            if name == ".wh..wh..opq" {
                // Opaque: the directory's contents from earlier layers are hidden.
                if let Ok(children) = fs::read_dir(root.join(dir)) {
                    for c in children.flatten() {
                        remove_inside(root, &dir.join(c.file_name()))?;
                    }
                }
            } else {
                remove_inside(root, &dir.join(&name[4..]))?;
            }
            continue;
        }
        let ty = entry.header().entry_type();
        if ty.is_block_special() || ty.is_character_special() {
            continue; // a sandbox gets its devices at boot
        }
        if !ty.is_dir() {
            // A file replacing a directory of an earlier layer.
            if fs::symlink_metadata(root.join(&rel)).is_ok_and(|m| m.is_dir()) {
                remove_inside(root, &rel)?;
            }
        }
        entry
            .unpack_in(root)
            .map_err(|e| bad(archive, format!("unpacking {}: {e}", rel.display())))?;
    }
    Ok(())
}

/// Adds the e2b user (and the files a user needs) to an image that lacks it.
fn ensure_user(root: &Path) -> Result<()> {
    let io = |e| Error::io("adding the user `user`", e);
    let etc = root.join("etc");
    fs::create_dir_all(&etc).map_err(io)?;
    let passwd = etc.join("passwd");
    let text = fs::read_to_string(&passwd).unwrap_or_default();
    let shell = if root.join("bin/bash").exists() || root.join("usr/bin/bash").exists() {
        "/bin/bash"
    } else {
        "/bin/sh"
    };
    let mut text = text;
    if !text.lines().any(|l| l.starts_with("root:")) {
        text.insert_str(0, "root:x:0:0:root:/root:/bin/sh\n");
    }
    if !text.lines().any(|l| l.starts_with("user:")) {
        text.push_str(&format!("user:x:1000:1000::/home/user:{shell}\n"));
        let group = etc.join("group");
        let mut g = fs::read_to_string(&group).unwrap_or_else(|_| "root:x:0:\n".into());
        if !g.lines().any(|l| l.starts_with("user:")) {
            g.push_str("user:x:1000:\n");
        }
        fs::write(&group, g).map_err(io)?;
    }
    fs::write(&passwd, text).map_err(io)?;
    let home = root.join("home/user");
    fs::create_dir_all(&home).map_err(io)?;
    std::os::unix::fs::chown(&home, Some(1000), Some(1000)).map_err(io)?;
    for d in ["proc", "dev", "sys", "tmp", "root", "run"] {
        fs::create_dir_all(root.join(d)).map_err(io)?;
    }
    fs::set_permissions(root.join("tmp"), fs::Permissions::from_mode(0o1777)).map_err(io)?;
    Ok(())
}

pub fn import(
    archive: &Path,
    staging: &Path,
    name: &str,
    ids: IdMap,
    progress: Progress<'_>,
) -> Result<TemplateMeta> {
    let unpacked = staging.join("image");
    fs::create_dir_all(&unpacked).map_err(|e| Error::io("unpacking the archive", e))?;
    progress(&format!(
        "importing {} as template {name}",
        archive.display()
    ));
    let file =
        File::open(archive).map_err(|e| Error::io(format!("opening {}", archive.display()), e))?;
    let mut outer = tar::Archive::new(BufReader::new(file));
    outer
        .unpack(&unpacked)
        .map_err(|e| bad(archive, format!("the archive itself: {e}")))?;
    let (config_path, layers) = locate(&unpacked, archive)?;
    let root = staging.join(super::ROOTFS);
    let config = fs::read(&config_path).unwrap_or_default();
    let run = assemble(&root, &layers, &config, ids, archive, progress)?;
    let _ = fs::remove_dir_all(&unpacked);
    let mut meta = new_meta(
        name,
        Kind::Oci,
        RootKind::Complete,
        ids,
        format!("image archive {}", archive.display()),
    );
    meta.env = run.env;
    meta.workdir = run.workdir;
    Ok(meta)
}

/// What an image asks of the sandboxes made from it.
#[derive(Debug, Default)]
pub struct ImageRun {
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
}

/// Makes `root` from an image's `layers` (in order) and its `config` (JSON): the layers
/// applied with their whiteouts, the user `user` added, ids moved into the sandbox range.
/// `origin` names the image in errors.
pub fn assemble(
    root: &Path,
    layers: &[PathBuf],
    config: &[u8],
    ids: IdMap,
    origin: &Path,
    progress: Progress<'_>,
) -> Result<ImageRun> {
    fs::create_dir_all(root).map_err(|e| Error::io("creating the root", e))?;
    for (i, layer) in layers.iter().enumerate() {
        progress(&format!("  layer {}/{}", i + 1, layers.len()));
        apply_layer(root, layer_reader(layer, origin)?, origin)?;
    }
    let config: ImageConfig = serde_json::from_slice(config).unwrap_or_default();
    ensure_user(root)?;
    shift_tree(root, ids, Shift::In)
        .map_err(|e| Error::io("moving the template into the sandbox id range", e))?;
    let run = config.config.unwrap_or_default();
    Ok(ImageRun {
        env: run
            .env
            .unwrap_or_default()
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        workdir: run.working_dir.filter(|w| !w.is_empty()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_paths_stay_inside() {
        assert_eq!(
            relative(Path::new("./etc/passwd")),
            Some(PathBuf::from("etc/passwd"))
        );
        assert_eq!(
            relative(Path::new("/usr/bin")),
            Some(PathBuf::from("usr/bin"))
        );
        assert_eq!(relative(Path::new("a/../../etc")), None);
        let dir = tempfile::tempdir().unwrap();
        assert!(blob(dir.path(), dir.path(), "sha256:abc").is_ok());
        assert!(blob(dir.path(), dir.path(), "sha256:../../x").is_err());
        assert!(blob(dir.path(), dir.path(), "nocolon").is_err());
    }
}
