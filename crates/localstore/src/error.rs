//! The crate's one error type and its classification.

use std::io;
use std::path::PathBuf;

use crate::{NodeHash, VolumeId, VolumeState};

/// What kind of failure an [`Error`] is, so a driver can map every error to exactly one gRPC
/// code with an exhaustive `match` (this enum is deliberately not `#[non_exhaustive]`: a new
/// kind must force a decision at each boundary).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A malformed argument: name, volume ID, capacity range, capabilities, parameters, path.
    /// CSI: `INVALID_ARGUMENT`.
    InvalidArgument,
    /// The volume does not exist. CSI: `NOT_FOUND`.
    NotFound,
    /// A volume of that name exists with other capacity, capabilities or parameters.
    /// CSI: `ALREADY_EXISTS`.
    Incompatible,
    /// A state conflict: a volume of another node, a consumer claim, a missing data directory,
    /// a volume that is not ready, stray data in the way, a read-only store.
    /// CSI: `FAILED_PRECONDITION`.
    FailedPrecondition,
    /// Another operation on the same volume is in flight. CSI: `ABORTED`.
    Busy,
    /// The store's filesystem cannot hold the requested size. CSI: `RESOURCE_EXHAUSTED`.
    CapacityExhausted,
    /// Another opener holds the store's lock.
    StoreInUse,
    /// The store's root or metadata directory is unsafe to use (symlinks, ownership,
    /// permissions, not its own filesystem).
    UnsafeStore,
    /// A record is unreadable: not a regular file, not JSON, inconsistent, or from a newer
    /// format. CSI: `DATA_LOSS` (the driver's choice: the volume's record is damaged).
    Corrupt,
    /// An operating-system call failed. CSI: `UNAVAILABLE` (the driver's choice: the caller may
    /// retry).
    Io,
}

