//! A worker, a client and a mount, all in one test process, and what the tests share: a
//! watchdog, a snapshot of a directory tree, and a way to act as another user.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use fusefs::testing::WorkerVolume;
use fusefs::{Fs, FsConfig, Mounted};
use lease_client::protocol::MountEpoch;
use lease_client::{Budgets, Client, HttpsTransport, LeaseConfig, MountLease, RenewalTask};
use tempfile::TempDir;
use worker::{AccessMode, Server, Timings, VolumeSpec};

/// Every duration is the default times this factor: a 1.5 s call budget, a 9 s lease.
pub(crate) const SCALE: f64 = 0.1;

pub(crate) type TestFs = Fs<Client<HttpsTransport>>;

/// The client's budgets in every test.
pub(crate) fn budgets() -> Budgets {
    Budgets::default().scaled(SCALE)
}

/// A worker serving one volume from a temporary directory (`fusefs::testing::WorkerVolume`),
/// with the mount points of the test inside it.
pub(crate) struct Volume {
    pub(crate) dir: TempDir,
    pub(crate) worker: WorkerVolume,
    pub(crate) spec: VolumeSpec,
}

impl Volume {
    pub(crate) async fn start(access_mode: AccessMode) -> Volume {
        Volume::start_with(access_mode, Timings::default().scaled(SCALE)).await
    }

    /// A volume whose worker uses `timings`.
    pub(crate) async fn start_with(access_mode: AccessMode, timings: Timings) -> Volume {
        Volume::start_in(tempfile::tempdir().unwrap(), access_mode, timings).await
    }

    /// A volume whose worker state (and so its backing directory) is on a tmpfs private to
    /// the test's mount namespace: for tests whose worker would otherwise spend its time in
    /// `fsync`s of its journal (one per new inode) on the host's disk.
    pub(crate) async fn start_on_tmpfs(access_mode: AccessMode) -> Volume {
        let dir = tempfile::tempdir().unwrap();
        rustix::mount::mount(
            "tmpfs",
            dir.path(),
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            c"mode=0700",
        )
        .unwrap();
        Volume::start_in(dir, access_mode, Timings::default().scaled(SCALE)).await
    }

    async fn start_in(dir: TempDir, access_mode: AccessMode, timings: Timings) -> Volume {
        let worker = WorkerVolume::start(dir.path(), "v1.fusefs-test", access_mode, timings)
            .await
            .unwrap();
        let spec = worker.spec().clone();
        Volume { dir, worker, spec }
    }

    pub(crate) fn server(&self) -> &Server {
        self.worker.server()
    }

    /// The worker's one endpoint; it stays the same across [`Volume::stop_worker`] and
    /// [`Volume::start_worker_again`].
    pub(crate) fn endpoint(&self) -> String {
        self.worker.endpoint()
    }

    /// Stops the worker: its port refuses connections until it is started again.
    pub(crate) async fn stop_worker(&mut self) {
        self.worker.stop_worker().await;
    }

    /// Starts a worker on the same address and state directory, as a restarted worker
    /// process would: leases, inode numbers and generations survive; open handles do not.
    pub(crate) async fn start_worker_again(&mut self) {
        self.worker.start_worker_again().await.unwrap();
    }

    pub(crate) fn client(&self) -> Client<HttpsTransport> {
        self.worker.client(budgets())
    }

    /// Where the worker keeps the volume's files (the backing directory).
    pub(crate) fn backing_dir(&self) -> PathBuf {
        self.worker.backing_dir()
    }

    /// A fresh, empty mount point.
    pub(crate) fn mount_point(&self, name: &str) -> PathBuf {
        let path = self.dir.path().join("mnt").join(name);
        std::fs::create_dir_all(&path).unwrap();
        path
    }

    /// How many calls have reached the worker so far.
    pub(crate) fn arrivals(&self) -> usize {
        self.server().faults().arrivals().len()
    }
}

impl Drop for Volume {
    /// A test that fails half-way leaves its mounts behind: abort their connections and
    /// detach them (and a tmpfs under the volume), so that removing the temporary directory
    /// never walks into a FUSE mount whose server is gone.
    fn drop(&mut self) {
        abort_connections_under(self.dir.path());
        let mounts = self.dir.path().join("mnt");
        if let Ok(entries) = std::fs::read_dir(&mounts) {
            for entry in entries.flatten() {
                let _ = rustix::mount::unmount(
                    entry.path(),
                    rustix::mount::UnmountFlags::DETACH | rustix::mount::UnmountFlags::NOFOLLOW,
                );
            }
        }
        let _ = rustix::mount::unmount(self.dir.path(), rustix::mount::UnmountFlags::DETACH);
    }
}

