//! The node's gRPC service: decodes requests, runs the verb, encodes the answer.
//! Verbs with several steps run as detached tasks, so a caller that goes away mid-call
//! cannot leave a half-done claim or a leaked instance behind.

use std::future::Future;
use std::pin::Pin;

use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::runtime::Runtime;
use super::{ClaimSpec, Node};
use crate::model::builds::{BuildQuery, FilesRef, RequestBuild, StartBuild, TemplateOp};
use crate::model::{self, Error, InventoryChange, InventoryEvent, PauseChange};
use crate::proto::{self, node_server};

pub struct NodeService<R: Runtime> {
    node: Node<R>,
}

impl<R: Runtime> NodeService<R> {
    pub fn new(node: Node<R>) -> Self {
        NodeService { node }
    }
}

type Reply<T> = Result<Response<T>, Status>;

async fn detached<T: Send + 'static>(
    fut: impl Future<Output = model::Result<T>> + Send + 'static,
) -> Result<T, Status> {
    match tokio::spawn(fut).await {
        Ok(r) => r.map_err(Status::from),
        Err(e) => Err(Status::internal(format!("node task failed: {e}"))),
    }
}

/// The JSON bodies of the build calls.
fn from_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, Status> {
    serde_json::from_slice(bytes)
        .map_err(|e| Status::invalid_argument(format!("a build call that does not parse: {e}")))
}

fn to_json<T: serde::Serialize>(v: &T) -> Reply<proto::BuildCall> {
    serde_json::to_vec(v)
        .map(|json| Response::new(proto::BuildCall { json }))
        .map_err(|e| Status::internal(format!("encoding a build answer: {e}")))
}

fn key_of(key: Option<proto::PoolKey>) -> model::Result<model::PoolKey> {
    key.ok_or_else(|| Error::invalid("claim needs a pool key"))?
        .to_model()
}

/// The claim spec of a ClaimRequest or ClaimCheckpointRequest (the same fields), taken out of
/// the message.
macro_rules! claim_spec {
    ($r:expr) => {{
        let r = &mut $r;
        model::OnTimeout::parse(&r.on_timeout)
            .and_then(|t| Ok((t, model::PauseMode::parse(&r.auto_pause_mode)?)))
            .map(|(on_timeout, pause_mode)| ClaimSpec {
                ttl_seconds: r.ttl_seconds,
                claim_ref: std::mem::take(&mut r.claim_ref),
                metadata: std::mem::take(&mut r.metadata).into_iter().collect(),
                env_vars: std::mem::take(&mut r.env_vars).into_iter().collect(),
                lifecycle: model::Lifecycle {
                    on_timeout,
                    auto_resume: r.auto_resume,
                    pause_mode,
                },
                network: r.network.take().map(Into::into).unwrap_or_default(),
                volume_mounts: std::mem::take(&mut r.volume_mounts)
                    .into_iter()
                    .map(Into::into)
                    .collect(),
            })
    }};
}

fn required_id(id: &str, what: &str) -> Result<(), Status> {
    if id.is_empty() {
        return Err(Error::invalid(format!("{what} id is empty")).into());
    }
    Ok(())
}

#[tonic::async_trait]
impl<R: Runtime> node_server::Node for NodeService<R> {
    async fn claim(&self, req: Request<proto::ClaimRequest>) -> Reply<proto::ClaimReply> {
        let mut r = req.into_inner();
        let spec = claim_spec!(r)?;
        let key = key_of(r.key)?;
        let node = self.node.clone();
        let (record, warm) = detached(async move { node.claim(&key, spec).await }).await?;
        Ok(Response::new(proto::ClaimReply {
            sandbox: Some((&record).into()),
            warm,
        }))
    }

    async fn claim_checkpoint(
        &self,
        req: Request<proto::ClaimCheckpointRequest>,
    ) -> Reply<proto::ClaimReply> {
        let mut r = req.into_inner();
        required_id(&r.checkpoint_id, "checkpoint")?;
        let spec = claim_spec!(r)?;
        let node = self.node.clone();
        let record =
            detached(async move { node.claim_checkpoint(&r.checkpoint_id, spec).await }).await?;
        Ok(Response::new(proto::ClaimReply {
            sandbox: Some((&record).into()),
            warm: false,
        }))
    }

    async fn release(&self, req: Request<proto::SandboxRef>) -> Reply<proto::ReleaseReply> {
        let id = req.into_inner().id;
        let node = self.node.clone();
        detached(async move { node.release(&id).await }).await?;
        Ok(Response::new(proto::ReleaseReply {}))
    }

    async fn get(&self, req: Request<proto::SandboxRef>) -> Reply<proto::Sandbox> {
        let (record, revision) = self.node.get(&req.into_inner().id)?;
        Ok(Response::new(proto::Sandbox {
            inventory_revision: revision,
            ..(&record).into()
        }))
    }

