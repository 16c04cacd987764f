//! TLS helpers every side shares: the one crypto provider (ring) and reading PEM certificates.

use rustls::pki_types::CertificateDer;

use crate::model::{Error, Result};

/// Installs the process-wide rustls crypto provider (ring) once.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub fn parse_certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
    let certs: std::result::Result<Vec<_>, _> = rustls_pemfile::certs(&mut &pem[..]).collect();
    let certs = certs.map_err(|e| Error::invalid(format!("parsing PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(Error::invalid("no certificate found in PEM data"));
    }
    Ok(certs)
}
