use std::io;
use std::path::PathBuf;

use crate::MountIdentity;

/// Everything that can go wrong while validating a target or mounting.
///
/// Deliberately not `#[non_exhaustive]`: callers map each variant to one status code with an
/// exhaustive `match`, and a new variant must force that decision.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The path is not clean and absolute.
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath {
        /// The path.
        path: PathBuf,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The target is not strictly below the configured root.
    #[error("target {path:?} is not below the allowed root {root:?}")]
    OutsideRoot {
        /// The target.
        path: PathBuf,
        /// The root it must lie below.
        root: PathBuf,
    },
    /// A component of the path is a symbolic link.
    #[error("a component of {path:?} is a symbolic link")]
    SymlinkInPath {
        /// The path.
        path: PathBuf,
    },
    /// A directory between the root and the target's parent is a mount point.
    #[error("a parent directory of {path:?} is a mount point")]
    MountOnParent {
        /// The target.
        path: PathBuf,
    },
    /// The target's parent directory does not exist (it is never created here).
    #[error("the parent directory of {path:?} does not exist")]
    ParentMissing {
        /// The target.
        path: PathBuf,
    },
    /// Something other than a directory is in the way.
    #[error("{path:?} is not a directory")]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// The target directory is not empty, so it is not removed.
    #[error("{path:?} is not empty")]
    NotEmpty {
        /// The target.
        path: PathBuf,
    },
    /// The target is still a mount point.
    #[error("{path:?} is still mounted")]
    StillMounted {
        /// The target.
        path: PathBuf,
    },
    /// The mount at the target is not the one the caller acts on.
    #[error("{path:?} holds a foreign mount ({found}), expected {expected}")]
    ForeignMount {
        /// The target.
        path: PathBuf,
        /// What is mounted there.
        found: Box<MountIdentity>,
        /// What the caller expected.
        expected: Box<MountIdentity>,
    },
    /// The path does not lie inside the mount the kernel reported for it (a symlink in the
    /// path, or a root directory that differs from ours).
    #[error("{path:?} is not below the mount point {mount_point:?} that contains it")]
    OutsideMount {
        /// The path.
        path: PathBuf,
        /// The mount point the kernel reported.
        mount_point: PathBuf,
    },
    /// No mount contains the path (an incomplete mount table).
    #[error("no mount contains {path:?}")]
    NoMount {
        /// The path.
        path: PathBuf,
    },
    /// The mount table could not be parsed.
    #[error("cannot parse the mount table")]
    MountTable(#[source] mountinfo::Error),
    /// A system call failed.
    #[error("{op} {path:?} failed")]
    Io {
        /// The operation.
        op: &'static str,
        /// The path it acted on.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}
