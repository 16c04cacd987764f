//! Checkpoints across the fleet: taking one, listing them on every node, finding the node
//! that holds one, and starting a sandbox from it or deleting it.

use std::sync::Arc;

use futures::StreamExt;

use super::client::Effect;
use super::registry::NodeHandle;
use super::{CheckpointListing, ClaimRequest, Claimed, Dispatcher};
use crate::model::{self, CheckpointFilter, CheckpointRecord, Error, Result, SandboxRecord, ids};
use crate::proto;

impl Dispatcher {
    /// Starts a fresh sandbox from a checkpoint on the node that holds it. `name_prefix`
    /// scopes the checkpoint to a tenant (its name must start with it).
    pub async fn claim_from_checkpoint(
        &self,
        checkpoint_id: &str,
        name_prefix: &str,
        req: ClaimRequest,
    ) -> Result<Claimed> {
        model::sandbox::validate_claim_ref(&req.claim_ref())?;
        let (node, _) = self.locate_checkpoint(checkpoint_id, name_prefix).await?;
        let mut c = node.conn().client();
        let reply = node
            .conn()
            .call(
                "claim from checkpoint",
                Effect::Write,
                self.inner.cfg.capture_timeout,
                c.claim_checkpoint(proto::ClaimCheckpointRequest {
                    checkpoint_id: checkpoint_id.to_string(),
                    ttl_seconds: req.ttl_seconds,
                    claim_ref: req.claim_ref(),
                    metadata: req.metadata.into_iter().collect(),
                    env_vars: req.env_vars.into_iter().collect(),
                    no_redirect: true,
                    on_timeout: req.lifecycle.on_timeout.as_str().to_string(),
                    auto_resume: req.lifecycle.auto_resume,
                    auto_pause_mode: req.lifecycle.pause_mode.as_str().to_string(),
                    network: Some((&req.network).into()),
                    volume_mounts: req.volume_mounts.iter().map(Into::into).collect(),
                }),
            )
            .await?;
        let record: SandboxRecord = reply
            .sandbox
            .ok_or_else(|| Error::internal("node answered a claim without a sandbox"))?
            .into();
        self.claimed_on(&node, &record, false);
        Ok(Claimed {
            record,
            warm: false,
        })
    }

    /// `memory`: the checkpoint must hold the sandbox's memory (refused where it cannot).
    pub async fn create_checkpoint(
        &self,
        namespace: Option<&str>,
        id: &str,
        name: &str,
        memory: bool,
    ) -> Result<CheckpointRecord> {
        if !name.is_empty() {
            model::validate_checkpoint_name(name)?;
        }
        let (node, record) = self.locate(namespace, id).await?;
        let mut c = node.conn().client();
        let ck: CheckpointRecord = node
            .conn()
            .call(
                "checkpoint",
                Effect::Write,
                self.inner.cfg.capture_timeout,
                c.create_checkpoint(proto::CreateCheckpointRequest {
                    id: record.id,
                    name: name.to_string(),
                    memory,
                }),
            )
            .await?
            .into();
        self.inner.owners.remember_checkpoint(&ck.id, &node);
        Ok(ck)
    }

    async fn checkpoints_on(
        &self,
        node: &Arc<NodeHandle>,
        filter: &CheckpointFilter,
    ) -> Result<Vec<CheckpointRecord>> {
        let mut c = node.conn().client();
        let reply = node
            .conn()
            .call(
                "list checkpoints",
                Effect::Read,
                self.inner.cfg.call_timeout,
                c.list_checkpoints(proto::ListCheckpointsRequest {
                    name_prefix: filter.name_prefix.clone(),
                    sandbox_id: filter.sandbox_id.clone(),
                    id: filter.id.clone(),
                }),
            )
            .await?;
        Ok(reply.checkpoints.into_iter().map(Into::into).collect())
    }

    /// Checkpoints on every node that answers, newest first.
    pub async fn list_checkpoints(&self, filter: &CheckpointFilter) -> CheckpointListing {
        let nodes = self.inner.registry.all();
        let mut asks = futures::stream::iter(nodes.into_iter().map(|node| async move {
            let r = self.checkpoints_on(&node, filter).await;
            (node, r)
        }))
        .buffer_unordered(self.inner.cfg.fanout_concurrency.max(1));
        let mut listing = CheckpointListing::default();
        while let Some((node, r)) = asks.next().await {
            match r {
                Ok(cks) => {
                    for ck in &cks {
                        self.inner.owners.remember_checkpoint(&ck.id, &node);
                    }
                    listing.checkpoints.extend(cks);
                }
                Err(_) => listing.unreachable.push(node.label()),
            }
        }
        listing.checkpoints.sort_by(|a, b| {
            b.created_at
                .cmp(&a.created_at)
                .then_with(|| b.id.cmp(&a.id))
        });
        listing
    }

    /// The node holding checkpoint `id`, if its name starts with `name_prefix`.
    async fn locate_checkpoint(
        &self,
        id: &str,
        name_prefix: &str,
    ) -> Result<(Arc<NodeHandle>, CheckpointRecord)> {
        let missing = || Error::not_found(format!("checkpoint {id:?} not found"));
        if !ids::is_checkpoint_id(id) {
            return Err(missing());
        }
        let filter = CheckpointFilter {
            name_prefix: name_prefix.to_string(),
            id: id.to_string(),
            ..Default::default()
        };
        if let Some(node) = self.inner.owners.node_of_checkpoint(id) {
            match self.checkpoints_on(&node, &filter).await {
                Ok(mut cks) if !cks.is_empty() => return Ok((node, cks.remove(0))),
                Ok(_) => self.inner.owners.forget_checkpoint(id),
                Err(e) => {
                    return Err(e.context(format!("checkpoint {id:?} is on node {}", node.label())));
                }
            }
        }
        let listing = self.list_checkpoints(&filter).await;
        match listing.checkpoints.into_iter().next() {
            Some(ck) => {
                let node = self
                    .inner
                    .owners
                    .node_of_checkpoint(id)
                    .ok_or_else(|| Error::internal("checkpoint owner was not recorded"))?;
                Ok((node, ck))
            }
            None if !listing.unreachable.is_empty() => Err(Error::unavailable(format!(
                "checkpoint {id:?} was not found on the nodes that answered; {} did not answer",
                listing.unreachable.join(", ")
            ))),
            None => Err(missing()),
        }
    }

    /// Deletes a checkpoint (scoped by name prefix like `claim_from_checkpoint`).
    pub async fn delete_checkpoint(&self, id: &str, name_prefix: &str) -> Result<()> {
        let (node, ck) = self.locate_checkpoint(id, name_prefix).await?;
        let mut c = node.conn().client();
        node.conn()
            .call(
                "delete checkpoint",
                Effect::Write,
                self.inner.cfg.call_timeout,
                c.delete_checkpoint(proto::CheckpointRef { id: ck.id }),
            )
            .await?;
        self.inner.owners.forget_checkpoint(id);
        Ok(())
    }
}
