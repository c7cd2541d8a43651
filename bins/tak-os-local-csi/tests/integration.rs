//! The driver over its real socket with real bind mounts, as root in a private mount namespace.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr,
    reason = "test helpers fail loudly and say when they skip"
)]

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi_proto::v1::controller_client::ControllerClient;
use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_proto::v1::*;
use mounter::Mounter as _;
use tak_os_local_csi::{Cli, LocalCsi};
use tempfile::TempDir;
use tonic::Code;
use tonic::transport::Channel;

const NODE: &str = "node-a";

/// A driver served in-process on a socket in a temporary directory.
struct Harness {
    dir: TempDir,
    rt: tokio::runtime::Runtime,
    channel: Channel,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Harness {
    /// Must be called after entering the private mount namespace.
    fn start() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["store", "kubelet/pods", "consumers"] {
            fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let socket = dir.path().join("csi.sock");
        let cli = Cli::try_parse_args(&[
            "--endpoint",
            &format!("unix://{}", socket.display()),
            "--node-id",
            NODE,
            "--volume-path",
            &dir.path().join("store").display().to_string(),
            "--kubelet-root",
            &dir.path().join("kubelet").display().to_string(),
            "--consumer-mount-root",
            &dir.path().join("consumers").display().to_string(),
            "--metrics-address",
            "",
        ]);
        let config = cli.config().unwrap();
        let driver =
            tak_os_local_csi::open(&config, Arc::new(mounter::LinuxMounter::new())).unwrap();
        let channel = rt.block_on(async {
            let listener = csi_proto::bind_unix(&socket).unwrap();
            tokio::spawn(csi_proto::serve_on(
                listener,
                LocalCsi::new(driver).router(),
                async {
                    let _ = stopped.await;
                },
            ));
            csi_proto::connect_unix(&socket).await.unwrap()
        });
        Harness {
            dir,
            rt,
            channel,
            _stop: stop,
        }
    }

    fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel.clone())
    }

    fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel.clone())
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A kubelet target whose parent exists, as kubelet would prepare it.
    fn target(&self, pod: &str) -> PathBuf {
        let parent = self.path(&format!("kubelet/pods/{pod}/volumes/kubernetes.io~csi/pv"));
        fs::create_dir_all(&parent).unwrap();
        parent.join("mount")
    }

    fn create(&self, name: &str, required: i64) -> Result<Volume, tonic::Status> {
        self.create_with(CreateVolumeRequest {
            name: name.to_owned(),
            capacity_range: Some(CapacityRange {
                required_bytes: required,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability(Mode::SingleNodeWriter)],
            ..Default::default()
        })
    }

    fn create_with(&self, req: CreateVolumeRequest) -> Result<Volume, tonic::Status> {
        self.rt
            .block_on(self.controller().create_volume(req))
            .map(|r| r.into_inner().volume.unwrap())
    }

    fn delete(&self, volume_id: &str) -> Result<(), tonic::Status> {
        let req = DeleteVolumeRequest {
            volume_id: volume_id.to_owned(),
            ..Default::default()
        };
        self.rt
            .block_on(self.controller().delete_volume(req))
            .map(drop)
    }

    fn publish(
        &self,
        volume_id: &str,
        target: &Path,
        mode: Mode,
        readonly: bool,
    ) -> Result<(), tonic::Status> {
        let req = NodePublishVolumeRequest {
            volume_id: volume_id.to_owned(),
            target_path: target.display().to_string(),
            volume_capability: Some(capability(mode)),
            readonly,
            ..Default::default()
        };
        self.rt
            .block_on(self.node().node_publish_volume(req))
            .map(drop)
    }

    fn unpublish(&self, volume_id: &str, target: &Path) -> Result<(), tonic::Status> {
        let req = NodeUnpublishVolumeRequest {
            volume_id: volume_id.to_owned(),
            target_path: target.display().to_string(),
        };
        self.rt
            .block_on(self.node().node_unpublish_volume(req))
            .map(drop)
    }

    fn stats(
        &self,
        volume_id: &str,
        path: &Path,
    ) -> Result<NodeGetVolumeStatsResponse, tonic::Status> {
        let req = NodeGetVolumeStatsRequest {
            volume_id: volume_id.to_owned(),
            volume_path: path.display().to_string(),
            staging_target_path: String::new(),
        };
        self.rt
            .block_on(self.node().node_get_volume_stats(req))
            .map(|r| r.into_inner())
    }

    fn data_dir(&self, volume_id: &str) -> PathBuf {
        self.path("store").join(volume_id)
    }
}