/// How a test mounts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MountOptions {
    pub(crate) fs: FsConfig,
    /// The RWO lease timings (only used for an RWO volume).
    pub(crate) lease: LeaseConfig,
    /// Keep the RWO lease renewed in the background.
    pub(crate) renew_lease: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            fs: FsConfig::default(),
            lease: LeaseConfig::default().scaled(SCALE),
            renew_lease: false,
        }
    }
}

/// A mounted volume with its handle renewal running.
#[allow(dead_code, reason = "tests use the parts they need")]
pub(crate) struct Mount {
    pub(crate) fs: Arc<TestFs>,
    pub(crate) mounted: Option<Mounted<Client<HttpsTransport>>>,
    pub(crate) lease: Option<MountLease<HttpsTransport>>,
    pub(crate) lease_renewal: Option<RenewalTask>,
}

impl Mount {
    /// Mounts the volume at `path`; an RWO volume claims a lease as node `node` first.
    pub(crate) async fn new(volume: &Volume, path: &Path, node: &str) -> Mount {
        Mount::with(volume, path, node, MountOptions::default()).await
    }

    pub(crate) async fn with(
        volume: &Volume,
        path: &Path,
        node: &str,
        options: MountOptions,
    ) -> Mount {
        let (client, lease, lease_renewal) = claimed_client(volume, node, options).await;
        let fs = Arc::new(Fs::new(client, options.fs).unwrap());
        let mut mount = Mount::of(fs, volume, path).await;
        mount.lease = lease;
        mount.lease_renewal = lease_renewal;
        mount
    }

    /// Mounts `fs` (whose client is already set up) at `path`.
    pub(crate) async fn of(fs: Arc<TestFs>, volume: &Volume, path: &Path) -> Mount {
        let mounted = fusefs::mount(Arc::clone(&fs), &volume.spec.volume_id, path)
            .await
            .unwrap();
        register_connection(mounted.device().1, path);
        Mount {
            fs,
            mounted: Some(mounted),
            lease: None,
            lease_renewal: None,
        }
    }

    pub(crate) fn path(&self) -> &Path {
        self.mounted.as_ref().unwrap().path()
    }

    /// Pauses the mount and has a new session adopt its connection, with the same `Fs`: the
    /// kernel sees no second INIT, and every node and handle it holds is still served.
    pub(crate) async fn hand_over(&mut self) {
        let mounted = self.mounted.take().unwrap();
        let paused = mounted.pause(Duration::from_secs(5)).await.unwrap();
        self.mounted = Some(paused.resume().unwrap());
    }

    pub(crate) async fn unmount(mut self) {
        if let Some(renewal) = self.lease_renewal.take() {
            renewal.stop().await;
        }
        let mut mounted = self.mounted.take().unwrap();
        let minor = mounted.device().1;
        mounted.unmount(Duration::from_secs(5)).await.unwrap();
        unregister_connection(minor);
    }
}

/// A client for `volume`; for an RWO volume it carries the epoch of a lease claimed as
/// `node`, with the lease (and its renewal task when asked for).
pub(crate) async fn claimed_client(
    volume: &Volume,
    node: &str,
    options: MountOptions,
) -> (
    Client<HttpsTransport>,
    Option<MountLease<HttpsTransport>>,
    Option<RenewalTask>,
) {
    let client = volume.client();
    if volume.spec.access_mode != AccessMode::Rwo {
        return (client, None, None);
    }
    let epoch = MountEpoch::random().unwrap();
    let lease = MountLease::new(&client, epoch, node, options.lease);
    let call = lease.prepare_claim().unwrap();
    let grant = lease.claim(&call).await.unwrap();
    let renewal = options.renew_lease.then(|| lease.spawn_renewal(grant));
    (client.with_epoch(epoch), Some(lease), renewal)
}

/// A multi-threaded runtime for the FUSE sessions, built after the namespace switch so its
/// threads live in the private namespace; the test thread itself does the file I/O.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

/// One privileged test: its namespace, runtime, worker and mount, and a watchdog.
///
/// Fields drop in order: a mount left by a failed test, then the volume (which aborts and
/// detaches leftover mounts), then the runtime, on which the mount's session runs.
pub(crate) struct Setup {
    pub(crate) mount: Option<Mount>,
    pub(crate) volume: Volume,
    pub(crate) rt: tokio::runtime::Runtime,
    _watchdog: Watchdog,
}

