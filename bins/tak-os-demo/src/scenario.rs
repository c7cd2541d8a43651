//! What kubelet and the external-provisioner would do with a fresh volume, step by step, over
//! the driver's socket: identity, create, publish read-write and read-only, use, stats,
//! unpublish, delete.

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use csi_proto::v1::controller_client::ControllerClient;
use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_proto::v1::*;
use tak_os_local_csi::driver::{DRIVER_NAME, TOPOLOGY_KEY};
use tonic::transport::Channel;

use crate::driver::{NODE_ID, ServiceProcess};
use crate::report::{Done, Failure, Report};
use crate::workspace::Workspace;

/// The CSI name of the demo's volume (the external-provisioner passes the PV name).
pub const VOLUME_NAME: &str = "pvc-demo";
/// The capacity the demo's claim requests.
const REQUIRED_BYTES: i64 = 64 << 20;
/// The pod that writes through a read-write publication.
const WRITER_POD: &str = "pod-writer";
/// The pod that reads through a read-only publication.
const READER_POD: &str = "pod-reader";
/// The file the writer creates.
const FILE_NAME: &str = "hello.txt";
/// What the writer writes.
const CONTENT: &[u8] = b"written through the read-write target, read through the read-only one\n";
/// How long the driver may take to serve its socket.
const SOCKET_WAIT: Duration = Duration::from_secs(10);
/// How long one RPC may take.
const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one connection attempt or health check may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the socket is polled while the driver starts.
const POLL: Duration = Duration::from_millis(20);

