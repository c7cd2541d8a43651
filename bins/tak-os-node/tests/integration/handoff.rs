//! Mounts that survive the mount owner: a keeper process holds a copy of every stage's FUSE
//! connection; an owner told to stop (SIGTERM) hands its stages over and the next owner
//! process takes them back. Five upgrades under verified I/O lose nothing; five owner kills
//! under verified I/O are ridden through by successors (the kernel resends what the dead owner
//! had read); an owner killed with nobody to take over ends its mounts cleanly at deadline D,
//! at once with the no-resend switch (no caller waits forever), as do owner and keeper killed
//! together; a restarted keeper is given every stage again; every node and
//! handle the kernel is given reaches the keeper's tables before the reply; and what the
//! keeper refuses changes nothing.
//!
//! Owners and keepers are this test binary re-executed (`crash::child_owner_process`,
//! `child_keeper_process`); the test talks to the owners as kubelet's frontend does, over gRPC.

use std::fs;
use std::os::fd::AsFd as _;
use std::os::unix::fs::{FileExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::{NodeGetVolumeStatsRequest, NodeStageVolumeRequest};
use tak_os_node::config::Cli;
use tak_os_node::keeper::protocol::{self, Answer, Deposit, Request};

use crate::crash::{CallLog, HOLD_TAKEOVER, client_of, request_id_hex, spawn_owner_with};
use crate::support::{
    Cluster, NodeSide, ServerProcess, VerifiedStream, assert_served_on_serving_threads, epoch_of,
    mount_id, mounts_under, privileged, publish_request, stage_request, unpublish_request,
    unstage_request,
};

const CHILD_ENV: &str = "TAK_OS_NODE_TEST_KEEPER";

/// Not a test on its own: the hand-off tests re-execute this binary to run a keeper in a child
/// process. `TAK_OS_NODE_TEST_KEEPER` holds the keeper's socket, and a second line of extra
/// arguments (`--no-resend`).
#[test]
#[ignore = "a helper process of the hand-off tests"]
fn child_keeper_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut lines = spec.lines();
    let socket = lines.next().unwrap().to_owned();
    observe::init_logging(observe::LogFormat::Text);
    let mut args = vec![
        "tak-os-node".to_owned(),
        "--keeper".to_owned(),
        "--keeper-socket".to_owned(),
        socket,
        "--metrics-address".to_owned(),
        String::new(),
    ];
    args.extend(lines.filter(|l| !l.is_empty()).map(str::to_owned));
    let config = <Cli as clap::Parser>::try_parse_from(args)
        .unwrap()
        .config()
        .unwrap();
    tak_os_node::serve(config).unwrap();
}

/// A keeper process on `<dir>/keeper.sock`.
fn spawn_keeper(dir: &Path) -> ServerProcess {
    spawn_keeper_with(dir, "")
}

/// A keeper process on `<dir>/keeper.sock` with `extra` arguments.
fn spawn_keeper_with(dir: &Path, extra: &str) -> ServerProcess {
    let socket = dir.join("keeper.sock");
    let process = ServerProcess::spawn(
        "handoff::child_keeper_process",
        CHILD_ENV,
        &[socket.display().to_string(), extra.to_owned()],
        socket.clone(),
        &dir.join("keepers.log"),
    );
    wait_for_socket(&socket);
    process
}

