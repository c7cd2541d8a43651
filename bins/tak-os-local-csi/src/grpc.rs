//! The tonic services: each RPC runs its `Driver` method on a blocking thread, then logs and
//! counts the outcome. No logic lives here.

use std::sync::Arc;
use std::time::Instant;

use csi_proto::v1::controller_server::Controller;
use csi_proto::v1::identity_server::Identity;
use csi_proto::v1::node_server::Node;
use csi_proto::v1::*;
use tonic::{Code, Request, Response, Status};

use crate::driver::{DRIVER_NAME, Driver};
use crate::error::Error;
use crate::status::{self, outcome};

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

    /// Runs a handler on a blocking thread, then logs and counts its outcome.
    async fn call<T, F>(
        &self,
        operation: &'static str,
        subject: Subject,
        f: F,
    ) -> Result<Response<T>, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Driver) -> Result<T, Error> + Send + 'static,
    {
        let start = Instant::now();
        let driver = Arc::clone(&self.driver);
        let result = tokio::task::spawn_blocking(move || f(&driver))
            .await
            .unwrap_or_else(|source| Err(Error::HandlerFailed { operation, source }));
        self.observe(operation, &subject, start, result)
    }

    /// Answers a call that touches nothing (capabilities, plugin and node info) in place, logged
    /// and counted like every other call.
    fn answer<T>(
        &self,
        operation: &'static str,
        f: impl FnOnce() -> Result<T, Error>,
    ) -> Result<Response<T>, Status> {
        let start = Instant::now();
        let result = f();
        self.observe(operation, &Subject::default(), start, result)
    }

    /// Refuses, logged and counted, an RPC the driver does not implement.
    fn refuse<T>(&self, rpc: &'static str) -> Result<Response<T>, Status> {
        self.answer(rpc, || Err(Error::Unsupported { rpc }))
    }

    /// Logs one line and counts one operation for a finished call, and turns its error into the
    /// status the client sees.
    fn observe<T>(
        &self,
        operation: &'static str,
        subject: &Subject,
        start: Instant,
        result: Result<T, Error>,
    ) -> Result<Response<T>, Status> {
        let elapsed = start.elapsed();
        let code = result.as_ref().map_or_else(status::code, |_| Code::Ok);
        let labels = [("operation", operation), ("outcome", outcome(code))];
        metrics::counter!("tak_os_local_csi_operations_total", &labels).increment(1);
        metrics::histogram!("tak_os_local_csi_operation_duration_seconds", &labels)
            .record(elapsed.as_secs_f64());
        let duration_ms = elapsed.as_secs_f64() * 1e3;
        let node = self.driver.node_id();
        let request_id = ::observe::correlation_id();
        let volume = subject.volume.as_deref();
        let name = subject.name.as_deref();
        match &result {
            Ok(_) => tracing::info!(
                operation,
                volume,
                name,
                node,
                outcome = outcome(code),
                duration_ms,
                request_id
            ),
            Err(error) => tracing::warn!(
                operation,
                volume,
                name,
                node,
                outcome = outcome(code),
                duration_ms,
                request_id,
                error = status::chain(error)
            ),
        }
        result.map(Response::new).map_err(Into::into)
    }
}

/// What a call is about, for its log line: `volume` is always a volume ID, `name` a CSI
/// volume name (CreateVolume's). Absent fields are not written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subject {
    /// The volume ID.
    pub volume: Option<String>,
    /// The CSI name the volume was created with.
    pub name: Option<String>,
}

impl Subject {
    /// A call about the volume with this ID (none when the request left it empty).
    pub fn volume(volume_id: &str) -> Self {
        Subject {
            volume: (!volume_id.is_empty()).then(|| volume_id.to_owned()),
            name: None,
        }
    }

    /// CreateVolume of `name`: the name, and the volume ID it maps to on this node when the
    /// name is valid.
    pub fn creation(driver: &Driver, name: &str) -> Self {
        Subject {
            volume: driver.store().volume_id(name).ok().map(|id| id.to_string()),
            name: (!name.is_empty()).then(|| name.to_owned()),
        }
    }
}

#[tonic::async_trait]
impl Identity for LocalCsi {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        self.answer("GetPluginInfo", || Ok(plugin_info()))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        self.answer("GetPluginCapabilities", || Ok(plugin_capabilities()))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        self.call("Probe", Subject::default(), Driver::probe).await
    }
}