/// Runs every step against a started driver; stops at the first failure.
pub async fn run(
    report: &mut Report<'_>,
    workspace: &Workspace,
    driver: &mut ServiceProcess,
    metrics: SocketAddr,
) -> Result<(), Failure> {
    let socket = workspace.socket();
    let channel = report
        .step(
            "wait for the driver's socket",
            wait_for_socket(&socket, driver),
        )
        .await?;
    let mut identity = IdentityClient::new(channel.clone());
    let mut controller = ControllerClient::new(channel.clone());
    let mut node = NodeClient::new(channel);

    report
        .step("GetPluginInfo", plugin_info(&mut identity, DRIVER_NAME))
        .await?;

    report
        .step("Probe", async {
            let probe = rpc(identity.probe(ProbeRequest {})).await?;
            // An absent `ready` means ready (CSI spec).
            match probe.ready {
                Some(false) => Err("the driver is not ready".to_owned()),
                Some(true) | None => Ok(Done::said("ready")),
            }
        })
        .await?;

    report.sync_step("GET /healthz on the metrics address", || {
        health(metrics).map(|()| Done::said(format!("http://{metrics}/healthz: 200 ok")))
    })?;

    let topology = report
        .step("NodeGetInfo", async {
            let info = rpc(node.node_get_info(NodeGetInfoRequest {})).await?;
            if info.node_id != NODE_ID {
                return Err(format!(
                    "node_id is {:?}, expected {NODE_ID:?}",
                    info.node_id
                ));
            }
            let topology = info
                .accessible_topology
                .filter(|t| t.segments.contains_key(TOPOLOGY_KEY))
                .ok_or_else(|| format!("accessible_topology lacks the key {TOPOLOGY_KEY}"))?;
            Ok(Done::new(topology.clone())
                .detail(format!("node id {}", info.node_id))
                .detail(format!("topology {}", segments(&topology))))
        })
        .await?;

    let create = create_request(&topology);
    let volume = report
        .step(
            &format!(
                "CreateVolume {VOLUME_NAME} (64 MiB, SINGLE_NODE_WRITER, this node's topology)"
            ),
            async {
                let created = rpc(controller.create_volume(create.clone())).await?;
                let volume = created
                    .volume
                    .ok_or_else(|| "the response has no volume".to_owned())?;
                if volume.capacity_bytes < REQUIRED_BYTES {
                    return Err(format!(
                        "capacity_bytes {} is below the required {REQUIRED_BYTES}",
                        volume.capacity_bytes
                    ));
                }
                let topologies: Vec<String> =
                    volume.accessible_topology.iter().map(segments).collect();
                Ok(Done::new(volume.clone())
                    .detail(format!("volume id {}", volume.volume_id))
                    .detail(format!("capacity {}", size(volume.capacity_bytes)))
                    .detail(format!("accessible topology {}", topologies.join("; "))))
            },
        )
        .await?;
    let volume_id = volume.volume_id.clone();

    report
        .step("CreateVolume again (idempotent)", async {
            let again = rpc(controller.create_volume(create.clone())).await?;
            let again_id = again.volume.map(|v| v.volume_id).unwrap_or_default();
            if again_id != volume_id {
                return Err(format!(
                    "the repeat returned volume {again_id:?}, not {volume_id:?}"
                ));
            }
            Ok(Done::said("same volume ID"))
        })
        .await?;

    report
        .step("GetCapacity for this node's topology", async {
            let capacity = rpc(controller.get_capacity(GetCapacityRequest {
                volume_capabilities: vec![capability()],
                parameters: HashMap::new(),
                accessible_topology: Some(topology.clone()),
            }))
            .await?;
            if capacity.available_capacity <= 0 {
                return Err(format!(
                    "available_capacity is {}",
                    capacity.available_capacity
                ));
            }
            Ok(Done::said(format!(
                "available {}: the store's free space (directories reserve none)",
                size(capacity.available_capacity)
            )))
        })
        .await?;

    let writer = workspace.target(WRITER_POD, VOLUME_NAME);
    let reader = workspace.target(READER_POD, VOLUME_NAME);
    for (target, readonly) in [(&writer, false), (&reader, true)] {
        let how = if readonly { "read-only" } else { "read-write" };
        let request = NodePublishVolumeRequest {
            volume_id: volume_id.clone(),
            target_path: path_string(target),
            volume_capability: Some(capability()),
            readonly,
            volume_context: volume.volume_context.clone(),
            ..Default::default()
        };
        report
            .step(&format!("NodePublishVolume {how}"), async {
                workspace
                    .create_target_parent(target)
                    .map_err(|e| format!("kubelet's part, creating the target's parent: {e}"))?;
                rpc(node.node_publish_volume(request)).await?;
                let mounted = mount_summary(target)?;
                let expected = if readonly { "ro" } else { "rw" };
                if !mounted.ends_with(expected) {
                    return Err(format!(
                        "the target is mounted {mounted}, expected {expected}"
                    ));
                }
                Ok(
                    Done::said(format!("{}", target.display()))
                        .detail(format!("mounted {mounted}")),
                )
            })
            .await?;
    }

    report.sync_step("write through the read-write target, read through the read-only one", || {
        let written = writer.join(FILE_NAME);
        std::fs::write(&written, CONTENT).map_err(|e| format!("writing {written:?}: {e}"))?;
        let read_path = reader.join(FILE_NAME);
        let read = std::fs::read(&read_path).map_err(|e| format!("reading {read_path:?}: {e}"))?;
        if read != CONTENT {
            return Err(format!(
                "read {} bytes through the read-only target that differ from the {} written",
                read.len(),
                CONTENT.len()
            ));
        }
        let stored = workspace.store().join(&volume_id).join(FILE_NAME);
        if !stored.is_file() {
            return Err(format!("the file is not in the store at {stored:?}"));
        }
        Ok(Done::said(format!(
            "{} bytes written to {FILE_NAME} via {WRITER_POD}, the same bytes read via {READER_POD}",
            CONTENT.len()
        ))
        .detail(format!("stored at {}", stored.display())))
    })?;

    report.sync_step("writing through the read-only target fails", || {
        let refused = reader.join("refused.txt");
        match std::fs::write(&refused, CONTENT) {
            Err(e) if e.kind() == std::io::ErrorKind::ReadOnlyFilesystem => {
                Ok(Done::said(format!("{}: {e}", refused.display())))
            }
            Err(e) => Err(format!(
                "writing {refused:?} failed, but not with EROFS: {e}"
            )),
            Ok(()) => Err(format!(
                "writing {refused:?} succeeded on a read-only publication"
            )),
        }
    })?;

    report
        .step("NodeGetVolumeStats on the read-write target", async {
            let stats = rpc(node.node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: volume_id.clone(),
                volume_path: path_string(&writer),
                staging_target_path: String::new(),
            }))
            .await?;
            let condition = stats
                .volume_condition
                .ok_or_else(|| "volume_condition is missing".to_owned())?;
            if condition.abnormal {
                return Err(format!("the volume is abnormal: {}", condition.message));
            }
            let bytes = stats
                .usage
                .iter()
                .find(|u| u.unit == volume_usage::Unit::Bytes as i32)
                .ok_or_else(|| "no usage in bytes".to_owned())?;
            let mut done = Done::said(format!(
                "bytes: used {}, available {}, total {}",
                size(bytes.used),
                size(bytes.available),
                size(bytes.total)
            ));
            if let Some(inodes) = stats
                .usage
                .iter()
                .find(|u| u.unit == volume_usage::Unit::Inodes as i32)
            {
                done = done.detail(format!(
                    "inodes: used {}, available {}",
                    inodes.used, inodes.available
                ));
            }
            Ok(done.detail(format!("condition: {}", condition.message)))
        })
        .await?;

    for (target, pod) in [(&writer, WRITER_POD), (&reader, READER_POD)] {
        report
            .step(
                &format!("NodeUnpublishVolume ({pod})"),
                unpublish(&mut node, &volume_id, target),
            )
            .await?;
    }

    let delete = DeleteVolumeRequest {
        volume_id: volume_id.clone(),
        secrets: HashMap::new(),
    };
    report
        .step("DeleteVolume", async {
            rpc(controller.delete_volume(delete.clone())).await?;
            let data = workspace.store().join(&volume_id);
            if data.exists() {
                return Err(format!("the data directory {data:?} still exists"));
            }
            Ok(Done::said("the data directory is gone"))
        })
        .await?;

    report
        .step("DeleteVolume again (idempotent)", async {
            rpc(controller.delete_volume(delete.clone())).await?;
            Ok(Done::said("OK for a deleted volume"))
        })
        .await?;

    report
        .step("ListVolumes", async {
            let list = rpc(controller.list_volumes(ListVolumesRequest::default())).await?;
            if !list.entries.is_empty() {
                let ids: Vec<String> = list
                    .entries
                    .iter()
                    .filter_map(|e| e.volume.as_ref().map(|v| v.volume_id.clone()))
                    .collect();
                return Err(format!("volumes remain: {}", ids.join(", ")));
            }
            Ok(Done::said("no volumes"))
        })
        .await?;
    Ok(())
}