fn wait_for_socket(socket: &Path) {
    let start = Instant::now();
    while fdpass::Channel::connect(socket).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the keeper never listened"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// An owner process of node `node-a` that deposits with the keeper at `keeper`.
fn spawn_owner(dir: &Path, cluster: &Cluster, keeper: &Path) -> ServerProcess {
    spawn_owner_with(dir, cluster, "node-a", "none", Some(keeper), None)
}

/// Owner processes started now, each waiting for its gate file (`opened`) before it serves:
/// successors forked later, while the test holds files on the mount, would hang at `exec`
/// (`spawn_owner_with`).
struct Successors {
    waiting: std::vec::IntoIter<(ServerProcess, PathBuf)>,
}

impl Successors {
    fn spawn(dir: &Path, cluster: &Cluster, keeper: &Path, count: usize) -> Successors {
        let waiting: Vec<_> = (0..count)
            .map(|n| {
                let gate = dir.join(format!("successor-{n}.go"));
                let owner =
                    spawn_owner_with(dir, cluster, "node-a", "none", Some(keeper), Some(&gate));
                (owner, gate)
            })
            .collect();
        Successors {
            waiting: waiting.into_iter(),
        }
    }

    /// The next owner, let go.
    fn next(&mut self) -> ServerProcess {
        let (owner, gate) = self.waiting.next().expect("a successor is left");
        fs::write(gate, b"").unwrap();
        owner
    }
}

/// A client of `owner` once it answers (at most 15 s; then the owners' log tells why not).
async fn answering(
    owner: &ServerProcess,
    dir: &Path,
) -> csi_proto::v1::node_client::NodeClient<tonic::transport::Channel> {
    match tokio::time::timeout(Duration::from_secs(15), client_of(owner)).await {
        Ok(client) => client,
        Err(_) => panic!(
            "the new owner did not answer in 15 s:\n{}",
            fs::read_to_string(dir.join("owners.log")).unwrap_or_default()
        ),
    }
}

type Client = csi_proto::v1::node_client::NodeClient<tonic::transport::Channel>;

/// A worker serving `volume` and a keeper; the volume's stage request on node `node-a`.
async fn start(
    volume: &str,
    mode: worker::AccessMode,
) -> (Cluster, ServerProcess, NodeStageVolumeRequest) {
    let cluster = Cluster::start(volume, mode).await;
    let staging = cluster.node("node-a").staging(volume);
    let (access, context) = match mode {
        worker::AccessMode::Rwo => (Mode::SingleNodeWriter, "rwo"),
        worker::AccessMode::Rwx => (Mode::MultiNodeMultiWriter, "rwx"),
    };
    let stage = stage_request(volume, &staging, access, cluster.context(context));
    let keeper = spawn_keeper(cluster.dir.path());
    (cluster, keeper, stage)
}

/// An RWO volume on a worker that logs what it applies, a keeper, and an owner that staged
/// the volume and published it at `target`, with successors spawned by `successors` before
/// anything opens a file on the mount.
struct Scene<S> {
    cluster: Cluster,
    keeper: ServerProcess,
    stage: NodeStageVolumeRequest,
    dir: PathBuf,
    node: NodeSide,
    staging: PathBuf,
    faults: worker::Faults,
    owner: ServerProcess,
    successors: S,
    client: Client,
    target: PathBuf,
}

impl<S> Scene<S> {
    async fn publish(
        volume: &str,
        successors: impl FnOnce(&Path, &Cluster, &Path) -> S,
    ) -> Scene<S> {
        let (cluster, keeper, stage) = start(volume, worker::AccessMode::Rwo).await;
        let dir = cluster.dir.path().to_owned();
        let node = cluster.node("node-a");
        let staging = node.staging(volume);
        let faults = cluster.worker.server().faults().clone();
        faults.log_applied(true);
        let owner = spawn_owner(&dir, &cluster, &keeper.socket);
        let successors = successors(&dir, &cluster, &keeper.socket);
        let mut client = client_of(&owner).await;
        let target = node.target("pod");
        stage_and_publish(&mut client, &stage, &target).await;
        Scene {
            cluster,
            keeper,
            stage,
            dir,
            node,
            staging,
            faults,
            owner,
            successors,
            client,
            target,
        }
    }
}

/// `count` successors.
fn successors(count: usize) -> impl FnOnce(&Path, &Cluster, &Path) -> Successors {
    move |dir, cluster, keeper| Successors::spawn(dir, cluster, keeper, count)
}

async fn stage_and_publish(client: &mut Client, stage: &NodeStageVolumeRequest, target: &Path) {
    client.node_stage_volume(stage.clone()).await.unwrap();
    client
        .node_publish_volume(publish_request(stage, target, false))
        .await
        .unwrap();
}

async fn unpublish_and_unstage(client: &mut Client, stage: &NodeStageVolumeRequest, target: &Path) {
    client
        .node_unpublish_volume(unpublish_request(&stage.volume_id, target))
        .await
        .unwrap();
    client
        .node_unstage_volume(unstage_request(stage))
        .await
        .unwrap();
}

fn stats_request(volume: &str, target: &Path) -> NodeGetVolumeStatsRequest {
    NodeGetVolumeStatsRequest {
        volume_id: volume.to_owned(),
        volume_path: target.display().to_string(),
        staging_target_path: String::new(),
    }
}

/// Waits until a log line of the file at `log` contains `text` (at most 10 s).
fn wait_for_log(log: &Path, text: &str) {
    wait_for_log_count(log, text, 1);
}

/// Waits until the file at `log` says `text` `count` times (at most 10 s).
fn wait_for_log_count(log: &Path, text: &str, count: usize) {
    let start = Instant::now();
    while fs::read_to_string(log)
        .unwrap_or_default()
        .matches(text)
        .count()
        < count
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{log:?} never said {text:?}:\n{}",
            fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads `path` on a thread of its own, so that a hung read fails the test instead of hanging
/// it: the errno, or `None` for success.
fn read_errno_within(path: PathBuf, limit: Duration) -> Option<i32> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(fs::read(&path).err().and_then(|e| e.raw_os_error()));
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("a read waited more than {limit:?}: a caller hangs"))
}

#[test]
fn five_owner_upgrades_under_io_lose_nothing() {
    privileged("five_owner_upgrades_under_io_lose_nothing", async || {
        let Scene {
            cluster: _cluster,
            keeper,
            stage,
            dir,
            node,
            staging,
            faults,
            mut owner,
            mut successors,
            mut client,
            target,
        } = Scene::publish("vol-up", successors(5)).await;
        let epoch = epoch_of(&staging);
        let stage_mount = mount_id(&staging);
        let target_mount = mount_id(&target);

        let held = Held::open(&target);

        let stream = VerifiedStream::start(&target.join("stream"));
        stream.progress().await;
        let quiet = stream.take_longest_write();
        let mut stops = Vec::new();
        let mut stalls = Vec::new();
        for round in 0..5 {
            stream.take_longest_write();
            stops.push(owner.terminate());
            owner = successors.next();
            client = answering(&owner, &dir).await;
            stream.progress().await;
            stalls.push(stream.take_longest_write());
            // The new owner holds the stage: its stats are served, not reported abnormal.
            let answer = client
                .node_get_volume_stats(stats_request("vol-up", &target))
                .await
                .unwrap();
            let condition = answer.into_inner().volume_condition.unwrap();
            assert!(!condition.abnormal, "round {round}: {condition:?}");
            held.mark(round);
        }
        let (written, checked) = stream.finish();
        eprintln!(
            "five upgrades: {written} chunks written, {checked} checked while running; owner \
             stop (SIGTERM to exit) {stops:?}; longest write during each upgrade {stalls:?} \
             against {quiet:?} before"
        );
        let (repeated, summary) = assert_exactly_once(&dir, &faults);
        eprintln!("exactly once: {summary}");
        assert_eq!(
            repeated, 0,
            "a graceful hand-over leaves no request to repeat"
        );

        held.still_work(4);

        // The last owner serves the stage it adopted on its serving threads.
        assert_served_on_serving_threads(&owner.child.id().to_string(), &target.join("stream"));

        assert_eq!(epoch_of(&staging), epoch, "the lease epoch is unchanged");
        assert_eq!(
            mount_id(&staging),
            stage_mount,
            "the stage was never remounted"
        );
        assert_eq!(mount_id(&target), target_mount, "nor the publication");
        let log = fs::read_to_string(dir.join("owners.log")).unwrap();
        assert_eq!(
            log.matches("took a handed-over stage back").count(),
            5,
            "each new owner took the stage back"
        );
        assert_eq!(
            log.matches("mount lease claimed").count(),
            1,
            "only the first owner claimed the lease; the others renewed it"
        );

        drop(held);
        unpublish_and_unstage(&mut client, &stage, &target).await;
        assert!(mounts_under(&node.kubelet).is_empty());
        drop((owner, keeper));
    });
}

