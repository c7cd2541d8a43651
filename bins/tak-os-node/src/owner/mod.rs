//! The mount owner: it holds every stage's FUSE connection, worker client, lease and
//! credentials, and serves the CSI Node calls that change them.
//!
//! What a successor needs is never only in memory: each stage has a session record beside its
//! staging path (volume identity, endpoints, access mode, RWO epoch, whether the stage
//! completed), and the kernel's mount table says what is mounted where. A stage this process
//! did not make (its owner process is gone, and with it the FUSE connection) is recognised from
//! those two and cleaned up by NodeUnpublishVolume and NodeUnstageVolume.
//!
//! Calls for one volume never run concurrently: a second one gets ABORTED.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lease_client::{Budgets, Client, HttpsTransport, LeaseConfig, LeaseStatus, MountLease};
use mounter::{MountIdentity, Mounter, TargetRoot};

use crate::context::VolumeContext;
use crate::credentials::CredentialSource;
use crate::error::Error;

mod handoff;
mod journal;
mod publish;
mod stage;
mod stats;

pub use handoff::HandOverReport;
pub use stats::{Condition, VolumeStats};

/// The worker client of one stage.
pub type WorkerClient = Client<HttpsTransport>;

/// The longest volume ID this driver accepts: a Secret named `<volumeID>-auth` must fit a
/// Kubernetes object name (253 characters).
pub const MAX_VOLUME_ID_BYTES: usize = 248;

/// A point inside NodeStageVolume, reached just after the step it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StagePoint {
    /// The pending session record is durable.
    RecordWritten,
    /// The RWO lease is claimed.
    Claimed,
    /// The FUSE filesystem is mounted at the staging path.
    Mounted,
    /// The session record says the stage completed.
    Completed,
    /// A successor fetched the stage of an owner that died and is about to have the kernel
    /// resend what that owner had read (a test holds a successor back here).
    TakingOver,
}

/// Called at every [`StagePoint`]: crash tests stop an owner process between any two steps,
/// or hold it there.
/// Production owners have none.
#[derive(Clone, Default)]
pub struct Hook(Option<Arc<dyn Fn(StagePoint) + Send + Sync>>);

impl Hook {
    /// A hook that calls `f` at every point.
    pub fn new(f: impl Fn(StagePoint) + Send + Sync + 'static) -> Self {
        Hook(Some(Arc::new(f)))
    }

    pub(crate) fn reach(&self, point: StagePoint) {
        if let Some(f) = &self.0 {
            f(point);
        }
    }
}

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Hook(set)"
        } else {
            "Hook(none)"
        })
    }
}

/// What the owner needs to know besides its collaborators.
#[derive(Debug, Clone)]
pub struct OwnerConfig {
    /// This node's CSI node ID (its Kubernetes name).
    pub node_id: String,
    /// Kubelet's root directory: staging and target paths must lie below it.
    pub kubelet_root: PathBuf,
    /// The only namespace credentials are read from.
    pub credential_namespace: String,
    /// The worker calls' budgets.
    pub budgets: Budgets,
    /// The RWO lease's timings.
    pub lease: LeaseConfig,
    /// The filesystem's tunables.
    pub fs: fusefs::FsConfig,
    /// How long NodeGetVolumeStats waits for the workers' statfs.
    pub stats_timeout: Duration,
    /// How long an unmount waits for the FUSE session to end.
    pub unmount_wait: Duration,
    /// The keeper's socket: every stage is deposited there, and handed over when the owner
    /// is told to stop. Without one, an owner restart ends its mounts.
    pub keeper_socket: Option<PathBuf>,
    /// How long handing a stage over waits for its requests in flight.
    pub handoff_deadline: Duration,
    /// How often the keeper is asked whether it is there (a new connection to it means it may
    /// have restarted: every stage is deposited again).
    pub keeper_check: Duration,
    /// Called at each step of a stage (crash tests only).
    pub hook: Hook,
    /// Told of every worker call made for a kernel request on every stage (the exactly-once
    /// tests only).
    pub calls: Option<Arc<dyn fusefs::CallObserver>>,
    /// How many threads serve the stages ([`fusefs::ServingThreads`]); zero means one per
    /// CPU the process may use. Each stage is served by one of them, its FUSE session and its
    /// worker connections together. They are named [`SERVING_THREADS`]`-0`, `-1` and so on.
    pub serving_threads: usize,
}

/// The name of the owner's serving threads, before each one's index (`fuse-0`, `fuse-1`, …),
/// as `ps -L` and `/proc/<pid>/task/*/comm` show them.
pub const SERVING_THREADS: &str = "fuse";