/// An error from the store. Messages are lowercase, name the offending value or path, and
/// never repeat the text of their `source`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A malformed argument.
    #[error("invalid {field} {value:?}: {reason}")]
    InvalidArgument {
        /// Which argument.
        field: &'static str,
        /// The offending value, shortened when long.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A capacity range whose limit is below its required bytes.
    #[error("invalid capacity range: limit {limit_bytes} is below required {required_bytes}")]
    InvalidCapacityRange {
        /// The requested minimum.
        required_bytes: u64,
        /// The requested maximum.
        limit_bytes: u64,
    },
    /// No such volume.
    #[error("volume {volume_id} not found")]
    NotFound {
        /// The volume asked for.
        volume_id: VolumeId,
    },
    /// A volume of the same name exists and does not match the request.
    #[error("volume {volume_id} already exists with a different {what}")]
    Incompatible {
        /// The existing volume.
        volume_id: VolumeId,
        /// What differs: `capacity`, `capabilities` or `parameters`.
        what: &'static str,
    },
    /// The volume ID names another node.
    #[error("volume {volume_id} belongs to node hash {}, not this node ({local})", .volume_id.node_hash())]
    ForeignNode {
        /// The volume asked for.
        volume_id: VolumeId,
        /// This store's node hash.
        local: NodeHash,
    },
    /// The volume is claimed by a trusted consumer, so it cannot be deleted.
    #[error("volume {volume_id} is claimed by consumer target {target:?}")]
    Claimed {
        /// The claimed volume.
        volume_id: VolumeId,
        /// The consumer's target path.
        target: PathBuf,
    },
    /// A claim or release for a target other than the one holding the claim.
    #[error("volume {volume_id} is claimed by consumer target {existing:?}, not {requested:?}")]
    ClaimConflict {
        /// The claimed volume.
        volume_id: VolumeId,
        /// The target that holds the claim.
        existing: PathBuf,
        /// The target of the refused request.
        requested: PathBuf,
    },
    /// The volume's data directory is missing (or was missing when the store opened): its disk
    /// may not be mounted, so nothing may be written there.
    #[error("volume {volume_id} cannot be published: data directory {path:?} {reason}")]
    Unpublishable {
        /// The volume.
        volume_id: VolumeId,
        /// Its data directory.
        path: PathBuf,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The volume is in the middle of a create or delete that did not finish.
    #[error("volume {volume_id} is {state}, not ready")]
    NotReady {
        /// The volume.
        volume_id: VolumeId,
        /// Its recorded state.
        state: VolumeState,
    },
    /// Something other than this store's own work occupies a path the operation needs, or a
    /// data directory holds something that must not be removed (a mount, a non-directory).
    #[error("volume {volume_id}: {path:?} {problem}")]
    UnexpectedData {
        /// The volume.
        volume_id: VolumeId,
        /// The path in the way.
        path: PathBuf,
        /// What was found.
        problem: &'static str,
    },
    /// Another operation on the same volume is in flight.
    #[error("volume {volume_id} is busy with another operation")]
    Busy {
        /// The volume.
        volume_id: VolumeId,
    },
    /// The requested size is larger than the free space.
    #[error("requested {requested_bytes} bytes but only {available_bytes} are available")]
    CapacityExhausted {
        /// The requested minimum size.
        requested_bytes: u64,
        /// Free bytes minus the reserve when the request was checked.
        available_bytes: u64,
    },
    /// Another opener, in this process or another, holds the store's lock.
    #[error("store in use: {path:?} is locked by another opener")]
    StoreInUse {
        /// The lock file.
        path: PathBuf,
    },
    /// The store's layout is unsafe: a symlink, a wrong owner or mode, a relative path, or a
    /// store that is not the root of its own filesystem.
    #[error("unsafe store path {path:?}: {problem}")]
    UnsafeStore {
        /// The offending path.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A mutating call on a store opened read-only.
    #[error("store {path:?} is open read-only")]
    ReadOnly {
        /// The store root.
        path: PathBuf,
    },
    /// A record that cannot be trusted.
    #[error("corrupt record {path:?}: {problem}")]
    CorruptRecord {
        /// The record file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
        /// The JSON error, when there is one.
        #[source]
        source: Option<serde_json::Error>,
    },
    /// A record written by a newer format than this library understands.
    #[error("record {path:?} has format version {found}; this library reads up to {supported}")]
    UnsupportedFormat {
        /// The record file.
        path: PathBuf,
        /// The version in the record.
        found: u64,
        /// The newest version this library reads.
        supported: u32,
    },
    /// An operating-system call failed.
    #[error("{operation} {path:?} failed")]
    Io {
        /// What was being done, e.g. `fsync directory`.
        operation: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The mount table could not be parsed.
    #[error("cannot parse the mount table while checking {path:?}")]
    MountTable {
        /// The store root.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: mountinfo::Error,
    },
}

impl Error {
    /// The classification a driver maps to a status code.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidArgument { .. } | Self::InvalidCapacityRange { .. } => {
                ErrorKind::InvalidArgument
            }
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::Incompatible { .. } => ErrorKind::Incompatible,
            Self::ForeignNode { .. }
            | Self::Claimed { .. }
            | Self::ClaimConflict { .. }
            | Self::Unpublishable { .. }
            | Self::NotReady { .. }
            | Self::UnexpectedData { .. }
            | Self::ReadOnly { .. } => ErrorKind::FailedPrecondition,
            Self::Busy { .. } => ErrorKind::Busy,
            Self::CapacityExhausted { .. } => ErrorKind::CapacityExhausted,
            Self::StoreInUse { .. } => ErrorKind::StoreInUse,
            Self::UnsafeStore { .. } | Self::MountTable { .. } => ErrorKind::UnsafeStore,
            Self::CorruptRecord { .. } | Self::UnsupportedFormat { .. } => ErrorKind::Corrupt,
            Self::Io { .. } => ErrorKind::Io,
        }
    }

    pub(crate) fn io(operation: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            operation,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn unsafe_store(path: impl Into<PathBuf>, problem: impl Into<String>) -> Self {
        Self::UnsafeStore {
            path: path.into(),
            problem: problem.into(),
        }
    }

    pub(crate) fn corrupt(path: impl Into<PathBuf>, problem: impl Into<String>) -> Self {
        Self::CorruptRecord {
            path: path.into(),
            problem: problem.into(),
            source: None,
        }
    }
}