#[test]
fn five_owner_kills_under_io_are_ridden_through_by_successors() {
    privileged(
        "five_owner_kills_under_io_are_ridden_through_by_successors",
        async || {
            let Scene {
                cluster,
                keeper,
                stage,
                dir,
                node,
                staging,
                faults,
                mut owner,
                mut successors,
                mut client,
                target,
            } = Scene::publish("vol-crash", successors(5)).await;
            let epoch = epoch_of(&staging);
            let stage_mount = mount_id(&staging);

            // The successors know what the test holds open only from the keeper's tables.
            let held = Held::open(&target);

            let stream = VerifiedStream::start(&target.join("stream"));
            let mutations = Mutator::start(&target);
            stream.progress().await;
            let quiet = stream.take_longest_write();
            let mut stalls = Vec::new();
            let mut fresh = Vec::new();
            let mut boundaries = Vec::new();
            for round in 0..5 {
                stream.take_longest_write();
                mutations.progress().await;
                // Opened just before the kill: its delivery mark may not have reached the
                // keeper, and its request is not resent (the kernel has the reply), so the
                // successor must keep it as delivered.
                let file = fs::File::create(target.join(format!("fresh{round}"))).unwrap();
                fresh.push(file);
                // SIGKILL: no hand-over. Requests the owner had read wait in the kernel until
                // the successor has them resent.
                owner.kill();
                // The keeper saw the owner go before the successor asks for the stage.
                wait_for_log_count(
                    &dir.join("keepers.log"),
                    "keeping it for a successor",
                    round + 1,
                );
                // What the successor is given: a deadline for requests resent again, from
                // each crash before this one, bounded by the first request each owner read
                // first-hand.
                let kept = fetch(&keeper.socket);
                let rules = &kept
                    .iter()
                    .find(|d| d.staging == staging)
                    .expect("the stage is kept")
                    .resend_rules;
                assert_eq!(rules.len(), round, "{rules:?}");
                assert!(
                    rules.windows(2).all(|w| w[0].below < w[1].below),
                    "{rules:?}"
                );
                boundaries.push(rules.iter().filter(|r| r.below != u64::MAX).count());
                owner = successors.next();
                client = answering(&owner, &dir).await;
                stream.progress().await;
                stalls.push(stream.take_longest_write());
                held.mark(round);
            }
            let (written, checked) = stream.finish();
            let rounds = mutations.finish();
            eprintln!(
                "five kills: {written} chunks written, {checked} checked while running, \
                 {rounds} rounds of create/append/rename/unlink; longest write during each kill \
                 {stalls:?} against {quiet:?} before; resend rules with a first-hand \
                 boundary at each kill: {boundaries:?}"
            );

            // The worker saw each request ID with one body only (over the last calls it keeps
            // a record of), and some twice: calls a dead owner had made, repeated by its
            // successor under the same derived ID.
            let arrivals = cluster.worker.server().faults().arrivals();
            let mut bodies = std::collections::HashMap::<[u8; 16], [u8; 16]>::new();
            let mut repeats = 0;
            for arrival in &arrivals {
                if let Some(digest) = bodies.insert(arrival.request_id, arrival.digest) {
                    assert_eq!(digest, arrival.digest, "an ID came with other bytes");
                    repeats += 1;
                }
            }
            eprintln!("{} calls, {repeats} repeated", arrivals.len());
            assert!(repeats > 0, "no call in flight at any of the kills");
            eprintln!("exactly once: {}", assert_exactly_once(&dir, &faults).1);

            held.still_work(4);
            for (round, file) in fresh.iter().enumerate() {
                let text = format!("opened before kill {round}");
                file.write_all_at(text.as_bytes(), 0).unwrap();
                assert_eq!(
                    fs::read_to_string(target.join(format!("fresh{round}"))).unwrap(),
                    text
                );
            }
            assert_eq!(epoch_of(&staging), epoch, "the lease epoch is unchanged");
            assert_eq!(mount_id(&staging), stage_mount, "never remounted");
            let log = fs::read_to_string(dir.join("owners.log")).unwrap();
            assert_eq!(
                log.matches("crashed=true").count(),
                5,
                "each successor took over a crashed owner's stage:\n{log}"
            );

            drop((held, fresh));
            unpublish_and_unstage(&mut client, &stage, &target).await;
            assert!(mounts_under(&node.kubelet).is_empty());
            drop((owner, keeper));
        },
    );
}