trait ParseArgs {
    fn try_parse_args(args: &[&str]) -> Cli;
}

impl ParseArgs for Cli {
    fn try_parse_args(args: &[&str]) -> Cli {
        use clap::Parser as _;
        Cli::try_parse_from(std::iter::once("tak-os-local-csi").chain(args.iter().copied()))
            .unwrap()
    }
}

fn capability(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

fn code<T: std::fmt::Debug>(result: Result<T, tonic::Status>) -> Code {
    result.expect_err("expected an error status").code()
}

fn is_mount_point(path: &Path) -> bool {
    let bytes = mountinfo::read_self().unwrap();
    mountinfo::MountTable::parse(&bytes)
        .unwrap()
        .is_mount_point(path)
}

/// A snapshot of every path below `root` (for "nothing changed" checks).
fn tree(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() && !path.is_symlink() {
                stack.push(path.clone());
            }
            out.push(path);
        }
    }
    out.sort();
    out
}

#[test]
fn lifecycle_with_idempotent_repeats_and_spec_codes() {
    if !test_support::private_mount_namespace("lifecycle_with_idempotent_repeats_and_spec_codes") {
        return;
    }
    let h = Harness::start();

    // Missing fields are INVALID_ARGUMENT before anything happens.
    assert_eq!(
        code(h.create_with(CreateVolumeRequest::default())),
        Code::InvalidArgument
    );
    assert_eq!(
        code(h.create_with(CreateVolumeRequest {
            name: "x".into(),
            ..Default::default()
        })),
        Code::InvalidArgument
    );
    assert_eq!(code(h.delete("")), Code::InvalidArgument);
    assert_eq!(
        code(h.publish("v", Path::new(""), Mode::SingleNodeWriter, false)),
        Code::InvalidArgument
    );

    // Create, and the same create again.
    let volume = h.create("pvc-1", 1 << 20).unwrap();
    let id = volume.volume_id.clone();
    assert!(id.starts_with("v1."), "{id}");
    assert_eq!(volume.capacity_bytes, 1 << 20);
    assert_eq!(volume.accessible_topology.len(), 1);
    assert_eq!(h.create("pvc-1", 1 << 20).unwrap().volume_id, id);
    assert!(h.data_dir(&id).is_dir());
    // Same name, a range the existing volume does not satisfy: ALREADY_EXISTS.
    assert_eq!(code(h.create("pvc-1", 2 << 20)), Code::AlreadyExists);

    // Unsupported requests.
    let mut with_param = CreateVolumeRequest {
        name: "pvc-p".into(),
        volume_capabilities: vec![capability(Mode::SingleNodeWriter)],
        ..Default::default()
    };
    with_param.parameters.insert("disk".into(), "fast".into());
    assert_eq!(code(h.create_with(with_param)), Code::InvalidArgument);
    let other_node = Topology {
        segments: HashMap::from([("csi.local.tak-os.org/node".to_owned(), "0".repeat(32))]),
    };
    let elsewhere = CreateVolumeRequest {
        name: "pvc-elsewhere".into(),
        volume_capabilities: vec![capability(Mode::SingleNodeWriter)],
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![other_node.clone()],
            preferred: vec![],
        }),
        ..Default::default()
    };
    assert_eq!(code(h.create_with(elsewhere)), Code::ResourceExhausted);
    assert_eq!(
        code(h.create("pvc-huge", i64::MAX)),
        Code::ResourceExhausted
    );
    let inverted = CreateVolumeRequest {
        name: "pvc-inverted".into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 10,
            limit_bytes: 5,
        }),
        volume_capabilities: vec![capability(Mode::SingleNodeWriter)],
        ..Default::default()
    };
    assert_eq!(code(h.create_with(inverted)), Code::InvalidArgument);

    // Validate and capacity.
    let validate_mode = |volume_id: &str, mode: Mode| ValidateVolumeCapabilitiesRequest {
        volume_id: volume_id.to_owned(),
        volume_capabilities: vec![capability(mode)],
        ..Default::default()
    };
    let validate = |volume_id: &str| validate_mode(volume_id, Mode::SingleNodeWriter);
    let confirmed =
        h.rt.block_on(h.controller().validate_volume_capabilities(validate(&id)))
            .unwrap();
    assert!(confirmed.into_inner().confirmed.is_some());
    // A capability the volume was not created with is not confirmed, and the message says why.
    let other = validate_mode(&id, Mode::SingleNodeReaderOnly);
    let refused =
        h.rt.block_on(h.controller().validate_volume_capabilities(other))
            .unwrap()
            .into_inner();
    assert!(refused.confirmed.is_none());
    assert!(
        refused.message.contains("SINGLE_NODE_READER_ONLY"),
        "{}",
        refused.message
    );
    let unknown = format!("{}.{}", &id[..35], "f".repeat(64));
    assert_eq!(
        code(
            h.rt.block_on(
                h.controller()
                    .validate_volume_capabilities(validate(&unknown))
            )
        ),
        Code::NotFound
    );
    let ours =
        h.rt.block_on(h.controller().get_capacity(GetCapacityRequest::default()))
            .unwrap()
            .into_inner();
    assert!(ours.available_capacity > 0);
    let theirs = GetCapacityRequest {
        accessible_topology: Some(other_node),
        ..Default::default()
    };
    assert_eq!(
        h.rt.block_on(h.controller().get_capacity(theirs))
            .unwrap()
            .into_inner()
            .available_capacity,
        0
    );

    // Publish read-write at A and read-only at B.
    let a = h.target("a");
    let b = h.target("b");
    h.publish(&id, &a, Mode::SingleNodeWriter, false).unwrap();
    h.publish(&id, &a, Mode::SingleNodeWriter, false).unwrap();
    assert_eq!(
        code(h.publish(&id, &a, Mode::SingleNodeWriter, true)),
        Code::AlreadyExists
    );
    h.publish(&id, &b, Mode::SingleNodeWriter, true).unwrap();
    fs::write(a.join("hello"), b"world").unwrap();
    assert_eq!(fs::read(h.data_dir(&id).join("hello")).unwrap(), b"world");
    assert_eq!(fs::read(b.join("hello")).unwrap(), b"world");
    let refused = fs::write(b.join("nope"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(30), "EROFS: {refused}");

    // Stats: usage and a healthy condition; NOT_FOUND where it is not mounted.
    let stats = h.stats(&id, &a).unwrap();
    assert_eq!(stats.usage.len(), 2);
    assert!(!stats.volume_condition.unwrap().abnormal);
    assert_eq!(code(h.stats(&id, &h.target("c"))), Code::NotFound);
    assert_eq!(code(h.stats(&unknown, &a)), Code::NotFound);

    // Deleting a published volume is refused.
    assert_eq!(code(h.delete(&id)), Code::FailedPrecondition);

    // Unpublish removes the target; again is OK; an unknown volume at an absent target is OK.
    h.unpublish(&id, &a).unwrap();
    assert!(!a.exists(), "the target directory is removed");
    h.unpublish(&id, &a).unwrap();
    h.unpublish(&id, &b).unwrap();
    assert!(!b.exists());
    h.unpublish("not-a-volume", &h.target("gone")).unwrap();
    assert_eq!(
        fs::read(h.data_dir(&id).join("hello")).unwrap(),
        b"world",
        "data survives unpublish"
    );

    // Delete, delete again; another node's volume ID is FAILED_PRECONDITION.
    h.delete(&id).unwrap();
    h.delete(&id).unwrap();
    assert!(!h.data_dir(&id).exists());
    let foreign = format!("v1.{}.{}", "0".repeat(32), "a".repeat(64));
    assert_eq!(code(h.delete(&foreign)), Code::FailedPrecondition);
}

