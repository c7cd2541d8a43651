//! What every privileged test needs: a runtime, a mount point that is cleaned up even when a
//! test fails, calls through the mount that cannot hang the test, child processes that are
//! killed when the test ends.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fuse_session::MountOptions;

/// How long a call that should answer may take, generously.
pub(crate) const PROMPT: Duration = Duration::from_secs(5);
/// How long a call that should keep waiting is watched.
pub(crate) const STILL_WAITING: Duration = Duration::from_millis(300);

/// A runtime with two workers; build it after entering the private mount namespace, so its
/// threads are in it too.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A single-threaded runtime driven by a thread of its own until dropped, as fusefs's serving
/// threads are: the tasks of a session mounted through [`handle`](Self::handle) all run on
/// that one thread.
pub(crate) struct OneThread {
    runtime: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OneThread {
    pub(crate) fn start() -> OneThread {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let _ = runtime.block_on(stopped);
        });
        OneThread {
            runtime: handle,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub(crate) fn handle(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }
}

impl Drop for OneThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The mount options of every test mount.
pub(crate) fn options() -> MountOptions {
    MountOptions {
        subtype: Some("fuse-session-test".into()),
        ..MountOptions::new("fuse-session-test")
    }
}

/// A temporary directory holding the mount point `mnt`. Dropping it detaches whatever a
/// failed test left mounted below it.
pub(crate) struct MountPoint {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) path: PathBuf,
}

impl MountPoint {
    pub(crate) fn new() -> MountPoint {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mnt");
        std::fs::create_dir(&path).unwrap();
        MountPoint { dir, path }
    }

    pub(crate) fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Unmounts with umount2 (no flags), retrying `EBUSY` while a file closed a moment ago is
    /// still being released.
    pub(crate) fn unmount(&self) {
        let path = self.path.clone();
        bounded("umount2", move || {
            let start = Instant::now();
            loop {
                match rustix::mount::unmount(&path, rustix::mount::UnmountFlags::empty()) {
                    Err(rustix::io::Errno::BUSY) if start.elapsed() < PROMPT => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    other => return other,
                }
            }
        })
        .unwrap();
        assert!(!is_mounted(&self.path), "unmounted");
    }
}

impl Drop for MountPoint {
    fn drop(&mut self) {
        test_support::detach_mounts_below(self.dir.path());
    }
}

/// Whether something is mounted at `path` in this thread's namespace: (type, source).
pub(crate) fn mount_at(path: &Path) -> Option<(String, String)> {
    let table = std::fs::read_to_string("/proc/thread-self/mountinfo").unwrap();
    table.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let sep = fields.iter().position(|f| *f == "-")?;
        (Path::new(fields.get(4)?) == path)
            .then(|| (fields[sep + 1].to_owned(), fields[sep + 2].to_owned()))
    })
}

pub(crate) fn is_mounted(path: &Path) -> bool {
    mount_at(path).is_some()
}

/// Runs `call` on a thread of its own and returns its result within [`PROMPT`]; a call that
/// hangs fails the test instead of hanging it.
pub(crate) fn bounded<T: Send + 'static>(
    what: &str,
    call: impl FnOnce() -> T + Send + 'static,
) -> T {
    started(call)
        .recv_timeout(PROMPT)
        .unwrap_or_else(|_| panic!("{what} did not return within {PROMPT:?}"))
}

/// Starts `call` on a thread of its own, for a call expected to wait: its result arrives on
/// the receiver.
pub(crate) fn started<T: Send + 'static>(
    call: impl FnOnce() -> T + Send + 'static,
) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(call());
    });
    rx
}

/// The raw error number of an `io::Error`.
pub(crate) fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error()
        .unwrap_or_else(|| panic!("{e} has no errno"))
}

/// A child process of this test binary, running the hidden test `test`; killed (SIGKILL)
/// and reaped on drop.
pub(crate) struct ChildProcess(Child);

impl ChildProcess {
    /// Starts it from the calling thread, so it shares this thread's mount namespace.
    pub(crate) fn spawn(test: &str, env: &[(&str, &OsStr)]) -> ChildProcess {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command.args([
            test,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ]);
        for (key, value) in env {
            command.env(key, value);
        }
        ChildProcess(command.spawn().unwrap())
    }

    pub(crate) fn id(&self) -> u32 {
        self.0.id()
    }

    /// Waits for it to exit.
    pub(crate) fn wait(&mut self) -> std::process::ExitStatus {
        self.0.wait().unwrap()
    }

    /// SIGKILL, then reap.
    pub(crate) fn kill(&mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until `done` holds, at most [`PROMPT`].
pub(crate) fn wait_until(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < PROMPT, "{what}: not within {PROMPT:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// [`Session::adopt`](fuse_session::Session::adopt) within `rt`, with the default limits.
pub(crate) fn adopt(
    rt: &tokio::runtime::Runtime,
    fd: std::os::fd::OwnedFd,
    record: fuse_wire::InitRecord,
    handler: crate::memfs::MemFs,
) -> fuse_session::Session {
    let _entered = rt.enter();
    fuse_session::Session::adopt(fd, record, handler, &fuse_session::ServeOptions::default())
        .unwrap()
}

/// Waits for the session to see its connection end, at most [`PROMPT`].
pub(crate) fn wait_ended(rt: &tokio::runtime::Handle, session: &fuse_session::Session) {
    rt.block_on(async { tokio::time::timeout(PROMPT, session.wait()).await })
        .expect("the session sees the connection end")
        .unwrap();
}

/// A fresh mount of a [`MemFs`](crate::memfs::MemFs) whose `STUCK` file is never answered, and
/// the channel that reports each request for it entering the handler.
pub(crate) fn mount_stuck(
    rt: &tokio::runtime::Runtime,
    mnt: &MountPoint,
) -> (
    fuse_session::Session,
    tokio::sync::mpsc::UnboundedReceiver<fuse_wire::Unique>,
) {
    let (entered_tx, entered) = tokio::sync::mpsc::unbounded_channel();
    let handler = crate::memfs::MemFs::new().stuck(crate::memfs::Stuck::Forever, entered_tx);
    let session = rt
        .block_on(fuse_session::Session::mount(&mnt.path, &options(), handler))
        .unwrap();
    (session, entered)
}