#[test]
fn a_kill_while_a_1_mib_write_and_an_append_are_applied_but_unanswered_applies_each_once() {
    privileged(
        "a_kill_while_a_1_mib_write_and_an_append_are_applied_but_unanswered_applies_each_once",
        async || {
            const MIB: usize = 1 << 20;
            let Scene {
                // Bound, so that the worker serves until the end.
                cluster: _cluster,
                keeper,
                stage,
                dir,
                node,
                faults,
                owner,
                mut successors,
                target,
                ..
            } = Scene::publish("vol-parts", successors(1)).await;
            let held = Held::open(&target);
            held.mark(0);
            let split = fs::File::create(target.join("split")).unwrap();
            let appended = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(target.join("appended"))
                .unwrap();

            // The worker holds every reply for 200 ms after applying it: the 1 MiB write (eight
            // parts, all in flight) and the append (one call) are applied and unanswered when
            // the owner dies.
            faults.set_delay(Duration::from_millis(200));
            let pattern: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
            let writers = [(split, false), (appended, true)].map(|(file, append)| {
                let pattern = pattern.clone();
                std::thread::spawn(move || {
                    use std::io::Write as _;
                    let mut file = file;
                    match append {
                        true => file.write_all(&pattern),
                        false => file.write_all_at(&pattern, 0),
                    }
                })
            });
            std::thread::sleep(Duration::from_millis(100));
            owner.kill();
            wait_for_log(&dir.join("keepers.log"), "keeping it for a successor");
            let owner = successors.next();
            let mut client = answering(&owner, &dir).await;
            for writer in writers {
                writer.join().unwrap().unwrap();
            }
            faults.set_delay(Duration::ZERO);

            // Each applied once: the append did not land twice, the parts are in place.
            assert_eq!(fs::read(target.join("split")).unwrap(), pattern);
            assert_eq!(fs::read(target.join("appended")).unwrap(), pattern);
            let arrivals = faults.arrivals();
            let distinct: std::collections::HashSet<_> =
                arrivals.iter().map(|a| a.request_id).collect();
            assert!(
                distinct.len() + 9 <= arrivals.len(),
                "the eight parts and the append were sent again under their IDs: {} calls, {} IDs",
                arrivals.len(),
                distinct.len()
            );
            eprintln!("exactly once: {}", assert_exactly_once(&dir, &faults).1);

            // Idle past one handle lease: the successor renews the handles it inherited.
            std::thread::sleep(Duration::from_secs(10));
            held.still_work(0);
            drop(held);
            unpublish_and_unstage(&mut client, &stage, &target).await;
            assert!(mounts_under(&node.kubelet).is_empty());
            drop((owner, keeper));
        },
    );
}

