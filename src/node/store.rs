//! The node's index on disk: claims (with their instances), checkpoints and lost claims,
//! rewritten atomically whenever they change. Writes are coalesced by a background task so a
//! claim never waits for the disk.

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use super::runtime::Instance;
use crate::fsx;
use crate::model::{CheckpointRecord, Error, LostClaim, Result, SandboxRecord};

pub const INDEX_VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
#[serde(bound = "H: Serialize + DeserializeOwned")]
pub struct PersistedClaim<H> {
    pub record: SandboxRecord,
    pub instance: Instance<H>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(bound = "H: Serialize + DeserializeOwned")]
pub struct IndexFile<H> {
    pub version: u32,
    pub node: String,
    pub claims: Vec<PersistedClaim<H>>,
    pub checkpoints: Vec<CheckpointRecord>,
    pub lost: Vec<LostClaim>,
}

impl<H: Serialize + DeserializeOwned> IndexFile<H> {
    pub fn load(path: &std::path::Path) -> Result<Option<Self>> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
        };
        let index: IndexFile<H> = serde_json::from_slice(&bytes)
            .map_err(|e| Error::internal(format!("{} is not a node index: {e}", path.display())))?;
        if index.version != INDEX_VERSION {
            return Err(Error::internal(format!(
                "{} has index version {}, this node understands {INDEX_VERSION}",
                path.display(),
                index.version
            )));
        }
        Ok(Some(index))
    }

    pub fn save(&self, path: &std::path::Path) -> Result<()> {
        let bytes = serde_json::to_vec(self)
            .map_err(|e| Error::internal(format!("encoding the node index: {e}")))?;
        fsx::write_atomic(path, &bytes)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))
    }
}
