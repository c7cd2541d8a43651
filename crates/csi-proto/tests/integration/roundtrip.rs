//! Each service over a real Unix socket in a temp dir: trivial servers that return
//! recognisable values, called through the generated clients and through raw gRPC paths.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_proto::v1::controller_client::ControllerClient;
use csi_proto::v1::controller_server::{Controller, ControllerServer};
use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::identity_server::{Identity, IdentityServer};
use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::node_server::{Node, NodeServer};
use csi_proto::v1::{self as csi, controller_service_capability, node_service_capability};
use csi_proto::v1::{plugin_capability, volume_capability, volume_usage};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::{Code, Request, Response, Status};

const DRIVER: &str = "csi.test.tak-os.org";
const NODE_ID: &str = "node-1";

type Reply<T> = Result<Response<T>, Status>;

fn unimplemented<T>(call: &str) -> Reply<T> {
    Err(Status::unimplemented(format!(
        "{call} is not offered by the test driver"
    )))
}

fn topology(node: &str) -> csi::Topology {
    csi::Topology {
        segments: HashMap::from([("topology.test/node".to_owned(), node.to_owned())]),
    }
}

struct TestIdentity;

#[tonic::async_trait]
impl Identity for TestIdentity {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Reply<csi::GetPluginInfoResponse> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: DRIVER.into(),
            vendor_version: "1.2.3".into(),
            manifest: HashMap::from([("build".to_owned(), "test".to_owned())]),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Reply<csi::GetPluginCapabilitiesResponse> {
        let service = |kind: plugin_capability::service::Type| csi::PluginCapability {
            r#type: Some(plugin_capability::Type::Service(
                plugin_capability::Service {
                    r#type: kind as i32,
                },
            )),
        };
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: vec![
                service(plugin_capability::service::Type::ControllerService),
                service(plugin_capability::service::Type::VolumeAccessibilityConstraints),
            ],
        }))
    }

    async fn probe(&self, _: Request<csi::ProbeRequest>) -> Reply<csi::ProbeResponse> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

struct TestController;

