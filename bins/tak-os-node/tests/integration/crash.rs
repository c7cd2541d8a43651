//! SIGKILL of an owner process at each step of an RWO stage, then a new owner process and a
//! NodeStageVolume retry (as kubelet retries after a timeout): they converge to one healthy
//! stage or to a clear, non-final refusal that NodeUnstageVolume then clears; never two
//! epochs, never a leaked mount.
//!
//! The owner processes are this test binary, re-executed (`child_owner_process`), serving CSI
//! on a Unix socket; the test talks to them as kubelet does, over gRPC.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::volume_capability::access_mode::Mode;
use tak_os_node::config::Cli;
use tak_os_node::owner::{Hook, StagePoint};
use tonic::Code;

use crate::support::{
    Cluster, ServerProcess, mounts_under, owner_flags, privileged, publish_request, stage_request,
    unpublish_request, unstage_request,
};

const CHILD_ENV: &str = "TAK_OS_NODE_TEST_OWNER";

/// The stage point of an owner process that dies nowhere but, taking over a crashed owner's
/// stage, waits 3 s before it has the kernel resend.
pub(crate) const HOLD_TAKEOVER: &str = "hold-takeover";

/// The file in an owner's directory where every owner process appends the worker calls made
/// for kernel requests ([`CallLog`]).
pub(crate) const CALL_LOG: &str = "calls.log";

/// Appends every call made for a kernel request to a file shared by the owner processes of a
/// test, one line per call: the nonce, the kernel request, the call index, the request ID (hex),
/// the operation, whether it is a mutation, and `-` as it is sent, then whether the worker
/// answered it with a result (`1` or `0`).
#[derive(Debug)]
pub(crate) struct CallLog(fs::File);

impl CallLog {
    fn open(path: &Path) -> CallLog {
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        CallLog(file)
    }

    /// The calls logged in `dir` by every owner process.
    pub(crate) fn read(dir: &Path) -> Vec<LoggedCall> {
        fs::read_to_string(dir.join(CALL_LOG))
            .unwrap_or_default()
            .lines()
            .map(|line| {
                let f: Vec<&str> = line.split(' ').collect();
                let [nonce, unique, index, id, op, mutation, succeeded] = f[..] else {
                    panic!("a malformed call log line: {line:?}");
                };
                LoggedCall {
                    call: (
                        nonce.to_owned(),
                        unique.parse().unwrap(),
                        index.parse().unwrap(),
                    ),
                    request_id: id.to_owned(),
                    op: op.to_owned(),
                    mutation: mutation == "1",
                    succeeded: match succeeded {
                        "-" => None,
                        outcome => Some(outcome == "1"),
                    },
                }
            })
            .collect()
    }
}

