//! Certificates, servers and clients for the integration tests.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use lease_client::{
    Budgets, Client, ClientConfig, EndpointSet, HttpsTransport, Transport as _, TransportError,
};
use worker::{AccessMode, Clock, Config, Role, Server, SystemClock, Timings, Tokens, VolumeSpec};
use worker_proto::v1;
use worker_proto::v1::request::Op;
use worker_proto::{MountEpoch, VolumeGeneration, decode_reply, encode_request};

/// Every duration in these tests is the default times this factor.
pub(crate) const SCALE: f64 = 0.1;
pub(crate) const TOKEN: &str = "test-token-0123456789";

pub(crate) fn timings() -> Timings {
    Timings::default().scaled(SCALE)
}

pub(crate) fn budgets() -> Budgets {
    Budgets::default().scaled(SCALE)
}

pub(crate) use worker::testing::Pki;

pub(crate) fn pki(name: &str) -> Pki {
    Pki::generate(name).unwrap()
}

/// The test token's credentials.
pub(crate) fn credentials(pki: &Pki, token: &str) -> lease_client::Credentials {
    pki.credentials(token).unwrap()
}

pub(crate) fn rwo(id: &str) -> VolumeSpec {
    VolumeSpec {
        volume_id: id.to_owned(),
        volume_generation: 1,
        access_mode: AccessMode::Rwo,
    }
}

pub(crate) fn rwx(id: &str) -> VolumeSpec {
    VolumeSpec {
        volume_id: id.to_owned(),
        volume_generation: 1,
        access_mode: AccessMode::Rwx,
    }
}

/// A leader's config; files are reopened by handle as root, by descriptor otherwise
/// ([`worker::testing::reopen_for_this_process`]).
pub(crate) fn config(pki: &Pki, state_dir: &std::path::Path, volumes: &[VolumeSpec]) -> Config {
    let mut config = Config::new("127.0.0.1:0".parse().unwrap(), state_dir, pki.tls());
    config.timings = timings();
    config.volumes = volumes.to_vec();
    config.reopen = worker::testing::reopen_for_this_process();
    config
}

pub(crate) async fn leader(
    pki: &Pki,
    state_dir: &std::path::Path,
    volumes: &[VolumeSpec],
) -> Server {
    leader_with_clock(pki, state_dir, volumes, Arc::new(SystemClock)).await
}

pub(crate) async fn leader_with_clock(
    pki: &Pki,
    state_dir: &std::path::Path,
    volumes: &[VolumeSpec],
    clock: Arc<dyn Clock>,
) -> Server {
    Server::start(config(pki, state_dir, volumes), Tokens::new([TOKEN]), clock)
        .await
        .unwrap()
}

pub(crate) async fn follower(pki: &Pki, leader: &str) -> Server {
    let mut config = config(pki, std::path::Path::new(""), &[]);
    config.role = Role::Follower {
        leader: leader.to_owned(),
    };
    let server = Server::start(config, Tokens::new([TOKEN]), Arc::new(SystemClock))
        .await
        .unwrap();
    // Let the first leader probe finish.
    tokio::time::sleep(timings().probe_timeout + Duration::from_millis(50)).await;
    server
}

/// An address on which nothing listens.
pub(crate) async fn dead_endpoint() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    address.to_string()
}

pub(crate) fn client(
    pki: &Pki,
    spec: &VolumeSpec,
    endpoints: &[String],
    budgets: Budgets,
) -> Client<HttpsTransport> {
    let config = ClientConfig {
        volume_id: spec.volume_id.clone(),
        volume_generation: VolumeGeneration(spec.volume_generation),
        access_mode: spec.access_mode.to_wire(),
        endpoints: EndpointSet::new(endpoints).unwrap(),
        budgets,
    };
    Client::new(
        config,
        HttpsTransport::with_credentials(&budgets, &credentials(pki, TOKEN)),
    )
}

/// Encodes a request as a client would.
pub(crate) fn request(spec: &VolumeSpec, id: [u8; 16], epoch: Option<[u8; 16]>, op: Op) -> Bytes {
    encode_request(&v1::Request {
        volume_id: spec.volume_id.clone(),
        volume_generation: spec.volume_generation,
        request_id: id.to_vec(),
        mount_epoch: epoch.map(|e| e.to_vec()).unwrap_or_default(),
        access_mode: spec.access_mode.to_wire().into(),
        op: Some(op),
    })
}

