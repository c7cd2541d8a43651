//! What the owner tests share: a worker group of one with its credentials directory, a node
//! (kubelet root and owner), request builders, and a private mount namespace to run in.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_proto::v1::*;
use fusefs::testing::WorkerVolume;
use tak_os_node::context;
use tak_os_node::credentials::{CredentialSource, DirectorySource};
use tak_os_node::owner::{Owner, OwnerConfig};
use tak_os_node::status;
use tempfile::TempDir;
use tonic::Code;

/// Every duration is the default times this factor: a 1.5 s call budget, a 9 s lease.
pub(crate) const SCALE: f64 = 0.1;
pub(crate) const NAMESPACE: &str = "tak-os-system";

/// The flags of an owner of node `node` serving `socket`, with its kubelet root and
/// credentials directory, every timing a tenth of the default as the test worker's are: a 9 s
/// lease renewed every 2 s, a 1.5 s call budget. No metrics server.
pub(crate) fn owner_flags(
    socket: &Path,
    node: &str,
    kubelet: &Path,
    credentials: &Path,
) -> Vec<String> {
    [
        "--csi-endpoint",
        &format!("unix://{}", socket.display()),
        "--node-id",
        node,
        "--kubelet-root",
        &kubelet.display().to_string(),
        "--credentials-dir",
        &credentials.display().to_string(),
        "--credential-namespace",
        NAMESPACE,
        "--metrics-address",
        "",
        "--lease-seconds",
        "9",
        "--lease-renew-seconds",
        "2",
        "--call-budget-seconds",
        "1.5",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// One node's view: a kubelet root, a credentials directory and an owner.
pub(crate) struct NodeSide {
    pub(crate) kubelet: PathBuf,
    pub(crate) owner: Arc<Owner>,
}

impl NodeSide {
    pub(crate) fn new(dir: &Path, node_id: &str, credentials: &Path) -> NodeSide {
        NodeSide::with_source(dir, node_id, Arc::new(DirectorySource::new(credentials)))
    }

    /// A node whose owner reads credentials from `source`.
    pub(crate) fn with_source(
        dir: &Path,
        node_id: &str,
        source: Arc<dyn CredentialSource>,
    ) -> NodeSide {
        let kubelet = dir.join("kubelet");
        fs::create_dir_all(kubelet.join("plugins")).unwrap();
        fs::create_dir_all(kubelet.join("pods")).unwrap();
        let mut config = OwnerConfig::new(node_id);
        config.kubelet_root = kubelet.clone();
        config.credential_namespace = NAMESPACE.to_owned();
        config.budgets = lease_client::Budgets::default().scaled(SCALE);
        config.lease = lease_client::LeaseConfig::default().scaled(SCALE);
        let owner = Owner::new(config, Arc::new(mounter::LinuxMounter::new()), source).unwrap();
        owner.recover().unwrap();
        NodeSide {
            kubelet,
            owner: Arc::new(owner),
        }
    }

    /// A staging path as kubelet makes it (the directory exists, empty).
    pub(crate) fn staging(&self, name: &str) -> PathBuf {
        let path = self
            .kubelet
            .join("plugins/csi")
            .join(name)
            .join("globalmount");
        fs::create_dir_all(&path).unwrap();
        path
    }

    /// A target path whose parent exists, as kubelet leaves it.
    pub(crate) fn target(&self, pod: &str) -> PathBuf {
        let parent = self.kubelet.join("pods").join(pod).join("volumes");
        fs::create_dir_all(&parent).unwrap();
        parent.join("mount")
    }
}

/// A worker group of one serving `volume_id`, and the credentials directory the owners read.
pub(crate) struct Cluster {
    pub(crate) dir: TempDir,
    pub(crate) worker: WorkerVolume,
    pub(crate) credentials: PathBuf,
}

impl Cluster {
    pub(crate) async fn start(volume_id: &str, mode: worker::AccessMode) -> Cluster {
        Cluster::start_in(tempfile::tempdir().unwrap(), volume_id, mode).await
    }

    /// The same with everything (the worker's state included) on a tmpfs private to the test's
    /// mount namespace, for tests that make hundreds of volumes (each costs the worker fsyncs).
    pub(crate) async fn start_on_tmpfs(volume_id: &str, mode: worker::AccessMode) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        rustix::mount::mount(
            "tmpfs",
            dir.path(),
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            c"mode=0755",
        )
        .unwrap();
        Cluster::start_in(dir, volume_id, mode).await
    }

    async fn start_in(dir: TempDir, volume_id: &str, mode: worker::AccessMode) -> Cluster {
        let worker = WorkerVolume::start(
            dir.path(),
            volume_id,
            mode,
            worker::Timings::default().scaled(SCALE),
        )
        .await
        .unwrap();
        let credentials = dir.path().join("credentials");
        let cluster = Cluster {
            dir,
            worker,
            credentials,
        };
        cluster.write_credentials(volume_id);
        cluster
    }

    /// Another volume on the same worker, with its credentials.
    pub(crate) fn add_volume(&self, volume_id: &str, mode: worker::AccessMode) {
        self.worker
            .server()
            .create_volume(&worker::testing::volume(volume_id, mode))
            .unwrap();
        self.write_credentials(volume_id);
    }

    fn write_credentials(&self, volume_id: &str) {
        let volume = self.credentials.join(volume_id);
        fs::create_dir_all(&volume).unwrap();
        let pki = self.worker.pki();
        for (key, value) in [
            ("token", fusefs::testing::TOKEN),
            ("ca.crt", pki.ca_pem.as_str()),
            ("tls.crt", pki.client_pem.as_str()),
            ("tls.key", pki.client_key.as_str()),
        ] {
            fs::write(volume.join(key), value).unwrap();
        }
    }

    pub(crate) fn node(&self, node_id: &str) -> NodeSide {
        NodeSide::new(&self.dir.path().join(node_id), node_id, &self.credentials)
    }

    /// A second owner with the same node ID, with a kubelet root of its own: as a second
    /// owner process on the same node would be if it were ever started by mistake.
    pub(crate) fn node_twin(&self, node_id: &str) -> NodeSide {
        NodeSide::new(&self.dir.path().join("twin"), node_id, &self.credentials)
    }

    pub(crate) fn context(&self, mode: &str) -> HashMap<String, String> {
        HashMap::from([
            (context::GENERATION.to_owned(), "1".to_owned()),
            (
                context::ENDPOINTS.to_owned(),
                format!("https://{}", self.worker.endpoint()),
            ),
            (context::ACCESS_MODE.to_owned(), mode.to_owned()),
            (
                "csi.storage.k8s.io/pod.name".to_owned(),
                "ignored".to_owned(),
            ),
        ])
    }
}

pub(crate) fn capability(mode: Mode) -> Option<VolumeCapability> {
    Some(VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    })
}