/// One line of a [`CallLog`].
#[derive(Debug, Clone)]
pub(crate) struct LoggedCall {
    /// The nonce (hex), the kernel request and the call's index.
    pub(crate) call: (String, u64, u32),
    /// The request ID, hex.
    pub(crate) request_id: String,
    pub(crate) op: String,
    pub(crate) mutation: bool,
    /// `None` for the line written as the call was sent.
    pub(crate) succeeded: Option<bool>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A worker request ID as the call log writes it.
pub(crate) fn request_id_hex(id: &[u8; 16]) -> String {
    hex(id)
}

impl fusefs::CallObserver for CallLog {
    fn observed(&self, call: &fusefs::ObservedCall) {
        use std::io::Write as _;
        let line = format!(
            "{} {} {} {} {} {} {}\n",
            hex(&call.nonce.0),
            call.unique,
            call.index,
            hex(&call.request_id.0),
            call.op,
            u8::from(call.mutation),
            match call.succeeded {
                None => "-",
                Some(true) => "1",
                Some(false) => "0",
            },
        );
        // One write of a short line to a file opened for appending: lines of several
        // processes never interleave.
        let _ = (&self.0).write_all(line.as_bytes());
    }
}

/// Not a test on its own: the crash tests re-execute this binary to run an owner in a child
/// process. `TAK_OS_NODE_TEST_OWNER` holds, one per line: the socket, the kubelet root, the
/// credentials directory, the node ID, the stage point to die at (or `none`), the keeper's
/// socket (or nothing: no keeper), and a gate file to wait for before starting (or nothing).
#[test]
#[ignore = "a helper process of the crash tests"]
fn child_owner_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    // Logs go to the process's stderr, which the test keeps in a file.
    observe::init_logging(observe::LogFormat::Text);
    // Split, not lines(): the last line may be empty (no keeper).
    let lines: Vec<&str> = spec.split('\n').collect();
    let [socket, kubelet, credentials, node, point, keeper, gate] = lines[..] else {
        panic!("malformed {CHILD_ENV}: {spec:?}");
    };
    while !gate.is_empty() && !Path::new(gate).exists() {
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut args = vec!["tak-os-node".to_owned()];
    args.extend(owner_flags(
        Path::new(socket),
        node,
        Path::new(kubelet),
        Path::new(credentials),
    ));
    if !keeper.is_empty() {
        args.extend(["--keeper-socket".to_owned(), keeper.to_owned()]);
    }
    let cli = <Cli as clap::Parser>::try_parse_from(args).unwrap();
    let mut config = cli.config().unwrap();
    let die_at = match point {
        "record" => Some(StagePoint::RecordWritten),
        "claimed" => Some(StagePoint::Claimed),
        "mounted" => Some(StagePoint::Mounted),
        "completed" => Some(StagePoint::Completed),
        _ => None,
    };
    // Every call made for a kernel request, beside the socket, for the exactly-once proof.
    let dir = Path::new(socket).parent().unwrap();
    config.owner.calls = Some(std::sync::Arc::new(CallLog::open(&dir.join(CALL_LOG))));
    let hold = point == HOLD_TAKEOVER;
    config.owner.hook = Hook::new(move |reached| {
        if hold && reached == StagePoint::TakingOver {
            // Past the deadline of the crash it takes over (2 s with the tests' timings).
            std::thread::sleep(Duration::from_secs(3));
        }
        if Some(reached) == die_at {
            // As abrupt as a SIGKILL from outside: no unwinding, no cleanup.
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::KILL,
            );
        }
    });
    // The binary's own runtime.
    tak_os_node::serve(config).unwrap();
}

/// An owner process: this binary re-executed as `child_owner_process`, dying at `die_at`.
fn spawn_owner(dir: &Path, cluster: &Cluster, node: &str, die_at: &str) -> ServerProcess {
    spawn_owner_with(dir, cluster, node, die_at, None, None)
}

/// An owner process that deposits its stages with the keeper at `keeper`, and that starts
/// only once the file `gate` exists.
///
/// A gate lets a test start owner processes before it opens files on a FUSE mount: a process
/// forked while the test holds such files closes its copies at `exec`, and each close sends a
/// FLUSH that waits for the connection's server, which during a hand-off is the very owner
/// being started.
pub(crate) fn spawn_owner_with(
    dir: &Path,
    cluster: &Cluster,
    node: &str,
    die_at: &str,
    keeper: Option<&Path>,
    gate: Option<&Path>,
) -> ServerProcess {
    let socket = dir.join(format!("{node}-{die_at}.sock"));
    let kubelet = dir.join(node).join("kubelet");
    fs::create_dir_all(kubelet.join("plugins")).unwrap();
    let spec = [
        socket.display().to_string(),
        kubelet.display().to_string(),
        cluster.credentials.display().to_string(),
        node.to_owned(),
        die_at.to_owned(),
        keeper.map(|k| k.display().to_string()).unwrap_or_default(),
        gate.map(|g| g.display().to_string()).unwrap_or_default(),
    ];
    ServerProcess::spawn(
        "crash::child_owner_process",
        CHILD_ENV,
        &spec,
        socket,
        &dir.join("owners.log"),
    )
}

