//! Where an instance lives. The node owns pools, leases and checkpoints; a runtime only boots,
//! freezes, copies and destroys instances. The default is `process`; a microVM runtime can
//! implement the same trait.

pub mod cgroup;
pub mod process;
pub mod sys;

use std::future::Future;
use std::path::{Path, PathBuf};

use serde::{Serialize, de::DeserializeOwned};

use crate::model::{PoolKey, Result};

/// A running instance: its state directory, its agent's address, and the runtime's handle.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
#[serde(bound = "H: Serialize + DeserializeOwned")]
pub struct Instance<H> {
    pub id: String,
    pub dir: PathBuf,
    pub address: String,
    pub handle: H,
}

pub struct BootSpec<'a> {
    pub instance_id: &'a str,
    pub key: &'a PoolKey,
    /// The directory the instance's state is copied from (a template or a checkpoint).
    pub seed: &'a Path,
    /// The instance's own state directory; must not exist yet.
    pub dir: &'a Path,
}

/// Resource use of an instance at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub cpu_ns: u64,
    pub mem_bytes: u64,
    pub processes: u32,
}

pub trait Runtime: Send + Sync + 'static {
    type Handle: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static;

    fn name(&self) -> &'static str;

    fn boot(
        &self,
        spec: BootSpec<'_>,
    ) -> impl Future<Output = Result<Instance<Self::Handle>>> + Send;

    /// Stops the instance and removes everything it had, including its state directory.
    fn destroy(&self, inst: &Instance<Self::Handle>) -> impl Future<Output = Result<()>> + Send;

    fn pause(&self, inst: &Instance<Self::Handle>) -> impl Future<Output = Result<()>> + Send;

    fn resume(&self, inst: &Instance<Self::Handle>) -> impl Future<Output = Result<()>> + Send;

    /// Copies the instance's state into `dest` (which must not exist), consistent as of one
    /// moment; returns the bytes copied. `paused` says whether the instance is paused now.
    fn capture(
        &self,
        inst: &Instance<Self::Handle>,
        paused: bool,
        dest: &Path,
    ) -> impl Future<Output = Result<u64>> + Send;

    fn usage(&self, inst: &Instance<Self::Handle>) -> impl Future<Output = Result<Usage>> + Send;

    fn is_alive(&self, inst: &Instance<Self::Handle>) -> bool;

    /// Removes whatever an earlier run of this node left behind (processes, cgroups).
    fn reclaim_orphans(&self) -> impl Future<Output = ()> + Send;
}
