//! Pulls an image from an OCI registry (a build's `fromImage`) with `oci-client`: the
//! manifest for this platform, its config and its layers, each checked against its digest,
//! into a directory `oci::import_layers` then turns into a root. Tenants name the registry, so
//! a node pulls only from public addresses unless its operator names a registry (a mirror, an
//! insecure or a private one); the operator's mirrors stand in for the registries they mirror.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use tokio::io::AsyncWrite;

use crate::model::builds::ImageAuth;
use crate::model::{Error, Result};

/// The default limit on an image's compressed layers: 16 GiB.
pub const DEFAULT_IMAGE_MAX_BYTES: u64 = 16 << 30;

/// How a node reaches registries, as its operator set it.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// `registry=mirror` pairs: pulls from `registry` (as images name it, `docker.io` for
    /// `python:3`) go to `mirror` instead.
    pub mirrors: Vec<(String, String)>,
    /// Registries spoken to over plain HTTP.
    pub insecure: Vec<String>,
    /// Registries that may have private or loopback addresses.
    pub private: Vec<String>,
    /// Extra trusted roots, PEM.
    pub ca_pem: Vec<Vec<u8>>,
    /// Most bytes an image's layers may take, compressed.
    pub max_bytes: u64,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            mirrors: Vec::new(),
            insecure: Vec::new(),
            private: Vec::new(),
            ca_pem: Vec::new(),
            max_bytes: DEFAULT_IMAGE_MAX_BYTES,
        }
    }
}

/// An image on disk: its config and its layers in order.
#[derive(Debug)]
pub struct Pulled {
    /// Where it came from, mirror and digest included.
    pub source: String,
    pub config: Vec<u8>,
    pub layers: Vec<PathBuf>,
}

impl RegistryConfig {
    /// Where `image` is pulled from: its own registry, or the operator's mirror of it.
    fn locate(&self, image: &str) -> Result<Reference> {
        let r: Reference = image.trim().parse().map_err(|e| {
            Error::invalid(format!(
                "fromImage {image:?} is not an image reference: {e}"
            ))
        })?;
        let Some((_, mirror)) = self
            .mirrors
            .iter()
            .find(|(from, _)| from == r.registry() || from == r.resolve_registry())
        else {
            return Ok(r);
        };
        let repo = r.repository().to_string();
        Ok(match (r.tag(), r.digest()) {
            (_, Some(d)) => Reference::with_digest(mirror.clone(), repo, d.to_string()),
            (t, None) => {
                Reference::with_tag(mirror.clone(), repo, t.unwrap_or("latest").to_string())
            }
        })
    }

    /// Whether the operator named `registry` (so it may be private or loopback).
    fn named(&self, registry: &str) -> bool {
        self.private.iter().any(|h| h == registry)
            || self.insecure.iter().any(|h| h == registry)
            || self.mirrors.iter().any(|(_, m)| m == registry)
    }

    /// Refuses a registry the operator did not name whose address is not public: a tenant's
    /// image reference must not become a request to the node's own network.
    async fn check_reachable(&self, registry: &str) -> Result<()> {
        if self.named(registry) {
            return Ok(());
        }
        let addrs = tokio::net::lookup_host(with_port(registry))
            .await
            .map_err(|e| Error::invalid(format!("registry {registry} cannot be resolved: {e}")))?;
        for a in addrs {
            if !is_public(a.ip()) {
                return Err(Error::forbidden(format!(
                    "registry {registry} has the private address {}; this node pulls only from public registries unless its operator allows one (--registry-private, --registry-insecure or --registry-mirror)",
                    a.ip()
                )));
            }
        }
        Ok(())
    }

    fn client(&self) -> Result<Client> {
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(self.insecure.clone()),
            extra_root_certificates: self
                .ca_pem
                .iter()
                .map(|pem| Certificate {
                    encoding: CertificateEncoding::Pem,
                    data: pem.clone(),
                })
                .collect(),
            connect_timeout: Some(Duration::from_secs(15)),
            read_timeout: Some(Duration::from_secs(120)),
            user_agent: concat!("sandbox-gateway/", env!("CARGO_PKG_VERSION")),
            ..ClientConfig::default()
        };
        crate::tlsx::install_crypto();
        Client::try_from(config).map_err(|e| Error::internal(format!("registry client: {e}")))
    }

    /// Pulls `image` into `dir` (which must exist), telling `progress` what it does.
    pub async fn pull(
        &self,
        image: &str,
        auth: &ImageAuth,
        dir: &Path,
        progress: &(dyn Fn(String) + Send + Sync),
    ) -> Result<Pulled> {
        let r = self.locate(image)?;
        self.check_reachable(r.resolve_registry()).await?;
        let auth = match auth {
            ImageAuth::Anonymous => RegistryAuth::Anonymous,
            ImageAuth::Basic { username, password } => {
                RegistryAuth::Basic(username.clone(), password.clone())
            }
        };
        let client = self.client()?;
        let failed = |e: oci_client::errors::OciDistributionError| {
            Error::invalid(format!(
                "pulling {image} from {}: {e}",
                r.resolve_registry()
            ))
        };
        let (manifest, digest, config) = client
            .pull_manifest_and_config(&r, &auth)
            .await
            .map_err(failed)?;
        let total: u64 = manifest
            .layers
            .iter()
            .map(|l| u64::try_from(l.size).unwrap_or(u64::MAX))
            .fold(0, u64::saturating_add);
        if total > self.max_bytes {
            return Err(Error::too_large(format!(
                "image {image} has {} MiB of layers; this node takes images up to {} MiB",
                total >> 20,
                self.max_bytes >> 20
            )));
        }
        if let Some(l) = manifest
            .layers
            .iter()
            .find(|l| l.media_type.contains("zstd") || l.media_type.contains("encrypted"))
        {
            return Err(Error::invalid(format!(
                "image {image} has a layer of type {}; only gzip and uncompressed layers can be imported",
                l.media_type
            )));
        }
        progress(format!(
            "pulling {} ({} layers, {:.1} MiB)",
            r.whole(),
            manifest.layers.len(),
            total as f64 / 1048576.0
        ));
        let mut layers = Vec::new();
        for (i, layer) in manifest.layers.iter().enumerate() {
            let path = dir.join(format!("layer-{i}"));
            let file = tokio::fs::File::create(&path)
                .await
                .map_err(|e| Error::io("writing a layer", e))?;
            let limit = u64::try_from(layer.size).unwrap_or(0);
            client
                .pull_blob(
                    &r,
                    layer,
                    Capped {
                        inner: file,
                        left: limit,
                    },
                )
                .await
                .map_err(failed)?;
            layers.push(path);
        }
        Ok(Pulled {
            source: format!("{}@{digest}", r.whole()),
            config: config.into_bytes(),
            layers,
        })
    }
}

