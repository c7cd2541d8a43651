//! The network boundary: the [`Transport`] trait, credentials, and the HTTPS implementation.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioTimer;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::ConfigError;
use crate::config::Budgets;
use crate::policy::Failure;
use crate::protocol::{CALL_PATH, CONTENT_TYPE as PROTOBUF, MAX_MESSAGE_BYTES};

/// Why one attempt brought no reply body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportError {
    /// The request certainly did not reach the worker's protocol handling.
    NotDelivered(Failure),
    /// The request may have reached the worker, but no reply came back.
    MaybeDelivered(Failure),
    /// The worker refused the credentials (HTTP 401 or 403). `credentials_changed` is true
    /// when newer credentials were installed after this attempt took its snapshot.
    Unauthorized {
        /// Whether a retry would use other credentials.
        credentials_changed: bool,
    },
    /// The worker refused the request with another 4xx status: nothing was applied.
    Rejected {
        /// The HTTP status.
        status: u16,
    },
}

/// Sends one attempt of a call to one endpoint. The network boundary of the client: the
/// real implementation is [`HttpsTransport`]; tests use the stateful fake in
/// `testing` module (feature `testing`).
pub trait Transport: Send + Sync + 'static {
    /// POSTs `body` to `endpoint` (`host:port`) and returns the reply body of an HTTP 200.
    /// The caller abandons the future at `deadline`; an implementation may also stop there.
    fn send(
        &self,
        endpoint: &str,
        body: Bytes,
        deadline: Instant,
    ) -> impl Future<Output = Result<Bytes, TransportError>> + Send;
}

/// The material a client authenticates with: a bearer token, the CA bundle that signs the
/// workers' certificates (several certificates during a CA rotation), and a client
/// certificate chain with its key.
///
/// Its `Debug` output names no secret.
#[derive(Clone)]
pub struct Credentials {
    tls: Arc<rustls::ClientConfig>,
    authorization: HeaderValue,
    ca_certificates: usize,
}

impl Credentials {
    /// Builds credentials from PEM: `ca_bundle` may hold several certificates, all trusted;
    /// `client_chain` holds the client certificate first; `client_key` holds its private key
    /// (PKCS#8, PKCS#1 or SEC1). Only TLS 1.3 is offered.
    pub fn from_pem(
        token: &str,
        ca_bundle: &[u8],
        client_chain: &[u8],
        client_key: &[u8],
    ) -> Result<Self, ConfigError> {
        let invalid = |what: &'static str| {
            move |err: rustls::pki_types::pem::Error| ConfigError::InvalidCredentials {
                what,
                source: Some(Box::new(err)),
            }
        };
        let mut roots = rustls::RootCertStore::empty();
        let mut ca_certificates = 0;
        for cert in CertificateDer::pem_slice_iter(ca_bundle) {
            roots
                .add(cert.map_err(invalid("CA bundle"))?)
                .map_err(|err| ConfigError::InvalidCredentials {
                    what: "CA bundle",
                    source: Some(Box::new(err)),
                })?;
            ca_certificates += 1;
        }
        if ca_certificates == 0 {
            return Err(ConfigError::InvalidCredentials {
                what: "CA bundle",
                source: None,
            });
        }
        let chain = CertificateDer::pem_slice_iter(client_chain)
            .collect::<Result<Vec<_>, _>>()
            .map_err(invalid("client certificate"))?;
        if chain.is_empty() {
            return Err(ConfigError::InvalidCredentials {
                what: "client certificate",
                source: None,
            });
        }
        let key = PrivateKeyDer::from_pem_slice(client_key).map_err(invalid("client key"))?;

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|err| ConfigError::InvalidCredentials {
                what: "TLS configuration",
                source: Some(Box::new(err)),
            })?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|err| ConfigError::InvalidCredentials {
                what: "client key",
                source: Some(Box::new(err)),
            })?;

        Ok(Credentials {
            tls: Arc::new(tls),
            authorization: bearer(token)?,
            ca_certificates,
        })
    }

    /// The same TLS material with another bearer token.
    pub fn with_token(&self, token: &str) -> Result<Self, ConfigError> {
        Ok(Credentials {
            authorization: bearer(token)?,
            ..self.clone()
        })
    }

    /// How many CA certificates are trusted.
    pub fn ca_certificates(&self) -> usize {
        self.ca_certificates
    }
}

fn bearer(token: &str) -> Result<HeaderValue, ConfigError> {
    let invalid = || ConfigError::InvalidCredentials {
        what: "token",
        source: None,
    };
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid());
    }
    let mut value = HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| invalid())?;
    value.set_sensitive(true);
    Ok(value)
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("token", &"<redacted>")
            .field("ca_certificates", &self.ca_certificates)
            .field("client_key", &"<redacted>")
            .finish()
    }
}

type Pool = HyperClient<ConnectOn<HttpsConnector<HttpConnector>>, Full<Bytes>>;

