//! The server's TLS setup: TLS 1.3 only, the `ring` provider, and client certificates that
//! must chain to the configured CA.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use crate::error::Error;

/// PEM-encoded TLS material for the worker's listener.
#[derive(Clone)]
pub struct TlsMaterial {
    /// The server certificate chain, leaf first.
    pub cert_chain_pem: Vec<u8>,
    /// The server's private key (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: Vec<u8>,
    /// The CA bundle client certificates must chain to (several certificates during a
    /// rotation).
    pub client_ca_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key never reaches a log.
        f.debug_struct("TlsMaterial").finish_non_exhaustive()
    }
}

impl TlsMaterial {
    /// Reads the three PEM files.
    pub fn from_files(cert: &Path, key: &Path, client_ca: &Path) -> Result<Self, Error> {
        let read = |path: &Path| std::fs::read(path).map_err(|e| Error::io("read", path, e));
        Ok(Self {
            cert_chain_pem: read(cert)?,
            key_pem: read(key)?,
            client_ca_pem: read(client_ca)?,
        })
    }

    /// The rustls server configuration (ALPN `h2` and `http/1.1`).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, Error> {
        let tls = |what: String| Error::Tls { what };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = CertificateDer::pem_slice_iter(&self.cert_chain_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| tls(format!("server certificate: {e}")))?;
        if chain.is_empty() {
            return Err(tls("server certificate: no certificate in the PEM".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(&self.key_pem)
            .map_err(|e| tls(format!("server key: {e}")))?;
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(&self.client_ca_pem) {
            let ca = ca.map_err(|e| tls(format!("client CA: {e}")))?;
            roots.add(ca).map_err(|e| tls(format!("client CA: {e}")))?;
        }
        if roots.is_empty() {
            return Err(tls("client CA: no certificate in the PEM".into()));
        }
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
                .build()
                .map_err(|e| tls(format!("client CA: {e}")))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| tls(format!("protocol versions: {e}")))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| tls(format!("server certificate and key: {e}")))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}