#[test]
fn a_kill_between_the_parts_of_a_1_mib_write_applies_each_part_once() {
    privileged(
        "a_kill_between_the_parts_of_a_1_mib_write_applies_each_part_once",
        async || {
            const MIB: usize = 1 << 20;
            let Scene {
                // Bound, so that the worker serves until the end.
                cluster: _cluster,
                keeper,
                stage,
                dir,
                node,
                faults,
                owner,
                mut successors,
                target,
                ..
            } = Scene::publish("vol-between", successors(1)).await;
            let split = fs::File::create(target.join("split")).unwrap();

            // Parts of 128 KiB, eight sent at once: the worker applies three and takes the
            // others without applying or answering them. The owner dies between the parts.
            let before = faults.applied().len();
            faults.hang_writes_after(3);
            let pattern: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
            let writer = std::thread::spawn({
                let pattern = pattern.clone();
                move || split.write_all_at(&pattern, 0)
            });
            let deadline = Instant::now() + Duration::from_secs(10);
            while faults.applied().len() < before + 3 {
                assert!(Instant::now() < deadline, "three parts were never applied");
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(faults.applied().len(), before + 3, "the rest hang");
            owner.kill();
            faults.clear();
            wait_for_log(&dir.join("keepers.log"), "keeping it for a successor");
            let owner = successors.next();
            let mut client = answering(&owner, &dir).await;
            writer.join().unwrap().unwrap();

            // The resent write: three parts answered from the reply cache, the rest applied now.
            assert_eq!(fs::read(target.join("split")).unwrap(), pattern);
            let (repeated, summary) = assert_exactly_once(&dir, &faults);
            eprintln!("between the parts: {summary}");
            assert!(repeated >= 8, "every part was sent again: {summary}");
            let parts: std::collections::HashSet<String> = CallLog::read(&dir)
                .into_iter()
                .filter(|c| c.op == "write")
                .map(|c| c.request_id)
                .collect();
            // Eight parts or more: the kernel may send the 1 MiB as two WRITE requests when
            // the buffer is not page-aligned.
            assert!(parts.len() >= 8, "{} parts", parts.len());
            let applied: Vec<String> = faults.applied().iter().map(request_id_hex).collect();
            for part in &parts {
                let times = applied.iter().filter(|id| *id == part).count();
                assert_eq!(times, 1, "part {part} applied {times} times");
            }

            unpublish_and_unstage(&mut client, &stage, &target).await;
            assert!(mounts_under(&node.kubelet).is_empty());
            drop((owner, keeper));
        },
    );
}

#[test]
fn a_successor_held_back_past_the_deadline_answers_resent_mutations_eio_and_applies_none_twice() {
    privileged(
        "a_successor_held_back_past_the_deadline_answers_resent_mutations_eio_and_applies_none_twice",
        async || {
            let held_back = |dir: &Path, cluster: &Cluster, keeper: &Path| {
                let gate = dir.join("late.go");
                let owner = spawn_owner_with(
                    dir,
                    cluster,
                    "node-a",
                    HOLD_TAKEOVER,
                    Some(keeper),
                    Some(&gate),
                );
                (owner, gate)
            };
            let Scene {
                // Bound, so that the worker serves until the end.
                cluster: _cluster,
                keeper,
                stage,
                dir,
                node,
                faults,
                owner,
                successors: (late, gate),
                target,
                ..
            } = Scene::publish("vol-late", held_back).await;
            let log = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(target.join("log"))
                .unwrap();

            // The worker applies the append and holds its reply (less than one attempt's
            // budget, 300 ms here); the owner dies meanwhile.
            faults.set_delay(Duration::from_millis(200));
            let line = [b'x'; 1000];
            let append = std::thread::spawn(move || {
                use std::io::Write as _;
                (&log).write_all(&line)
            });
            std::thread::sleep(Duration::from_millis(100));
            owner.kill();
            wait_for_log(&dir.join("keepers.log"), "keeping it for a successor");
            // The successor fetches the stage at once, but waits 3 s before it has the
            // kernel resend: past D (2 s after the crash with these timings).
            fs::write(&gate, b"").unwrap();
            let mut client = answering(&late, &dir).await;
            let error = append.join().unwrap().unwrap_err();
            faults.set_delay(Duration::ZERO);
            assert_eq!(
                error.raw_os_error(),
                Some(libc::EIO),
                "the outcome is unknown to the successor: {error}\n{}\n{}",
                fs::read_to_string(dir.join("owners.log")).unwrap_or_default(),
                fs::read_to_string(dir.join("keepers.log")).unwrap_or_default()
            );
            // It was applied once, by the dead owner's call; the successor sent nothing.
            assert_eq!(fs::metadata(target.join("log")).unwrap().len(), 1000);
            let (repeated, summary) = assert_exactly_once(&dir, &faults);
            eprintln!("held back: {summary}");
            let owners = fs::read_to_string(dir.join("owners.log")).unwrap();
            assert!(
                owners.contains("after the window for repeating it safely"),
                "the successor says why:\n{owners}"
            );
            assert!(repeated <= 1, "only reads may be repeated: {summary}");

            // The mount serves on.
            fs::write(target.join("after"), b"fine").unwrap();
            assert_eq!(fs::read(target.join("after")).unwrap(), b"fine");
            unpublish_and_unstage(&mut client, &stage, &target).await;
            assert!(mounts_under(&node.kubelet).is_empty());
            drop((late, keeper));
        },
    );
}

#[test]
fn an_owner_killed_with_nobody_to_take_over_ends_its_mounts_and_cleanup_completes() {
    privileged(
        "an_owner_killed_with_nobody_to_take_over_ends_its_mounts_and_cleanup_completes",
        async || {
            let (cluster, keeper, stage) = start("vol-kill", worker::AccessMode::Rwo).await;
            let dir = cluster.dir.path().to_owned();
            let node = cluster.node("node-a");
            let target = node.target("pod");

            // With resend, the keeper keeps the stage until deadline D, then ends it: callers
            // waited, and now fail; nobody hangs.
            let owner = spawn_owner(&dir, &cluster, &keeper.socket);
            let mut client = client_of(&owner).await;
            stage_and_publish(&mut client, &stage, &target).await;
            fs::write(target.join("file"), b"w").unwrap();
            owner.kill();
            wait_for_log(&dir.join("keepers.log"), "keeping it for a successor");
            let errno = read_errno_within(target.join("file"), Duration::from_secs(15));
            assert!(
                matches!(errno, Some(libc::ENOTCONN | libc::ECONNABORTED)),
                "{errno:?}"
            );
            wait_for_log(&dir.join("keepers.log"), "no successor took over");
            let (owner, _) =
                clean_up_with_a_new_owner(&cluster, &node, &keeper.socket, &stage).await;
            drop(owner);
            keeper.kill();

            // The no-resend switch (kernels before 6.9): the keeper lets go of the stage at
            // once, and the connection ends.
            let keeper = spawn_keeper_with(&dir, "--no-resend");
            let owner = spawn_owner(&dir, &cluster, &keeper.socket);
            let mut client = client_of(&owner).await;
            stage_and_publish(&mut client, &stage, &target).await;
            fs::write(target.join("file"), b"x").unwrap();
            owner.kill();
            wait_for_log(
                &dir.join("keepers.log"),
                "the owner went without handing this stage over: its connection ends",
            );
            assert_eq!(
                read_errno_within(target.join("file"), Duration::from_secs(5)),
                Some(libc::ENOTCONN)
            );
            let (owner, mut client) =
                clean_up_with_a_new_owner(&cluster, &node, &keeper.socket, &stage).await;

            // Owner and keeper killed together: the same, cleanly.
            stage_and_publish(&mut client, &stage, &target).await;
            fs::write(target.join("file"), b"y").unwrap();
            owner.kill();
            keeper.kill();
            assert_eq!(
                read_errno_within(target.join("file"), Duration::from_secs(5)),
                Some(libc::ENOTCONN)
            );
            let keeper = spawn_keeper(&dir);
            let (owner, _) =
                clean_up_with_a_new_owner(&cluster, &node, &keeper.socket, &stage).await;
            drop((owner, keeper));
        },
    );
}

/// A new owner of node `node-a`, through which the dead stage of `stage` (published at the
/// node's target `pod`) is unpublished and unstaged; nothing stays mounted.
async fn clean_up_with_a_new_owner(
    cluster: &Cluster,
    node: &NodeSide,
    keeper: &Path,
    stage: &NodeStageVolumeRequest,
) -> (ServerProcess, Client) {
    let owner = spawn_owner(cluster.dir.path(), cluster, keeper);
    let mut client = client_of(&owner).await;
    unpublish_and_unstage(&mut client, stage, &node.target("pod")).await;
    assert!(mounts_under(&node.kubelet).is_empty());
    (owner, client)
}

#[test]
fn a_restarted_keeper_is_given_every_stage_again() {
    privileged(
        "a_restarted_keeper_is_given_every_stage_again",
        async || {
            let (cluster, keeper, stage) = start("vol-keep", worker::AccessMode::Rwx).await;
            let dir = cluster.dir.path().to_owned();
            let node = cluster.node("node-a");
            let staging = node.staging("vol-keep");
            let owner = spawn_owner(&dir, &cluster, &keeper.socket);
            let mut client = client_of(&owner).await;
            client.node_stage_volume(stage.clone()).await.unwrap();
            fs::write(staging.join("file"), b"kept").unwrap();
            let stage_mount = mount_id(&staging);

            // The keeper is killed and comes back empty; the owner deposits the stage again.
            keeper.kill();
            let keeper = spawn_keeper(&dir);
            wait_for_log(&dir.join("owners.log"), "connected to the keeper again");
            assert_eq!(
                fetch(&keeper.socket).len(),
                1,
                "the stage is deposited again"
            );

            // So an upgrade now keeps the mount.
            owner.terminate();
            let owner = spawn_owner(&dir, &cluster, &keeper.socket);
            let mut client = client_of(&owner).await;
            assert_eq!(fs::read(staging.join("file")).unwrap(), b"kept");
            assert_eq!(mount_id(&staging), stage_mount);
            client
                .node_unstage_volume(unstage_request(&stage))
                .await
                .unwrap();
            assert!(mounts_under(&node.kubelet).is_empty());
            assert!(
                fetch(&keeper.socket).is_empty(),
                "unstaging withdrew the deposit"
            );
            drop((owner, keeper));
        },
    );
}

#[test]
fn every_node_and_handle_the_kernel_is_given_is_written_ahead_to_the_keeper() {
    privileged(
        "every_node_and_handle_the_kernel_is_given_is_written_ahead_to_the_keeper",
        async || {
            let (cluster, keeper, stage) = start("vol-ahead", worker::AccessMode::Rwx).await;
            let dir = cluster.dir.path().to_owned();
            let node = cluster.node("node-a");
            let staging = node.staging("vol-ahead");
            let owner = spawn_owner(&dir, &cluster, &keeper.socket);
            let mut client = client_of(&owner).await;
            client.node_stage_volume(stage.clone()).await.unwrap();

            // A directory, a file in it held open, a file unlinked while open.
            fs::create_dir(staging.join("d")).unwrap();
            let held = fs::File::create(staging.join("d/held")).unwrap();
            let gone = fs::File::create(staging.join("gone")).unwrap();
            fs::remove_file(staging.join("gone")).unwrap();
            let inos = [
                fs::metadata(staging.join("d")).unwrap().ino(),
                held.metadata().unwrap().ino(),
                gone.metadata().unwrap().ino(),
            ];

            // Each reply that handed one over waited for the keeper: its tables have them
            // now, while the owner still serves.
            let state = tables_of(&keeper.socket, &staging);
            let nodes: Vec<u64> = state.nodes.iter().map(|n| n.node).collect();
            for ino in inos {
                assert!(nodes.contains(&ino), "node {ino} in {nodes:?}");
            }
            let open: Vec<u64> = state.handles.iter().map(|h| h.file.ino).collect();
            assert!(
                open.contains(&inos[1]) && open.contains(&inos[2]),
                "{open:?}"
            );
            assert_eq!(state.nonce, tables_of(&keeper.socket, &staging).nonce);
            // Each handle names the request that opened it until its reply is known to have
            // reached the kernel; the marks follow within a check.
            let deadline = Instant::now() + Duration::from_secs(10);
            while tables_of(&keeper.socket, &staging)
                .handles
                .iter()
                .any(|h| h.opened_by.is_some())
            {
                assert!(
                    Instant::now() < deadline,
                    "the delivery marks never arrived"
                );
                std::thread::sleep(Duration::from_millis(100));
            }

            // Closed: the releases need no wait; they reach the keeper within a check.
            drop((held, gone));
            let deadline = Instant::now() + Duration::from_secs(10);
            while !tables_of(&keeper.socket, &staging).handles.is_empty() {
                assert!(Instant::now() < deadline, "the releases never arrived");
                std::thread::sleep(Duration::from_millis(100));
            }
            client
                .node_unstage_volume(unstage_request(&stage))
                .await
                .unwrap();
            assert!(mounts_under(&node.kubelet).is_empty());
            drop((owner, keeper));
        },
    );
}

/// What a test holds open on a mount across owner changes: a file, a file unlinked while
/// open, and the mount's root directory.
struct Held {
    file: fs::File,
    unlinked: fs::File,
    dir: fs::File,
}

impl Held {
    fn open(target: &Path) -> Held {
        let create = |name: &str, text: &[u8]| {
            let file = fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(target.join(name))
                .unwrap();
            file.write_all_at(text, 0).unwrap();
            file
        };
        let file = create("held", b"before");
        let unlinked = create("unlinked", b"still here");
        fs::remove_file(target.join("unlinked")).unwrap();
        Held {
            file,
            unlinked,
            dir: fs::File::open(target).unwrap(),
        }
    }

    /// Writes `round N` into the held file.
    fn mark(&self, round: usize) {
        self.file
            .write_all_at(format!("round {round}").as_bytes(), 100)
            .unwrap();
    }

    /// Everything opened before still works: read, write, `fstat`, `fchmod`, and lookups
    /// relative to the directory held open, which finds the mark of round `last`.
    fn still_work(&self, last: usize) {
        let mut text = [0u8; 6];
        self.file.read_exact_at(&mut text, 0).unwrap();
        assert_eq!(&text, b"before");
        let mut text = [0u8; 10];
        self.unlinked.read_exact_at(&mut text, 0).unwrap();
        assert_eq!(&text, b"still here");
        assert_eq!(self.unlinked.metadata().unwrap().nlink(), 0);
        self.unlinked
            .set_permissions(fs::Permissions::from_mode(0o600))
            .unwrap();
        assert_eq!(self.unlinked.metadata().unwrap().mode() & 0o777, 0o600);
        let inside = rustix::fs::openat(
            self.dir.as_fd(),
            "held",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        let mut round = [0u8; 7];
        fs::File::from(inside)
            .read_exact_at(&mut round, 100)
            .unwrap();
        assert_eq!(round, format!("round {last}").as_bytes());
    }
}

/// A thread making mutations that would fail or leave a trace if any were applied twice: in
/// round `n` it creates `m/n` with `O_EXCL`, appends line `n` to `log` with `O_APPEND`,
/// renames `m/n` to `m/n.done` and unlinks `m/(n-1).done`. Its first error stops it and is
/// kept.
struct Mutator {
    dir: PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    rounds: std::sync::Arc<std::sync::atomic::AtomicU64>,
    thread: std::thread::JoinHandle<Result<(), String>>,
}

impl Mutator {
    fn start(target: &Path) -> Mutator {
        use std::io::Write as _;
        use std::sync::atomic::Ordering;
        let dir = target.join("m");
        fs::create_dir(&dir).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let rounds = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let thread = std::thread::spawn({
            let (dir, stop, rounds) = (dir.clone(), stop.clone(), rounds.clone());
            move || -> Result<(), String> {
                let mut log = fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.join("log"))
                    .map_err(|e| format!("open log: {e}"))?;
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let new = dir.join(n.to_string());
                    fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&new)
                        .map_err(|e| format!("round {n}: create: {e}"))?;
                    writeln!(log, "{n}").map_err(|e| format!("round {n}: append: {e}"))?;
                    fs::rename(&new, dir.join(format!("{n}.done")))
                        .map_err(|e| format!("round {n}: rename: {e}"))?;
                    if n > 0 {
                        fs::remove_file(dir.join(format!("{}.done", n - 1)))
                            .map_err(|e| format!("round {n}: unlink: {e}"))?;
                    }
                    n += 1;
                    rounds.store(n, Ordering::SeqCst);
                }
                Ok(())
            }
        });
        Mutator {
            dir,
            stop,
            rounds,
            thread,
        }
    }

    /// Waits for ten more rounds.
    async fn progress(&self) {
        use std::sync::atomic::Ordering;
        let from = self.rounds.load(Ordering::SeqCst);
        let start = Instant::now();
        while self.rounds.load(Ordering::SeqCst) < from + 10 {
            assert!(!self.thread.is_finished(), "the mutations stopped");
            assert!(start.elapsed() < Duration::from_secs(20), "no progress");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops; checks that every round left exactly its trace; the rounds made.
    fn finish(self) -> u64 {
        use std::sync::atomic::Ordering;
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap().unwrap();
        let rounds = self.rounds.load(Ordering::SeqCst);
        let expected: String = (0..rounds).map(|n| format!("{n}\n")).collect();
        assert_eq!(
            fs::read_to_string(self.dir.join("log")).unwrap(),
            expected,
            "each append applied once, in order"
        );
        let mut left: Vec<String> = fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut want = vec!["log".to_owned()];
        if rounds > 0 {
            want.insert(0, format!("{}.done", rounds - 1));
        }
        assert_eq!(left, want);
        rounds
    }
}

/// The keeper's tables of the stage at `staging`, through a connection of the test's own.
fn tables_of(socket: &Path, staging: &Path) -> fusefs::MountState {
    let channel = fdpass::Channel::connect(socket).unwrap();
    channel
        .send(&protocol::encode(&Request::Fetch), &[])
        .unwrap();
    let mut found = None;
    loop {
        let message = channel.recv().unwrap().unwrap();
        match protocol::decode::<Answer>(&message.payload).unwrap() {
            Answer::Stage { stage } if stage.staging == staging => {
                assert!(stage.tables, "{stage:?}");
                found = Some(protocol::StageState::from_memfd(&message.fds[1]).unwrap().0);
            }
            Answer::Stage { .. } => {}
            Answer::Done { .. } => return found.expect("the stage is deposited"),
            other => panic!("{other:?}"),
        }
    }
}

/// The keeper's deposits, through a connection of the test's own.
fn fetch(socket: &Path) -> Vec<Deposit> {
    let channel = fdpass::Channel::connect(socket).unwrap();
    channel
        .send(&protocol::encode(&Request::Fetch), &[])
        .unwrap();
    let mut deposits = Vec::new();
    loop {
        let message = channel.recv().unwrap().unwrap();
        match protocol::decode::<Answer>(&message.payload).unwrap() {
            Answer::Stage { stage } => deposits.push(stage),
            Answer::Done { count } => {
                assert_eq!(count, deposits.len());
                return deposits;
            }
            other => panic!("{other:?}"),
        }
    }
}

/// One request on a connection of the test's own; the keeper's answer.
fn ask(channel: &fdpass::Channel, payload: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]) -> Answer {
    channel.send(payload, fds).unwrap();
    let message = channel.recv().unwrap().unwrap();
    protocol::decode::<Answer>(&message.payload).unwrap()
}