/// One credentials snapshot and the connection pool that uses it. Calls keep the snapshot
/// they started with, so swapping credentials never breaks a call in flight; the old pool
/// closes when its last call ends.
struct Session {
    generation: u64,
    authorization: HeaderValue,
    pool: Pool,
}

/// The real [`Transport`]: HTTPS over hyper and rustls (TLS 1.3 only, client certificate,
/// bearer token), HTTP/2 where the worker offers it (so concurrent calls share one
/// connection per endpoint), HTTP/1.1 otherwise, with connections kept per endpoint.
///
/// Credentials are swapped with [`set_credentials`](Self::set_credentials) while calls are
/// in flight: new attempts use the new snapshot (a new connection pool, so a new client
/// certificate takes effect), running ones finish with the old.
pub struct HttpsTransport {
    session: RwLock<Option<Arc<Session>>>,
    generation: AtomicU64,
    connect_timeout: Duration,
    spawner: Spawner,
}

/// Where a pool runs its connections' tasks: on one runtime, or on whichever runtime the call
/// that opens a connection runs on.
#[derive(Clone)]
struct Spawner(Option<tokio::runtime::Handle>);

/// A connector that connects (TCP and TLS) as a task on the [`Spawner`]'s runtime, if it names
/// one: a socket belongs to the I/O driver of the runtime it was opened on, so one opened by a
/// call from elsewhere would have every reply woken from that other runtime's thread.
#[derive(Clone)]
struct ConnectOn<C> {
    connector: C,
    spawner: Spawner,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<C> tower_service::Service<Uri> for ConnectOn<C>
where
    C: tower_service::Service<Uri, Error = BoxError>,
    C::Future: Send + 'static,
    C::Response: Send + 'static,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        self.connector.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.connector.call(uri);
        match &self.spawner.0 {
            None => Box::pin(connecting),
            Some(runtime) => {
                let task = runtime.spawn(connecting);
                Box::pin(async move { task.await.map_err(BoxError::from)? })
            }
        }
    }
}

impl<F> hyper::rt::Executor<F> for Spawner
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, task: F) {
        match &self.0 {
            Some(runtime) => drop(runtime.spawn(task)),
            None => drop(tokio::spawn(task)),
        }
    }
}

impl HttpsTransport {
    /// A transport without credentials: every attempt fails as not delivered until
    /// [`set_credentials`](Self::set_credentials). TCP connects give up after half an attempt
    /// budget, so that an unreachable endpoint is told apart from one that took the request
    /// and went silent.
    pub fn new(budgets: &Budgets) -> Self {
        HttpsTransport {
            session: RwLock::new(None),
            generation: AtomicU64::new(0),
            connect_timeout: budgets.attempt / 2,
            spawner: Spawner(None),
        }
    }

    /// [`HttpsTransport::new`], with every connection opened (TCP and TLS) and run (HTTP/2)
    /// as tasks on `runtime`, whichever runtime the call that opens it runs on. Calls made on
    /// that runtime's thread then hand nothing to another thread: on a single-threaded
    /// runtime the caller, the connection and the I/O driver take turns on one thread, where
    /// a multi-threaded runtime wakes another thread for nearly every reply. On a loopback
    /// round trip that halves the client's CPU per call (fusefs's floor benchmark, row 3b).
    /// Without it, a connection is opened and runs where the call that opens it runs.
    pub fn on_runtime(budgets: &Budgets, runtime: tokio::runtime::Handle) -> Self {
        HttpsTransport {
            spawner: Spawner(Some(runtime)),
            ..HttpsTransport::new(budgets)
        }
    }

    /// A transport with `credentials` installed.
    pub fn with_credentials(budgets: &Budgets, credentials: &Credentials) -> Self {
        let transport = HttpsTransport::new(budgets);
        transport.set_credentials(credentials);
        transport
    }

