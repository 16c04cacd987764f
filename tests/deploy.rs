//! The manifests in deploy/. Every file parses into its Kubernetes type without losing a
//! field (so a misspelt field fails here, not in someone's cluster); kubectl's built-in
//! kustomize renders the whole set; and the pieces point at each other and at the code: the
//! APIService at the gateway Service and port, the probes at the health paths, the container
//! arguments at flags the binary accepts, RBAC at the verbs the code uses, the CRD schema at
//! every field a node publishes. The Helm chart in deploy/helm passes `helm lint --strict`
//! and renders (with `helm template`) a set that passes the same checks; both renders are
//! validated against the Kubernetes 1.33 OpenAPI schemas (`kubernetes-validate --strict`), and
//! the chart's values reach the flags, mounts and objects they name.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::Parser;
use common::*;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, PodSpec, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use sandbox_gateway::cluster::{self, inventory};
use sandbox_gateway::config::{Cli, Command};
use sandbox_gateway::node::config::RuntimeKind;
use serde::{Deserialize, Serialize};
use serde_json::Value;

// cert-manager's types (it has no crate in k8s-openapi); only the fields deploy/ uses, and
// nothing unknown is accepted.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CertManagerObject<S> {
    api_version: String,
    kind: String,
    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    spec: S,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct IssuerSpec {
    self_signed: BTreeMap<String, Value>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CertificateSpec {
    secret_name: String,
    common_name: String,
    dns_names: Vec<String>,
    duration: String,
    renew_before: String,
    private_key: PrivateKey,
    issuer_ref: IssuerRef,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PrivateKey {
    algorithm: String,
    size: u32,
    rotation_policy: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct IssuerRef {
    kind: String,
    name: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Kustomization {
    api_version: String,
    kind: String,
    resources: Vec<String>,
    secret_generator: Vec<SecretGenerator>,
    images: Vec<Value>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SecretGenerator {
    name: String,
    namespace: String,
    files: Vec<String>,
}

/// Every object deploy/ holds, typed.
#[derive(Default)]
struct Objects {
    namespaces: Vec<Namespace>,
    crds: Vec<CustomResourceDefinition>,
    api_services: Vec<APIService>,
    issuers: Vec<CertManagerObject<IssuerSpec>>,
    certificates: Vec<CertManagerObject<CertificateSpec>>,
    service_accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    role_bindings: Vec<RoleBinding>,
    services: Vec<Service>,
    pdbs: Vec<PodDisruptionBudget>,
    deployments: Vec<Deployment>,
    daemon_sets: Vec<DaemonSet>,
    secrets: Vec<Secret>,
}

/// Parses `v` as `T` and checks that writing it back gives `v` again: a field `T` does not
/// know would be silently dropped by the API server too.
fn typed<T: serde::de::DeserializeOwned + Serialize>(v: &Value, what: &str) -> T {
    let t: T = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let back = serde_json::to_value(&t).unwrap();
    assert_eq!(&back, v, "{what}: a field was lost or changed by its type");
    t
}

impl Objects {
    fn add(&mut self, v: Value, what: &str) {
        let kind = v["kind"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "Namespace" => self.namespaces.push(typed(&v, what)),
            "CustomResourceDefinition" => self.crds.push(typed(&v, what)),
            "APIService" => self.api_services.push(typed(&v, what)),
            "Issuer" => self.issuers.push(typed(&v, what)),
            "Certificate" => self.certificates.push(typed(&v, what)),
            "ServiceAccount" => self.service_accounts.push(typed(&v, what)),
            "ClusterRole" => self.cluster_roles.push(typed(&v, what)),
            "ClusterRoleBinding" => self.cluster_role_bindings.push(typed(&v, what)),
            "RoleBinding" => self.role_bindings.push(typed(&v, what)),
            "Service" => self.services.push(typed(&v, what)),
            "PodDisruptionBudget" => self.pdbs.push(typed(&v, what)),
            "Deployment" => self.deployments.push(typed(&v, what)),
            "DaemonSet" => self.daemon_sets.push(typed(&v, what)),
            "Secret" => self.secrets.push(typed(&v, what)),
            other => panic!("{what}: unexpected kind {other:?}"),
        }
    }
}

fn deploy_dir() -> PathBuf {
    repo().join("deploy")
}

fn yaml_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") || n.ends_with(".yml"))
        .collect();
    files.sort();
    files
}

fn parse_yaml(text: &str, what: &str) -> Value {
    serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Renders deploy/ with `kubectl kustomize` (offline), on a copy with made-up secret files.
fn kustomize(tmp: &Path) -> Vec<Value> {
    let copy = tmp.join("deploy");
    std::fs::create_dir_all(copy.join("secrets")).unwrap();
    for f in yaml_files() {
        std::fs::copy(deploy_dir().join(&f), copy.join(&f)).unwrap();
    }
    std::fs::write(copy.join("secrets/fleet-token"), "t0ken\n").unwrap();
    std::fs::write(copy.join("secrets/api-keys"), "e2b_x team-a\n").unwrap();
    std::fs::write(copy.join("secrets/envd-secret"), "s3cret\n").unwrap();
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&copy)
        .output()
        .expect("kubectl (the tests need it on PATH; .ci/run checks for it)");
    assert!(
        out.status.success(),
        "kubectl kustomize: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_saphyr::from_multiple(&text).expect("kustomize output")
}

fn named<'a, T: kube::Resource<DynamicType = ()>>(items: &'a [T], name: &str) -> &'a T {
    items
        .iter()
        .find(|o| o.meta().name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no {} named {name}", T::kind(&())))
}

fn labels(t: &k8s_openapi::api::core::v1::PodTemplateSpec) -> BTreeMap<String, String> {
    t.metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .expect("pod labels")
}

fn container_args(pod: &PodSpec) -> Vec<String> {
    let c = &pod.containers[0];
    let mut args = vec!["sandbox-gateway".to_string()];
    args.extend(c.args.clone().unwrap_or_default());
    args
}

/// Checks that `path` lies in a volume mounted from a Secret named `secret` (by prefix, as
/// kustomize appends a hash) and that the Secret has the file's key.
fn mounted_from_secret(pod: &PodSpec, path: &Path, secret: &str, secrets: &[Secret]) {
    let c = &pod.containers[0];
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| path.starts_with(&m.mount_path))
        .unwrap_or_else(|| panic!("{} is not under any volume mount", path.display()));
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .expect("the mount's volume");
    let secret_name = volume
        .secret
        .as_ref()
        .and_then(|s| s.secret_name.clone())
        .unwrap_or_else(|| panic!("{} is not a Secret volume", mount.name));
    assert!(
        secret_name.starts_with(secret),
        "{secret_name} for {secret}"
    );
    let key = path
        .strip_prefix(&mount.mount_path)
        .unwrap()
        .display()
        .to_string();
    if !secrets.is_empty() {
        let s = named(secrets, &secret_name);
        assert!(
            s.data.as_ref().is_some_and(|d| d.contains_key(&key)),
            "Secret {secret_name} has no key {key}"
        );
    }
}

/// Every key of `value` is described by `schema` (a structural schema prunes the rest).
fn covered(value: &Value, schema: &Value, at: &str) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let sub = schema["properties"]
                    .get(k)
                    .or_else(|| schema.get("additionalProperties"))
                    .unwrap_or_else(|| panic!("the CRD schema has no {at}.{k}"));
                if sub.get("type") == Some(&Value::String("object".into()))
                    && sub.get("properties").is_none()
                    && sub.get("additionalProperties").is_none()
                    && k == "metadata"
                    && at.is_empty()
                {
                    continue;
                }
                covered(v, sub, &format!("{at}.{k}"));
            }
        }
        Value::Array(items) => {
            for v in items {
                covered(v, &schema["items"], &format!("{at}[]"));
            }
        }
        _ => {}
    }
}

