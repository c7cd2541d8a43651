//! The replicated part of the demo: a worker group (leader with the reference CSI controller,
//! and a follower) keeps its state on a local volume published to it as a trusted consumer;
//! the controller creates an RWO volume; the node's frontend and mount owner (with a keeper
//! holding copies of its FUSE connections) stage it and publish it to two pods; a writer
//! streams through one publication while the frontend is killed and restarted, again while
//! the mount owner is upgraded (it hands the stage over to the keeper, the next owner takes it
//! back), and again while the mount owner is killed (a successor takes the stage over from the
//! keeper), and each stream is read back whole through the other publication; then everything
//! is unpublished, unstaged (the lease released), owner and keeper are killed together (the
//! mount ends cleanly), and everything is deleted and stopped.
//!
//! Every process is this executable run with a hidden subcommand (`serve-worker`,
//! `serve-node`), serving the same library its own binary serves.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use csi_proto::v1::controller_client::ControllerClient;
use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_proto::v1::*;
use replicated_contract::context::VolumeContext;
use tak_os_local_csi::config::LogFormat;
use tonic::transport::Channel;

use crate::driver::{NODE_ID, ServiceProcess, Stopped};
use crate::report::{Done, Failure, Report};
use crate::scenario::{
    mount_summary, path_string, plugin_info, rpc, size, unpublish, wait_for_socket,
};
use crate::workspace::Workspace;

/// The replicated volume the demo creates.
pub const REPLICATED_VOLUME: &str = "pvc-replicated";
/// The local volume that holds the worker group's state.
pub const STATE_VOLUME: &str = "pvc-worker-state";
/// The namespace the node reads credentials from (here: the credentials directory stands in).
const CREDENTIAL_NAMESPACE: &str = "tak-os-system";
/// The replicated node's driver name.
const NODE_DRIVER: &str = "csi.replicated.tak-os.org";
/// The state volume's size; the demo's writes fit in it with room to spare.
const STATE_REQUIRED_BYTES: i64 = 192 << 20;
/// The trusted consumer target of the state volume: `<consumers>/<generation>/<replica>/mount`.
const CONSUMER_GENERATION: &str = "demo";
const CONSUMER_REPLICA: &str = "r0";
/// The pods of the replicated volume.
const WRITER_POD: &str = "pod-replicated-writer";
const READER_POD: &str = "pod-replicated-reader";
/// The file written and read through the two publications.
const FILE_NAME: &str = "hello.txt";
const CONTENT: &[u8] =
    b"written on one pod's target, read on the other's, kept by the worker group\n";
/// The file the writer streams into while the frontend restarts.
const STREAM_FILE: &str = "stream.bin";
/// The file the writer streams into while the mount owner is upgraded.
const UPGRADE_STREAM_FILE: &str = "upgrade-stream.bin";
/// The stream written while the mount owner is killed and its successor takes over.
const CRASH_STREAM_FILE: &str = "crash-stream.bin";
/// One write of the stream.
const CHUNK_BYTES: usize = 64 << 10;
/// The stream stops here even if the restart takes long.
const STREAM_LIMIT: u64 = 96 << 20;
/// How long the writer runs before the frontend is killed, and after it is ready again.
const STREAM_MARGIN: Duration = Duration::from_millis(400);
/// The longest pause between two writes that still counts as "no gap".
const LONGEST_PAUSE_ALLOWED: Duration = Duration::from_secs(2);
/// How long a process may take to be ready.
const READY_WAIT: Duration = Duration::from_secs(15);
/// How often readiness is polled.
const POLL: Duration = Duration::from_millis(20);
/// How long an owner told to stop may take to hand its stages over and exit (its
/// `--handoff-deadline-seconds` is 10 s) before it is killed.
const OWNER_STOP_GRACE: Duration = Duration::from_secs(20);

/// The processes of the replicated part and where they listen.
#[derive(Debug, Default)]
pub struct Processes {
    /// The worker group's leader, serving the reference controller.
    pub leader: Option<ServiceProcess>,
    /// The follower.
    pub follower: Option<ServiceProcess>,
    /// The node's FUSE keeper: it holds a copy of every stage's FUSE connection, so that an
    /// owner upgrade keeps the mounts.
    pub keeper: Option<ServiceProcess>,
    /// The node's mount owner.
    pub owner: Option<ServiceProcess>,
    /// The node's kubelet-facing frontend.
    pub frontend: Option<ServiceProcess>,
    /// Where the owner serves metrics.
    pub owner_metrics: Option<SocketAddr>,
    /// Where the frontend serves metrics.
    pub frontend_metrics: Option<SocketAddr>,
    /// The worker endpoints, leader first.
    pub endpoints: Vec<SocketAddr>,
}

impl Processes {
    /// The running processes, stopped in reverse start order: the frontend before the owner,
    /// the owner before the keeper, the node before the workers.
    pub fn in_stop_order(&mut self) -> Vec<(&'static str, ServiceProcess)> {
        [
            ("frontend", self.frontend.take()),
            ("mount owner", self.owner.take()),
            ("keeper", self.keeper.take()),
            ("follower", self.follower.take()),
            ("leader", self.leader.take()),
        ]
        .into_iter()
        .filter_map(|(name, process)| process.map(|p| (name, p)))
        .collect()
    }
}

/// Where the workers keep their state.
#[derive(Debug)]
pub enum StateHost {
    /// A local volume published to the worker group as a trusted consumer.
    LocalVolume {
        /// The local volume's ID.
        volume_id: String,
        /// Its consumer target, the workers' state directory.
        target: PathBuf,
    },
    /// A plain directory (`--replicated-only`).
    Directory(PathBuf),
}

impl StateHost {
    fn dir(&self) -> &Path {
        match self {
            StateHost::LocalVolume { target, .. } => target,
            StateHost::Directory(dir) => dir,
        }
    }
}

/// The workspace's files of the replicated part.
struct Files<'a>(&'a Workspace);

impl Files<'_> {
    fn worker(&self, name: &str) -> PathBuf {
        self.0.worker_dir().join(name)
    }
    fn node(&self, name: &str) -> PathBuf {
        self.0.node_dir().join(name)
    }
    fn credentials(&self) -> PathBuf {
        self.worker("credentials")
    }
    fn controller_socket(&self) -> PathBuf {
        self.worker("controller.sock")
    }
    fn owner_socket(&self) -> PathBuf {
        self.node("owner.sock")
    }
    fn frontend_socket(&self) -> PathBuf {
        self.node("csi.sock")
    }
    fn keeper_socket(&self) -> PathBuf {
        self.node("keeper.sock")
    }
    fn staging(&self) -> PathBuf {
        self.0
            .kubelet_root()
            .join("plugins/kubernetes.io/csi")
            .join(NODE_DRIVER)
            .join("demo")
            .join("globalmount")
    }
}

/// The logs of the replicated part, for `--keep` and failures.
pub fn logs(workspace: &Workspace) -> Vec<(&'static str, PathBuf)> {
    let files = Files(workspace);
    vec![
        ("leader", files.worker("leader.log")),
        ("follower", files.worker("follower.log")),
        ("keeper", files.node("keeper.log")),
        ("mount owner", files.node("owner.log")),
        ("frontend", files.node("frontend.log")),
    ]
}

/// The sockets of the replicated part, for `--keep`.
pub fn sockets(workspace: &Workspace) -> Vec<(&'static str, PathBuf)> {
    let files = Files(workspace);
    vec![
        ("reference controller", files.controller_socket()),
        ("node (frontend)", files.frontend_socket()),
        ("mount service (owner)", files.owner_socket()),
        ("keeper", files.keeper_socket()),
    ]
}

