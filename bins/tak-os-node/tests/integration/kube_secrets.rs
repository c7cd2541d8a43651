//! [`KubeSecretSource`] against a stand-in Kubernetes API server on loopback: the real Secrets
//! paths and JSON (base64 data, lists with a resourceVersion and continue tokens, watch streams
//! of newline-delimited events, `Status` objects for errors and for a 410 Gone), plain HTTP,
//! no auth. The stand-in records every request, so the tests can assert what the source asked
//! and where.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use serde_json::{Value, json};
use tak_os_node::credentials::kube::{KubeSecretSource, WatchSettings};
use tak_os_node::credentials::{
    CA_BUNDLE, CLIENT_CERTIFICATE, CLIENT_KEY, CredentialError, CredentialSource, Material,
    NEXT_TOKEN, TOKEN,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

const NS: &str = "tak-os";
const OTHER_NS: &str = "other";
/// Long enough for anything that must happen on loopback; a failure says what did not.
const PATIENCE: Duration = Duration::from_secs(5);

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// A request the stand-in saw.
#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    path: String,
    query: BTreeMap<String, String>,
}

impl Seen {
    fn is_watch(&self) -> bool {
        self.query.get("watch").is_some_and(|v| v == "true")
    }

    fn is_list(&self) -> bool {
        self.path.ends_with("/secrets") && !self.is_watch()
    }

    fn is_get_of(&self, name: &str) -> bool {
        self.path.ends_with(&format!("/secrets/{name}"))
    }
}

#[derive(Default)]
struct ApiState {
    /// The last resourceVersion handed out.
    version: u64,
    /// Current Secrets by (namespace, name), as the API serves them.
    secrets: BTreeMap<(String, String), Value>,
    /// Every change: (resourceVersion, namespace, event line).
    history: Vec<(u64, String, Value)>,
    /// A watch from a resourceVersion below this gets an ERROR 410.
    compacted_below: u64,
    forbidden: bool,
    requests: Vec<Seen>,
    /// Open watch streams, by namespace.
    streams: Vec<(String, mpsc::UnboundedSender<Bytes>)>,
}

/// The stand-in API server; dropping it stops it.
struct FakeApi {
    url: String,
    state: Arc<Mutex<ApiState>>,
    /// Bumped on every request and every closed stream, for [`FakeApi::wait_until`].
    ticks: watch::Sender<u64>,
    _server: tokio::task::JoinHandle<()>,
}