    /// Installs new credentials for every later attempt.
    pub fn set_credentials(&self, credentials: &Credentials) {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(self.connect_timeout));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(rustls::ClientConfig::clone(&credentials.tls))
            .https_only()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let pool = HyperClient::builder(self.spawner.clone())
            // Room for whole 1 MiB replies on all 64 admitted calls at once, in large frames.
            .http2_initial_stream_window_size(4 << 20)
            .http2_initial_connection_window_size(64 << 20)
            .http2_max_frame_size(256 << 10)
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(ConnectOn {
                connector,
                spawner: self.spawner.clone(),
            });
        let mut session = self.session.write().unwrap_or_else(PoisonError::into_inner);
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        *session = Some(Arc::new(Session {
            generation,
            authorization: credentials.authorization.clone(),
            pool,
        }));
    }

    /// Removes the credentials: later attempts fail as not delivered.
    pub fn clear_credentials(&self) {
        let mut session = self.session.write().unwrap_or_else(PoisonError::into_inner);
        self.generation.fetch_add(1, Ordering::SeqCst);
        *session = None;
    }

    fn snapshot(&self) -> Option<Arc<Session>> {
        self.session
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    async fn exchange(
        &self,
        session: &Session,
        endpoint: &str,
        body: Bytes,
    ) -> Result<Bytes, TransportError> {
        let uri = Uri::builder()
            .scheme("https")
            .authority(endpoint)
            .path_and_query(CALL_PATH)
            .build()
            .map_err(|_| TransportError::NotDelivered(Failure::Connect))?;
        let request = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header(CONTENT_TYPE, PROTOBUF)
            .header(AUTHORIZATION, session.authorization.clone())
            .body(Full::new(body))
            .map_err(|_| TransportError::NotDelivered(Failure::Connect))?;
        let response = session
            .pool
            .request(request)
            .await
            .map_err(|err| classify_client_error(&err))?;
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(TransportError::Unauthorized {
                credentials_changed: self.generation.load(Ordering::SeqCst) != session.generation,
            });
        }
        if status.is_client_error() {
            return Err(TransportError::Rejected {
                status: status.as_u16(),
            });
        }
        if status != StatusCode::OK {
            return Err(TransportError::MaybeDelivered(Failure::BadReply));
        }
        let collected = Limited::new(response.into_body(), MAX_MESSAGE_BYTES)
            .collect()
            .await
            .map_err(|_| TransportError::MaybeDelivered(Failure::Connection))?;
        Ok(collected.to_bytes())
    }
}

impl Transport for HttpsTransport {
    async fn send(
        &self,
        endpoint: &str,
        body: Bytes,
        deadline: Instant,
    ) -> Result<Bytes, TransportError> {
        let Some(session) = self.snapshot() else {
            return Err(TransportError::NotDelivered(Failure::NoCredentials));
        };
        let deadline = tokio::time::Instant::from_std(deadline);
        tokio::time::timeout_at(deadline, self.exchange(&session, endpoint, body))
            .await
            .unwrap_or(Err(TransportError::MaybeDelivered(Failure::Timeout)))
    }
}

impl fmt::Debug for HttpsTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpsTransport")
            .field("generation", &self.generation.load(Ordering::SeqCst))
            .field("has_credentials", &self.snapshot().is_some())
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// Decides whether a failed exchange can have reached the worker.
///
/// Not delivered: a failure to connect (TCP, or the TLS handshake as the client sees it); a
/// request hyper cancelled, or could not hand to its connection, because the connection
/// closed before the request was written; and a handshake alert about certificates that
/// rustls reports as such. Everything else may have been delivered: that includes a broken
/// pipe, since on an HTTP/2 connection one stream's write error is reported to every stream.
///
/// With TLS 1.3 a server refuses a client certificate after the client considers the
/// handshake done, so that refusal reaches the call as any of these; the call then ends
/// definite or uncertain depending on which its attempts saw, never with a result.
fn classify_client_error(err: &hyper_util::client::legacy::Error) -> TransportError {
    let tls = tls_error(err);
    if err.is_connect() {
        let failure = if tls.is_some() {
            Failure::Tls
        } else {
            Failure::Connect
        };
        return TransportError::NotDelivered(failure);
    }
    if hyper_error(err).is_some_and(|err| err.is_canceled() || err.is_closed()) {
        return TransportError::NotDelivered(Failure::Connection);
    }
    match tls {
        Some(rustls::Error::AlertReceived(alert)) if is_handshake_refusal(*alert) => {
            TransportError::NotDelivered(Failure::Tls)
        }
        Some(rustls::Error::InvalidCertificate(_)) => TransportError::NotDelivered(Failure::Tls),
        Some(_) => TransportError::MaybeDelivered(Failure::Tls),
        None => TransportError::MaybeDelivered(Failure::Connection),
    }
}

fn is_handshake_refusal(alert: rustls::AlertDescription) -> bool {
    use rustls::AlertDescription as A;
    matches!(
        alert,
        A::BadCertificate
            | A::UnsupportedCertificate
            | A::CertificateRevoked
            | A::CertificateExpired
            | A::CertificateUnknown
            | A::UnknownCA
            | A::AccessDenied
            | A::CertificateRequired
            | A::HandshakeFailure
    )
}

/// The hyper error in `err`'s chain.
fn hyper_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a hyper::Error> {
    chain(err).find_map(|error| error.downcast_ref::<hyper::Error>())
}

/// The rustls error in `err`'s chain.
fn tls_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    chain(err).find_map(|error| error.downcast_ref::<rustls::Error>())
}

/// `err` and its causes. An `io::Error` hides its payload from `source()` (it returns the
/// payload's own source), so the walk steps into the payload instead; connectors nest them.
fn chain<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(err), |error| {
        match error
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            Some(payload) => Some(payload as &(dyn std::error::Error + 'static)),
            None => error.source(),
        }
    })
}