/// One raw attempt: POST `body` to `endpoint`.
pub(crate) async fn raw(
    pki: &Pki,
    endpoint: &str,
    body: Bytes,
) -> Result<v1::Reply, TransportError> {
    let budgets = budgets();
    let transport = HttpsTransport::with_credentials(&budgets, &credentials(pki, TOKEN));
    let deadline = Instant::now() + budgets.call;
    let bytes = transport.send(endpoint, body, deadline).await?;
    Ok(decode_reply(bytes).unwrap())
}

/// The error kind of a reply, or `None` for a result.
pub(crate) fn error_kind(reply: &v1::Reply) -> Option<v1::ErrorKind> {
    match &reply.result {
        Some(v1::reply::Result::Error(e)) => Some(e.kind()),
        _ => None,
    }
}

pub(crate) fn root() -> v1::FileId {
    v1::FileId {
        ino: worker::ROOT_INO,
        inode_generation: worker::ROOT_GENERATION,
    }
}

pub(crate) fn getattr(file: v1::FileId) -> Op {
    Op::Getattr(v1::GetattrRequest {
        file: Some(file),
        handle: None,
    })
}

pub(crate) fn mkdir(parent: v1::FileId, name: &str) -> Op {
    Op::Mkdir(v1::MkdirRequest {
        parent: Some(parent),
        name: name.as_bytes().to_vec(),
        mode: 0o755,
        umask: 0o022,
        caller: None,
    })
}

pub(crate) fn create(parent: v1::FileId, name: &str) -> Op {
    Op::Create(v1::CreateRequest {
        parent: Some(parent),
        name: name.as_bytes().to_vec(),
        mode: 0o644,
        umask: 0o022,
        flags: libc::O_RDWR as u32,
        caller: None,
    })
}

pub(crate) fn lookup(parent: v1::FileId, name: &str) -> Op {
    Op::Lookup(v1::LookupRequest {
        parent: Some(parent),
        name: name.as_bytes().to_vec(),
    })
}

pub(crate) fn unlink(parent: v1::FileId, name: &str) -> Op {
    Op::Unlink(v1::UnlinkRequest {
        parent: Some(parent),
        name: name.as_bytes().to_vec(),
    })
}

pub(crate) fn claim(node: &str) -> Op {
    Op::ClaimMount(v1::ClaimMountRequest {
        node_id: node.to_owned(),
    })
}

pub(crate) fn entry_of(result: &v1::reply::Result) -> v1::Entry {
    match result {
        v1::reply::Result::Lookup(e)
        | v1::reply::Result::Getattr(e)
        | v1::reply::Result::Mkdir(e)
        | v1::reply::Result::Mknod(e)
        | v1::reply::Result::Setattr(e)
        | v1::reply::Result::Link(e)
        | v1::reply::Result::Symlink(e) => *e,
        v1::reply::Result::Create(c) => c.entry.unwrap(),
        other => panic!("no entry in {other:?}"),
    }
}

pub(crate) fn file_of(result: &v1::reply::Result) -> v1::FileId {
    entry_of(result).file.unwrap()
}

pub(crate) fn epoch(byte: u8) -> MountEpoch {
    MountEpoch([byte; 16])
}

/// POSTs JSON to an admin path over HTTP/1.1 with the test client certificate; the status.
pub(crate) async fn admin(pki: &Pki, endpoint: &str, path: &str, body: &str, token: &str) -> u16 {
    admin_reply(pki, endpoint, path, body, Some(token)).await.0
}

/// POSTs JSON to an admin path over HTTP/1.1 with the test client certificate, with `token`
/// as the bearer token or without an `Authorization` header; the status and the body.
pub(crate) async fn admin_reply(
    pki: &Pki,
    endpoint: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, String) {
    use http_body_util::{BodyExt as _, Full};
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(pki.ca_pem.as_bytes()).unwrap())
        .unwrap();
    let chain = vec![CertificateDer::from_pem_slice(pki.client_pem.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(pki.client_key.as_bytes()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(endpoint).await.unwrap();
    let tls = connector
        .connect(ServerName::try_from("127.0.0.1").unwrap().to_owned(), tcp)
        .await
        .unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(connection);
    let mut request = hyper::Request::post(path)
        .header("host", endpoint)
        .header("content-type", "application/json");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}