fn rule_verbs(role: &ClusterRole) -> BTreeSet<String> {
    let rules = role.rules.as_ref().expect("rules");
    assert_eq!(rules.len(), 1, "one rule, for nodeinventories");
    let r = &rules[0];
    assert_eq!(
        r.api_groups.as_deref(),
        Some(&[inventory::GROUP.to_string()][..])
    );
    assert_eq!(
        r.resources.as_deref(),
        Some(&[inventory::PLURAL.to_string()][..])
    );
    r.verbs.iter().cloned().collect()
}

fn verbs(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn bound_to(
    binding_subjects: Option<&Vec<k8s_openapi::api::rbac::v1::Subject>>,
    sa: &str,
    ns: &str,
) {
    let subjects = binding_subjects.expect("subjects");
    assert!(
        subjects.iter().any(|s| s.kind == "ServiceAccount"
            && s.name == sa
            && s.namespace.as_deref() == Some(ns)),
        "{subjects:?} should name {ns}/{sa}"
    );
}

fn check(objects: &Objects) {
    // The APIService: the whole agents.x-k8s.io/v1beta1, served by the gateway Service.
    assert!(
        objects
            .crds
            .iter()
            .all(|c| c.spec.group != "agents.x-k8s.io"),
        "no CRD may take the APIService's group"
    );
    let api = named(&objects.api_services, "v1beta1.agents.x-k8s.io");
    let api_spec = api.spec.as_ref().expect("spec");
    assert_eq!(api_spec.group.as_deref(), Some("agents.x-k8s.io"));
    assert_eq!(api_spec.version.as_deref(), Some("v1beta1"));
    assert!(api_spec.group_priority_minimum > 0 && api_spec.version_priority > 0);
    assert_ne!(api_spec.insecure_skip_tls_verify, Some(true));
    let svc_ref = api_spec.service.as_ref().expect("a service");
    let ns = svc_ref.namespace.clone().unwrap();
    let svc_name = svc_ref.name.clone().unwrap();
    let svc = named(&objects.services, &svc_name);
    assert_eq!(svc.metadata.namespace.as_deref(), Some(ns.as_str()));
    let port = svc_ref.port.unwrap_or(443);
    let svc_port = svc
        .spec
        .as_ref()
        .unwrap()
        .ports
        .iter()
        .flatten()
        .find(|p| p.port == port)
        .expect("the APIService port on the Service");

    // The Service reaches the gateway's Kubernetes listener, and only gateway pods.
    let gw = named(&objects.deployments, "sandbox-gateway");
    assert_eq!(gw.metadata.namespace.as_deref(), Some(ns.as_str()));
    let spec = gw.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod_labels = labels(&spec.template);
    let selector = svc.spec.as_ref().unwrap().selector.clone().unwrap();
    assert!(selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
    let node_ds = named(&objects.daemon_sets, "sandbox-gateway-node");
    let node_labels = labels(&node_ds.spec.as_ref().unwrap().template);
    assert!(
        !selector.iter().all(|(k, v)| node_labels.get(k) == Some(v)),
        "the Service must not select node pods"
    );
    let pod = spec.template.spec.as_ref().unwrap();
    let container = &pod.containers[0];
    let target = match svc_port.target_port.as_ref().expect("targetPort") {
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(name) => {
            container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .expect("the named container port")
                .container_port
        }
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => *n,
    };
    let Some(Command::Serve(serve)) = Cli::try_parse_from(container_args(pod))
        .expect("gateway args parse")
        .command
    else {
        panic!("the gateway runs serve");
    };
    assert!(
        serve.kube_listen.ends_with(&format!(":{target}")),
        "{} vs {target}",
        serve.kube_listen
    );
    assert!(serve.discover_nodes && serve.delegate_auth);
    assert!(
        serve.nodes.is_empty(),
        "nodes come from NodeInventory objects"
    );

    // Probes: /livez and /readyz over HTTPS on the same listener.
    for (probe, path) in [
        (&container.liveness_probe, "/livez"),
        (&container.readiness_probe, "/readyz"),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("an HTTP probe");
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.scheme.as_deref(), Some("HTTPS"));
        assert_eq!(
            get.port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("https".into())
        );
    }
    let pdb = named(&objects.pdbs, "sandbox-gateway");
    let pdb_labels = pdb
        .spec
        .as_ref()
        .unwrap()
        .selector
        .as_ref()
        .unwrap()
        .match_labels
        .clone()
        .unwrap();
    assert!(pdb_labels.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));

    // Serving certificate: the name kube-apiserver dials, mounted where the flags point, and
    // its CA injected into the APIService.
    let inject = api
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("cert-manager.io/inject-ca-from"))
        .expect("caBundle injection");
    let (cert_ns, cert_name) = inject.split_once('/').unwrap();
    let cert = objects
        .certificates
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(cert_name))
        .expect("the Certificate");
    assert_eq!(cert.metadata.namespace.as_deref(), Some(cert_ns));
    assert!(
        cert.spec
            .dns_names
            .contains(&format!("{svc_name}.{ns}.svc"))
    );
    assert!(
        objects
            .issuers
            .iter()
            .any(|i| i.metadata.name.as_deref() == Some(cert.spec.issuer_ref.name.as_str()))
    );
    for f in [serve.tls_cert_file.as_ref(), serve.tls_key_file.as_ref()] {
        mounted_from_secret(
            pod,
            f.expect("a provided serving certificate"),
            &cert.spec.secret_name,
            &[],
        );
    }
    mounted_from_secret(
        pod,
        serve.node_token_file.as_ref().unwrap(),
        "sandbox-gateway-fleet-token",
        &objects.secrets,
    );
    mounted_from_secret(
        pod,
        serve.api_keys.as_ref().unwrap(),
        "sandbox-gateway-api-keys",
        &objects.secrets,
    );
    mounted_from_secret(
        pod,
        serve.envd_secret_file.as_ref().unwrap(),
        "sandbox-gateway-envd",
        &objects.secrets,
    );

    // The node DaemonSet publishes its inventory with the same fleet token.
    let node_pod = node_ds
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    let Some(Command::Node(node)) = Cli::try_parse_from(container_args(node_pod))
        .expect("node args parse")
        .command
    else {
        panic!("the DaemonSet runs node");
    };
    assert!(node.publish_inventory);
    mounted_from_secret(
        node_pod,
        node.token_file.as_ref().unwrap(),
        "sandbox-gateway-fleet-token",
        &objects.secrets,
    );
    let data_mount = node_pod.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| node.data_dir.starts_with(&m.mount_path))
        .expect("the data dir is a volume");
    let data_volume = node_pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == data_mount.name)
        .unwrap();
    assert!(
        data_volume.host_path.is_some(),
        "checkpoints survive a pod restart"
    );

    // RBAC: exactly the verbs the code uses, bound to the service accounts the pods run as.
    let gw_sa = pod.service_account_name.clone().unwrap();
    let node_sa = node_pod.service_account_name.clone().unwrap();
    named(&objects.service_accounts, &gw_sa);
    named(&objects.service_accounts, &node_sa);
    let role_of = |sa: &str, role_kind: &str, role_name: Option<&str>| {
        objects
            .cluster_role_bindings
            .iter()
            .filter(|b| {
                b.role_ref.kind == role_kind && role_name.is_none_or(|n| b.role_ref.name == n)
            })
            .find(|b| b.subjects.iter().flatten().any(|s| s.name == sa))
            .map(|b| b.role_ref.name.clone())
    };
    let gw_role = role_of(&gw_sa, "ClusterRole", Some(&gw_sa)).expect("a role for the gateway");
    assert_eq!(
        rule_verbs(named(&objects.cluster_roles, &gw_role)),
        verbs(cluster::GATEWAY_VERBS)
    );
    let node_role = role_of(&node_sa, "ClusterRole", Some(&node_sa)).expect("a role for the node");
    assert_eq!(
        rule_verbs(named(&objects.cluster_roles, &node_role)),
        verbs(cluster::NODE_VERBS)
    );
    let delegator = objects
        .cluster_role_bindings
        .iter()
        .find(|b| b.role_ref.name == "system:auth-delegator")
        .expect("system:auth-delegator");
    bound_to(delegator.subjects.as_ref(), &gw_sa, &ns);
    let reader = objects
        .role_bindings
        .iter()
        .find(|b| b.role_ref.name == "extension-apiserver-authentication-reader")
        .expect("the authentication reader");
    assert_eq!(reader.role_ref.kind, "Role");
    assert_eq!(reader.metadata.namespace.as_deref(), Some("kube-system"));
    bound_to(reader.subjects.as_ref(), &gw_sa, &ns);

    // The NodeInventory CRD describes every field a node publishes.
    let crd = named(
        &objects.crds,
        &format!("{}.{}", inventory::PLURAL, inventory::GROUP),
    );
    assert_eq!(crd.spec.group, inventory::GROUP);
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(crd.spec.names.kind, inventory::KIND);
    let version = crd
        .spec
        .versions
        .iter()
        .find(|v| v.name == inventory::VERSION)
        .expect("v1beta1");
    assert!(version.served && version.storage);
    let schema = serde_json::to_value(
        version
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap();
    covered(
        &serde_json::to_value(full_inventory()).unwrap(),
        &schema,
        "",
    );
}

