//! Changing a sandbox's metadata (the Kubernetes facade's labels, annotations and submitted
//! spec live there) or its network policy on its owning node, reflected in this gateway's read
//! view at once.

use std::collections::BTreeMap;

use super::Dispatcher;
use super::client::Effect;
use super::read_view::LocalChange;
use crate::model::network::NetworkPolicy;
use crate::model::{Error, OnTimeout, Result, SandboxRecord};
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
        let (node, record) = self.locate(namespace, id).await?;
        let mut c = node.conn().client();
        let reply = node
            .conn()
            .call(
                "update metadata",
                Effect::Write,
                self.inner.cfg.call_timeout,
                c.update_metadata(proto::UpdateMetadataRequest {
                    id: record.id,
                    set: set.into_iter().collect(),
                    remove,
                }),
            )
            .await?;
        self.state_changed(reply)
    }

    /// Replaces the sandbox's network policy on its node (outside `namespace`: not found).
    /// Answers the record (without its token) and whether anything changed.
    pub async fn update_network(
        &self,
        namespace: Option<&str>,
        id: &str,
        policy: &NetworkPolicy,
    ) -> Result<(SandboxRecord, bool)> {
        let (node, record) = self.locate(namespace, id).await?;
        let mut c = node.conn().client();
        let reply = node
            .conn()
            .call(
                "update network",
                Effect::Write,
                self.inner.cfg.call_timeout,
                c.update_network(proto::UpdateNetworkRequest {
                    id: record.id,
                    network: Some(policy.into()),
                }),
            )
            .await?;
        self.state_changed(reply)
    }

    /// Sets what the end of the sandbox's lease does (outside `namespace`: not found).
    pub async fn set_on_timeout(
        &self,
        namespace: Option<&str>,
        id: &str,
        on_timeout: OnTimeout,
    ) -> Result<(SandboxRecord, bool)> {
        let (node, record) = self.locate(namespace, id).await?;
        let mut c = node.conn().client();
        let reply = node
            .conn()
            .call(
                "set on-timeout",
                Effect::Write,
                self.inner.cfg.call_timeout,
                c.set_on_timeout(proto::SetOnTimeoutRequest {
                    id: record.id,
                    on_timeout: on_timeout.as_str().to_string(),
                }),
            )
            .await?;
        self.state_changed(reply)
    }

    /// A node's answer to a change, reflected in this gateway's read view at once.
    fn state_changed(&self, reply: proto::StateChange) -> Result<(SandboxRecord, bool)> {
        let record: SandboxRecord = reply
            .sandbox
            .ok_or_else(|| Error::internal("node answered without the sandbox"))?
            .into();
        // An unchanged record would not move the view anyway; skip the write lock.
        if reply.changed {
            self.local(&record.node, LocalChange::Upsert(Box::new(record.clone())));
        }
        Ok((record, reply.changed))
    }
}