/// Creates the local volume that holds the worker group's state and publishes it to the
/// group as a trusted consumer, over the local driver's socket.
pub async fn host_state_on_local_volume(
    report: &mut Report<'_>,
    workspace: &Workspace,
) -> Result<StateHost, Failure> {
    let channel = report
        .step("connect to the local driver again", async {
            let channel = csi_proto::connect_unix(workspace.socket())
                .await
                .map_err(|e| e.to_string())?;
            Ok(Done::said(format!("unix://{}", workspace.socket().display())).map(|()| channel))
        })
        .await?;
    let mut node = NodeClient::new(channel.clone());
    let mut controller = ControllerClient::new(channel);
    let volume = report
        .step(
            &format!(
                "CreateVolume {STATE_VOLUME} on the local driver (192 MiB) for the worker group"
            ),
            async {
                let info = rpc(node.node_get_info(NodeGetInfoRequest {})).await?;
                let topology = info
                    .accessible_topology
                    .ok_or_else(|| "NodeGetInfo has no topology".to_owned())?;
                let created = rpc(controller.create_volume(CreateVolumeRequest {
                    name: STATE_VOLUME.to_owned(),
                    capacity_range: Some(CapacityRange {
                        required_bytes: STATE_REQUIRED_BYTES,
                        limit_bytes: 0,
                    }),
                    volume_capabilities: vec![crate::scenario::capability()],
                    accessibility_requirements: Some(TopologyRequirement {
                        requisite: vec![topology.clone()],
                        preferred: vec![topology],
                    }),
                    ..Default::default()
                }))
                .await?;
                let volume = created
                    .volume
                    .ok_or_else(|| "the response has no volume".to_owned())?;
                Ok(Done::said(format!(
                    "volume id {}, capacity {}",
                    volume.volume_id,
                    size(volume.capacity_bytes)
                ))
                .map(|()| volume))
            },
        )
        .await?;
    let target = workspace
        .consumers()
        .join(CONSUMER_GENERATION)
        .join(CONSUMER_REPLICA)
        .join("mount");
    let request = NodePublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        target_path: path_string(&target),
        volume_capability: Some(crate::scenario::capability()),
        volume_context: volume.volume_context.clone(),
        ..Default::default()
    };
    report
        .step(
            "NodePublishVolume to the worker group as a trusted consumer",
            async {
                // The consumer makes <generation>/<replica>; the driver makes `mount`.
                if let Some(parent) = target.parent() {
                    std::fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o700)
                        .create(parent)
                        .map_err(|e| format!("the consumer's part, creating {parent:?}: {e}"))?;
                }
                rpc(node.node_publish_volume(request)).await?;
                let mounted = mount_summary(&target)?;
                Ok(Done::said(target.display().to_string())
                    .detail(format!("mounted {mounted}"))
                    .detail("the volume is claimed: kubelet and other consumers are refused it"))
            },
        )
        .await?;
    Ok(StateHost::LocalVolume {
        volume_id: volume.volume_id,
        target,
    })
}

/// Unpublishes the workers' local volume (releasing the claim) and deletes it.
pub async fn release_local_state(
    report: &mut Report<'_>,
    workspace: &Workspace,
    host: &StateHost,
) -> Result<(), Failure> {
    let StateHost::LocalVolume { volume_id, target } = host else {
        return Ok(());
    };
    let channel = csi_proto::connect_unix(workspace.socket())
        .await
        .map_err(|e| Failure::new("connect to the local driver", e))?;
    let mut node = NodeClient::new(channel.clone());
    let mut controller = ControllerClient::new(channel);
    report
        .step("NodeUnpublishVolume the trusted consumer's target", async {
            rpc(node.node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: volume_id.clone(),
                target_path: path_string(target),
            }))
            .await?;
            if target.exists() {
                return Err(format!("{target:?} still exists"));
            }
            Ok(Done::said("unmounted; the claim is released"))
        })
        .await?;
    report
        .step(&format!("DeleteVolume {STATE_VOLUME}"), async {
            rpc(controller.delete_volume(DeleteVolumeRequest {
                volume_id: volume_id.clone(),
                secrets: HashMap::new(),
            }))
            .await?;
            Ok(Done::said(
                "the worker group's state is gone with the local volume",
            ))
        })
        .await?;
    Ok(())
}