/// A NodeInventory with every optional field set.
fn full_inventory() -> inventory::NodeInventory {
    use sandbox_gateway::model::*;
    let record = SandboxRecord {
        id: "sb_0000000000000001".into(),
        token: String::new(),
        key: PoolKey::new("base", "egress", "small").unwrap(),
        claim_ref: "team-a/box".into(),
        claimed_at: chrono::Utc::now(),
        deadline: chrono::Utc::now(),
        phase: Phase::Paused,
        address: "10.0.0.1:4000".into(),
        metadata: BTreeMap::from([("k".into(), "v".into())]),
        env_vars: BTreeMap::new(),
        from_checkpoint: Some("ck_0000000000000001".into()),
        forked_from: Some("sb_0000000000000002".into()),
        node: "n1".into(),
        cpu_count: 1,
        memory_bytes: 1,
        state_dir: String::new(),
        disk_bytes: 1,
        lifecycle: Default::default(),
        network: Default::default(),
        volume_mounts: Vec::new(),
        lease_seconds: 0,
        paused: None,
    };
    let info = NodeInfo {
        name: "n1".into(),
        advertise_address: "10.0.0.1:7777".into(),
        pools: vec![PoolStatus {
            key: record.key.clone(),
            warm: 1,
            target: 2,
            booting: 0,
            captures_memory: true,
        }],
        claimed: 1,
        paused: 1,
        checkpoints: 0,
        limits: NodeLimits {
            lease_default_seconds: 1,
            lease_max_seconds: 1,
            fork_limit: 1,
            max_sandboxes: 1,
            cold_start: true,
            paused_retention_seconds: 3600,
        },
        templates: vec![],
        revision: 1,
        lost: vec![],
        runtime: "process".into(),
        version: "0".into(),
        started_at: chrono::Utc::now(),
        disk_bytes: 1,
        usage: vec![],
        data_address: String::new(),
        template_info: vec![TemplateInfo {
            name: "k3x.6f1c2b8e".into(),
            size_bytes: 1,
            packages: vec!["jq".into()],
            kind: "built".into(),
            owner: "team-a".into(),
            e2b_names: vec!["k3x".into(), "my-env".into()],
            ..Default::default()
        }],
        boundary: String::new(),
        captures_memory: false,
        templates_building: vec![],
        builds: false,
    };
    inventory::NodeInventory::snapshot(&info, &[record], chrono::Utc::now())
}

