//! Cluster mode: nodes publish a NodeInventory object each, gateways discover nodes (and, by
//! default, build unpinned lists) from those objects. Kubernetes is the only shared state.

pub mod backoff;
pub mod discover;
pub mod inventory;
pub mod publish;

use std::path::Path;

/// The verbs a gateway uses on NodeInventory objects: a list, then a watch from its version.
/// deploy/ grants exactly these.
pub const GATEWAY_VERBS: &[&str] = &["list", "watch"];
/// A node's verbs on its NodeInventory: server-side apply is a PATCH that creates the object
/// when it is missing, which RBAC checks as create.
pub const NODE_VERBS: &[&str] = &["create", "patch"];

use crate::model::{Error, Result};

/// A client for the cluster: from a kubeconfig file, else the in-cluster service account
/// (or `$KUBECONFIG`). `purpose` names the flag that needs it, for the error message.
pub async fn client(kubeconfig: Option<&Path>, purpose: &str) -> Result<kube::Client> {
    crate::tlsx::install_crypto();
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| Error::invalid(format!("reading {}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| Error::invalid(format!("kubeconfig {}: {e}", path.display())))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            Error::invalid(format!(
                "{purpose} needs a cluster: no in-cluster service account or kubeconfig ({e}); pass --kubeconfig"
            ))
        })?,
    };
    kube::Client::try_from(config)
        .map_err(|e| Error::invalid(format!("connecting to the cluster: {e}")))
}
