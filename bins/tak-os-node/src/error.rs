//! Everything a Node call can fail with. [`crate::status::code`] maps each variant to its gRPC
//! code in one exhaustive match; the message a client sees is the error's chain.

use std::path::PathBuf;

use crate::capability::CapabilityError;
use crate::context::ContextError;
use crate::credentials::CredentialError;

/// Why a Node call failed.
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
    /// The volume ID is not one this driver issues.
    #[error("volume_id {volume_id:?} is invalid: {reason}")]
    InvalidVolumeId {
        /// The ID as given.
        volume_id: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The volume context breaks the contract.
    #[error(transparent)]
    Context(#[from] ContextError),
    /// The capability is unsupported, or more than the volume allows.
    #[error(transparent)]
    Capability(#[from] CapabilityError),
    /// The request carries secrets; this driver reads credentials only from its own namespace.
    #[error("secrets are not accepted: this driver reads credentials only from its own namespace")]
    SecretsGiven,
    /// A staging or target path is not acceptable.
    #[error("{field} is not acceptable")]
    Path {
        /// The request field.
        field: &'static str,
        /// Why.
        #[source]
        source: mounter::Error,
    },
    /// The volume's credentials are missing or unusable, or their source cannot be read.
    #[error("the credentials of volume {volume_id} cannot be used")]
    Credentials {
        /// The volume.
        volume_id: String,
        /// Why.
        #[source]
        source: CredentialError,
    },
    /// The workers do not know the volume, or know it at another generation or access mode.
    #[error("the workers do not serve volume {volume_id} at generation {generation} ({why})")]
    VolumeNotFound {
        /// The volume.
        volume_id: String,
        /// The generation asked for.
        generation: u64,
        /// The workers' refusal.
        why: &'static str,
    },
    /// The staging or target path holds something of another identity.
    #[error("{path:?} already holds {found}")]
    AlreadyExists {
        /// The path.
        path: PathBuf,
        /// What is there.
        found: String,
    },
    /// Another node (or another owner) holds the RWO volume's lease.
    #[error(
        "volume {volume_id} is in use on another node: its lease is held by another epoch for {remaining:?}"
    )]
    LeaseHeld {
        /// The volume.
        volume_id: String,
        /// How much longer the other lease runs, at the worker's clock.
        remaining: std::time::Duration,
    },
    /// The workers could not be reached or did not settle the call in its budget.
    #[error("the workers of volume {volume_id} did not answer {op}")]
    Workers {
        /// The volume.
        volume_id: String,
        /// What was asked.
        op: &'static str,
        /// Why.
        #[source]
        source: lease_client::Error,
    },
    /// The workers refused a call definitely, for a reason not named above.
    #[error("the workers refused {op} for volume {volume_id}")]
    Refused {
        /// The volume.
        volume_id: String,
        /// What was asked.
        op: &'static str,
        /// Why.
        #[source]
        source: lease_client::Error,
    },
    /// Another call for the same volume is in flight.
    #[error("another call for volume {volume_id} is in progress")]
    Busy {
        /// The volume.
        volume_id: String,
    },
    /// A retried stage whose earlier stage completed and whose lease has expired.
    #[error(
        "lease expired: the stage of volume {volume_id} at {path:?} stays until NodeUnstageVolume"
    )]
    LeaseExpired {
        /// The volume.
        volume_id: String,
        /// The staging path.
        path: PathBuf,
    },
    /// Something of this volume must stay for now (a stage left by an earlier owner process
    /// still referenced, an uncertain step); the call may be repeated.
    #[error("volume {volume_id}: {what}")]
    Retry {
        /// The volume.
        volume_id: String,
        /// What remains, and why.
        what: String,
    },
    /// The call cannot be done in the volume's current state.
    #[error("volume {volume_id}: {problem}")]
    FailedPrecondition {
        /// The volume.
        volume_id: String,
        /// What is in the way.
        problem: String,
    },
    /// The path holds no stage or publication of this volume.
    #[error("{path:?} holds no stage or publication of volume {volume_id}")]
    NotFound {
        /// The volume.
        volume_id: String,
        /// The path.
        path: PathBuf,
    },
    /// The session record beside the staging path cannot be used.
    #[error("the session record of {staging:?}")]
    Session {
        /// The staging path.
        staging: PathBuf,
        /// Why.
        #[source]
        source: session::Error,
    },
    /// Mounting or unmounting the FUSE filesystem failed.
    #[error("the FUSE mount of volume {volume_id}")]
    Mount {
        /// The volume.
        volume_id: String,
        /// Why.
        #[source]
        source: fusefs::MountError,
    },
    /// A bind mount, an unmount or a mount-table read failed.
    #[error("the mounts of volume {volume_id}")]
    Mounter {
        /// The volume.
        volume_id: String,
        /// Why.
        #[source]
        source: mounter::Error,
    },
    /// The threads that serve the stages could not start.
    #[error("cannot start the threads that serve mounts")]
    Threads(#[source] std::io::Error),
    /// The owner is not ready yet (its startup recovery has not finished).
    #[error("the mount owner is starting")]
    NotReady,
    /// An RPC this driver does not implement.
    #[error("{rpc} is not supported by this driver")]
    Unsupported {
        /// The RPC.
        rpc: &'static str,
    },
}

/// A bounded error category for logs and metrics: never a path or an ID.
pub fn category(error: &Error) -> &'static str {
    match error {
        Error::Missing { .. }
        | Error::InvalidVolumeId { .. }
        | Error::Context(_)
        | Error::SecretsGiven
        | Error::Path { .. } => "invalid_argument",
        Error::Capability(CapabilityError::Unsupported(_)) => "invalid_argument",
        Error::Capability(CapabilityError::ExceedsVolume { .. }) => "capability",
        Error::Credentials { .. } => "credentials",
        Error::VolumeNotFound { .. } => "volume_not_found",
        Error::AlreadyExists { .. } => "already_exists",
        Error::LeaseHeld { .. } => "lease_held",
        Error::Workers { .. } => "workers_unavailable",
        Error::Refused { .. } => "workers_refused",
        Error::Busy { .. } => "busy",
        Error::LeaseExpired { .. } => "lease_expired",
        Error::Retry { .. } => "retry",
        Error::FailedPrecondition { .. } => "failed_precondition",
        Error::NotFound { .. } => "not_found",
        Error::Session { .. } => "session_record",
        Error::Mount { .. } => "mount",
        Error::Mounter { .. } => "mounter",
        Error::NotReady => "not_ready",
        Error::Threads(_) => "threads",
        Error::Unsupported { .. } => "unsupported",
    }
}
