//! Who is calling and what they may do.
//!
//! - Locally, a bearer token is an e2b API key: it grants its namespace only (admin keys see
//!   all namespaces); anything else is 403.
//! - Behind kube-apiserver (`--delegate-auth`), the front-proxy client certificate is verified
//!   against the request-header CA and the allowed names before `X-Remote-User`,
//!   `X-Remote-Group` and `X-Remote-Extra-*` are believed, and every request is authorized with
//!   a SubjectAccessReview, cached for 10 seconds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix_web::HttpRequest;
use actix_web::web;
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use moka::sync::Cache;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;

use super::status::{KubeError, KubeResult};
use super::types::{GROUP, PLURAL, VERSION};
use crate::e2b::auth::{ApiKeys, Tenant};
use crate::model::{Error, Result};

/// The client certificate chain of a TLS connection, captured when it was accepted.
#[derive(Clone, Debug)]
pub struct PeerCerts(pub Vec<CertificateDer<'static>>);

/// What a request asks to do, in Kubernetes authorization terms.
#[derive(Debug, Clone)]
pub struct Attrs<'a> {
    pub verb: &'static str,
    /// For resource requests: the namespace (None for a cluster-wide list or watch).
    pub namespace: Option<&'a str>,
    pub subresource: Option<&'a str>,
    pub name: Option<&'a str>,
    /// Set for non-resource requests (discovery, OpenAPI).
    pub path: Option<&'a str>,
}

impl<'a> Attrs<'a> {
    /// A request on sandboxes (`name` None for a collection).
    pub fn resource(verb: &'static str, namespace: Option<&'a str>, name: Option<&'a str>) -> Self {
        Attrs {
            verb,
            namespace,
            subresource: None,
            name,
            path: None,
        }
    }

    /// A GET of a non-resource path.
    pub fn path(path: &'a str) -> Self {
        Attrs {
            verb: "get",
            namespace: None,
            subresource: None,
            name: None,
            path: Some(path),
        }
    }
}

#[derive(Debug, Clone)]
pub enum Caller {
    /// An e2b API key.
    Key(Tenant),
    /// A user kube-apiserver authenticated.
    Delegated {
        user: String,
        uid: String,
        groups: Vec<String>,
        extra: BTreeMap<String, Vec<String>>,
    },
}

impl Caller {
    pub fn user(&self) -> String {
        match self {
            Caller::Key(t) if t.admin => "e2b-key:admin".into(),
            Caller::Key(t) => format!("e2b-key:{}", t.namespace),
            Caller::Delegated { user, .. } => user.clone(),
        }
    }
}

/// Settings for trusting kube-apiserver.
#[derive(Debug, Clone, Default)]
pub struct DelegationConfig {
    /// PEM of the CA that signs kube-apiserver's front-proxy client certificate.
    pub requestheader_ca: Vec<u8>,
    /// Common names the front-proxy certificate may have (empty: any name from that CA).
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub extra_prefixes: Vec<String>,
}

impl DelegationConfig {
    pub fn with_defaults(mut self) -> Self {
        if self.username_headers.is_empty() {
            self.username_headers = vec!["X-Remote-User".into()];
        }
        if self.group_headers.is_empty() {
            self.group_headers = vec!["X-Remote-Group".into()];
        }
        if self.extra_prefixes.is_empty() {
            self.extra_prefixes = vec!["X-Remote-Extra-".into()];
        }
        self
    }
}

struct Delegation {
    cfg: DelegationConfig,
    verifier: Arc<dyn ClientCertVerifier>,
    client: kube::Client,
    decisions: Cache<String, Result<(), String>>,
}

pub struct Auth {
    keys: web::Data<ApiKeys>,
    delegation: Option<Delegation>,
}

const DECISION_TTL: Duration = Duration::from_secs(10);
const SAR_TIMEOUT: Duration = Duration::from_secs(10);

fn common_name_and_orgs(der: &[u8]) -> Option<(String, Vec<String>)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let cn = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())?
        .to_string();
    let orgs = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok().map(str::to_string))
        .collect();
    Some((cn, orgs))
}

fn percent_decode(s: &str) -> String {
    crate::e2b::listing::query_unescape(&s.replace('+', "%2B")).unwrap_or_else(|| s.to_string())
}

impl Auth {
    pub fn local(keys: web::Data<ApiKeys>) -> Self {
        Auth {
            keys,
            delegation: None,
        }
    }