impl FakeApi {
    async fn start() -> FakeApi {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(ApiState::default()));
        let ticks = watch::Sender::new(0_u64);
        let server = {
            let state = Arc::clone(&state);
            let ticks = ticks.clone();
            tokio::spawn(async move {
                // Owned by this task, so stopping the server stops its connections.
                let mut connections = JoinSet::new();
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    let state = Arc::clone(&state);
                    let ticks = ticks.clone();
                    let service = hyper::service::service_fn(move |request| {
                        let response = handle(&state, &ticks, request);
                        async move { Ok::<_, Infallible>(response) }
                    });
                    connections.spawn(
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service),
                    );
                }
            })
        };
        FakeApi {
            url,
            state,
            ticks,
            _server: server,
        }
    }

    fn lock(&self) -> MutexGuard<'_, ApiState> {
        self.state.lock().unwrap()
    }

    /// Creates or replaces a Secret, as `kubectl apply` would, and streams the event.
    fn put(&self, namespace: &str, name: &str, data: &[(&str, &[u8])]) -> u64 {
        let mut state = self.lock();
        put(&mut state, namespace, name, data)
    }

    fn delete(&self, namespace: &str, name: &str) {
        let mut state = self.lock();
        let mut object = state
            .secrets
            .remove(&(namespace.to_owned(), name.to_owned()))
            .unwrap();
        state.version += 1;
        object["metadata"]["resourceVersion"] = json!(state.version.to_string());
        record(&mut state, namespace, "DELETED", object);
    }

    /// Sends a BOOKMARK on every open watch, at a new resourceVersion (other objects of the
    /// cluster change all the time, and resourceVersions are global).
    fn bookmark(&self) {
        let mut state = self.lock();
        state.version += 1;
        let event = json!({
            "type": "BOOKMARK",
            "object": {
                "kind": "Secret",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": state.version.to_string()},
            },
        });
        let line = line(&event);
        state
            .streams
            .retain(|(_, tx)| tx.send(line.clone()).is_ok());
    }

    /// Ends every open watch, as the API server does when a watch times out.
    fn end_watches(&self) {
        self.lock().streams.clear();
    }

    /// Changes a Secret while no watch is open, then forgets the history before it, so a watch
    /// from an older resourceVersion gets 410 Gone.
    fn change_and_compact(&self, namespace: &str, name: &str, data: &[(&str, &[u8])]) {
        let mut state = self.lock();
        state.streams.clear();
        put(&mut state, namespace, name, data);
        state.compacted_below = state.version;
    }

    fn set_forbidden(&self, forbidden: bool) {
        self.lock().forbidden = forbidden;
    }

    fn requests(&self) -> Vec<Seen> {
        self.lock().requests.clone()
    }

    fn gets_of(&self, name: &str) -> usize {
        self.requests().iter().filter(|r| r.is_get_of(name)).count()
    }

    fn watches(&self) -> Vec<Seen> {
        self.requests().into_iter().filter(Seen::is_watch).collect()
    }

    fn lists(&self) -> Vec<Seen> {
        self.requests().into_iter().filter(Seen::is_list).collect()
    }

    fn open_watches(&self) -> usize {
        self.lock()
            .streams
            .iter()
            .filter(|(_, tx)| !tx.is_closed())
            .count()
    }

    /// Waits, at most [`PATIENCE`], until `condition` holds of the server.
    async fn wait_until(&self, what: &str, condition: impl Fn(&FakeApi) -> bool) {
        let mut ticks = self.ticks.subscribe();
        within(what, async {
            while !condition(self) {
                ticks.changed().await.unwrap();
            }
        })
        .await;
    }
}

fn put(state: &mut ApiState, namespace: &str, name: &str, data: &[(&str, &[u8])]) -> u64 {
    state.version += 1;
    let secret = Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            resource_version: Some(state.version.to_string()),
            uid: Some(format!("uid-{namespace}-{name}")),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
                .collect(),
        ),
        type_: Some("Opaque".to_owned()),
        ..Default::default()
    };
    let object = serde_json::to_value(&secret).unwrap();
    let key = (namespace.to_owned(), name.to_owned());
    let kind = if state.secrets.contains_key(&key) {
        "MODIFIED"
    } else {
        "ADDED"
    };
    state.secrets.insert(key, object.clone());
    record(state, namespace, kind, object);
    state.version
}

fn record(state: &mut ApiState, namespace: &str, kind: &str, object: Value) {
    let event = json!({"type": kind, "object": object});
    let version = state.version;
    state
        .history
        .push((version, namespace.to_owned(), event.clone()));
    let line = line(&event);
    state
        .streams
        .retain(|(ns, tx)| ns != namespace || tx.send(line.clone()).is_ok());
}

fn line(value: &Value) -> Bytes {
    let mut text = serde_json::to_vec(value).unwrap();
    text.push(b'\n');
    Bytes::from(text)
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

fn json_response(code: u16, value: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(value).unwrap())).boxed_unsync())
        .unwrap()
}

