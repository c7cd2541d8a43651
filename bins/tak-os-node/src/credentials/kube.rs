//! Credentials from Kubernetes Secrets: [`KubeSecretSource`], the source the mount owner uses in
//! a cluster.
//!
//! # What it reads
//!
//! The Secret `<volumeID>-auth` in ONE namespace, the one the source was built with (the
//! owner's configured manager namespace). No caller can name another namespace: every request
//! goes to `/api/v1/namespaces/<namespace>/secrets`, fixed when the source is built. The data
//! keys are the module constants of [`super`] (`token`, `next-token`, `ca.crt`, `tls.crt`,
//! `tls.key`; only `next-token` is optional), base64-encoded in the Secret's `data` as the API
//! stores them. A value over [`MAX_VALUE_BYTES`] is [`CredentialError::Malformed`].
//!
//! # RBAC
//!
//! The node's ServiceAccount needs `get`, `list` and `watch` on `secrets` in that namespace (a
//! Role and RoleBinding there, not a ClusterRole):
//!
//! ```yaml
//! rules:
//!   - apiGroups: [""]
//!     resources: ["secrets"]
//!     verbs: ["get", "list", "watch"]
//! ```
//!
//! A 403 from the API server becomes [`CredentialError::Unavailable`] whose cause says so.
//!
//! # One watch for the whole node
//!
//! A node stages hundreds of volumes (DESIGN.md section 6), and each stage keeps a refresh task
//! waiting on [`CredentialSource::changed`]. One watch per volume would be hundreds of
//! long-lived requests per node, times every node, on the API server. So the source runs ONE
//! watch over the namespace's Secrets, shared by all volumes, in a task it spawns when it is
//! built and aborts when it is dropped:
//!
//! - it lists the namespace (in pages), then watches from the list's `resourceVersion`;
//! - it keeps only the Secrets the owner asked about (a [`load`](CredentialSource::load) or a
//!   [`changed`](CredentialSource::changed) of the volume registers it; [`KubeSecretSource::forget`]
//!   drops it at unstage), so memory grows with the node's volumes, not with the cluster's; the
//!   Secrets of other volumes stream past and are dropped (no selector can pick the `-auth`
//!   names out, so the namespace had best hold little else);
//! - an ADDED, MODIFIED or DELETED event of a registered Secret updates the cache and wakes that
//!   volume's `changed()` futures (one `tokio::sync::watch` channel per volume; nothing else
//!   wakes);
//! - a watch the API server ends (it does every few minutes; the source asks for
//!   [`WatchSettings::with_watch_timeout`]) is resumed from the last `resourceVersion` seen, of an
//!   event or a BOOKMARK; a `410 Gone` (the version has been compacted) relists and wakes the
//!   volumes whose Secret differs from the cache;
//! - failures back off exponentially with jitter, between the bounds of
//!   [`WatchSettings::with_retry_delays`], so a restarted API server is not stampeded by every node.
//!
//! The watch is hand-rolled over `list` and `watch` requests instead of `kube::runtime::watcher`:
//! the resume and relist rules above are a few lines of a plain state machine here (tested
//! without a server), and `kube-runtime` would add a crate and its dependencies for them.
//! The requests are built with `kube::core::Request` and sent with [`Client::request_text`] and
//! [`Client::request_events`] rather than through `kube::Api`: `Api::get` and `Api::list` log the
//! whole response body at warn level when it does not decode, which for a Secret would write
//! its content to the log; here a body that does not decode gives an error that quotes nothing.
//!
//! # Loads
//!
//! While the watch is up, a load of a registered volume whose Secret is cached is served from
//! the cache, with no request. The first load of a volume, a load while the watch is down, and a
//! load of a Secret the cache believes absent (a Secret is often created just before the first
//! stage, ahead of the watch) are a GET, at most [`MAX_CONCURRENT_GETS`] at a time, each bounded
//! by [`WatchSettings::with_request_timeout`]. A GET's answer is cached unless the watch
//! updated the entry meanwhile (the watch is ordered and complete, so it wins).
//!
//! # When the API server cannot be reached
//!
//! Volumes already staged keep working: the owner holds their credentials in the live worker
//! clients and does not need the API server to use them (a refresh load while the watch is
//! down is a GET, which fails with [`CredentialError::Unavailable`]; the live credentials stay
//! as they are). When the watch comes back, the events it missed (replayed from the last
//! resourceVersion, or a relist after a 410) wake every volume whose Secret changed meanwhile;
//! and while the watch is down `changed()` also resolves every
//! [`WatchSettings::with_degraded_poll`] interval, so that a rotation is picked up by a GET as
//! soon as GETs work again (RBAC that allows `get` but not `watch`, say). New stages fail with
//! [`CredentialError::Unavailable`] until the API server answers.
//!
//! The tests of this module check the pure parts (the Secret's data, the watch cursor, the
//! backoff, error texts); `tests/integration/kube_secrets.rs` runs the source against a
//! stand-in API server that speaks the real paths, JSON and watch streams.
//!
//! Nothing here logs, shows or puts in an error any Secret content: errors name the Secret and
//! the key, `Debug` of the source shows its namespace and counts.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{BuildHasher as _, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ::kube::Client;
use ::kube::api::{GetParams, ListParams, ObjectList, WatchEvent, WatchParams};
use futures_util::TryStreamExt as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{
    CA_BUNDLE, CLIENT_CERTIFICATE, CLIENT_KEY, Changed, CredentialError, CredentialSource, Load,
    MAX_VALUE_BYTES, Material, NEXT_TOKEN, TOKEN,
};