#[test]
fn every_manifest_parses_into_its_type_and_the_set_fits_together() {
    let files = yaml_files();
    let kustomization: Kustomization = {
        let v = parse_yaml(
            &std::fs::read_to_string(deploy_dir().join("kustomization.yaml")).unwrap(),
            "kustomization.yaml",
        );
        typed(&v, "kustomization.yaml")
    };
    assert_eq!(kustomization.kind, "Kustomization");
    let listed: BTreeSet<&str> = kustomization.resources.iter().map(String::as_str).collect();
    let on_disk: BTreeSet<&str> = files
        .iter()
        .map(String::as_str)
        .filter(|f| *f != "kustomization.yaml")
        .collect();
    assert_eq!(
        listed, on_disk,
        "the kustomization lists every manifest, and only those"
    );
    for g in &kustomization.secret_generator {
        for f in &g.files {
            let path = f.split_once('=').map_or(f.as_str(), |(_, p)| p);
            assert!(
                path.starts_with("secrets/"),
                "{path}: secrets come from deploy/secrets/ (never committed)"
            );
        }
    }

    // Each file on its own.
    let mut objects = Objects::default();
    for f in &on_disk {
        let text = std::fs::read_to_string(deploy_dir().join(f)).unwrap();
        objects.add(parse_yaml(&text, f), f);
    }
    check(&objects);

    // And the rendered set, with generated Secrets and rewritten references.
    let (tmp, _) = workspace();
    let rendered = kustomize(tmp.path());
    let mut objects = Objects::default();
    for (i, v) in rendered.into_iter().enumerate() {
        objects.add(v, &format!("kustomize output #{i}"));
    }
    assert_eq!(objects.secrets.len(), kustomization.secret_generator.len());
    check(&objects);
}

