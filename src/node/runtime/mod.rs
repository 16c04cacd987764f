//! Where an instance lives. The node owns pools, leases and checkpoints; a runtime only boots,
//! freezes, captures, reaches and destroys instances. The default is `builtin` (Linux
//! namespaces, cgroups, seccomp); others implement the same trait.

pub mod any;
pub mod builtin;
pub mod cgroup;
pub mod dial;
pub mod disk;
pub mod gvisor;
pub mod mount_in;
pub mod reaper;
pub mod sys;

use std::future::Future;
use std::path::{Path, PathBuf};

use serde::{Serialize, de::DeserializeOwned};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::model::network::Egress;
use crate::model::{Error, PoolKey, Result};
use crate::templates::Template;

/// `what` did not become ready within `timeout` (the node's `--boot-timeout-seconds`). A host
/// too loaded to boot in time is out of room for now, not broken: "no capacity" lets the
/// dispatcher try another node and tells the client to come back (503 with Retry-After).
/// Every runtime's boot, restore and helper start answers its timeout with this.
pub fn boot_too_slow(what: impl std::fmt::Display, timeout: std::time::Duration) -> Error {
    Error::no_capacity(format!(
        "{what} was not ready within {timeout:?}; the node is too busy to boot a sandbox now"
    ))
}

/// A byte stream into an instance (TCP into its network namespace, or its door socket).
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}
pub type Conn = Box<dyn Io>;

/// A running instance: its directory on the node and the runtime's handle.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
#[serde(bound = "H: Serialize + DeserializeOwned")]
pub struct Instance<H> {
    pub id: String,
    pub dir: PathBuf,
    /// Where the instance can be reached, when that is an address (empty when only `dial`
    /// reaches it).
    pub address: String,
    pub handle: H,
    /// The sandbox's log ring (not persisted: a restarted node starts a new one).
    #[serde(skip)]
    pub logs: crate::node::logs::Logs,
    /// A connection to its agent, opened while it waits warm (see `AgentLine`).
    #[serde(skip)]
    pub agent: AgentLine,
}

/// A connection to a warm instance's agent, and the template it booted from, kept by the
/// refill so that its claim neither dials nor reads the template (in the claim's wake, and
/// competing with the claims after it) to hand the agent its identity. Taken once; a claim
/// that finds none, or finds the connection broken, does both.
#[derive(Clone, Default)]
pub struct AgentLine(std::sync::Arc<std::sync::Mutex<Option<(Conn, Template)>>>);

impl AgentLine {
    pub fn put(&self, conn: Conn, template: Template) {
        if let Ok(mut line) = self.0.lock() {
            *line = Some((conn, template));
        }
    }

    pub fn take(&self) -> Option<(Conn, Template)> {
        self.0.lock().ok()?.take()
    }
}

impl std::fmt::Debug for AgentLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentLine")
    }
}

pub struct BootSpec<'a> {
    pub instance_id: &'a str,
    pub key: &'a PoolKey,
    pub template: &'a Template,
    /// A directory a `capture` filled (a checkpoint's or a fork's) to start from; a fresh
    /// instance of the template when None.
    pub seed: Option<&'a Path>,
    /// The instance's own directory; must not exist yet.
    pub dir: &'a Path,
    /// Egress rules in force before any of the instance's processes run (a restored
    /// instance's resume at once); None for a pool's instances, which get theirs at claim.
    pub egress: Option<&'a Egress>,
    /// A build step's instance: what it writes is committed as a layer (see `commit`), so a
    /// runtime that keeps writes elsewhere puts them where `commit` reads them.
    pub build: bool,
    /// Volumes mounted read-write before the instance runs, for runtimes that cannot mount
    /// into a running one (`mounts_volumes_live` false); the others never get any here (the
    /// node mounts theirs with `mount_volume`).
    pub volumes: &'a [crate::model::VolumeMount],
}