/// The suffix of a volume's Secret name: the Secret of volume `v` is `v-auth`.
pub const SECRET_SUFFIX: &str = "-auth";

/// At most this many GETs of Secrets are in flight at once (a restarted owner loads every
/// staged volume at once; the API server gets them a few at a time).
pub const MAX_CONCURRENT_GETS: usize = 8;

/// A watch that the server closes sooner than this, having sent nothing, counts as a failure
/// for the backoff (a server that closes every watch at once must not be hammered).
const MIN_PRODUCTIVE_WATCH: Duration = Duration::from_secs(1);

/// How long after its requested timeout a watch may stay open before it is taken for a dead
/// connection and resumed.
const WATCH_GRACE: Duration = Duration::from_secs(5);

/// The longest API server message quoted in an error.
const MAX_MESSAGE_CHARS: usize = 256;

/// How the source talks to the API server: timeouts, retry delays and paging.
#[derive(Debug, Clone)]
pub struct WatchSettings {
    retry_min: Duration,
    retry_max: Duration,
    watch_timeout: Duration,
    request_timeout: Duration,
    degraded_poll: Duration,
    page_size: u32,
}

impl Default for WatchSettings {
    fn default() -> Self {
        WatchSettings {
            retry_min: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
            watch_timeout: Duration::from_secs(290),
            request_timeout: Duration::from_secs(10),
            degraded_poll: Duration::from_secs(300),
            page_size: 500,
        }
    }
}

impl WatchSettings {
    /// Failed requests of the watch are retried after `min`, doubling up to `max`, each delay
    /// jittered down to half of it. The defaults are 500 ms and 30 s.
    #[must_use]
    pub fn with_retry_delays(mut self, min: Duration, max: Duration) -> Self {
        self.retry_min = min;
        self.retry_max = max.max(min);
        self
    }

    /// How long the API server is asked to keep one watch open before it ends it, whole
    /// seconds of at least one (the source then resumes it). The default is 290 s, under the
    /// API server's own limit.
    #[must_use]
    pub fn with_watch_timeout(mut self, timeout: Duration) -> Self {
        self.watch_timeout = timeout.max(Duration::from_secs(1));
        self
    }

    /// How long one GET or one page of a list may take. The default is 10 s.
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// While the watch is down, `changed()` resolves at this interval, so that the owner
    /// reloads with a GET. The default is 5 minutes.
    #[must_use]
    pub fn with_degraded_poll(mut self, interval: Duration) -> Self {
        self.degraded_poll = interval;
        self
    }

    /// How many Secrets one page of a list asks for (at least one). The default is 500.
    #[must_use]
    pub fn with_page_size(mut self, size: u32) -> Self {
        self.page_size = size.max(1);
        self
    }
}

/// The namespace given to [`KubeSecretSource::new`] is not a Kubernetes namespace name.
#[derive(Debug, thiserror::Error)]
#[error(
    "{namespace:?} is not a Kubernetes namespace name (1 to 63 lowercase letters, digits and '-')"
)]
pub struct InvalidNamespace {
    /// The name given.
    pub namespace: String,
}

/// The [`CredentialSource`] over the Secrets `<volumeID>-auth` of one namespace, kept by one
/// watch; see the [module documentation](self).
///
/// Dropping the source stops its watch.
pub struct KubeSecretSource {
    shared: Arc<Shared>,
    watch_task: JoinHandle<()>,
}

