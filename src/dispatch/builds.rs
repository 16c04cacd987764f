//! Template builds across the fleet: a team's template lives on one node (its builds, files
//! and layers are there), chosen by hashing the team and the template's name over the nodes
//! that can build, so every replica sends a template's calls to the same node. Calls that
//! name a template by id ask the nodes in turn until one knows it.

use std::sync::Arc;

use super::Dispatcher;
use super::client::Effect;
use super::registry::NodeHandle;
use crate::model::builds::{
    BuildQuery, BuildStatus, FilesRef, RequestBuild, RequestedBuild, StartBuild, TemplateOp,
    TemplateView,
};
use crate::model::{Error, ErrorKind, Result};
use crate::proto;

/// Bytes per chunk of an upload on its way to the node.
const CHUNK: usize = 1 << 20;

fn encode<T: serde::Serialize>(v: &T) -> Result<proto::BuildCall> {
    serde_json::to_vec(v)
        .map(|json| proto::BuildCall { json })
        .map_err(|e| Error::internal(format!("encoding a build call: {e}")))
}

fn decode<T: serde::de::DeserializeOwned>(c: proto::BuildCall) -> Result<T> {
    serde_json::from_slice(&c.json)
        .map_err(|e| Error::internal(format!("a node's build answer does not parse: {e}")))
}

/// The node calls whose bodies and answers are JSON (`model::builds`).
#[derive(Debug, Clone, Copy)]
enum JsonRpc {
    RequestBuild,
    StartBuild,
    GetBuild,
    HasBuildFiles,
    TemplateOp,
}

impl JsonRpc {
    fn what(self) -> &'static str {
        match self {
            JsonRpc::RequestBuild => "request build",
            JsonRpc::StartBuild => "start build",
            JsonRpc::GetBuild => "build status",
            JsonRpc::HasBuildFiles => "build files",
            JsonRpc::TemplateOp => "template",
        }
    }
}

/// Sends `body` to `node` as `rpc` and decodes the node's answer.
async fn call_json<T: serde::de::DeserializeOwned>(
    node: &NodeHandle,
    rpc: JsonRpc,
    effect: Effect,
    timeout: std::time::Duration,
    body: proto::BuildCall,
) -> Result<T> {
    let conn = node.conn();
    let mut c = conn.client();
    let what = rpc.what();
    let reply = match rpc {
        JsonRpc::RequestBuild => {
            conn.call(what, effect, timeout, c.request_build(body))
                .await
        }
        JsonRpc::StartBuild => conn.call(what, effect, timeout, c.start_build(body)).await,
        JsonRpc::GetBuild => conn.call(what, effect, timeout, c.get_build(body)).await,
        JsonRpc::HasBuildFiles => {
            conn.call(what, effect, timeout, c.has_build_files(body))
                .await
        }
        JsonRpc::TemplateOp => conn.call(what, effect, timeout, c.template_op(body)).await,
    }?;
    decode(reply)
}

impl Dispatcher {
    /// The up nodes that can build, in the order a template of `team` called `alias` tries
    /// them (rendezvous hashing: the same on every replica).
    fn builders(&self, team: &str, alias: &str) -> Vec<Arc<NodeHandle>> {
        let mut nodes: Vec<(String, Arc<NodeHandle>)> = self
            .inner
            .registry
            .up()
            .into_iter()
            .filter_map(|h| {
                let info = h.info()?;
                info.builds.then_some((info.name, h))
            })
            .collect();
        nodes.sort_by_cached_key(|(name, _)| {
            std::cmp::Reverse(crate::model::ids::stable_hash_hex(
                format!("{team}\0{alias}\0{name}").as_bytes(),
            ))
        });
        nodes.into_iter().map(|(_, h)| h).collect()
    }

