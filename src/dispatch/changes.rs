//! Changing a sandbox's metadata (the Kubernetes facade's labels, annotations and submitted
//! spec live there), its network policy, its on-timeout action or whether it is paused, on its
//! owning node, reflected in this gateway's read view at once.

use std::collections::BTreeMap;
use std::time::Duration;

use tonic::{Response, Status};

use super::Dispatcher;
use super::client::{Client, Effect};
use super::read_view::LocalChange;
use crate::model::network::NetworkPolicy;
use crate::model::{Error, OnTimeout, PauseChange, PauseMode, Result, SandboxRecord};
use crate::proto;

impl Dispatcher {
    /// Sets `set` and removes `remove` on the sandbox's metadata (outside `namespace`: not
    /// found). Answers the record (without its token) and whether anything changed.
    pub async fn update_metadata(
        &self,
        namespace: Option<&str>,
        id: &str,
        set: BTreeMap<String, String>,
        remove: Vec<String>,
    ) -> Result<(SandboxRecord, bool)> {
        let t = self.inner.cfg.call_timeout;
        self.change(namespace, id, "update metadata", t, async |c, id| {
            let set = set.into_iter().collect();
            c.update_metadata(proto::UpdateMetadataRequest { id, set, remove })
                .await
        })
        .await
    }

    /// Replaces the sandbox's network policy on its node (outside `namespace`: not found).
    /// Answers the record (without its token) and whether anything changed.
    pub async fn update_network(
        &self,
        namespace: Option<&str>,
        id: &str,
        policy: &NetworkPolicy,
    ) -> Result<(SandboxRecord, bool)> {
        let t = self.inner.cfg.call_timeout;
        self.change(namespace, id, "update network", t, async |c, id| {
            let network = Some(policy.into());
            c.update_network(proto::UpdateNetworkRequest { id, network })
                .await
        })
        .await
    }

    /// Sets what the end of the sandbox's lease does (outside `namespace`: not found).
    pub async fn set_on_timeout(
        &self,
        namespace: Option<&str>,
        id: &str,
        on_timeout: OnTimeout,
    ) -> Result<(SandboxRecord, bool)> {
        let t = self.inner.cfg.call_timeout;
        self.change(namespace, id, "set on-timeout", t, async |c, id| {
            let on_timeout = on_timeout.as_str().to_string();
            c.set_on_timeout(proto::SetOnTimeoutRequest { id, on_timeout })
                .await
        })
        .await
    }

    /// Pauses or resumes the sandbox (outside `namespace`: not found). Answers the record
    /// (without its token) and whether anything changed.
    pub async fn set_paused(
        &self,
        namespace: Option<&str>,
        id: &str,
        pause: bool,
    ) -> Result<(SandboxRecord, bool)> {
        let change = if pause {
            PauseChange::Pause(PauseMode::Full)
        } else {
            PauseChange::Resume { cold: false }
        };
        self.change_pause(namespace, id, change).await
    }

    /// `set_paused` with the pause's mode, or a resume that boots fresh from the sandbox's
    /// files (`cold`; always so after a filesystem-only pause).
    pub async fn change_pause(
        &self,
        namespace: Option<&str>,
        id: &str,
        change: PauseChange,
    ) -> Result<(SandboxRecord, bool)> {
        // Pause and resume write or read a sandbox's memory or files.
        let t = self.inner.cfg.capture_timeout;
        let what = match change {
            PauseChange::Pause(_) => "pause",
            PauseChange::Resume { .. } => "resume",
        };
        self.change(namespace, id, what, t, async |c, id| match change {
            PauseChange::Pause(mode) => {
                let filesystem = mode == PauseMode::Filesystem;
                c.pause(proto::PauseRequest { id, filesystem }).await
            }
            PauseChange::Resume { cold } => c.resume(proto::ResumeRequest { id, cold }).await,
        })
        .await
    }

    /// Asks the sandbox's owning node for a change (`ask` is given a client and the
    /// sandbox's id) and reflects the answer in this gateway's read view at once.
    async fn change(
        &self,
        namespace: Option<&str>,
        id: &str,
        what: &str,
        timeout: Duration,
        ask: impl AsyncFnOnce(
            &mut Client,
            String,
        ) -> std::result::Result<Response<proto::StateChange>, Status>,
    ) -> Result<(SandboxRecord, bool)> {
        let (node, record) = self.locate(namespace, id).await?;
        let mut c = node.conn().client();
        let reply = node
            .conn()
            .call(what, Effect::Write, timeout, ask(&mut c, record.id))
            .await?;
        let record: SandboxRecord = reply
            .sandbox
            .ok_or_else(|| Error::internal("node answered without the sandbox"))?
            .into();
        // Also when the node changed nothing: the view may not have caught up with a change
        // made elsewhere (another replica paused it), and the same record is no event.
        self.local(&record.node, LocalChange::Upsert(Box::new(record.clone())));
        Ok((record, reply.changed))
    }
}
