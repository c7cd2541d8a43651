//! The driver's logic, synchronous and free of gRPC plumbing: each method takes a CSI request
//! and returns its response or a status. `grpc.rs` runs them on blocking threads.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use csi_proto::v1::*;
use localstore::{CapacityRange, CreateRequest, Store, VolumeId, VolumeRecord, VolumeState};
use mounter::{MountIdentity, MountedAt, Mounter, Target, TargetRoot};
use tonic::Status;

use crate::capability::{AccessMode, Capability};
use crate::place::Place;
use crate::status::{self, missing};

/// The plugin name.
pub const DRIVER_NAME: &str = "csi.local.tak-os.org";
/// The topology key; its value is the node hash (DESIGN.md 3.1).
pub const TOPOLOGY_KEY: &str = "csi.local.tak-os.org/node";
/// Parameter keys the external-provisioner may add; any other parameter is refused.
const PROVISIONER_PARAMETER_PREFIX: &str = "csi.storage.k8s.io/";
/// Mode of a target directory the driver creates.
const TARGET_DIR_MODE: u32 = 0o750;
/// How many stacked mounts of one volume an unpublish removes from one target at most.
const MAX_STACKED_MOUNTS: usize = 16;

/// What the driver needs to run.
#[derive(Debug)]
pub struct Driver {
    store: Store,
    mounter: Arc<dyn Mounter>,
    kubelet_root: TargetRoot,
    consumer_root: Option<TargetRoot>,
    max_volumes_per_node: i64,
    /// The mount the store was on when the driver started; Probe fails if that changes (a
    /// disk unmounted underneath a running driver).
    store_mount_id: u64,
}