impl KubeSecretSource {
    /// A source over the Secrets of `namespace`, read with `client`, and its watch, spawned on
    /// `runtime` at once (build `client` inside that runtime: the kube client spawns a task of
    /// its own when it is built). The watch runs until the source is dropped.
    pub fn new(
        client: Client,
        namespace: &str,
        settings: WatchSettings,
        runtime: &tokio::runtime::Handle,
    ) -> Result<Self, InvalidNamespace> {
        if !is_namespace_name(namespace) {
            return Err(InvalidNamespace {
                namespace: namespace.to_owned(),
            });
        }
        let secrets = ::kube::core::Request::new(format!("/api/v1/namespaces/{namespace}/secrets"));
        let shared = Arc::new(Shared {
            client,
            secrets,
            namespace: namespace.to_owned(),
            settings,
            state: Mutex::new(State::default()),
            gets: Semaphore::new(MAX_CONCURRENT_GETS),
        });
        let watch_task = runtime.spawn(run_watch(Arc::clone(&shared)));
        Ok(KubeSecretSource { shared, watch_task })
    }

    /// The namespace the source reads.
    pub fn namespace(&self) -> &str {
        &self.shared.namespace
    }

    /// Whether the watch is up: the cache was filled by a list and a watch is streaming, so
    /// loads of cached volumes make no request.
    pub fn is_watching(&self) -> bool {
        self.shared.lock().watching
    }
}

impl Drop for KubeSecretSource {
    fn drop(&mut self) {
        self.watch_task.abort();
    }
}

impl fmt::Debug for KubeSecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("KubeSecretSource")
            .field("namespace", &self.shared.namespace)
            .field("watching", &state.watching)
            .field("volumes", &state.entries.len())
            .finish_non_exhaustive()
    }
}

impl CredentialSource for KubeSecretSource {
    fn load<'a>(&'a self, volume_id: &'a str) -> Load<'a> {
        Box::pin(self.shared.load(secret_name(volume_id)))
    }

    /// Stops keeping `volume_id`'s Secret (the owner calls it when it unstages the volume).
    /// Pending [`changed`](CredentialSource::changed) futures of the volume resolve.
    fn forget(&self, volume_id: &str) {
        self.shared.lock().entries.remove(&secret_name(volume_id));
    }

    fn changed<'a>(&'a self, volume_id: &'a str) -> Changed<'a> {
        // Subscribed now, so a change between this call and the first poll is not missed.
        let mut wake = self.shared.subscribe(&secret_name(volume_id));
        let shared = &self.shared;
        Box::pin(async move {
            loop {
                tokio::select! {
                    _ = wake.changed() => return,
                    () = tokio::time::sleep(shared.settings.degraded_poll) => {
                        if !shared.lock().watching {
                            return;
                        }
                    }
                }
            }
        })
    }
}

fn secret_name(volume_id: &str) -> String {
    format!("{volume_id}{SECRET_SUFFIX}")
}

/// An RFC 1123 label, as a namespace name is.
fn is_namespace_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let inner = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-';
    let outer = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(inner)
        && bytes.first().is_some_and(outer)
        && bytes.last().is_some_and(outer)
}

/// Why a Secret's data does not make material: the parts of a [`CredentialError`] that can be
/// cached (the place is added when it is returned).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Unusable {
    MissingKey(&'static str),
    Malformed { what: &'static str, reason: String },
}

type Parsed = Result<Material, Unusable>;

fn into_result(parsed: Parsed, place: String) -> Result<Material, CredentialError> {
    parsed.map_err(|unusable| match unusable {
        Unusable::MissingKey(key) => CredentialError::MissingKey { place, key },
        Unusable::Malformed { what, reason } => CredentialError::Malformed { what, reason },
    })
}

/// The material in a Secret's data; the checks and their order are those of the directory
/// source.
fn material_from(secret: Secret) -> Parsed {
    let mut data = secret.data.unwrap_or_default();
    let mut take = |key: &'static str| -> Result<Option<Vec<u8>>, Unusable> {
        match data.remove(key) {
            None => Ok(None),
            Some(ByteString(bytes)) if bytes.len() as u64 > MAX_VALUE_BYTES => {
                Err(Unusable::Malformed {
                    what: key,
                    reason: format!("it is over {MAX_VALUE_BYTES} bytes"),
                })
            }
            Some(ByteString(bytes)) => Ok(Some(bytes)),
        }
    };
    let text = |key: &'static str, bytes: Vec<u8>| {
        String::from_utf8(bytes).map_err(|_| Unusable::Malformed {
            what: key,
            reason: "it is not UTF-8".to_owned(),
        })
    };
    let token = take(TOKEN)?.ok_or(Unusable::MissingKey(TOKEN))?;
    let token = text(TOKEN, token)?;
    let next_token = take(NEXT_TOKEN)?
        .map(|bytes| text(NEXT_TOKEN, bytes))
        .transpose()?
        .filter(|token| !token.trim().is_empty());
    let ca_bundle = take(CA_BUNDLE)?.ok_or(Unusable::MissingKey(CA_BUNDLE))?;
    let client_chain = take(CLIENT_CERTIFICATE)?.ok_or(Unusable::MissingKey(CLIENT_CERTIFICATE))?;
    let client_key = take(CLIENT_KEY)?.ok_or(Unusable::MissingKey(CLIENT_KEY))?;
    Ok(Material::new(
        token,
        next_token,
        ca_bundle,
        client_chain,
        client_key,
    ))
}