#[tonic::async_trait]
impl Controller for TestController {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Reply<csi::CreateVolumeResponse> {
        let request = request.into_inner();
        if request.name.is_empty() {
            return Err(Status::invalid_argument("name is required"));
        }
        Ok(Response::new(csi::CreateVolumeResponse {
            volume: Some(csi::Volume {
                capacity_bytes: request.capacity_range.map_or(0, |r| r.required_bytes),
                volume_id: format!("vol-{}", request.name),
                volume_context: request.parameters,
                content_source: None,
                accessible_topology: request
                    .accessibility_requirements
                    .map(|r| r.requisite)
                    .unwrap_or_default(),
            }),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Reply<csi::DeleteVolumeResponse> {
        let request = request.into_inner();
        if request.volume_id.starts_with("other-node.") {
            return Err(Status::failed_precondition(format!(
                "volume {} belongs to another node",
                request.volume_id
            )));
        }
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        _: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Reply<csi::ControllerPublishVolumeResponse> {
        unimplemented("ControllerPublishVolume")
    }

    async fn controller_unpublish_volume(
        &self,
        _: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Reply<csi::ControllerUnpublishVolumeResponse> {
        unimplemented("ControllerUnpublishVolume")
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Reply<csi::ValidateVolumeCapabilitiesResponse> {
        let request = request.into_inner();
        Ok(Response::new(csi::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                volume_context: request.volume_context,
                volume_capabilities: request.volume_capabilities,
                parameters: request.parameters,
                mutable_parameters: request.mutable_parameters,
            }),
            message: String::new(),
        }))
    }

    async fn list_volumes(
        &self,
        request: Request<csi::ListVolumesRequest>,
    ) -> Reply<csi::ListVolumesResponse> {
        let request = request.into_inner();
        let volume = |id: &str| csi::list_volumes_response::Entry {
            volume: Some(csi::Volume {
                volume_id: id.into(),
                ..Default::default()
            }),
            status: None,
        };
        let response = match request.starting_token.as_str() {
            "" => csi::ListVolumesResponse {
                entries: vec![volume("a"), volume("b")],
                next_token: "2".into(),
            },
            "2" => csi::ListVolumesResponse {
                entries: vec![volume("c")],
                next_token: String::new(),
            },
            other => return Err(Status::aborted(format!("unknown starting_token {other:?}"))),
        };
        Ok(Response::new(response))
    }

    async fn get_capacity(
        &self,
        _: Request<csi::GetCapacityRequest>,
    ) -> Reply<csi::GetCapacityResponse> {
        Ok(Response::new(csi::GetCapacityResponse {
            available_capacity: 42 << 30,
            maximum_volume_size: Some(8 << 30),
            minimum_volume_size: None,
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Reply<csi::ControllerGetCapabilitiesResponse> {
        let rpc =
            |kind: controller_service_capability::rpc::Type| csi::ControllerServiceCapability {
                r#type: Some(controller_service_capability::Type::Rpc(
                    controller_service_capability::Rpc {
                        r#type: kind as i32,
                    },
                )),
            };
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: vec![
                rpc(controller_service_capability::rpc::Type::CreateDeleteVolume),
                rpc(controller_service_capability::rpc::Type::GetCapacity),
                rpc(controller_service_capability::rpc::Type::ListVolumes),
            ],
        }))
    }

    async fn create_snapshot(
        &self,
        _: Request<csi::CreateSnapshotRequest>,
    ) -> Reply<csi::CreateSnapshotResponse> {
        unimplemented("CreateSnapshot")
    }

    async fn delete_snapshot(
        &self,
        _: Request<csi::DeleteSnapshotRequest>,
    ) -> Reply<csi::DeleteSnapshotResponse> {
        unimplemented("DeleteSnapshot")
    }

    async fn list_snapshots(
        &self,
        _: Request<csi::ListSnapshotsRequest>,
    ) -> Reply<csi::ListSnapshotsResponse> {
        unimplemented("ListSnapshots")
    }

    async fn get_snapshot(
        &self,
        _: Request<csi::GetSnapshotRequest>,
    ) -> Reply<csi::GetSnapshotResponse> {
        unimplemented("GetSnapshot")
    }

    async fn controller_expand_volume(
        &self,
        _: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Reply<csi::ControllerExpandVolumeResponse> {
        unimplemented("ControllerExpandVolume")
    }

    async fn controller_get_volume(
        &self,
        _: Request<csi::ControllerGetVolumeRequest>,
    ) -> Reply<csi::ControllerGetVolumeResponse> {
        unimplemented("ControllerGetVolume")
    }

    async fn controller_modify_volume(
        &self,
        _: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Reply<csi::ControllerModifyVolumeResponse> {
        unimplemented("ControllerModifyVolume")
    }
}

struct TestNode;

#[tonic::async_trait]
impl Node for TestNode {
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Reply<csi::NodeStageVolumeResponse> {
        if request.get_ref().staging_target_path.is_empty() {
            return Err(Status::invalid_argument("staging_target_path is required"));
        }
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        _: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Reply<csi::NodeUnstageVolumeResponse> {
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Reply<csi::NodePublishVolumeResponse> {
        let request = request.into_inner();
        if request.target_path.is_empty() {
            return Err(Status::invalid_argument(format!(
                "target_path is required for volume {}",
                request.volume_id
            )));
        }
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        _: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Reply<csi::NodeUnpublishVolumeResponse> {
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Reply<csi::NodeGetVolumeStatsResponse> {
        let request = request.into_inner();
        Ok(Response::new(csi::NodeGetVolumeStatsResponse {
            usage: vec![csi::VolumeUsage {
                available: 3,
                total: 10,
                used: 7,
                unit: volume_usage::Unit::Bytes as i32,
            }],
            volume_condition: Some(csi::VolumeCondition {
                abnormal: false,
                message: format!(
                    "{} is healthy at {}",
                    request.volume_id, request.volume_path
                ),
            }),
        }))
    }

    async fn node_expand_volume(
        &self,
        _: Request<csi::NodeExpandVolumeRequest>,
    ) -> Reply<csi::NodeExpandVolumeResponse> {
        unimplemented("NodeExpandVolume")
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Reply<csi::NodeGetCapabilitiesResponse> {
        let rpc = |kind: node_service_capability::rpc::Type| csi::NodeServiceCapability {
            r#type: Some(node_service_capability::Type::Rpc(
                node_service_capability::Rpc {
                    r#type: kind as i32,
                },
            )),
        };
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: vec![
                rpc(node_service_capability::rpc::Type::StageUnstageVolume),
                rpc(node_service_capability::rpc::Type::GetVolumeStats),
            ],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Reply<csi::NodeGetInfoResponse> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: NODE_ID.into(),
            max_volumes_per_node: 0,
            accessible_topology: Some(topology(NODE_ID)),
        }))
    }
}

fn router() -> tonic::transport::server::Router {
    tonic::transport::Server::builder()
        .add_service(IdentityServer::new(TestIdentity))
        .add_service(ControllerServer::new(TestController))
        .add_service(NodeServer::new(TestNode))
}

/// A test server on a Unix socket.
struct Running {
    path: PathBuf,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), csi_proto::Error>>,
}

impl Running {
    async fn stop(self) {
        self.stop.send(()).expect("server still running");
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("server stops within 10 s")
            .expect("server task")
            .expect("server ends without error");
    }
}

fn start_at(path: PathBuf) -> Running {
    // The socket is bound before the server task runs, so clients can connect right away.
    let listener = csi_proto::bind_unix(&path).expect("bind");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(csi_proto::serve_on(listener, router(), async {
        let _ = stopped.await;
    }));
    Running { path, stop, task }
}

/// Starts a server on `csi.sock` in a fresh temp dir; keep the dir alive while it runs.
fn start() -> (tempfile::TempDir, Running) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("csi.sock");
    let server = start_at(path);
    (dir, server)
}

async fn channel(path: &Path) -> tonic::transport::Channel {
    csi_proto::connect_unix(path).await.expect("connect")
}

#[tokio::test]
async fn identity_over_a_unix_socket() {
    let (_dir, server) = start();
    let mut identity = IdentityClient::new(channel(&server.path).await);

    let info = identity
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.vendor_version, "1.2.3");
    assert_eq!(info.manifest["build"], "test");

    let capabilities = identity
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .expect("capabilities")
        .into_inner()
        .capabilities;
    let kinds: Vec<_> = capabilities
        .iter()
        .map(|c| match &c.r#type {
            Some(plugin_capability::Type::Service(service)) => service.r#type(),
            other => panic!("unexpected capability {other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            plugin_capability::service::Type::ControllerService,
            plugin_capability::service::Type::VolumeAccessibilityConstraints
        ]
    );

    let probe = identity
        .probe(csi::ProbeRequest {})
        .await
        .expect("probe")
        .into_inner();
    assert_eq!(probe.ready, Some(true));
    server.stop().await;
}

#[tokio::test]
async fn controller_over_a_unix_socket() {
    let (_dir, server) = start();
    let mut controller = ControllerClient::new(channel(&server.path).await);

    let capability = csi::VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume::default(),
        )),
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
    };
    let created = controller
        .create_volume(csi::CreateVolumeRequest {
            name: "pvc-9".into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 1 << 30,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability.clone()],
            parameters: HashMap::from([("tier".to_owned(), "fast".to_owned())]),
            secrets: HashMap::from([("token".to_owned(), "s3cr3t".to_owned())]),
            accessibility_requirements: Some(csi::TopologyRequirement {
                requisite: vec![topology(NODE_ID)],
                preferred: vec![topology(NODE_ID)],
            }),
            ..Default::default()
        })
        .await
        .expect("create")
        .into_inner()
        .volume
        .expect("volume");
    assert_eq!(created.volume_id, "vol-pvc-9");
    assert_eq!(created.capacity_bytes, 1 << 30);
    assert_eq!(created.volume_context["tier"], "fast");
    assert_eq!(created.accessible_topology, [topology(NODE_ID)]);

    let status = controller
        .create_volume(csi::CreateVolumeRequest::default())
        .await
        .expect_err("a missing name is refused");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "name is required");

    controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: "vol-pvc-9".into(),
            secrets: HashMap::new(),
        })
        .await
        .expect("delete");
    let status = controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: "other-node.x".into(),
            secrets: HashMap::new(),
        })
        .await
        .expect_err("another node's volume");
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(
        status.message(),
        "volume other-node.x belongs to another node"
    );

    let confirmed = controller
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: "vol-pvc-9".into(),
            volume_capabilities: vec![capability.clone()],
            ..Default::default()
        })
        .await
        .expect("validate")
        .into_inner()
        .confirmed
        .expect("confirmed");
    assert_eq!(confirmed.volume_capabilities, [capability]);

    let first = controller
        .list_volumes(csi::ListVolumesRequest {
            max_entries: 2,
            starting_token: String::new(),
        })
        .await
        .expect("first page")
        .into_inner();
    let second = controller
        .list_volumes(csi::ListVolumesRequest {
            max_entries: 2,
            starting_token: first.next_token.clone(),
        })
        .await
        .expect("second page")
        .into_inner();
    let ids: Vec<_> = first
        .entries
        .iter()
        .chain(&second.entries)
        .map(|e| e.volume.as_ref().expect("volume").volume_id.as_str())
        .collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert!(second.next_token.is_empty());
    let status = controller
        .list_volumes(csi::ListVolumesRequest {
            max_entries: 0,
            starting_token: "bogus".into(),
        })
        .await
        .expect_err("unknown token");
    assert_eq!(status.code(), Code::Aborted);

    let capacity = controller
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .expect("capacity")
        .into_inner();
    assert_eq!(capacity.available_capacity, 42 << 30);
    assert_eq!(capacity.maximum_volume_size, Some(8 << 30));
    assert_eq!(capacity.minimum_volume_size, None);

    let capabilities = controller
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .expect("capabilities")
        .into_inner()
        .capabilities;
    assert_eq!(capabilities.len(), 3);

    let status = controller
        .create_snapshot(csi::CreateSnapshotRequest::default())
        .await
        .expect_err("snapshots are not offered");
    assert_eq!(status.code(), Code::Unimplemented);
    server.stop().await;
}

