//! The mount owner driven as kubelet drives it, as root in a private mount namespace, with
//! real FUSE mounts and the reference worker over loopback TLS (shortened budgets and lease).

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_proto::v1::*;
use fusefs::testing::WorkerVolume;
use tak_os_node::context;
use tak_os_node::credentials::DirectorySource;
use tak_os_node::owner::{Owner, OwnerConfig};
use tak_os_node::status;
use tempfile::TempDir;
use tonic::Code;

/// Every duration is the default times this factor: a 1.5 s call budget, a 9 s lease.
const SCALE: f64 = 0.1;
const NAMESPACE: &str = "tak-os-system";

/// One node's view: a kubelet root, a credentials directory and an owner.
struct NodeSide {
    kubelet: PathBuf,
    owner: Arc<Owner>,
}

impl NodeSide {
    fn new(dir: &Path, node_id: &str, credentials: &Path) -> NodeSide {
        let kubelet = dir.join(node_id).join("kubelet");
        fs::create_dir_all(kubelet.join("plugins")).unwrap();
        fs::create_dir_all(kubelet.join("pods")).unwrap();
        let mut config = OwnerConfig::new(node_id);
        config.kubelet_root = kubelet.clone();
        config.credential_namespace = NAMESPACE.to_owned();
        config.budgets = lease_client::Budgets::default().scaled(SCALE);
        config.lease = lease_client::LeaseConfig::default().scaled(SCALE);
        let owner = Owner::new(
            config,
            Arc::new(mounter::LinuxMounter::new()),
            Arc::new(DirectorySource::new(credentials)),
        )
        .unwrap();
        owner.recover().unwrap();
        NodeSide {
            kubelet,
            owner: Arc::new(owner),
        }
    }

    /// A staging path as kubelet makes it (the directory exists, empty).
    fn staging(&self, name: &str) -> PathBuf {
        let path = self
            .kubelet
            .join("plugins/csi")
            .join(name)
            .join("globalmount");
        fs::create_dir_all(&path).unwrap();
        path
    }

    /// A target path whose parent exists, as kubelet leaves it.
    fn target(&self, pod: &str) -> PathBuf {
        let parent = self.kubelet.join("pods").join(pod).join("volumes");
        fs::create_dir_all(&parent).unwrap();
        parent.join("mount")
    }
}

/// A worker group of one serving `volume_id`, and the credentials directory the owners read.
struct Cluster {
    dir: TempDir,
    worker: WorkerVolume,
    credentials: PathBuf,
}

impl Cluster {
    async fn start(volume_id: &str, mode: worker::AccessMode) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let worker = WorkerVolume::start(
            dir.path(),
            volume_id,
            mode,
            worker::Timings::default().scaled(SCALE),
        )
        .await
        .unwrap();
        let credentials = dir.path().join("credentials");
        let volume = credentials.join(volume_id);
        fs::create_dir_all(&volume).unwrap();
        let pki = worker.pki();
        for (key, value) in [
            ("token", fusefs::testing::TOKEN),
            ("ca.crt", pki.ca_pem.as_str()),
            ("tls.crt", pki.client_pem.as_str()),
            ("tls.key", pki.client_key.as_str()),
        ] {
            fs::write(volume.join(key), value).unwrap();
        }
        Cluster {
            dir,
            worker,
            credentials,
        }
    }

    fn node(&self, node_id: &str) -> NodeSide {
        NodeSide::new(self.dir.path(), node_id, &self.credentials)
    }

    fn context(&self, mode: &str) -> HashMap<String, String> {
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

fn capability(mode: Mode) -> Option<VolumeCapability> {
    Some(VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    })
}