/// A Node client of an owner process.
pub(crate) async fn client_of(owner: &ServerProcess) -> NodeClient<tonic::transport::Channel> {
    NodeClient::new(owner.channel().await)
}

/// Kills an owner process right after `point` of an RWO stage, then retries with a new one.
fn crash_at(test: &'static str, point: &'static str) {
    privileged(test, async || {
        let cluster = Cluster::start("vol-crash", worker::AccessMode::Rwo).await;
        let dir = cluster.dir.path().to_owned();
        let node_a = cluster.node("node-a");
        let staging = node_a.staging("vol-crash");
        let stage = stage_request(
            "vol-crash",
            &staging,
            Mode::SingleNodeWriter,
            cluster.context("rwo"),
        );

        let first = spawn_owner(&dir, &cluster, "node-a", point);
        let mut client = client_of(&first).await;
        let refused = client.node_stage_volume(stage.clone()).await;
        assert!(refused.is_err(), "the owner died in the middle of the call");
        first.died();

        let second = spawn_owner(&dir, &cluster, "node-a", "none");
        let mut client = client_of(&second).await;
        match client.node_stage_volume(stage.clone()).await {
            Ok(_) => {}
            Err(status) if point == "completed" => {
                // The stage completed in a process that is gone: it stays until unstaged.
                assert_eq!(status.code(), Code::Aborted, "{status:?}");
                assert!(status.message().contains("NodeUnstageVolume"), "{status:?}");
                client
                    .node_unstage_volume(unstage_request(&stage))
                    .await
                    .unwrap();
                assert!(
                    mounts_under(&node_a.kubelet).is_empty(),
                    "the dead stage is gone"
                );
                client.node_stage_volume(stage.clone()).await.unwrap();
            }
            Err(status) => panic!("the retry after a crash at {point}: {status:?}"),
        }
        // One healthy stage: exactly one mount at the staging path, serving.
        assert_eq!(
            mounts_under(&staging),
            [staging.display().to_string()],
            "one stage"
        );
        let target = node_a.target("pod-1");
        client
            .node_publish_volume(publish_request(&stage, &target, false))
            .await
            .unwrap();
        fs::write(target.join("after-the-crash"), point).unwrap();
        assert_eq!(
            fs::read(target.join("after-the-crash")).unwrap(),
            point.as_bytes()
        );
        client
            .node_unpublish_volume(unpublish_request("vol-crash", &target))
            .await
            .unwrap();
        client
            .node_unstage_volume(unstage_request(&stage))
            .await
            .unwrap();
        assert!(mounts_under(&dir).is_empty(), "no mount leaked");

        // Never two epochs: the stage's release freed the one lease, so another node stages
        // at once.
        let node_b = cluster.node("node-b");
        let stage_b = stage_request(
            "vol-crash",
            &node_b.staging("vol-crash"),
            Mode::SingleNodeWriter,
            cluster.context("rwo"),
        );
        node_b.owner.stage(&stage_b).await.unwrap();
        node_b
            .owner
            .unstage(&unstage_request(&stage_b))
            .await
            .unwrap();
        assert!(mounts_under(&dir).is_empty());
        drop(second);
    });
}

#[test]
fn a_crash_after_the_record_then_a_retry_stages_once() {
    crash_at(
        "a_crash_after_the_record_then_a_retry_stages_once",
        "record",
    );
}

#[test]
fn a_crash_after_the_claim_then_a_retry_stages_once_with_the_same_epoch() {
    crash_at(
        "a_crash_after_the_claim_then_a_retry_stages_once_with_the_same_epoch",
        "claimed",
    );
}

#[test]
fn a_crash_after_the_mount_then_a_retry_replaces_the_dead_mount() {
    crash_at(
        "a_crash_after_the_mount_then_a_retry_replaces_the_dead_mount",
        "mounted",
    );
}

#[test]
fn a_crash_after_completion_is_aborted_until_unstaged() {
    crash_at(
        "a_crash_after_completion_is_aborted_until_unstaged",
        "completed",
    );
}