impl Driver {
    /// A driver over an open store.
    pub fn new(
        store: Store,
        mounter: Arc<dyn Mounter>,
        kubelet_root: TargetRoot,
        consumer_root: Option<TargetRoot>,
        max_volumes_per_node: i64,
    ) -> Result<Self, mounter::Error> {
        let store_mount_id = mounter.source_mount(store.root())?.mount_id;
        Ok(Driver {
            store,
            mounter,
            kubelet_root,
            consumer_root,
            max_volumes_per_node,
            store_mount_id,
        })
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// This node's name (its CSI node ID).
    pub fn node_id(&self) -> &str {
        self.store.node_name()
    }

    fn segment(&self) -> HashMap<String, String> {
        HashMap::from([(TOPOLOGY_KEY.to_owned(), self.store.node_hash().to_string())])
    }

    fn topology(&self) -> Topology {
        Topology {
            segments: self.segment(),
        }
    }

    /// Whether a topology names this node.
    fn is_this_node(&self, topology: &Topology) -> bool {
        topology.segments.get(TOPOLOGY_KEY) == Some(&self.store.node_hash().to_string())
    }

    // ----- Identity -----

    /// Probe: ready while the store is where it was opened: the same mount, its metadata
    /// directory present, and its filesystem answering.
    pub fn probe(&self) -> Result<ProbeResponse, Status> {
        let root = self.store.root();
        let now = self
            .mounter
            .source_mount(root)
            .map_err(|e| status::mount(&e))?;
        if now.mount_id != self.store_mount_id {
            return Err(Status::failed_precondition(format!(
                "the store {root:?} is no longer on the mount it was opened on (was mount {}, now {})",
                self.store_mount_id, now.mount_id
            )));
        }
        let metadata = root.join(localstore::METADATA_DIR);
        rustix::fs::statx(
            rustix::fs::CWD,
            &metadata,
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW | rustix::fs::AtFlags::STATX_DONT_SYNC,
            rustix::fs::StatxFlags::TYPE,
        )
        .map_err(|e| {
            Status::failed_precondition(format!("the store's {metadata:?} is gone: {e}"))
        })?;
        self.store.capacity().map_err(|e| status::store(&e))?;
        Ok(ProbeResponse { ready: Some(true) })
    }

    // ----- Controller -----

    /// CreateVolume, for this node only.
    pub fn create_volume(&self, req: CreateVolumeRequest) -> Result<CreateVolumeResponse, Status> {
        if req.name.is_empty() {
            return Err(missing("name"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(missing("volume_capabilities"));
        }
        let capabilities = req
            .volume_capabilities
            .iter()
            .map(|c| Capability::from_csi(c).map(|c| c.to_record()))
            .collect::<Result<_, _>>()
            .map_err(Status::invalid_argument)?;
        if let Some(key) = req
            .parameters
            .keys()
            .find(|k| !k.starts_with(PROVISIONER_PARAMETER_PREFIX))
        {
            return Err(Status::invalid_argument(format!(
                "parameter {key:?} is not supported: the local driver takes no storage class parameters"
            )));
        }
        if !req.mutable_parameters.is_empty() {
            return Err(Status::invalid_argument(
                "mutable_parameters are not supported",
            ));
        }
        if req.volume_content_source.is_some() {
            return Err(Status::invalid_argument(
                "volume_content_source is not supported: no snapshots or clones",
            ));
        }
        let capacity = match req.capacity_range {
            None => None,
            Some(range) => Some(capacity_range(range)?),
        };
        if let Some(requirement) = &req.accessibility_requirements
            && !requirement.requisite.is_empty()
            && !requirement.requisite.iter().any(|t| self.is_this_node(t))
        {
            return Err(Status::resource_exhausted(format!(
                "node {} is not in the requisite topology; the volume can only live on this node",
                self.node_id()
            )));
        }
        let request = CreateRequest {
            name: req.name,
            capacity,
            capabilities,
            parameters: req.parameters.into_iter().collect(),
        };
        let record = self.store.create(&request).map_err(|e| status::store(&e))?;
        Ok(CreateVolumeResponse {
            volume: Some(self.volume(&record)),
        })
    }

    fn volume(&self, record: &VolumeRecord) -> Volume {
        Volume {
            capacity_bytes: i64::try_from(record.capacity_bytes).unwrap_or(i64::MAX),
            volume_id: record.volume_id.to_string(),
            volume_context: HashMap::new(),
            content_source: None,
            accessible_topology: vec![self.topology()],
        }
    }

    /// DeleteVolume: unknown volumes are deleted already; another node's are refused.
    pub fn delete_volume(&self, req: DeleteVolumeRequest) -> Result<DeleteVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(missing("volume_id"));
        }
        // An ID this driver could never have issued names no volume of ours: nothing to delete.
        let Ok(volume_id) = VolumeId::from_str(&req.volume_id) else {
            return Ok(DeleteVolumeResponse {});
        };
        let guard = self
            .store
            .lock_volume(&volume_id)
            .map_err(|e| status::store(&e))?;
        if guard.record().map_err(|e| status::store(&e))?.is_none() {
            return Ok(DeleteVolumeResponse {});
        }
        let mounted = self.publications(&volume_id)?;
        if let Some(target) = mounted.first() {
            return Err(Status::failed_precondition(format!(
                "volume {volume_id} is still mounted at {target:?} ({} mounts); unpublish it first",
                mounted.len()
            )));
        }
        guard.delete().map_err(|e| status::store(&e))?;
        Ok(DeleteVolumeResponse {})
    }

    /// ValidateVolumeCapabilities.
    pub fn validate_volume_capabilities(
        &self,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(missing("volume_id"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(missing("volume_capabilities"));
        }
        let record = self.record(&req.volume_id)?;
        let mut unsupported = Vec::new();
        for requested in &req.volume_capabilities {
            match Capability::from_csi(requested) {
                Err(problem) => unsupported.push(problem),
                Ok(c) if !record.capabilities.contains(&c.to_record()) => {
                    unsupported.push(format!(
                        "the volume was not created with {} and mount flags {:?}",
                        c.to_record().access_mode,
                        c.mount_flags
                    ))
                }
                Ok(_) => {}
            }
        }
        if !unsupported.is_empty() {
            return Ok(ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: unsupported.join("; "),
            });
        }
        if let Some(key) = req
            .parameters
            .keys()
            .find(|k| record.parameters.get(*k) != req.parameters.get(*k))
        {
            return Ok(ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: format!("parameter {key:?} differs from the volume's"),
            });
        }
        Ok(ValidateVolumeCapabilitiesResponse {
            confirmed: Some(validate_volume_capabilities_response::Confirmed {
                volume_context: req.volume_context,
                volume_capabilities: req.volume_capabilities,
                parameters: req.parameters,
                mutable_parameters: HashMap::new(),
            }),
            message: String::new(),
        })
    }