    pub fn delegated(
        keys: web::Data<ApiKeys>,
        cfg: DelegationConfig,
        client: kube::Client,
    ) -> Result<Self> {
        let cfg = cfg.with_defaults();
        crate::tlsx::install_crypto();
        let roots = super::tls::roots(&[&cfg.requestheader_ca])?;
        let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
            .build()
            .map_err(|e| Error::invalid(format!("request-header CA: {e}")))?;
        Ok(Auth {
            keys,
            delegation: Some(Delegation {
                cfg,
                verifier,
                client,
                decisions: Cache::builder()
                    .time_to_live(DECISION_TTL)
                    .max_capacity(100_000)
                    .build(),
            }),
        })
    }

    pub fn is_delegated(&self) -> bool {
        self.delegation.is_some()
    }

    /// The front-proxy identity, if the connection's certificate proves it came through
    /// kube-apiserver. Headers are ignored otherwise.
    fn front_proxy(&self, req: &HttpRequest) -> Option<Caller> {
        let d = self.delegation.as_ref()?;
        let certs = req.conn_data::<PeerCerts>()?;
        let (leaf, intermediates) = certs.0.split_first()?;
        d.verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .ok()?;
        let (cn, _) = common_name_and_orgs(leaf)?;
        if !d.cfg.allowed_names.is_empty() && !d.cfg.allowed_names.contains(&cn) {
            tracing::warn!(
                cn,
                "front-proxy certificate name is not allowed; ignoring its headers"
            );
            return None;
        }
        let h = req.headers();
        let user = d
            .cfg
            .username_headers
            .iter()
            .find_map(|name| {
                h.get(name.as_str())
                    .and_then(|v| v.to_str().ok())
                    .filter(|v| !v.is_empty())
            })?
            .to_string();
        let mut groups: Vec<String> = d
            .cfg
            .group_headers
            .iter()
            .flat_map(|name| h.get_all(name.as_str()))
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect();
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".into());
        }
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, value) in h.iter() {
            let name = name.as_str();
            for prefix in &d.cfg.extra_prefixes {
                if let Some(key) = name.strip_prefix(&prefix.to_ascii_lowercase())
                    && let Ok(v) = value.to_str()
                {
                    extra
                        .entry(percent_decode(key).to_ascii_lowercase())
                        .or_default()
                        .push(v.to_string());
                }
            }
        }
        let uid = h
            .get("X-Remote-Uid")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        Some(Caller::Delegated {
            user,
            uid,
            groups,
            extra,
        })
    }

    fn bearer(&self, req: &HttpRequest) -> KubeResult<Caller> {
        let token = req
            .headers()
            .get("Authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        self.keys
            .authenticate(token)
            .map(Caller::Key)
            .map_err(|_| KubeError::unauthorized())
    }

    /// Authenticates the request and checks that it may do `attrs`.
    pub async fn authorize(&self, req: &HttpRequest, attrs: &Attrs<'_>) -> KubeResult<Caller> {
        let caller = match self.front_proxy(req) {
            Some(c) => c,
            None => self.bearer(req)?,
        };
        match &caller {
            Caller::Key(tenant) => self.check_key(&caller, tenant, attrs)?,
            Caller::Delegated { .. } => self.review(&caller, attrs).await?,
        }
        Ok(caller)
    }

    fn check_key(&self, caller: &Caller, tenant: &Tenant, attrs: &Attrs<'_>) -> KubeResult<()> {
        if tenant.admin || attrs.path.is_some() {
            return Ok(());
        }
        match attrs.namespace {
            Some(ns) if ns == tenant.namespace => Ok(()),
            ns => Err(KubeError::forbidden(
                &caller.user(),
                attrs.verb,
                attrs.subresource,
                ns,
                &format!("this API key grants namespace {:?} only", tenant.namespace),
            )),
        }
    }

    async fn review(&self, caller: &Caller, attrs: &Attrs<'_>) -> KubeResult<()> {
        let Some(d) = &self.delegation else {
            return Err(KubeError::unauthorized());
        };
        let Caller::Delegated {
            user,
            uid,
            groups,
            extra,
        } = caller
        else {
            return Err(KubeError::unauthorized());
        };
        // Like kube-apiserver's own delegating authorizer.
        if groups.iter().any(|g| g == "system:masters") {
            return Ok(());
        }
        let mut sorted = groups.clone();
        sorted.sort();
        let key = format!("{user}\0{uid}\0{sorted:?}\0{extra:?}\0{attrs:?}");
        let decision = match d.decisions.get(&key) {
            Some(decision) => decision,
            None => {
                let spec = SubjectAccessReviewSpec {
                    user: Some(user.clone()),
                    uid: (!uid.is_empty()).then(|| uid.clone()),
                    groups: Some(groups.clone()),
                    extra: (!extra.is_empty()).then(|| extra.clone()),
                    resource_attributes: attrs.path.is_none().then(|| ResourceAttributes {
                        namespace: attrs.namespace.map(str::to_string),
                        verb: Some(attrs.verb.into()),
                        group: Some(GROUP.into()),
                        version: Some(VERSION.into()),
                        resource: Some(PLURAL.into()),
                        subresource: attrs.subresource.map(str::to_string),
                        name: attrs.name.map(str::to_string),
                        ..Default::default()
                    }),
                    non_resource_attributes: attrs.path.map(|p| NonResourceAttributes {
                        path: Some(p.to_string()),
                        verb: Some(attrs.verb.into()),
                    }),
                };
                let review = SubjectAccessReview {
                    spec,
                    ..Default::default()
                };
                let api: kube::Api<SubjectAccessReview> = kube::Api::all(d.client.clone());
                let answer = tokio::time::timeout(
                    SAR_TIMEOUT,
                    api.create(&kube::api::PostParams::default(), &review),
                )
                .await;
                let status = match answer {
                    Ok(Ok(r)) => r.status.unwrap_or_default(),
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "SubjectAccessReview failed");
                        return Err(KubeError::internal(format!(
                            "authorization check failed: {e}"
                        )));
                    }
                    Err(_) => {
                        return Err(KubeError::internal("authorization check timed out"));
                    }
                };
                let decision = if status.allowed && !status.denied.unwrap_or(false) {
                    Ok(())
                } else {
                    Err(status.reason.unwrap_or_default())
                };
                d.decisions.insert(key, decision.clone());
                decision
            }
        };
        decision.map_err(|why| match attrs.path {
            Some(p) => KubeError::forbidden_path(user, p),
            None => {
                KubeError::forbidden(user, attrs.verb, attrs.subresource, attrs.namespace, &why)
            }
        })
    }
}