#[test]
fn what_the_keeper_refuses_changes_nothing() {
    privileged("what_the_keeper_refuses_changes_nothing", async || {
        let (cluster, keeper, stage) = start("vol-ref", worker::AccessMode::Rwx).await;
        let dir = cluster.dir.path().to_owned();
        let staging = cluster.node("node-a").staging("vol-ref");
        let owner = spawn_owner(&dir, &cluster, &keeper.socket);
        let mut client = client_of(&owner).await;
        client.node_stage_volume(stage.clone()).await.unwrap();
        let before = fetch(&keeper.socket);
        assert_eq!(before.len(), 1);
        let good = before[0].clone();
        let tables_before = tables_of(&keeper.socket, &staging);

        let channel = fdpass::Channel::connect(&keeper.socket).unwrap();
        let null = fs::File::open("/dev/null").unwrap();
        let refusals: Vec<(&str, Vec<u8>, Vec<std::os::fd::BorrowedFd<'_>>)> = vec![
            ("garbage", b"\x00\xffnot json".to_vec(), vec![]),
            (
                "another version",
                br#"{"v":9,"op":"ping"}"#.to_vec(),
                vec![],
            ),
            (
                "a descriptor that is not /dev/fuse",
                protocol::encode(&Request::Deposit {
                    stage: Deposit {
                        staging: dir.join("elsewhere"),
                        tables: false,
                        ..good.clone()
                    },
                }),
                vec![null.as_fd()],
            ),
            (
                "a deposit without its descriptor",
                protocol::encode(&Request::Deposit {
                    stage: good.clone(),
                }),
                vec![],
            ),
            (
                "an INIT record that does not decode",
                protocol::encode(&Request::Deposit {
                    stage: Deposit {
                        record: "00ff".to_owned(),
                        tables: false,
                        ..good.clone()
                    },
                }),
                vec![null.as_fd()],
            ),
            (
                "a journal for a stage another connection serves",
                protocol::encode(&Request::Journal {
                    staging: staging.clone(),
                    changes: vec![protocol::Change::Forgotten { node: 99 }],
                }),
                vec![],
            ),
            (
                "a journal for no stage",
                protocol::encode(&Request::Journal {
                    staging: dir.join("nowhere"),
                    changes: vec![protocol::Change::Released { handle: 1 }],
                }),
                vec![],
            ),
        ];
        for (what, payload, fds) in refusals {
            assert!(
                matches!(ask(&channel, &payload, &fds), Answer::Refused { .. }),
                "{what} is refused"
            );
        }
        // After the refusals, the connection still serves.
        assert_eq!(
            ask(&channel, &protocol::encode(&Request::Ping), &[]),
            Answer::Ok
        );
        assert_eq!(fetch(&keeper.socket), before, "nothing changed");
        assert_eq!(tables_of(&keeper.socket, &staging), tables_before);

        // A stage of a volume the next owner does not know (a FUSE mount of the test's own,
        // deposited as handed over): the successor refuses it and lets go of it, and takes
        // the real stage back.
        let foreign = dir.join("foreign");
        fs::create_dir(&foreign).unwrap();
        let session = fuse_session::Session::mount(
            &foreign,
            &fuse_session::MountOptions::new("vol-foreign"),
            Nothing,
        )
        .await
        .unwrap();
        let state = protocol::StageState(fusefs::MountState::default())
            .to_memfd()
            .unwrap();
        let unknown = Deposit {
            volume_id: "vol-foreign".to_owned(),
            staging: foreign.clone(),
            device: (0, 0),
            record: protocol::hex_encode(&session.record().encode()),
            context: good.context.clone(),
            handed_over: true,
            tables: true,
            reply_retention_ms: 0,
            call_budget_ms: 0,
            resend_window_ms: None,
            resend_rules: Vec::new(),
        };
        assert_eq!(
            ask(
                &channel,
                &protocol::encode(&Request::Deposit { stage: unknown }),
                &[session.descriptor(), state.as_fd()],
            ),
            Answer::Ok
        );
        drop(channel);
        owner.terminate();
        let owner = spawn_owner(&dir, &cluster, &keeper.socket);
        let mut client = client_of(&owner).await;
        wait_for_log(
            &dir.join("owners.log"),
            "a handed-over stage cannot be taken back",
        );
        let after: Vec<String> = fetch(&keeper.socket)
            .into_iter()
            .map(|d| d.volume_id)
            .collect();
        assert_eq!(after, ["vol-ref"], "the unknown stage was let go of");
        fs::write(staging.join("file"), b"served").unwrap();
        client
            .node_unstage_volume(unstage_request(&stage))
            .await
            .unwrap();
        rustix::mount::unmount(&foreign, rustix::mount::UnmountFlags::DETACH).unwrap();
        drop(session);
        assert!(mounts_under(&dir).is_empty());
        drop((owner, keeper));
    });
}

