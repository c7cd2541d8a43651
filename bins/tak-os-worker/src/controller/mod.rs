//! The reference CSI controller: CSI Identity and Controller for the volumes of this leader, so
//! that real CSI tooling (external-provisioner, csi-sanity, the demo) can create and delete
//! replicated volumes. It stands in for the product's manager in tests and demos; it is not that
//! manager (one leader, no placement, no quota).
//!
//! - **CreateVolume** records the volume (generation, capacity, access mode) in
//!   `<state-dir>/controller/`, creates it on this leader, writes development credentials when
//!   `--credentials-dir` is set, and answers with the volume context of the node's contract
//!   (generation, the whole group's endpoints, access mode, credential namespace) and no
//!   topology: any node can mount. It is idempotent on the name: a repeat with the same access
//!   mode and a capacity range holding the recorded capacity returns the same volume (same
//!   generation); anything else is ALREADY_EXISTS.
//! - **DeleteVolume** removes the credentials, the record, then the volume's state and data; an
//!   unknown volume is OK.
//! - **ValidateVolumeCapabilities** confirms capabilities the volume's access mode accepts
//!   (the node's own table, [`replicated_contract::capability`]).
//! - **ControllerGetCapabilities**: CREATE_DELETE_VOLUME and SINGLE_NODE_MULTI_WRITER; every other
//!   controller call is UNIMPLEMENTED.
//!
//! StorageClass parameters: `accessMode` (`rwx` or `rwo`, default `rwx`); keys under
//! `csi.storage.k8s.io/` (the provisioner's own) are ignored and any other key is refused, so a
//! typo in a StorageClass is an error instead of a silently different volume. Secrets are
//! refused and never logged. The capacity is recorded and reported, not enforced: the reference
//! worker has no quota.

pub mod credentials;
pub mod records;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use csi_proto::UnixEndpoint;
use csi_proto::v1::controller_server::Controller;
use csi_proto::v1::identity_server::Identity;
use csi_proto::v1::*;
use replicated_contract::capability::{self, CapabilityError};
use replicated_contract::context::{VolumeContext, VolumeMode};
use tonic::{Code, Request, Response, Status};
use worker::{AccessMode, Admin, Deleted, VolumeSpec};

pub use credentials::{CredentialError, CredentialFiles};
pub use records::{Record, RecordError, Records};

/// The driver name the controller answers with by default: the replicated node's.
pub const DEFAULT_DRIVER_NAME: &str = "csi.replicated.tak-os.org";
/// The StorageClass parameter that chooses the access mode.
pub const ACCESS_MODE_PARAMETER: &str = "accessMode";
/// Parameters under this prefix belong to the external-provisioner and are ignored.
const PROVISIONER_PREFIX: &str = "csi.storage.k8s.io/";

/// How the controller is configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerSettings {
    /// The Unix socket to serve on.
    pub endpoint: UnixEndpoint,
    /// The name GetPluginInfo answers with; the node's driver name.
    pub driver_name: String,
    /// The endpoints of the whole worker group, `https://host:port`, as volume contexts list them.
    pub group_endpoints: Vec<String>,
    /// The namespace of the volumes' Secrets, put in every volume context when set.
    pub credential_namespace: Option<String>,
    /// Where development credentials are written, if anywhere.
    pub credentials: Option<CredentialFiles>,
}

