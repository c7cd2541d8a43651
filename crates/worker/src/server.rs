//! The HTTPS front: TLS, authentication, body limits, routing, follower answers and faults.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use worker_proto::v1;
use worker_proto::{CALL_PATH, CONTENT_TYPE, MAX_MESSAGE_BYTES, decode_request};

use crate::VolumeSpec;
use crate::admin::{self, Admin, Deleted};
use crate::auth::Tokens;
use crate::clock::Clock;
use crate::config::{Config, Role};
use crate::error::Error;
use crate::faults::{Arrival, FaultSettings, Faults};
use crate::lease::LeaseState;
use crate::meta;
use crate::volume::{self, Command, Volume, VolumeOptions, error_result, reply_bytes};

/// The admin path that creates a volume (JSON [`VolumeSpec`]).
pub const ADMIN_VOLUMES_PATH: &str = "/takos.worker.v1/admin/volumes";
/// The admin path that deletes a volume (JSON `{"volume_id": "..."}`); see
/// [`Admin::delete_volume`].
pub const ADMIN_DELETE_VOLUME_PATH: &str = "/takos.worker.v1/admin/volumes/delete";
/// The admin path that sets faults (JSON [`FaultSettings`]).
pub const ADMIN_FAULTS_PATH: &str = "/takos.worker.v1/admin/faults";
/// The largest admin request body.
const ADMIN_BODY_MAX: usize = 64 << 10;

pub(crate) struct Registered {
    pub(crate) spec: VolumeSpec,
    pub(crate) tx: mpsc::Sender<Command>,
    /// The volume, for the reads that need not queue ([`volume::apply_now`]).
    slot: volume::Slot,
}

pub(crate) struct Shared {
    pub(crate) config: Config,
    tokens: Tokens,
    faults: Faults,
    clock: Arc<dyn Clock>,
    pub(crate) volumes: RwLock<HashMap<String, Registered>>,
    /// Held by every create and delete for its whole length (see the `admin` module).
    pub(crate) admin: Mutex<()>,
    /// Set once the server stops; from then on no volume is registered.
    stopped: AtomicBool,
    leader_reachable: AtomicBool,
}

impl Shared {
    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Empties the registry for good: every apply loop ends with its last sender.
    fn shut_down(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.volumes
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }
}