#[tonic::async_trait]
impl Controller for LocalCsi {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let req = request.into_inner();
        let subject = Subject::creation(&self.driver, &req.name);
        self.call("CreateVolume", subject, move |d| d.create_volume(req))
            .await
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let req = request.into_inner();
        let subject = Subject::volume(&req.volume_id);
        self.call("DeleteVolume", subject, move |d| d.delete_volume(req))
            .await
    }

    async fn controller_publish_volume(
        &self,
        _: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        self.refuse("ControllerPublishVolume")
    }

    async fn controller_unpublish_volume(
        &self,
        _: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        self.refuse("ControllerUnpublishVolume")
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = request.into_inner();
        let subject = Subject::volume(&req.volume_id);
        self.call("ValidateVolumeCapabilities", subject, move |d| {
            d.validate_volume_capabilities(req)
        })
        .await
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let req = request.into_inner();
        self.call("ListVolumes", Subject::default(), move |d| {
            d.list_volumes(req)
        })
        .await
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let req = request.into_inner();
        self.call("GetCapacity", Subject::default(), move |d| {
            d.get_capacity(req)
        })
        .await
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        self.answer(
            "ControllerGetCapabilities",
            || Ok(controller_capabilities()),
        )
    }

    async fn create_snapshot(
        &self,
        _: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        self.refuse("CreateSnapshot")
    }

    async fn delete_snapshot(
        &self,
        _: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        self.refuse("DeleteSnapshot")
    }

    async fn list_snapshots(
        &self,
        _: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        self.refuse("ListSnapshots")
    }

    async fn get_snapshot(
        &self,
        _: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        self.refuse("GetSnapshot")
    }

    async fn controller_expand_volume(
        &self,
        _: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        self.refuse("ControllerExpandVolume")
    }

    async fn controller_get_volume(
        &self,
        _: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        self.refuse("ControllerGetVolume")
    }

    async fn controller_modify_volume(
        &self,
        _: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        self.refuse("ControllerModifyVolume")
    }
}

#[tonic::async_trait]
impl Node for LocalCsi {
    async fn node_stage_volume(
        &self,
        _: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        self.refuse("NodeStageVolume")
    }

    async fn node_unstage_volume(
        &self,
        _: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        self.refuse("NodeUnstageVolume")
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let subject = Subject::volume(&req.volume_id);
        self.call("NodePublishVolume", subject, move |d| {
            d.node_publish_volume(req)
        })
        .await
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let subject = Subject::volume(&req.volume_id);
        self.call("NodeUnpublishVolume", subject, move |d| {
            d.node_unpublish_volume(req)
        })
        .await
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let req = request.into_inner();
        let subject = Subject::volume(&req.volume_id);
        self.call("NodeGetVolumeStats", subject, move |d| {
            d.node_get_volume_stats(req)
        })
        .await
    }

    async fn node_expand_volume(
        &self,
        _: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        self.refuse("NodeExpandVolume")
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        self.answer("NodeGetCapabilities", || Ok(node_capabilities()))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        self.answer("NodeGetInfo", || Ok(self.driver.node_get_info()))
    }
}

/// GetPluginInfo's answer: the driver's name and version.
fn plugin_info() -> GetPluginInfoResponse {
    GetPluginInfoResponse {
        name: DRIVER_NAME.to_owned(),
        vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
        manifest: Default::default(),
    }
}

/// GetPluginCapabilities' answer: a controller service, and topology.
fn plugin_capabilities() -> GetPluginCapabilitiesResponse {
    use plugin_capability::service::Type;
    let service = |t: Type| PluginCapability {
        r#type: Some(plugin_capability::Type::Service(
            plugin_capability::Service { r#type: t as i32 },
        )),
    };
    GetPluginCapabilitiesResponse {
        capabilities: vec![
            service(Type::ControllerService),
            service(Type::VolumeAccessibilityConstraints),
        ],
    }
}

/// ControllerGetCapabilities' answer.
fn controller_capabilities() -> ControllerGetCapabilitiesResponse {
    use controller_service_capability::rpc::Type;
    let rpc = |t: Type| ControllerServiceCapability {
        r#type: Some(controller_service_capability::Type::Rpc(
            controller_service_capability::Rpc { r#type: t as i32 },
        )),
    };
    ControllerGetCapabilitiesResponse {
        capabilities: vec![
            rpc(Type::CreateDeleteVolume),
            rpc(Type::GetCapacity),
            rpc(Type::ListVolumes),
            rpc(Type::SingleNodeMultiWriter),
        ],
    }
}

/// NodeGetCapabilities' answer.
fn node_capabilities() -> NodeGetCapabilitiesResponse {
    use node_service_capability::rpc::Type;
    csi_proto::node_capabilities(&[
        Type::GetVolumeStats,
        Type::VolumeCondition,
        Type::SingleNodeMultiWriter,
    ])
}

#[cfg(test)]
mod tests {

    use localstore::{Store, StoreOptions};
    use mounter::{FakeMounter, Mounter, TargetRoot};