/// Where delegated authentication gets its settings.
#[derive(Debug, Clone, Default)]
pub struct DelegationSource {
    /// PEM file of the front-proxy CA; read from the cluster when unset.
    pub requestheader_ca_file: Option<std::path::PathBuf>,
    pub allowed_names: Vec<String>,
    /// Kubeconfig for SubjectAccessReviews and the ConfigMap; in-cluster when unset.
    pub kubeconfig: Option<std::path::PathBuf>,
}

const AUTH_CONFIGMAP_NS: &str = "kube-system";
const AUTH_CONFIGMAP: &str = "extension-apiserver-authentication";

fn json_list(s: Option<&String>) -> Vec<String> {
    s.and_then(|v| serde_json::from_str::<Vec<String>>(v).ok())
        .unwrap_or_default()
}

/// Connects to the cluster and settles the request-header trust: from flags, or from
/// kube-apiserver's `kube-system/extension-apiserver-authentication` ConfigMap.
pub async fn delegation(source: &DelegationSource) -> Result<(DelegationConfig, kube::Client)> {
    let client = crate::cluster::client(source.kubeconfig.as_deref(), "--delegate-auth").await?;
    let mut cfg = DelegationConfig {
        allowed_names: source.allowed_names.clone(),
        ..Default::default()
    };
    match &source.requestheader_ca_file {
        Some(path) => {
            cfg.requestheader_ca = std::fs::read(path)
                .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        }
        None => {
            let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
                kube::Api::namespaced(client.clone(), AUTH_CONFIGMAP_NS);
            let cm = api.get(AUTH_CONFIGMAP).await.map_err(|e| {
                Error::unavailable(format!("reading {AUTH_CONFIGMAP_NS}/{AUTH_CONFIGMAP}: {e}"))
            })?;
            let data = cm.data.unwrap_or_default();
            cfg.requestheader_ca = data
                .get("requestheader-client-ca-file")
                .cloned()
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "{AUTH_CONFIGMAP} has no requestheader-client-ca-file: kube-apiserver is not set up for aggregation"
                    ))
                })?
                .into_bytes();
            if cfg.allowed_names.is_empty() {
                cfg.allowed_names = json_list(data.get("requestheader-allowed-names"));
            }
            cfg.username_headers = json_list(data.get("requestheader-username-headers"));
            cfg.group_headers = json_list(data.get("requestheader-group-headers"));
            cfg.extra_prefixes = json_list(data.get("requestheader-extra-headers-prefix"));
        }
    }
    Ok((cfg.with_defaults(), client))
}