    async fn list(&self, req: Request<proto::ListRequest>) -> Reply<proto::ListReply> {
        let r = req.into_inner();
        let filter = (!r.claim_ref.is_empty()).then_some(r.claim_ref.as_str());
        let (records, revision) = self.node.list(filter);
        Ok(Response::new(proto::ListReply {
            sandboxes: records.iter().map(Into::into).collect(),
            revision,
        }))
    }

    async fn renew(&self, req: Request<proto::RenewRequest>) -> Reply<proto::RenewReply> {
        let r = req.into_inner();
        let (deadline, changed) = if r.expire_now {
            self.node.expire(&r.id)?
        } else {
            self.node.renew(&r.id, r.ttl_seconds, r.allow_shorter)?
        };
        Ok(Response::new(proto::RenewReply {
            deadline_ms: proto::to_ms(deadline),
            changed,
        }))
    }

    async fn pause(&self, req: Request<proto::PauseRequest>) -> Reply<proto::StateChange> {
        let r = req.into_inner();
        let mode = if r.filesystem {
            model::PauseMode::Filesystem
        } else {
            model::PauseMode::Full
        };
        self.set_paused(r.id, PauseChange::Pause(mode)).await
    }

    async fn resume(&self, req: Request<proto::ResumeRequest>) -> Reply<proto::StateChange> {
        let r = req.into_inner();
        self.set_paused(r.id, PauseChange::Resume { cold: r.cold })
            .await
    }

    async fn fork(&self, req: Request<proto::ForkRequest>) -> Reply<proto::ForkReply> {
        let r = req.into_inner();
        let node = self.node.clone();
        let children = detached(async move {
            node.fork(&r.id, r.count, r.ttl_seconds, &r.claim_ref_prefix)
                .await
        })
        .await?;
        Ok(Response::new(proto::ForkReply {
            children: children.iter().map(Into::into).collect(),
        }))
    }

    async fn create_checkpoint(
        &self,
        req: Request<proto::CreateCheckpointRequest>,
    ) -> Reply<proto::Checkpoint> {
        let r = req.into_inner();
        let node = self.node.clone();
        let ck =
            detached(async move { node.create_checkpoint(&r.id, &r.name, r.memory).await }).await?;
        Ok(Response::new((&ck).into()))
    }

    async fn list_checkpoints(
        &self,
        req: Request<proto::ListCheckpointsRequest>,
    ) -> Reply<proto::ListCheckpointsReply> {
        let r = req.into_inner();
        let cks = self.node.list_checkpoints(&model::CheckpointFilter {
            name_prefix: r.name_prefix,
            sandbox_id: r.sandbox_id,
            id: r.id,
        });
        Ok(Response::new(proto::ListCheckpointsReply {
            checkpoints: cks.iter().map(Into::into).collect(),
        }))
    }

    async fn delete_checkpoint(
        &self,
        req: Request<proto::CheckpointRef>,
    ) -> Reply<proto::DeleteCheckpointReply> {
        let id = req.into_inner().id;
        let node = self.node.clone();
        detached(async move { node.delete_checkpoint(&id).await }).await?;
        Ok(Response::new(proto::DeleteCheckpointReply {}))
    }

    async fn stats(&self, req: Request<proto::SandboxRef>) -> Reply<proto::SandboxStats> {
        let stats = self.node.stats(&req.into_inner().id).await?;
        Ok(Response::new((&stats).into()))
    }

    async fn logs(&self, req: Request<proto::LogsRequest>) -> Reply<proto::LogsReply> {
        let r = req.into_inner();
        let query = r.to_query()?;
        let (claim_ref, entries) = self.node.logs(&r.id, &query)?;
        Ok(Response::new(proto::LogsReply {
            entries: entries.iter().map(Into::into).collect(),
            claim_ref,
        }))
    }

    async fn info(&self, _req: Request<proto::InfoRequest>) -> Reply<proto::NodeInfo> {
        Ok(Response::new((&self.node.info()).into()))
    }

    type WatchInventoryStream =
        Pin<Box<dyn Stream<Item = Result<proto::InventoryEvent, Status>> + Send + 'static>>;