/// Runs the replicated part: starts the worker group and the node, and drives them.
pub async fn run(
    report: &mut Report<'_>,
    workspace: &Workspace,
    host: &StateHost,
    processes: &mut Processes,
    log_format: LogFormat,
) -> Result<(), Failure> {
    let files = Files(workspace);
    let log_format = crate::driver::log_format_name(log_format);
    report.sync_step(
        "make a test CA, the workers' and the node's certificates and a token",
        || {
            write_pki(&files).map_err(|e| format!("{e:#}"))?;
            Ok(Done::said(format!(
                "{} (ca.pem, server.pem, client.pem, token)",
                workspace.worker_dir().display()
            )))
        },
    )?;

    report.sync_step(
        "start the worker group: a leader with the reference controller, and a follower",
        || {
            let leader = crate::free_local_port().map_err(|e| e.to_string())?;
            let follower = crate::free_local_port().map_err(|e| e.to_string())?;
            processes.endpoints = vec![leader, follower];
            let group = format!("https://{leader},https://{follower}");
            let tls = |args: &mut Vec<OsString>| {
                for (flag, file) in [
                    ("--cert", "server.pem"),
                    ("--key", "server.key"),
                    ("--client-ca", "ca.pem"),
                    ("--token-file", "token"),
                ] {
                    args.push(flag.into());
                    args.push(files.worker(file).into());
                }
                args.push("--log-format".into());
                args.push(log_format.into());
            };
            let mut leader_args: Vec<OsString> = vec![
                "--listen".into(),
                leader.to_string().into(),
                "--state-dir".into(),
                host.dir().into(),
                "--csi-endpoint".into(),
                unix(&files.controller_socket()),
                "--group-endpoint".into(),
                group.clone().into(),
                "--credential-namespace".into(),
                CREDENTIAL_NAMESPACE.into(),
                "--credentials-dir".into(),
                files.credentials().into(),
                "--credentials-ca".into(),
                files.worker("ca.pem").into(),
                "--credentials-cert".into(),
                files.worker("client.pem").into(),
                "--credentials-key".into(),
                files.worker("client.key").into(),
            ];
            tls(&mut leader_args);
            let mut follower_args: Vec<OsString> = vec![
                "--listen".into(),
                follower.to_string().into(),
                "--follow".into(),
                leader.to_string().into(),
            ];
            tls(&mut follower_args);
            let [leader_log, follower_log] =
                [files.worker("leader.log"), files.worker("follower.log")];
            let spawned = ServiceProcess::spawn_self("serve-worker", leader_args, &leader_log)
                .map_err(|e| format!("{e:#}"))?;
            let leader_pid = spawned.pid();
            processes.leader = Some(spawned);
            let spawned = ServiceProcess::spawn_self("serve-worker", follower_args, &follower_log)
                .map_err(|e| format!("{e:#}"))?;
            let follower_pid = spawned.pid();
            processes.follower = Some(spawned);
            Ok(Done::said(format!(
                "leader pid {leader_pid} on https://{leader}, state in {}",
                host.dir().display()
            ))
            .detail(format!("follower pid {follower_pid} on https://{follower}"))
            .detail(format!(
                "logs {} and {}",
                leader_log.display(),
                follower_log.display()
            )))
        },
    )?;

    let channel = report
        .step(
            "wait for the reference controller's socket",
            wait_for_socket(&files.controller_socket(), leader(processes)?),
        )
        .await?;
    let mut identity = IdentityClient::new(channel.clone());
    let mut controller = ControllerClient::new(channel);
    report
        .step(
            "GetPluginInfo (reference controller)",
            plugin_info(&mut identity, NODE_DRIVER),
        )
        .await?;

    let create = CreateVolumeRequest {
        name: REPLICATED_VOLUME.to_owned(),
        capacity_range: Some(CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![rwo_capability()],
        parameters: HashMap::from([("accessMode".to_owned(), "rwo".to_owned())]),
        ..Default::default()
    };
    let volume = report
        .step(
            &format!("CreateVolume {REPLICATED_VOLUME} (accessMode rwo, SINGLE_NODE_WRITER) through the reference controller"),
            async {
                let created = rpc(controller.create_volume(create.clone())).await?;
                let volume = created.volume.ok_or_else(|| "the response has no volume".to_owned())?;
                let context = VolumeContext::parse(&volume.volume_context, CREDENTIAL_NAMESPACE)
                    .map_err(|e| format!("the volume context breaks the node's contract: {e}"))?;
                let credentials = files.credentials().join(&volume.volume_id);
                if !credentials.join("token").is_file() {
                    return Err(format!("no credentials were written to {credentials:?}"));
                }
                let state = host.dir().join("volumes").join(&volume.volume_id);
                if !state.is_dir() {
                    return Err(format!("the leader has no state for it at {state:?}"));
                }
                Ok(Done::said(format!(
                    "generation {}, access mode {}, endpoints {}",
                    context.generation,
                    context.mode,
                    context.endpoint_urls.join(" ")
                ))
                .detail(format!("volume state {}", state.display()))
                .detail(format!("credentials for the node in {}", credentials.display()))
                .map(|()| volume))
            },
        )
        .await?;
    report
        .step(
            "CreateVolume again (idempotent: the same generation)",
            async {
                let again = rpc(controller.create_volume(create.clone())).await?;
                if again.volume.as_ref() != Some(&volume) {
                    return Err(format!("a different volume came back: {:?}", again.volume));
                }
                Ok(Done::said("the same volume and volume context"))
            },
        )
        .await?;

    report
        .step(
            "start the FUSE keeper: it will hold a copy of every stage's /dev/fuse descriptor",
            start_keeper(&files, processes, log_format),
        )
        .await?;
    report.sync_step(
        "start the node: the mount owner, and the frontend kubelet talks to",
        || {
            let owner_metrics = crate::free_local_port().map_err(|e| e.to_string())?;
            let owner = ServiceProcess::spawn_self(
                "serve-node",
                owner_args(&files, owner_metrics, log_format),
                &files.node("owner.log"),
            )
            .map_err(|e| format!("{e:#}"))?;
            let owner_pid = owner.pid();
            processes.owner = Some(owner);
            processes.owner_metrics = Some(owner_metrics);
            let frontend = start_frontend(&files, processes, log_format)?;
            Ok(Done::said(format!(
                "mount owner pid {owner_pid} serving unix://{}, depositing its stages with the keeper",
                files.owner_socket().display()
            ))
            .detail(format!(
                "frontend pid {} serving unix://{} (--mount-service unix://{})",
                frontend,
                files.frontend_socket().display(),
                files.owner_socket().display()
            )))
        },
    )?;

    let channel = report
        .step(
            "wait until the frontend is ready (Probe answers through the owner)",
            ready(&files.frontend_socket(), frontend(processes)?),
        )
        .await?;
    let mut node = NodeClient::new(channel);
    report
        .step("NodeGetInfo through the frontend", async {
            let info = rpc(node.node_get_info(NodeGetInfoRequest {})).await?;
            if info.node_id != NODE_ID {
                return Err(format!("node_id {:?}, expected {NODE_ID:?}", info.node_id));
            }
            Ok(Done::said(format!(
                "node id {} (no topology: any node can mount)",
                info.node_id
            )))
        })
        .await?;

    let staging = files.staging();
    let stage = NodeStageVolumeRequest {
        volume_id: volume.volume_id.clone(),
        staging_target_path: path_string(&staging),
        volume_capability: Some(rwo_capability()),
        volume_context: volume.volume_context.clone(),
        ..Default::default()
    };
    let (stage_mount, epoch) = report
        .step(
            "NodeStageVolume: the one FUSE mount, and the RWO lease",
            async {
                std::fs::create_dir_all(&staging)
                    .map_err(|e| format!("kubelet's part, creating {staging:?}: {e}"))?;
                rpc(node.node_stage_volume(stage.clone())).await?;
                let mounted = mount_summary(&staging)?;
                let id = mount_id(&staging)?;
                let (line, epoch) = claimed(&files.node("owner.log"), 1)?;
                Ok(Done::said(staging.display().to_string())
                    .detail(format!("mounted {mounted} (mount id {id})"))
                    .detail(format!("owner log: {line}"))
                    .map(|()| (id, epoch)))
            },
        )
        .await?;

    let writer = workspace.target(WRITER_POD, REPLICATED_VOLUME);
    let reader = workspace.target(READER_POD, REPLICATED_VOLUME);
    for (target, readonly) in [(&writer, false), (&reader, true)] {
        let how = if readonly { "read-only" } else { "read-write" };
        let request = NodePublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            staging_target_path: stage.staging_target_path.clone(),
            target_path: path_string(target),
            volume_capability: Some(rwo_capability()),
            readonly,
            volume_context: volume.volume_context.clone(),
            ..Default::default()
        };
        report
            .step(
                &format!("NodePublishVolume {how} (a bind mount of the stage)"),
                async {
                    workspace.create_target_parent(target).map_err(|e| {
                        format!("kubelet's part, creating the target's parent: {e}")
                    })?;
                    rpc(node.node_publish_volume(request)).await?;
                    let mounted = mount_summary(target)?;
                    Ok(Done::said(target.display().to_string())
                        .detail(format!("mounted {mounted}")))
                },
            )
            .await?;
    }

    report.sync_step(
        "write through one pod's target, read through the other's",
        || {
            let written = writer.join(FILE_NAME);
            std::fs::write(&written, CONTENT).map_err(|e| format!("writing {written:?}: {e}"))?;
            let read_path = reader.join(FILE_NAME);
            let read =
                std::fs::read(&read_path).map_err(|e| format!("reading {read_path:?}: {e}"))?;
            if read != CONTENT {
                return Err(format!(
                    "read {} bytes that differ from the {} written",
                    read.len(),
                    CONTENT.len()
                ));
            }
            let stored = host
                .dir()
                .join("volumes")
                .join(&volume.volume_id)
                .join("data")
                .join(FILE_NAME);
            let kept = std::fs::read(&stored).map_err(|e| format!("reading {stored:?}: {e}"))?;
            if kept != CONTENT {
                return Err(format!("the leader's copy at {stored:?} differs"));
            }
            Ok(Done::said(format!(
                "{} bytes via {WRITER_POD}, the same bytes via {READER_POD}",
                CONTENT.len()
            ))
            .detail(format!("kept by the leader at {}", stored.display())))
        },
    )?;

    let published = Published {
        staging: staging.clone(),
        writer: writer.clone(),
        reader: reader.clone(),
        mount: stage_mount,
        epoch: epoch.clone(),
        log: files.node("owner.log"),
    };
    let restart = report
        .step(
            "kill the frontend (SIGKILL) and start a new one while a writer streams",
            restart_frontend_under_writer(&files, processes, log_format, &writer),
        )
        .await?;
    let mut node = NodeClient::new(restart.channel.clone());
    report.sync_step(
        "the stream is whole: every byte read back through the other pod",
        || published.stream_kept(STREAM_FILE, restart.written),
    )?;

    let written = report
        .step(
            "upgrade the mount owner (SIGTERM: it hands the stage over to the keeper) while a writer streams",
            upgrade_owner_under_writer(&files, processes, log_format, &restart.channel, &writer),
        )
        .await?;
    report
        .step(
            "after the upgrade: the stream is whole, and the new owner serves the stage it took back",
            async {
                let done = published.stream_kept(UPGRADE_STREAM_FILE, written)?;
                let stats = rpc(node.node_get_volume_stats(NodeGetVolumeStatsRequest {
                    volume_id: volume.volume_id.clone(),
                    volume_path: path_string(&writer),
                    staging_target_path: stage.staging_target_path.clone(),
                }))
                .await?;
                let condition = stats
                    .volume_condition
                    .ok_or_else(|| "NodeGetVolumeStats reports no condition".to_owned())?;
                if condition.abnormal {
                    return Err(format!(
                        "NodeGetVolumeStats through the new owner: abnormal: {}",
                        condition.message
                    ));
                }
                let (handed, taken) = handed_over_and_taken_back(&published.log, &epoch)?;
                Ok(done
                    .detail(format!(
                        "NodeGetVolumeStats through the new owner: {}",
                        condition.message
                    ))
                    .detail(format!("the old owner's log: {handed}"))
                    .detail(format!("the new owner's log: {taken}")))
            },
        )
        .await?;

    let written = report
        .step(
            "kill the mount owner (SIGKILL: no hand-over) while a writer streams: a successor takes the stage over",
            crash_owner_under_writer(&files, processes, log_format, &restart.channel, &writer),
        )
        .await?;
    report
        .step(
            "after the crash: the stream is whole, and the successor serves the stage",
            async {
                let done = published.stream_kept(CRASH_STREAM_FILE, written)?;
                let taken = log_lines(&published.log, "took a handed-over stage back")?
                    .into_iter()
                    .rfind(|line| log_field(line, "crashed") == Some("true"))
                    .ok_or_else(|| {
                        "the owners' log shows no successor taking over a crashed owner's stage"
                            .to_owned()
                    })?;
                Ok(done.detail(format!("the successor's log: {taken}")))
            },
        )
        .await?;

    for (target, pod) in [(&writer, WRITER_POD), (&reader, READER_POD)] {
        report
            .step(
                &format!("NodeUnpublishVolume ({pod})"),
                unpublish(&mut node, &volume.volume_id, target),
            )
            .await?;
    }

    report
        .step("NodeUnstageVolume: unmount, release the lease", async {
            rpc(node.node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: volume.volume_id.clone(),
                staging_target_path: stage.staging_target_path.clone(),
            }))
            .await?;
            if mount_id(&staging).is_ok() {
                return Err(format!("{staging:?} is still mounted"));
            }
            let released = released(&files.node("owner.log"), &epoch)?;
            Ok(Done::said("the stage is unmounted").detail(format!("owner log: {released}")))
        })
        .await?;

    owner_killed(
        report, &files, processes, log_format, &mut node, &stage, &writer,
    )
    .await?;

    let delete = DeleteVolumeRequest {
        volume_id: volume.volume_id.clone(),
        secrets: HashMap::new(),
    };
    report
        .step(
            &format!("DeleteVolume {REPLICATED_VOLUME} through the reference controller"),
            async {
                rpc(controller.delete_volume(delete.clone())).await?;
                let state = host.dir().join("volumes").join(&volume.volume_id);
                if state.exists() {
                    return Err(format!("the leader still has {state:?}"));
                }
                let credentials = files.credentials().join(&volume.volume_id);
                if credentials.exists() {
                    return Err(format!("the credentials remain in {credentials:?}"));
                }
                Ok(Done::said(
                    "the volume's state, data and credentials are gone",
                ))
            },
        )
        .await?;
    report
        .step("DeleteVolume again (idempotent)", async {
            rpc(controller.delete_volume(delete.clone())).await?;
            Ok(Done::said("OK for a deleted volume"))
        })
        .await?;
    Ok(())
}

