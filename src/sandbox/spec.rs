//! What a node tells a sandbox's supervisor to build: written by the node as `boot.json` in the
//! instance directory, read by `sandbox-gateway agent --boot`. Paths are absolute on the host;
//! everything the sandbox itself sees is derived from them inside the boundary.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::{Error, Result};

/// The port envd listens on inside every sandbox, as on e2b.
pub const ENVD_PORT: u16 = 49983;
/// The abstract Unix socket name on which a built-in sandbox's agent also serves envd, in the
/// sandbox's network namespace (the node dials it instead of the port; see `agent`).
pub const ENVD_ABSTRACT_SOCKET: &str = "sandbox-gateway-envd";

/// Names inside an instance directory. The supervisor works relative to the directory, so that
/// the sandbox's unprivileged root never has to walk the host path above it.
pub mod layout {
    /// The sandbox's writable layer: an ext4 image holding `upper/` and `work/`.
    pub const DISK_IMAGE: &str = "disk.img";
    /// Where the disk image is mounted (inside the supervisor's mount namespace only).
    pub const DISK_MOUNT: &str = "disk";
    /// Where the template's root filesystem is bound read-only.
    pub const LOWER: &str = "lower";
    /// Where a built template's layers are bound read-only: `layers/0` is the top one.
    pub const LAYERS: &str = "layers";
    /// Where the host's `/usr` is bound read-only for templates composed from it.
    pub const HOST_USR: &str = "host-usr";
    /// The overlay's mount point: the sandbox's root.
    pub const ROOT: &str = "root";
    pub const BOOT_SPEC: &str = "boot.json";
}

/// How a template's root filesystem is completed at boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RootKind {
    /// A complete root filesystem (built from Debian packages or imported from an image).
    Complete,
    /// Its own `/etc`, `/home` and `/tmp`, with the host's `/usr` bound read-only over `/usr`.
    HostUsr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Net {
    /// Loopback only.
    None,
    /// The internet through user-mode networking; the host's loopback and private ranges are
    /// unroutable.
    Egress,
}

impl Net {
    pub fn parse(net: &str) -> Result<Net> {
        match net {
            "none" | "" => Ok(Net::None),
            "egress" => Ok(Net::Egress),
            other => Err(Error::invalid(format!("unknown net {other:?}"))),
        }
    }
}

/// The user namespace mapping: sandbox ids `0..count` are host ids `base..base+count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMap {
    pub base: u32,
    pub count: u32,
}

impl IdMap {
    pub const COUNT: u32 = 65536;

    pub fn new(base: u32) -> Result<IdMap> {
        if base == 0 || base.checked_add(Self::COUNT).is_none() {
            return Err(Error::invalid(format!(
                "uid base {base} must be above 0 and leave room for {} ids",
                Self::COUNT
            )));
        }
        Ok(IdMap {
            base,
            count: Self::COUNT,
        })
    }

    /// The host id of a sandbox id, if it is mapped.
    pub fn host(&self, inner: u32) -> Option<u32> {
        (inner < self.count).then(|| self.base + inner)
    }

    /// The line written to `/proc/PID/uid_map` and `gid_map`.
    pub fn proc_line(&self) -> String {
        format!("0 {} {}\n", self.base, self.count)
    }
}

/// Everything the supervisor needs; the node writes it before starting the supervisor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BootSpec {
    pub instance_id: String,
    /// The instance directory (absolute), holding the disk image and the mount points.
    pub dir: PathBuf,
    /// The template's root filesystem, owned by the mapped ids.
    pub template_root: PathBuf,
    /// The layers a built template stacks over that root, top first (overlay upper format).
    #[serde(default)]
    pub template_layers: Vec<PathBuf>,
    pub root_kind: RootKind,
    pub ids: IdMap,
    pub net: Net,
    /// The hostname until a claim names the sandbox.
    pub hostname: String,
    /// The secret envd's `/init` requires; only the node knows it.
    pub init_token: String,
    /// The size tier, reported by envd's /metrics as totals.
    pub cpu_count: u32,
    pub memory_bytes: u64,
    /// slirp4netns for `Net::Egress`.
    pub slirp4netns: Option<PathBuf>,
    /// Destinations a sandbox with egress must never reach (CIDRs): private and local ranges
    /// and the host's own addresses.
    pub blocked: Vec<String>,
    /// What the sandbox runs beside envd (its template's services).
    #[serde(default)]
    pub services: Vec<super::services::Service>,
}

impl BootSpec {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(layout::BOOT_SPEC)
    }

    pub fn load(path: &Path) -> Result<BootSpec> {
        let bytes =
            std::fs::read(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| Error::invalid(format!("{} is not a boot spec: {e}", path.display())))
    }

    pub fn save(&self) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(self)
            .map_err(|e| Error::internal(format!("encoding the boot spec: {e}")))?;
        let path = Self::path(&self.dir);
        // It holds the agent's /init secret: only the host's root reads it.
        crate::fsx::write_atomic(&path, &bytes)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_maps_cover_one_range() {
        let m = IdMap::new(100_000).unwrap();
        assert_eq!(m.host(0), Some(100_000));
        assert_eq!(m.host(1000), Some(101_000));
        assert_eq!(m.host(65_536), None);
        assert_eq!(m.proc_line(), "0 100000 65536\n");
        assert!(IdMap::new(0).is_err());
        assert!(IdMap::new(u32::MAX - 10).is_err());
    }

    #[test]
    fn nets_parse() {
        assert_eq!(Net::parse("none").unwrap(), Net::None);
        assert_eq!(Net::parse("").unwrap(), Net::None);
        assert_eq!(Net::parse("egress").unwrap(), Net::Egress);
        assert!(Net::parse("host").is_err());
    }

    #[test]
    fn specs_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let spec = BootSpec {
            instance_id: "in_0123".into(),
            dir: dir.path().to_path_buf(),
            template_root: "/t/base/rootfs".into(),
            template_layers: Vec::new(),
            root_kind: RootKind::HostUsr,
            ids: IdMap::new(1_000_000).unwrap(),
            net: Net::Egress,
            hostname: "in-0123".into(),
            init_token: "secret".into(),
            cpu_count: 1,
            memory_bytes: 512 << 20,
            slirp4netns: Some("/usr/bin/slirp4netns".into()),
            blocked: vec!["10.0.0.0/8".into()],
            services: vec![super::super::services::Service::CodeInterpreter],
        };
        spec.save().unwrap();
        let back = BootSpec::load(&BootSpec::path(dir.path())).unwrap();
        assert_eq!(back.root_kind, RootKind::HostUsr);
        assert_eq!(back.net, Net::Egress);
        assert_eq!(back.ids, spec.ids);
        assert_eq!(back.services, spec.services);
        assert!(BootSpec::load(&dir.path().join("missing")).is_err());
    }
}
