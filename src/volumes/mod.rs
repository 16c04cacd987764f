//! Tenants' volumes (e2b `Volume`): named directories that outlive sandboxes, kept under one
//! directory (`--volumes-dir`; shared storage such as an NFS export when a fleet's nodes mount
//! them) as `<tenant>/<id>/volume.json` and `<tenant>/<id>/data/`, with a name taken by an
//! exclusively created `<tenant>/names/<name>`. On one machine each volume's `data` is a file
//! system of its own (`image`). The content API reaches a volume with a bearer token bound to
//! its tenant and id (HMAC-SHA256 under a key of the gateway's own).

pub mod content;
pub mod image;

use std::io;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::model::{Error, Result, ids};
use crate::sandbox::spec::IdMap;

/// Most volumes one tenant keeps.
pub const MAX_VOLUMES: usize = 1000;
const NAMES: &str = "names";
const META: &str = "volume.json";
const DATA: &str = "data";
const TOKEN_PREFIX: &str = "vt1.";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    pub id: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

/// Every tenant's volumes under one directory.
pub struct VolumeStore {
    dir: PathBuf,
    key: Vec<u8>,
    ids: IdMap,
    /// Each volume's size and how its file system is made, when volumes are images.
    images: Option<Images>,
}

/// Volumes as file systems of their own (`image`).
#[derive(Debug, Clone)]
struct Images {
    bytes: u64,
    mkfs: PathBuf,
}

impl std::fmt::Debug for VolumeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeStore")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// e2b's volume names: `^[a-zA-Z0-9_-]+$` (at most 128 here).
pub fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "volume name {name:?} must be 1-128 letters, digits, '_' or '-'"
        )))
    }
}