#[test]
fn list_volumes_pages_through_every_volume() {
    if !test_support::private_mount_namespace("list_volumes_pages_through_every_volume") {
        return;
    }
    let h = Harness::start();
    let mut created: Vec<String> = (0..5)
        .map(|i| h.create(&format!("pvc-{i}"), 0).unwrap().volume_id)
        .collect();
    created.sort();
    let mut listed = Vec::new();
    let mut token = String::new();
    loop {
        let req = ListVolumesRequest {
            max_entries: 2,
            starting_token: token,
        };
        let page =
            h.rt.block_on(h.controller().list_volumes(req))
                .unwrap()
                .into_inner();
        assert!(page.entries.len() <= 2);
        listed.extend(
            page.entries
                .into_iter()
                .map(|e| e.volume.unwrap().volume_id),
        );
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert_eq!(listed, created);
    let bad = ListVolumesRequest {
        max_entries: 0,
        starting_token: "bogus".into(),
    };
    assert_eq!(
        code(h.rt.block_on(h.controller().list_volumes(bad))),
        Code::Aborted
    );
}

#[test]
fn refusals_change_nothing() {
    if !test_support::private_mount_namespace("refusals_change_nothing") {
        return;
    }
    let h = Harness::start();
    let id = h.create("pvc-r", 0).unwrap().volume_id;

    // A symlinked parent below the kubelet root.
    let real = h.path("elsewhere");
    fs::create_dir_all(&real).unwrap();
    std::os::unix::fs::symlink(&real, h.path("kubelet/pods/linked")).unwrap();
    let before = (tree(h.dir.path()), tree(&real));
    let via_link = h.path("kubelet/pods/linked/mount");
    assert_eq!(
        code(h.publish(&id, &via_link, Mode::SingleNodeWriter, false)),
        Code::InvalidArgument
    );
    assert_eq!((tree(h.dir.path()), tree(&real)), before);

    // Outside the kubelet root.
    let outside = h.path("outside/mount");
    fs::create_dir_all(h.path("outside")).unwrap();
    assert_eq!(
        code(h.publish(&id, &outside, Mode::SingleNodeWriter, false)),
        Code::InvalidArgument
    );
    assert!(!outside.exists());

    // A foreign mount at the target stays, through publish and unpublish.
    let target = h.target("foreign");
    fs::create_dir(&target).unwrap();
    rustix::mount::mount(
        "tmpfs",
        &target,
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        None,
    )
    .unwrap();
    assert_eq!(
        code(h.publish(&id, &target, Mode::SingleNodeWriter, false)),
        Code::FailedPrecondition
    );
    assert_eq!(code(h.unpublish(&id, &target)), Code::FailedPrecondition);
    assert!(
        is_mount_point(&target),
        "the foreign mount is left in place"
    );
    rustix::mount::unmount(&target, rustix::mount::UnmountFlags::empty()).unwrap();

    // A volume whose data directory is missing: refused, and nothing is created.
    fs::remove_dir(h.data_dir(&id)).unwrap();
    let target = h.target("missing");
    let before = tree(h.dir.path());
    assert_eq!(
        code(h.publish(&id, &target, Mode::SingleNodeWriter, false)),
        Code::FailedPrecondition
    );
    assert_eq!(tree(h.dir.path()), before);
    assert!(
        !h.data_dir(&id).exists(),
        "the data directory is never recreated"
    );
}

#[test]
fn single_node_single_writer_allows_one_publication() {
    if !test_support::private_mount_namespace("single_node_single_writer_allows_one_publication") {
        return;
    }
    let h = Harness::start();
    let id = h.create("pvc-rwop", 0).unwrap().volume_id;
    let (a, b) = (h.target("a"), h.target("b"));
    h.publish(&id, &a, Mode::SingleNodeSingleWriter, false)
        .unwrap();
    assert_eq!(
        code(h.publish(&id, &b, Mode::SingleNodeSingleWriter, false)),
        Code::FailedPrecondition
    );
    assert!(!b.exists());
    h.unpublish(&id, &a).unwrap();
    h.publish(&id, &b, Mode::SingleNodeSingleWriter, false)
        .unwrap();
    h.unpublish(&id, &b).unwrap();
    // Multi-writer modes may share the node.
    h.publish(&id, &a, Mode::SingleNodeMultiWriter, false)
        .unwrap();
    h.publish(&id, &b, Mode::SingleNodeMultiWriter, false)
        .unwrap();
    h.unpublish(&id, &a).unwrap();
    h.unpublish(&id, &b).unwrap();
}

#[test]
fn trusted_consumer_claims_exclude_everyone_else() {
    if !test_support::private_mount_namespace("trusted_consumer_claims_exclude_everyone_else") {
        return;
    }
    let h = Harness::start();
    let id = h.create("pvc-c", 0).unwrap().volume_id;
    let slot = |generation: &str, replica: &str| {
        let parent = h.path(&format!("consumers/{generation}/{replica}"));
        fs::create_dir_all(&parent).unwrap();
        parent.join("mount")
    };
    let first = slot("gen-1", "r0");
    let second = slot("gen-1", "r1-0123456789ab");

    // A malformed consumer target is refused.
    fs::create_dir_all(h.path("consumers/gen-1/r9")).unwrap();
    let bad = h.path("consumers/gen-1/r9/mount");
    assert_eq!(
        code(h.publish(&id, &bad, Mode::SingleNodeWriter, false)),
        Code::InvalidArgument
    );

    h.publish(&id, &first, Mode::SingleNodeWriter, false)
        .unwrap();
    h.publish(&id, &first, Mode::SingleNodeWriter, false)
        .unwrap();
    assert!(is_mount_point(&first));
    assert!(
        h.path("store/.metadata")
            .join(format!("{id}.consumer.json"))
            .exists()
    );

    // While claimed: no other consumer target, no kubelet publication, no deletion.
    assert_eq!(
        code(h.publish(&id, &second, Mode::SingleNodeWriter, false)),
        Code::FailedPrecondition
    );
    assert_eq!(
        code(h.publish(&id, &h.target("k"), Mode::SingleNodeWriter, false)),
        Code::FailedPrecondition
    );
    assert_eq!(code(h.delete(&id)), Code::FailedPrecondition);

    // Unpublishing the original target releases the claim, even when the bind is already gone.
    rustix::mount::unmount(&first, rustix::mount::UnmountFlags::empty()).unwrap();
    h.unpublish(&id, &first).unwrap();
    assert!(!first.exists());
    assert!(
        !h.path("store/.metadata")
            .join(format!("{id}.consumer.json"))
            .exists()
    );

    // A claim is refused while kubelet has the volume published.
    let k = h.target("k2");
    h.publish(&id, &k, Mode::SingleNodeWriter, false).unwrap();
    assert_eq!(
        code(h.publish(&id, &second, Mode::SingleNodeWriter, false)),
        Code::FailedPrecondition
    );
    h.unpublish(&id, &k).unwrap();
    h.publish(&id, &second, Mode::SingleNodeWriter, false)
        .unwrap();
    h.unpublish(&id, &second).unwrap();
    h.delete(&id).unwrap();
}

/// A mounter that stops forever (after writing a marker) instead of binding: the child driver
/// process of the kill test dies here, after the claim is durable and before any mount.
#[derive(Debug)]
struct StopBeforeBind {
    marker: PathBuf,
}

impl mounter::Mounter for StopBeforeBind {
    fn source_mount(&self, source: &Path) -> Result<mounter::MountedAt, mounter::Error> {
        mounter::LinuxMounter::new().source_mount(source)
    }

    fn mounted_at(
        &self,
        target: &mounter::Target,
    ) -> Result<Option<mounter::MountedAt>, mounter::Error> {
        mounter::LinuxMounter::new().mounted_at(target)
    }

    fn bind(
        &self,
        _: &Path,
        _: &mounter::Target,
        _: mounter::BindOptions,
    ) -> Result<(), mounter::Error> {
        fs::write(&self.marker, b"before bind").unwrap();
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }

    fn unmount(
        &self,
        target: &mounter::Target,
        expected: &mounter::MountIdentity,
    ) -> Result<mounter::Unmounted, mounter::Error> {
        mounter::LinuxMounter::new().unmount(target, expected)
    }

    fn remove_target(&self, target: &mounter::Target) -> Result<bool, mounter::Error> {
        mounter::LinuxMounter::new().remove_target(target)
    }

    fn publications(
        &self,
        volume: &mounter::MountIdentity,
    ) -> Result<Vec<PathBuf>, mounter::Error> {
        mounter::LinuxMounter::new().publications(volume)
    }
}

const CHILD_ENV: &str = "TAK_OS_TEST_CHILD_DRIVER";

/// A child process that is killed when the guard drops, so a failed assertion never leaves a
/// driver running.
struct KillOnDrop(std::process::Child);

impl KillOnDrop {
    fn kill(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Not a test on its own: the kill test re-executes this binary to run a driver in a child
/// process (`TAK_OS_TEST_CHILD_DRIVER=<dir>`, plus `:stop` to stop before the bind).
#[test]
#[ignore = "a helper process of kill_between_record_and_mount_then_retry_succeeds"]
fn child_driver_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (dir, stop) = match spec.strip_suffix(":stop") {
        Some(dir) => (PathBuf::from(dir), true),
        None => (PathBuf::from(spec), false),
    };
    let cli = Cli::try_parse_args(&[
        "--endpoint",
        &format!("unix://{}", dir.join("csi.sock").display()),
        "--node-id",
        NODE,
        "--volume-path",
        &dir.join("store").display().to_string(),
        "--kubelet-root",
        &dir.join("kubelet").display().to_string(),
        "--consumer-mount-root",
        &dir.join("consumers").display().to_string(),
        "--metrics-address",
        "",
    ]);
    let mounter: Arc<dyn mounter::Mounter> = if stop {
        Arc::new(StopBeforeBind {
            marker: dir.join("paused"),
        })
    } else {
        Arc::new(mounter::LinuxMounter::new())
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(tak_os_local_csi::run(
        cli.config().unwrap(),
        mounter,
        std::future::pending(),
    ))
    .unwrap();
}

/// Kills a driver process (SIGKILL) after it has recorded a consumer claim and created the
/// target, before the bind; a restarted driver finishes the same publication on retry.
#[test]
fn kill_between_record_and_mount_then_retry_succeeds() {
    use std::process::Command;
    use std::time::{Duration, Instant};

    if !test_support::private_mount_namespace("kill_between_record_and_mount_then_retry_succeeds") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for sub in ["store", "kubelet/pods", "consumers/g/r0"] {
        fs::create_dir_all(dir.path().join(sub)).unwrap();
    }
    let socket = dir.path().join("csi.sock");
    let marker = dir.path().join("paused");
    let log = dir.path().join("driver.log");
    // The child inherits this thread's private mount namespace.
    let spawn = |stop: bool| {
        let spec = format!(
            "{}{}",
            dir.path().display(),
            if stop { ":stop" } else { "" }
        );
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_driver_process",
                "--ignored",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_ENV, spec)
            .stdout(
                fs::File::options()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap(),
            )
            .stderr(
                fs::File::options()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap(),
            )
            .spawn()
            .map(KillOnDrop)
            .unwrap()
    };
    let wait_for = |what: &str, ready: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !ready() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "timed out waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let connect = || {
        let start = Instant::now();
        loop {
            if socket.exists()
                && let Ok(channel) = rt.block_on(csi_proto::connect_unix(&socket))
            {
                return channel;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the driver never answered"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let target = dir.path().join("consumers/g/r0/mount");
    let publish = |volume_id: &str| NodePublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        target_path: target.display().to_string(),
        volume_capability: Some(capability(Mode::SingleNodeWriter)),
        ..Default::default()
    };

    let driver = spawn(true);
    let channel = connect();
    let create = CreateVolumeRequest {
        name: "pvc-kill".into(),
        volume_capabilities: vec![capability(Mode::SingleNodeWriter)],
        ..Default::default()
    };
    let created = rt.block_on(ControllerClient::new(channel.clone()).create_volume(create));
    let id = created.unwrap().into_inner().volume.unwrap().volume_id;
    let call = rt.spawn({
        let channel = channel.clone();
        let req = publish(&id);
        async move { NodeClient::new(channel).node_publish_volume(req).await }
    });
    wait_for("the pause before the bind", &|| marker.exists());
    driver.kill();
    assert!(
        rt.block_on(call).unwrap().is_err(),
        "the killed call cannot have succeeded"
    );
    let claim = dir
        .path()
        .join("store/.metadata")
        .join(format!("{id}.consumer.json"));
    assert!(claim.exists(), "the claim is durable before the bind");
    assert!(
        target.is_dir() && !is_mount_point(&target),
        "killed after mkdir, before the bind"
    );

    let driver = spawn(false);
    let channel = connect();
    rt.block_on(NodeClient::new(channel.clone()).node_publish_volume(publish(&id)))
        .unwrap();
    assert!(
        is_mount_point(&target),
        "the retry finished the publication"
    );
    let unpublish = NodeUnpublishVolumeRequest {
        volume_id: id.clone(),
        target_path: target.display().to_string(),
    };
    rt.block_on(NodeClient::new(channel).node_unpublish_volume(unpublish))
        .unwrap();
    assert!(!target.exists());
    assert!(!claim.exists(), "unpublish released the claim");
    driver.kill();
}

// ----- The driver's logic over the fake mounter: no mount privilege and no root needed (the
// store is owned by the user running the tests), so these run in a build container too. -----

/// A driver over a `FakeMounter`, called directly.
struct FakeHarness {
    dir: TempDir,
    fake: Arc<mounter::FakeMounter>,
    driver: Arc<tak_os_local_csi::Driver>,
}

impl FakeHarness {
    fn start(store_attrs: mounter::MountAttrs) -> FakeHarness {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["store", "kubelet/pods", "consumers"] {
            fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let fake = Arc::new(mounter::FakeMounter::new());
        fake.set_source_attrs(&dir.path().join("store"), store_attrs);
        let cli = Cli::try_parse_args(&[
            "--node-id",
            NODE,
            "--volume-path",
            &dir.path().join("store").display().to_string(),
            "--kubelet-root",
            &dir.path().join("kubelet").display().to_string(),
            "--metrics-address",
            "",
        ]);
        let mounter: Arc<dyn mounter::Mounter> = fake.clone();
        let driver = tak_os_local_csi::open(&cli.config().unwrap(), mounter).unwrap();
        FakeHarness { dir, fake, driver }
    }

    fn volume(&self, name: &str) -> String {
        let req = CreateVolumeRequest {
            name: name.to_owned(),
            volume_capabilities: vec![capability(Mode::SingleNodeWriter)],
            ..Default::default()
        };
        self.driver
            .create_volume(req)
            .unwrap()
            .volume
            .unwrap()
            .volume_id
    }

    fn target(&self, pod: &str) -> PathBuf {
        let parent = self.dir.path().join(format!("kubelet/pods/{pod}"));
        fs::create_dir_all(&parent).unwrap();
        parent.join("mount")
    }

    fn publish(&self, volume_id: &str, target: &Path, readonly: bool) -> Result<(), tonic::Status> {
        let req = NodePublishVolumeRequest {
            volume_id: volume_id.to_owned(),
            target_path: target.display().to_string(),
            volume_capability: Some(capability(Mode::SingleNodeWriter)),
            readonly,
            ..Default::default()
        };
        self.driver
            .node_publish_volume(req)
            .map(drop)
            .map_err(tonic::Status::from)
    }

    fn unpublish(&self, volume_id: &str, target: &Path) -> Result<(), tonic::Status> {
        let req = NodeUnpublishVolumeRequest {
            volume_id: volume_id.to_owned(),
            target_path: target.display().to_string(),
        };
        self.driver
            .node_unpublish_volume(req)
            .map(drop)
            .map_err(tonic::Status::from)
    }
}

/// Regression: a bind inherits the store mount's nosuid/nodev, so comparing the mounted flags
/// with only the requested ones made every repeated publish ALREADY_EXISTS on such a store.
#[test]
fn repeated_publish_on_a_nosuid_nodev_store_is_ok() {
    let store_attrs = mounter::MountAttrs {
        nosuid: true,
        nodev: true,
        ..Default::default()
    };
    let h = FakeHarness::start(store_attrs);
    let id = h.volume("pvc-flags");
    let target = h.target("p");
    h.publish(&id, &target, false).unwrap();
    h.publish(&id, &target, false).unwrap();
    assert_eq!(code(h.publish(&id, &target, true)), Code::AlreadyExists);
    let mounted = h.fake.mounts();
    let at_target = &mounted[&target];
    assert_eq!(at_target.len(), 1, "a repeat never mounts twice");
    assert!(at_target[0].attrs.nosuid && at_target[0].attrs.nodev);
    h.unpublish(&id, &target).unwrap();
    assert!(h.fake.mounts().is_empty());
    assert!(!target.exists());
}

#[test]
fn a_failed_bind_leaves_no_target_behind() {
    let h = FakeHarness::start(Default::default());
    let id = h.volume("pvc-fail");
    let target = h.target("p");
    h.fake.fail_next(mounter::FakeOp::Bind, 5);
    assert_eq!(code(h.publish(&id, &target, false)), Code::Unavailable);
    assert!(
        !target.exists(),
        "the target the driver created is removed again"
    );
    h.publish(&id, &target, false).unwrap();
    h.unpublish(&id, &target).unwrap();
}

#[test]
fn unpublish_never_removes_a_foreign_mount() {
    let h = FakeHarness::start(Default::default());
    let id = h.volume("pvc-foreign");
    let target = h.target("p");
    fs::create_dir(&target).unwrap();
    let foreign = mounter::MountIdentity {
        major: 0,
        minor: 99,
        root: "/".into(),
        fs_type: "tmpfs".into(),
        source: "tmpfs".into(),
    };
    h.fake.mount_foreign(&target, foreign.clone());
    assert_eq!(code(h.unpublish(&id, &target)), Code::FailedPrecondition);
    assert_eq!(h.fake.mounts()[&target][0].identity, foreign);
    assert!(target.exists());
    // A publish on top of it is refused too.
    assert_eq!(
        code(h.publish(&id, &target, false)),
        Code::FailedPrecondition
    );
}

#[test]
fn probe_fails_when_the_store_moves_to_another_mount() {
    let h = FakeHarness::start(Default::default());
    h.driver.probe().unwrap();
    // The disk under the store is unmounted: the path now lies on another mount.
    let moved = mounter::MountedAt {
        mount_id: 7,
        identity: h.fake.source_identity(&h.dir.path().join("store")).unwrap(),
        attrs: Default::default(),
    };
    h.fake.set_source_mount(&h.dir.path().join("store"), moved);
    let status = tonic::Status::from(h.driver.probe().unwrap_err());
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().contains("no longer on the mount"),
        "{}",
        status.message()
    );
}

#[test]
fn audit_reports_volumes_orphans_and_unreadable_records_beside_a_live_driver() {
    let h = FakeHarness::start(Default::default());
    let id = h.volume("pvc-audit");
    let store = h.dir.path().join("store");
    // An orphan data directory and a garbage record, as a crash or a careless hand leaves them.
    let orphan = format!("{}.{}", &id[..35], "e".repeat(64));
    fs::create_dir(store.join(&orphan)).unwrap();
    let garbage = format!("{}.{}", &id[..35], "d".repeat(64));
    fs::write(
        store.join(".metadata").join(format!("{garbage}.json")),
        b"{not json",
    )
    .unwrap();
    let before = tree(&store);

    let table =
        tak_os_local_csi::audit::audit(&store, NODE, tak_os_local_csi::config::AuditFormat::Table)
            .unwrap();
    assert!(
        table.contains(&id) && table.contains("pvc-audit"),
        "{table}"
    );
    assert!(table.contains(&format!("orphan   {orphan}")), "{table}");
    assert!(table.contains("unreadable"), "{table}");

    let json =
        tak_os_local_csi::audit::audit(&store, NODE, tak_os_local_csi::config::AuditFormat::Json)
            .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(doc["volumes"][0]["volume_id"], id.as_str());
    assert_eq!(doc["orphan_directories"][0], orphan.as_str());
    assert!(
        doc["unreadable"][0]["reason"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{json}"
    );
    assert_eq!(tree(&store), before, "an audit writes nothing");
}
