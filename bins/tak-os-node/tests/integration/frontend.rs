//! The frontend/owner split: a frontend process killed with SIGKILL and restarted again and
//! again while a process writes a verified stream through a published target and another reads
//! it back; no I/O error, no byte lost, the same stage and the same lease epoch. And the
//! frontend's refusals: an owner that does not answer (UNAVAILABLE within the bound) and an
//! owner that serves another node (refused, never forwarded).
//!
//! The owner runs in this test process (served on its socket as the binary serves it); each
//! frontend is this test binary re-executed (`child_frontend_process`).

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::{NodeGetVolumeStatsRequest, ProbeRequest};
use tak_os_node::config::Cli;
use tonic::Code;

use crate::support::{
    Cluster, ServerProcess, ShowOnFailure, VerifiedStream, epoch_of, log_to, mount_id,
    mounts_under, owner_flags, privileged, publish_request, stage_request, unpublish_request,
    unstage_request, within,
};

const CHILD_ENV: &str = "TAK_OS_NODE_TEST_FRONTEND";

/// The most one step of the restart test may take: it normally takes milliseconds.
const STEP: Duration = Duration::from_secs(30);

fn cli(args: &[&str]) -> tak_os_node::config::Config {
    let mut all = vec!["tak-os-node", "--metrics-address", ""];
    all.extend_from_slice(args);
    <Cli as clap::Parser>::try_parse_from(all)
        .unwrap()
        .config()
        .unwrap()
}

/// Not a test on its own: the frontend tests re-execute this binary to run a frontend in a
/// child process. `TAK_OS_NODE_TEST_FRONTEND` holds, one per line: the CSI socket, the owner's
/// socket, the node ID.
#[test]
#[ignore = "a helper process of the frontend tests"]
fn child_frontend_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    // Logs go to the process's stderr, which the test keeps in a file.
    observe::init_logging(observe::LogFormat::Text);
    let lines: Vec<&str> = spec.lines().collect();
    let [csi, owner, node] = lines[..] else {
        panic!("malformed {CHILD_ENV}: {spec:?}");
    };
    let config = cli(&[
        "--csi-endpoint",
        &format!("unix://{csi}"),
        "--mount-service",
        &format!("unix://{owner}"),
        "--node-id",
        node,
    ]);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
        .block_on(tak_os_node::run_frontend(config, std::future::pending()))
        .unwrap();
}

/// A frontend process: this binary re-executed as `child_frontend_process`.
fn spawn_frontend(dir: &Path, name: &str, owner: &Path, node: &str) -> ServerProcess {
    let socket = dir.join(format!("{name}.sock"));
    let _ = fs::remove_file(&socket);
    let spec = [
        socket.display().to_string(),
        owner.display().to_string(),
        node.to_owned(),
    ];
    ServerProcess::spawn(
        "frontend::child_frontend_process",
        CHILD_ENV,
        &spec,
        socket,
        &dir.join("frontends.log"),
    )
}