pub(crate) fn stage_request(
    volume_id: &str,
    staging: &Path,
    mode: Mode,
    context: HashMap<String, String>,
) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: volume_id.to_owned(),
        staging_target_path: staging.display().to_string(),
        volume_capability: capability(mode),
        volume_context: context,
        ..Default::default()
    }
}

pub(crate) fn publish_request(
    stage: &NodeStageVolumeRequest,
    target: &Path,
    readonly: bool,
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: stage.volume_id.clone(),
        staging_target_path: stage.staging_target_path.clone(),
        target_path: target.display().to_string(),
        volume_capability: stage.volume_capability.clone(),
        readonly,
        volume_context: stage.volume_context.clone(),
        ..Default::default()
    }
}

pub(crate) fn unstage_request(stage: &NodeStageVolumeRequest) -> NodeUnstageVolumeRequest {
    NodeUnstageVolumeRequest {
        volume_id: stage.volume_id.clone(),
        staging_target_path: stage.staging_target_path.clone(),
    }
}

pub(crate) fn unpublish_request(volume_id: &str, target: &Path) -> NodeUnpublishVolumeRequest {
    NodeUnpublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        target_path: target.display().to_string(),
    }
}

pub(crate) fn code_of<T>(result: Result<T, tak_os_node::error::Error>) -> Code {
    match result {
        Ok(_) => Code::Ok,
        Err(error) => {
            eprintln!("refused: {}", error_text(&error));
            status::code(&error)
        }
    }
}

