//! HTTPS for the admin API (feature `admin-tls`): rustls with aws-lc, as
//! the connectors' TLS, from a certificate chain and a private key in PEM
//! files.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A TLS acceptor for the certificate chain in `certificate` and the key
/// in `key`, or why there is none (naming the file).
pub(super) fn acceptor(certificate: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(certificate)
        .and_then(Iterator::collect)
        .map_err(|e| format!("the admin API's certificate `{}`: {e}", certificate.display()))?;
    if chain.is_empty() {
        return Err(format!("the admin API's certificate `{}` holds no certificate", certificate.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("the admin API's private key `{}`: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("the admin API's TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("the admin API's certificate and key: {e}"))?;
    let mut config = config;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}
