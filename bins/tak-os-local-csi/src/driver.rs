//! The driver's logic, synchronous and free of gRPC plumbing: each method takes a CSI request
//! and returns its response or an [`Error`]. `grpc.rs` runs them on blocking threads and maps
//! the errors to statuses.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use csi_proto::v1::*;
use localstore::{CapacityRange, CreateRequest, Store, VolumeId, VolumeRecord, VolumeState};
use mounter::{MountIdentity, MountedAt, Mounter, Target, TargetRoot};

use crate::capability::{AccessMode, Capability};
use crate::error::Error;
use crate::place::Place;
use crate::status::chain;

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
    pub fn probe(&self) -> Result<ProbeResponse, Error> {
        let root = self.store.root();
        let now = self.mounter.source_mount(root)?;
        if now.mount_id != self.store_mount_id {
            return Err(Error::StoreMoved {
                root: root.to_owned(),
                was: self.store_mount_id,
                now: now.mount_id,
            });
        }
        self.store.check()?;
        Ok(ProbeResponse { ready: Some(true) })
    }

    // ----- Controller -----

    /// CreateVolume, for this node only.
    pub fn create_volume(&self, req: CreateVolumeRequest) -> Result<CreateVolumeResponse, Error> {
        if req.name.is_empty() {
            return Err(Error::Missing { field: "name" });
        }
        if req.volume_capabilities.is_empty() {
            return Err(Error::Missing {
                field: "volume_capabilities",
            });
        }
        let capabilities = req
            .volume_capabilities
            .iter()
            .map(|c| Capability::from_csi(c).map(|c| c.to_record()))
            .collect::<Result<_, _>>()
            .map_err(|problem| Error::UnsupportedCapability { problem })?;
        if let Some(key) = req
            .parameters
            .keys()
            .find(|k| !k.starts_with(PROVISIONER_PARAMETER_PREFIX))
        {
            return Err(Error::UnsupportedParameter { key: key.clone() });
        }
        if !req.mutable_parameters.is_empty() {
            return Err(Error::MutableParameters);
        }
        if req.volume_content_source.is_some() {
            return Err(Error::ContentSource);
        }
        let capacity = match req.capacity_range {
            None => None,
            Some(range) => Some(capacity_range(range)?),
        };
        if let Some(requirement) = &req.accessibility_requirements
            && !requirement.requisite.is_empty()
            && !requirement.requisite.iter().any(|t| self.is_this_node(t))
        {
            return Err(Error::NotInRequisiteTopology {
                node: self.node_id().to_owned(),
            });
        }
        let request = CreateRequest {
            name: req.name,
            capacity,
            capabilities,
            parameters: req.parameters.into_iter().collect(),
        };
        let record = self.store.create(&request)?;
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
    pub fn delete_volume(&self, req: DeleteVolumeRequest) -> Result<DeleteVolumeResponse, Error> {
        if req.volume_id.is_empty() {
            return Err(Error::Missing { field: "volume_id" });
        }
        // An ID this driver could never have issued names no volume of ours: nothing to delete.
        let Ok(volume_id) = VolumeId::from_str(&req.volume_id) else {
            return Ok(DeleteVolumeResponse {});
        };
        let guard = self.store.lock_volume(&volume_id)?;
        if guard.record()?.is_none() {
            return Ok(DeleteVolumeResponse {});
        }
        let mounted = self.publications(&volume_id)?;
        if let Some(target) = mounted.first() {
            return Err(Error::StillPublished {
                volume_id,
                target: target.clone(),
                mounts: mounted.len(),
            });
        }
        guard.delete()?;
        Ok(DeleteVolumeResponse {})
    }

    /// ValidateVolumeCapabilities.
    pub fn validate_volume_capabilities(
        &self,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse, Error> {
        if req.volume_id.is_empty() {
            return Err(Error::Missing { field: "volume_id" });
        }
        if req.volume_capabilities.is_empty() {
            return Err(Error::Missing {
                field: "volume_capabilities",
            });
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
    pub fn list_volumes(&self, req: ListVolumesRequest) -> Result<ListVolumesResponse, Error> {
        let max_entries =
            usize::try_from(req.max_entries).map_err(|_| Error::NegativeMaxEntries {
                max_entries: req.max_entries,
            })?;
        let after = if req.starting_token.is_empty() {
            None
        } else {
            Some(
                VolumeId::from_str(&req.starting_token).map_err(|_| Error::ForeignToken {
                    token: req.starting_token.clone(),
                })?,
            )
        };
        let records = self.store.list()?;
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
    pub fn get_capacity(&self, req: GetCapacityRequest) -> Result<GetCapacityResponse, Error> {
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
        let capacity = self.store.capacity()?;
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
    ) -> Result<NodePublishVolumeResponse, Error> {
        if req.volume_id.is_empty() {
            return Err(Error::Missing { field: "volume_id" });
        }
        if req.target_path.is_empty() {
            return Err(Error::Missing {
                field: "target_path",
            });
        }
        let capability = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| Error::Missing {
                field: "volume_capability",
            })?;
        let capability = Capability::from_csi(capability)
            .map_err(|problem| Error::UnsupportedCapability { problem })?;
        let target_path = PathBuf::from(&req.target_path);
        let place = Place::of(
            &target_path,
            &self.kubelet_root,
            self.consumer_root.as_ref(),
        )?;
        let volume_id = self.volume_id(&req.volume_id)?;

        let guard = self.store.lock_volume(&volume_id)?;
        let source = self.store.publish_path(&volume_id)?;
        let target = place.root().resolve(&target_path)?;
        let volume = self.volume_mount(&volume_id)?;
        let expected = volume.identity;
        let options = capability.bind_options(req.readonly);
        let expected_attrs = options.attrs.union(volume.attrs);

        if let Some(found) = self.mounter.mounted_at(&target)? {
            if found.identity != expected {
                return Err(self.occupied(&target_path, found.identity)?);
            }
            if found.attrs != expected_attrs {
                return Err(Error::PublishedWithOtherOptions {
                    volume_id,
                    target: target_path,
                    mounted: found.attrs,
                    requested: expected_attrs,
                });
            }
            return Ok(NodePublishVolumeResponse {});
        }

        let claim = self.store.claim_of(&volume_id)?;
        match (place, claim) {
            (Place::Consumer(_), Some(claim)) if claim.target == target_path => {} // resuming
            (Place::Consumer(_) | Place::Kubelet(_), Some(claim)) => {
                return Err(Error::ClaimedByConsumer {
                    volume_id,
                    target: claim.target,
                });
            }
            (Place::Consumer(_), None) => {
                if let Some(other) = self.publications(&volume_id)?.into_iter().next() {
                    return Err(Error::PublishedBeforeClaim { volume_id, other });
                }
                guard.claim(&target_path)?;
            }
            (Place::Kubelet(_), None) => {
                if capability.access_mode == AccessMode::SingleNodeSingleWriter
                    && let Some(other) = self.publications(&volume_id)?.into_iter().next()
                {
                    return Err(Error::SingleWriterPublished { volume_id, other });
                }
            }
        }

        let created = target.create_dir(TARGET_DIR_MODE)?;
        if let Err(error) = self.mounter.bind(&source, &target, options) {
            if created {
                // Leave nothing behind; the target is empty because the bind failed.
                let _ = self.mounter.remove_target(&target);
            }
            return Err(error.into());
        }
        Ok(NodePublishVolumeResponse {})
    }

    /// NodeUnpublishVolume: unmount only this volume's bind, then remove the empty target.
    pub fn node_unpublish_volume(
        &self,
        req: NodeUnpublishVolumeRequest,
    ) -> Result<NodeUnpublishVolumeResponse, Error> {
        if req.volume_id.is_empty() {
            return Err(Error::Missing { field: "volume_id" });
        }
        if req.target_path.is_empty() {
            return Err(Error::Missing {
                field: "target_path",
            });
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
            Err(error) => return Err(error),
        };
        // An unknown or foreign volume ID must still succeed for an absent target.
        let volume_id = VolumeId::from_str(&req.volume_id)
            .ok()
            .filter(|id| id.node_hash() == self.store.node_hash());
        let guard = match &volume_id {
            Some(id) => Some(self.store.lock_volume(id)?),
            None => None,
        };

        match place.root().resolve(&target_path) {
            Ok(target) => self.unmount_all(&target, volume_id.as_ref())?,
            Err(mounter::Error::ParentMissing { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        if place.is_consumer()
            && let (Some(guard), Some(id)) = (&guard, &volume_id)
            && let Some(claim) = self.store.claim_of(id)?
            && claim.target == target_path
        {
            guard.release(&target_path)?;
        }
        Ok(NodeUnpublishVolumeResponse {})
    }

    fn unmount_all(&self, target: &Target, volume_id: Option<&VolumeId>) -> Result<(), Error> {
        for _ in 0..MAX_STACKED_MOUNTS {
            let Some(found) = self.mounter.mounted_at(target)? else {
                self.mounter.remove_target(target)?;
                return Ok(());
            };
            let Some(volume_id) = volume_id else {
                return Err(Error::UnknownVolumeMounted {
                    target: target.path().to_owned(),
                    found: found.identity,
                });
            };
            let expected = self.volume_identity(volume_id)?;
            self.mounter.unmount(target, &expected)?;
        }
        Err(Error::TooManyMounts {
            target: target.path().to_owned(),
            unmounts: MAX_STACKED_MOUNTS,
        })
    }

    /// NodeGetVolumeStats: usage of the backing filesystem and the volume's condition.
    pub fn node_get_volume_stats(
        &self,
        req: NodeGetVolumeStatsRequest,
    ) -> Result<NodeGetVolumeStatsResponse, Error> {
        if req.volume_id.is_empty() {
            return Err(Error::Missing { field: "volume_id" });
        }
        if req.volume_path.is_empty() {
            return Err(Error::Missing {
                field: "volume_path",
            });
        }
        let record = self.record(&req.volume_id)?;
        let volume_id = record.volume_id;
        let volume_path = PathBuf::from(&req.volume_path);
        let not_mounted = || Error::NotMountedAt {
            volume_id,
            path: volume_path.clone(),
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
        let found = self.mounter.mounted_at(&target)?;
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
                message: chain(&error),
            },
        };
        // A volume whose data directory is unusable reports its store's filesystem instead.
        let usage = match condition.abnormal {
            false => self.store.volume_usage(&volume_id)?,
            true => self.store.usage()?,
        };
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let usage = vec![
            VolumeUsage {
                available: clamp(usage.available_bytes),
                total: clamp(usage.total_bytes),
                used: clamp(usage.used_bytes),
                unit: volume_usage::Unit::Bytes as i32,
            },
            VolumeUsage {
                available: clamp(usage.available_inodes),
                total: clamp(usage.total_inodes),
                used: clamp(usage.used_inodes),
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
    fn volume_id(&self, id: &str) -> Result<VolumeId, Error> {
        let volume_id =
            VolumeId::from_str(id).map_err(|_| Error::NotAVolumeId { id: id.to_owned() })?;
        if volume_id.node_hash() != self.store.node_hash() {
            return Err(Error::OtherNode {
                volume_id,
                node: self.node_id().to_owned(),
            });
        }
        Ok(volume_id)
    }

    fn record(&self, id: &str) -> Result<VolumeRecord, Error> {
        let volume_id = self.volume_id(id)?;
        self.store
            .find(&volume_id)?
            .ok_or(Error::VolumeNotFound { volume_id })
    }

    /// The identity a bind of the volume's data directory has. Derived from the store root's
    /// mount so that it is known even when the data directory itself is gone.
    fn volume_identity(&self, volume_id: &VolumeId) -> Result<MountIdentity, Error> {
        Ok(self.volume_mount(volume_id)?.identity)
    }

    /// What a bind of the volume's data directory is: its identity and the flags it inherits
    /// from the store's mount (a bind copies them; `nodev` on the store stays `nodev`).
    fn volume_mount(&self, volume_id: &VolumeId) -> Result<MountedAt, Error> {
        let mut mounted = self.mounter.source_mount(self.store.root())?;
        mounted.identity.root = mounted.identity.root.join(volume_id.to_string());
        Ok(mounted)
    }

    /// The error for a target that holds a mount of something else: another volume of this
    /// store (`ALREADY_EXISTS`), or a foreign mount (`FAILED_PRECONDITION`).
    fn occupied(&self, target: &Path, found: MountIdentity) -> Result<Error, Error> {
        let store = self.mounter.source_identity(self.store.root())?;
        let same_filesystem = (store.major, store.minor, &store.fs_type, &store.source)
            == (found.major, found.minor, &found.fs_type, &found.source);
        let other_volume = same_filesystem
            && found.root.parent() == Some(store.root.as_path())
            && found
                .root
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| VolumeId::from_str(n).is_ok());
        let target = target.to_owned();
        Ok(if other_volume {
            Error::TargetOfAnotherVolume { target, found }
        } else {
            Error::ForeignMountAtTarget { target, found }
        })
    }

    /// Every mount point of the volume's data directory, or of a directory inside it (a kubelet
    /// subPath), from the whole mount table. Only the rare paths call this: delete, consumer
    /// claims and single-writer publications.
    fn publications(&self, volume_id: &VolumeId) -> Result<Vec<PathBuf>, Error> {
        let expected = self.volume_identity(volume_id)?;
        Ok(self.mounter.publications(&expected)?)
    }
}

/// Checks a CSI capacity range: no negative bounds, limit not below required.
fn capacity_range(range: csi_proto::v1::CapacityRange) -> Result<CapacityRange, Error> {
    let bound = |name: &'static str, value: i64| {
        u64::try_from(value).map_err(|_| Error::NegativeCapacity { bound: name, value })
    };
    let range = CapacityRange {
        required_bytes: bound("required_bytes", range.required_bytes)?,
        limit_bytes: bound("limit_bytes", range.limit_bytes)?,
    };
    range.validate()?;
    Ok(range)
}

#[cfg(test)]
mod tests {
    //! The driver's rules over the fake mounter: no mount privilege, no namespace, no root (the
    //! store is owned by the user running the tests, which `localstore` accepts as the driver
    //! user).

    use std::fs;

    use csi_proto::v1::volume_capability::access_mode::Mode;
    use csi_proto::v1::volume_capability::{AccessMode as CsiAccessMode, AccessType, MountVolume};
    use localstore::StoreOptions;
    use mounter::{BindOptions, FakeMounter, FakeOp};
    use tempfile::TempDir;
    use tonic::Code;

    use super::*;
    use crate::status;

    struct Fixture {
        dir: TempDir,
        fake: Arc<FakeMounter>,
        driver: Driver,
    }

    impl Fixture {
        fn new() -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            for sub in ["store", "kubelet/pods", "consumers/g/r0", "consumers/g/r1"] {
                fs::create_dir_all(dir.path().join(sub)).unwrap();
            }
            let store = Store::open(dir.path().join("store"), StoreOptions::new("node-a")).unwrap();
            let fake = Arc::new(FakeMounter::new());
            let mounter: Arc<dyn Mounter> = fake.clone();
            let driver = Driver::new(
                store,
                mounter,
                TargetRoot::new(dir.path().join("kubelet")).unwrap(),
                Some(TargetRoot::new(dir.path().join("consumers")).unwrap()),
                0,
            )
            .unwrap();
            Fixture { dir, fake, driver }
        }

        fn volume(&self, name: &str, mode: Mode) -> String {
            let req = CreateVolumeRequest {
                name: name.to_owned(),
                volume_capabilities: vec![capability(mode)],
                ..Default::default()
            };
            let volume = self.driver.create_volume(req).unwrap().volume.unwrap();
            volume.volume_id
        }

        /// A kubelet target whose parent exists.
        fn kubelet_target(&self, pod: &str) -> PathBuf {
            let parent = self.dir.path().join("kubelet/pods").join(pod);
            fs::create_dir_all(&parent).unwrap();
            parent.join("mount")
        }

        fn consumer_target(&self, replica: &str) -> PathBuf {
            self.dir
                .path()
                .join("consumers/g")
                .join(replica)
                .join("mount")
        }

        fn publish(&self, volume_id: &str, target: &Path, mode: Mode) -> Result<(), Error> {
            let req = NodePublishVolumeRequest {
                volume_id: volume_id.to_owned(),
                target_path: target.display().to_string(),
                volume_capability: Some(capability(mode)),
                ..Default::default()
            };
            self.driver.node_publish_volume(req).map(drop)
        }

        fn unpublish(&self, volume_id: &str, target: &Path) -> Result<(), Error> {
            let req = NodeUnpublishVolumeRequest {
                volume_id: volume_id.to_owned(),
                target_path: target.display().to_string(),
            };
            self.driver.node_unpublish_volume(req).map(drop)
        }

        fn delete(&self, volume_id: &str) -> Result<(), Error> {
            let req = DeleteVolumeRequest {
                volume_id: volume_id.to_owned(),
                ..Default::default()
            };
            self.driver.delete_volume(req).map(drop)
        }
    }

    fn capability(mode: Mode) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(CsiAccessMode { mode: mode as i32 }),
            access_type: Some(AccessType::Mount(MountVolume::default())),
        }
    }

    fn code<T>(result: Result<T, Error>) -> Code {
        match result {
            Ok(_) => Code::Ok,
            Err(error) => status::code(&error),
        }
    }

    #[test]
    fn a_published_volume_is_not_deleted_until_unpublished() {
        let f = Fixture::new();
        let id = f.volume("pvc-delete", Mode::SingleNodeWriter);
        let target = f.kubelet_target("p");
        f.publish(&id, &target, Mode::SingleNodeWriter).unwrap();
        let err = f.delete(&id).unwrap_err();
        assert!(
            matches!(&err, Error::StillPublished { target: t, mounts: 1, .. } if *t == target),
            "{err}"
        );
        assert_eq!(status::code(&err), Code::FailedPrecondition);
        f.unpublish(&id, &target).unwrap();
        f.delete(&id).unwrap();
        f.delete(&id).unwrap();
    }

    #[test]
    fn a_subpath_bind_inside_a_volume_blocks_its_deletion() {
        let f = Fixture::new();
        let id = f.volume("pvc-subpath", Mode::SingleNodeWriter);
        let volume_id = VolumeId::from_str(&id).unwrap();
        let inside = f.driver.store().data_dir(&volume_id).join("sub");
        fs::create_dir(&inside).unwrap();
        // Kubelet binds a directory inside the volume for a subPath, beside the publication.
        let root = TargetRoot::new(f.dir.path().join("kubelet")).unwrap();
        let subpath = root.resolve(&f.kubelet_target("q")).unwrap();
        subpath.create_dir(0o750).unwrap();
        f.fake
            .bind(&inside, &subpath, BindOptions::default())
            .unwrap();
        assert_eq!(code(f.delete(&id)), Code::FailedPrecondition);
        f.fake
            .unmount(&subpath, &f.fake.source_identity(&inside).unwrap())
            .unwrap();
        f.delete(&id).unwrap();
    }

    #[test]
    fn a_failed_mount_table_read_fails_the_deletion_and_keeps_the_volume() {
        let f = Fixture::new();
        let id = f.volume("pvc-table", Mode::SingleNodeWriter);
        f.fake.fail_next(FakeOp::Publications, 5);
        assert_eq!(code(f.delete(&id)), Code::Unavailable);
        let volume_id = VolumeId::from_str(&id).unwrap();
        assert!(f.driver.store().find(&volume_id).unwrap().is_some());
        f.delete(&id).unwrap();
    }

    #[test]
    fn a_single_writer_volume_has_one_publication_at_a_time() {
        let f = Fixture::new();
        let id = f.volume("pvc-rwop", Mode::SingleNodeSingleWriter);
        let first = f.kubelet_target("p1");
        let second = f.kubelet_target("p2");
        f.publish(&id, &first, Mode::SingleNodeSingleWriter)
            .unwrap();
        f.publish(&id, &first, Mode::SingleNodeSingleWriter)
            .unwrap();
        let err = f
            .publish(&id, &second, Mode::SingleNodeSingleWriter)
            .unwrap_err();
        assert!(
            matches!(&err, Error::SingleWriterPublished { other, .. } if *other == first),
            "{err}"
        );
        assert_eq!(status::code(&err), Code::FailedPrecondition);
        assert!(!second.exists(), "a refusal creates no target");
        f.unpublish(&id, &first).unwrap();
        f.publish(&id, &second, Mode::SingleNodeSingleWriter)
            .unwrap();
        f.unpublish(&id, &second).unwrap();
        assert!(f.fake.mounts().is_empty());
    }

    #[test]
    fn a_multi_writer_volume_is_published_at_many_targets() {
        let f = Fixture::new();
        let id = f.volume("pvc-rwo", Mode::SingleNodeMultiWriter);
        let targets = [f.kubelet_target("p1"), f.kubelet_target("p2")];
        for target in &targets {
            f.publish(&id, target, Mode::SingleNodeMultiWriter).unwrap();
        }
        assert_eq!(f.fake.mounts().len(), 2);
        for target in &targets {
            f.unpublish(&id, target).unwrap();
        }
    }

    #[test]
    fn a_consumer_claim_excludes_kubelet_other_consumers_and_deletion() {
        let f = Fixture::new();
        let id = f.volume("pvc-claim", Mode::SingleNodeWriter);
        let claimed = f.consumer_target("r0");
        f.publish(&id, &claimed, Mode::SingleNodeWriter).unwrap();
        f.publish(&id, &claimed, Mode::SingleNodeWriter).unwrap();

        let kubelet = f.kubelet_target("p");
        let err = f
            .publish(&id, &kubelet, Mode::SingleNodeWriter)
            .unwrap_err();
        assert!(
            matches!(&err, Error::ClaimedByConsumer { target, .. } if *target == claimed),
            "{err}"
        );
        let other = f.consumer_target("r1");
        assert_eq!(
            code(f.publish(&id, &other, Mode::SingleNodeWriter)),
            Code::FailedPrecondition
        );
        assert_eq!(code(f.delete(&id)), Code::FailedPrecondition);
        assert!(!kubelet.exists() && !other.exists());

        f.unpublish(&id, &claimed).unwrap();
        let volume_id = VolumeId::from_str(&id).unwrap();
        assert!(f.driver.store().claim_of(&volume_id).unwrap().is_none());
        f.delete(&id).unwrap();
    }

    #[test]
    fn a_volume_published_by_kubelet_cannot_be_claimed() {
        let f = Fixture::new();
        let id = f.volume("pvc-kubelet", Mode::SingleNodeWriter);
        let kubelet = f.kubelet_target("p");
        f.publish(&id, &kubelet, Mode::SingleNodeWriter).unwrap();
        let err = f
            .publish(&id, &f.consumer_target("r0"), Mode::SingleNodeWriter)
            .unwrap_err();
        assert!(
            matches!(&err, Error::PublishedBeforeClaim { other, .. } if *other == kubelet),
            "{err}"
        );
        assert_eq!(status::code(&err), Code::FailedPrecondition);
        let volume_id = VolumeId::from_str(&id).unwrap();
        assert!(f.driver.store().claim_of(&volume_id).unwrap().is_none());
        f.unpublish(&id, &kubelet).unwrap();
    }

    #[test]
    fn another_volume_at_the_target_is_already_exists_and_a_foreign_mount_a_precondition() {
        let f = Fixture::new();
        let first = f.volume("pvc-1", Mode::SingleNodeWriter);
        let second = f.volume("pvc-2", Mode::SingleNodeWriter);
        let target = f.kubelet_target("p");
        f.publish(&first, &target, Mode::SingleNodeWriter).unwrap();
        let err = f
            .publish(&second, &target, Mode::SingleNodeWriter)
            .unwrap_err();
        assert!(matches!(err, Error::TargetOfAnotherVolume { .. }), "{err}");
        assert_eq!(status::code(&err), Code::AlreadyExists);
        // The unpublish of the wrong volume leaves the right one's bind in place.
        assert_eq!(
            code(f.unpublish(&second, &target)),
            Code::FailedPrecondition
        );
        assert_eq!(f.fake.mounts()[&target].len(), 1);
        f.unpublish(&first, &target).unwrap();

        let foreign = f.kubelet_target("q");
        fs::create_dir(&foreign).unwrap();
        f.fake.mount_foreign(
            &foreign,
            MountIdentity {
                major: 0,
                minor: 42,
                root: "/".into(),
                fs_type: "tmpfs".into(),
                source: "tmpfs".into(),
            },
        );
        let err = f
            .publish(&first, &foreign, Mode::SingleNodeWriter)
            .unwrap_err();
        assert!(matches!(err, Error::ForeignMountAtTarget { .. }), "{err}");
    }

    #[test]
    fn stats_need_the_volume_mounted_at_the_path() {
        let f = Fixture::new();
        let id = f.volume("pvc-stats", Mode::SingleNodeWriter);
        let target = f.kubelet_target("p");
        let stats = |path: &Path| {
            f.driver.node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: id.clone(),
                volume_path: path.display().to_string(),
                staging_target_path: String::new(),
            })
        };
        assert!(matches!(stats(&target), Err(Error::NotMountedAt { .. })));
        f.publish(&id, &target, Mode::SingleNodeWriter).unwrap();
        let answer = stats(&target).unwrap();
        assert_eq!(answer.usage.len(), 2);
        assert!(!answer.volume_condition.unwrap().abnormal);
        f.unpublish(&id, &target).unwrap();
    }

    #[test]
    fn unpublish_of_a_target_with_an_unknown_volume_id_is_ok_when_nothing_is_mounted() {
        let f = Fixture::new();
        let target = f.kubelet_target("p");
        f.unpublish("not-a-volume-id", &target).unwrap();
        fs::create_dir(&target).unwrap();
        f.fake.mount_foreign(
            &target,
            MountIdentity {
                major: 0,
                minor: 42,
                root: "/".into(),
                fs_type: "tmpfs".into(),
                source: "tmpfs".into(),
            },
        );
        let err = f.unpublish("not-a-volume-id", &target).unwrap_err();
        assert!(matches!(err, Error::UnknownVolumeMounted { .. }), "{err}");
        assert!(target.is_dir());
    }
}