pub(crate) fn error_text(error: &tak_os_node::error::Error) -> String {
    test_support::error_chain(error)
}

/// The mount table's lines that mention `path`.
pub(crate) fn mounts_under(path: &Path) -> Vec<String> {
    let bytes = mountinfo::read_self().unwrap();
    let table = mountinfo::MountTable::parse(&bytes).unwrap();
    table
        .iter()
        .filter(|m| m.mount_point().starts_with(path))
        .map(|m| m.mount_point().display().to_string())
        .collect()
}

/// Asserts that the owner `process` (a PID, or `self`) serves the mount under `path` on its
/// serving threads ([`tak_os_node::owner::SERVING_THREADS`]): a thousand `lstat`s of
/// `path`, a few FUSE requests and worker calls each, cost those threads hundreds of
/// milliseconds of CPU time, where idle threads gain none.
pub(crate) fn assert_served_on_serving_threads(process: &str, path: &Path) {
    let before = serving_threads_cpu_ticks(process);
    for _ in 0..1000 {
        fs::symlink_metadata(path).unwrap();
    }
    let ticks = serving_threads_cpu_ticks(process) - before;
    assert!(
        ticks >= 5,
        "process {process}'s serving threads took {ticks} ticks of CPU time for 1000 lstats"
    );
}

/// The CPU time so far, in clock ticks, of `process`'s serving threads.
fn serving_threads_cpu_ticks(process: &str) -> u64 {
    let mut ticks = 0;
    for task in fs::read_dir(format!("/proc/{process}/task"))
        .unwrap()
        .flatten()
    {
        let comm = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let serving = comm
            .strip_prefix(tak_os_node::owner::SERVING_THREADS)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|index| index.trim_end().parse::<usize>().is_ok());
        if !serving {
            continue;
        }
        // After the command's closing parenthesis: field 3 (state) on; utime and stime are
        // fields 14 and 15.
        let stat = fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(") ")
            .map_or("", |(_, rest)| rest)
            .split_whitespace()
            .collect();
        for index in [11, 12] {
            ticks += fields
                .get(index)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    ticks
}

/// Runs `body` on a multi-threaded runtime inside a private mount namespace, or skips.
pub(crate) fn privileged(test: &str, body: impl AsyncFnOnce()) {
    if !test_support::private_mount_namespace_with_fuse(test) {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(120), body())
            .await
            .expect("the test finished within two minutes");
    });
}

/// `future`'s output, or a failure naming `what` if it takes longer than `bound`: a step that
/// hangs says which one it was instead of running into the test's own two minutes.
pub(crate) async fn within<T>(bound: Duration, what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(bound, future)
        .await
        .unwrap_or_else(|_| panic!("not within {bound:?}: {what}"))
}

/// Sends this process's logs (the in-process owner's) to `file` from now on, so that they
/// stay out of the test's output unless [`ShowOnFailure`] shows them. Once per process: a
/// later call changes nothing.
pub(crate) fn log_to(file: &Path) {
    let file = fs::File::create(file).unwrap();
    let filter = tracing_subscriber::EnvFilter::new("info");
    let logs = observe::subscriber(
        observe::LogFormat::Text,
        filter,
        false,
        std::sync::Mutex::new(file),
    );
    let _ = tracing::subscriber::set_global_default(logs);
}

/// A log file that is printed to stderr when it is dropped during a failure (a panic), before
/// the temporary directory it is in goes away.
pub(crate) struct ShowOnFailure(pub(crate) PathBuf);

impl Drop for ShowOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = fs::read_to_string(&self.0).unwrap_or_else(|e| format!("unreadable: {e}"));
            eprintln!("----- {} -----\n{log}----- end -----", self.0.display());
        }
    }
}