    use super::*;
    use crate::observe::Captured;

    /// The JSON log lines `logs` holds.
    fn lines(logs: &Captured) -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&logs.bytes())
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    fn driver(dir: &std::path::Path) -> Arc<Driver> {
        for sub in ["store", "kubelet"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let store = Store::open(dir.join("store"), StoreOptions::new("node-a")).unwrap();
        let mounter: Arc<dyn Mounter> = Arc::new(FakeMounter::new());
        let kubelet = TargetRoot::new(dir.join("kubelet")).unwrap();
        Arc::new(Driver::new(store, mounter, kubelet, None, 0).unwrap())
    }

    #[test]
    fn subjects_keep_names_and_volume_ids_apart() {
        assert_eq!(Subject::volume(""), Subject::default());
        assert_eq!(Subject::volume("v1.a.b").volume.as_deref(), Some("v1.a.b"));
        let dir = tempfile::tempdir().unwrap();
        let driver = driver(dir.path());
        let subject = Subject::creation(&driver, "pvc-1");
        assert_eq!(subject.name.as_deref(), Some("pvc-1"));
        let id = driver.store().volume_id("pvc-1").unwrap().to_string();
        assert_eq!(subject.volume, Some(id));
        assert_eq!(Subject::creation(&driver, ""), Subject::default());
    }

    #[test]
    fn every_rpc_is_logged_with_fields_that_mean_one_thing() {
        let dir = tempfile::tempdir().unwrap();
        let csi = LocalCsi::new(driver(dir.path()));
        let logs = Captured::default();
        let writer = logs.clone();
        let subscriber = ::observe::subscriber(
            ::observe::LogFormat::Json,
            tracing_subscriber::EnvFilter::new("info"),
            false,
            move || writer.clone(),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let volume_id = tracing::subscriber::with_default(subscriber, || {
            rt.block_on(async {
                csi.get_plugin_info(Request::new(Default::default()))
                    .await
                    .unwrap();
                csi.get_plugin_capabilities(Request::new(Default::default()))
                    .await
                    .unwrap();
                csi.probe(Request::new(Default::default())).await.unwrap();
                csi.controller_get_capabilities(Request::new(Default::default()))
                    .await
                    .unwrap();
                csi.node_get_capabilities(Request::new(Default::default()))
                    .await
                    .unwrap();
                csi.node_get_info(Request::new(Default::default()))
                    .await
                    .unwrap();
                let create = CreateVolumeRequest {
                    name: "pvc-logged".to_owned(),
                    volume_capabilities: vec![VolumeCapability {
                        access_mode: Some(volume_capability::AccessMode {
                            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
                        }),
                        access_type: Some(volume_capability::AccessType::Mount(Default::default())),
                    }],
                    ..Default::default()
                };
                let volume = csi.create_volume(Request::new(create)).await.unwrap();
                let volume_id = volume.into_inner().volume.unwrap().volume_id;
                let delete = DeleteVolumeRequest {
                    volume_id: volume_id.clone(),
                    ..Default::default()
                };
                csi.delete_volume(Request::new(delete)).await.unwrap();
                let refused = csi
                    .create_snapshot(Request::new(Default::default()))
                    .await
                    .unwrap_err();
                assert_eq!(refused.code(), Code::Unimplemented);
                volume_id
            })
        });

        let lines = lines(&logs);
        let operations: Vec<&str> = lines
            .iter()
            .map(|line| line["operation"].as_str().unwrap())
            .collect();
        assert_eq!(
            operations,
            [
                "GetPluginInfo",
                "GetPluginCapabilities",
                "Probe",
                "ControllerGetCapabilities",
                "NodeGetCapabilities",
                "NodeGetInfo",
                "CreateVolume",
                "DeleteVolume",
                "CreateSnapshot",
            ]
        );
        for line in &lines {
            assert_eq!(line["node"], "node-a", "{line}");
            assert!(line["duration_ms"].is_number(), "{line}");
            assert!(line["request_id"].is_string(), "{line}");
        }
        let create = &lines[6];
        assert_eq!(create["name"], "pvc-logged");
        assert_eq!(create["volume"], volume_id.as_str());
        assert_eq!(create["outcome"], "ok");
        let delete = &lines[7];
        assert_eq!(delete["volume"], volume_id.as_str());
        assert!(delete.get("name").is_none(), "{delete}");
        assert!(lines[0].get("volume").is_none(), "{}", lines[0]);
        let refused = &lines[8];
        assert_eq!(refused["outcome"], "unimplemented");
        assert_eq!(refused["level"], "WARN");
        assert_eq!(
            refused["error"],
            "CreateSnapshot is not supported by csi.local.tak-os.org"
        );
    }
}