/// What went wrong in a controller call; [`ControllerError::code`] is what the caller sees.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// The request is malformed or asks for something never supported.
    #[error("{0}")]
    InvalidArgument(String),
    /// A volume of that name exists and is not what the request asks for.
    #[error("{0}")]
    AlreadyExists(String),
    /// No such volume.
    #[error("volume {volume_id:?} does not exist")]
    NotFound {
        /// The volume ID.
        volume_id: String,
    },
    /// A controller call this reference does not offer.
    #[error("{rpc} is not supported by the reference controller")]
    Unsupported {
        /// The call.
        rpc: &'static str,
    },
    /// The worker could not create or delete the volume.
    #[error("the worker failed")]
    Worker(#[from] worker::Error),
    /// The controller's record could not be read or written.
    #[error(transparent)]
    Records(#[from] RecordError),
    /// The development credentials could not be written or removed.
    #[error(transparent)]
    Credentials(#[from] CredentialError),
    /// The token for the credentials could not be read.
    #[error("cannot read a token for the volume's credentials")]
    Token(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A blocking task ended without an answer.
    #[error("the controller's blocking task failed")]
    Task,
}

impl ControllerError {
    /// The gRPC code for this error.
    pub fn code(&self) -> Code {
        match self {
            ControllerError::InvalidArgument(_) => Code::InvalidArgument,
            ControllerError::AlreadyExists(_) => Code::AlreadyExists,
            ControllerError::NotFound { .. } => Code::NotFound,
            ControllerError::Unsupported { .. } => Code::Unimplemented,
            ControllerError::Worker(worker::Error::IdentityMismatch { .. }) => Code::AlreadyExists,
            ControllerError::Worker(worker::Error::InvalidVolumeId { .. }) => Code::InvalidArgument,
            ControllerError::Worker(_)
            | ControllerError::Records(_)
            | ControllerError::Credentials(_)
            | ControllerError::Token(_)
            | ControllerError::Task => Code::Internal,
        }
    }
}

impl From<ControllerError> for Status {
    fn from(error: ControllerError) -> Self {
        Status::new(error.code(), error_text::chain(&error))
    }
}

/// The Identity and Controller services over one leader.
#[derive(Clone, Debug)]
pub struct ControllerService {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    admin: Admin,
    settings: ControllerSettings,
    records: Records,
    token_file: PathBuf,
    /// Controller calls that change something run one at a time (a reference, not a scheduler).
    changes: tokio::sync::Mutex<()>,
}

impl ControllerService {
    /// The services for the leader behind `admin`, keeping records in `state_dir`.
    ///
    /// # Errors
    /// The group endpoints are not a valid endpoint list of the node's contract, or the records
    /// directory cannot be opened.
    pub fn new(
        admin: Admin,
        settings: ControllerSettings,
        state_dir: &Path,
        token_file: PathBuf,
    ) -> anyhow::Result<Self> {
        VolumeContext::new(0, &settings.group_endpoints, VolumeMode::Rwx)
            .map_err(|e| anyhow::anyhow!("--group-endpoint: {e}"))?;
        let records = Records::open(state_dir)?;
        Ok(ControllerService {
            inner: Arc::new(Inner {
                admin,
                settings,
                records,
                token_file,
                changes: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// A tonic router serving Identity and Controller.
    pub fn router(self) -> tonic::transport::server::Router {
        tonic::transport::Server::builder()
            .add_service(identity_server::IdentityServer::new(self.clone()))
            .add_service(controller_server::ControllerServer::new(self))
    }

    async fn create(&self, req: CreateVolumeRequest) -> Result<Volume, ControllerError> {
        let name = req.name.clone();
        check_name(&name)?;
        if !req.secrets.is_empty() {
            return Err(invalid(
                "secrets are not accepted: the reference controller takes no credentials from requests",
            ));
        }
        if req.volume_content_source.is_some() {
            return Err(invalid(
                "volume_content_source is not supported: the reference controller creates empty volumes only",
            ));
        }
        let mode = parse_parameters(&req.parameters)?;
        check_capabilities(&req.volume_capabilities, mode)?;
        let range = CapacityRange::from_request(req.capacity_range.as_ref())?;
        let _changing = self.inner.changes.lock().await;
        let inner = Arc::clone(&self.inner);
        let record = blocking(move || inner.create(&name, mode, range)).await?;
        let context = VolumeContext::new(
            record.generation,
            &self.inner.settings.group_endpoints,
            record.mode,
        )
        .map_err(|e| invalid(e.to_string()))?;
        Ok(Volume {
            capacity_bytes: record.capacity_bytes,
            volume_id: record.volume_id,
            volume_context: context.to_map(self.inner.settings.credential_namespace.as_deref()),
            content_source: None,
            accessible_topology: Vec::new(),
        })
    }

    async fn delete(&self, req: &DeleteVolumeRequest) -> Result<(), ControllerError> {
        if req.volume_id.is_empty() {
            return Err(invalid("volume_id is required"));
        }
        if !req.secrets.is_empty() {
            return Err(invalid(
                "secrets are not accepted: the reference controller takes no credentials from requests",
            ));
        }
        // An ID that can never name a volume names no volume: deleting it is done.
        if worker::validate_volume_id(&req.volume_id).is_err() {
            return Ok(());
        }
        let _changing = self.inner.changes.lock().await;
        let inner = Arc::clone(&self.inner);
        let volume_id = req.volume_id.clone();
        blocking(move || inner.forget(&volume_id)).await?;
        let deleted = self.inner.admin.delete_volume(&req.volume_id).await?;
        tracing::info!(
            volume = req.volume_id,
            existed = deleted == Deleted::Removed,
            "deleted"
        );
        Ok(())
    }

    fn validate(
        &self,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse, ControllerError> {
        if req.volume_id.is_empty() {
            return Err(invalid("volume_id is required"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(invalid("volume_capabilities are required"));
        }
        let Some(spec) = worker::validate_volume_id(&req.volume_id)
            .ok()
            .and_then(|()| self.inner.admin.volume(&req.volume_id))
        else {
            return Err(ControllerError::NotFound {
                volume_id: req.volume_id,
            });
        };
        let mode = volume_mode(spec.access_mode);
        let refused = |message: String| ValidateVolumeCapabilitiesResponse {
            confirmed: None,
            message,
        };
        if !req.parameters.is_empty() {
            match parse_parameters(&req.parameters) {
                Ok(asked) if asked == mode => {}
                Ok(asked) => {
                    return Ok(refused(format!(
                        "the volume is {mode}, the parameters ask for {asked}"
                    )));
                }
                Err(error) => return Ok(refused(error.to_string())),
            }
        }
        if let Err(error) = check_capabilities(&req.volume_capabilities, mode) {
            return Ok(refused(error.to_string()));
        }
        Ok(ValidateVolumeCapabilitiesResponse {
            confirmed: Some(validate_volume_capabilities_response::Confirmed {
                volume_context: req.volume_context,
                volume_capabilities: req.volume_capabilities,
                parameters: req.parameters,
                mutable_parameters: req.mutable_parameters,
            }),
            message: String::new(),
        })
    }
}

impl Inner {
    /// Records (or finds) the volume, creates it on the worker and writes its credentials.
    fn create(
        &self,
        name: &str,
        mode: VolumeMode,
        range: CapacityRange,
    ) -> Result<Record, ControllerError> {
        let record = match self.records.get(name)? {
            Some(existing) => {
                if existing.mode != mode {
                    return Err(ControllerError::AlreadyExists(format!(
                        "volume {name:?} exists as an {} volume; this request asks for {mode}",
                        existing.mode
                    )));
                }
                if !range.holds(existing.capacity_bytes) {
                    return Err(ControllerError::AlreadyExists(format!(
                        "volume {name:?} exists with a capacity of {} bytes, outside the requested range {range}",
                        existing.capacity_bytes
                    )));
                }
                existing
            }
            None => {
                if let Some(spec) = self.admin.volume(name) {
                    return Err(ControllerError::AlreadyExists(format!(
                        "volume {name:?} exists on the worker (generation {}) but this controller did not create it; delete it first",
                        spec.volume_generation
                    )));
                }
                let record = Record {
                    volume_id: name.to_owned(),
                    generation: new_generation(),
                    mode,
                    capacity_bytes: range.chosen(),
                };
                self.records.put(&record)?;
                record
            }
        };
        self.admin.create_volume(&VolumeSpec {
            volume_id: record.volume_id.clone(),
            volume_generation: record.generation,
            access_mode: worker_mode(record.mode),
        })?;
        if let Some(files) = &self.settings.credentials {
            let tokens = crate::read_tokens(&self.token_file)
                .map_err(|e| ControllerError::Token(e.into()))?;
            let token = tokens.first().map(String::as_str).unwrap_or_default();
            files.write(name, token)?;
        }
        Ok(record)
    }

    /// Removes the credentials and the record of `volume_id`, first: a crash before the
    /// worker's delete leaves a volume without a record, which a CreateVolume refuses and a
    /// repeated DeleteVolume removes, so a generation is never handed out twice.
    fn forget(&self, volume_id: &str) -> Result<(), ControllerError> {
        if let Some(files) = &self.settings.credentials {
            files.remove(volume_id)?;
        }
        self.records.remove(volume_id)?;
        Ok(())
    }
}

/// A CreateVolume capacity range, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CapacityRange {
    required: i64,
    limit: i64,
}

impl CapacityRange {
    fn from_request(range: Option<&csi_proto::v1::CapacityRange>) -> Result<Self, ControllerError> {
        let Some(range) = range else {
            return Ok(CapacityRange {
                required: 0,
                limit: 0,
            });
        };
        if range.required_bytes < 0 || range.limit_bytes < 0 {
            return Err(invalid(format!(
                "capacity_range has a negative bound (required_bytes {}, limit_bytes {})",
                range.required_bytes, range.limit_bytes
            )));
        }
        if range.limit_bytes > 0 && range.limit_bytes < range.required_bytes {
            return Err(invalid(format!(
                "capacity_range limit_bytes {} is below required_bytes {}",
                range.limit_bytes, range.required_bytes
            )));
        }
        Ok(CapacityRange {
            required: range.required_bytes,
            limit: range.limit_bytes,
        })
    }

    /// The capacity a new volume reports: what was required (0 when nothing was).
    fn chosen(self) -> i64 {
        self.required
    }

    fn holds(self, capacity: i64) -> bool {
        capacity >= self.required && (self.limit == 0 || capacity <= self.limit)
    }
}

impl std::fmt::Display for CapacityRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.limit {
            0 => write!(f, "[{}, any]", self.required),
            limit => write!(f, "[{}, {limit}]", self.required),
        }
    }
}

fn invalid(message: impl Into<String>) -> ControllerError {
    ControllerError::InvalidArgument(message.into())
}

fn check_name(name: &str) -> Result<(), ControllerError> {
    if name.is_empty() {
        return Err(invalid("name is required"));
    }
    worker::validate_volume_id(name).map_err(|e| {
        invalid(format!(
            "name {name:?} cannot be a volume ID: {}",
            error_text::chain(&e)
        ))
    })
}

/// The access mode the parameters ask for; see the module docs.
fn parse_parameters(parameters: &HashMap<String, String>) -> Result<VolumeMode, ControllerError> {
    let mut keys: Vec<&String> = parameters.keys().collect();
    keys.sort();
    let mut mode = VolumeMode::Rwx;
    for key in keys {
        let value = &parameters[key];
        if key == ACCESS_MODE_PARAMETER {
            mode = VolumeMode::parse(value).ok_or_else(|| {
                invalid(format!(
                    "parameters[{ACCESS_MODE_PARAMETER:?}] = {value:?} is invalid: expected rwx or rwo"
                ))
            })?;
        } else if !key.starts_with(PROVISIONER_PREFIX) {
            return Err(invalid(format!(
                "parameter {key:?} is unknown: the reference controller takes only {ACCESS_MODE_PARAMETER:?}"
            )));
        }
    }
    Ok(mode)
}

fn check_capabilities(
    capabilities: &[VolumeCapability],
    mode: VolumeMode,
) -> Result<(), ControllerError> {
    if capabilities.is_empty() {
        return Err(invalid("volume_capabilities are required"));
    }
    for capability in capabilities {
        capability::check(Some(capability), mode).map_err(|error| match error {
            CapabilityError::Unsupported(_) => invalid(error.to_string()),
            CapabilityError::ExceedsVolume { .. } => invalid(format!(
                "{error} (set the StorageClass parameter {ACCESS_MODE_PARAMETER} to match the claim's access modes)"
            )),
        })?;
    }
    Ok(())
}

fn worker_mode(mode: VolumeMode) -> AccessMode {
    match mode {
        VolumeMode::Rwx => AccessMode::Rwx,
        VolumeMode::Rwo => AccessMode::Rwo,
    }
}

fn volume_mode(mode: AccessMode) -> VolumeMode {
    match mode {
        AccessMode::Rwx => VolumeMode::Rwx,
        AccessMode::Rwo => VolumeMode::Rwo,
    }
}

/// A generation for a new volume: the time in milliseconds, so that a name reused after a
/// delete gets a larger one.
fn new_generation() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(now.as_millis()).unwrap_or(u64::MAX).max(1)
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ControllerError> + Send + 'static,
) -> Result<T, ControllerError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|_| ControllerError::Task)?
}

/// Logs one line for a finished call and turns its error into the caller's status. Request
/// bodies are never logged: a misconfigured StorageClass may send secrets.
fn observe<T>(
    operation: &'static str,
    volume: &str,
    start: Instant,
    result: Result<T, ControllerError>,
) -> Result<Response<T>, Status> {
    let duration_ms = start.elapsed().as_secs_f64() * 1e3;
    let volume = (!volume.is_empty()).then_some(volume);
    match &result {
        Ok(_) => tracing::info!(operation, volume, outcome = "ok", duration_ms),
        Err(error) => tracing::warn!(
            operation,
            volume,
            outcome = csi_proto::code_name(error.code()),
            duration_ms,
            error = error_text::chain(error)
        ),
    }
    result.map(Response::new).map_err(Into::into)
}

#[tonic::async_trait]
impl Identity for ControllerService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        let response = GetPluginInfoResponse {
            name: self.inner.settings.driver_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            manifest: HashMap::new(),
        };
        observe("GetPluginInfo", "", Instant::now(), Ok(response))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        use plugin_capability::service::Type;
        // A controller, and no topology: any node can mount a replicated volume.
        let response = GetPluginCapabilitiesResponse {
            capabilities: vec![PluginCapability {
                r#type: Some(plugin_capability::Type::Service(
                    plugin_capability::Service {
                        r#type: Type::ControllerService as i32,
                    },
                )),
            }],
        };
        observe("GetPluginCapabilities", "", Instant::now(), Ok(response))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        // Served only once the leader has opened every volume.
        let response = ProbeResponse { ready: Some(true) };
        observe("Probe", "", Instant::now(), Ok(response))
    }
}

/// Answers a controller call this reference does not offer.
fn unsupported<T>(rpc: &'static str) -> Result<Response<T>, Status> {
    observe(
        rpc,
        "",
        Instant::now(),
        Err(ControllerError::Unsupported { rpc }),
    )
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let start = Instant::now();
        let req = request.into_inner();
        let name = req.name.clone();
        let result = self.create(req).await.map(|volume| CreateVolumeResponse {
            volume: Some(volume),
        });
        observe("CreateVolume", &name, start, result)
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let start = Instant::now();
        let req = request.into_inner();
        let result = self.delete(&req).await.map(|()| DeleteVolumeResponse {});
        observe("DeleteVolume", &req.volume_id, start, result)
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let start = Instant::now();
        let req = request.into_inner();
        let volume_id = req.volume_id.clone();
        let result = self.validate(req);
        observe("ValidateVolumeCapabilities", &volume_id, start, result)
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        use controller_service_capability::rpc::Type;
        let capabilities = [Type::CreateDeleteVolume, Type::SingleNodeMultiWriter]
            .into_iter()
            .map(|t| ControllerServiceCapability {
                r#type: Some(controller_service_capability::Type::Rpc(
                    controller_service_capability::Rpc { r#type: t as i32 },
                )),
            })
            .collect();
        let response = ControllerGetCapabilitiesResponse { capabilities };
        observe(
            "ControllerGetCapabilities",
            "",
            Instant::now(),
            Ok(response),
        )
    }

    async fn controller_publish_volume(
        &self,
        _: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        unsupported("ControllerPublishVolume")
    }

    async fn controller_unpublish_volume(
        &self,
        _: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        unsupported("ControllerUnpublishVolume")
    }

    async fn list_volumes(
        &self,
        _: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        unsupported("ListVolumes")
    }

    async fn get_capacity(
        &self,
        _: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        unsupported("GetCapacity")
    }

    async fn create_snapshot(
        &self,
        _: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        unsupported("CreateSnapshot")
    }

    async fn delete_snapshot(
        &self,
        _: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        unsupported("DeleteSnapshot")
    }

    async fn list_snapshots(
        &self,
        _: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        unsupported("ListSnapshots")
    }

    async fn get_snapshot(
        &self,
        _: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        unsupported("GetSnapshot")
    }

    async fn controller_expand_volume(
        &self,
        _: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        unsupported("ControllerExpandVolume")
    }

    async fn controller_get_volume(
        &self,
        _: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        unsupported("ControllerGetVolume")
    }

    async fn controller_modify_volume(
        &self,
        _: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        unsupported("ControllerModifyVolume")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_choose_the_mode_and_refuse_what_they_do_not_know() {
        let params = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<HashMap<_, _>>()
        };
        assert_eq!(parse_parameters(&params(&[])).unwrap(), VolumeMode::Rwx);
        assert_eq!(
            parse_parameters(&params(&[
                ("accessMode", "rwo"),
                ("csi.storage.k8s.io/pv/name", "pv-1"),
                ("csi.storage.k8s.io/pvc/namespace", "default"),
            ]))
            .unwrap(),
            VolumeMode::Rwo
        );
        let error = parse_parameters(&params(&[("accessMode", "RWO")])).unwrap_err();
        assert!(error.to_string().contains("\"RWO\" is invalid"), "{error}");
        let error = parse_parameters(&params(&[("acessMode", "rwo")])).unwrap_err();
        assert!(
            error.to_string().contains("\"acessMode\" is unknown"),
            "{error}"
        );
        assert_eq!(error.code(), Code::InvalidArgument);
    }

    #[test]
    fn capacity_ranges_are_checked_and_held() {
        let range = |required, limit| {
            CapacityRange::from_request(Some(&csi_proto::v1::CapacityRange {
                required_bytes: required,
                limit_bytes: limit,
            }))
        };
        assert!(range(10, 5).is_err());
        assert!(range(-1, 0).is_err());
        let any = CapacityRange::from_request(None).unwrap();
        assert_eq!(any.chosen(), 0);
        assert!(any.holds(0) && any.holds(1 << 40));
        let r = range(100, 200).unwrap();
        assert_eq!(r.chosen(), 100);
        assert!(r.holds(100) && r.holds(200));
        assert!(!r.holds(99) && !r.holds(201));
        assert!(range(100, 0).unwrap().holds(1 << 40));
        assert_eq!(r.to_string(), "[100, 200]");
    }

    #[test]
    fn generations_grow_with_time() {
        let first = new_generation();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(new_generation() > first);
    }
}