#[test]
fn the_frontend_restarts_under_io_without_breaking_a_mount() {
    privileged(
        "the_frontend_restarts_under_io_without_breaking_a_mount",
        async || {
            let cluster = Cluster::start("vol-front", worker::AccessMode::Rwo).await;
            let dir = cluster.dir.path().to_owned();
            // The owner's and the frontends' logs, shown if the test fails, so that a failure
            // says where each process was.
            log_to(&dir.join("owner.log"));
            let _owner_log = ShowOnFailure(dir.join("owner.log"));
            let _frontend_log = ShowOnFailure(dir.join("frontends.log"));
            let node = cluster.node("node-a");
            let owner_socket = dir.join("owner.sock");
            let flags = owner_flags(&owner_socket, "node-a", &node.kubelet, &cluster.credentials);
            let config = <Cli as clap::Parser>::try_parse_from(
                std::iter::once("tak-os-node".to_owned()).chain(flags),
            )
            .unwrap()
            .config()
            .unwrap();
            let (stop_owner, stopped) = tokio::sync::oneshot::channel::<()>();
            let owner = tokio::spawn(tak_os_node::run(
                config,
                Arc::new(mounter::LinuxMounter::new()),
                Arc::new(tak_os_node::credentials::DirectorySource::new(
                    &cluster.credentials,
                )),
                async {
                    let _ = stopped.await;
                },
            ));

            // The owner task binds its socket when it first runs: wait for it, so that the
            // first forwarded call does not race the owner's start (kubelet would retry).
            let start = Instant::now();
            while !owner_socket.exists() {
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "the owner never listened"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let mut frontend = spawn_frontend(&dir, "csi", &owner_socket, "node-a");
            let mut client = NodeClient::new(frontend.channel().await);
            let staging = node.staging("vol-front");
            let stage = stage_request(
                "vol-front",
                &staging,
                Mode::SingleNodeWriter,
                cluster.context("rwo"),
            );
            within(
                STEP,
                "NodeStageVolume",
                client.node_stage_volume(stage.clone()),
            )
            .await
            .unwrap();
            let target = node.target("pod");
            within(
                STEP,
                "NodePublishVolume",
                client.node_publish_volume(publish_request(&stage, &target, false)),
            )
            .await
            .unwrap();
            let epoch = epoch_of(&staging);
            let stage_mount = mount_id(&staging);

            // A writer of a verified stream, and a reader that checks what is there so far.
            let stream = VerifiedStream::start(&target.join("stream"));
            let stats = NodeGetVolumeStatsRequest {
                volume_id: "vol-front".to_owned(),
                volume_path: target.display().to_string(),
                staging_target_path: String::new(),
            };

            stream.progress().await;
            for round in 0..5 {
                frontend.kill();
                // Kubelet's call while the frontend is down fails; its retry after the
                // restart succeeds.
                let down = within(
                    STEP,
                    &format!("round {round}: NodeGetVolumeStats to the killed frontend"),
                    client.node_get_volume_stats(stats.clone()),
                )
                .await;
                assert!(down.is_err(), "round {round}: the frontend is down");
                stream.progress().await;
                frontend = spawn_frontend(&dir, "csi", &owner_socket, "node-a");
                client = NodeClient::new(frontend.channel().await);
                let answer = within(
                    STEP,
                    &format!("round {round}: NodeGetVolumeStats after the restart"),
                    client.node_get_volume_stats(stats.clone()),
                )
                .await
                .unwrap();
                assert!(!answer.into_inner().volume_condition.unwrap().abnormal);
                stream.progress().await;
            }
            stream.finish();
            assert_eq!(epoch_of(&staging), epoch, "the lease epoch is unchanged");
            assert_eq!(mount_id(&staging), stage_mount, "no new stage");

            // An owner that does not answer: UNAVAILABLE within the bound, Probe not ready.
            let nowhere = spawn_frontend(&dir, "nowhere", &dir.join("absent.sock"), "node-a");
            let channel = nowhere.channel().await;
            let start = Instant::now();
            let mut unanswered = NodeClient::new(channel.clone());
            let status = within(
                STEP,
                "NodeGetVolumeStats with no owner",
                unanswered.node_get_volume_stats(stats.clone()),
            )
            .await
            .unwrap_err();
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{:?}",
                start.elapsed()
            );
            let mut identity = IdentityClient::new(channel);
            let probe = within(STEP, "Probe with no owner", identity.probe(ProbeRequest {})).await;
            assert_eq!(probe.unwrap_err().code(), Code::Unavailable);

            // An owner of another node: refused, never forwarded.
            let miswired = spawn_frontend(&dir, "miswired", &owner_socket, "node-z");
            let channel = miswired.channel().await;
            let mut refused = NodeClient::new(channel.clone());
            let status = within(
                STEP,
                "NodeUnpublishVolume to the other node's owner",
                refused.node_unpublish_volume(unpublish_request("vol-front", &target)),
            )
            .await
            .unwrap_err();
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
            assert!(status.message().contains("serves node"), "{status:?}");
            assert!(target.join("stream").exists(), "nothing was unpublished");
            let mut identity = IdentityClient::new(channel);
            let probe = within(
                STEP,
                "Probe to the other node's owner",
                identity.probe(ProbeRequest {}),
            )
            .await;
            assert!(probe.is_err());

            within(
                STEP,
                "NodeUnpublishVolume",
                client.node_unpublish_volume(unpublish_request("vol-front", &target)),
            )
            .await
            .unwrap();
            within(
                STEP,
                "NodeUnstageVolume",
                client.node_unstage_volume(unstage_request(&stage)),
            )
            .await
            .unwrap();
            assert!(mounts_under(&node.kubelet).is_empty());
            drop((nowhere, miswired, frontend));
            let _ = stop_owner.send(());
            within(STEP, "the owner's shutdown", owner)
                .await
                .unwrap()
                .unwrap();
        },
    );
}