/// What a user sees when the mount owner and the keeper die together (a node's processes all
/// killed): the volume staged again (the released lease claimed at once), published, both
/// killed, the last copy of the FUSE connection closed with them so the target answers
/// ENOTCONN (no caller hangs), a keeper and a new owner started, and the dead stage
/// unpublished and unstaged through it, the lease released with the epoch of the session
/// record.
///
/// The new owner is started while the demo holds no file on the mount (the dead read has
/// returned): see [`upgrade_owner_under_writer`] for why that matters.
async fn owner_killed(
    report: &mut Report<'_>,
    files: &Files<'_>,
    processes: &mut Processes,
    log_format: &str,
    node: &mut NodeClient<Channel>,
    stage: &NodeStageVolumeRequest,
    target: &Path,
) -> Result<(), Failure> {
    let log = files.node("owner.log");
    report.say(format_args!(
        "-- the mount owner and the keeper killed together (SIGKILL): nothing holds the FUSE connection, so its mounts end cleanly"
    ));
    let epoch = report
        .step(
            "NodeStageVolume again: the released lease is claimed at once",
            async {
                rpc(node.node_stage_volume(stage.clone())).await?;
                let (line, epoch) = claimed(&log, 2)?;
                Ok(Done::said(format!("owner log: {line}")).map(|()| epoch))
            },
        )
        .await?;
    let publish = NodePublishVolumeRequest {
        volume_id: stage.volume_id.clone(),
        staging_target_path: stage.staging_target_path.clone(),
        target_path: path_string(target),
        volume_capability: stage.volume_capability.clone(),
        volume_context: stage.volume_context.clone(),
        ..Default::default()
    };
    report
        .step("NodePublishVolume read-write", async {
            rpc(node.node_publish_volume(publish)).await?;
            let file = target.join(FILE_NAME);
            std::fs::write(&file, CONTENT).map_err(|e| format!("writing {file:?}: {e}"))?;
            Ok(Done::said(format!("{} written through it", file.display())))
        })
        .await?;
    let killed_at = Instant::now();
    report.sync_step("kill the mount owner and the keeper (SIGKILL)", || {
        let mut pids = Vec::new();
        for process in [processes.owner.take(), processes.keeper.take()] {
            let mut process = process.ok_or_else(|| "not started".to_owned())?;
            pids.push(process.pid());
            process.kill().map_err(|e| format!("{e:#}"))?;
        }
        let seen = access_dead_mount(&target.join(FILE_NAME))?;
        Ok(Done::said(format!("pids {pids:?} killed"))
            .detail(format!("a read through the pod's target: {seen}")))
    })?;
    report
        .step(
            "start a new keeper",
            start_keeper(files, processes, log_format),
        )
        .await?;
    report.sync_step("start a new mount owner", || {
        let metrics = processes
            .owner_metrics
            .ok_or_else(|| "the owner's metrics address is unknown".to_owned())?;
        let owner = ServiceProcess::spawn_self_appending(
            "serve-node",
            owner_args(files, metrics, log_format),
            &log,
        )
        .map_err(|e| format!("{e:#}"))?;
        let pid = owner.pid();
        processes.owner = Some(owner);
        Ok(Done::said(format!("pid {pid}, the same flags")))
    })?;
    let unpublish = NodeUnpublishVolumeRequest {
        volume_id: stage.volume_id.clone(),
        target_path: path_string(target),
    };
    let unstage = NodeUnstageVolumeRequest {
        volume_id: stage.volume_id.clone(),
        staging_target_path: stage.staging_target_path.clone(),
    };
    let staging = PathBuf::from(&stage.staging_target_path);
    report
        .step(
            "NodeUnpublishVolume and NodeUnstageVolume through the new owner",
            async {
                // Kubelet retries while the new owner starts: UNAVAILABLE until it serves.
                let deadline = Instant::now() + READY_WAIT;
                loop {
                    match rpc(node.node_unpublish_volume(unpublish.clone())).await {
                        Ok(_) => break,
                        Err(error)
                            if Instant::now() < deadline && error.starts_with("Unavailable") =>
                        {
                            tokio::time::sleep(POLL).await;
                        }
                        Err(error) => return Err(error),
                    }
                }
                rpc(node.node_unstage_volume(unstage)).await?;
                let clean = killed_at.elapsed();
                if target.exists() {
                    return Err(format!("the target {target:?} still exists"));
                }
                if mount_id(&staging).is_ok() {
                    return Err(format!("{staging:?} is still mounted"));
                }
                let released = released(&log, &epoch)?;
                Ok(Done::said(format!(
                    "{:.1} ms from the kill to a clean unstage (owner kill to clean unstage)",
                    ms(clean)
                ))
                .detail("nothing is left mounted")
                .detail(format!("owner log: {released}")))
            },
        )
        .await?;
    Ok(())
}

/// Reads `path` through a dead FUSE mount on a thread of its own, so that even an unexpected
/// hang cannot stop the demo; says what the reader saw.
fn access_dead_mount(path: &Path) -> Result<String, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = path.to_owned();
    std::thread::Builder::new()
        .name("demo-dead-read".into())
        .spawn(move || {
            let _ = tx.send(std::fs::read(&path).map(|bytes| bytes.len()));
        })
        .map_err(|e| format!("cannot start the reader: {e}"))?;
    match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(Err(e)) if dead_connection(&e) => Ok(format!("{e}")),
        Ok(Err(e)) => Err(format!(
            "the read failed, but not with ENOTCONN or ECONNABORTED: {e}"
        )),
        Ok(Ok(n)) => Err(format!("the read through a dead mount returned {n} bytes")),
        Err(_) => Err("the read through the dead mount hung for 5 s".to_owned()),
    }
}

/// What the kernel answers on a FUSE mount whose connection is gone.
fn dead_connection(error: &std::io::Error) -> bool {
    use rustix::io::Errno;
    [Errno::NOTCONN, Errno::CONNABORTED]
        .iter()
        .any(|errno| error.raw_os_error() == Some(errno.raw_os_error()))
}

fn leader(processes: &mut Processes) -> Result<&mut ServiceProcess, Failure> {
    processes
        .leader
        .as_mut()
        .ok_or_else(|| Failure::new("the leader", "it was not started"))
}

fn frontend(processes: &mut Processes) -> Result<&mut ServiceProcess, Failure> {
    processes
        .frontend
        .as_mut()
        .ok_or_else(|| Failure::new("the frontend", "it was not started"))
}

fn unix(path: &Path) -> OsString {
    let mut endpoint = OsString::from("unix://");
    endpoint.push(path);
    endpoint
}

