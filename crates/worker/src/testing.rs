//! Test support for crates that test against the reference worker: a throwaway PKI and a
//! leader on loopback. Behind the `testing` feature; never for production.
//!
//! A test leader opens files the way [`reopen_for_this_process`] picks: by handle
//! (production's way) as root, by descriptor otherwise, so the tests also run unprivileged.
//! What by descriptor cannot do (survive a restart with its file references, act as another
//! user) is for tests that call `test_support::requires_root`.

use std::path::Path;
use std::sync::Arc;

use lease_client::{Budgets, Client, ClientConfig, Credentials, EndpointSet, HttpsTransport};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use worker_proto::VolumeGeneration;

use crate::{
    AccessMode, Config, Error, Reopen, Server, SystemClock, Timings, TlsMaterial, Tokens,
    VolumeSpec,
};

/// A CA with a server certificate for `127.0.0.1`/`localhost` and a client certificate, all
/// PEM.
#[derive(Clone)]
pub struct Pki {
    /// The CA certificate.
    pub ca_pem: String,
    /// The server certificate.
    pub server_pem: String,
    /// The server key.
    pub server_key: String,
    /// The client certificate.
    pub client_pem: String,
    /// The client key.
    pub client_key: String,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").finish_non_exhaustive()
    }
}

/// Why a test PKI could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot generate the test PKI")]
pub struct PkiError(#[from] rcgen::Error);

impl Pki {
    /// A fresh PKI whose names mention `name`.
    pub fn generate(name: &str) -> Result<Pki, PkiError> {
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca, ca_key);

        let server_key = KeyPair::generate()?;
        let mut server =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_cert = server.signed_by(&server_key, &issuer)?;

        let client_key = KeyPair::generate()?;
        let mut client = CertificateParams::new(Vec::<String>::new())?;
        client
            .distinguished_name
            .push(DnType::CommonName, format!("{name} node"));
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_cert = client.signed_by(&client_key, &issuer)?;

        Ok(Pki {
            ca_pem: ca_cert.pem(),
            server_pem: server_cert.pem(),
            server_key: server_key.serialize_pem(),
            client_pem: client_cert.pem(),
            client_key: client_key.serialize_pem(),
        })
    }

    /// The worker's TLS material.
    pub fn tls(&self) -> TlsMaterial {
        TlsMaterial {
            cert_chain_pem: self.server_pem.clone().into_bytes(),
            key_pem: self.server_key.clone().into_bytes(),
            client_ca_pem: self.ca_pem.clone().into_bytes(),
        }
    }

    /// A client's credentials with `token`.
    pub fn credentials(&self, token: &str) -> Result<Credentials, lease_client::ConfigError> {
        Credentials::from_pem(
            token,
            self.ca_pem.as_bytes(),
            self.client_pem.as_bytes(),
            self.client_key.as_bytes(),
        )
    }
}

/// A volume spec with generation 1.
pub fn volume(id: &str, access_mode: AccessMode) -> VolumeSpec {
    VolumeSpec {
        volume_id: id.to_owned(),
        volume_generation: 1,
        access_mode,
    }
}

/// How a test worker in this process opens files again: [`Reopen::ByHandle`], production's
/// way, when the process runs as root (as CI does), else [`Reopen::ByDescriptor`], which needs
/// no privilege but loses its file references across a restart. [`leader`] uses it; a
/// harness that builds its own [`Config`] sets `config.reopen` to it.
pub fn reopen_for_this_process() -> Reopen {
    if rustix::process::geteuid().is_root() {
        Reopen::ByHandle
    } else {
        Reopen::ByDescriptor
    }
}

/// Starts a leader on `127.0.0.1:0` serving `volumes` from `state_dir`, accepting `token`, with
/// `timings`, opening files the way [`reopen_for_this_process`] picks.
pub async fn leader(
    pki: &Pki,
    state_dir: &Path,
    volumes: &[VolumeSpec],
    token: &str,
    timings: Timings,
) -> Result<Server, Error> {
    let mut config = Config::new(([127, 0, 0, 1], 0).into(), state_dir, pki.tls());
    config.timings = timings;
    config.volumes = volumes.to_vec();
    config.reopen = reopen_for_this_process();
    Server::start(config, Tokens::new([token]), Arc::new(SystemClock)).await
}

/// A client of `spec` on the worker at `endpoint`, authenticated with `pki`'s client
/// certificate and `token`.
pub fn client(
    pki: &Pki,
    spec: &VolumeSpec,
    endpoint: &str,
    token: &str,
    budgets: Budgets,
) -> Result<Client<HttpsTransport>, lease_client::ConfigError> {
    client_over(
        pki,
        spec,
        endpoint,
        token,
        HttpsTransport::new(&budgets),
        budgets,
    )
}

/// [`client`], with its connections run on `runtime` ([`HttpsTransport::on_runtime`]).
pub fn client_on(
    pki: &Pki,
    spec: &VolumeSpec,
    endpoint: &str,
    token: &str,
    budgets: Budgets,
    runtime: tokio::runtime::Handle,
) -> Result<Client<HttpsTransport>, lease_client::ConfigError> {
    let transport = HttpsTransport::on_runtime(&budgets, runtime);
    client_over(pki, spec, endpoint, token, transport, budgets)
}

fn client_over(
    pki: &Pki,
    spec: &VolumeSpec,
    endpoint: &str,
    token: &str,
    transport: HttpsTransport,
    budgets: Budgets,
) -> Result<Client<HttpsTransport>, lease_client::ConfigError> {
    let config = ClientConfig {
        volume_id: spec.volume_id.clone(),
        volume_generation: VolumeGeneration(spec.volume_generation),
        access_mode: spec.access_mode.to_wire(),
        endpoints: EndpointSet::new([endpoint])?,
        budgets,
    };
    transport.set_credentials(&pki.credentials(token)?);
    Ok(Client::new(config, transport))
}
