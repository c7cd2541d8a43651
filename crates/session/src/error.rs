//! The crate's one error type and its classification.

use std::io;
use std::path::{Path, PathBuf};

use crate::{AccessMode, MountEpoch};

/// What kind of failure an [`Error`] is, so a caller can map every error to exactly one gRPC
/// code with an exhaustive `match`. Deliberately not `#[non_exhaustive]`: a new kind must force
/// a decision at each boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A malformed argument: a staging path, an identity, endpoints or an epoch string.
    InvalidArgument,
    /// There is no session record where one was required.
    NotFound,
    /// The record or its directory is unsafe to trust: a symlink, not a regular file, another
    /// owner, a mode wider than 0600, extra hard links. Rejected, never repaired.
    Unsafe,
    /// The record's content cannot be trusted: too large, not JSON, an unknown field or format
    /// version, an invalid value, a record of one access mode under the other's name, or both
    /// an RWO and an RWX record beside one staging path.
    Corrupt,
    /// The record names another volume, generation, node or mount epoch than the caller's.
    IdentityMismatch,
    /// The staging path holds a session of the caller's identity but of another access mode
    /// (RWO against RWX): the request is an incompatible repeat of NodeStageVolume, which CSI
    /// answers with `ALREADY_EXISTS` ("volume staged at this path, but incompatible").
    Incompatible,
    /// An operating-system call failed.
    Io,
}

