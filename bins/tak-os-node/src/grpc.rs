//! The tonic services: each RPC runs its [`Owner`] method, then logs one line and counts the
//! outcome. No logic lives here, and no request body is ever logged (a misconfigured
//! StorageClass may send secrets).

use std::sync::Arc;
use std::time::Instant;

use csi_proto::v1::identity_server::Identity;
use csi_proto::v1::node_server::Node;
use csi_proto::v1::*;
use tonic::{Code, Request, Response, Status};

use crate::error::{Error, category};
use crate::owner::Owner;
use crate::status;

/// The Identity and Node services over one owner.
#[derive(Clone, Debug)]
pub struct NodeService {
    owner: Arc<Owner>,
    driver_name: String,
}

impl NodeService {
    /// Services over `owner`, answering GetPluginInfo with `driver_name`.
    pub fn new(owner: Arc<Owner>, driver_name: impl Into<String>) -> Self {
        NodeService {
            owner,
            driver_name: driver_name.into(),
        }
    }

    /// A tonic router serving both services.
    pub fn router(self) -> tonic::transport::server::Router {
        tonic::transport::Server::builder()
            .add_service(identity_server::IdentityServer::new(self.clone()))
            .add_service(node_server::NodeServer::new(self))
    }

    /// Logs one line and counts one operation for a finished call, and turns its error into
    /// the status the client sees.
    fn observe<T>(
        &self,
        operation: &'static str,
        volume: &str,
        start: Instant,
        result: Result<T, Error>,
    ) -> Result<Response<T>, Status> {
        let elapsed = start.elapsed();
        let code = result.as_ref().map_or_else(status::code, |_| Code::Ok);
        let outcome = csi_proto::code_name(code);
        let labels = [("operation", operation), ("outcome", outcome)];
        metrics::counter!("tak_os_node_operations_total", &labels).increment(1);
        metrics::histogram!("tak_os_node_operation_duration_seconds", &labels)
            .record(elapsed.as_secs_f64());
        let duration_ms = elapsed.as_secs_f64() * 1e3;
        let node = self.owner.config().node_id.as_str();
        let request_id = observe::correlation_id();
        let volume = (!volume.is_empty()).then_some(volume);
        match &result {
            Ok(_) => tracing::info!(operation, volume, node, outcome, duration_ms, request_id),
            Err(error) => {
                let error_category = category(error);
                metrics::counter!("tak_os_node_failures_total", "operation" => operation, "category" => error_category)
                    .increment(1);
                tracing::warn!(
                    operation,
                    volume,
                    node,
                    outcome,
                    duration_ms,
                    request_id,
                    category = error_category,
                    error = error_text::chain(error)
                );
            }
        }
        result.map(Response::new).map_err(Into::into)
    }
}

#[tonic::async_trait]
impl Identity for NodeService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        let response = GetPluginInfoResponse {
            name: self.driver_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            manifest: Default::default(),
        };
        self.observe("GetPluginInfo", "", Instant::now(), Ok(response))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        // A Node service only: no controller, and no topology (any node can mount).
        let response = GetPluginCapabilitiesResponse {
            capabilities: Vec::new(),
        };
        self.observe("GetPluginCapabilities", "", Instant::now(), Ok(response))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        let result = if self.owner.is_ready() {
            Ok(ProbeResponse { ready: Some(true) })
        } else {
            Err(Error::NotReady)
        };
        self.observe("Probe", "", Instant::now(), result)
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let start = Instant::now();
        let req = request.into_inner();
        let result = self.owner.stage(&req).await;
        self.observe("NodeStageVolume", &req.volume_id, start, result)
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let start = Instant::now();
        let req = request.into_inner();
        let result = self.owner.unstage(&req).await;
        self.observe("NodeUnstageVolume", &req.volume_id, start, result)
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let start = Instant::now();
        let req = request.into_inner();
        let result = self.owner.publish(&req).await;
        self.observe("NodePublishVolume", &req.volume_id, start, result)
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let start = Instant::now();
        let req = request.into_inner();
        let result = self.owner.unpublish(&req).await;
        self.observe("NodeUnpublishVolume", &req.volume_id, start, result)
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let start = Instant::now();
        let req = request.into_inner();
        let result = self.owner.volume_stats(&req).await;
        self.observe("NodeGetVolumeStats", &req.volume_id, start, result)
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        let result: Result<NodeExpandVolumeResponse, _> = Err(Error::Unsupported {
            rpc: "NodeExpandVolume",
        });
        self.observe("NodeExpandVolume", &req.volume_id, Instant::now(), result)
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        self.observe(
            "NodeGetCapabilities",
            "",
            Instant::now(),
            Ok(node_capabilities()),
        )
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        let response = NodeGetInfoResponse {
            node_id: self.owner.config().node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        };
        self.observe("NodeGetInfo", "", Instant::now(), Ok(response))
    }
}

/// NodeGetCapabilities' answer.
fn node_capabilities() -> NodeGetCapabilitiesResponse {
    use node_service_capability::rpc::Type;
    csi_proto::node_capabilities(&[
        Type::StageUnstageVolume,
        Type::GetVolumeStats,
        Type::VolumeCondition,
        Type::SingleNodeMultiWriter,
    ])
}
