//! The runtime a node was started with (`--runtime builtin|gvisor|auto`), behind the one
//! `Runtime` trait, so the node and its daemon are the same code for either.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::builtin::{BuiltinHandle, BuiltinRuntime};
use super::gvisor::{GvisorHandle, GvisorRuntime};
use super::{BootSpec, Conn, Instance, Runtime, Usage};
use crate::model::{Error, Result};
use crate::templates::Template;

/// Boxed runtimes: one lives per node, and the two differ much in size.
pub enum AnyRuntime {
    Builtin(Box<BuiltinRuntime>),
    Gvisor(Box<GvisorRuntime>),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "runtime", rename_all = "kebab-case")]
pub enum AnyHandle {
    Builtin(BuiltinHandle),
    Gvisor(GvisorHandle),
}

fn with<H: Clone>(inst: &Instance<AnyHandle>, handle: H) -> Instance<H> {
    Instance {
        id: inst.id.clone(),
        dir: inst.dir.clone(),
        address: inst.address.clone(),
        handle,
        logs: inst.logs.clone(),
        agent: inst.agent.clone(),
    }
}

fn mismatch(inst: &Instance<AnyHandle>) -> Error {
    Error::internal(format!(
        "instance {} belongs to another runtime than this node's",
        inst.id
    ))
}

/// Runs `$body` with the concrete runtime `$rt` and the instance `$i` of its own handle type.
macro_rules! on {
    ($self:ident, $inst:ident, |$rt:ident, $i:ident| $body:expr) => {
        match ($self, &$inst.handle) {
            (AnyRuntime::Builtin($rt), AnyHandle::Builtin(h)) => {
                let $i = with($inst, h.clone());
                $body
            }
            (AnyRuntime::Gvisor($rt), AnyHandle::Gvisor(h)) => {
                let $i = with($inst, h.clone());
                $body
            }
            _ => Err(mismatch($inst)),
        }
    };
}

impl AnyRuntime {
    /// Whether this node can give sandboxes net `egress`.
    pub fn offers_egress(&self) -> bool {
        match self {
            AnyRuntime::Builtin(b) => b.offers_egress(),
            AnyRuntime::Gvisor(g) => g.offers_egress(),
        }
    }
}

impl Runtime for AnyRuntime {
    type Handle = AnyHandle;