fn valid_id(id: &str) -> bool {
    id.strip_prefix("vol_")
        .is_some_and(|h| !h.is_empty() && h.len() <= 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A tenant's directory name (namespaces are DNS labels; anything else is refused).
fn tenant_dir(tenant: &str) -> Result<&str> {
    let ok = !tenant.is_empty()
        && tenant.len() <= 253
        && !tenant.starts_with('.')
        && tenant
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
    if ok {
        Ok(tenant)
    } else {
        Err(Error::invalid(format!(
            "tenant {tenant:?} cannot own volumes"
        )))
    }
}

fn io_err(what: impl std::fmt::Display) -> impl FnOnce(io::Error) -> Error {
    move |e| Error::io(what, e)
}

impl VolumeStore {
    /// The store in `dir` (made when missing); tokens are signed with the secret in
    /// `key_file` (made when missing); files belong to the sandbox ids `ids` shifts. With
    /// `image_bytes` every new volume is a file system of that size, and the existing ones are
    /// mounted now.
    pub fn open(
        dir: &Path,
        key_file: &Path,
        ids: IdMap,
        image_bytes: Option<u64>,
    ) -> Result<(VolumeStore, bool)> {
        std::fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let (key, made) = crate::fsx::load_or_create_secret(key_file, || ids::random_hex(32))
            .map_err(io_err(format!("volume token key {}", key_file.display())))?;
        let images = match image_bytes {
            Some(bytes) => Some(Images {
                bytes,
                mkfs: crate::node::runtime::disk::find_mkfs()
                    .map_err(io_err("volumes of their own size"))?,
            }),
            None => None,
        };
        let store = VolumeStore {
            dir: dir.to_path_buf(),
            key: key.trim().as_bytes().to_vec(),
            ids,
            images,
        };
        store.mount_all()?;
        Ok((store, made))
    }

    /// Every volume directory (`<tenant>/<id>`) in the store.
    fn volume_dirs(&self) -> Vec<PathBuf> {
        let Ok(tenants) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        tenants
            .flatten()
            .filter_map(|t| std::fs::read_dir(t.path()).ok())
            .flat_map(|vols| vols.flatten())
            .filter(|v| v.file_name().to_str().is_some_and(valid_id))
            .map(|v| v.path())
            .collect()
    }

    /// Mounts every volume that has an image (a store of plain directories has none).
    fn mount_all(&self) -> Result<()> {
        for vdir in self.volume_dirs() {
            let img = vdir.join(image::IMAGE);
            if img.exists() {
                image::mount_at(&img, &vdir.join(DATA))
                    .map_err(io_err(format!("mounting volume {}", vdir.display())))?;
            }
        }
        Ok(())
    }

    /// Unmounts every volume's file system (the gateway is stopping); the images stay.
    pub fn unmount_all(&self) {
        for vdir in self.volume_dirs() {
            if let Err(e) = image::unmount(&vdir.join(DATA)) {
                tracing::warn!(volume = %vdir.display(), error = %e, "could not unmount a volume");
            }
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn volume_dir(&self, tenant: &str, id: &str) -> Result<PathBuf> {
        if !valid_id(id) {
            return Err(Error::not_found(format!("volume {id:?} not found")));
        }
        Ok(self.dir.join(tenant_dir(tenant)?).join(id))
    }

    /// Where the volume's files are (what sandboxes mount).
    pub fn data_dir(&self, tenant: &str, id: &str) -> Result<PathBuf> {
        Ok(self.volume_dir(tenant, id)?.join(DATA))
    }

    pub fn create(&self, tenant: &str, name: &str) -> Result<Volume> {
        validate_name(name)?;
        let tenant_root = self.dir.join(tenant_dir(tenant)?);
        let names = tenant_root.join(NAMES);
        std::fs::create_dir_all(&names).map_err(io_err("creating the volume index"))?;
        if self.list(tenant)?.len() >= MAX_VOLUMES {
            return Err(Error::invalid(format!(
                "a team keeps at most {MAX_VOLUMES} volumes; delete some first"
            )));
        }
        let volume = Volume {
            id: format!("vol_{}", ids::random_hex(8)),
            name: name.to_string(),
            created_at: Utc::now(),
        };
        // The name is taken first, exclusively: two creates of one name cannot both win.
        let claim = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(names.join(name));
        match claim {
            Ok(mut f) => {
                use std::io::Write;
                f.write_all(volume.id.as_bytes())
                    .map_err(io_err("recording the volume's name"))?;
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(Error::invalid(format!(
                    "Volume with name '{name}' already exists"
                )));
            }
            Err(e) => return Err(Error::io("recording the volume's name", e)),
        }
        let made = (|| -> Result<()> {
            let vdir = tenant_root.join(&volume.id);
            let data = vdir.join(DATA);
            std::fs::create_dir_all(&data).map_err(io_err("creating the volume"))?;
            if let Some(images) = &self.images {
                let img = vdir.join(image::IMAGE);
                image::make(&images.mkfs, &img, images.bytes)
                    .map_err(io_err("making the volume's file system"))?;
                image::mount_at(&img, &data).map_err(io_err("mounting the volume"))?;
                // A fresh ext4 has lost+found, which no e2b volume shows.
                let _ = std::fs::remove_dir(data.join("lost+found"));
            }
            // Its top belongs to the sandbox user, so that `user` can write where it is mounted.
            let owner = self
                .ids
                .host(content::DEFAULT_OWNER)
                .unwrap_or(self.ids.base);
            std::os::unix::fs::chown(&data, Some(owner), Some(owner))
                .map_err(io_err("giving the volume to the sandbox user"))?;
            let meta = serde_json::to_vec(&volume)
                .map_err(|e| Error::internal(format!("encoding a volume: {e}")))?;
            crate::fsx::write_atomic(&vdir.join(META), &meta)
                .map_err(io_err("recording the volume"))
        })();
        if let Err(e) = made {
            let _ = image::unmount(&tenant_root.join(&volume.id).join(DATA));
            let _ = std::fs::remove_dir_all(tenant_root.join(&volume.id));
            let _ = std::fs::remove_file(names.join(name));
            return Err(e);
        }
        Ok(volume)
    }

    pub fn get(&self, tenant: &str, id: &str) -> Result<Volume> {
        let path = self.volume_dir(tenant, id)?.join(META);
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Error::not_found(format!("volume {id:?} not found")));
            }
            Err(e) => return Err(Error::io("reading a volume", e)),
        };
        serde_json::from_slice(&text)
            .map_err(|e| Error::internal(format!("volume {id} is unreadable: {e}")))
    }

    /// The tenant's volume called `name`.
    pub fn resolve(&self, tenant: &str, name: &str) -> Result<Volume> {
        validate_name(name)?;
        let path = self.dir.join(tenant_dir(tenant)?).join(NAMES).join(name);
        let id = std::fs::read_to_string(&path)
            .map_err(|_| Error::not_found(format!("volume {name:?} not found")))?;
        self.get(tenant, id.trim())
    }

    /// The tenant's volumes, by name.
    pub fn list(&self, tenant: &str) -> Result<Vec<Volume>> {
        let root = self.dir.join(tenant_dir(tenant)?);
        let entries = match std::fs::read_dir(&root) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io("listing volumes", e)),
        };
        let mut out: Vec<Volume> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| valid_id(n))
            .filter_map(|id| self.get(tenant, &id).ok())
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Removes the volume and everything in it (its name is free again).
    pub fn delete(&self, tenant: &str, id: &str) -> Result<()> {
        let volume = self.get(tenant, id)?;
        let vdir = self.volume_dir(tenant, id)?;
        // The record goes first: a half-removed volume is never listed again.
        std::fs::remove_file(vdir.join(META)).map_err(io_err("removing a volume"))?;
        let _ = std::fs::remove_file(self.dir.join(tenant).join(NAMES).join(&volume.name));
        // Its file system goes from the gateway's view; sandboxes that mount it keep it until
        // they end, and the image's space is freed then.
        image::unmount(&vdir.join(DATA)).map_err(io_err("unmounting a volume"))?;
        // remove_dir_all does not follow symbolic links a sandbox left in the volume.
        std::fs::remove_dir_all(&vdir).map_err(io_err("removing a volume's files"))
    }

    fn mac(&self, tenant: &str, id: &str) -> Result<Hmac<Sha256>> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key)
            .map_err(|e| Error::internal(format!("volume token key: {e}")))?;
        mac.update(tenant.as_bytes());
        mac.update(b"\n");
        mac.update(id.as_bytes());
        Ok(mac)
    }

    /// The bearer token that opens the tenant's volume `id` to the content API.
    pub fn token(&self, tenant: &str, id: &str) -> Result<String> {
        use base64::Engine;
        let tag = self.mac(tenant, id)?.finalize().into_bytes();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        Ok(format!(
            "{TOKEN_PREFIX}{}.{}",
            b64.encode(format!("{tenant}\n{id}")),
            b64.encode(tag)
        ))
    }

    /// The tenant a valid token for volume `id` was made for (None: not one).
    pub fn check_token(&self, token: &str, id: &str) -> Option<String> {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let (who, tag) = token.strip_prefix(TOKEN_PREFIX)?.split_once('.')?;
        let who = String::from_utf8(b64.decode(who).ok()?).ok()?;
        let (tenant, for_id) = who.split_once('\n')?;
        if for_id != id {
            return None;
        }
        let tag = b64.decode(tag).ok()?;
        self.mac(tenant, id).ok()?.verify_slice(&tag).ok()?;
        Some(tenant.to_string())
    }

    /// The volume's files, for the content API.
    pub fn files(&self, tenant: &str, id: &str) -> Result<content::Root> {
        self.get(tenant, id)?;
        content::Root::open(&self.data_dir(tenant, id)?, self.ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, VolumeStore) {
        let d = tempfile::tempdir().unwrap();
        let (s, made) = VolumeStore::open(
            &d.path().join("volumes"),
            &d.path().join("key"),
            IdMap::new(100_000).unwrap(),
            None,
        )
        .unwrap();
        assert!(made);
        (d, s)
    }

    #[test]
    fn volumes_are_named_once_per_tenant_and_kept_on_disk() {
        if !nix::unistd::geteuid().is_root() {
            return; // the data directory is given to the sandbox user
        }
        let (d, s) = store();
        let v = s.create("team-a", "work").unwrap();
        assert!(valid_id(&v.id));
        let dup = s.create("team-a", "work").unwrap_err();
        assert!(dup.message.contains("already exists"), "{}", dup.message);
        let theirs = s.create("team-b", "work").unwrap();
        assert_eq!(s.list("team-a").unwrap(), vec![v.clone()]);
        assert_eq!(s.resolve("team-a", "work").unwrap(), v);
        assert!(
            s.get("team-b", &v.id).is_err(),
            "another team's id is not found"
        );
        assert!(s.create("team-a", "bad name").is_err());
        assert!(s.create("../x", "n").is_err());
        // A second store on the same directory (a restart) sees the same volumes.
        let (again, made) = VolumeStore::open(
            &d.path().join("volumes"),
            &d.path().join("key"),
            IdMap::new(100_000).unwrap(),
            None,
        )
        .unwrap();
        assert!(!made);
        assert_eq!(again.get("team-a", &v.id).unwrap(), v);
        s.delete("team-a", &v.id).unwrap();
        assert!(s.get("team-a", &v.id).is_err() && s.list("team-a").unwrap().is_empty());
        s.create("team-a", "work").unwrap();
        assert!(s.get("team-b", &theirs.id).is_ok());
    }

    #[test]
    fn a_token_opens_one_volume_of_one_tenant() {
        let (_d, s) = store();
        let t = s.token("team-a", "vol_0123456789abcdef").unwrap();
        assert_eq!(
            s.check_token(&t, "vol_0123456789abcdef").as_deref(),
            Some("team-a")
        );
        assert_eq!(
            s.check_token(&t, "vol_fedcba9876543210"),
            None,
            "another volume"
        );
        let forged = t.replace(
            &base64::Engine::encode(
                &base64::engine::general_purpose::URL_SAFE_NO_PAD,
                "team-a\nvol_0123456789abcdef",
            ),
            &base64::Engine::encode(
                &base64::engine::general_purpose::URL_SAFE_NO_PAD,
                "team-b\nvol_0123456789abcdef",
            ),
        );
        assert_eq!(
            s.check_token(&forged, "vol_0123456789abcdef"),
            None,
            "another tenant"
        );
        assert_eq!(s.check_token("vt1.x.y", "vol_0123456789abcdef"), None);
        assert_eq!(s.check_token("", "vol_0123456789abcdef"), None);
    }

    #[test]
    fn a_volume_is_a_file_system_of_its_own_size_and_is_mounted_again_on_open() {
        let root = crate::node::runtime::sys::is_root();
        if !root || !Path::new("/dev/loop-control").exists() {
            println!("skipped: volume images need root and loop devices");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let open = || {
            VolumeStore::open(
                &d.path().join("volumes"),
                &d.path().join("key"),
                IdMap::new(100_000).unwrap(),
                Some(8 << 20),
            )
            .unwrap()
            .0
        };
        let s = open();
        let v = s.create("team-a", "sized").unwrap();
        let data = s.data_dir("team-a", &v.id).unwrap();
        assert!(image::is_mounted(&data).unwrap());
        assert!(!data.join("lost+found").exists());
        std::fs::write(data.join("small"), b"kept").unwrap();
        let big = std::fs::write(data.join("big"), vec![7u8; 9 << 20]).unwrap_err();
        assert_eq!(big.raw_os_error(), Some(libc::ENOSPC), "{big}");
        s.unmount_all();
        assert!(!image::is_mounted(&data).unwrap());
        let again = open();
        assert!(image::is_mounted(&data).unwrap());
        assert_eq!(std::fs::read(data.join("small")).unwrap(), b"kept");
        again.delete("team-a", &v.id).unwrap();
        assert!(!data.exists());
        let img = d
            .path()
            .join("volumes/team-a")
            .join(&v.id)
            .join(image::IMAGE);
        assert!(!crate::sandbox::loopdev::attached_backing_files().contains(&img));
    }
}
