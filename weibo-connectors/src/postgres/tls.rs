//! TLS for the Postgres sink (feature `postgres-tls`): tokio-postgres over
//! rustls, with aws-lc as the sink's own crypto provider (no process-wide
//! provider is installed, so other rustls clients in the process keep
//! theirs). The server's certificate and host name are always verified:
//! against the system's roots, or the root certificates of a PEM file.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use weibo::{Error, Result};

/// Makes verified TLS connections to the server.
#[derive(Clone)]
pub(crate) struct MakeRustls {
    config: Arc<rustls::ClientConfig>,
}

impl MakeRustls {
    /// Trusting the system's roots, or only those in the PEM file `roots`.
    pub(crate) fn new(name: &str, roots: Option<&Path>) -> Result<Self> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::connector_caused(name, "cannot set up TLS".to_string(), e))?;
        let config = match roots {
            Some(path) => {
                let mut store = rustls::RootCertStore::empty();
                let certs = CertificateDer::pem_file_iter(path).map_err(|e| {
                    Error::connector_caused(name, format!("cannot read root certificates `{}`", path.display()), e)
                })?;
                for (i, cert) in certs.enumerate() {
                    let cert = cert.map_err(|e| {
                        Error::connector_caused(
                            name,
                            format!("certificate {} in `{}` does not parse", i + 1, path.display()),
                            e,
                        )
                    })?;
                    store.add(cert).map_err(|e| {
                        Error::connector_caused(
                            name,
                            format!("certificate {} in `{}` is not a usable root", i + 1, path.display()),
                            e,
                        )
                    })?;
                }
                if store.is_empty() {
                    return Err(Error::connector(name, format!("`{}` holds no certificate", path.display())));
                }
                builder.with_root_certificates(store).with_no_client_auth()
            }
            None => {
                let verifier = rustls_platform_verifier::Verifier::new(provider).map_err(|e| {
                    Error::connector_caused(name, "cannot load the system's root certificates".to_string(), e)
                })?;
                builder.dangerous().with_custom_certificate_verifier(Arc::new(verifier)).with_no_client_auth()
            }
        };
        Ok(Self { config: Arc::new(config) })
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> MakeTlsConnect<S> for MakeRustls {
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, domain: &str) -> std::result::Result<RustlsConnect, Self::Error> {
        Ok(RustlsConnect { config: Arc::clone(&self.config), server: ServerName::try_from(domain.to_string())? })
    }
}

/// One connection's TLS handshake.
pub(crate) struct RustlsConnect {
    config: Arc<rustls::ClientConfig>,
    server: ServerName<'static>,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> TlsConnect<S> for RustlsConnect {
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let stream = tokio_rustls::TlsConnector::from(self.config).connect(self.server, stream).await?;
            Ok(RustlsStream(stream))
        })
    }
}

/// A TLS connection to the server.
pub(crate) struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    /// No channel binding (SCRAM without `-PLUS`, libpq's
    /// `channel_binding=prefer` against such a client).
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}