/// A filesystem that answers nothing but its root (the foreign mount above).
struct Nothing;

impl fuse_session::Handler for Nothing {
    async fn handle<'a>(
        &'a self,
        _context: fuse_session::RequestContext,
        request: fuse_wire::Request<'a>,
    ) -> fuse_session::Reply {
        match request.op {
            fuse_wire::Operation::Forget(_) | fuse_wire::Operation::BatchForget(_) => {
                fuse_session::Reply::none()
            }
            _ => fuse_session::Reply::error(request.header.unique, fuse_wire::Errno::ENOENT),
        }
    }
}

/// The exactly-once proof over every call the owner processes in `dir` made for kernel
/// requests ([`CallLog`]) and every mutation the worker applied since
/// `Faults::log_applied`: each call (nonce, kernel request, index) went under one request ID
/// whoever made it, no request ID was applied twice, and every mutation a worker answered
/// with a result was applied. Returns how many calls were made again (by a successor, for a
/// request the kernel resent) and a summary.
fn assert_exactly_once(dir: &Path, faults: &worker::Faults) -> (usize, String) {
    use std::collections::{HashMap, HashSet};
    let calls = CallLog::read(dir);
    let mut ids = HashMap::<&(String, u64, u32), &str>::new();
    for call in &calls {
        let id = ids.entry(&call.call).or_insert(&call.request_id);
        assert_eq!(*id, call.request_id, "{call:?} went under two IDs");
    }
    let applied: Vec<String> = faults.applied().iter().map(request_id_hex).collect();
    let distinct: HashSet<&String> = applied.iter().collect();
    assert_eq!(
        distinct.len(),
        applied.len(),
        "a request ID was applied twice"
    );
    let acknowledged: Vec<_> = calls
        .iter()
        .filter(|c| c.mutation && c.succeeded == Some(true))
        .collect();
    for call in &acknowledged {
        assert!(
            distinct.contains(&call.request_id),
            "{} {call:?} was acknowledged but never applied",
            call.op
        );
    }
    let mut sends = HashMap::<&(String, u64, u32), (usize, &str)>::new();
    for call in calls.iter().filter(|c| c.succeeded.is_none()) {
        sends.entry(&call.call).or_insert((0, &call.op)).0 += 1;
    }
    let sent: usize = sends.values().map(|(n, _)| n).sum();
    let repeated = sent - sends.len();
    let mut repeated_ops: Vec<&str> = sends
        .values()
        .filter(|(n, _)| *n > 1)
        .map(|(_, op)| *op)
        .collect();
    repeated_ops.sort_unstable();
    let nonces: HashSet<&str> = calls.iter().map(|c| c.call.0.as_str()).collect();
    assert_eq!(
        nonces.len(),
        1,
        "one connection, one nonce, whoever served it"
    );
    let summary = format!(
        "{sent} calls for kernel requests ({repeated} made again under the same ID: \
         {repeated_ops:?}), {} mutations acknowledged, {} applied by the worker, none twice",
        acknowledged.len(),
        applied.len()
    );
    (repeated, summary)
}