/// NodeUnpublishVolume of `target`, which must be gone afterwards.
pub(crate) async fn unpublish(
    node: &mut NodeClient<Channel>,
    volume_id: &str,
    target: &Path,
) -> Result<Done<()>, String> {
    rpc(node.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        target_path: path_string(target),
    }))
    .await?;
    match std::fs::symlink_metadata(target) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Ok(Done::said("unmounted; the target directory is gone"))
        }
        Err(e) => Err(format!("cannot check the target {target:?}: {e}")),
        Ok(_) => Err(format!("the target {target:?} still exists")),
    }
}

/// GetPluginInfo, which must name `expected`.
pub(crate) async fn plugin_info(
    identity: &mut IdentityClient<Channel>,
    expected: &str,
) -> Result<Done<()>, String> {
    let info = rpc(identity.get_plugin_info(GetPluginInfoRequest {})).await?;
    if info.name != expected {
        return Err(format!(
            "the plugin is {:?}, expected {expected:?}",
            info.name
        ));
    }
    Ok(Done::said(format!("{} {}", info.name, info.vendor_version)))
}

/// Polls until the driver serves its socket, it exits, or [`SOCKET_WAIT`] passes.
pub(crate) async fn wait_for_socket(
    socket: &Path,
    driver: &mut ServiceProcess,
) -> Result<Done<Channel>, String> {
    let deadline = Instant::now() + SOCKET_WAIT;
    let mut last_error = String::from("the socket does not exist yet");
    loop {
        if let Some(status) = driver.exited().map_err(|e| format!("{e:#}"))? {
            return Err(format!(
                "pid {} exited ({status}) before serving",
                driver.pid()
            ));
        }
        if socket.exists() {
            match tokio::time::timeout(CONNECT_TIMEOUT, csi_proto::connect_unix(socket)).await {
                Ok(Ok(channel)) => {
                    return Ok(Done::new(channel).detail(format!(
                        "pid {} serves unix://{}",
                        driver.pid(),
                        socket.display()
                    )));
                }
                Ok(Err(e)) => last_error = e.to_string(),
                Err(_) => last_error = format!("connecting took over {CONNECT_TIMEOUT:?}"),
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "nothing serves {socket:?} after {SOCKET_WAIT:?}: {last_error}"
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Awaits one RPC within [`RPC_TIMEOUT`]; a failure reads `Code: message`.
pub(crate) async fn rpc<T>(
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(RPC_TIMEOUT, call).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
        Err(_) => Err(format!("no answer within {RPC_TIMEOUT:?}")),
    }
}

/// A GET of `/healthz` on the driver's metrics server: it must answer 200.
fn health(metrics: SocketAddr) -> Result<(), String> {
    let mut stream = TcpStream::connect_timeout(&metrics, CONNECT_TIMEOUT)
        .map_err(|e| format!("cannot connect to {metrics}: {e}"))?;
    stream
        .set_read_timeout(Some(CONNECT_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(CONNECT_TIMEOUT)))
        .map_err(|e| format!("cannot set timeouts: {e}"))?;
    write!(
        stream,
        "GET /healthz HTTP/1.1\r\nHost: {metrics}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("cannot send the request: {e}"))?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| format!("cannot read the response: {e}"))?;
    let status_line = response.lines().next().unwrap_or_default();
    if status_line.split_whitespace().nth(1) != Some("200") {
        return Err(format!("the answer is {status_line:?}"));
    }
    Ok(())
}

/// The demo's one capability: a mounted directory, SINGLE_NODE_WRITER.
pub(crate) fn capability() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// CreateVolume as the external-provisioner sends it for a claim on this node under delayed
/// binding: the node's topology is both requisite and preferred.
fn create_request(topology: &Topology) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: VOLUME_NAME.to_owned(),
        capacity_range: Some(CapacityRange {
            required_bytes: REQUIRED_BYTES,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability()],
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![topology.clone()],
            preferred: vec![topology.clone()],
        }),
        ..Default::default()
    }
}

/// How the target is mounted, from this namespace's mount table:
/// `<fs type> <source>[<root>] rw|ro`.
pub(crate) fn mount_summary(target: &Path) -> Result<String, String> {
    let bytes = mountinfo::read_self().map_err(|e| format!("cannot read the mount table: {e}"))?;
    let table = mountinfo::MountTable::parse(&bytes)
        .map_err(|e| format!("cannot parse the mount table: {e}"))?;
    let mount = table
        .by_mount_point(target)
        .ok_or_else(|| format!("nothing is mounted at {target:?}"))?;
    Ok(format!(
        "{} {}[{}] {}",
        mount.fs_type().to_string_lossy(),
        mount.source().to_string_lossy(),
        mount.root().display(),
        if mount.is_read_only() { "ro" } else { "rw" }
    ))
}

/// `key=value` pairs of a topology, sorted.
fn segments(topology: &Topology) -> String {
    let mut pairs: Vec<String> = topology
        .segments
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    pairs.sort();
    pairs.join(",")
}

/// A byte count in the largest binary unit that keeps it at 1 or more.
pub(crate) fn size(bytes: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

pub(crate) fn path_string(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_use_the_largest_unit_at_least_one() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(4096), "4.0 KiB");
        assert_eq!(size(REQUIRED_BYTES), "64.0 MiB");
        assert_eq!(size(3 << 30), "3.0 GiB");
    }

    #[test]
    fn the_create_request_is_what_the_provisioner_sends_for_this_node() {
        let topology = Topology {
            segments: HashMap::from([(TOPOLOGY_KEY.to_owned(), "ab".repeat(16))]),
        };
        let request = create_request(&topology);
        assert_eq!(request.name, VOLUME_NAME);
        let requirement = request.accessibility_requirements.unwrap_or_default();
        assert_eq!(requirement.requisite, vec![topology.clone()]);
        assert_eq!(requirement.preferred, vec![topology.clone()]);
        assert_eq!(
            segments(&topology),
            format!("{TOPOLOGY_KEY}={}", "ab".repeat(16))
        );
    }
}