impl Setup {
    /// Enters a private mount namespace, starts a worker for a volume of `access_mode` and
    /// mounts it; `None` when the test is skipped (not root, no `/dev/fuse`).
    pub(crate) fn new(
        test: &'static str,
        access_mode: AccessMode,
        limit: Duration,
    ) -> Option<Self> {
        Setup::with(test, limit, Volume::start(access_mode))
    }

    /// Like [`Setup::new`], with the worker's state on a private tmpfs.
    pub(crate) fn on_tmpfs(
        test: &'static str,
        access_mode: AccessMode,
        limit: Duration,
    ) -> Option<Self> {
        Setup::with(test, limit, Volume::start_on_tmpfs(access_mode))
    }

    fn with(
        test: &'static str,
        limit: Duration,
        volume: impl Future<Output = Volume>,
    ) -> Option<Self> {
        if !test_support::private_mount_namespace_with_fuse(test) {
            return None;
        }
        let watchdog = Watchdog::arm(test, limit);
        let rt = runtime();
        let volume = rt.block_on(volume);
        let path = volume.mount_point("a");
        let mut mount = rt.block_on(Mount::new(&volume, &path, "node-a"));
        if ADOPTED.get() {
            rt.block_on(mount.hand_over());
        }
        Some(Setup {
            mount: Some(mount),
            volume,
            rt,
            _watchdog: watchdog,
        })
    }

    pub(crate) fn root(&self) -> PathBuf {
        self.mount.as_ref().unwrap().path().to_owned()
    }

    /// Lets every user walk down to the mount's root (the test's temporary directory is
    /// 0700), so that tests can act as an unprivileged user through the mount.
    pub(crate) fn let_everyone_reach_the_root(&self) {
        let mut up = self.root();
        while up != self.volume.dir.path() {
            up.pop();
            std::fs::set_permissions(&up, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }

    pub(crate) fn finish(mut self) {
        let mount = self.mount.take().unwrap();
        self.rt.block_on(mount.unmount());
    }
}

thread_local! {
    /// Whether [`Setup`] hands each mount over before the test uses it.
    static ADOPTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `test` with the mount of every [`Setup`] it makes paused and adopted by a new session
/// first ([`Mount::hand_over`]): the test then runs against an adopted connection.
pub(crate) fn on_an_adopted_mount(test: impl FnOnce()) {
    ADOPTED.set(true);
    test();
    ADOPTED.set(false);
}

/// Declares each of the named test functions (written without `#[test]`) twice: in `fresh`,
/// against the session that mounted it, and in `adopted`, against a session that adopted
/// the live connection ([`on_an_adopted_mount`]).
macro_rules! on_fresh_and_adopted_mounts {
    ($($name:ident),* $(,)?) => {
        mod fresh {
            $(#[test]
            fn $name() {
                super::$name()
            })*
        }
        mod adopted {
            $(#[test]
            fn $name() {
                $crate::support::on_an_adopted_mount(super::$name)
            })*
        }
    };
}
pub(crate) use on_fresh_and_adopted_mounts;

/// FUSE connections (fusectl minors) this process mounted and has not unmounted, with their
/// mount points: the watchdog, or a failed test's cleanup, aborts them. (Only live ones: a
/// minor is reused by the next mount on the machine, perhaps another test's.)
static CONNECTIONS: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

fn connections() -> std::sync::MutexGuard<'static, Vec<(u32, PathBuf)>> {
    CONNECTIONS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) fn register_connection(minor: u32, path: &Path) {
    connections().push((minor, path.to_owned()));
    // Aborting needs fusectl, which not every machine mounts: mount it in the test's private
    // namespace (it goes with the namespace).
    let fusectl = Path::new("/sys/fs/fuse/connections");
    if !fusectl.join(minor.to_string()).exists() {
        rustix::mount::mount(
            "fusectl",
            fusectl,
            "fusectl",
            rustix::mount::MountFlags::empty(),
            None,
        )
        .unwrap();
        assert!(fusectl.join(minor.to_string()).join("abort").exists());
    }
}

pub(crate) fn unregister_connection(minor: u32) {
    connections().retain(|(m, _)| *m != minor);
}

fn abort_connections_under(dir: &Path) {
    connections().retain(|(minor, path)| {
        if path.starts_with(dir) {
            let _ = fusefs::abort_connection(*minor);
            false
        } else {
            true
        }
    });
}

/// Ends a test that runs past its limit, so that a test that fails by hanging (a request
/// nobody answers) still ends and leaves nothing behind: its FUSE connections are aborted, so
/// every system call waiting on them returns and the test fails and cleans up as any failed
/// test does; if it still has not finished a while later, the process aborts, and its private
/// mount namespace goes with it.
pub(crate) struct Watchdog {
    done: Arc<(Mutex<bool>, Condvar)>,
}

impl Watchdog {
    /// How long a test has to fail on its own after its connections were aborted.
    const GRACE: Duration = Duration::from_secs(10);

    pub(crate) fn arm(test: &'static str, limit: Duration) -> Watchdog {
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let watched = Arc::clone(&done);
        std::thread::spawn(move || {
            let (lock, cvar) = &*watched;
            let finished = lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let (finished, timeout) = cvar
                .wait_timeout_while(finished, limit, |finished| !*finished)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !timeout.timed_out() {
                return;
            }
            drop(finished);
            eprintln!("WATCHDOG: {test} ran longer than {limit:?}; aborting its FUSE connections");
            abort_connections_under(Path::new("/"));
            let finished = lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let (_finished, timeout) = cvar
                .wait_timeout_while(finished, Self::GRACE, |finished| !*finished)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if timeout.timed_out() {
                eprintln!("WATCHDOG: {test} is still running; aborting the process");
                std::process::abort();
            }
        });
        Watchdog { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (lock, cvar) = &*self.done;
        *lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        cvar.notify_all();
    }
}

/// One entry of a directory tree as [`tree`] records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Entry {
    File { size: u64, data: Vec<u8> },
    Dir,
    Symlink { target: PathBuf },
    Other { kind: String },
}

/// One entry with its metadata, as [`tree_with_metadata`] records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Described {
    pub(crate) entry: Entry,
    pub(crate) mode: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) nlink: u64,
    /// Not for directories (their size is the filesystem's business).
    pub(crate) size: Option<u64>,
    pub(crate) mtime: (i64, i64),
    pub(crate) ctime: (i64, i64),
}

