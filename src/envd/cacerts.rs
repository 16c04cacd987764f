//! envd's `/init` `caBundle`: the CA a sandbox's egress proxy signs intercepted hosts'
//! certificates with, added where Debian's tools look for trusted certificates: appended to
//! the system bundle (OpenSSL, curl, Python's `ssl`) and kept as a local CA, so that a later
//! `update-ca-certificates` keeps trusting it.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::Path;

/// The bundle OpenSSL-based clients read.
pub const BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Where `update-ca-certificates` finds local CAs.
pub const LOCAL: &str = "/usr/local/share/ca-certificates/e2b-ca.crt";
/// A CA bundle is a certificate or two, never more.
const MAX_PEM: usize = 64 << 10;

/// Installs `pem` into the system's trusted certificates; installing it again changes nothing.
pub fn install(pem: &str) -> io::Result<()> {
    install_at(pem, Path::new(BUNDLE), Path::new(LOCAL))
}

fn install_at(pem: &str, bundle: &Path, local: &Path) -> io::Result<()> {
    let pem = pem.trim();
    if pem.len() > MAX_PEM
        || !pem.starts_with("-----BEGIN CERTIFICATE-----")
        || !pem.ends_with("-----END CERTIFICATE-----")
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "caBundle must be PEM certificates (at most 64 KiB)",
        ));
    }
    if let Some(dir) = local.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(local, format!("{pem}\n"))?;
    let current = match std::fs::read_to_string(bundle) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    if current.contains(pem) {
        return Ok(());
    }
    if let Some(dir) = bundle.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = OpenOptions::new().create(true).append(true).open(bundle)?;
    let sep = if current.is_empty() || current.ends_with('\n') {
        ""
    } else {
        "\n"
    };
    f.write_all(format!("{sep}{pem}\n").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    #[test]
    fn a_ca_is_appended_once_and_kept_as_a_local_ca() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("etc/ssl/certs/ca-certificates.crt");
        let local = dir
            .path()
            .join("usr/local/share/ca-certificates/e2b-ca.crt");
        std::fs::create_dir_all(bundle.parent().unwrap()).unwrap();
        std::fs::write(
            &bundle,
            "-----BEGIN CERTIFICATE-----\nROOT\n-----END CERTIFICATE-----",
        )
        .unwrap();
        install_at(PEM, &bundle, &local).unwrap();
        install_at(PEM, &bundle, &local).unwrap();
        let text = std::fs::read_to_string(&bundle).unwrap();
        assert_eq!(text.matches("MIIB").count(), 1, "{text}");
        assert!(text.starts_with(
            "-----BEGIN CERTIFICATE-----\nROOT\n-----END CERTIFICATE-----\n-----BEGIN"
        ));
        assert_eq!(std::fs::read_to_string(&local).unwrap(), PEM);
    }

    #[test]
    fn anything_but_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (bundle, local) = (dir.path().join("b"), dir.path().join("l"));
        for bad in [
            "",
            "hello",
            "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----",
        ] {
            assert!(install_at(bad, &bundle, &local).is_err(), "{bad}");
        }
        assert!(!bundle.exists() && !local.exists());
    }
}