/// A server process that is this test binary re-executed to run one `#[ignore]`d helper test
/// (`helper`, which reads its instructions from the variable `env`), serving CSI on `socket`.
/// Killed when dropped, so a failed assertion never leaves one running; the child inherits the
/// calling thread's private mount namespace.
pub(crate) struct ServerProcess {
    pub(crate) child: std::process::Child,
    pub(crate) socket: PathBuf,
}

impl ServerProcess {
    pub(crate) fn spawn(
        helper: &str,
        env: &str,
        spec: &[String],
        socket: PathBuf,
        log: &Path,
    ) -> ServerProcess {
        let log = fs::File::options()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                helper,
                "--ignored",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(env, spec.join("\n"))
            .env("TAK_OS_LOG_FORMAT", "text")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        ServerProcess { child, socket }
    }

    /// A channel to the process's socket, once it answers (at most 20 s).
    pub(crate) async fn channel(&self) -> tonic::transport::Channel {
        let start = std::time::Instant::now();
        loop {
            if self.socket.exists() {
                let attempt = csi_proto::connect_unix(&self.socket);
                if let Ok(Ok(channel)) = tokio::time::timeout(Duration::from_secs(5), attempt).await
                {
                    return channel;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the process at {:?} never answered",
                self.socket
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills the process and waits for it.
    pub(crate) fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Sends SIGTERM and waits for the process to exit (at most 30 s): how Kubernetes stops a
    /// Pod. Returns how long it took.
    pub(crate) fn terminate(mut self) -> Duration {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        let start = std::time::Instant::now();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "the process exited with {status}");
                return start.elapsed();
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the process ignored SIGTERM for 30 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until the process has died on its own (a hook killed it).
    pub(crate) fn died(mut self) {
        let status = self.child.wait().unwrap();
        assert!(!status.success(), "the process was killed: {status}");
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The bytes of one chunk of a [`VerifiedStream`].
pub(crate) const CHUNK: usize = 4096;

/// Chunk `n` of a [`VerifiedStream`]: bytes that differ from chunk to chunk.
pub(crate) fn chunk(n: u64) -> Vec<u8> {
    let mut data = vec![0u8; CHUNK];
    for (i, byte) in data.iter_mut().enumerate() {
        *byte = (n as usize * 31 + i) as u8;
    }
    data
}

/// A writer of a verified stream through a mount, and a reader that checks what is there so
/// far, each on a thread of its own with one descriptor open throughout. The first I/O error
/// of either stops it and is kept.
pub(crate) struct VerifiedStream {
    file: PathBuf,
    stop: Arc<std::sync::atomic::AtomicBool>,
    written: Arc<std::sync::atomic::AtomicU64>,
    /// The longest single write, in microseconds.
    longest_write_us: Arc<std::sync::atomic::AtomicU64>,
    failure: Arc<std::sync::Mutex<Option<String>>>,
    writer: std::thread::JoinHandle<Result<(), String>>,
    reader: std::thread::JoinHandle<Result<u64, String>>,
}

impl VerifiedStream {
    /// Starts both threads on `file`, which is created empty.
    pub(crate) fn start(file: &Path) -> VerifiedStream {
        use std::os::unix::fs::FileExt as _;
        use std::sync::atomic::Ordering;
        fs::write(file, b"").unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let longest_write_us = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let failure = Arc::new(std::sync::Mutex::new(None::<String>));
        let writer = std::thread::spawn({
            let (stop, written, longest) =
                (stop.clone(), written.clone(), longest_write_us.clone());
            let (file, failure) = (file.to_owned(), failure.clone());
            move || -> Result<(), String> {
                let run = || -> Result<(), String> {
                    let out = fs::OpenOptions::new()
                        .write(true)
                        .open(&file)
                        .map_err(|e| e.to_string())?;
                    let mut n = 0u64;
                    while !stop.load(Ordering::SeqCst) {
                        let started = std::time::Instant::now();
                        out.write_all_at(&chunk(n), n * CHUNK as u64)
                            .map_err(|e| format!("write {n}: {e}"))?;
                        let took = started.elapsed().as_micros() as u64;
                        longest.fetch_max(took, Ordering::SeqCst);
                        n += 1;
                        written.store(n, Ordering::SeqCst);
                    }
                    Ok(())
                };
                run().inspect_err(|e| *failure.lock().unwrap() = Some(e.clone()))
            }
        });
        let reader = std::thread::spawn({
            let (stop, written) = (stop.clone(), written.clone());
            let (file, failure) = (file.to_owned(), failure.clone());
            move || -> Result<u64, String> {
                let run = || -> Result<u64, String> {
                    let input = fs::File::open(&file).map_err(|e| e.to_string())?;
                    let mut checked = 0u64;
                    let mut buf = vec![0u8; CHUNK];
                    while !stop.load(Ordering::SeqCst) {
                        if checked >= written.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(1));
                            continue;
                        }
                        input
                            .read_exact_at(&mut buf, checked * CHUNK as u64)
                            .map_err(|e| format!("read {checked}: {e}"))?;
                        if buf != chunk(checked) {
                            return Err(format!("chunk {checked} read back wrong"));
                        }
                        checked += 1;
                    }
                    Ok(checked)
                };
                run().inspect_err(|e| *failure.lock().unwrap() = Some(e.clone()))
            }
        });
        VerifiedStream {
            file: file.to_owned(),
            stop,
            written,
            longest_write_us,
            failure,
            writer,
            reader,
        }
    }

    /// Waits until 50 more chunks were written (at most 20 s), failing at once when either
    /// thread stopped.
    pub(crate) async fn progress(&self) {
        use std::sync::atomic::Ordering;
        let from = self.written.load(Ordering::SeqCst);
        let start = std::time::Instant::now();
        while self.written.load(Ordering::SeqCst) < from + 50 {
            assert!(
                !self.writer.is_finished() && !self.reader.is_finished(),
                "the I/O stopped: {:?}",
                self.failure.lock().unwrap()
            );
            assert!(start.elapsed() < Duration::from_secs(20), "no I/O progress");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The longest single write so far, and starts measuring afresh.
    pub(crate) fn take_longest_write(&self) -> Duration {
        let us = self
            .longest_write_us
            .swap(0, std::sync::atomic::Ordering::SeqCst);
        Duration::from_micros(us)
    }

    /// Stops both threads, asserts that neither failed, and checks the whole file: every
    /// chunk written is there, once, in order. Returns the chunks written and those the
    /// reader checked on the way.
    pub(crate) fn finish(self) -> (u64, u64) {
        use std::sync::atomic::Ordering;
        self.stop.store(true, Ordering::SeqCst);
        self.writer.join().unwrap().unwrap();
        let checked = self.reader.join().unwrap().unwrap();
        let total = self.written.load(Ordering::SeqCst);
        assert!(
            checked > 0 && total >= checked,
            "{checked} of {total} chunks checked"
        );
        let all = fs::read(&self.file).unwrap();
        assert_eq!(
            all.len() as u64,
            total * CHUNK as u64,
            "every byte is there"
        );
        for n in 0..total {
            let at = n as usize * CHUNK;
            assert!(all[at..at + CHUNK] == chunk(n)[..], "chunk {n} is correct");
        }
        (total, checked)
    }
}

/// The epoch in the RWO session record beside `staging`.
pub(crate) fn epoch_of(staging: &Path) -> String {
    let record = staging.with_file_name(format!(
        "{}.rwo-session",
        staging.file_name().unwrap().to_string_lossy()
    ));
    let json: serde_json::Value = serde_json::from_slice(&fs::read(record).unwrap()).unwrap();
    json["epoch"].as_str().unwrap().to_owned()
}

/// The kernel's ID of the mount at `path`.
pub(crate) fn mount_id(path: &Path) -> u64 {
    let bytes = mountinfo::read_self().unwrap();
    let table = mountinfo::MountTable::parse(&bytes).unwrap();
    table.by_mount_point(path).unwrap().mount_id()
}
