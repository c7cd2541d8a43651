//! The one mapping from the owner's errors to gRPC status codes.
//!
//! Kubelet treats UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, RESOURCE_EXHAUSTED and CANCELLED as
//! "may have happened, call again" and every other code as final, after which it does not call
//! NodeUnstageVolume for that attempt: a final code must never leave anything of the volume
//! behind, so whatever can be left behind maps to a retryable code.

use tonic::{Code, Status};

use crate::capability::CapabilityError;
use crate::credentials::CredentialError;
use crate::error::Error;

/// The gRPC code of an error. Exhaustive by design, down to the kinds of the libraries'
/// errors, so that a new kind forces a decision here.
#[deny(clippy::wildcard_enum_match_arm)]
pub fn code(error: &Error) -> Code {
    use mounter::Error as M;
    use session::ErrorKind as S;
    match error {
        Error::Missing { .. }
        | Error::InvalidVolumeId { .. }
        | Error::Context(_)
        | Error::SecretsGiven
        | Error::Capability(CapabilityError::Unsupported(_)) => Code::InvalidArgument,
        Error::Path { source, .. } => match source {
            M::InvalidPath { .. }
            | M::OutsideRoot { .. }
            | M::SymlinkInPath { .. }
            | M::MountOnParent { .. }
            | M::NotADirectory { .. }
            | M::ParentMissing { .. } => Code::InvalidArgument,
            M::NotEmpty { .. }
            | M::StillMounted { .. }
            | M::ForeignMount { .. }
            | M::OutsideMount { .. }
            | M::NoMount { .. } => Code::FailedPrecondition,
            M::MountTable(_) | M::Io { .. } => Code::Unavailable,
        },
        Error::Capability(CapabilityError::ExceedsVolume { .. })
        | Error::LeaseHeld { .. }
        | Error::Refused { .. }
        | Error::FailedPrecondition { .. } => Code::FailedPrecondition,
        Error::Credentials { source, .. } => match source {
            CredentialError::Missing { .. }
            | CredentialError::MissingKey { .. }
            | CredentialError::Malformed { .. } => Code::FailedPrecondition,
            CredentialError::Unavailable { .. } => Code::Unavailable,
        },
        Error::VolumeNotFound { .. } | Error::NotFound { .. } => Code::NotFound,
        Error::AlreadyExists { .. } => Code::AlreadyExists,
        Error::Workers { .. } | Error::NotReady | Error::Threads(_) => Code::Unavailable,
        Error::Unsupported { .. } => Code::Unimplemented,
        Error::Busy { .. } | Error::LeaseExpired { .. } | Error::Retry { .. } => Code::Aborted,
        Error::Session { source, .. } => match source.kind() {
            S::InvalidArgument => Code::InvalidArgument,
            S::NotFound => Code::NotFound,
            S::IdentityMismatch | S::Incompatible => Code::AlreadyExists,
            // A record that cannot be trusted stays, and so may a stage: never final.
            S::Unsafe | S::Corrupt => Code::FailedPrecondition,
            S::Io => Code::Unavailable,
        },
        Error::Mount { source, .. } => match source {
            fusefs::MountError::StillReferenced { .. } | fusefs::MountError::NotOurs { .. } => {
                Code::FailedPrecondition
            }
            fusefs::MountError::Mount { .. }
            | fusefs::MountError::Session { .. }
            | fusefs::MountError::Nonce(_)
            | fusefs::MountError::Io { .. } => Code::Unavailable,
        },
        Error::Mounter { source, .. } => match source {
            M::InvalidPath { .. }
            | M::OutsideRoot { .. }
            | M::SymlinkInPath { .. }
            | M::MountOnParent { .. }
            | M::ParentMissing { .. }
            | M::NotADirectory { .. }
            | M::NotEmpty { .. }
            | M::StillMounted { .. }
            | M::ForeignMount { .. }
            | M::OutsideMount { .. }
            | M::NoMount { .. } => Code::FailedPrecondition,
            M::MountTable(_) | M::Io { .. } => Code::Unavailable,
        },
    }
}

/// Whether kubelet takes `code` as final: it then forgets the attempt and never calls
/// NodeUnstageVolume for it, so nothing of the volume may stay behind.
pub fn is_final(code: Code) -> bool {
    !matches!(
        code,
        Code::Ok
            | Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::Cancelled
    )
}

/// The status a client sees for an error: its [`code`] and its whole chain.
pub fn status(error: &Error) -> Status {
    Status::new(code(error), error_text::chain(error))
}

impl From<Error> for Status {
    fn from(error: Error) -> Self {
        status(&error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::ContextError;

    #[test]
    fn retryable_and_final_codes_are_as_the_issue_table_says() {
        let cases = [
            (Error::Missing { field: "volume_id" }, Code::InvalidArgument),
            (Error::SecretsGiven, Code::InvalidArgument),
            (
                Error::Context(ContextError::Missing { key: "k" }),
                Code::InvalidArgument,
            ),
            (
                Error::Capability(CapabilityError::ExceedsVolume {
                    mode: "MULTI_NODE_MULTI_WRITER",
                    volume_mode: crate::context::VolumeMode::Rwo,
                    accepted: "SINGLE_NODE_WRITER",
                }),
                Code::FailedPrecondition,
            ),
            (
                Error::VolumeNotFound {
                    volume_id: "v".into(),
                    generation: 1,
                    why: "unknown volume",
                },
                Code::NotFound,
            ),
            (
                Error::LeaseHeld {
                    volume_id: "v".into(),
                    remaining: std::time::Duration::from_secs(9),
                },
                Code::FailedPrecondition,
            ),
            (
                Error::Busy {
                    volume_id: "v".into(),
                },
                Code::Aborted,
            ),
            (
                Error::LeaseExpired {
                    volume_id: "v".into(),
                    path: "/s".into(),
                },
                Code::Aborted,
            ),
            (
                Error::Credentials {
                    volume_id: "v".into(),
                    source: CredentialError::MissingKey {
                        place: "/c/v".into(),
                        key: "token",
                    },
                },
                Code::FailedPrecondition,
            ),
            (Error::NotReady, Code::Unavailable),
        ];
        for (error, expected) in cases {
            assert_eq!(code(&error), expected, "{error}");
        }
        let status = status(&Error::LeaseExpired {
            volume_id: "v".into(),
            path: "/s".into(),
        });
        assert!(
            status.message().starts_with("lease expired: ")
                && status.message().ends_with("stays until NodeUnstageVolume"),
            "{}",
            status.message()
        );
        assert!(is_final(Code::InvalidArgument) && is_final(Code::FailedPrecondition));
        assert!(!is_final(Code::Aborted) && !is_final(Code::Unavailable));
    }
}