impl OwnerConfig {
    /// The defaults for node `node_id`: kubelet in `/var/lib/kubelet`, credentials from
    /// namespace `tak-os-system`, the protocol's budgets and lease timings.
    pub fn new(node_id: impl Into<String>) -> Self {
        OwnerConfig {
            node_id: node_id.into(),
            kubelet_root: PathBuf::from("/var/lib/kubelet"),
            credential_namespace: "tak-os-system".to_owned(),
            budgets: Budgets::default(),
            lease: LeaseConfig::default(),
            fs: fusefs::FsConfig::default(),
            stats_timeout: Duration::from_secs(2),
            unmount_wait: Duration::from_secs(5),
            keeper_socket: None,
            handoff_deadline: Duration::from_secs(10),
            keeper_check: Duration::from_secs(1),
            hook: Hook::default(),
            calls: None,
            serving_threads: 0,
        }
    }
}

/// The mount owner.
#[derive(Debug)]
pub struct Owner {
    config: OwnerConfig,
    kubelet: TargetRoot,
    mounter: Arc<dyn Mounter>,
    credentials: Arc<dyn CredentialSource>,
    /// The stages this process made, by staging path.
    stages: Mutex<HashMap<PathBuf, Arc<Stage>>>,
    /// Volumes with a call in flight.
    busy: Mutex<HashSet<String>>,
    ready: AtomicBool,
    /// The keeper, when one is configured.
    keeper: Option<Arc<crate::keeper::KeeperLink>>,
    /// The threads the stages are served on.
    serving: fusefs::ServingThreads,
}

impl std::fmt::Debug for dyn CredentialSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CredentialSource")
    }
}

/// One stage this process made: the FUSE mount, its worker client, the RWO lease and the
/// credential refresh.
#[derive(Debug)]
pub(crate) struct Stage {
    pub(crate) volume_id: String,
    pub(crate) context: VolumeContext,
    pub(crate) staging: PathBuf,
    /// The mount's identity: the FUSE connection's device, root `/`, type and source.
    pub(crate) identity: MountIdentity,
    pub(crate) mounted: tokio::sync::Mutex<Option<fusefs::Mounted<WorkerClient>>>,
    pub(crate) lease: Option<Lease>,
    pub(crate) refresh: tokio::task::JoinHandle<()>,
    /// The write-ahead of its tables to the keeper, when there is one.
    pub(crate) journal: Option<Arc<journal::StageJournal>>,
}

/// An RWO stage's lease and its renewal.
#[derive(Debug)]
pub(crate) struct Lease {
    pub(crate) lease: MountLease<HttpsTransport>,
    pub(crate) renewal: Mutex<Option<lease_client::RenewalTask>>,
}

impl Stage {
    /// Why the stage cannot serve, if it cannot: its lease is lost or was stopped.
    pub(crate) fn unhealthy(&self) -> Option<String> {
        let lease = self.lease.as_ref()?;
        let renewal = lock(&lease.renewal);
        match renewal.as_ref().map(lease_client::RenewalTask::status) {
            Some(LeaseStatus::Held { .. }) => None,
            Some(LeaseStatus::Lost(reason)) => Some(format!("its lease is lost ({reason:?})")),
            Some(LeaseStatus::Stopped) | None => Some("its lease is no longer renewed".to_owned()),
        }
    }
}

impl Owner {
    /// The filesystem configuration of a stage: the configured one, with the call budget of
    /// the owner's client (a kernel request starts no call later than that after its first).
    /// Sets the configured call observer, if any, on a stage's new filesystem.
    pub(crate) fn observe(&self, fs: &fusefs::Fs<WorkerClient>) {
        if let Some(calls) = &self.config.calls {
            fs.observe_calls(Arc::clone(calls));
        }
    }

    pub(crate) fn fs_config(&self) -> fusefs::FsConfig {
        fusefs::FsConfig {
            call_budget: self.config.budgets.call,
            ..self.config.fs
        }
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        self.refresh.abort();
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The mark of a call in flight for one volume; dropping it ends the call.
pub(crate) struct Busy<'a> {
    owner: &'a Owner,
    volume_id: String,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        lock(&self.owner.busy).remove(&self.volume_id);
    }
}