#[tokio::test]
async fn node_over_a_unix_socket() {
    let (_dir, server) = start();
    let mut node = NodeClient::new(channel(&server.path).await);

    let info = node
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.node_id, NODE_ID);
    assert_eq!(info.accessible_topology, Some(topology(NODE_ID)));

    let capabilities = node
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .expect("capabilities")
        .into_inner()
        .capabilities;
    let kinds: Vec<_> = capabilities
        .iter()
        .map(|c| match &c.r#type {
            Some(node_service_capability::Type::Rpc(rpc)) => rpc.r#type(),
            None => panic!("empty capability"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            node_service_capability::rpc::Type::StageUnstageVolume,
            node_service_capability::rpc::Type::GetVolumeStats
        ]
    );

    node.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: "v".into(),
        staging_target_path: "/staging/v".into(),
        ..Default::default()
    })
    .await
    .expect("stage");
    node.node_publish_volume(csi::NodePublishVolumeRequest {
        volume_id: "v".into(),
        staging_target_path: "/staging/v".into(),
        target_path: "/pods/p/volumes/v".into(),
        readonly: true,
        ..Default::default()
    })
    .await
    .expect("publish");
    let status = node
        .node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: "v".into(),
            ..Default::default()
        })
        .await
        .expect_err("no target path");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "target_path is required for volume v");

    let stats = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: "v".into(),
            volume_path: "/pods/p/volumes/v".into(),
            staging_target_path: String::new(),
        })
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(stats.usage[0].unit(), volume_usage::Unit::Bytes);
    assert_eq!((stats.usage[0].used, stats.usage[0].total), (7, 10));
    let condition = stats.volume_condition.expect("condition");
    assert!(!condition.abnormal);
    assert_eq!(condition.message, "v is healthy at /pods/p/volumes/v");

    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: "v".into(),
        target_path: "/pods/p/volumes/v".into(),
    })
    .await
    .expect("unpublish");
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: "v".into(),
        staging_target_path: "/staging/v".into(),
    })
    .await
    .expect("unstage");

    let status = node
        .node_expand_volume(csi::NodeExpandVolumeRequest::default())
        .await
        .expect_err("not offered");
    assert_eq!(status.code(), Code::Unimplemented);
    server.stop().await;
}