/// Resource use of an instance at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub cpu_ns: u64,
    pub mem_bytes: u64,
    pub processes: u32,
    /// False when the numbers are not measurements.
    pub measured: bool,
    pub disk_used: u64,
    pub disk_total: u64,
    /// Processes the kernel killed for exceeding the memory limit.
    pub oom_kills: u64,
}

pub trait Runtime: Send + Sync + 'static {
    type Handle: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static;

    fn name(&self) -> &'static str;

    /// What isolates what, for the startup log.
    fn describe(&self) -> String;

    /// Whether capture and boots from a capture keep the memory (the processes continue) of
    /// instances with this net, not only their files.
    fn captures_memory(&self, _net: &str) -> bool {
        false
    }

    /// Ok when a `capture` of a paused instance holds its files apart from its processes and
    /// `boot` from it starts fresh processes over them (a filesystem-only pause); else why not.
    fn captures_files(&self) -> Result<()> {
        Err(Error::invalid(format!(
            "a filesystem-only pause (memory: false) is not available on the {} runtime; pause with memory instead",
            self.name()
        )))
    }

    /// Whether `set_egress` (and `BootSpec::egress`) can be enforced here.
    fn enforces_egress(&self) -> bool {
        false
    }

    /// Whether egress rules may allow domain names here (an egress proxy sees the name each
    /// connection carries).
    fn proxies_egress(&self) -> bool {
        false
    }

    /// Puts the instance's egress rules in force (None lifts them); they reach open
    /// connections' next packets. A paused instance gets them before it runs again.
    fn set_egress(
        &self,
        _inst: &Instance<Self::Handle>,
        _egress: Option<&Egress>,
    ) -> impl Future<Output = Result<()>> + Send {
        async {
            Err(Error::invalid(
                "this node's runtime cannot enforce network policies",
            ))
        }
    }

    /// The PEM of the CA the instance's egress proxy signs intercepted hosts' certificates
    /// with (made on first use, one per instance, gone with it); only runtimes with a proxy.
    fn egress_ca(&self, inst: &Instance<Self::Handle>) -> Result<String> {
        Err(Error::invalid(format!(
            "sandbox {}'s runtime has no egress proxy to intercept with",
            inst.id
        )))
    }

    /// Whether `mount_volume` works on a running instance (a warm one can be handed out with
    /// volumes); else they are mounted at boot (`BootSpec::volumes`).
    fn mounts_volumes_live(&self) -> bool {
        false
    }

    /// Mounts the host directory `source` (a volume's data) read-write at `target` inside the
    /// running instance.
    fn mount_volume(
        &self,
        inst: &Instance<Self::Handle>,
        _source: &Path,
        _target: &str,
    ) -> impl Future<Output = Result<()>> + Send {
        let id = inst.id.clone();
        async move {
            Err(Error::invalid(format!(
                "sandbox {id}'s runtime cannot mount volumes into a running sandbox; they are mounted when one boots"
            )))
        }
    }

    /// Readies a template just installed for boots, so that its first boot (a claim, with a
    /// deadline) finds the work done; gVisor copies it into a plain tree of the image's ids.
    fn prepare_template(&self, _t: &Template) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }

    fn boot(
        &self,
        spec: BootSpec<'_>,
    ) -> impl Future<Output = Result<Instance<Self::Handle>>> + Send;

    /// Stops the instance and removes everything it had, including its directory.
    fn destroy(&self, inst: &Instance<Self::Handle>) -> impl Future<Output = Result<()>> + Send;

    fn pause(&self, inst: &Instance<Self::Handle>) -> impl Future<Output = Result<()>> + Send;

    fn resume(&self, inst: &Instance<Self::Handle>) -> impl Future<Output = Result<()>> + Send;

    /// Readies a paused instance's resume once its pause has answered: nothing by default; a
    /// gVisor node starts the processes its restore will run in.
    fn ready_resume(
        &self,
        inst: &Instance<Self::Handle>,
    ) -> impl Future<Output = Result<()>> + Send {
        let _ = inst;
        async { Ok(()) }
    }

    /// Captures the instance's state into the directory `dest` (which must not exist),
    /// consistent as of one moment, so that `BootSpec::seed` can start copies of it; returns
    /// the bytes captured. `paused` says whether the instance is paused now.
    fn capture(
        &self,
        inst: &Instance<Self::Handle>,
        paused: bool,
        dest: &Path,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// `capture`, running `meanwhile` (boots from `dest`: a fork's children) as soon as
    /// `dest` is complete, or from the start where the runtime's boots wait for it (gVisor's
    /// make their containers meanwhile). A runtime that stops the instance to capture it
    /// brings it back alongside `meanwhile` instead of before it, so a fork waits for the
    /// longer of the two, not their sum. Answers the capture's result and `meanwhile`'s
    /// output if it ran (boots that started fail when nothing was captured; the caller
    /// releases what it made either way).
    fn capture_then<T: Send>(
        &self,
        inst: &Instance<Self::Handle>,
        paused: bool,
        dest: &Path,
        meanwhile: impl Future<Output = T> + Send,
    ) -> impl Future<Output = (Result<u64>, Option<T>)> + Send {
        async move {
            match self.capture(inst, paused, dest).await {
                Ok(size) => (Ok(size), Some(meanwhile.await)),
                Err(e) => (Err(e), None),
            }
        }
    }

    /// Saves the instance's files apart from its processes into the new directory `dest`, for
    /// a filesystem-only pause (see `captures_files`); the caller destroys the instance after.
    /// `frozen` says it is paused already. By default it is frozen and `capture`d; on failure
    /// it runs on as it was.
    fn capture_files(
        &self,
        inst: &Instance<Self::Handle>,
        frozen: bool,
        dest: &Path,
    ) -> impl Future<Output = Result<u64>> + Send {
        async move {
            if !frozen {
                // Nothing may write between the copy and the end of the processes.
                self.pause(inst).await?;
            }
            let captured = self.capture(inst, true, dest).await;
            if captured.is_err()
                && !frozen
                && let Err(thaw) = self.resume(inst).await
            {
                tracing::error!(instance = %inst.id, error = %thaw, "a failed filesystem-only pause could not thaw the sandbox");
            }
            captured
        }
    }

    /// Copies what the instance wrote over its template (its overlay's upper directory) into
    /// the new directory `dest` as a layer, leaving out the relative paths in `skip`; the
    /// instance is frozen meanwhile and is not resumed. Answers the layer's bytes, or None
    /// when the instance wrote nothing. Runtimes without a host-side upper refuse.
    fn commit(
        &self,
        _inst: &Instance<Self::Handle>,
        _dest: &Path,
        _skip: &'static [&'static str],
    ) -> impl Future<Output = Result<Option<u64>>> + Send {
        async {
            Err(Error::invalid(
                "this node's runtime keeps a sandbox's writes in its memory and cannot build templates; build on a node with the built-in runtime",
            ))
        }
    }

    /// Whether `commit` works here.
    fn commits(&self) -> bool {
        false
    }

    fn usage(&self, inst: &Instance<Self::Handle>) -> impl Future<Output = Result<Usage>> + Send;

    fn is_alive(&self, inst: &Instance<Self::Handle>) -> bool;

    /// A connection to `port` inside the instance (its agent, or a server of its own).
    fn dial(
        &self,
        inst: &Instance<Self::Handle>,
        port: u16,
    ) -> impl Future<Output = Result<Conn>> + Send;

    /// The secret the instance's agent wants on `/init`.
    fn init_token(&self, inst: &Instance<Self::Handle>) -> String;

    /// Removes whatever an earlier run of this node left behind (processes, cgroups).
    fn reclaim_orphans(&self) -> impl Future<Output = ()> + Send;
}