/// What the cache holds for one Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cached {
    /// Registered, not read yet.
    Unknown,
    Absent,
    Present(Parsed),
}

struct Entry {
    cached: Cached,
    /// Bumped by every update from the watch, so that a GET that was in flight meanwhile does
    /// not overwrite what the watch said.
    generation: u64,
    wake: watch::Sender<()>,
}

impl Entry {
    fn new() -> Self {
        Entry {
            cached: Cached::Unknown,
            generation: 0,
            wake: watch::Sender::new(()),
        }
    }

    /// Stores `cached`, waking the volume's `changed()` futures when it differs.
    fn update(&mut self, cached: Cached) {
        self.generation += 1;
        if self.cached != cached {
            self.cached = cached;
            self.wake.send_replace(());
        }
    }
}

#[derive(Default)]
struct State {
    /// A list filled the cache and a watch is streaming.
    watching: bool,
    /// The registered Secrets, by Secret name.
    entries: HashMap<String, Entry>,
}

struct Shared {
    client: Client,
    /// Requests under `/api/v1/namespaces/<namespace>/secrets`, the only path the source uses.
    secrets: ::kube::core::Request,
    namespace: String,
    settings: WatchSettings,
    state: Mutex<State>,
    gets: Semaphore,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent at every await-free step, so a panic elsewhere leaves it
        // usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn place(&self, name: &str) -> String {
        format!("secret {}/{name}", self.namespace)
    }

    fn subscribe(&self, name: &str) -> watch::Receiver<()> {
        let mut state = self.lock();
        state
            .entries
            .entry(name.to_owned())
            .or_insert_with(Entry::new)
            .wake
            .subscribe()
    }

    fn set_watching(&self, watching: bool) {
        self.lock().watching = watching;
    }

    async fn load(&self, name: String) -> Result<Material, CredentialError> {
        let place = self.place(&name);
        let generation = {
            let mut state = self.lock();
            let watching = state.watching;
            let entry = state.entries.entry(name.clone()).or_insert_with(Entry::new);
            if let (true, Cached::Present(parsed)) = (watching, &entry.cached) {
                return into_result(parsed.clone(), place);
            }
            entry.generation
        };
        let fetched = self
            .fetch(&name)
            .await
            .map_err(|failure| CredentialError::Unavailable {
                place: place.clone(),
                source: Box::new(failure),
            })?;
        if let Some(entry) = self.lock().entries.get_mut(&name)
            && entry.generation == generation
        {
            entry.update(fetched.clone());
        }
        match fetched {
            Cached::Present(parsed) => into_result(parsed, place),
            Cached::Absent | Cached::Unknown => Err(CredentialError::Missing { place }),
        }
    }

    /// One GET of the Secret `name`: [`Cached::Absent`] or [`Cached::Present`].
    async fn fetch(&self, name: &str) -> Result<Cached, ApiFailure> {
        // The semaphore is never closed.
        let _permit = self.gets.acquire().await;
        let request = self
            .secrets
            .get(name, &GetParams::default())
            .map_err(|e| ApiFailure::Request(e.to_string()))?;
        match self.call::<Secret>(request).await {
            Ok(secret) => Ok(Cached::Present(material_from(secret))),
            Err(ApiFailure::NotFound) => Ok(Cached::Absent),
            Err(failure) => Err(failure),
        }
    }

    /// One request, bounded by the request timeout, its answer decoded as `T`.
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        request: http::Request<Vec<u8>>,
    ) -> Result<T, ApiFailure> {
        let timeout = self.settings.request_timeout;
        let text = tokio::time::timeout(timeout, self.client.request_text(request))
            .await
            .map_err(|_| ApiFailure::Timeout(timeout))?
            .map_err(|error| ApiFailure::from_kube(error, &self.namespace))?;
        decode(&text)
    }

    /// Lists the namespace's Secrets, refreshes every registered one from the list, and
    /// returns the list's resourceVersion.
    async fn relist(&self) -> Result<String, ApiFailure> {
        let wanted: HashSet<String> = self.lock().entries.keys().cloned().collect();
        let mut found: HashMap<String, Parsed> = HashMap::new();
        let mut params = ListParams::default().limit(self.settings.page_size);
        let resource_version = loop {
            let request = self
                .secrets
                .list(&params)
                .map_err(|e| ApiFailure::Request(e.to_string()))?;
            let page: ObjectList<Secret> = self.call(request).await?;
            for secret in page.items {
                if let Some(name) = secret
                    .metadata
                    .name
                    .as_ref()
                    .filter(|n| wanted.contains(*n))
                {
                    found.insert(name.clone(), material_from(secret));
                }
            }
            // Every page of a list carries the resourceVersion of the same snapshot; with
            // nothing registered, the first page is enough to learn it.
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) if !wanted.is_empty() => {
                    params = ListParams::default()
                        .limit(self.settings.page_size)
                        .continue_token(&token);
                }
                _ => {
                    break page
                        .metadata
                        .resource_version
                        .filter(|version| !version.is_empty())
                        .ok_or(ApiFailure::NoResourceVersion)?;
                }
            }
        };
        let mut state = self.lock();
        // A Secret registered after the list began is left to its own GET: the list may have
        // passed its name before it was registered.
        for name in &wanted {
            if let Some(entry) = state.entries.get_mut(name) {
                entry.update(match found.remove(name) {
                    Some(parsed) => Cached::Present(parsed),
                    None => Cached::Absent,
                });
            }
        }
        state.watching = true;
        Ok(resource_version)
    }

    /// Applies one watched Secret to the cache, if it is registered.
    fn apply(&self, secret: Secret, deleted: bool) {
        let Some(name) = secret.metadata.name.clone() else {
            return;
        };
        let mut state = self.lock();
        if let Some(entry) = state.entries.get_mut(&name) {
            entry.update(if deleted {
                Cached::Absent
            } else {
                Cached::Present(material_from(secret))
            });
        }
    }

    /// One watch from `resource_version`, applied to the cache until it ends; the cursor
    /// follows every resourceVersion seen.
    async fn watch_once(&self, cursor: &mut WatchCursor, resource_version: &str) -> WatchEnd {
        let started = Instant::now();
        let deadline = started + self.settings.watch_timeout + WATCH_GRACE;
        let seconds = u32::try_from(self.settings.watch_timeout.as_secs()).unwrap_or(u32::MAX);
        let params = WatchParams::default().timeout(seconds);
        let request = match self.secrets.watch(&params, resource_version) {
            Ok(request) => request,
            Err(e) => return WatchEnd::Failed(ApiFailure::Request(e.to_string())),
        };
        let stream =
            match tokio::time::timeout_at(deadline, self.client.request_events::<Secret>(request))
                .await
            {
                Err(_) => return WatchEnd::Failed(ApiFailure::Silent),
                Ok(Err(error)) => return self.watch_error(error),
                Ok(Ok(stream)) => stream,
            };
        self.set_watching(true);
        let mut stream = std::pin::pin!(stream);
        let mut events = 0_u64;
        loop {
            let next = match tokio::time::timeout_at(deadline, stream.try_next()).await {
                Err(_) => return WatchEnd::Failed(ApiFailure::Silent),
                Ok(next) => next,
            };
            let event = match next {
                Ok(Some(event)) => event,
                Ok(None) => {
                    return WatchEnd::Closed {
                        events,
                        lasted: started.elapsed(),
                    };
                }
                Err(error) => return self.watch_error(error),
            };
            events += 1;
            match event {
                WatchEvent::Added(secret) | WatchEvent::Modified(secret) => {
                    cursor.advanced(secret.metadata.resource_version.clone());
                    self.apply(secret, false);
                }
                WatchEvent::Deleted(secret) => {
                    cursor.advanced(secret.metadata.resource_version.clone());
                    self.apply(secret, true);
                }
                WatchEvent::Bookmark(bookmark) => {
                    cursor.advanced(Some(bookmark.metadata.resource_version));
                }
                WatchEvent::Error(status) if status.code == 410 => return WatchEnd::Gone,
                WatchEvent::Error(status) => {
                    return WatchEnd::Failed(ApiFailure::from_status(&status, &self.namespace));
                }
            }
        }
    }

    fn watch_error(&self, error: ::kube::Error) -> WatchEnd {
        match error {
            ::kube::Error::Api(status) if status.code == 410 => WatchEnd::Gone,
            error => WatchEnd::Failed(ApiFailure::from_kube(error, &self.namespace)),
        }
    }
}