/// Calls a method by its literal gRPC path, independent of the generated clients.
async fn call_by_path<Req, Resp>(
    channel: tonic::transport::Channel,
    path: &'static str,
    request: Req,
) -> Resp
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    grpc.unary(
        Request::new(request),
        PathAndQuery::from_static(path),
        codec,
    )
    .await
    .unwrap_or_else(|status| panic!("{path}: {status}"))
    .into_inner()
}

#[tokio::test]
async fn grpc_paths_are_the_specifications() {
    assert_eq!(
        csi_proto::v1::identity_server::SERVICE_NAME,
        "csi.v1.Identity"
    );
    assert_eq!(
        csi_proto::v1::controller_server::SERVICE_NAME,
        "csi.v1.Controller"
    );
    assert_eq!(csi_proto::v1::node_server::SERVICE_NAME, "csi.v1.Node");

    let (_dir, server) = start();
    let channel = channel(&server.path).await;
    let info: csi::GetPluginInfoResponse = call_by_path(
        channel.clone(),
        "/csi.v1.Identity/GetPluginInfo",
        csi::GetPluginInfoRequest {},
    )
    .await;
    assert_eq!(info.name, DRIVER);
    let capacity: csi::GetCapacityResponse = call_by_path(
        channel.clone(),
        "/csi.v1.Controller/GetCapacity",
        csi::GetCapacityRequest::default(),
    )
    .await;
    assert_eq!(capacity.available_capacity, 42 << 30);
    let node: csi::NodeGetInfoResponse = call_by_path(
        channel.clone(),
        "/csi.v1.Node/NodeGetInfo",
        csi::NodeGetInfoRequest {},
    )
    .await;
    assert_eq!(node.node_id, NODE_ID);
    server.stop().await;
}