    /// ListVolumes, ordered by volume ID; the token is the last ID of the previous page.
    pub fn list_volumes(&self, req: ListVolumesRequest) -> Result<ListVolumesResponse, Status> {
        let max_entries = usize::try_from(req.max_entries).map_err(|_| {
            Status::invalid_argument(format!("max_entries {} is negative", req.max_entries))
        })?;
        let after = if req.starting_token.is_empty() {
            None
        } else {
            Some(VolumeId::from_str(&req.starting_token).map_err(|_| {
                Status::aborted(format!(
                    "starting_token {:?} was not issued by this driver",
                    req.starting_token
                ))
            })?)
        };
        let records = self.store.list().map_err(|e| status::store(&e))?;
        let mut ready = records
            .iter()
            .filter(|r| r.state == VolumeState::Ready)
            .filter(|r| after.is_none_or(|after| r.volume_id.to_string() > after.to_string()))
            .peekable();
        let limit = if max_entries == 0 {
            usize::MAX
        } else {
            max_entries
        };
        let mut entries = Vec::new();
        let mut last = None;
        while entries.len() < limit {
            let Some(record) = ready.next() else { break };
            last = Some(record.volume_id);
            entries.push(list_volumes_response::Entry {
                volume: Some(self.volume(record)),
                status: None,
            });
        }
        let next_token = match (ready.peek(), last) {
            (Some(_), Some(last)) => last.to_string(),
            _ => String::new(),
        };
        Ok(ListVolumesResponse {
            entries,
            next_token,
        })
    }