fn rwo_capability() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// The mount owner's command line: every owner the demo starts (the first, the upgrade's
/// successor, the one after the kill) gets the same flags.
fn owner_args(files: &Files<'_>, metrics: SocketAddr, log_format: &str) -> Vec<OsString> {
    vec![
        "--csi-endpoint".into(),
        unix(&files.owner_socket()),
        "--node-id".into(),
        NODE_ID.into(),
        "--kubelet-root".into(),
        files.0.kubelet_root().into(),
        "--credentials-dir".into(),
        files.credentials().into(),
        "--credential-namespace".into(),
        CREDENTIAL_NAMESPACE.into(),
        "--metrics-address".into(),
        metrics.to_string().into(),
        "--keeper-socket".into(),
        files.keeper_socket().into(),
        "--log-format".into(),
        log_format.into(),
    ]
}

/// Starts a frontend; returns its PID.
fn start_frontend(
    files: &Files<'_>,
    processes: &mut Processes,
    log_format: &str,
) -> Result<u32, String> {
    let metrics = crate::free_local_port().map_err(|e| e.to_string())?;
    let args: Vec<OsString> = vec![
        "--csi-endpoint".into(),
        unix(&files.frontend_socket()),
        "--mount-service".into(),
        unix(&files.owner_socket()),
        "--node-id".into(),
        NODE_ID.into(),
        "--kubelet-root".into(),
        files.0.kubelet_root().into(),
        "--metrics-address".into(),
        metrics.to_string().into(),
        "--log-format".into(),
        log_format.into(),
    ];
    let log = files.node("frontend.log");
    // A restarted frontend appends to the same log.
    let frontend = ServiceProcess::spawn_self_appending("serve-node", args, &log)
        .map_err(|e| format!("{e:#}"))?;
    let pid = frontend.pid();
    processes.frontend = Some(frontend);
    processes.frontend_metrics = Some(metrics);
    Ok(pid)
}