fn handle(
    state: &Mutex<ApiState>,
    ticks: &watch::Sender<u64>,
    request: Request<hyper::body::Incoming>,
) -> Response<Body> {
    let seen = Seen {
        method: request.method().clone(),
        path: request.uri().path().to_owned(),
        query: request
            .uri()
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                (k.to_owned(), v.to_owned())
            })
            .collect(),
    };
    let mut guard = state.lock().unwrap();
    let state = &mut *guard;
    state.requests.push(seen.clone());
    ticks.send_modify(|n| *n += 1);
    if state.forbidden {
        return json_response(
            403,
            &status(
                403,
                "Forbidden",
                "secrets is forbidden: User \"system:serviceaccount:tak-os:node\" cannot get resource \"secrets\"",
            ),
        );
    }
    let segments: Vec<&str> = seen.path.trim_matches('/').split('/').collect();
    let (namespace, name) = match segments.as_slice() {
        ["api", "v1", "namespaces", ns, "secrets"] => (*ns, None),
        ["api", "v1", "namespaces", ns, "secrets", name] => (*ns, Some(*name)),
        _ => {
            return json_response(
                404,
                &status(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                ),
            );
        }
    };
    if seen.method != Method::GET {
        return json_response(405, &status(405, "MethodNotAllowed", "not here"));
    }
    if let Some(name) = name {
        return match state.secrets.get(&(namespace.to_owned(), name.to_owned())) {
            Some(secret) => json_response(200, secret),
            None => json_response(
                404,
                &status(404, "NotFound", &format!("secrets \"{name}\" not found")),
            ),
        };
    }
    if seen.is_watch() {
        return watch_response(state, ticks, namespace, &seen);
    }
    // A list, paged by `limit` with the offset as the continue token.
    let items: Vec<Value> = state
        .secrets
        .iter()
        .filter(|((ns, _), _)| ns == namespace)
        .map(|(_, secret)| {
            // Items of a real list carry no kind or apiVersion.
            let mut item = secret.clone();
            let object = item.as_object_mut().unwrap();
            object.remove("kind");
            object.remove("apiVersion");
            item
        })
        .collect();
    let start: usize = seen.query.get("continue").map_or(0, |c| c.parse().unwrap());
    let limit: usize = seen
        .query
        .get("limit")
        .map_or(items.len(), |l| l.parse().unwrap());
    let end = (start + limit).min(items.len());
    let mut metadata = json!({"resourceVersion": state.version.to_string()});
    if end < items.len() {
        metadata["continue"] = json!(end.to_string());
    }
    json_response(
        200,
        &json!({
            "kind": "SecretList",
            "apiVersion": "v1",
            "metadata": metadata,
            "items": items[start..end],
        }),
    )
}

fn watch_response(
    state: &mut ApiState,
    ticks: &watch::Sender<u64>,
    namespace: &str,
    seen: &Seen,
) -> Response<Body> {
    let from: u64 = seen
        .query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(state.version);
    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
    if from < state.compacted_below {
        let gone = status(
            410,
            "Expired",
            &format!(
                "too old resource version: {from} ({})",
                state.compacted_below
            ),
        );
        tx.send(line(&json!({"type": "ERROR", "object": gone})))
            .unwrap();
    } else {
        for (version, ns, event) in &state.history {
            if *version > from && ns == namespace {
                tx.send(line(event)).unwrap();
            }
        }
        state.streams.push((namespace.to_owned(), tx));
    }
    // Ticks when the body is dropped (the client went away), for `wait_until`.
    let on_drop = TickOnDrop(ticks.clone());
    let frames = futures_util::stream::poll_fn(move |cx| {
        let _ = &on_drop;
        rx.poll_recv(cx)
            .map(|next| next.map(|bytes| Ok::<_, Infallible>(Frame::data(bytes))))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(StreamBody::new(frames).boxed_unsync())
        .unwrap()
}

struct TickOnDrop(watch::Sender<u64>);

impl Drop for TickOnDrop {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n += 1);
    }
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    crate::support::within(PATIENCE, what, future).await
}

fn settings() -> WatchSettings {
    WatchSettings::default()
        .with_retry_delays(Duration::from_millis(10), Duration::from_millis(100))
        .with_request_timeout(Duration::from_secs(2))
}

