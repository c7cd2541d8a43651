use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::VolumeSpec;

/// Everything that can go wrong while starting the worker, opening or creating a volume, or
/// administering it. Protocol-level refusals are not errors of this type: they are answered
/// to the caller as `Reply` errors.
///
/// Deliberately not `#[non_exhaustive]`: callers map each variant with an exhaustive `match`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file operation on the worker's own state failed.
    #[error("cannot {action} {path:?}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A state file exists but cannot be understood.
    #[error("{path:?} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A volume ID that cannot name a directory safely.
    #[error("invalid volume ID {volume_id:?}: {reason}")]
    InvalidVolumeId {
        /// The rejected ID.
        volume_id: String,
        /// Why.
        reason: &'static str,
    },
    /// The volume exists with another generation or access mode.
    #[error("volume {:?} exists as {existing} and cannot be opened as {requested}", existing.volume_id)]
    IdentityMismatch {
        /// What is on disk.
        existing: VolumeSpec,
        /// What was asked for.
        requested: VolumeSpec,
    },
    /// No volume with that ID is served here.
    #[error("unknown volume {volume_id:?}")]
    UnknownVolume {
        /// The ID.
        volume_id: String,
    },
    /// The TLS material is unusable.
    #[error("invalid TLS material: {what}")]
    Tls {
        /// Which part, and what is wrong.
        what: String,
    },
    /// The listening socket cannot be bound.
    #[error("cannot listen on {address}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The volume's apply loop has stopped (the worker is shutting down).
    #[error("the apply loop of volume {volume_id:?} has stopped")]
    Stopped {
        /// The volume.
        volume_id: String,
    },
}

impl Error {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
