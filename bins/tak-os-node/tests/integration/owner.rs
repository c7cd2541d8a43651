//! The mount owner driven as kubelet drives it, as root in a private mount namespace, with
//! real FUSE mounts and the reference worker over loopback TLS (shortened budgets and lease).

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::FileExt as _;
use std::sync::Arc;

use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::volume_capability::{AccessMode, AccessType};
use csi_proto::v1::*;
use tak_os_node::context;
use tonic::Code;

use crate::support::{
    Cluster, assert_served_on_serving_threads, capability, code_of, error_text, mounts_under,
    privileged, publish_request, stage_request, unpublish_request, unstage_request,
};

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

            assert_served_on_serving_threads("self", &reader.join("data"));

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
            // Detached by hand, the stage no longer shows at its path; its binds still count.
            rustix::mount::unmount(&staging, rustix::mount::UnmountFlags::DETACH).unwrap();
            assert_eq!(
                code_of(owner.unstage(&unstage_request(&stage)).await),
                Code::FailedPrecondition,
                "unstage while published, the staging mount detached"
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
            // A second owner with the same node ID never shares the volume: another epoch.
            let twin = cluster.node_twin("node-a");
            let stage_twin = stage_request(
                "vol-rwo",
                &twin.staging("vol-rwo"),
                Mode::SingleNodeWriter,
                cluster.context("rwo"),
            );
            assert_eq!(
                code_of(twin.owner.stage(&stage_twin).await),
                Code::FailedPrecondition,
                "a second owner with the same node ID"
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
        // A staging path that is itself a symlink is never followed (it might lead into a dead
        // FUSE mount): refused before anything is read or written.
        let linked_parent = node.kubelet.join("plugins/csi/vol-linked");
        fs::create_dir_all(&linked_parent).unwrap();
        std::os::unix::fs::symlink(&outside, linked_parent.join("globalmount")).unwrap();
        let linked = with(&|r| {
            r.staging_target_path = linked_parent.join("globalmount").display().to_string();
        });
        assert_eq!(
            code_of(node.owner.stage(&linked).await),
            Code::InvalidArgument,
            "a symlink as the staging path"
        );
        let left: Vec<_> = fs::read_dir(&linked_parent)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["globalmount"], "no record beside the symlink");
        assert_eq!(mounts_under(cluster.dir.path()), before);
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

/// A directory source that counts its calls, so the test knows when the owner has looked at
/// the files again (a refresh cycle is: `changed` resolves, `load`, swap, `changed` again).
struct Counted {
    inner: tak_os_node::credentials::DirectorySource,
    loads: std::sync::atomic::AtomicU64,
    changes: std::sync::atomic::AtomicU64,
}

impl tak_os_node::credentials::CredentialSource for Counted {
    fn load<'a>(&'a self, volume_id: &'a str) -> tak_os_node::credentials::Load<'a> {
        self.loads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.load(volume_id)
    }

    fn changed<'a>(&'a self, volume_id: &'a str) -> tak_os_node::credentials::Changed<'a> {
        self.changes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.changed(volume_id)
    }
}

impl Counted {
    /// Waits for two whole refresh cycles, so the material on disk now is in the client.
    async fn refreshed(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let (loads, changes) = (self.loads.load(SeqCst), self.changes.load(SeqCst));
        let start = std::time::Instant::now();
        while self.loads.load(SeqCst) < loads + 2 || self.changes.load(SeqCst) < changes + 2 {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "no refresh"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

#[test]
fn a_token_rotation_during_continuous_io_fails_no_call() {
    privileged(
        "a_token_rotation_during_continuous_io_fails_no_call",
        async || {
            use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
            let cluster = Cluster::start("vol-rot", worker::AccessMode::Rwx).await;
            let source = Arc::new(Counted {
                inner: tak_os_node::credentials::DirectorySource::new(&cluster.credentials)
                    .with_poll_interval(std::time::Duration::from_millis(50)),
                loads: AtomicU64::new(0),
                changes: AtomicU64::new(0),
            });
            let node = crate::support::NodeSide::with_source(
                &cluster.dir.path().join("node-a"),
                "node-a",
                source.clone(),
            );
            let stage = stage_request(
                "vol-rot",
                &node.staging("vol-rot"),
                Mode::MultiNodeMultiWriter,
                cluster.context("rwx"),
            );
            node.owner.stage(&stage).await.unwrap();
            let target = node.target("pod");
            node.owner
                .publish(&publish_request(&stage, &target, false))
                .await
                .unwrap();

            // A writer and reader that never stops: every write verified by a read.
            let stop = Arc::new(AtomicBool::new(false));
            let rounds = Arc::new(AtomicU64::new(0));
            let io = std::thread::spawn({
                let (stop, rounds, target) = (stop.clone(), rounds.clone(), target.clone());
                move || -> Result<(), String> {
                    let mut n = 0u64;
                    while !stop.load(Ordering::SeqCst) {
                        let data = format!("round {n}");
                        fs::write(target.join("f"), &data)
                            .map_err(|e| format!("write {n}: {e}"))?;
                        let read =
                            fs::read(target.join("f")).map_err(|e| format!("read {n}: {e}"))?;
                        if read != data.as_bytes() {
                            return Err(format!("round {n} read back {read:?}"));
                        }
                        n += 1;
                        rounds.store(n, Ordering::SeqCst);
                    }
                    Ok(())
                }
            });
            let volume = cluster.credentials.join("vol-rot");
            let tokens = cluster.worker.server().tokens();
            let progress = async |what: &str| {
                let from = rounds.load(Ordering::SeqCst);
                let start = std::time::Instant::now();
                while rounds.load(Ordering::SeqCst) < from + 20 {
                    assert!(!io.is_finished(), "the I/O stopped {what}");
                    assert!(
                        start.elapsed() < std::time::Duration::from_secs(20),
                        "no I/O {what}"
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            };
            progress("before the rotation").await;
            // The manager's order: the workers accept the new token, it appears as
            // next-token, the old one is retired, the new one becomes the token.
            tokens.replace([fusefs::testing::TOKEN, "rotated-token"]);
            fs::write(volume.join("next-token"), "rotated-token").unwrap();
            source.refreshed().await;
            progress("with both tokens accepted").await;
            tokens.replace(["rotated-token"]);
            progress("with only the new token accepted").await;
            fs::write(volume.join("token"), "rotated-token").unwrap();
            fs::remove_file(volume.join("next-token")).unwrap();
            source.refreshed().await;
            progress("after the rotation").await;

            stop.store(true, Ordering::SeqCst);
            io.join().unwrap().unwrap();
            node.owner
                .unpublish(&unpublish_request("vol-rot", &target))
                .await
                .unwrap();
            node.owner.unstage(&unstage_request(&stage)).await.unwrap();
        },
    );
}

#[test]
fn publish_unpublish_and_stats_refuse_what_is_not_theirs() {
    privileged(
        "publish_unpublish_and_stats_refuse_what_is_not_theirs",
        async || {
            let cluster = Cluster::start("vol-p", worker::AccessMode::Rwx).await;
            let node = cluster.node("node-a");
            let owner = &node.owner;
            let stage = stage_request(
                "vol-p",
                &node.staging("vol-p"),
                Mode::MultiNodeMultiWriter,
                cluster.context("rwx"),
            );
            owner.stage(&stage).await.unwrap();
            let target = node.target("pod");
            let foreign = node.target("foreign");
            fs::create_dir(&foreign).unwrap();
            rustix::mount::mount(
                "tmpfs",
                &foreign,
                "tmpfs",
                rustix::mount::MountFlags::empty(),
                c"",
            )
            .unwrap();
            let before = mounts_under(&node.kubelet);
            let outside = cluster.dir.path().join("outside");
            let with = |f: &dyn Fn(&mut NodePublishVolumeRequest)| {
                let mut req = publish_request(&stage, &target, false);
                f(&mut req);
                req
            };
            let cases: Vec<(&str, NodePublishVolumeRequest, Code)> = vec![
                (
                    "no staging path",
                    with(&|r| r.staging_target_path.clear()),
                    Code::FailedPrecondition,
                ),
                (
                    "a staging path that holds no stage",
                    with(&|r| {
                        r.staging_target_path = node.staging("elsewhere").display().to_string();
                    }),
                    Code::FailedPrecondition,
                ),
                (
                    "a target outside kubelet",
                    with(&|r| r.target_path = outside.display().to_string()),
                    Code::InvalidArgument,
                ),
                (
                    "a foreign mount at the target",
                    with(&|r| r.target_path = foreign.display().to_string()),
                    Code::FailedPrecondition,
                ),
                (
                    "secrets",
                    with(&|r| {
                        r.secrets = HashMap::from([("k".to_owned(), "hunter2".to_owned())]);
                    }),
                    Code::InvalidArgument,
                ),
                (
                    "another volume's context",
                    with(&|r| {
                        r.volume_context
                            .insert(context::GENERATION.to_owned(), "9".to_owned());
                    }),
                    Code::FailedPrecondition,
                ),
            ];
            for (what, req, expected) in cases {
                assert_eq!(code_of(owner.publish(&req).await), expected, "{what}");
                assert_eq!(
                    mounts_under(&node.kubelet),
                    before,
                    "{what}: the mount table"
                );
                assert!(!target.exists(), "{what}: no target made");
            }
            let stats = |path: &std::path::Path| NodeGetVolumeStatsRequest {
                volume_id: "vol-p".to_owned(),
                volume_path: path.display().to_string(),
                staging_target_path: String::new(),
            };
            assert_eq!(
                code_of(owner.volume_stats(&stats(&target)).await),
                Code::NotFound
            );
            assert_eq!(
                code_of(owner.volume_stats(&stats(&foreign)).await),
                Code::NotFound
            );
            assert_eq!(
                code_of(owner.unpublish(&unpublish_request("vol-p", &foreign)).await),
                Code::FailedPrecondition,
                "a foreign mount is never unmounted"
            );
            assert_eq!(mounts_under(&node.kubelet), before);
            // An absent target is unpublished already.
            owner
                .unpublish(&unpublish_request("vol-p", &target))
                .await
                .unwrap();
            rustix::mount::unmount(&foreign, rustix::mount::UnmountFlags::empty()).unwrap();
            owner.unstage(&unstage_request(&stage)).await.unwrap();
        },
    );
}
