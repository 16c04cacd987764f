//! A build's base when it starts `fromImage`: the image pulled from its registry (or the
//! operator's mirror) and unpacked into a root layer of its own, remembered in the team's
//! cache by the image's name as upstream does (a moving tag refreshes only with `force`).
//! The cache is per team: another team naming the same image pulls it with its own
//! credentials, so a private image never reaches a team that could not pull it.

use std::fs;
use std::path::Path;

use super::LogLevel;
use super::records::{BuildRecord, Cached};
use crate::model::builds::{BuildReason, BuildSpec, ImageAuth};
use crate::node::Node;
use crate::node::runtime::Runtime;
use crate::sandbox::spec::RootKind;
use crate::templates::build::steps::{self, Context};
use crate::templates::{Kind, Template, new_meta, oci};

/// The image's root layer, the context it gives the build and the cache key after it.
pub(super) type ImageBase = (Template, String, Context, String);

fn base_failed(message: impl Into<String>) -> BuildReason {
    BuildReason {
        message: message.into(),
        step: Some("base".into()),
    }
}

impl<R: Runtime> Node<R> {
    /// The base of a build from `image`: cached, or pulled and unpacked now.
    pub(super) async fn image_base(
        &self,
        rec: &BuildRecord,
        spec: &BuildSpec,
        image: &str,
    ) -> Result<ImageBase, BuildReason> {
        let auth = ImageAuth::parse(spec.from_image_registry.as_ref())
            .map_err(|e| base_failed(e.message))?;
        let b = self.builds();
        let store = &self.inner.templates;
        let log = |m: String| b.log(&rec.build_id, LogLevel::Info, Some("base"), m);
        let chain = steps::chain("v1", &[&rec.team, &format!("image:{image}")]);
        let short = &chain[..12];
        let hit = if spec.force {
            None
        } else {
            b.records.cached(&rec.team, &chain).and_then(|hit| {
                let layer = hit.layer.filter(|l| store.layer_path(l).is_dir())?;
                Some((layer, hit.context))
            })
        };
        let (root, ctx) = match hit {
            Some(found) => {
                log(format!("CACHED [base] FROM {image} [{short}]"));
                b.touch(&rec.team, std::slice::from_ref(&chain));
                found
            }
            None => {
                log(format!("[base] FROM {image} [{short}]"));
                let found = self.pull_image(image, &auth, &log).await?;
                let _w = b.write_lock();
                let entry = Cached {
                    layer: Some(found.0.clone()),
                    context: found.1.clone(),
                    used_at: Some(chrono::Utc::now()),
                };
                if let Err(e) = b.records.cache(&rec.team, &chain, entry) {
                    tracing::warn!(build = %rec.build_id, error = %e, "could not cache an image");
                }
                found
            }
        };
        let mut meta = new_meta(
            &format!("image-{}", &chain[..16]),
            Kind::Oci,
            RootKind::Complete,
            store.ids(),
            format!("image {image}"),
        );
        meta.env = ctx.env.clone();
        meta.workdir = ctx.workdir.clone();
        let parent = Template {
            meta,
            root: store.layer_path(&root),
            layers: Vec::new(),
        };
        // Later phases are keyed by the root they ran on: a re-pulled image is a new root.
        let chain = steps::chain(&chain, &["ROOT", &root]);
        Ok((parent, root, ctx, chain))
    }

    /// Pulls `image` and unpacks it as a new root layer: its id, and the context the image
    /// sets (root and its `Env`).
    async fn pull_image(
        &self,
        image: &str,
        auth: &ImageAuth,
        log: &(dyn Fn(String) + Send + Sync),
    ) -> Result<(String, Context), BuildReason> {
        let store = &self.inner.templates;
        let (id, staging) = store.new_layer_path().map_err(|e| base_failed(e.message))?;
        // Beside the layer, so an interrupted pull is cleaned with it (`.new-` names).
        let blobs = staging.with_file_name(format!(
            "{}-pull",
            staging
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        ));
        let made = async {
            fs::create_dir_all(&blobs)
                .map_err(|e| base_failed(format!("creating {}: {e}", blobs.display())))?;
            let pulled = self
                .inner
                .cfg
                .registry
                .pull(image, auth, &blobs, log)
                .await
                .map_err(|e| base_failed(e.message))?;
            log(format!(
                "unpacking {} layers of {}",
                pulled.layers.len(),
                pulled.source
            ));
            let ids = store.ids();
            let root = staging.clone();
            let origin = image.to_string();
            let run = tokio::task::spawn_blocking(move || {
                oci::assemble(
                    &root,
                    &pulled.layers,
                    &pulled.config,
                    ids,
                    Path::new(&origin),
                    &|_| {},
                )
            })
            .await
            .map_err(|e| base_failed(format!("unpacking the image: {e}")))?
            .map_err(|e| base_failed(e.message))?;
            store
                .adopt_layer(&id, &staging)
                .map_err(|e| base_failed(e.message))?;
            // As upstream: the image's `Env` holds for the build, its `WorkingDir` does not
            // (the sandboxes start in the user's home unless a step sets one).
            Ok(Context {
                user: "root".into(),
                workdir: None,
                env: run.env,
            })
        }
        .await;
        let _ = fs::remove_dir_all(&blobs);
        if made.is_err() {
            let _ = fs::remove_dir_all(&staging);
        }
        made.map(|ctx| (id, ctx))
    }
}