    /// Registers a build of the team's template on the node that keeps it.
    pub async fn request_build(&self, req: &RequestBuild) -> Result<RequestedBuild> {
        let node = self
            .builders(&req.team, &req.alias)
            .into_iter()
            .next()
            .ok_or_else(|| {
                Error::unavailable(
                    "no node that can build templates is up (a node that cannot says why when it starts)",
                )
            })?;
        let timeout = self.inner.cfg.call_timeout;
        call_json(
            &node,
            JsonRpc::RequestBuild,
            Effect::Write,
            timeout,
            encode(req)?,
        )
        .await
    }

    /// Asks the nodes in turn until one knows the template (not "not found").
    async fn on_template_node<T>(
        &self,
        what: &str,
        effect: Effect,
        call: impl AsyncFn(&Arc<NodeHandle>) -> Result<T>,
    ) -> Result<T> {
        // Every node: one that cannot build may share the templates (and their records)
        // with one that can.
        let nodes = self.inner.registry.up();
        let mut last = Error::not_found(format!("{what}: not found"));
        for node in nodes {
            match call(&node).await {
                Err(e) if e.kind == ErrorKind::NotFound => last = e,
                // A write that may have reached a node is not sent to another.
                Err(e) if effect == Effect::Write && e.kind == ErrorKind::OutcomeUnknown => {
                    return Err(e);
                }
                other => return other,
            }
        }
        Err(last)
    }

    /// Calls `rpc` with `body` on the node that knows the template it names.
    async fn on_template_json<T: serde::de::DeserializeOwned>(
        &self,
        what: &str,
        rpc: JsonRpc,
        effect: Effect,
        body: proto::BuildCall,
    ) -> Result<T> {
        let timeout = self.inner.cfg.call_timeout;
        self.on_template_node(what, effect, async |node| {
            call_json(node, rpc, effect, timeout, body.clone()).await
        })
        .await
    }

    pub async fn start_build(&self, req: &StartBuild) -> Result<()> {
        let body = encode(req)?;
        self.on_template_json::<serde::de::IgnoredAny>(
            "build",
            JsonRpc::StartBuild,
            Effect::Write,
            body,
        )
        .await
        .map(|_| ())
    }

    pub async fn get_build(&self, q: &BuildQuery) -> Result<BuildStatus> {
        self.on_template_json("build", JsonRpc::GetBuild, Effect::Read, encode(q)?)
            .await
    }

    pub async fn has_build_files(&self, f: &FilesRef) -> Result<bool> {
        self.on_template_json("template", JsonRpc::HasBuildFiles, Effect::Read, encode(f)?)
            .await
    }

    /// A team's template, resolved, described, tagged, published or deleted on the node that
    /// keeps it (`list_built` gathers every node's list).
    pub async fn template_op<T: serde::de::DeserializeOwned>(&self, op: &TemplateOp) -> Result<T> {
        let body = encode(op)?;
        let effect = match op {
            TemplateOp::Describe { .. } | TemplateOp::List { .. } | TemplateOp::Resolve { .. } => {
                Effect::Read
            }
            _ => Effect::Write,
        };
        self.on_template_json("template", JsonRpc::TemplateOp, effect, body)
            .await
    }

    /// Every node's templates visible to `team`, each once (nodes may share them).
    pub async fn list_built(&self, team: &str) -> Vec<TemplateView> {
        let body = match encode(&TemplateOp::List {
            team: team.to_string(),
        }) {
            Ok(b) => b,
            Err(_) => return Vec::new(),
        };
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let timeout = self.inner.cfg.lookup_timeout;
        for node in self.inner.registry.up() {
            let reply = call_json::<Vec<TemplateView>>(
                &node,
                JsonRpc::TemplateOp,
                Effect::Read,
                timeout,
                body.clone(),
            )
            .await;
            if let Ok(views) = reply {
                // Nodes sharing a templates directory know the same templates.
                out.extend(
                    views
                        .into_iter()
                        .filter(|v| seen.insert(v.record.template_id.clone())),
                );
            }
        }
        out
    }