/// An owner process paused (SIGSTOP) past its lease: another node stages the volume once the
/// lease has run out; resumed, the paused owner's mount fails every operation with EIO (its
/// epoch is fenced), and its unpublish and unstage still complete.
#[test]
fn a_paused_owner_is_fenced_and_still_unpublishes_and_unstages() {
    privileged(
        "a_paused_owner_is_fenced_and_still_unpublishes_and_unstages",
        async || {
            let cluster = Cluster::start("vol-fence", worker::AccessMode::Rwo).await;
            let dir = cluster.dir.path().to_owned();
            let node_a = cluster.node("node-a");
            let stage_a = stage_request(
                "vol-fence",
                &node_a.staging("vol-fence"),
                Mode::SingleNodeWriter,
                cluster.context("rwo"),
            );
            let owner_a = spawn_owner(&dir, &cluster, "node-a", "none");
            let mut client = client_of(&owner_a).await;
            client.node_stage_volume(stage_a.clone()).await.unwrap();
            let target = node_a.target("pod-a");
            client
                .node_publish_volume(publish_request(&stage_a, &target, false))
                .await
                .unwrap();
            fs::write(target.join("file"), b"before").unwrap();

            let pid =
                rustix::process::Pid::from_raw(i32::try_from(owner_a.child.id()).unwrap()).unwrap();
            rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
            let node_b = cluster.node("node-b");
            let stage_b = stage_request(
                "vol-fence",
                &node_b.staging("vol-fence"),
                Mode::SingleNodeWriter,
                cluster.context("rwo"),
            );
            let start = Instant::now();
            loop {
                match node_b.owner.stage(&stage_b).await {
                    Ok(_) => break,
                    Err(error)
                        if tak_os_node::status::code(&error) == Code::FailedPrecondition
                            && start.elapsed() < Duration::from_secs(30) =>
                    {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(error) => panic!("node-b never staged: {error}"),
                }
            }
            let waited = start.elapsed();
            rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
            assert!(
                waited >= Duration::from_secs(5),
                "node-b staged only once the 9 s lease had run out ({waited:?})"
            );

            // node-a's mount is fenced: its epoch is stale at the workers.
            let errno = |result: std::io::Result<()>| result.unwrap_err().raw_os_error();
            assert_eq!(
                errno(fs::read(target.join("file")).map(drop)),
                Some(libc::EIO)
            );
            assert_eq!(
                errno(fs::write(target.join("other"), b"x")),
                Some(libc::EIO)
            );
            assert_eq!(
                errno(fs::metadata(target.join("file")).map(drop)),
                Some(libc::EIO)
            );

            client
                .node_unpublish_volume(unpublish_request("vol-fence", &target))
                .await
                .unwrap();
            client
                .node_unstage_volume(unstage_request(&stage_a))
                .await
                .unwrap();
            assert!(mounts_under(&node_a.kubelet).is_empty());
            node_b
                .owner
                .unstage(&unstage_request(&stage_b))
                .await
                .unwrap();
            assert!(mounts_under(&dir).is_empty());
            drop(owner_a);
        },
    );
}

/// The owner process killed with SIGKILL while its volume is published: the target reports
/// the dead connection (never a hang), a new owner process unpublishes and unstages within 5 s
/// each, without a call that could touch the dead mount, and releases the lease with the epoch
/// from the session record, so another node stages at once instead of waiting for expiry.
#[test]
fn a_killed_owner_leaves_a_dead_mount_that_a_new_owner_tears_down_at_once() {
    privileged(
        "a_killed_owner_leaves_a_dead_mount_that_a_new_owner_tears_down_at_once",
        async || {
            let cluster = Cluster::start("vol-dead", worker::AccessMode::Rwo).await;
            let dir = cluster.dir.path().to_owned();
            let node_a = cluster.node("node-a");
            let stage = stage_request(
                "vol-dead",
                &node_a.staging("vol-dead"),
                Mode::SingleNodeWriter,
                cluster.context("rwo"),
            );
            let first = spawn_owner(&dir, &cluster, "node-a", "none");
            let mut client = client_of(&first).await;
            client.node_stage_volume(stage.clone()).await.unwrap();
            let target = node_a.target("pod");
            client
                .node_publish_volume(publish_request(&stage, &target, false))
                .await
                .unwrap();
            fs::write(target.join("file"), b"alive").unwrap();
            drop(first);

            // The dead connection answers at once, from a thread so a hang fails the test.
            let probe = {
                let file = target.join("file");
                std::thread::spawn(move || fs::read(file).unwrap_err().raw_os_error())
            };
            let start = Instant::now();
            while !probe.is_finished() {
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "a read of the dead mount hangs"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let errno = probe.join().unwrap();
            assert!(
                errno == Some(libc::ENOTCONN) || errno == Some(libc::ECONNABORTED),
                "{errno:?}"
            );

            let second = spawn_owner(&dir, &cluster, "node-a", "none");
            let mut client = client_of(&second).await;
            let start = Instant::now();
            client
                .node_unpublish_volume(unpublish_request("vol-dead", &target))
                .await
                .unwrap();
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "unpublish {:?}",
                start.elapsed()
            );
            let start = Instant::now();
            client
                .node_unstage_volume(unstage_request(&stage))
                .await
                .unwrap();
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "unstage {:?}",
                start.elapsed()
            );
            assert!(mounts_under(&dir).is_empty(), "no mount left");

            // Released with the record's epoch: another node stages at once.
            let node_b = cluster.node("node-b");
            let stage_b = stage_request(
                "vol-dead",
                &node_b.staging("vol-dead"),
                Mode::SingleNodeWriter,
                cluster.context("rwo"),
            );
            node_b.owner.stage(&stage_b).await.unwrap();
            node_b
                .owner
                .unstage(&unstage_request(&stage_b))
                .await
                .unwrap();
            drop(second);
        },
    );
}