impl Owner {
    /// An owner for `config`, mounting through `mounter` and reading credentials from
    /// `credentials`. It serves once [`Owner::recover`] has run.
    pub fn new(
        config: OwnerConfig,
        mounter: Arc<dyn Mounter>,
        credentials: Arc<dyn CredentialSource>,
    ) -> Result<Self, Error> {
        let kubelet = TargetRoot::new(&config.kubelet_root).map_err(|source| Error::Path {
            field: "kubelet root",
            source,
        })?;
        let keeper = config
            .keeper_socket
            .as_ref()
            .map(|path| Arc::new(crate::keeper::KeeperLink::new(path)));
        let serving = match config.serving_threads {
            0 => fusefs::ServingThreads::per_cpu(SERVING_THREADS),
            count => fusefs::ServingThreads::new(SERVING_THREADS, count),
        }
        .map_err(Error::Threads)?;
        Ok(Owner {
            serving,
            config,
            keeper,
            kubelet,
            mounter,
            credentials,
            stages: Mutex::new(HashMap::new()),
            busy: Mutex::new(HashSet::new()),
            ready: AtomicBool::new(false),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &OwnerConfig {
        &self.config
    }

    /// Startup recovery: the stages a previous owner process left are found when their calls
    /// come (from the session record beside the path in the request and the kernel's mount
    /// table; nothing walks the kubelet directory, which may hold dead mounts). What is left
    /// here is to count them for the logs: the mount table names every
    /// `fuse.tak-os-replicated` mount, and each one not on the connection of a stage this
    /// process holds (made, or taken back from the keeper with [`Owner::adopt_handed_over`],
    /// which runs first) is reported as not held by this process.
    pub fn recover(&self) -> Result<usize, Error> {
        let bytes = mountinfo::read_self().map_err(|e| Error::Mounter {
            volume_id: String::new(),
            source: mounter::Error::Io {
                op: "read the mount table",
                path: PathBuf::from("/proc/self/mountinfo"),
                source: e,
            },
        })?;
        let table = mountinfo::MountTable::parse(&bytes).map_err(|e| Error::Mounter {
            volume_id: String::new(),
            source: mounter::Error::MountTable(e),
        })?;
        let held: HashSet<(u32, u32)> = lock(&self.stages)
            .values()
            .map(|stage| (stage.identity.major, stage.identity.minor))
            .collect();
        let left = table
            .iter()
            .filter(|m| m.fs_type() == fusefs::FS_TYPE && !held.contains(&(m.major(), m.minor())))
            .inspect(|m| {
                tracing::warn!(
                    volume = %m.source().to_string_lossy(),
                    path = %m.mount_point().display(),
                    "a replicated volume's mount left by an earlier owner process: its connection is gone until NodeUnpublishVolume and NodeUnstageVolume clean it up"
                );
            })
            .count();
        self.ready.store(true, Ordering::SeqCst);
        Ok(left)
    }

    /// Whether startup recovery has finished.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// How many stages this process holds.
    pub fn stage_count(&self) -> usize {
        lock(&self.stages).len()
    }

    fn begin(&self, volume_id: &str) -> Result<Busy<'_>, Error> {
        if !self.is_ready() {
            return Err(Error::NotReady);
        }
        if !lock(&self.busy).insert(volume_id.to_owned()) {
            return Err(Error::Busy {
                volume_id: volume_id.to_owned(),
            });
        }
        Ok(Busy {
            owner: self,
            volume_id: volume_id.to_owned(),
        })
    }

    fn stage_at(&self, staging: &Path) -> Option<Arc<Stage>> {
        lock(&self.stages).get(staging).cloned()
    }

    /// The stage of `volume_id` this process holds at any staging path.
    fn stage_of(&self, volume_id: &str) -> Option<Arc<Stage>> {
        lock(&self.stages)
            .values()
            .find(|stage| stage.volume_id == volume_id)
            .cloned()
    }
}

/// Checks a volume ID: what this driver's manager issues, and safe as a Secret name prefix
/// and a directory name. 1 to [`MAX_VOLUME_ID_BYTES`] characters from lowercase ASCII letters,
/// digits, `-` and `.`, beginning and ending with a letter or digit.
pub fn check_volume_id(volume_id: &str) -> Result<(), Error> {
    let invalid = |reason| Error::InvalidVolumeId {
        volume_id: volume_id.to_owned(),
        reason,
    };
    if volume_id.is_empty() {
        return Err(Error::Missing { field: "volume_id" });
    }
    if volume_id.len() > MAX_VOLUME_ID_BYTES {
        return Err(invalid("it is longer than 248 characters"));
    }
    let allowed = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.';
    if !volume_id.bytes().all(allowed) {
        return Err(invalid(
            "only lowercase letters, digits, '-' and '.' are allowed",
        ));
    }
    let alphanumeric = |c: Option<u8>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alphanumeric(volume_id.bytes().next()) || !alphanumeric(volume_id.bytes().last()) {
        return Err(invalid("it must begin and end with a letter or digit"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_ids_are_object_name_safe() {
        for good in ["a", "vol-1", "v1.a.b", "0", &"a".repeat(248)] {
            assert!(check_volume_id(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a/b",
            "..",
            "a b",
            "a_b",
            &"a".repeat(249),
        ] {
            assert!(check_volume_id(bad).is_err(), "{bad:?}");
        }
    }
}