#[tokio::test]
async fn a_restarted_server_replaces_its_stale_socket() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("csi.sock");
    start_at(path.clone()).stop().await;
    let left =
        std::fs::symlink_metadata(&path).expect("the stopped server's socket is still there");
    assert!(std::os::unix::fs::FileTypeExt::is_socket(&left.file_type()));

    let server = start_at(path.clone());
    let mut identity = IdentityClient::new(channel(&path).await);
    identity
        .probe(csi::ProbeRequest {})
        .await
        .expect("probe after restart");
    server.stop().await;
}

#[tokio::test]
async fn serve_unix_binds_and_serves_until_shutdown() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("csi.sock");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(csi_proto::serve_unix(router(), path.clone(), async {
        let _ = stopped.await;
    }));

    // serve_unix binds inside the task, so wait for the socket to accept connections.
    let mut attempts = 0;
    let channel = loop {
        match csi_proto::connect_unix(&path).await {
            Ok(channel) => break channel,
            Err(_) if attempts < 200 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(err) => panic!("server never came up: {err}"),
        }
    };
    let info = NodeClient::new(channel)
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .expect("info");
    assert_eq!(info.into_inner().node_id, NODE_ID);

    stop.send(()).expect("server running");
    task.await.expect("join").expect("clean shutdown");
}

#[tokio::test]
async fn serve_unix_refuses_a_regular_file_at_the_socket_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("csi.sock");
    std::fs::write(&path, b"not a socket").expect("write");
    let err = csi_proto::serve_unix(router(), &path, std::future::pending())
        .await
        .expect_err("must refuse");
    assert!(
        matches!(
            err,
            csi_proto::Error::NotASocket {
                kind: csi_proto::FileKind::RegularFile,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(std::fs::read(&path).expect("file kept"), b"not a socket");
}
