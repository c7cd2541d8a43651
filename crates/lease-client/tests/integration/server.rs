//! A minimal HTTPS worker for transport tests: TLS 1.3 requiring a client certificate from
//! one CA, a set of accepted bearer tokens, and a getattr-style answer to every request.
//! Certificates are made per test with rcgen.

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tak_os_lease_client::protocol::{self, ROOT_INO};
use tak_os_lease_client::v1;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A CA that signs leaf certificates.
pub(crate) struct TestCa {
    pub(crate) pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A leaf certificate and its key, in PEM.
pub(crate) struct Leaf {
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
}

impl TestCa {
    pub(crate) fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        TestCa {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    pub(crate) fn server_leaf(&self) -> Leaf {
        self.leaf(
            vec!["127.0.0.1".into(), "localhost".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    pub(crate) fn client_leaf(&self) -> Leaf {
        self.leaf(
            vec!["node-a.example".into()],
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    fn leaf(&self, names: Vec<String>, usage: ExtendedKeyUsagePurpose) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, "leaf");
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// What the server saw, and knobs tests turn while it runs.
pub(crate) struct ServerState {
    tokens: Mutex<HashSet<String>>,
    /// Requests answered with 200.
    pub(crate) answered: AtomicUsize,
    /// Requests refused with 401.
    pub(crate) refused: AtomicUsize,
    /// TLS connections that completed the handshake.
    pub(crate) connections: AtomicUsize,
    in_flight: AtomicUsize,
    /// The most authenticated requests held at once.
    pub(crate) max_in_flight: AtomicUsize,
    gate: watch::Sender<bool>,
}

impl ServerState {
    pub(crate) fn accept_token(&self, token: &str) {
        self.tokens.lock().unwrap().insert(token.to_owned());
    }

    pub(crate) fn revoke_token(&self, token: &str) {
        self.tokens.lock().unwrap().remove(token);
    }

    /// While closed, authenticated requests wait before being answered.
    pub(crate) fn set_gate(&self, open: bool) {
        self.gate.send_replace(open);
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
}

pub(crate) struct TestServer {
    pub(crate) endpoint: String,
    pub(crate) state: Arc<ServerState>,
    task: JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    /// Serves with `server` as its certificate and `client_ca_pem` as the only CA it
    /// accepts client certificates from; `token` is accepted.
    pub(crate) async fn start(server: &Leaf, client_ca_pem: &str, token: &str) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(client_ca_pem.as_bytes()).unwrap())
            .unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.into(),
            provider.clone(),
        )
        .build()
        .unwrap();
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![CertificateDer::from_pem_slice(server.cert_pem.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).unwrap(),
            )
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = listener.local_addr().unwrap().to_string();
        let state = Arc::new(ServerState {
            tokens: Mutex::new(HashSet::from([token.to_owned()])),
            answered: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            gate: watch::Sender::new(true),
        });
        let serving = Arc::clone(&state);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let state = Arc::clone(&serving);
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    state.connections.fetch_add(1, Ordering::SeqCst);
                    let service = service_fn(move |request| handle(Arc::clone(&state), request));
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        TestServer {
            endpoint,
            state,
            task,
        }
    }
}

async fn handle(
    state: Arc<ServerState>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let token = request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::to_owned);
    let authorized = token.is_some_and(|token| state.tokens.lock().unwrap().contains(&token));
    if !authorized || request.uri().path() != protocol::CALL_PATH {
        state.refused.fetch_add(1, Ordering::SeqCst);
        return Ok(status(StatusCode::UNAUTHORIZED));
    }
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    state.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let body = request.into_body().collect().await.map(|b| b.to_bytes());
    let mut gate = state.gate.subscribe();
    let _ = gate.wait_for(|open| *open).await;
    state.in_flight.fetch_sub(1, Ordering::SeqCst);
    let Ok(body) = body else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    let reply = match protocol::decode_request(body.clone()) {
        Ok(request) => v1::Reply {
            request_id: request.request_id.0.to_vec(),
            result: Some(v1::reply::Result::Getattr(v1::Entry {
                file: Some(v1::FileId {
                    ino: ROOT_INO,
                    inode_generation: 0,
                }),
                attr: Some(v1::Attr {
                    mode: 0o040_755,
                    nlink: 2,
                    ..Default::default()
                }),
            })),
            ..Default::default()
        },
        Err(err) => v1::Reply {
            request_id: Vec::new(),
            result: Some(v1::reply::Result::Error(err.to_wire())),
            ..Default::default()
        },
    };
    state.answered.fetch_add(1, Ordering::SeqCst);
    Ok(Response::new(Full::new(protocol::encode_reply(&reply))))
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = code;
    response
}

/// A TCP listener that accepts connections and never says a word.
pub(crate) async fn silent_endpoint() -> (String, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    (endpoint, task)
}

/// Everything a client needs to reach a [`TestServer`], plus the server.
pub(crate) struct Pki {
    pub(crate) ca: TestCa,
    pub(crate) client: Leaf,
    pub(crate) server: Leaf,
}

impl Pki {
    pub(crate) fn new() -> Self {
        let ca = TestCa::new("test CA");
        let client = ca.client_leaf();
        let server = ca.server_leaf();
        Pki { ca, client, server }
    }
}
