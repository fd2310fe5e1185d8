//! HTTPS for the dashboard and `/metrics` (`--http-cert`, `--http-key`):
//! a TCP listener whose connections are TLS-handshaken, each in a task of
//! its own (bounded in time), so a slow or silent client never holds up the
//! others; axum serves what comes out.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How long a client has to finish its handshake.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const READY: usize = 64;

/// Why the certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    /// A file could not be read or holds no PEM of the kind expected.
    #[error("{flag} {path}: {detail}")]
    File {
        /// The flag that named it.
        flag: &'static str,
        /// The file.
        path: String,
        /// What went wrong.
        detail: String,
    },
    /// rustls refused the pair.
    #[error("--http-cert and --http-key do not make a TLS server: {0}")]
    Config(String),
}

/// A TLS acceptor for the certificate chain in `cert` and the key in
/// `key` (PEM files).
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsSetupError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let file = |flag, path: &Path, detail: String| TlsSetupError::File {
        flag,
        path: path.display().to_string(),
        detail,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| file("--http-cert", cert, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| file("--http-cert", cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(file("--http-cert", cert, "no certificate in it".into()));
    }
    let key =
        PrivateKeyDer::from_pem_file(key).map_err(|e| file("--http-key", key, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsSetupError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| TlsSetupError::Config(e.to_string()))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A listener that hands axum TLS streams.
pub struct TlsListener {
    ready: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Accepts on `tcp` and handshakes with `acceptor`.
    pub fn new(tcp: TcpListener, acceptor: TlsAcceptor) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, ready) = tokio::sync::mpsc::channel(READY);
        let accepting = tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "the dashboard could not accept a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_WITHIN, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(peer = %peer, error = %e, "a TLS handshake failed");
                        }
                        Err(_) => tracing::debug!(peer = %peer, "a TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self {
            ready,
            local,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accepting task ended (it never does on its own): serve
            // nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