/// The owner process as the binary runs it (its open-file limit raised) holds 600 stages, more
/// than tokio's default 512 blocking threads (fuse3, before the project's own session, read
/// each connection on one), and the last one staged and the first still serve.
#[test]
fn six_hundred_stages_in_one_owner_process_all_serve() {
    privileged(
        "six_hundred_stages_in_one_owner_process_all_serve",
        async || {
            const STAGES: usize = 600;
            let cluster = Cluster::start_on_tmpfs("vol-s0", worker::AccessMode::Rwx).await;
            let dir = cluster.dir.path().to_owned();
            let node = cluster.node("node-a");
            let owner = spawn_owner(&dir, &cluster, "node-a", "none");
            let mut client = client_of(&owner).await;
            let mut stages = Vec::with_capacity(STAGES);
            for i in 0..STAGES {
                let id = format!("vol-s{i}");
                if i > 0 {
                    cluster.add_volume(&id, worker::AccessMode::Rwx);
                }
                let req = stage_request(
                    &id,
                    &node.staging(&id),
                    Mode::MultiNodeMultiWriter,
                    cluster.context("rwx"),
                );
                client.node_stage_volume(req.clone()).await.unwrap();
                stages.push(req);
            }
            for (n, req) in [(0, &stages[0]), (STAGES, &stages[STAGES - 1])] {
                let target = node.target(&format!("pod-{n}"));
                client
                    .node_publish_volume(publish_request(req, &target, false))
                    .await
                    .unwrap();
                fs::write(target.join("f"), format!("stage {n}")).unwrap();
                assert_eq!(
                    fs::read(target.join("f")).unwrap(),
                    format!("stage {n}").as_bytes()
                );
                client
                    .node_unpublish_volume(unpublish_request(&req.volume_id, &target))
                    .await
                    .unwrap();
            }
            for req in &stages {
                client
                    .node_unstage_volume(unstage_request(req))
                    .await
                    .unwrap();
            }
            assert!(mounts_under(&node.kubelet).is_empty(), "no mount left");
            drop(owner);
        },
    );
}