/// How one watch ended.
enum WatchEnd {
    /// The server ended it (its timeout, or a restart).
    Closed {
        events: u64,
        lasted: Duration,
    },
    /// The resourceVersion is too old: relist.
    Gone,
    Failed(ApiFailure),
}

/// What the watch task does next.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    List,
    Watch { resource_version: String },
}

/// The watch task's decisions, without I/O: where to resume and how long to back off.
#[derive(Debug)]
struct WatchCursor {
    resource_version: Option<String>,
    failures: u32,
    retry_min: Duration,
    retry_max: Duration,
}

impl WatchCursor {
    fn new(retry_min: Duration, retry_max: Duration) -> Self {
        WatchCursor {
            resource_version: None,
            failures: 0,
            retry_min,
            retry_max,
        }
    }

    fn next(&self) -> Action {
        match &self.resource_version {
            None => Action::List,
            Some(version) => Action::Watch {
                resource_version: version.clone(),
            },
        }
    }

    /// A list succeeded at `resource_version`.
    fn listed(&mut self, resource_version: String) {
        self.resource_version = Some(resource_version);
        self.failures = 0;
    }

    /// A watch event or bookmark carried `resource_version`.
    fn advanced(&mut self, resource_version: Option<String>) {
        if let Some(version) = resource_version.filter(|v| !v.is_empty()) {
            self.resource_version = Some(version);
        }
        self.failures = 0;
    }