/// An error from this crate. Messages are lowercase, name the offending path or value, and
/// never repeat the text of their `source`. None of them carries a record's bytes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The staging path cannot carry a session record beside it.
    #[error("invalid staging path {path:?}: {reason}")]
    InvalidStagingPath {
        /// The staging path as given.
        path: PathBuf,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A record field the caller supplied is out of bounds.
    #[error("invalid session record: {field} {reason}")]
    InvalidRecord {
        /// The field, as named in the JSON form.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A string that is not the text form of a [`MountEpoch`].
    #[error("invalid mount epoch: {reason}")]
    InvalidEpoch {
        /// What is wrong with it.
        reason: String,
    },
    /// The directory that holds the record is unsafe.
    #[error("unsafe session directory {path:?}: {problem}")]
    UnsafeDirectory {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A symlink where the record belongs. It is never followed and never replaced.
    #[error("session record {path:?} is a symlink; refusing to follow it")]
    Symlink {
        /// The record path.
        path: PathBuf,
    },
    /// Something other than a regular file where the record belongs.
    #[error("session record {path:?} is not a regular file")]
    NotRegularFile {
        /// The record path.
        path: PathBuf,
    },
    /// The record belongs to another user.
    #[error(
        "session record {path:?} is owned by uid {owner}, not by this process's uid {expected}"
    )]
    ForeignOwner {
        /// The record path.
        path: PathBuf,
        /// The record's owner.
        owner: u32,
        /// The effective uid of this process.
        expected: u32,
    },
    /// The record grants more than owner read and write.
    #[error("session record {path:?} has mode {mode:04o}; it must be 0600 or narrower")]
    WrongMode {
        /// The record path.
        path: PathBuf,
        /// The permission bits found, including set-id and sticky bits.
        mode: u32,
    },
    /// The record has more than one name, so something else can read or change it.
    #[error("session record {path:?} has {links} hard links; expected 1")]
    HardLinked {
        /// The record path.
        path: PathBuf,
        /// The link count found.
        links: u64,
    },
    /// The record is larger than any record this library writes.
    #[error("session record {path:?} is {size} bytes; the limit is {limit}")]
    TooLarge {
        /// The record path.
        path: PathBuf,
        /// The size found (at least `limit + 1` when the file grew while read).
        size: u64,
        /// [`MAX_RECORD_BYTES`](crate::MAX_RECORD_BYTES).
        limit: u64,
    },
    /// The record is not a valid record of its format version, or its name is the other access
    /// mode's (an RWX record in `<staging>.rwo-session`, or the other way round).
    #[error("malformed session record{}: {problem}", at(.path.as_deref()))]
    Malformed {
        /// The record path; `None` from [`parse`](crate::parse).
        path: Option<PathBuf>,
        /// What is wrong.
        problem: String,
        /// The JSON parser's error, when there is one (boxed, so that the parser is not part
        /// of this crate's API).
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The record's format version is not one this library reads.
    #[error(
        "session record{} has unknown format version {found}; this library reads versions 1 to {supported}",
        at(.path.as_deref())
    )]
    UnsupportedFormat {
        /// The record path; `None` from [`parse`](crate::parse).
        path: Option<PathBuf>,
        /// The version in the record.
        found: u64,
        /// The newest version this library reads, [`FORMAT_VERSION`](crate::FORMAT_VERSION); it
        /// reads every version from 1 up to it.
        supported: u32,
    },
    /// Both an RWO and an RWX record exist beside one staging path. This library never writes
    /// that state, so it does not choose between them: every operation refuses it and leaves
    /// both files as they are.
    #[error(
        "session records {rwo:?} and {rwx:?} both exist; a staging path has at most one, so neither is trusted"
    )]
    ConflictingRecords {
        /// The RWO record's path.
        rwo: PathBuf,
        /// The RWX record's path.
        rwx: PathBuf,
    },
    /// The record names another volume, generation or node than the caller expects.
    #[error("session record {path:?} names {field} {found}, not {expected}")]
    IdentityMismatch {
        /// The record path.
        path: PathBuf,
        /// The first field that differs: `volume_id`, `volume_generation` or `node_id`.
        field: &'static str,
        /// The value in the record (strings quoted).
        found: String,
        /// The value the caller expects (strings quoted).
        expected: String,
    },
    /// The staging path holds a session of the caller's identity for another access mode than
    /// the caller's: it was staged RWO and is asked for RWX, or the other way round.
    #[error("session record {path:?} is for access mode {found}, not {expected}")]
    AccessModeMismatch {
        /// The existing record's path.
        path: PathBuf,
        /// The access mode of the existing record.
        found: AccessMode,
        /// The access mode the caller asked for.
        expected: AccessMode,
    },
    /// The record belongs to another claim of the same volume.
    #[error("session record {path:?} holds mount epoch {found}, not {expected}")]
    EpochMismatch {
        /// The record path.
        path: PathBuf,
        /// The epoch in the record.
        found: MountEpoch,
        /// The epoch the caller holds.
        expected: MountEpoch,
    },
    /// No record exists where the operation needs one.
    #[error("session record {path:?} does not exist")]
    NotFound {
        /// The record path.
        path: PathBuf,
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
}

fn at(path: Option<&Path>) -> String {
    path.map(|p| format!(" {p:?}")).unwrap_or_default()
}

impl Error {
    /// The classification a caller maps to a status code.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidStagingPath { .. }
            | Self::InvalidRecord { .. }
            | Self::InvalidEpoch { .. } => ErrorKind::InvalidArgument,
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::UnsafeDirectory { .. }
            | Self::Symlink { .. }
            | Self::NotRegularFile { .. }
            | Self::ForeignOwner { .. }
            | Self::WrongMode { .. }
            | Self::HardLinked { .. } => ErrorKind::Unsafe,
            Self::TooLarge { .. }
            | Self::Malformed { .. }
            | Self::UnsupportedFormat { .. }
            | Self::ConflictingRecords { .. } => ErrorKind::Corrupt,
            Self::IdentityMismatch { .. } | Self::EpochMismatch { .. } => {
                ErrorKind::IdentityMismatch
            }
            Self::AccessModeMismatch { .. } => ErrorKind::Incompatible,
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

    /// Attaches the record path to an error from [`parse`](crate::parse).
    pub(crate) fn at_path(mut self, record: &Path) -> Self {
        match &mut self {
            Self::Malformed { path, .. } | Self::UnsupportedFormat { path, .. } => {
                *path = Some(record.to_owned());
            }
            _ => {}
        }
        self
    }
}