/// `registry` as a `host:port` to resolve: HTTPS's port when it names none.
fn with_port(registry: &str) -> String {
    let has_port = |host: &str, port: &str| {
        !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && !host.contains(':')
            || host.ends_with(']')
    };
    match registry.rsplit_once(':') {
        Some((host, port)) if has_port(host, port) => registry.to_string(),
        _ if registry.starts_with('[') || !registry.contains(':') => format!("{registry}:443"),
        _ => format!("[{registry}]:443"),
    }
}

/// Whether `ip` is an address on the public internet.
fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
                || (a == 198 && (b == 18 || b == 19)) // benchmarking
                || a >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00 // unique local
                || (first & 0xffc0) == 0xfe80 // link local
                || first == 0x2001 && v6.segments()[1] == 0xdb8) // documentation
        }
    }
}

/// A writer that refuses more than a layer's declared size: a registry that sends more is
/// lying about it, and the disk is not for it to fill.
struct Capped<W> {
    inner: W,
    left: u64,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Capped<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if buf.len() as u64 > self.left {
            return Poll::Ready(Err(std::io::Error::other(
                "the registry sent more than the layer's declared size",
            )));
        }
        let this = &mut *self;
        let n = std::task::ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        this.left -= n as u64;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in ["1.1.1.1", "151.101.0.1", "2606:4700::1111"] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn mirrors_stand_in_for_the_registry_they_mirror() {
        let cfg = RegistryConfig {
            mirrors: vec![("docker.io".into(), "127.0.0.1:5000".into())],
            ..RegistryConfig::default()
        };
        let r = cfg.locate("python:3").unwrap();
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.repository(), "library/python");
        assert_eq!(r.tag(), Some("3"));
        let r = cfg.locate("e2bdev/base").unwrap();
        assert_eq!(r.whole(), "127.0.0.1:5000/e2bdev/base:latest");
        let r = cfg.locate("quay.io/a/b:1").unwrap();
        assert_eq!(r.registry(), "quay.io");
        assert!(cfg.named("127.0.0.1:5000"));
        assert!(!cfg.named("quay.io"));
        assert!(cfg.locate("has space:tag").is_err());
        assert!(cfg.locate("").is_err());
    }

    #[test]
    fn registries_get_https_port_when_they_name_none() {
        assert_eq!(with_port("quay.io"), "quay.io:443");
        assert_eq!(with_port("127.0.0.1:5000"), "127.0.0.1:5000");
        assert_eq!(with_port("[::1]:5000"), "[::1]:5000");
        assert_eq!(with_port("[::1]"), "[::1]:443");
        assert_eq!(with_port("::1"), "[::1]:443");
    }

    #[tokio::test]
    async fn a_private_registry_needs_the_operator() {
        let cfg = RegistryConfig::default();
        let e = cfg.check_reachable("127.0.0.1:5000").await.unwrap_err();
        assert!(
            e.message.contains("private address 127.0.0.1"),
            "{}",
            e.message
        );
        assert!(cfg.check_reachable("localhost").await.is_err());
        assert!(cfg.check_reachable("[::1]:5000").await.is_err());
        let cfg = RegistryConfig {
            private: vec!["127.0.0.1:5000".into()],
            ..RegistryConfig::default()
        };
        cfg.check_reachable("127.0.0.1:5000").await.unwrap();
    }

    #[tokio::test]
    async fn a_layer_larger_than_declared_is_refused() {
        use tokio::io::AsyncWriteExt;
        let mut w = Capped {
            inner: Vec::new(),
            left: 4,
        };
        w.write_all(b"abcd").await.unwrap();
        assert!(w.write_all(b"e").await.is_err());
        assert_eq!(w.inner, b"abcd");
    }
}