fn source_at(url: &str, settings: WatchSettings) -> KubeSecretSource {
    let config = kube::Config::new(url.parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    KubeSecretSource::new(client, NS, settings, &tokio::runtime::Handle::current()).unwrap()
}

async fn watching(server: &FakeApi, settings: WatchSettings) -> KubeSecretSource {
    let source = source_at(&server.url, settings);
    server
        .wait_until("the source opens its watch", |s| s.open_watches() == 1)
        .await;
    within("the source reports its watch", async {
        while !source.is_watching() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    source
}

fn data(token: &'static str) -> Vec<(&'static str, &'static [u8])> {
    vec![
        (TOKEN, token.as_bytes()),
        (CA_BUNDLE, b"ca-secret-bytes"),
        (CLIENT_CERTIFICATE, b"crt-secret-bytes"),
        (CLIENT_KEY, b"key-secret-bytes"),
    ]
}

fn material(token: &str) -> Material {
    Material::new(
        token.to_owned(),
        None,
        b"ca-secret-bytes".to_vec(),
        b"crt-secret-bytes".to_vec(),
        b"key-secret-bytes".to_vec(),
    )
}

/// Asserts that `text` shows no token value of the tests.
fn assert_no_secret(text: &str) {
    for secret in ["tok-", "dG9r", "secret-bytes", "c2VjcmV0LWJ5dGVz"] {
        assert!(!text.contains(secret), "{secret:?} shown in: {text}");
    }
}

#[tokio::test]
async fn an_existing_secret_loads_and_later_loads_come_from_the_watch_cache() {
    let server = FakeApi::start().await;
    server.put(NS, "vol-1-auth", &data("tok-1"));
    // The stand-in speaks the API's JSON: data is base64, as a real server stores it.
    let raw = server.lock().secrets[&(NS.to_owned(), "vol-1-auth".to_owned())].to_string();
    assert!(raw.contains("\"token\":\"dG9rLTE=\""), "{raw}");

    let source = watching(&server, settings()).await;
    assert_eq!(source.load("vol-1").await.unwrap(), material("tok-1"));
    assert_eq!(server.gets_of("vol-1-auth"), 1);
    for _ in 0..3 {
        assert_eq!(source.load("vol-1").await.unwrap(), material("tok-1"));
    }
    assert_eq!(server.gets_of("vol-1-auth"), 1, "later loads are cached");

    let mut with_next = data("tok-1");
    with_next.push((NEXT_TOKEN, b"tok-2"));
    let changed = source.changed("vol-1");
    server.put(NS, "vol-1-auth", &with_next);
    within("the next token wakes the volume", changed).await;
    let loaded = source.load("vol-1").await.unwrap();
    assert_ne!(loaded, material("tok-1"));
    assert_no_secret(&format!("{loaded:?} {source:?}"));
}

#[tokio::test]
async fn a_missing_secret_and_a_missing_key_say_what_is_missing_and_quote_nothing() {
    let server = FakeApi::start().await;
    let source = watching(&server, settings()).await;

    let error = source.load("vol-none").await.unwrap_err();
    assert!(
        matches!(&error, CredentialError::Missing { place } if place == "secret tak-os/vol-none-auth"),
        "{error:?}"
    );

    let mut partial = data("tok-very-secret");
    partial.retain(|(key, _)| *key != CLIENT_KEY);
    server.put(NS, "vol-2-auth", &partial);
    let error = source.load("vol-2").await.unwrap_err();
    assert!(
        matches!(
            &error,
            CredentialError::MissingKey { place, key: CLIENT_KEY } if place == "secret tak-os/vol-2-auth"
        ),
        "{error:?}"
    );
    assert_no_secret(&format!(
        "{error} {error:?} {} {source:?}",
        error_text::chain(&error)
    ));
    // Served from the watch's cache the second time, with the same answer.
    let again = source.load("vol-2").await.unwrap_err();
    assert!(matches!(
        again,
        CredentialError::MissingKey {
            key: CLIENT_KEY,
            ..
        }
    ));
    assert_eq!(server.gets_of("vol-2-auth"), 1);
}

#[tokio::test]
async fn a_modification_wakes_changed_and_the_next_load_sees_the_new_token() {
    let server = FakeApi::start().await;
    server.put(NS, "vol-1-auth", &data("tok-1"));
    server.put(NS, "vol-9-auth", &data("tok-9"));
    let source = watching(&server, settings()).await;
    assert_eq!(source.load("vol-1").await.unwrap(), material("tok-1"));
    assert_eq!(source.load("vol-9").await.unwrap(), material("tok-9"));

    let changed = source.changed("vol-1");
    let other_changed = source.changed("vol-9");
    server.put(NS, "vol-1-auth", &data("tok-2"));
    within("the modification wakes vol-1", changed).await;
    assert_eq!(source.load("vol-1").await.unwrap(), material("tok-2"));
    assert_eq!(server.gets_of("vol-1-auth"), 1, "the watch's copy is used");
    // Only the volume whose Secret changed is woken.
    assert!(
        other_changed.now_or_never().is_none(),
        "vol-9 woken by vol-1's change"
    );

    let changed = source.changed("vol-1");
    server.delete(NS, "vol-1-auth");
    within("the deletion wakes vol-1", changed).await;
    assert!(matches!(
        source.load("vol-1").await,
        Err(CredentialError::Missing { .. })
    ));
}

#[tokio::test]
async fn a_watch_the_server_ends_is_resumed_from_the_last_resource_version() {
    let server = FakeApi::start().await;
    server.put(NS, "vol-1-auth", &data("tok-1"));
    let source = watching(&server, settings()).await;
    source.load("vol-1").await.unwrap();

    let changed = source.changed("vol-1");
    server.put(NS, "vol-1-auth", &data("tok-2"));
    within("the first change is seen", changed).await;
    // A Secret of a volume the node does not have, then a bookmark: both move the
    // resourceVersion on, though neither touches the cache.
    server.put(NS, "vol-elsewhere-auth", &data("tok-x"));
    server.put(NS, "vol-elsewhere-auth", &data("tok-y"));
    server.bookmark();
    let last = server.lock().version;
    server.end_watches();

    server
        .wait_until("a second watch", |s| s.watches().len() == 2)
        .await;
    let watches = server.watches();
    assert_eq!(
        watches[1].query.get("resourceVersion"),
        Some(&last.to_string()),
        "{watches:?}"
    );
    assert_eq!(server.lists().len(), 1, "a resumed watch needs no list");

    let changed = source.changed("vol-1");
    server.put(NS, "vol-1-auth", &data("tok-3"));
    within("a change after the resume is seen", changed).await;
    assert_eq!(source.load("vol-1").await.unwrap(), material("tok-3"));
    assert_eq!(server.gets_of("vol-1-auth"), 1);
}

#[tokio::test]
async fn a_410_gone_makes_the_source_list_again_in_pages() {
    let server = FakeApi::start().await;
    for volume in ["vol-a", "vol-b", "vol-c"] {
        server.put(NS, &format!("{volume}-auth"), &data("tok-0"));
    }
    let source = watching(&server, settings().with_page_size(1)).await;
    source.load("vol-b").await.unwrap();
    assert_eq!(server.lists().len(), 1, "nothing registered: one page");

    let changed = source.changed("vol-b");
    server.change_and_compact(NS, "vol-b-auth", &data("tok-1"));
    within("the relist wakes vol-b", changed).await;
    assert_eq!(source.load("vol-b").await.unwrap(), material("tok-1"));
    assert_eq!(
        server.gets_of("vol-b-auth"),
        1,
        "the relist refreshed the cache"
    );

    server
        .wait_until("a watch after the relist", |s| s.watches().len() >= 3)
        .await;
    let lists = server.lists();
    assert_eq!(lists.len(), 1 + 3, "one page per Secret: {lists:?}");
    assert!(lists[2].query.contains_key("continue"), "{lists:?}");
    let watches = server.watches();
    assert_eq!(
        watches.last().unwrap().query.get("resourceVersion"),
        Some(&server.lock().version.to_string()),
        "the new watch starts at the relist"
    );

    let changed = source.changed("vol-b");
    server.put(NS, "vol-b-auth", &data("tok-2"));
    within("a change after the relist is seen", changed).await;
    assert_eq!(source.load("vol-b").await.unwrap(), material("tok-2"));
}

#[tokio::test]
async fn a_secret_in_another_namespace_is_never_read() {
    let server = FakeApi::start().await;
    server.put(OTHER_NS, "vol-x-auth", &data("tok-other-x"));
    server.put(OTHER_NS, "vol-1-auth", &data("tok-other-1"));
    server.put(NS, "vol-1-auth", &data("tok-1"));
    let source = watching(&server, settings()).await;

    assert!(matches!(
        source.load("vol-x").await,
        Err(CredentialError::Missing { place }) if place == "secret tak-os/vol-x-auth"
    ));
    assert_eq!(source.load("vol-1").await.unwrap(), material("tok-1"));
    let changed = source.changed("vol-1");
    server.put(OTHER_NS, "vol-1-auth", &data("tok-other-2"));
    server.put(NS, "vol-1-auth", &data("tok-2"));
    within("the change in the source's namespace is seen", changed).await;
    assert_eq!(source.load("vol-1").await.unwrap(), material("tok-2"));

    let prefix = format!("/api/v1/namespaces/{NS}/secrets");
    let requests = server.requests();
    assert!(!requests.is_empty());
    for request in &requests {
        assert!(request.path.starts_with(&prefix), "{request:?}");
        assert_eq!(request.method, Method::GET, "{request:?}");
    }
}

#[tokio::test]
async fn a_forbidden_answer_names_the_permission_the_service_account_lacks() {
    let server = FakeApi::start().await;
    server.put(NS, "vol-1-auth", &data("tok-1"));
    let source = watching(&server, settings()).await;
    assert_eq!(source.load("vol-1").await.unwrap(), material("tok-1"));

    server.set_forbidden(true);
    server.end_watches();
    within("the watch goes down", async {
        while source.is_watching() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let error = source.load("vol-2").await.unwrap_err();
    let text = error_text::chain(&error);
    assert!(
        matches!(error, CredentialError::Unavailable { ref place, .. } if place == "secret tak-os/vol-2-auth"),
        "{error:?}"
    );
    assert!(
        text.contains("get, list and watch on secrets in namespace tak-os"),
        "{text}"
    );
    assert_no_secret(&format!("{text} {error:?} {source:?}"));

    // Allowed again: the watch comes back by itself and serves the cache.
    server.set_forbidden(false);
    within("the watch comes back", async {
        while !source.is_watching() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(source.load("vol-1").await.unwrap(), material("tok-1"));
}

#[tokio::test]
async fn an_unreachable_api_server_makes_loads_unavailable() {
    // A port that was just free: nothing listens there.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let source = source_at(&url, settings());
    let error = within("a load fails", source.load("vol-1"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, CredentialError::Unavailable { .. }),
        "{error:?}"
    );
    assert!(!source.is_watching());
    assert!(
        error_text::chain(&error).contains("cannot be reached"),
        "{}",
        error_text::chain(&error)
    );
}

#[tokio::test]
async fn dropping_the_source_stops_its_watch() {
    let server = FakeApi::start().await;
    let source = watching(&server, settings()).await;
    assert_eq!(server.open_watches(), 1);
    drop(source);
    server
        .wait_until("the watch is closed", |s| s.open_watches() == 0)
        .await;
    let watches = server.watches().len();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        server.watches().len(),
        watches,
        "no new watch after the drop"
    );
}