    /// The server ended a watch after `events` events and `lasted`: resume at once, or after
    /// a backoff when it sent nothing and closed at once.
    fn closed(&mut self, events: u64, lasted: Duration, random: u64) -> Option<Duration> {
        if events > 0 || lasted >= MIN_PRODUCTIVE_WATCH {
            self.failures = 0;
            None
        } else {
            Some(self.failed(random))
        }
    }

    /// The resourceVersion is gone: relist next.
    fn gone(&mut self) {
        self.resource_version = None;
    }

    /// A request failed: the delay before the next, `retry_min` doubling per failure up to
    /// `retry_max`, jittered by `random` to between half and all of it.
    fn failed(&mut self, random: u64) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let doublings = (self.failures - 1).min(20);
        let full = self
            .retry_min
            .saturating_mul(1_u32 << doublings)
            .min(self.retry_max);
        let half = full / 2;
        // `random % 1024` is below 1024, so the cast is exact.
        half + half * (random % 1024) as u32 / 1024
    }
}

fn random() -> u64 {
    RandomState::new().hash_one(Instant::now())
}

async fn run_watch(shared: Arc<Shared>) {
    let settings = &shared.settings;
    let mut cursor = WatchCursor::new(settings.retry_min, settings.retry_max);
    loop {
        let delay = match cursor.next() {
            Action::List => match shared.relist().await {
                Ok(version) => {
                    tracing::debug!(namespace = %shared.namespace, "listed credential secrets");
                    cursor.listed(version);
                    None
                }
                Err(failure) => {
                    shared.set_watching(false);
                    let delay = cursor.failed(random());
                    tracing::warn!(
                        namespace = %shared.namespace,
                        error = %error_text::Chain(&failure),
                        retry_in = ?delay,
                        "cannot list credential secrets",
                    );
                    Some(delay)
                }
            },
            Action::Watch { resource_version } => {
                match shared.watch_once(&mut cursor, &resource_version).await {
                    WatchEnd::Closed { events, lasted } => cursor.closed(events, lasted, random()),
                    WatchEnd::Gone => {
                        shared.set_watching(false);
                        tracing::info!(
                            namespace = %shared.namespace,
                            "the credential secrets' watch expired; listing again",
                        );
                        cursor.gone();
                        None
                    }
                    WatchEnd::Failed(failure) => {
                        shared.set_watching(false);
                        let delay = cursor.failed(random());
                        tracing::warn!(
                            namespace = %shared.namespace,
                            error = %error_text::Chain(&failure),
                            retry_in = ?delay,
                            "the credential secrets' watch failed",
                        );
                        Some(delay)
                    }
                }
            }
        };
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
    }
}

/// Decodes an API server answer; the error quotes none of it (serde's messages can quote the
/// value that did not fit, and a Secret's value is what does not fit).
fn decode<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, ApiFailure> {
    serde_json::from_str(text).map_err(|error| {
        let what = match error.classify() {
            serde_json::error::Category::Io => "unreadable",
            serde_json::error::Category::Syntax => "not JSON",
            serde_json::error::Category::Data => "JSON of an unexpected shape",
            serde_json::error::Category::Eof => "truncated JSON",
        };
        ApiFailure::Undecodable(format!(
            "{what} at line {} column {}",
            error.line(),
            error.column()
        ))
    })
}