    async fn watch_inventory(
        &self,
        _req: Request<proto::WatchInventoryRequest>,
    ) -> Reply<Self::WatchInventoryStream> {
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let node = self.node.clone();
        let stop = node.shutdown_token();
        tokio::spawn(async move {
            tokio::select! {
                _ = stream_inventory(node, tx) => {}
                _ = stop.cancelled() => {}
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn update_metadata(
        &self,
        req: Request<proto::UpdateMetadataRequest>,
    ) -> Reply<proto::StateChange> {
        let r = req.into_inner();
        required_id(&r.id, "sandbox")?;
        let set = r.set.into_iter().collect();
        let (record, changed) = self.node.update_metadata(&r.id, set, &r.remove)?;
        Ok(Response::new(proto::StateChange {
            changed,
            sandbox: Some((&record).into()),
        }))
    }

    async fn request_build(&self, req: Request<proto::BuildCall>) -> Reply<proto::BuildCall> {
        let r: RequestBuild = from_json(&req.into_inner().json)?;
        to_json(&self.node.request_build(&r)?)
    }

    async fn start_build(&self, req: Request<proto::BuildCall>) -> Reply<proto::BuildCall> {
        let r: StartBuild = from_json(&req.into_inner().json)?;
        self.node.start_build(r)?;
        to_json(&())
    }

    async fn get_build(&self, req: Request<proto::BuildCall>) -> Reply<proto::BuildCall> {
        let q: BuildQuery = from_json(&req.into_inner().json)?;
        to_json(&self.node.get_build(&q)?)
    }

    async fn has_build_files(&self, req: Request<proto::BuildCall>) -> Reply<proto::BuildCall> {
        let f: FilesRef = from_json(&req.into_inner().json)?;
        to_json(&self.node.has_build_files(&f)?)
    }

    async fn template_op(&self, req: Request<proto::BuildCall>) -> Reply<proto::BuildCall> {
        let op: TemplateOp = from_json(&req.into_inner().json)?;
        to_json(&self.node.template_op(op)?)
    }

    async fn put_build_files(
        &self,
        req: Request<tonic::Streaming<proto::FilesChunk>>,
    ) -> Reply<proto::BuildCall> {
        let mut stream = req.into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("an upload needs its first chunk"))?;
        let f: FilesRef = from_json(&first.json)?;
        let head = futures::stream::iter([Ok(bytes::Bytes::from(first.data))]);
        let rest = futures::StreamExt::map(stream, |c| {
            c.map(|c| bytes::Bytes::from(c.data))
                .map_err(|e| Error::unavailable(format!("the upload broke off: {e}")))
        });
        self.node
            .put_build_files(&f, futures::StreamExt::chain(head, rest))
            .await?;
        to_json(&())
    }

    async fn set_on_timeout(
        &self,
        req: Request<proto::SetOnTimeoutRequest>,
    ) -> Reply<proto::StateChange> {
        let r = req.into_inner();
        required_id(&r.id, "sandbox")?;
        let on_timeout = model::OnTimeout::parse(&r.on_timeout)?;
        let (record, changed) = self.node.set_on_timeout(&r.id, on_timeout)?;
        Ok(Response::new(proto::StateChange {
            changed,
            sandbox: Some((&record).into()),
        }))
    }

    async fn update_network(
        &self,
        req: Request<proto::UpdateNetworkRequest>,
    ) -> Reply<proto::StateChange> {
        let r = req.into_inner();
        required_id(&r.id, "sandbox")?;
        let policy = r.network.map(Into::into).unwrap_or_default();
        let node = self.node.clone();
        let (record, changed) =
            detached(async move { node.update_network(&r.id, policy).await }).await?;
        Ok(Response::new(proto::StateChange {
            changed,
            sandbox: Some((&record).into()),
        }))
    }
}

impl<R: Runtime> NodeService<R> {
    async fn set_paused(&self, id: String, change: PauseChange) -> Reply<proto::StateChange> {
        let node = self.node.clone();
        let (record, changed) =
            detached(async move { node.change_pause(&id, change).await }).await?;
        Ok(Response::new(proto::StateChange {
            changed,
            sandbox: Some((&record).into()),
        }))
    }
}

type EventTx = tokio::sync::mpsc::Sender<Result<proto::InventoryEvent, Status>>;

async fn send(tx: &EventTx, change: InventoryChange, revision: u64) -> bool {
    let event = InventoryEvent { change, revision };
    tx.send(Ok((&event).into())).await.is_ok()
}

/// A snapshot, then every change; a watcher that falls behind gets RESET and a new snapshot.
async fn stream_inventory<R: Runtime>(node: Node<R>, tx: EventTx) {
    let mut first = true;
    loop {
        let (snapshot, revision, mut rx) = node.watch();
        if !first && !send(&tx, InventoryChange::Reset, revision).await {
            return;
        }
        first = false;
        for record in snapshot {
            if !send(&tx, InventoryChange::Added(record), revision).await {
                return;
            }
        }
        if !send(&tx, InventoryChange::Synced, revision).await {
            return;
        }
        loop {
            match rx.recv().await {
                Ok(ev) if ev.revision <= revision => {}
                Ok(ev) => {
                    if tx.send(Ok((&ev).into())).await.is_err() {
                        return;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}