/// Starts the FUSE keeper and waits until it listens on its socket.
async fn start_keeper(
    files: &Files<'_>,
    processes: &mut Processes,
    log_format: &str,
) -> Result<Done<()>, String> {
    let socket = files.keeper_socket();
    let log = files.node("keeper.log");
    let args: Vec<OsString> = vec![
        "--keeper".into(),
        "--keeper-socket".into(),
        socket.clone().into(),
        "--metrics-address".into(),
        "".into(),
        "--log-format".into(),
        log_format.into(),
    ];
    let keeper =
        ServiceProcess::spawn_self("serve-node", args, &log).map_err(|e| format!("{e:#}"))?;
    let pid = keeper.pid();
    let keeper = processes.keeper.insert(keeper);
    let deadline = Instant::now() + READY_WAIT;
    while !socket.exists() {
        if let Some(status) = keeper.exited().map_err(|e| format!("{e:#}"))? {
            return Err(format!(
                "the keeper (pid {pid}) exited ({status}) before it listened"
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the keeper (pid {pid}) does not listen on {socket:?} after {READY_WAIT:?}"
            ));
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(Done::said(format!(
        "keeper pid {pid} listening on {} (root only)",
        socket.display()
    ))
    .detail("the owner deposits every stage with it, and hands them over to it on SIGTERM")
    .detail(format!("log {}", log.display())))
}

/// Waits for the socket, then until Probe answers ready.
async fn ready(socket: &Path, process: &mut ServiceProcess) -> Result<Done<Channel>, String> {
    let connected = wait_for_socket(socket, process).await?;
    let (channel, details) = connected.into_parts();
    until_ready(&channel, process).await?;
    let mut done = Done::new(channel);
    for line in details {
        done = done.detail(line);
    }
    Ok(done.detail("Probe: ready"))
}

/// Polls Probe on `channel` until it answers ready, while `process` (the one readiness waits
/// for) runs, for at most [`READY_WAIT`].
async fn until_ready(channel: &Channel, process: &mut ServiceProcess) -> Result<(), String> {
    let mut identity = IdentityClient::new(channel.clone());
    let deadline = Instant::now() + READY_WAIT;
    loop {
        let answer = rpc(identity.probe(ProbeRequest {})).await;
        if let Ok(ProbeResponse {
            ready: Some(true) | None,
        }) = answer
        {
            return Ok(());
        }
        if let Some(status) = process.exited().map_err(|e| format!("{e:#}"))? {
            return Err(format!(
                "pid {} exited ({status}) before it was ready",
                process.pid()
            ));
        }
        if Instant::now() >= deadline {
            return Err(match answer {
                Err(error) => format!("not ready after {READY_WAIT:?}: {error}"),
                Ok(_) => format!("not ready after {READY_WAIT:?}"),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// What the frontend restart under a writer measured.
struct Restart {
    channel: Channel,
    written: u64,
}

/// Kills the frontend (SIGKILL) and starts a new one while a writer streams through the
/// read-write target `writer`; the stream must see no error and no long pause.
async fn restart_frontend_under_writer(
    files: &Files<'_>,
    processes: &mut Processes,
    log_format: &str,
    writer: &Path,
) -> Result<Done<Restart>, String> {
    let stream = Writer::start(writer.join(STREAM_FILE))?;
    tokio::time::sleep(STREAM_MARGIN).await;
    let killed_at = Instant::now();
    let old_pid = frontend(processes).map_err(|f| f.reason)?.pid();
    frontend(processes)
        .map_err(|f| f.reason)?
        .kill()
        .map_err(|e| format!("{e:#}"))?;
    // Spawning here, while the writer holds its file open, is safe: the owner serves the mount
    // throughout, so the FLUSH the new process's exec sends is answered.
    let new_pid = start_frontend(files, processes, log_format)?;
    let ready = ready(
        &files.frontend_socket(),
        frontend(processes).map_err(|f| f.reason)?,
    )
    .await;
    let ready_at = Instant::now();
    let stream = stream.finish(ready.is_ok()).await?;
    let channel = ready?.into_parts().0;
    let figures = stream.judged(killed_at, ready_at, &FRONTEND_RESTART)?;
    let done = Done::new(Restart {
        channel,
        written: stream.written,
    })
    .detail(format!(
        "frontend pid {old_pid} killed; pid {new_pid} ready {:.1} ms later (restart to ready)",
        ms(ready_at - killed_at)
    ));
    Ok(figures.into_iter().fold(done, Done::detail))
}

/// Upgrades the mount owner while a writer streams through the read-write target `writer`:
/// the old owner gets SIGTERM, hands the stage over to the keeper and exits 0; a new owner
/// with the same flags takes the stage back (no new INIT, the same lease epoch, renewed) and
/// reports ready, which the frontend's Probe shows. The writer must see no error and no long
/// pause. Returns how many bytes the writer wrote.
async fn upgrade_owner_under_writer(
    files: &Files<'_>,
    processes: &mut Processes,
    log_format: &str,
    frontend: &Channel,
    writer: &Path,
) -> Result<Done<u64>, String> {
    let (successor, gate) = gated_successor(files, processes, log_format, "upgrade")?;
    let new_pid = successor.pid();
    let stream = Writer::start(writer.join(UPGRADE_STREAM_FILE))?;
    tokio::time::sleep(STREAM_MARGIN).await;
    let old = processes
        .owner
        .as_mut()
        .ok_or_else(|| "the owner was not started".to_owned())?;
    let old_pid = old.pid();
    let terminated_at = Instant::now();
    let stopped = old.stop_async(OWNER_STOP_GRACE).await;
    let exited_at = Instant::now();
    // The old owner is gone either way (exited, or killed after the grace period): the
    // successor takes its place and is let go.
    processes.owner = Some(successor);
    let ready = let_go(&gate, processes, frontend).await;
    let ready_at = Instant::now();
    let stream = stream.finish(ready.is_ok()).await;
    match stopped.map_err(|e| format!("{e:#}"))? {
        Stopped::Terminated(status) if status.success() => {}
        Stopped::Terminated(status) => {
            return Err(format!("the old owner exited with {status} after SIGTERM"));
        }
        Stopped::AlreadyExited(status) => {
            return Err(format!("the old owner had exited on its own ({status})"));
        }
        Stopped::Killed => {
            return Err(format!(
                "the old owner did not exit within {OWNER_STOP_GRACE:?} of SIGTERM and was killed"
            ));
        }
    }
    ready.map_err(|e| format!("the new owner (pid {new_pid}): {e}"))?;
    let stream = stream?;
    let figures = stream.judged(terminated_at, ready_at, &OWNER_UPGRADE)?;
    let done = Done::new(stream.written)
        .detail(format!(
            "mount owner pid {old_pid} exited 0 {:.1} ms after SIGTERM, the stage handed over to the keeper",
            ms(exited_at - terminated_at)
        ))
        .detail(format!(
            "pid {new_pid} (started before the writer, held at a start gate) took the stage back; Probe through the frontend ready {:.1} ms after the SIGTERM (owner upgrade: SIGTERM to ready)",
            ms(ready_at - terminated_at)
        ));
    Ok(figures.into_iter().fold(done, Done::detail))
}

/// A new mount owner, started now and held at a start gate (its path returned) until
/// [`let_go`]. It must be forked before a writer opens its file on the mount: forked while the
/// writer holds the file open, the new process would close its copy of that descriptor at
/// `exec`, and that close sends a FUSE FLUSH, which waits for the connection's server. While
/// the old owner is gone there is none, and the server to come is the very process stuck in
/// `exec`: the spawn (which waits for the exec) would never return. So nothing is forked while
/// a writer runs.
fn gated_successor(
    files: &Files<'_>,
    processes: &Processes,
    log_format: &str,
    what: &str,
) -> Result<(ServiceProcess, PathBuf), String> {
    let metrics = processes
        .owner_metrics
        .ok_or_else(|| "the owner's metrics address is unknown".to_owned())?;
    let gate = files.node(&format!("owner-successor-{what}.go"));
    let successor = ServiceProcess::spawn_self_gated(
        "serve-node",
        owner_args(files, metrics, log_format),
        &files.node("owner.log"),
        &gate,
    )
    .map_err(|e| format!("{e:#}"))?;
    Ok((successor, gate))
}

/// Lets the owner held at `gate` (now `processes.owner`) go, and waits until Probe through the
/// frontend says it is ready.
async fn let_go(gate: &Path, processes: &mut Processes, frontend: &Channel) -> Result<(), String> {
    std::fs::write(gate, b"")
        .map_err(|e| format!("cannot let the new owner go ({gate:?}): {e}"))?;
    match processes.owner.as_mut() {
        Some(owner) => until_ready(frontend, owner).await,
        None => Err("the new owner is gone".to_owned()),
    }
}

/// Kills the mount owner (SIGKILL: no hand-over) while a writer streams through `writer`: the
/// keeper keeps the stage for a successor, which takes it over with the tables written ahead,
/// has the kernel resend what the dead owner had read, and serves on. The successor is
/// started before the writer, held at a start gate (see [`upgrade_owner_under_writer`]).
async fn crash_owner_under_writer(
    files: &Files<'_>,
    processes: &mut Processes,
    log_format: &str,
    frontend: &Channel,
    writer: &Path,
) -> Result<Done<u64>, String> {
    let (successor, gate) = gated_successor(files, processes, log_format, "crash")?;
    let new_pid = successor.pid();
    let keeper_log = files.node("keeper.log");
    let kept_before = log_lines(&keeper_log, "keeping it for a successor")?.len();
    let stream = Writer::start(writer.join(CRASH_STREAM_FILE))?;
    tokio::time::sleep(STREAM_MARGIN).await;
    let old = processes
        .owner
        .as_mut()
        .ok_or_else(|| "the owner was not started".to_owned())?;
    let old_pid = old.pid();
    let killed_at = Instant::now();
    let killed = old.kill().map_err(|e| format!("{e:#}"));
    processes.owner = Some(successor);
    // The keeper sees the owner's socket close and keeps the stage; then the successor goes.
    let kept = async {
        killed?;
        let deadline = Instant::now() + READY_WAIT;
        loop {
            let kept = log_lines(&keeper_log, "keeping it for a successor")?;
            if kept.len() > kept_before {
                return Ok(kept.last().cloned().unwrap_or_default());
            }
            if Instant::now() > deadline {
                return Err("the keeper never said it kept the stage".to_owned());
            }
            tokio::time::sleep(POLL).await;
        }
    }
    .await;
    let ready = match kept {
        Ok(_) => let_go(&gate, processes, frontend).await,
        Err(e) => Err(e),
    };
    let ready_at = Instant::now();
    let stream = stream.finish(ready.is_ok()).await;
    ready.map_err(|e| format!("the successor (pid {new_pid}): {e}"))?;
    let kept = log_lines(&keeper_log, "keeping it for a successor")?;
    let stream = stream?;
    let figures = stream.judged(killed_at, ready_at, &OWNER_CRASH)?;
    let done = Done::new(stream.written)
        .detail(format!(
            "mount owner pid {old_pid} killed; the keeper's log: {}",
            kept.last().map_or("", String::as_str)
        ))
        .detail(format!(
            "pid {new_pid} (started before the writer, held at a start gate) took the stage over; Probe through the frontend ready {:.1} ms after the SIGKILL (owner crash: SIGKILL to ready)",
            ms(ready_at - killed_at)
        ));
    Ok(figures.into_iter().fold(done, Done::detail))
}

/// The stage and its two publications as they were made: what the checks after each
/// interruption compare against.
struct Published {
    staging: PathBuf,
    writer: PathBuf,
    reader: PathBuf,
    /// The stage's mount ID.
    mount: u64,
    /// The lease epoch claimed at stage.
    epoch: String,
    /// The owners' log.
    log: PathBuf,
}

impl Published {
    /// Reads the stream `file` back through the read-only target and checks every byte, then
    /// removes it through the read-write one (room for the next stream); checks that the stage
    /// is the one staged (the same mount ID) and the lease the one claimed (no second claim).
    fn stream_kept(&self, file: &str, written: u64) -> Result<Done<()>, String> {
        let read = verify_stream(&self.reader.join(file), written)?;
        let id = mount_id(&self.staging)?;
        if id != self.mount {
            return Err(format!(
                "the stage was remounted (mount id {}, now {id})",
                self.mount
            ));
        }
        let (_, now) = claimed(&self.log, 1)?;
        if now != self.epoch {
            return Err(format!(
                "the lease was claimed again (epoch {}, now {now})",
                self.epoch
            ));
        }
        let stream = self.writer.join(file);
        std::fs::remove_file(&stream).map_err(|e| format!("removing {stream:?}: {e}"))?;
        Ok(Done::said(format!(
            "{} read back and checked (then removed)",
            size(to_i64(read))
        ))
        .detail(format!(
            "the FUSE mount is the one staged (mount id {id}): never remounted"
        ))
        .detail(format!(
            "the lease is the one claimed at stage (epoch {}): no new claim",
            self.epoch
        )))
    }
}

/// The owners' log lines of the one hand-over: the old owner's "handed the stage over" (the
/// whole hand-over must have handed one stage over and failed none), and the new owner's
/// "took a handed-over stage back", with the lease's `epoch`.
fn handed_over_and_taken_back(log: &Path, epoch: &str) -> Result<(String, String), String> {
    let summary = log_lines(log, "handed the stages over to the keeper")?;
    let summary = summary
        .last()
        .ok_or_else(|| "the owner's log shows no hand-over".to_owned())?;
    if log_field(summary, "handed_over") != Some("1") || log_field(summary, "failed") != Some("0") {
        return Err(format!(
            "the hand-over was not one stage, none failed: {summary}"
        ));
    }
    let handed = log_lines(log, "handed the stage over")?;
    let handed = handed
        .last()
        .ok_or_else(|| "the owner's log shows no stage handed over".to_owned())?;
    let taken = log_lines(log, "took a handed-over stage back")?;
    let [taken] = &taken[..] else {
        return Err(format!(
            "the owner's log shows {} stages taken back, expected 1",
            taken.len()
        ));
    };
    if !taken.contains(epoch) {
        return Err(format!(
            "the stage was taken back without epoch {epoch}: {taken}"
        ));
    }
    Ok((handed.clone(), taken.clone()))
}

/// A writer thread streaming into a file on the mount ([`write_stream`]). Dropping it tells
/// the thread to stop.
struct Writer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Stream>>,
}

impl Writer {
    /// Starts the writer; it creates `path`.
    fn start(path: PathBuf) -> Result<Writer, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("demo-writer".into())
                .spawn(move || write_stream(&path, &stop))
                .map_err(|e| format!("cannot start the writer: {e}"))?
        };
        Ok(Writer {
            stop,
            thread: Some(thread),
        })
    }

    /// Lets the writer run [`STREAM_MARGIN`] longer if `settle`, then stops it and returns
    /// what it did. A writer that does not stop within [`READY_WAIT`] (a write waiting on a
    /// mount nobody serves) is left behind, and that is the error.
    async fn finish(mut self, settle: bool) -> Result<Stream, String> {
        if settle {
            tokio::time::sleep(STREAM_MARGIN).await;
        }
        self.stop.store(true, Ordering::SeqCst);
        let thread = self
            .thread
            .take()
            .ok_or_else(|| "the writer has already finished".to_owned())?;
        let deadline = Instant::now() + READY_WAIT;
        while !thread.is_finished() {
            if Instant::now() >= deadline {
                return Err(format!(
                    "the writer did not stop within {READY_WAIT:?}: a write waits on the mount"
                ));
            }
            tokio::time::sleep(POLL).await;
        }
        thread
            .join()
            .map_err(|_| "the writer thread panicked".to_owned())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// What interrupts a stream, in the words of its figures.
struct Interruption {
    /// Its start: "the kill".
    start: &'static str,
    /// Its window: "while the frontend was down".
    during: &'static str,
    /// Its name: "the restart".
    name: &'static str,
    /// What the pauses show.
    shows: &'static str,
}

const FRONTEND_RESTART: Interruption = Interruption {
    start: "the kill",
    during: "while the frontend was down",
    name: "the restart",
    shows: "kubelet's socket is not in the I/O path",
};

const OWNER_CRASH: Interruption = Interruption {
    start: "the SIGKILL",
    during: "during the take-over",
    name: "the take-over",
    shows: "requests the dead owner had read were resent to its successor",
};

const OWNER_UPGRADE: Interruption = Interruption {
    start: "the SIGTERM",
    during: "during the upgrade",
    name: "the upgrade",
    shows: "requests waited in the kernel while the keeper held the connection",
};

/// What the writer thread did.
struct Stream {
    written: u64,
    completions: Vec<(Instant, u64)>,
    error: Option<String>,
    started: Instant,
}

/// Throughput in MiB/s per window and the pauses between writes.
struct Figures {
    before: f64,
    during: f64,
    after: f64,
    /// The longest pause between two writes that overlaps the interruption.
    interrupted_pause: Duration,
    /// The longest pause between two writes outside it.
    other_pause: Duration,
    median_pause: Duration,
}

impl Stream {
    /// Fails on the writer's error or on a pause over [`LONGEST_PAUSE_ALLOWED`] during the
    /// interruption from `from` to `to`; otherwise the lines that say what was measured.
    fn judged(
        &self,
        from: Instant,
        to: Instant,
        how: &Interruption,
    ) -> Result<Vec<String>, String> {
        if let Some(error) = &self.error {
            return Err(format!(
                "the writer saw an I/O error after {}: {error}",
                size(to_i64(self.written))
            ));
        }
        let figures = self.figures(from, to);
        if figures.interrupted_pause > LONGEST_PAUSE_ALLOWED {
            return Err(format!(
                "the writer stalled for {:?} during {}",
                figures.interrupted_pause, how.name
            ));
        }
        Ok(vec![
            format!(
                "writer: {} in {} writes of {}, zero errors",
                size(to_i64(self.written)),
                self.completions.len(),
                size(to_i64(CHUNK_BYTES as u64))
            ),
            format!(
                "throughput {:.1} MiB/s before {}, {:.1} MiB/s {}, {:.1} MiB/s after",
                figures.before, how.start, figures.during, how.during, figures.after
            ),
            format!(
                "longest pause between writes during {} {:.1} ms, elsewhere {:.1} ms (median {:.2} ms): {}",
                how.name,
                ms(figures.interrupted_pause),
                ms(figures.other_pause),
                ms(figures.median_pause),
                how.shows
            ),
        ])
    }

    /// The figures of the stream split at the interruption's start (`from`) and end (`to`).
    fn figures(&self, from: Instant, to: Instant) -> Figures {
        let end = self.completions.last().map_or(to, |(at, _)| *at);
        let rate = |from: Instant, to: Instant| {
            let bytes: u64 = self
                .completions
                .iter()
                .filter(|(at, _)| *at > from && *at <= to)
                .map(|(_, n)| *n)
                .sum();
            let seconds = to.saturating_duration_since(from).as_secs_f64();
            if seconds > 0.0 {
                bytes as f64 / seconds / f64::from(1u32 << 20)
            } else {
                0.0
            }
        };
        // Each pause runs from one completion (or the file's creation) to the next.
        let times: Vec<Instant> = std::iter::once(self.started)
            .chain(self.completions.iter().map(|(at, _)| *at))
            .collect();
        let intervals: Vec<(Instant, Instant)> = times.windows(2).map(|w| (w[0], w[1])).collect();
        let overlaps = |(start, stop): &(Instant, Instant)| *stop > from && *start < to;
        let longest = |interrupted: bool| {
            intervals
                .iter()
                .filter(|i| overlaps(i) == interrupted)
                .map(|(start, stop)| *stop - *start)
                .max()
                .unwrap_or_default()
        };
        let mut pauses: Vec<Duration> = intervals
            .iter()
            .map(|(start, stop)| *stop - *start)
            .collect();
        pauses.sort();
        Figures {
            before: rate(self.started, from),
            during: rate(from, to),
            after: rate(to, end),
            interrupted_pause: longest(true),
            other_pause: longest(false),
            median_pause: pauses.get(pauses.len() / 2).copied().unwrap_or_default(),
        }
    }
}

/// Writes the pattern in [`CHUNK_BYTES`] pieces until told to stop, then fsyncs.
fn write_stream(path: &Path, stop: &AtomicBool) -> Stream {
    let mut stream = Stream {
        written: 0,
        completions: Vec::new(),
        error: None,
        started: Instant::now(),
    };
    let mut file = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
    {
        Ok(file) => file,
        Err(e) => {
            stream.error = Some(format!("creating {path:?}: {e}"));
            return stream;
        }
    };
    // The pauses count from the file's creation on.
    stream.started = Instant::now();
    let mut chunk = vec![0u8; CHUNK_BYTES];
    while !stop.load(Ordering::SeqCst) && stream.written < STREAM_LIMIT {
        fill(&mut chunk, stream.written);
        if let Err(e) = file.write_all(&chunk) {
            stream.error = Some(format!("writing at offset {}: {e}", stream.written));
            return stream;
        }
        stream.written += CHUNK_BYTES as u64;
        stream
            .completions
            .push((Instant::now(), CHUNK_BYTES as u64));
    }
    if let Err(e) = file.sync_all() {
        stream.error = Some(format!("fsync: {e}"));
    }
    stream
}

/// The stream's content: each 8-byte word holds its own offset.
fn fill(buf: &mut [u8], offset: u64) {
    for (i, word) in buf.chunks_exact_mut(8).enumerate() {
        word.copy_from_slice(&(offset + 8 * i as u64).to_le_bytes());
    }
}

/// Reads the stream back and checks every byte; returns how many were read.
fn verify_stream(path: &Path, written: u64) -> Result<u64, String> {
    let mut file = std::fs::File::open(path).map_err(|e| format!("opening {path:?}: {e}"))?;
    let mut chunk = vec![0u8; CHUNK_BYTES];
    let mut expected = vec![0u8; CHUNK_BYTES];
    let mut offset = 0u64;
    loop {
        let n =
            read_full(&mut file, &mut chunk).map_err(|e| format!("reading at {offset}: {e}"))?;
        if n == 0 {
            break;
        }
        fill(&mut expected, offset);
        if chunk[..n] != expected[..n] {
            return Err(format!(
                "the bytes at offset {offset} differ from what was written"
            ));
        }
        offset += n as u64;
    }
    if offset != written {
        return Err(format!("read {offset} bytes, {written} were written"));
    }
    Ok(offset)
}

fn read_full(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// The mount ID of what is mounted at `path`.
fn mount_id(path: &Path) -> Result<u64, String> {
    let bytes = mountinfo::read_self().map_err(|e| format!("cannot read the mount table: {e}"))?;
    let table = mountinfo::MountTable::parse(&bytes)
        .map_err(|e| format!("cannot parse the mount table: {e}"))?;
    table
        .by_mount_point(path)
        .map(|m| m.mount_id())
        .ok_or_else(|| format!("nothing is mounted at {path:?}"))
}

/// The lines of a log that carry `message`.
fn log_lines(log: &Path, message: &str) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(log).map_err(|e| format!("reading {log:?}: {e}"))?;
    Ok(text
        .lines()
        .filter(|line| line.contains(message))
        .map(|line| line.trim().to_owned())
        .collect())
}

/// The value of `key` in a log line, text (`key=value`) or JSON (`"key":"value"` or
/// `"key":value`).
fn log_field<'l>(line: &'l str, key: &str) -> Option<&'l str> {
    let text = format!("{key}=");
    let json = format!("\"{key}\":");
    let (start, rest) = if let Some(at) = line.find(&text) {
        (at + text.len(), &line[at + text.len()..])
    } else {
        let at = line.find(&json)?;
        (at + json.len(), &line[at + json.len()..])
    };
    let quoted = rest.starts_with('"');
    let from = start + usize::from(quoted);
    let value = &line[from..];
    let end = value
        .find(|c: char| {
            if quoted {
                c == '"'
            } else {
                c.is_whitespace() || c == ',' || c == '}'
            }
        })
        .unwrap_or(value.len());
    Some(&value[..end])
}

/// The owner's claims of the lease so far, which must be `expected` many; the last one's line
/// and epoch.
fn claimed(log: &Path, expected: usize) -> Result<(String, String), String> {
    let lines = log_lines(log, "mount lease claimed")?;
    if lines.len() != expected {
        return Err(format!(
            "the owner's log shows {} claims of the lease, expected {expected}",
            lines.len()
        ));
    }
    let line = lines
        .last()
        .ok_or_else(|| "the owner's log shows no claim of the lease".to_owned())?;
    let epoch = log_field(line, "epoch").ok_or_else(|| format!("no epoch in {line:?}"))?;
    Ok((line.clone(), epoch.to_owned()))
}

/// The owner's release of the lease by its holder, with the claimed epoch.
fn released(log: &Path, epoch: &str) -> Result<String, String> {
    log_lines(log, "mount lease released")?
        .into_iter()
        .rev()
        .find(|line| log_field(line, "was_holder") == Some("true"))
        .filter(|line| log_field(line, "epoch") == Some(epoch))
        .ok_or_else(|| {
            format!("the owner's log {log:?} does not show epoch {epoch} released by its holder")
        })
}

fn write_pki(files: &Files<'_>) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let pki = worker::testing::Pki::generate("tak-os-demo")?;
    let mut token = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut token))
        .context("cannot read /dev/urandom for a token")?;
    let token: String = token.iter().map(|b| format!("{b:02x}")).collect();
    for (name, content) in [
        ("ca.pem", pki.ca_pem.as_str()),
        ("server.pem", pki.server_pem.as_str()),
        ("server.key", pki.server_key.as_str()),
        ("client.pem", pki.client_pem.as_str()),
        ("client.key", pki.client_key.as_str()),
        ("token", token.as_str()),
    ] {
        let path = files.worker(name);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("cannot create {path:?}"))?;
        file.write_all(content.as_bytes())
            .with_context(|| format!("cannot write {path:?}"))?;
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(files.credentials())
        .with_context(|| format!("cannot create {:?}", files.credentials()))?;
    Ok(())
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

fn to_i64(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_pattern_names_every_offset_and_is_verified_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let mut bytes = vec![0u8; 3 * CHUNK_BYTES];
        for (i, chunk) in bytes.chunks_mut(CHUNK_BYTES).enumerate() {
            fill(chunk, (i * CHUNK_BYTES) as u64);
        }
        assert_eq!(&bytes[8..16], &8u64.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(
            verify_stream(&path, bytes.len() as u64),
            Ok(bytes.len() as u64)
        );
        assert!(
            verify_stream(&path, 1)
                .unwrap_err()
                .contains("were written")
        );
        bytes[CHUNK_BYTES + 5] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let error = verify_stream(&path, bytes.len() as u64).unwrap_err();
        assert!(error.contains(&format!("offset {CHUNK_BYTES}")), "{error}");
    }

    #[test]
    fn figures_split_the_stream_at_the_interruption() {
        let started = Instant::now();
        let at = |ms: u64| started + Duration::from_millis(ms);
        let stream = Stream {
            written: 4 << 20,
            completions: vec![
                (at(100), 1 << 20),
                (at(200), 1 << 20),
                (at(700), 1 << 20),
                (at(800), 1 << 20),
            ],
            error: None,
            started,
        };
        let figures = stream.figures(at(250), at(650));
        assert!((figures.before - 8.0).abs() < 1e-6, "{}", figures.before);
        assert!(figures.during.abs() < 1e-6);
        assert!(
            (figures.after - 2.0 / 0.15).abs() < 1e-6,
            "{}",
            figures.after
        );
        assert_eq!(figures.interrupted_pause, Duration::from_millis(500));
        assert_eq!(figures.other_pause, Duration::from_millis(100));
        assert_eq!(figures.median_pause, Duration::from_millis(100));
    }

    #[test]
    fn log_fields_are_read_from_text_and_json_lines() {
        let text = "2026-12-01T00:00:00Z  INFO mount lease released volume=pvc-1 epoch=00ab was_holder=true";
        assert_eq!(log_field(text, "epoch"), Some("00ab"));
        assert_eq!(log_field(text, "was_holder"), Some("true"));
        let json =
            r#"{"fields":{"message":"mount lease released","epoch":"00ab","was_holder":true}}"#;
        assert_eq!(log_field(json, "epoch"), Some("00ab"));
        assert_eq!(log_field(json, "was_holder"), Some("true"));
        assert_eq!(log_field(json, "volume"), None);
    }

    #[test]
    fn one_hand_over_and_one_take_back_with_the_epoch_count() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("owner.log");
        let handed = "INFO handed the stage over volume=v nodes=3 handles=1\n";
        let summary =
            "INFO handed the stages over to the keeper handed_over=1 failed=0 seconds=0.01\n";
        let taken = "INFO took a handed-over stage back volume=v epoch=Some(\"e1\") seconds=0.01\n";
        std::fs::write(&log, format!("{handed}{summary}{taken}")).unwrap();
        let (old, new) = handed_over_and_taken_back(&log, "e1").unwrap();
        assert!(old.contains("nodes=3"), "{old}");
        assert!(new.contains("took a handed-over stage back"), "{new}");
        assert!(
            handed_over_and_taken_back(&log, "e2")
                .unwrap_err()
                .contains("without epoch e2")
        );
        std::fs::write(&log, format!("{handed}{summary}{taken}{taken}")).unwrap();
        assert!(
            handed_over_and_taken_back(&log, "e1")
                .unwrap_err()
                .contains("2 stages taken back")
        );
        let failed =
            "INFO handed the stages over to the keeper handed_over=0 failed=1 seconds=0.01\n";
        std::fs::write(&log, format!("{failed}{taken}")).unwrap();
        assert!(handed_over_and_taken_back(&log, "e1").is_err());
        let json = concat!(
            r#"{"message":"handed the stage over","volume":"v","nodes":3,"handles":1}"#,
            "\n",
            r#"{"message":"handed the stages over to the keeper","handed_over":1,"failed":0}"#,
            "\n",
            r#"{"message":"took a handed-over stage back","volume":"v","epoch":"Some(\"e1\")"}"#,
            "\n",
        );
        std::fs::write(&log, json).unwrap();
        assert!(handed_over_and_taken_back(&log, "e1").is_ok());
    }

    #[test]
    fn only_one_claim_and_its_release_by_the_holder_count() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("owner.log");
        let claim = "INFO mount lease claimed volume=v epoch=e1 lease_seconds=90\n";
        std::fs::write(&log, claim).unwrap();
        assert_eq!(claimed(&log, 1).unwrap().1, "e1");
        std::fs::write(&log, format!("{claim}{claim}")).unwrap();
        assert!(claimed(&log, 1).unwrap_err().contains("2 claims"));
        assert_eq!(claimed(&log, 2).unwrap().1, "e1");
        assert!(claimed(&dir.path().join("absent"), 0).is_err());
        std::fs::write(
            &log,
            "INFO mount lease released volume=v epoch=e1 was_holder=false\n",
        )
        .unwrap();
        assert!(released(&log, "e1").is_err());
        std::fs::write(
            &log,
            "INFO mount lease released volume=v epoch=e0 was_holder=true\n",
        )
        .unwrap();
        assert!(released(&log, "e1").is_err());
        std::fs::write(
            &log,
            "INFO mount lease released volume=v epoch=e1 was_holder=true\n",
        )
        .unwrap();
        assert!(released(&log, "e1").unwrap().contains("epoch=e1"));
    }
}