/// A tool of the `py-deploy` venv tests/e2b/setup.sh installs: `helm` (3.17.3) or
/// `kubernetes-validate` (1.37.0).
fn deploy_tool(name: &str) -> PathBuf {
    ensure_sdks();
    sdk_dir().join("py-deploy/bin").join(name)
}

fn chart_dir() -> PathBuf {
    deploy_dir().join("helm/sandbox-gateway")
}

/// `helm template` of the chart as release `sandbox-gateway` in `sandbox-system`, with the
/// CRDs: Ok(the manifests' text) or Err(helm's error).
fn helm_template(sets: &[&str]) -> Result<String, String> {
    let mut cmd = std::process::Command::new(deploy_tool("helm"));
    cmd.args(["template", "sandbox-gateway"])
        .arg(chart_dir())
        .args(["--namespace", "sandbox-system", "--include-crds"]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("helm runs");
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("UTF-8"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn rendered_objects(text: &str, what: &str) -> Objects {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).expect("helm's YAML");
    let mut objects = Objects::default();
    for (i, v) in docs.into_iter().filter(|v| !v.is_null()).enumerate() {
        objects.add(v, &format!("{what} #{i}"));
    }
    objects
}

/// Validates manifests against the Kubernetes 1.33 OpenAPI schemas (strict: an unknown field
/// fails). cert-manager's kinds have no schema there and are only warned about.
fn kubernetes_validate(text: &str, what: &str) {
    let tmp = tempfile::tempdir().expect("tmp");
    let file = tmp.path().join("manifests.yaml");
    std::fs::write(&file, text).expect("write");
    let out = std::process::Command::new(deploy_tool("kubernetes-validate"))
        .args(["-k", "1.33", "--strict"])
        .arg(&file)
        .output()
        .expect("kubernetes-validate runs");
    let report =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !report.contains("ERROR"),
        "{what}:\n{report}"
    );
    let passed = report
        .lines()
        .filter(|l| l.contains(" passed for resource "))
        .count();
    assert!(
        passed >= 15,
        "{what}: only {passed} objects validated:\n{report}"
    );
}

fn gateway_serve(objects: &Objects) -> (PodSpec, sandbox_gateway::config::ServeArgs) {
    let gw = named(&objects.deployments, "sandbox-gateway");
    let pod = gw.spec.as_ref().unwrap().template.spec.clone().unwrap();
    let Some(Command::Serve(serve)) = Cli::try_parse_from(container_args(&pod))
        .expect("gateway args parse")
        .command
    else {
        panic!("the gateway runs serve");
    };
    (pod, *serve)
}

fn node_args(objects: &Objects) -> (PodSpec, sandbox_gateway::config::NodeArgs) {
    let ds = named(&objects.daemon_sets, "sandbox-gateway-node");
    let pod = ds.spec.as_ref().unwrap().template.spec.clone().unwrap();
    let Some(Command::Node(node)) = Cli::try_parse_from(container_args(&pod))
        .expect("node args parse")
        .command
    else {
        panic!("the DaemonSet runs node");
    };
    (pod, *node)
}

fn pools(node: &sandbox_gateway::config::NodeArgs) -> Vec<(String, u32)> {
    node.pools
        .iter()
        .map(|p| (p.key.to_string(), p.target))
        .collect()
}

#[test]
fn the_helm_chart_lints_and_renders_the_system_the_manifests_describe() {
    let lint = std::process::Command::new(deploy_tool("helm"))
        .args(["lint", "--strict"])
        .arg(chart_dir())
        .args(["--set", "secrets.apiKeys=e2b_x team-a"])
        .output()
        .expect("helm lint runs");
    assert!(
        lint.status.success(),
        "helm lint: {}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );
    let text = helm_template(&["secrets.apiKeys=e2b_x team-a"]).expect("helm template");
    kubernetes_validate(&text, "helm template");
    // The same checks as the kustomization's: names, ports, probes, flags, secrets, RBAC, CRD.
    let objects = rendered_objects(&text, "helm template");
    check(&objects);
    // Generated secrets are real ones, and the gateway and nodes share the fleet token.
    let fleet = named(&objects.secrets, "sandbox-gateway-fleet-token");
    let token = &fleet.data.as_ref().unwrap()["token"].0;
    assert!(token.len() >= 32, "a fleet token of {} bytes", token.len());
    let (_, serve) = gateway_serve(&objects);
    assert!(
        serve.e2b_domain == "localhost" && !serve.e2b_tls,
        "the binary's defaults"
    );
    // Metrics: the pods say where Prometheus scrapes them, and the node's port is where its
    // data plane (which answers GET /metrics) listens.
    let (node_pod, node) = node_args(&objects);
    assert_eq!(
        pools(&node),
        [
            ("base/egress/small".into(), 8),
            ("base/none/small".into(), 4)
        ]
    );
    assert_eq!(node.sandboxes.runtime, RuntimeKind::Builtin);
    let ds = named(&objects.daemon_sets, "sandbox-gateway-node");
    let annotations = ds
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .clone()
        .unwrap();
    let port = &annotations["prometheus.io/port"];
    assert!(
        node.data_listen
            .as_deref()
            .is_some_and(|l| l.ends_with(&format!(":{port}")))
    );
    assert!(
        node_pod.containers[0]
            .ports
            .iter()
            .flatten()
            .any(|p| p.container_port.to_string() == *port)
    );

    // The kustomization's render passes the same schema check.
    let (tmp, _) = workspace();
    let kustomized = kustomize(tmp.path());
    let as_yaml: Vec<String> = kustomized
        .iter()
        .map(|v| serde_json::to_string(v).unwrap())
        .collect();
    kubernetes_validate(&as_yaml.join("\n---\n"), "kubectl kustomize");
}

#[test]
fn the_helm_chart_takes_its_values_and_refuses_incomplete_ones() {
    let text = helm_template(&[
        "secrets.existingApiKeysSecret=team-keys",
        "gateway.replicas=3",
        "gateway.e2bDomain=sb.example.com",
        "gateway.e2bTls.secretName=e2b-tls",
        "gateway.servingCert.certManager=false",
        "gateway.servingCert.secretName=my-serving-cert",
        "gateway.servingCert.caBundle=Zm9v",
        "node.runtime=gvisor",
        "node.maxSandboxes=50",
        "node.pools={base=2,code-interpreter=1}",
    ])
    .expect("helm template");
    kubernetes_validate(&text, "helm template with values");
    let objects = rendered_objects(&text, "helm template with values");
    let gw = named(&objects.deployments, "sandbox-gateway");
    assert_eq!(gw.spec.as_ref().unwrap().replicas, Some(3));
    let (pod, serve) = gateway_serve(&objects);
    assert_eq!(serve.e2b_domain, "sb.example.com");
    assert!(serve.e2b_tls);
    mounted_from_secret(&pod, serve.e2b_tls_cert.as_ref().unwrap(), "e2b-tls", &[]);
    mounted_from_secret(
        &pod,
        serve.tls_cert_file.as_ref().unwrap(),
        "my-serving-cert",
        &[],
    );
    mounted_from_secret(&pod, serve.api_keys.as_ref().unwrap(), "team-keys", &[]);
    assert!(objects.issuers.is_empty() && objects.certificates.is_empty());
    assert!(
        objects
            .secrets
            .iter()
            .all(|s| s.metadata.name.as_deref() != Some("sandbox-gateway-api-keys")),
        "an existing keys Secret is not rendered"
    );
    let api = named(&objects.api_services, "v1beta1.agents.x-k8s.io");
    assert_eq!(
        api.spec
            .as_ref()
            .unwrap()
            .ca_bundle
            .as_ref()
            .map(|b| b.0.as_slice()),
        Some(&b"foo"[..])
    );
    let (_, node) = node_args(&objects);
    assert_eq!(node.sandboxes.runtime, RuntimeKind::Gvisor);
    assert_eq!(node.max_sandboxes, 50);
    assert_eq!(
        pools(&node),
        [
            ("base/none/small".into(), 2),
            ("code-interpreter/none/small".into(), 1)
        ]
    );

    // Incomplete values fail the render with what is missing.
    let no_keys = helm_template(&[]).expect_err("no API keys");
    assert!(no_keys.contains("secrets.apiKeys"), "{no_keys}");
    let no_cert = helm_template(&[
        "secrets.apiKeys=e2b_x team-a",
        "gateway.servingCert.certManager=false",
    ])
    .expect_err("no serving certificate");
    assert!(
        no_cert.contains("gateway.servingCert.secretName"),
        "{no_cert}"
    );
}