fn stage_request(
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

fn publish_request(
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

fn unstage_request(stage: &NodeStageVolumeRequest) -> NodeUnstageVolumeRequest {
    NodeUnstageVolumeRequest {
        volume_id: stage.volume_id.clone(),
        staging_target_path: stage.staging_target_path.clone(),
    }
}

fn unpublish_request(volume_id: &str, target: &Path) -> NodeUnpublishVolumeRequest {
    NodeUnpublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        target_path: target.display().to_string(),
    }
}

fn code_of<T>(result: Result<T, tak_os_node::error::Error>) -> Code {
    match result {
        Ok(_) => Code::Ok,
        Err(error) => {
            eprintln!("refused: {}", error_text(&error));
            status::code(&error)
        }
    }
}

fn error_text(error: &tak_os_node::error::Error) -> String {
    test_support::error_chain(error)
}

/// The mount table's lines that mention `path`.
fn mounts_under(path: &Path) -> Vec<String> {
    let bytes = mountinfo::read_self().unwrap();
    let table = mountinfo::MountTable::parse(&bytes).unwrap();
    table
        .iter()
        .filter(|m| m.mount_point().starts_with(path))
        .map(|m| m.mount_point().display().to_string())
        .collect()
}

/// Runs `body` on a multi-threaded runtime inside a private mount namespace, or skips.
fn privileged(test: &str, body: impl AsyncFnOnce()) {
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

#[test]
fn rwx_stage_publish_twice_write_read_and_tear_down_idempotently() {
    privileged(
        "rwx_stage_publish_twice_write_read_and_tear_down_idempotently",
        async || {
            let cluster = Cluster::start("vol-rwx", worker::AccessMode::Rwx).await;
            let node = cluster.node("node-a");
            let owner = &node.owner;
            let staging = node.staging("vol-rwx");
            let stage = stage_request(
                "vol-rwx",
                &staging,
                Mode::MultiNodeMultiWriter,
                cluster.context("rwx"),
            );
            for _ in 0..2 {
                owner.stage(&stage).await.unwrap();
            }
            assert!(
                staging
                    .parent()
                    .unwrap()
                    .join("globalmount.rwx-session")
                    .exists(),
                "an RWX stage has a session record too"
            );

            let writer = node.target("pod-w");
            let reader = node.target("pod-r");
            for _ in 0..2 {
                owner
                    .publish(&publish_request(&stage, &writer, false))
                    .await
                    .unwrap();
                owner
                    .publish(&publish_request(&stage, &reader, true))
                    .await
                    .unwrap();
            }
            assert_eq!(
                code_of(owner.publish(&publish_request(&stage, &writer, true)).await),
                Code::AlreadyExists,
                "the same target with other arguments"
            );

            let written = writer.join("data");
            fs::write(&written, b"through one publication").unwrap();
            assert_eq!(
                fs::read(reader.join("data")).unwrap(),
                b"through one publication"
            );
            let refused = fs::OpenOptions::new()
                .write(true)
                .open(reader.join("data"))
                .unwrap_err();
            assert_eq!(refused.raw_os_error(), Some(libc::EROFS));
            let file = fs::File::open(&written).unwrap();
            let mut buf = [0u8; 7];
            file.read_exact_at(&mut buf, 8).unwrap();
            assert_eq!(&buf, b"one pub");
            drop(file);

            let stats = owner
                .volume_stats(&NodeGetVolumeStatsRequest {
                    volume_id: "vol-rwx".to_owned(),
                    volume_path: writer.display().to_string(),
                    staging_target_path: String::new(),
                })
                .await
                .unwrap();
            assert_eq!(stats.usage.len(), 2, "{stats:?}");
            assert!(!stats.volume_condition.unwrap().abnormal);

            assert_eq!(
                code_of(owner.unstage(&unstage_request(&stage)).await),
                Code::FailedPrecondition,
                "unstage while published"
            );
            for target in [&writer, &reader] {
                for _ in 0..2 {
                    owner
                        .unpublish(&unpublish_request("vol-rwx", target))
                        .await
                        .unwrap();
                }
                assert!(!target.exists(), "the target directory is removed");
            }
            for _ in 0..2 {
                owner.unstage(&unstage_request(&stage)).await.unwrap();
            }
            assert!(mounts_under(&node.kubelet).is_empty());
            assert!(
                staging.is_dir(),
                "the staging directory is kubelet's and stays"
            );
            assert!(
                !staging
                    .parent()
                    .unwrap()
                    .join("globalmount.rwx-session")
                    .exists(),
                "the session record is removed last"
            );
            assert_eq!(owner.stage_count(), 0);
        },
    );
}

#[test]
fn rwo_is_one_node_at_a_time_and_an_unstage_hands_it_over_at_once() {
    privileged(
        "rwo_is_one_node_at_a_time_and_an_unstage_hands_it_over_at_once",
        async || {
            let cluster = Cluster::start("vol-rwo", worker::AccessMode::Rwo).await;
            let a = cluster.node("node-a");
            let b = cluster.node("node-b");
            let stage_a = stage_request(
                "vol-rwo",
                &a.staging("vol-rwo"),
                Mode::SingleNodeWriter,
                cluster.context("rwo"),
            );
            let stage_b = stage_request(
                "vol-rwo",
                &b.staging("vol-rwo"),
                Mode::SingleNodeMultiWriter,
                cluster.context("rwo"),
            );
            a.owner.stage(&stage_a).await.unwrap();
            a.owner.stage(&stage_a).await.unwrap();
            let target = a.target("pod-1");
            a.owner
                .publish(&publish_request(&stage_a, &target, false))
                .await
                .unwrap();
            fs::write(target.join("owned-by-a"), b"a").unwrap();

            assert_eq!(
                code_of(b.owner.stage(&stage_b).await),
                Code::FailedPrecondition,
                "the lease is held by node-a's epoch"
            );
            assert!(
                !b.staging("vol-rwo")
                    .parent()
                    .unwrap()
                    .join("globalmount.rwo-session")
                    .exists(),
                "a refused claim removes its pending record"
            );
            assert!(mounts_under(&b.kubelet).is_empty());

            a.owner
                .unpublish(&unpublish_request("vol-rwo", &target))
                .await
                .unwrap();
            a.owner.unstage(&unstage_request(&stage_a)).await.unwrap();
            // Released, not expired: node-b stages at once.
            b.owner.stage(&stage_b).await.unwrap();
            let target_b = b.target("pod-2");
            b.owner
                .publish(&publish_request(&stage_b, &target_b, false))
                .await
                .unwrap();
            assert_eq!(fs::read(target_b.join("owned-by-a")).unwrap(), b"a");
            b.owner
                .unpublish(&unpublish_request("vol-rwo", &target_b))
                .await
                .unwrap();
            b.owner.unstage(&unstage_request(&stage_b)).await.unwrap();
            assert!(mounts_under(&b.kubelet).is_empty());
        },
    );
}

#[test]
fn refusals_change_nothing() {
    privileged("refusals_change_nothing", async || {
        let cluster = Cluster::start("vol-x", worker::AccessMode::Rwx).await;
        let node = cluster.node("node-a");
        let staging = node.staging("vol-x");
        let good = stage_request(
            "vol-x",
            &staging,
            Mode::MultiNodeMultiWriter,
            cluster.context("rwx"),
        );
        let with = |f: &dyn Fn(&mut NodeStageVolumeRequest)| {
            let mut req = good.clone();
            f(&mut req);
            req
        };
        let outside = cluster.dir.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        let link_parent = node.kubelet.join("plugins/link");
        std::os::unix::fs::symlink(&outside, &link_parent).unwrap();
        let cases: Vec<(&str, NodeStageVolumeRequest, Code)> = vec![
            (
                "no volume id",
                with(&|r| r.volume_id.clear()),
                Code::InvalidArgument,
            ),
            (
                "bad volume id",
                with(&|r| r.volume_id = "Vol/X".into()),
                Code::InvalidArgument,
            ),
            (
                "no staging path",
                with(&|r| r.staging_target_path.clear()),
                Code::InvalidArgument,
            ),
            (
                "staging path outside kubelet",
                with(&|r| r.staging_target_path = outside.display().to_string()),
                Code::InvalidArgument,
            ),
            (
                "dot-dot in the staging path",
                with(&|r| {
                    r.staging_target_path = format!("{}/../x", staging.display());
                }),
                Code::InvalidArgument,
            ),
            (
                "symlinked parent",
                with(&|r| {
                    r.staging_target_path = link_parent.join("globalmount").display().to_string();
                }),
                Code::InvalidArgument,
            ),
            (
                "secrets",
                with(&|r| {
                    r.secrets = HashMap::from([("token".to_owned(), "hunter2".to_owned())]);
                }),
                Code::InvalidArgument,
            ),
            (
                "no generation",
                with(&|r| {
                    r.volume_context.remove(context::GENERATION);
                }),
                Code::InvalidArgument,
            ),
            (
                "foreign namespace",
                with(&|r| {
                    r.volume_context.insert(
                        context::CREDENTIAL_NAMESPACE.to_owned(),
                        "kube-system".to_owned(),
                    );
                }),
                Code::InvalidArgument,
            ),
            (
                "block",
                with(&|r| {
                    r.volume_capability = Some(VolumeCapability {
                        access_mode: Some(AccessMode {
                            mode: Mode::MultiNodeMultiWriter as i32,
                        }),
                        access_type: Some(AccessType::Block(Default::default())),
                    });
                }),
                Code::InvalidArgument,
            ),
            (
                "rwo mode on an rwx volume",
                with(&|r| {
                    r.volume_capability = capability(Mode::SingleNodeWriter);
                }),
                Code::FailedPrecondition,
            ),
            (
                "another generation",
                with(&|r| {
                    r.volume_context
                        .insert(context::GENERATION.to_owned(), "2".to_owned());
                }),
                Code::NotFound,
            ),
        ];
        let before = mounts_under(cluster.dir.path());
        for (what, req, expected) in cases {
            let result = node.owner.stage(&req).await;
            if let Err(error) = &result {
                assert!(
                    !error_text(error).contains("hunter2"),
                    "{what}: secret in {error}"
                );
            }
            assert_eq!(code_of(result), expected, "{what}");
            assert_eq!(
                mounts_under(cluster.dir.path()),
                before,
                "{what}: the mount table"
            );
            let records: Vec<_> = fs::read_dir(staging.parent().unwrap())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(records, ["globalmount"], "{what}: no record left behind");
        }
        // A non-empty staging directory and a foreign mount at it are never a stage.
        fs::write(staging.join("stray"), b"").unwrap();
        assert_eq!(code_of(node.owner.stage(&good).await), Code::AlreadyExists);
        fs::remove_file(staging.join("stray")).unwrap();
        rustix::mount::mount(
            "tmpfs",
            &staging,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            c"",
        )
        .unwrap();
        assert_eq!(code_of(node.owner.stage(&good).await), Code::AlreadyExists);
        assert_eq!(
            code_of(node.owner.unstage(&unstage_request(&good)).await),
            Code::FailedPrecondition,
            "a foreign mount at the staging path is never unmounted"
        );
        rustix::mount::unmount(&staging, rustix::mount::UnmountFlags::empty()).unwrap();
    });
}