/// A running worker endpoint (leader or follower) on the current tokio runtime.
///
/// Dropping it without [`Server::stop`] also stops it: the accept loop ends when the handle
/// goes away, and every volume's apply loop ends with the last request sender. An [`Admin`]
/// handle that outlives the server manages nothing any more.
pub struct Server {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("local_addr", &self.local_addr)
            .field("role", &self.shared.config.role)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Opens every volume (leader), binds the listener and starts serving.
    ///
    /// A leader opens every volume already in its state directory and creates (or checks)
    /// the volumes of [`Config::volumes`]; a volume whose recorded generation or access mode
    /// differs fails the start, before anything is served.
    pub async fn start(
        config: Config,
        tokens: Tokens,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, Error> {
        let acceptor = tokio_rustls::TlsAcceptor::from(config.tls.server_config()?);
        let shared = Arc::new(Shared {
            config,
            tokens,
            faults: Faults::default(),
            clock,
            volumes: RwLock::new(HashMap::new()),
            admin: Mutex::new(()),
            stopped: AtomicBool::new(false),
            leader_reachable: AtomicBool::new(false),
        });
        if shared.config.role == Role::Leader {
            open_existing(&shared)?;
            for spec in shared.config.volumes.clone() {
                admin::create_volume(&shared, &spec)?;
            }
        }
        let listener = TcpListener::bind(shared.config.listen)
            .await
            .map_err(|source| Error::Bind {
                address: shared.config.listen,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| Error::Bind {
            address: shared.config.listen,
            source,
        })?;
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(accept_loop(
            Arc::clone(&shared),
            listener,
            acceptor,
            stopped,
        ));
        Ok(Self {
            shared,
            local_addr,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The endpoint as clients and hints name it: `host:port`.
    pub fn endpoint(&self) -> String {
        self.local_addr.to_string()
    }

    /// The fault switchboard of this endpoint.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// The accepted bearer tokens (replace them to rotate).
    pub fn tokens(&self) -> &Tokens {
        &self.shared.tokens
    }

    /// Creates a volume, or checks that an existing one has this identity (leader only); the
    /// same as [`Admin::create_volume`].
    pub fn create_volume(&self, spec: &VolumeSpec) -> Result<(), Error> {
        admin::create_volume(&self.shared, spec)
    }

    /// A handle for creating and deleting this leader's volumes, for use in-process.
    pub fn admin(&self) -> Admin {
        Admin::new(Arc::clone(&self.shared))
    }

    /// Reloads every volume from disk, as a restarted worker would: open handles and reply
    /// caches are lost; leases, inode numbers and inode generations are not.
    pub async fn restart(&self) -> Result<(), Error> {
        restart(&self.shared).await
    }

    /// The lease state of a volume as its apply loop holds it now.
    pub async fn lease(&self, volume_id: &str) -> Result<LeaseState, Error> {
        let unknown = || Error::UnknownVolume {
            volume_id: volume_id.to_owned(),
        };
        let tx = sender(&self.shared, volume_id).ok_or_else(unknown)?;
        let stopped = || {
            if registered_as(&self.shared, volume_id, &tx) {
                Error::Stopped {
                    volume_id: volume_id.to_owned(),
                }
            } else {
                unknown()
            }
        };
        let (reply, answer) = oneshot::channel();
        if tx.send(Command::Inspect { reply }).await.is_err() {
            return Err(stopped());
        }
        match answer.await {
            Ok(Some(lease)) => Ok(lease),
            Ok(None) | Err(_) => Err(stopped()),
        }
    }

    /// Stops accepting, drops every connection and waits for the accept loop to end.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.shared.shut_down();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        self.shared.shut_down();
    }
}

/// Serves until `shutdown` resolves.
pub async fn run(
    config: Config,
    tokens: Tokens,
    clock: Arc<dyn Clock>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    let server = Server::start(config, tokens, clock).await?;
    tracing::info!(address = %server.local_addr(), role = ?server.shared.config.role, "serving");
    shutdown.await;
    server.stop().await;
    Ok(())
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The reply retention every reply states: four call budgets. A client's own retry reaches the
/// worker at most one call budget after the first attempt; the successor of a crashed mount
/// owner repeats the dead owner's calls later, within the retention minus two call budgets and
/// a second from the crash (the node's HANDOFF.md, section 7), which leaves it two budgets
/// less a second.
fn retention_ms(config: &Config) -> u64 {
    ms(config.timings.call_budget).saturating_mul(4)
}

fn options(config: &Config) -> VolumeOptions {
    VolumeOptions {
        lease_ms: ms(config.timings.lease),
        handle_lease_ms: ms(config.timings.handle_lease),
        dedup_capacity: config.dedup_capacity,
        dedup_retention_ms: retention_ms(config),
        compact_after: config.compact_after.max(1),
        reopen: config.reopen,
    }
}

fn open_existing(shared: &Arc<Shared>) -> Result<(), Error> {
    for name in meta::purge_trash(&shared.config.state_dir)? {
        tracing::info!(entry = ?name, "removed what an interrupted volume delete left in the trash");
    }
    let root = shared.config.state_dir.join(meta::VOLUMES);
    std::fs::create_dir_all(&root).map_err(|e| Error::io("create", &root, e))?;
    let entries = std::fs::read_dir(&root).map_err(|e| Error::io("list", &root, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("list", &root, e))?;
        let dir = entry.path();
        let Some(spec) = meta::read_identity(&dir)? else {
            continue;
        };
        if Some(spec.volume_id.as_str()) != dir.file_name().and_then(|n| n.to_str()) {
            return Err(Error::Corrupt {
                path: dir,
                reason: format!("holds the identity of volume {:?}", spec.volume_id),
            });
        }
        register(shared, &spec)?;
    }
    Ok(())
}

/// Opens a created volume and starts serving it; refused once the server has stopped.
pub(crate) fn register(shared: &Arc<Shared>, spec: &VolumeSpec) -> Result<(), Error> {
    let volume = Volume::open(&shared.config.state_dir, spec, options(&shared.config))?;
    let (tx, slot) = volume::spawn(
        volume,
        shared.config.state_dir.clone(),
        Arc::clone(&shared.clock),
        shared.config.queue_depth,
        shared.faults.clone(),
    )?;
    let mut volumes = shared
        .volumes
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Checked under the registry's lock, which `shut_down` takes after setting the flag.
    if shared.is_stopped() {
        return Err(Error::Stopped {
            volume_id: spec.volume_id.clone(),
        });
    }
    volumes.insert(
        spec.volume_id.clone(),
        Registered {
            spec: spec.clone(),
            tx,
            slot,
        },
    );
    Ok(())
}

async fn restart(shared: &Arc<Shared>) -> Result<(), Error> {
    let senders: Vec<(String, mpsc::Sender<Command>)> = shared
        .volumes
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .map(|(id, r)| (id.clone(), r.tx.clone()))
        .collect();
    for (volume_id, tx) in senders {
        let (done, result) = oneshot::channel();
        let reloaded = match tx.send(Command::Reload { done }).await {
            Ok(()) => result.await.ok(),
            Err(_) => None,
        };
        match reloaded {
            Some(Ok(())) => {}
            // Deleted while the restart ran: there is nothing left to reload.
            _ if !registered_as(shared, &volume_id, &tx) => {}
            Some(Err(error)) => return Err(error),
            None => return Err(Error::Stopped { volume_id }),
        }
    }
    Ok(())
}

/// Whether `volume_id` is still served by the apply loop behind `tx` (not deleted since).
fn registered_as(shared: &Shared, volume_id: &str, tx: &mpsc::Sender<Command>) -> bool {
    shared
        .volumes
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(volume_id)
        .is_some_and(|r| r.tx.same_channel(tx))
}

fn sender(shared: &Shared, volume_id: &str) -> Option<mpsc::Sender<Command>> {
    served(shared, volume_id).map(|(tx, _)| tx)
}

/// The queue to the apply loop serving `volume_id`, and its volume's slot.
fn served(shared: &Shared, volume_id: &str) -> Option<(mpsc::Sender<Command>, volume::Slot)> {
    shared
        .volumes
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(volume_id)
        .map(|r| (r.tx.clone(), Arc::clone(&r.slot)))
}

async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    mut stopped: oneshot::Receiver<()>,
) {
    let mut connections = JoinSet::new();
    connections.spawn(reclaim_ticker(Arc::clone(&shared)));
    if let Role::Follower { leader } = &shared.config.role {
        connections.spawn(probe_leader(Arc::clone(&shared), leader.clone()));
    }
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => {
                let Ok((tcp, _peer)) = accepted else { continue };
                let _ = tcp.set_nodelay(true);
                connections.spawn(serve_connection(Arc::clone(&shared), acceptor.clone(), tcp));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.shutdown().await;
}

async fn reclaim_ticker(shared: Arc<Shared>) {
    let period = shared
        .config
        .timings
        .reclaim_interval
        .max(std::time::Duration::from_millis(1));
    let mut interval = tokio::time::interval(period);
    loop {
        interval.tick().await;
        let senders: Vec<_> = shared
            .volumes
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .map(|r| r.tx.clone())
            .collect();
        for tx in senders {
            let _ = tx.try_send(Command::Tick);
        }
    }
}

async fn probe_leader(shared: Arc<Shared>, leader: String) {
    let timings = shared.config.timings;
    loop {
        let reachable = matches!(
            tokio::time::timeout(timings.probe_timeout, TcpStream::connect(leader.as_str())).await,
            Ok(Ok(_))
        );
        shared.leader_reachable.store(reachable, Ordering::SeqCst);
        tokio::time::sleep(
            timings
                .probe_interval
                .max(std::time::Duration::from_millis(1)),
        )
        .await;
    }
}

async fn serve_connection(
    shared: Arc<Shared>,
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: TcpStream,
) {
    let handshake =
        tokio::time::timeout(shared.config.timings.attempt_budget, acceptor.accept(tcp));
    let Ok(Ok(tls)) = handshake.await else {
        return;
    };
    let service = hyper::service::service_fn(move |request| handle(Arc::clone(&shared), request));
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // Room for whole 1 MiB requests on every stream the client may have in flight, in frames
    // large enough that a megabyte is a handful of them, not sixty-four.
    builder
        .http2()
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .max_frame_size(H2_MAX_FRAME);
    let _ = builder.serve_connection(TokioIo::new(tls), service).await;
}

/// HTTP/2 flow control: a stream's window holds a whole request (1 MiB of data and the rest of
/// the message), and the connection's holds 64 of them (the client's admission limit).
const H2_STREAM_WINDOW: u32 = 4 << 20;
const H2_CONNECTION_WINDOW: u32 = 64 << 20;
const H2_MAX_FRAME: u32 = 256 << 10;

/// Returned by the service to reset the connection instead of answering (a dropped reply).
#[derive(Debug)]
struct DroppedReply;

impl std::fmt::Display for DroppedReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("reply dropped")
    }
}

impl std::error::Error for DroppedReply {}

type HttpResponse = Response<Full<Bytes>>;

fn plain(status: StatusCode, text: &str) -> HttpResponse {
    let mut response = Response::new(Full::new(Bytes::from(format!("{text}\n"))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn protobuf(body: Bytes) -> HttpResponse {
    let mut response = Response::new(Full::new(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(CONTENT_TYPE),
    );
    response
}

fn json(status: StatusCode, value: &serde_json::Value) -> HttpResponse {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

enum BodyError {
    TooLarge,
    Gone,
}

async fn read_body(request: Request<Incoming>, limit: usize) -> Result<Bytes, BodyError> {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(BodyError::TooLarge);
    }
    match Limited::new(request.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(BodyError::TooLarge),
        Err(_) => Err(BodyError::Gone),
    }
}

async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<HttpResponse, DroppedReply> {
    let authorized = request
        .headers()
        .get(header::AUTHORIZATION)
        .is_some_and(|value| shared.tokens.accepts_header(value.as_bytes()));
    if !authorized {
        return Ok(plain(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token",
        ));
    }
    if request.method() != Method::POST {
        return Ok(plain(StatusCode::METHOD_NOT_ALLOWED, "only POST is served"));
    }
    match request.uri().path() {
        CALL_PATH => call(shared, request).await,
        ADMIN_VOLUMES_PATH => Ok(admin_volumes(&shared, request).await),
        ADMIN_DELETE_VOLUME_PATH => Ok(admin_delete_volume(&shared, request).await),
        ADMIN_FAULTS_PATH => Ok(admin_faults(&shared, request).await),
        _ => Ok(plain(StatusCode::NOT_FOUND, "no such path")),
    }
}

async fn call(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<HttpResponse, DroppedReply> {
    let body = match read_body(request, MAX_MESSAGE_BYTES).await {
        Ok(body) => body,
        Err(BodyError::TooLarge) => {
            return Ok(plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request body over the limit",
            ));
        }
        Err(BodyError::Gone) => return Err(DroppedReply),
    };
    let digest = crate::dedup::digest(&body);
    let decoded = decode_request(body.clone());
    shared.faults.record(Arrival {
        request_id: decoded.as_ref().map(|r| r.request_id.0).unwrap_or_default(),
        digest,
    });
    let decoded = match decoded {
        Ok(decoded) => decoded,
        Err(error) => {
            let request_id = v1::Request::decode(body.as_ref())
                .ok()
                .map(|m| m.request_id)
                .filter(|id| id.len() == 16)
                .unwrap_or_default();
            return Ok(protobuf(reply_bytes(
                &request_id,
                v1::reply::Result::Error(error.to_wire()),
                retention_ms(&shared.config),
            )));
        }
    };
    let request_id = decoded.request_id.0;
    let refuse = |kind: v1::ErrorKind, message: &str| {
        Ok(protobuf(reply_bytes(
            &request_id,
            error_result(kind, message),
            retention_ms(&shared.config),
        )))
    };
    let write = matches!(
        decoded.op,
        v1::request::Op::Write(_) | v1::request::Op::WriteKillSuidgid(_)
    );
    if shared.faults.hang(write) {
        std::future::pending::<()>().await;
    }
    if let Role::Follower { leader } = &shared.config.role {
        if shared.faults.minority() || !shared.leader_reachable.load(Ordering::SeqCst) {
            return refuse(
                v1::ErrorKind::NoQuorum,
                "this endpoint cannot reach the leader",
            );
        }
        return Ok(protobuf(reply_bytes(
            &request_id,
            v1::reply::Result::Error(v1::Error {
                kind: v1::ErrorKind::NotLeader.into(),
                message: "this endpoint follows; ask the leader".into(),
                leader_hint: leader.clone(),
                ..Default::default()
            }),
            retention_ms(&shared.config),
        )));
    }
    if shared.faults.minority() {
        return refuse(v1::ErrorKind::NoQuorum, "this endpoint is in a minority");
    }
    let Some((tx, slot)) = served(&shared, &decoded.volume_id) else {
        return refuse(v1::ErrorKind::UnknownVolume, "no volume with this ID");
    };
    if let Some(result) = shared.faults.stand_in_answer(&decoded.op) {
        return Ok(protobuf(reply_bytes(
            &request_id,
            result,
            retention_ms(&shared.config),
        )));
    }
    let bytes = match volume::apply_now(&slot, &decoded, digest, shared.clock.now_ms()) {
        Some(bytes) => bytes,
        None => {
            let (reply, answer) = oneshot::channel();
            let command = Command::Call {
                request: Box::new(decoded),
                digest,
                reply,
            };
            if let Err(mpsc::error::SendError(unsent)) = tx.send(command).await {
                let deleted = matches!(&unsent, Command::Call { request, .. }
                    if !registered_as(&shared, &request.volume_id, &tx));
                if deleted {
                    return refuse(v1::ErrorKind::UnknownVolume, "the volume was deleted");
                }
                return refuse(v1::ErrorKind::NoQuorum, "the volume is not being served");
            }
            let Ok(bytes) = answer.await else {
                return refuse(
                    v1::ErrorKind::Uncertain,
                    "the apply loop stopped while the request was queued",
                );
            };
            bytes
        }
    };
    let delay = shared.faults.delay();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if shared.faults.take_drop() {
        return Err(DroppedReply);
    }
    Ok(protobuf(bytes))
}

async fn admin_body<T: serde::de::DeserializeOwned>(
    request: Request<Incoming>,
) -> Result<T, HttpResponse> {
    let body = read_body(request, ADMIN_BODY_MAX)
        .await
        .map_err(|_| plain(StatusCode::PAYLOAD_TOO_LARGE, "admin body over the limit"))?;
    serde_json::from_slice(&body).map_err(|e| {
        json(
            StatusCode::BAD_REQUEST,
            &serde_json::json!({ "error": e.to_string() }),
        )
    })
}

async fn admin_volumes(shared: &Arc<Shared>, request: Request<Incoming>) -> HttpResponse {
    let spec: VolumeSpec = match admin_body(request).await {
        Ok(spec) => spec,
        Err(response) => return response,
    };
    let shared2 = Arc::clone(shared);
    let spec2 = spec.clone();
    let created = tokio::task::spawn_blocking(move || admin::create_volume(&shared2, &spec2)).await;
    let status = match &created {
        Ok(Ok(())) => StatusCode::OK,
        Ok(Err(Error::InvalidVolumeId { .. })) => StatusCode::BAD_REQUEST,
        Ok(Err(Error::IdentityMismatch { .. })) => StatusCode::CONFLICT,
        Ok(Err(Error::UnknownVolume { .. })) => StatusCode::MISDIRECTED_REQUEST,
        Ok(Err(
            Error::Io { .. }
            | Error::Corrupt { .. }
            | Error::Tls { .. }
            | Error::Bind { .. }
            | Error::Stopped { .. },
        ))
        | Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let body = match created {
        Ok(Ok(())) => serde_json::json!({ "volume": spec }),
        Ok(Err(error)) => serde_json::json!({ "error": error_text::chain(&error) }),
        Err(_) => serde_json::json!({ "error": "volume creation panicked" }),
    };
    json(status, &body)
}

/// The body of an [`ADMIN_DELETE_VOLUME_PATH`] call.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteVolume {
    volume_id: String,
}

async fn admin_delete_volume(shared: &Arc<Shared>, request: Request<Incoming>) -> HttpResponse {
    let DeleteVolume { volume_id } = match admin_body(request).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let admin = Admin::new(Arc::clone(shared));
    let id = volume_id.clone();
    // Its own task, so that a panic becomes a 500 and not a dead connection.
    let deleted = tokio::spawn(async move { admin.delete_volume(&id).await }).await;
    let status = match &deleted {
        Ok(Ok(Deleted::Removed | Deleted::Absent)) => StatusCode::OK,
        Ok(Err(Error::InvalidVolumeId { .. })) => StatusCode::BAD_REQUEST,
        Ok(Err(Error::UnknownVolume { .. })) => StatusCode::MISDIRECTED_REQUEST,
        Ok(Err(
            Error::Io { .. }
            | Error::Corrupt { .. }
            | Error::IdentityMismatch { .. }
            | Error::Tls { .. }
            | Error::Bind { .. }
            | Error::Stopped { .. },
        ))
        | Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let body = match deleted {
        Ok(Ok(deleted)) => serde_json::json!({
            "deleted": volume_id,
            "existed": deleted == Deleted::Removed,
        }),
        Ok(Err(error)) => serde_json::json!({ "error": error_text::chain(&error) }),
        Err(_) => serde_json::json!({ "error": "volume deletion panicked" }),
    };
    json(status, &body)
}

async fn admin_faults(shared: &Arc<Shared>, request: Request<Incoming>) -> HttpResponse {
    let settings: FaultSettings = match admin_body(request).await {
        Ok(settings) => settings,
        Err(response) => return response,
    };
    shared.faults.apply(&settings);
    if settings.restart
        && let Err(error) = restart(shared).await
    {
        return json(
            StatusCode::INTERNAL_SERVER_ERROR,
            &serde_json::json!({ "error": error_text::chain(&error) }),
        );
    }
    json(
        StatusCode::OK,
        &serde_json::json!({ "applied": settings_json(&settings) }),
    )
}

fn settings_json(settings: &FaultSettings) -> serde_json::Value {
    serde_json::to_value(settings).unwrap_or(serde_json::Value::Null)
}