/// Every entry under `root` (relative paths), without following symbolic links.
pub(crate) fn tree(root: &Path) -> BTreeMap<PathBuf, Entry> {
    tree_with_metadata(root)
        .into_iter()
        .map(|(path, described)| (path, described.entry))
        .collect()
}

/// Every entry under `root` (relative paths) with its metadata, following no link.
pub(crate) fn tree_with_metadata(root: &Path) -> BTreeMap<PathBuf, Described> {
    let mut out = BTreeMap::new();
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        for item in std::fs::read_dir(&dir).unwrap() {
            let item = item.unwrap();
            let path = item.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let kind = meta.file_type();
            let entry = if kind.is_dir() {
                pending.push(path.clone());
                Entry::Dir
            } else if kind.is_symlink() {
                Entry::Symlink {
                    target: std::fs::read_link(&path).unwrap(),
                }
            } else if kind.is_file() {
                Entry::File {
                    size: meta.len(),
                    data: std::fs::read(&path).unwrap(),
                }
            } else {
                let kind = if kind.is_fifo() { "fifo" } else { "special" };
                Entry::Other { kind: kind.into() }
            };
            let described = Described {
                size: (!kind.is_dir()).then_some(meta.size()),
                entry,
                mode: meta.mode(),
                uid: meta.uid(),
                gid: meta.gid(),
                nlink: meta.nlink(),
                mtime: (meta.mtime(), meta.mtime_nsec()),
                ctime: (meta.ctime(), meta.ctime_nsec()),
            };
            out.insert(path.strip_prefix(root).unwrap().to_owned(), described);
        }
    }
    out
}

/// Runs `f` on a new thread whose user and group IDs are all `uid`/`gid` (and no
/// supplementary groups), as an unprivileged process would be. Only that thread changes:
/// the raw system calls set one thread's credentials, unlike the C library's wrappers.
pub(crate) fn as_user<T: Send + 'static>(
    uid: u32,
    gid: u32,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        use rustix::process::{Gid, Uid};
        let gid = Gid::from_raw(gid);
        let uid = Uid::from_raw(uid);
        rustix::thread::set_thread_groups(&[]).unwrap();
        rustix::thread::set_thread_res_gid(gid, gid, gid).unwrap();
        rustix::thread::set_thread_res_uid(uid, uid, uid).unwrap();
        f()
    })
    .join()
    .unwrap()
}

/// The user and group `nobody`.
pub(crate) const NOBODY: u32 = 65534;

/// The errno of a failed I/O call, or `None` when it succeeded.
pub(crate) fn errno_of<T>(result: std::io::Result<T>) -> Option<i32> {
    result.err().map(|e| e.raw_os_error().unwrap_or(-1))
}

/// Runs `f` and returns what it returned and how long it took.
pub(crate) fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let started = Instant::now();
    let out = f();
    (out, started.elapsed())
}