    /// Sends an upload to the node that keeps the template, as it arrives.
    pub async fn put_build_files(
        &self,
        f: &FilesRef,
        body: impl futures::Stream<Item = Result<bytes::Bytes>> + Send + 'static,
    ) -> Result<()> {
        use futures::StreamExt;
        // The node is found first (without the body, which can be read only once).
        let node = self
            .on_template_node("template", Effect::Read, async |node| {
                let timeout = self.inner.cfg.call_timeout;
                call_json::<bool>(
                    node,
                    JsonRpc::HasBuildFiles,
                    Effect::Read,
                    timeout,
                    encode(f)?,
                )
                .await
                .map(|_| node.clone())
            })
            .await?;
        let first = proto::FilesChunk {
            json: encode(f)?.json,
            data: Vec::new(),
        };
        let chunks = body.flat_map(|r| {
            let parts: Vec<proto::FilesChunk> = match r {
                Ok(b) => b
                    .chunks(CHUNK)
                    .map(|c| proto::FilesChunk {
                        json: Vec::new(),
                        data: c.to_vec(),
                    })
                    .collect(),
                // A body that broke off ends the stream short; the node then refuses the
                // truncated archive.
                Err(_) => Vec::new(),
            };
            futures::stream::iter(parts)
        });
        let stream = futures::stream::once(async move { first }).chain(chunks);
        let mut c = node.conn().client();
        node.conn()
            .call(
                "upload",
                Effect::Write,
                self.inner.cfg.capture_timeout,
                c.put_build_files(stream),
            )
            .await
            .map(|_| ())
    }

    /// The node template a create of `name` by `team` starts, as the node that keeps the
    /// team's templates says now (a tag may have moved a moment ago); None when no team has a
    /// template by that name that `team` may start. The nodes' info is fetched again when
    /// none offers it yet (the build just ended), so the claim finds it.
    pub async fn resolve_built_now(&self, team: &str, name: &str) -> Result<Option<String>> {
        let op = TemplateOp::Resolve {
            team: team.to_string(),
            name: name.to_string(),
        };
        let store: String = match self.template_op(&op).await {
            Ok(s) => s,
            Err(e) if e.kind == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let up = self.inner.registry.up();
        if !up.iter().any(|h| h.offers_template(&store)) {
            let timeout = self
                .inner
                .cfg
                .lookup_timeout
                .max(std::time::Duration::from_secs(1));
            for h in &up {
                if let Ok(info) = h.conn().info(timeout).await {
                    h.set_info(info);
                }
            }
        }
        Ok(Some(store))
    }

    /// Who owns the node template `name` ("" for the node's own templates), and whether
    /// others may start it.
    pub fn template_owner(&self, name: &str) -> Option<(String, bool)> {
        self.inner.registry.up().into_iter().find_map(|node| {
            node.info()?
                .template_info
                .into_iter()
                .find(|t| t.name == name)
                .map(|t| (t.owner, t.public))
        })
    }

    /// A node's own template (`base`, or a name a template answers to such as
    /// `code-interpreter-v1`), by its name.
    pub fn node_template(&self, name: &str) -> Option<String> {
        self.inner.registry.up().into_iter().find_map(|node| {
            node.info()?
                .template_info
                .into_iter()
                .find(|t| {
                    t.owner.is_empty() && (t.name == name || t.aliases.iter().any(|a| a == name))
                })
                .map(|t| t.name)
        })
    }

    /// The node template a create of `asked` in `team`'s namespace starts: one the team built
    /// (by alias, `alias:tag` or template id), another team's public one, or a node's own
    /// (`base`). Another team's private template is not found, whatever it is called.
    pub async fn template_for(&self, team: &str, asked: &str) -> Result<String> {
        let lower = asked.trim().to_ascii_lowercase();
        let name = lower.strip_suffix(":default").unwrap_or(&lower);
        // The nodes' own templates (`base`) are the common case and need no second look.
        if self.node_template(name).is_none()
            && let Some(store) = self.resolve_built_now(team, name).await?
        {
            return Ok(store);
        }
        match self.template_owner(asked) {
            Some((owner, public)) if !owner.is_empty() && owner != team && !public => {
                Err(Error::not_found(format!("template {asked:?} not found")))
            }
            _ => Ok(asked.to_string()),
        }
    }
}