    fn name(&self) -> &'static str {
        match self {
            AnyRuntime::Builtin(r) => r.name(),
            AnyRuntime::Gvisor(r) => r.name(),
        }
    }

    fn describe(&self) -> String {
        match self {
            AnyRuntime::Builtin(r) => r.describe(),
            AnyRuntime::Gvisor(r) => r.describe(),
        }
    }

    fn captures_memory(&self, net: &str) -> bool {
        match self {
            AnyRuntime::Builtin(r) => r.captures_memory(net),
            AnyRuntime::Gvisor(r) => r.captures_memory(net),
        }
    }

    fn captures_files(&self) -> Result<()> {
        match self {
            AnyRuntime::Builtin(r) => r.captures_files(),
            AnyRuntime::Gvisor(r) => r.captures_files(),
        }
    }

    fn enforces_egress(&self) -> bool {
        match self {
            AnyRuntime::Builtin(r) => r.enforces_egress(),
            AnyRuntime::Gvisor(r) => r.enforces_egress(),
        }
    }

    fn proxies_egress(&self) -> bool {
        match self {
            AnyRuntime::Builtin(r) => r.proxies_egress(),
            AnyRuntime::Gvisor(r) => r.proxies_egress(),
        }
    }

    async fn set_egress(
        &self,
        inst: &Instance<AnyHandle>,
        egress: Option<&crate::model::network::Egress>,
    ) -> Result<()> {
        on!(self, inst, |r, i| r.set_egress(&i, egress).await)
    }

    async fn prepare_template(&self, t: &Template) -> Result<()> {
        match self {
            AnyRuntime::Builtin(r) => r.prepare_template(t).await,
            AnyRuntime::Gvisor(r) => r.prepare_template(t).await,
        }
    }

    fn mounts_volumes_live(&self) -> bool {
        match self {
            AnyRuntime::Builtin(r) => r.mounts_volumes_live(),
            AnyRuntime::Gvisor(r) => r.mounts_volumes_live(),
        }
    }

    async fn mount_volume(
        &self,
        inst: &Instance<AnyHandle>,
        source: &Path,
        target: &str,
    ) -> Result<()> {
        on!(self, inst, |r, i| r.mount_volume(&i, source, target).await)
    }

    fn egress_ca(&self, inst: &Instance<AnyHandle>) -> Result<String> {
        on!(self, inst, |r, i| r.egress_ca(&i))
    }

    async fn boot(&self, spec: BootSpec<'_>) -> Result<Instance<AnyHandle>> {
        match self {
            AnyRuntime::Builtin(r) => {
                let i = r.boot(spec).await?;
                let h = AnyHandle::Builtin(i.handle.clone());
                Ok(with_handle(i, h))
            }
            AnyRuntime::Gvisor(r) => {
                let i = r.boot(spec).await?;
                let h = AnyHandle::Gvisor(i.handle.clone());
                Ok(with_handle(i, h))
            }
        }
    }

    async fn destroy(&self, inst: &Instance<AnyHandle>) -> Result<()> {
        on!(self, inst, |r, i| r.destroy(&i).await)
    }

    async fn pause(&self, inst: &Instance<AnyHandle>) -> Result<()> {
        on!(self, inst, |r, i| r.pause(&i).await)
    }

    async fn resume(&self, inst: &Instance<AnyHandle>) -> Result<()> {
        on!(self, inst, |r, i| r.resume(&i).await)
    }

    async fn ready_resume(&self, inst: &Instance<AnyHandle>) -> Result<()> {
        on!(self, inst, |r, i| r.ready_resume(&i).await)
    }

    async fn capture(&self, inst: &Instance<AnyHandle>, paused: bool, dest: &Path) -> Result<u64> {
        on!(self, inst, |r, i| r.capture(&i, paused, dest).await)
    }

    async fn capture_then<T: Send>(
        &self,
        inst: &Instance<AnyHandle>,
        paused: bool,
        dest: &Path,
        meanwhile: impl Future<Output = T> + Send,
    ) -> (Result<u64>, Option<T>) {
        match (self, &inst.handle) {
            (AnyRuntime::Builtin(r), AnyHandle::Builtin(h)) => {
                r.capture_then(&with(inst, h.clone()), paused, dest, meanwhile)
                    .await
            }
            (AnyRuntime::Gvisor(r), AnyHandle::Gvisor(h)) => {
                r.capture_then(&with(inst, h.clone()), paused, dest, meanwhile)
                    .await
            }
            _ => (Err(mismatch(inst)), None),
        }
    }

    async fn capture_files(
        &self,
        inst: &Instance<AnyHandle>,
        frozen: bool,
        dest: &Path,
    ) -> Result<u64> {
        on!(self, inst, |r, i| r.capture_files(&i, frozen, dest).await)
    }

    async fn commit(
        &self,
        inst: &Instance<AnyHandle>,
        dest: &Path,
        skip: &'static [&'static str],
    ) -> Result<Option<u64>> {
        on!(self, inst, |r, i| r.commit(&i, dest, skip).await)
    }

    fn commits(&self) -> bool {
        match self {
            AnyRuntime::Builtin(r) => r.commits(),
            AnyRuntime::Gvisor(r) => r.commits(),
        }
    }

    async fn usage(&self, inst: &Instance<AnyHandle>) -> Result<Usage> {
        on!(self, inst, |r, i| r.usage(&i).await)
    }

    fn is_alive(&self, inst: &Instance<AnyHandle>) -> bool {
        let alive: Result<bool> = on!(self, inst, |r, i| Ok(r.is_alive(&i)));
        alive.unwrap_or(false)
    }

    async fn dial(&self, inst: &Instance<AnyHandle>, port: u16) -> Result<Conn> {
        on!(self, inst, |r, i| r.dial(&i, port).await)
    }

    fn init_token(&self, inst: &Instance<AnyHandle>) -> String {
        match &inst.handle {
            AnyHandle::Builtin(h) => h.init_token.clone(),
            AnyHandle::Gvisor(h) => h.init_token.clone(),
        }
    }

    async fn reclaim_orphans(&self) {
        match self {
            AnyRuntime::Builtin(r) => r.reclaim_orphans().await,
            AnyRuntime::Gvisor(r) => r.reclaim_orphans().await,
        }
    }
}

fn with_handle<H>(i: Instance<H>, handle: AnyHandle) -> Instance<AnyHandle> {
    Instance {
        id: i.id,
        dir: i.dir,
        address: i.address,
        handle,
        logs: i.logs,
        agent: i.agent,
    }
}