/// Why a request to the API server failed; carries nothing of a response body but the API
/// server's own status message.
#[derive(Debug, thiserror::Error)]
enum ApiFailure {
    #[error(
        "the API server forbids it ({message}); the node's ServiceAccount needs get, list and watch on secrets in namespace {namespace}"
    )]
    Forbidden { namespace: String, message: String },
    #[error("the Secret does not exist")]
    NotFound,
    #[error("the API server answers {code} {reason}: {message}")]
    Refused {
        code: u16,
        reason: String,
        message: String,
    },
    #[error("the API server does not answer within {0:?}")]
    Timeout(Duration),
    #[error("the watch stays silent past its timeout")]
    Silent,
    #[error("the API server's answer is {0}")]
    Undecodable(String),
    #[error("the list has no resourceVersion")]
    NoResourceVersion,
    #[error("the request cannot be built: {0}")]
    Request(String),
    #[error("the API server cannot be reached")]
    Unreachable(#[source] ::kube::Error),
    #[error("the request fails: {0}")]
    Other(String),
}

impl ApiFailure {
    fn from_kube(error: ::kube::Error, namespace: &str) -> Self {
        match error {
            ::kube::Error::Api(status) => Self::from_status(&status, namespace),
            // Only their lengths and positions are kept: the body may be a Secret.
            ::kube::Error::SerdeError(error) => {
                ApiFailure::Undecodable(format!("undecodable at line {}", error.line()))
            }
            ::kube::Error::FromUtf8(_) => ApiFailure::Undecodable("not UTF-8".to_owned()),
            error @ (::kube::Error::HyperError(_)
            | ::kube::Error::Service(_)
            | ::kube::Error::ReadEvents(_)) => ApiFailure::Unreachable(error),
            other => ApiFailure::Other(other.to_string()),
        }
    }