    /// GetCapacity: free space for this node's topology, 0 for any other.
    pub fn get_capacity(&self, req: GetCapacityRequest) -> Result<GetCapacityResponse, Status> {
        let ours = req
            .accessible_topology
            .as_ref()
            .is_none_or(|t| self.is_this_node(t));
        let supported = req
            .volume_capabilities
            .iter()
            .all(|c| Capability::from_csi(c).is_ok())
            && req
                .parameters
                .keys()
                .all(|k| k.starts_with(PROVISIONER_PARAMETER_PREFIX));
        if !ours || !supported {
            return Ok(GetCapacityResponse {
                available_capacity: 0,
                maximum_volume_size: Some(0),
                minimum_volume_size: None,
            });
        }
        let capacity = self.store.capacity().map_err(|e| status::store(&e))?;
        let available = i64::try_from(capacity.available_bytes).unwrap_or(i64::MAX);
        Ok(GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: Some(available),
            minimum_volume_size: None,
        })
    }

    // ----- Node -----

    /// NodeGetInfo.
    pub fn node_get_info(&self) -> NodeGetInfoResponse {
        NodeGetInfoResponse {
            node_id: self.node_id().to_owned(),
            max_volumes_per_node: self.max_volumes_per_node,
            accessible_topology: Some(self.topology()),
        }
    }

    /// NodePublishVolume: a bind mount of the data directory, never creating it.
    pub fn node_publish_volume(
        &self,
        req: NodePublishVolumeRequest,
    ) -> Result<NodePublishVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(missing("volume_id"));
        }
        if req.target_path.is_empty() {
            return Err(missing("target_path"));
        }
        let capability = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| missing("volume_capability"))?;
        let capability = Capability::from_csi(capability).map_err(Status::invalid_argument)?;
        let target_path = PathBuf::from(&req.target_path);
        let place = Place::of(
            &target_path,
            &self.kubelet_root,
            self.consumer_root.as_ref(),
        )?;
        let volume_id = self.volume_id(&req.volume_id)?;

        let guard = self
            .store
            .lock_volume(&volume_id)
            .map_err(|e| status::store(&e))?;
        let source = self
            .store
            .publish_path(&volume_id)
            .map_err(|e| status::store(&e))?;
        let target = place
            .root()
            .resolve(&target_path)
            .map_err(|e| status::mount(&e))?;
        let volume = self.volume_mount(&volume_id)?;
        let expected = volume.identity;
        let options = capability.bind_options(req.readonly);
        let expected_attrs = options.attrs.union(volume.attrs);

        if let Some(found) = self
            .mounter
            .mounted_at(&target)
            .map_err(|e| status::mount(&e))?
        {
            if found.identity != expected {
                return Err(self.occupied(&target_path, &found.identity)?);
            }
            if found.attrs != expected_attrs {
                return Err(Status::already_exists(format!(
                    "volume {volume_id} is already published at {target_path:?} with other options \
                     (mounted {:?}, requested {:?})",
                    found.attrs, expected_attrs
                )));
            }
            return Ok(NodePublishVolumeResponse {});
        }

        let claim = self
            .store
            .claim_of(&volume_id)
            .map_err(|e| status::store(&e))?;
        match (place, claim) {
            (Place::Consumer(_), Some(claim)) if claim.target == target_path => {} // resuming
            (Place::Consumer(_) | Place::Kubelet(_), Some(claim)) => {
                return Err(Status::failed_precondition(format!(
                    "volume {volume_id} is claimed by the trusted consumer target {:?}",
                    claim.target
                )));
            }
            (Place::Consumer(_), None) => {
                if let Some(other) = self.publications(&volume_id)?.first() {
                    return Err(Status::failed_precondition(format!(
                        "volume {volume_id} is published at {other:?}; a consumer cannot claim it"
                    )));
                }
                guard.claim(&target_path).map_err(|e| status::store(&e))?;
            }
            (Place::Kubelet(_), None) => {
                if capability.access_mode == AccessMode::SingleNodeSingleWriter
                    && let Some(other) = self.publications(&volume_id)?.first()
                {
                    return Err(Status::failed_precondition(format!(
                        "volume {volume_id} is SINGLE_NODE_SINGLE_WRITER and already published at {other:?}"
                    )));
                }
            }
        }

        let created = target
            .create_dir(TARGET_DIR_MODE)
            .map_err(|e| status::mount(&e))?;
        if let Err(error) = self.mounter.bind(&source, &target, options) {
            if created {
                // Leave nothing behind; the target is empty because the bind failed.
                let _ = target.remove_dir();
            }
            return Err(status::mount(&error));
        }
        Ok(NodePublishVolumeResponse {})
    }

    /// NodeUnpublishVolume: unmount only this volume's bind, then remove the empty target.
    pub fn node_unpublish_volume(
        &self,
        req: NodeUnpublishVolumeRequest,
    ) -> Result<NodeUnpublishVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(missing("volume_id"));
        }
        if req.target_path.is_empty() {
            return Err(missing("target_path"));
        }
        let target_path = PathBuf::from(&req.target_path);
        let place = match Place::of(
            &target_path,
            &self.kubelet_root,
            self.consumer_root.as_ref(),
        ) {
            Ok(place) => place,
            // The driver never publishes to a malformed consumer target, so none is ours to
            // remove: "already unpublished".
            Err(_)
                if self
                    .consumer_root
                    .as_ref()
                    .is_some_and(|root| root.contains(&target_path)) =>
            {
                return Ok(NodeUnpublishVolumeResponse {});
            }
            Err(status) => return Err(status),
        };
        // An unknown or foreign volume ID must still succeed for an absent target.
        let volume_id = VolumeId::from_str(&req.volume_id)
            .ok()
            .filter(|id| id.node_hash() == self.store.node_hash());
        let guard = match &volume_id {
            Some(id) => Some(self.store.lock_volume(id).map_err(|e| status::store(&e))?),
            None => None,
        };

        match place.root().resolve(&target_path) {
            Ok(target) => self.unmount_all(&target, volume_id.as_ref())?,
            Err(mounter::Error::ParentMissing { .. }) => {}
            Err(e) => return Err(status::mount(&e)),
        }
        if place.is_consumer()
            && let (Some(guard), Some(id)) = (&guard, &volume_id)
            && let Some(claim) = self.store.claim_of(id).map_err(|e| status::store(&e))?
            && claim.target == target_path
        {
            guard.release(&target_path).map_err(|e| status::store(&e))?;
        }
        Ok(NodeUnpublishVolumeResponse {})
    }

    fn unmount_all(&self, target: &Target, volume_id: Option<&VolumeId>) -> Result<(), Status> {
        for _ in 0..MAX_STACKED_MOUNTS {
            let Some(found) = self
                .mounter
                .mounted_at(target)
                .map_err(|e| status::mount(&e))?
            else {
                target.remove_dir().map_err(|e| status::mount(&e))?;
                return Ok(());
            };
            let Some(volume_id) = volume_id else {
                return Err(Status::failed_precondition(format!(
                    "{:?} holds a mount ({}) but the volume ID names no volume of this node; left in place",
                    target.path(),
                    found.identity
                )));
            };
            let expected = self.volume_identity(volume_id)?;
            self.mounter
                .unmount(target, &expected)
                .map_err(|e| status::mount(&e))?;
        }
        Err(Status::failed_precondition(format!(
            "{:?} still holds mounts after {MAX_STACKED_MOUNTS} unmounts",
            target.path()
        )))
    }

    /// NodeGetVolumeStats: usage of the backing filesystem and the volume's condition.
    pub fn node_get_volume_stats(
        &self,
        req: NodeGetVolumeStatsRequest,
    ) -> Result<NodeGetVolumeStatsResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(missing("volume_id"));
        }
        if req.volume_path.is_empty() {
            return Err(missing("volume_path"));
        }
        let record = self.record(&req.volume_id)?;
        let volume_id = record.volume_id;
        let volume_path = PathBuf::from(&req.volume_path);
        let not_mounted = || {
            Status::not_found(format!(
                "volume {volume_id} is not mounted at {volume_path:?}"
            ))
        };
        let place = Place::of(
            &volume_path,
            &self.kubelet_root,
            self.consumer_root.as_ref(),
        )
        .map_err(|_| not_mounted())?;
        let target = place
            .root()
            .resolve(&volume_path)
            .map_err(|_| not_mounted())?;
        let found = self
            .mounter
            .mounted_at(&target)
            .map_err(|e| status::mount(&e))?;
        let expected = self.volume_identity(&volume_id)?;
        if found.is_none_or(|f| f.identity != expected) {
            return Err(not_mounted());
        }

        let condition = match self.store.publish_path(&volume_id) {
            Ok(_) => VolumeCondition {
                abnormal: false,
                message: "volume is healthy".to_owned(),
            },
            Err(error) => VolumeCondition {
                abnormal: true,
                message: status::chain(&error),
            },
        };
        let data_dir = self.store.data_dir(&volume_id);
        let stats_path = if condition.abnormal {
            self.store.root().to_owned()
        } else {
            data_dir
        };
        let st = rustix::fs::statvfs(&stats_path)
            .map_err(|e| Status::unavailable(format!("statvfs {stats_path:?} failed: {e}")))?;
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let block = st.f_frsize;
        let usage = vec![
            VolumeUsage {
                available: clamp(st.f_bavail.saturating_mul(block)),
                total: clamp(st.f_blocks.saturating_mul(block)),
                used: clamp(st.f_blocks.saturating_sub(st.f_bfree).saturating_mul(block)),
                unit: volume_usage::Unit::Bytes as i32,
            },
            VolumeUsage {
                available: clamp(st.f_favail),
                total: clamp(st.f_files),
                used: clamp(st.f_files.saturating_sub(st.f_ffree)),
                unit: volume_usage::Unit::Inodes as i32,
            },
        ];
        Ok(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(condition),
        })
    }

    // ----- Helpers -----

    /// A volume ID of this node; anything else is `NOT_FOUND` (it names no volume here).
    fn volume_id(&self, id: &str) -> Result<VolumeId, Status> {
        let volume_id = VolumeId::from_str(id).map_err(|_| {
            Status::not_found(format!(
                "volume {id:?} does not exist: not a volume ID of this driver"
            ))
        })?;
        if volume_id.node_hash() != self.store.node_hash() {
            return Err(Status::not_found(format!(
                "volume {volume_id} belongs to another node (this node is {})",
                self.node_id()
            )));
        }
        Ok(volume_id)
    }

    fn record(&self, id: &str) -> Result<VolumeRecord, Status> {
        let volume_id = self.volume_id(id)?;
        self.store
            .find(&volume_id)
            .map_err(|e| status::store(&e))?
            .ok_or_else(|| Status::not_found(format!("volume {volume_id} does not exist")))
    }

    /// The identity a bind of the volume's data directory has. Derived from the store root's
    /// mount so that it is known even when the data directory itself is gone.
    fn volume_identity(&self, volume_id: &VolumeId) -> Result<MountIdentity, Status> {
        Ok(self.volume_mount(volume_id)?.identity)
    }

    /// What a bind of the volume's data directory is: its identity and the flags it inherits
    /// from the store's mount (a bind copies them; `nodev` on the store stays `nodev`).
    fn volume_mount(&self, volume_id: &VolumeId) -> Result<MountedAt, Status> {
        let mut mounted = self
            .mounter
            .source_mount(self.store.root())
            .map_err(|e| status::mount(&e))?;
        mounted.identity.root = mounted.identity.root.join(volume_id.to_string());
        Ok(mounted)
    }

    /// The status for a target that holds a mount of something else: `ALREADY_EXISTS` when it
    /// is another volume of this store, `FAILED_PRECONDITION` for a foreign mount.
    fn occupied(&self, target: &Path, found: &MountIdentity) -> Result<Status, Status> {
        let store = self
            .mounter
            .source_identity(self.store.root())
            .map_err(|e| status::mount(&e))?;
        let same_filesystem = (store.major, store.minor, &store.fs_type, &store.source)
            == (found.major, found.minor, &found.fs_type, &found.source);
        let other_volume = same_filesystem
            && found.root.parent() == Some(store.root.as_path())
            && found
                .root
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| VolumeId::from_str(n).is_ok());
        Ok(if other_volume {
            Status::already_exists(format!(
                "{target:?} is already the target of another volume ({found})"
            ))
        } else {
            Status::failed_precondition(format!(
                "{target:?} holds a foreign mount ({found}); left in place"
            ))
        })
    }

    /// Every mount point of the volume's data directory, from the whole mount table. Only the
    /// rare paths call this: delete, consumer claims and single-writer publications.
    fn publications(&self, volume_id: &VolumeId) -> Result<Vec<PathBuf>, Status> {
        let expected = self.volume_identity(volume_id)?;
        let bytes = mountinfo::read_self().map_err(|e| {
            Status::unavailable(format!("reading /proc/self/mountinfo failed: {e}"))
        })?;
        let table = mountinfo::MountTable::parse(&bytes)
            .map_err(|e| Status::internal(format!("cannot parse /proc/self/mountinfo: {e}")))?;
        // A kubelet subPath is a bind of a directory inside the volume: it counts too.
        Ok(table
            .iter()
            .filter(|m| (m.major(), m.minor()) == (expected.major, expected.minor))
            .filter(|m| m.root().starts_with(&expected.root))
            .filter(|m| m.fs_type() == expected.fs_type && m.source() == expected.source)
            .map(|m| m.mount_point().to_owned())
            .collect())
    }
}

/// Checks a CSI capacity range: no negative bounds, limit not below required.
fn capacity_range(range: csi_proto::v1::CapacityRange) -> Result<CapacityRange, Status> {
    let bound = |name: &str, value: i64| {
        u64::try_from(value).map_err(|_| {
            Status::invalid_argument(format!("capacity_range.{name} {value} is negative"))
        })
    };
    let range = CapacityRange {
        required_bytes: bound("required_bytes", range.required_bytes)?,
        limit_bytes: bound("limit_bytes", range.limit_bytes)?,
    };
    range.validate().map_err(|e| status::store(&e))?;
    Ok(range)
}
