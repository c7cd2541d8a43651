//! The tonic services: each RPC runs its `Driver` method on a blocking thread, then logs and
//! counts the outcome. No logic lives here.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use csi_proto::v1::controller_server::Controller;
use csi_proto::v1::identity_server::Identity;
use csi_proto::v1::node_server::Node;
use csi_proto::v1::*;
use tonic::{Code, Request, Response, Status};

use crate::driver::{DRIVER_NAME, Driver};
use crate::status::outcome;

/// The Identity, Controller and Node services over one driver.
#[derive(Clone, Debug)]
pub struct LocalCsi {
    driver: Arc<Driver>,
}

impl LocalCsi {
    /// Services over `driver`.
    pub fn new(driver: Arc<Driver>) -> Self {
        LocalCsi { driver }
    }

    /// A tonic router serving all three services.
    pub fn router(self) -> tonic::transport::server::Router {
        tonic::transport::Server::builder()
            .add_service(identity_server::IdentityServer::new(self.clone()))
            .add_service(controller_server::ControllerServer::new(self.clone()))
            .add_service(node_server::NodeServer::new(self))
    }

    async fn call<T, F>(
        &self,
        operation: &'static str,
        volume: String,
        f: F,
    ) -> Result<Response<T>, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Driver) -> Result<T, Status> + Send + 'static,
    {
        let request_id = next_request_id();
        let start = Instant::now();
        let driver = Arc::clone(&self.driver);
        let result = tokio::task::spawn_blocking(move || f(&driver))
            .await
            .unwrap_or_else(|e| Err(Status::internal(format!("{operation} handler failed: {e}"))));
        let elapsed = start.elapsed();
        let code = result.as_ref().map_or_else(Status::code, |_| Code::Ok);
        let labels = [("operation", operation), ("outcome", outcome(code))];
        metrics::counter!("tak_os_local_csi_operations_total", &labels).increment(1);
        metrics::histogram!("tak_os_local_csi_operation_duration_seconds", &labels)
            .record(elapsed.as_secs_f64());
        let duration_ms = elapsed.as_secs_f64() * 1e3;
        let node = self.driver.node_id();
        match &result {
            Ok(_) => tracing::info!(
                operation,
                volume,
                node,
                outcome = outcome(code),
                duration_ms,
                request_id
            ),
            Err(status) => tracing::warn!(
                operation,
                volume,
                node,
                outcome = outcome(code),
                duration_ms,
                request_id,
                error = status.message()
            ),
        }
        result.map(Response::new)
    }
}

/// A process-unique correlation ID for one request's log line.
fn next_request_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let seed = *SEED.get_or_init(|| RandomState::new().hash_one(std::process::id()));
    format!("{seed:016x}-{:x}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

fn unimplemented<T>(what: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!(
        "{what} is not supported by {DRIVER_NAME}"
    )))
}

#[tonic::async_trait]
impl Identity for LocalCsi {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER_NAME.to_owned(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        use plugin_capability::service::Type;
        let service = |t: Type| PluginCapability {
            r#type: Some(plugin_capability::Type::Service(
                plugin_capability::Service { r#type: t as i32 },
            )),
        };
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: vec![
                service(Type::ControllerService),
                service(Type::VolumeAccessibilityConstraints),
            ],
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        self.call("Probe", String::new(), Driver::probe).await
    }
}

#[tonic::async_trait]
impl Controller for LocalCsi {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let req = request.into_inner();
        let volume = req.name.clone();
        self.call("CreateVolume", volume, move |d| d.create_volume(req))
            .await
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let req = request.into_inner();
        let volume = req.volume_id.clone();
        self.call("DeleteVolume", volume, move |d| d.delete_volume(req))
            .await
    }

    async fn controller_publish_volume(
        &self,
        _: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        unimplemented("ControllerPublishVolume")
    }

    async fn controller_unpublish_volume(
        &self,
        _: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        unimplemented("ControllerUnpublishVolume")
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = request.into_inner();
        let volume = req.volume_id.clone();
        self.call("ValidateVolumeCapabilities", volume, move |d| {
            d.validate_volume_capabilities(req)
        })
        .await
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let req = request.into_inner();
        self.call("ListVolumes", String::new(), move |d| d.list_volumes(req))
            .await
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let req = request.into_inner();
        self.call("GetCapacity", String::new(), move |d| d.get_capacity(req))
            .await
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        use controller_service_capability::rpc::Type;
        let rpc = |t: Type| ControllerServiceCapability {
            r#type: Some(controller_service_capability::Type::Rpc(
                controller_service_capability::Rpc { r#type: t as i32 },
            )),
        };
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: vec![
                rpc(Type::CreateDeleteVolume),
                rpc(Type::GetCapacity),
                rpc(Type::ListVolumes),
                rpc(Type::SingleNodeMultiWriter),
            ],
        }))
    }

    async fn create_snapshot(
        &self,
        _: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        unimplemented("CreateSnapshot")
    }

    async fn delete_snapshot(
        &self,
        _: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        unimplemented("DeleteSnapshot")
    }

    async fn list_snapshots(
        &self,
        _: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        unimplemented("ListSnapshots")
    }

    async fn get_snapshot(
        &self,
        _: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        unimplemented("GetSnapshot")
    }

    async fn controller_expand_volume(
        &self,
        _: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        unimplemented("ControllerExpandVolume")
    }

    async fn controller_get_volume(
        &self,
        _: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        unimplemented("ControllerGetVolume")
    }

    async fn controller_modify_volume(
        &self,
        _: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        unimplemented("ControllerModifyVolume")
    }
}

#[tonic::async_trait]
impl Node for LocalCsi {
    async fn node_stage_volume(
        &self,
        _: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        unimplemented("NodeStageVolume")
    }

    async fn node_unstage_volume(
        &self,
        _: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        unimplemented("NodeUnstageVolume")
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let volume = req.volume_id.clone();
        self.call("NodePublishVolume", volume, move |d| {
            d.node_publish_volume(req)
        })
        .await
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let volume = req.volume_id.clone();
        self.call("NodeUnpublishVolume", volume, move |d| {
            d.node_unpublish_volume(req)
        })
        .await
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let req = request.into_inner();
        let volume = req.volume_id.clone();
        self.call("NodeGetVolumeStats", volume, move |d| {
            d.node_get_volume_stats(req)
        })
        .await
    }

    async fn node_expand_volume(
        &self,
        _: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        unimplemented("NodeExpandVolume")
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::rpc::Type;
        let rpc = |t: Type| NodeServiceCapability {
            r#type: Some(node_service_capability::Type::Rpc(
                node_service_capability::Rpc { r#type: t as i32 },
            )),
        };
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![
                rpc(Type::GetVolumeStats),
                rpc(Type::VolumeCondition),
                rpc(Type::SingleNodeMultiWriter),
            ],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(self.driver.node_get_info()))
    }
}