    fn from_status(status: &::kube::core::Status, namespace: &str) -> Self {
        let message: String = status.message.chars().take(MAX_MESSAGE_CHARS).collect();
        if status.is_not_found() {
            ApiFailure::NotFound
        } else if status.is_forbidden() {
            ApiFailure::Forbidden {
                namespace: namespace.to_owned(),
                message,
            }
        } else {
            ApiFailure::Refused {
                code: status.code,
                reason: status.reason.clone(),
                message,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Material data as a test writes it into a Secret.
    fn secret_with(name: &str, data: &[(&str, &[u8])]) -> Secret {
        Secret {
            metadata: ::kube::core::ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(key, value)| ((*key).to_owned(), ByteString(value.to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        }
    }

    const FULL: &[(&str, &[u8])] = &[
        (TOKEN, b"tok-1"),
        (CA_BUNDLE, b"ca"),
        (CLIENT_CERTIFICATE, b"crt"),
        (CLIENT_KEY, b"key"),
    ];

    #[test]
    fn a_secret_with_every_key_makes_material_and_a_blank_next_token_is_none() {
        let material = material_from(secret_with("v-auth", FULL)).unwrap();
        let expected = Material::new(
            "tok-1".to_owned(),
            None,
            b"ca".to_vec(),
            b"crt".to_vec(),
            b"key".to_vec(),
        );
        assert_eq!(material, expected);
        let mut data = FULL.to_vec();
        data.push((NEXT_TOKEN, b" \n"));
        assert_eq!(
            material_from(secret_with("v-auth", &data)).unwrap(),
            expected
        );
        data.pop();
        data.push((NEXT_TOKEN, b"tok-2"));
        let material = material_from(secret_with("v-auth", &data)).unwrap();
        assert_ne!(material, expected);
    }

    #[test]
    fn a_missing_key_an_oversized_value_and_a_binary_token_are_refused_without_content() {
        let without_key: Vec<_> = FULL
            .iter()
            .copied()
            .filter(|(k, _)| *k != CLIENT_KEY)
            .collect();
        assert_eq!(
            material_from(secret_with("v-auth", &without_key)),
            Err(Unusable::MissingKey(CLIENT_KEY))
        );
        assert_eq!(
            material_from(Secret::default()),
            Err(Unusable::MissingKey(TOKEN))
        );
        let big = vec![b'a'; usize::try_from(MAX_VALUE_BYTES).unwrap() + 1];
        let mut data = FULL.to_vec();
        data.push((CA_BUNDLE, &big));
        let error = material_from(secret_with("v-auth", &data)).unwrap_err();
        assert!(
            matches!(&error, Unusable::Malformed { what: CA_BUNDLE, reason } if !reason.contains('a')),
            "{error:?}"
        );
        let mut data = FULL.to_vec();
        data.push((TOKEN, b"\xffsecret"));
        let error = material_from(secret_with("v-auth", &data)).unwrap_err();
        let error = into_result(Err(error), "secret ns/v-auth".to_owned()).unwrap_err();
        assert!(matches!(
            error,
            CredentialError::Malformed { what: TOKEN, .. }
        ));
        assert!(
            !format!("{error} {error:?}").contains("secret\""),
            "{error:?}"
        );
    }

    #[test]
    fn the_cursor_lists_first_resumes_from_the_last_version_and_relists_when_gone() {
        let mut cursor = WatchCursor::new(Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(cursor.next(), Action::List);
        cursor.listed("10".to_owned());
        let watch_from = |v: &str| Action::Watch {
            resource_version: v.to_owned(),
        };
        assert_eq!(cursor.next(), watch_from("10"));
        cursor.advanced(Some("12".to_owned()));
        cursor.advanced(None);
        cursor.advanced(Some(String::new()));
        assert_eq!(cursor.next(), watch_from("12"));
        // A normal end resumes at once from where the watch was.
        assert_eq!(cursor.closed(3, Duration::from_millis(5), 0), None);
        assert_eq!(cursor.closed(0, Duration::from_secs(290), 0), None);
        assert_eq!(cursor.next(), watch_from("12"));
        // A server that closes at once, having sent nothing, is backed off from.
        assert!(cursor.closed(0, Duration::from_millis(5), 0).is_some());
        assert_eq!(cursor.next(), watch_from("12"));
        cursor.gone();
        assert_eq!(cursor.next(), Action::List);
    }

    #[test]
    fn failures_back_off_doubling_up_to_the_bound_with_jitter_down_to_half() {
        let min = Duration::from_millis(100);
        let max = Duration::from_millis(1000);
        let mut cursor = WatchCursor::new(min, max);
        let fulls: Vec<Duration> = (0..6).map(|_| cursor.failed(1023)).collect();
        assert!(fulls[0] <= min && fulls[0] > min * 99 / 100, "{fulls:?}");
        assert!(fulls.windows(2).all(|w| w[0] <= w[1]), "{fulls:?}");
        assert!(*fulls.last().unwrap() <= max && fulls[5] > max * 99 / 100);
        let mut cursor = WatchCursor::new(min, max);
        assert_eq!(cursor.failed(0), min / 2);
        for _ in 0..10 {
            cursor.failed(0);
        }
        for random in [0, 1, 511, 1023, u64::MAX] {
            let delay = cursor.failed(random);
            assert!(delay >= max / 2 && delay <= max, "{delay:?}");
        }
        cursor.listed("1".to_owned());
        assert_eq!(cursor.failed(0), min / 2);
    }

    #[test]
    fn undecodable_answers_quote_none_of_the_body() {
        let body = r#"{"kind":"Secret","apiVersion":"v1","metadata":{"name":"v-auth"},"data":{"token":987654321}}"#;
        let error = decode::<Secret>(body).unwrap_err();
        let shown = format!("{error} {error:?}");
        assert!(!shown.contains("987654321"), "{shown}");
        let body = r#"{"metadata":{"name":"v-auth"},"data":{"token":"c2VjcmV0!!"}}"#;
        let shown = format!("{:?}", decode::<Secret>(body).unwrap_err());
        assert!(
            !shown.contains("c2VjcmV0") && !shown.contains("symbol"),
            "{shown}"
        );
        let source = serde_json::from_str::<u32>("\"secret-value\"").unwrap_err();
        let error = ApiFailure::from_kube(::kube::Error::SerdeError(source), "ns");
        assert!(!format!("{error} {error:?}").contains("secret-value"));
    }

    #[test]
    fn a_forbidden_answer_names_the_missing_permission() {
        let status =
            ::kube::core::Status::failure("secrets is forbidden", "Forbidden").with_code(403);
        let error = ApiFailure::from_kube(::kube::Error::Api(status.boxed()), "tak-os");
        let text = error.to_string();
        assert!(
            text.contains("get, list and watch") && text.contains("namespace tak-os"),
            "{text}"
        );
    }

    #[test]
    fn only_namespace_names_are_accepted() {
        for good in ["tak-os", "a", "x1", &"n".repeat(63)] {
            assert!(is_namespace_name(good), "{good}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a/b",
            "a..b",
            "kube system",
            &"n".repeat(64),
        ] {
            assert!(!is_namespace_name(bad), "{bad}");
        }
    }
}
