//! Everything a CSI call can fail with. [`crate::status::code`] maps each variant to its gRPC
//! code in one exhaustive match; the message a client sees is the error's chain
//! ([`crate::status::chain`]).

use std::path::PathBuf;

use localstore::VolumeId;
use mounter::{MountAttrs, MountIdentity};

use crate::driver::DRIVER_NAME;

/// Why a CSI call failed.
///
/// Deliberately not `#[non_exhaustive]`: a new variant must force a decision in the mapping to
/// a status code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A required request field is empty or absent.
    #[error("{field} is required")]
    Missing {
        /// The field's name in the CSI request.
        field: &'static str,
    },
    /// A volume capability the driver does not support.
    #[error("{problem}")]
    UnsupportedCapability {
        /// What is unsupported, and why.
        problem: String,
    },
    /// A storage class parameter other than the provisioner's own.
    #[error(
        "parameter {key:?} is not supported: the local driver takes no storage class parameters"
    )]
    UnsupportedParameter {
        /// The parameter's key.
        key: String,
    },
    /// CreateVolume with mutable parameters.
    #[error("mutable_parameters are not supported")]
    MutableParameters,
    /// CreateVolume from a snapshot or another volume.
    #[error("volume_content_source is not supported: no snapshots or clones")]
    ContentSource,
    /// A negative bound in a capacity range.
    #[error("capacity_range.{bound} {value} is negative")]
    NegativeCapacity {
        /// `required_bytes` or `limit_bytes`.
        bound: &'static str,
        /// The value asked for.
        value: i64,
    },
    /// A negative `max_entries` in ListVolumes.
    #[error("max_entries {max_entries} is negative")]
    NegativeMaxEntries {
        /// The value asked for.
        max_entries: i32,
    },
    /// A ListVolumes token this driver did not issue.
    #[error("starting_token {token:?} was not issued by this driver")]
    ForeignToken {
        /// The token.
        token: String,
    },
    /// A requisite topology that does not name this node.
    #[error("node {node} is not in the requisite topology; the volume can only live on this node")]
    NotInRequisiteTopology {
        /// This node's name.
        node: String,
    },
    /// A consumer target that is not `<root>/<generation>/<replica>/mount`.
    #[error("consumer target {target:?} is not <root>/<generation>/<replica>/mount: {problem}")]
    MalformedConsumerTarget {
        /// The target.
        target: PathBuf,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A target below neither the kubelet root nor the consumer root.
    #[error(
        "target {target:?} is not below the kubelet root {kubelet_root:?}{}",
        consumer_hint(consumer_root.as_ref())
    )]
    OutsideRoots {
        /// The target.
        target: PathBuf,
        /// Kubelet's root.
        kubelet_root: PathBuf,
        /// The consumer root, when the extension is on.
        consumer_root: Option<PathBuf>,
    },
    /// A volume ID this driver could not have issued.
    #[error("volume {id:?} does not exist: not a volume ID of this driver")]
    NotAVolumeId {
        /// The ID as given.
        id: String,
    },
    /// A volume ID of another node.
    #[error("volume {volume_id} belongs to another node (this node is {node})")]
    OtherNode {
        /// The volume.
        volume_id: VolumeId,
        /// This node's name.
        node: String,
    },
    /// No record of the volume.
    #[error("volume {volume_id} does not exist")]
    VolumeNotFound {
        /// The volume.
        volume_id: VolumeId,
    },
    /// DeleteVolume of a volume that is still mounted somewhere.
    #[error(
        "volume {volume_id} is still mounted at {target:?} ({mounts} mounts); unpublish it first"
    )]
    StillPublished {
        /// The volume.
        volume_id: VolumeId,
        /// One of its mount points.
        target: PathBuf,
        /// How many mounts show it.
        mounts: usize,
    },
    /// The target already holds this volume with other flags.
    #[error(
        "volume {volume_id} is already published at {target:?} with other options \
         (mounted {mounted:?}, requested {requested:?})"
    )]
    PublishedWithOtherOptions {
        /// The volume.
        volume_id: VolumeId,
        /// The target.
        target: PathBuf,
        /// The flags of the mount there.
        mounted: MountAttrs,
        /// The flags the request asks for.
        requested: MountAttrs,
    },
    /// The target already holds another volume of this store.
    #[error("{target:?} is already the target of another volume ({found})")]
    TargetOfAnotherVolume {
        /// The target.
        target: PathBuf,
        /// What is mounted there.
        found: MountIdentity,
    },
    /// The target holds a mount that is no volume of this store.
    #[error("{target:?} holds a foreign mount ({found}); left in place")]
    ForeignMountAtTarget {
        /// The target.
        target: PathBuf,
        /// What is mounted there.
        found: MountIdentity,
    },
    /// A trusted consumer owns the volume.
    #[error("volume {volume_id} is claimed by the trusted consumer target {target:?}")]
    ClaimedByConsumer {
        /// The volume.
        volume_id: VolumeId,
        /// The consumer's target.
        target: PathBuf,
    },
    /// A consumer claim of a volume that kubelet has published.
    #[error("volume {volume_id} is published at {other:?}; a consumer cannot claim it")]
    PublishedBeforeClaim {
        /// The volume.
        volume_id: VolumeId,
        /// One of its mount points.
        other: PathBuf,
    },
    /// A second publication of a SINGLE_NODE_SINGLE_WRITER volume.
    #[error("volume {volume_id} is SINGLE_NODE_SINGLE_WRITER and already published at {other:?}")]
    SingleWriterPublished {
        /// The volume.
        volume_id: VolumeId,
        /// Its mount point.
        other: PathBuf,
    },
    /// NodeUnpublishVolume of a mounted target with a volume ID of no volume here.
    #[error(
        "{target:?} holds a mount ({found}) but the volume ID names no volume of this node; left in place"
    )]
    UnknownVolumeMounted {
        /// The target.
        target: PathBuf,
        /// What is mounted there.
        found: MountIdentity,
    },
    /// More stacked mounts at a target than an unpublish removes.
    #[error("{target:?} still holds mounts after {unmounts} unmounts")]
    TooManyMounts {
        /// The target.
        target: PathBuf,
        /// How many were unmounted.
        unmounts: usize,
    },
    /// NodeGetVolumeStats for a path where the volume is not mounted.
    #[error("volume {volume_id} is not mounted at {path:?}")]
    NotMountedAt {
        /// The volume.
        volume_id: VolumeId,
        /// The path asked about.
        path: PathBuf,
    },
    /// The store's directory is no longer on the mount the driver opened it on.
    #[error(
        "the store {root:?} is no longer on the mount it was opened on (was mount {was}, now {now})"
    )]
    StoreMoved {
        /// The store's root.
        root: PathBuf,
        /// The mount ID at startup.
        was: u64,
        /// The mount ID now.
        now: u64,
    },
    /// An RPC this driver does not implement.
    #[error("{rpc} is not supported by {DRIVER_NAME}")]
    Unsupported {
        /// The RPC's name.
        rpc: &'static str,
    },
    /// The blocking task running a handler panicked or was cancelled (a bug).
    #[error("{operation} handler failed")]
    HandlerFailed {
        /// The RPC's name.
        operation: &'static str,
        /// The cause.
        #[source]
        source: tokio::task::JoinError,
    },
    /// The volume store failed.
    #[error(transparent)]
    Store(#[from] localstore::Error),
    /// Mounting, unmounting or validating a target failed.
    #[error(transparent)]
    Mount(#[from] mounter::Error),
}

fn consumer_hint(consumer_root: Option<&PathBuf>) -> String {
    consumer_root
        .map(|root| format!(" or the consumer mount root {root:?}"))
        .unwrap_or_default()
}
