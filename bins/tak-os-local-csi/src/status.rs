//! The one mapping from the driver's errors to gRPC status codes, and the error category that
//! logs and metrics use (a bounded label, never a path or an ID).

use tonic::{Code, Status};

use crate::error::Error;

/// The full error chain, `outer: cause: cause`, for a status message.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    error_text::chain(error)
}

/// The gRPC code of an error (DESIGN.md section 4). Exhaustive by design, down to the kinds of
/// the store's and the mounter's errors: a new variant forces a decision here.
#[deny(clippy::wildcard_enum_match_arm)]
pub fn code(error: &Error) -> Code {
    use localstore::ErrorKind as K;
    use mounter::Error as M;
    match error {
        Error::Missing { .. }
        | Error::UnsupportedCapability { .. }
        | Error::UnsupportedParameter { .. }
        | Error::MutableParameters
        | Error::ContentSource
        | Error::NegativeCapacity { .. }
        | Error::NegativeMaxEntries { .. }
        | Error::MalformedConsumerTarget { .. }
        | Error::OutsideRoots { .. } => Code::InvalidArgument,
        Error::NotAVolumeId { .. }
        | Error::OtherNode { .. }
        | Error::VolumeNotFound { .. }
        | Error::NotMountedAt { .. } => Code::NotFound,
        Error::PublishedWithOtherOptions { .. } | Error::TargetOfAnotherVolume { .. } => {
            Code::AlreadyExists
        }
        Error::StillPublished { .. }
        | Error::ForeignMountAtTarget { .. }
        | Error::ClaimedByConsumer { .. }
        | Error::PublishedBeforeClaim { .. }
        | Error::SingleWriterPublished { .. }
        | Error::UnknownVolumeMounted { .. }
        | Error::TooManyMounts { .. }
        | Error::StoreMoved { .. } => Code::FailedPrecondition,
        Error::ForeignToken { .. } => Code::Aborted,
        Error::NotInRequisiteTopology { .. } => Code::ResourceExhausted,
        Error::Unsupported { .. } => Code::Unimplemented,
        Error::HandlerFailed { .. } => Code::Internal,
        Error::Store(error) => match error.kind() {
            K::InvalidArgument => Code::InvalidArgument,
            K::NotFound => Code::NotFound,
            K::Incompatible => Code::AlreadyExists,
            K::FailedPrecondition | K::StoreInUse | K::UnsafeStore => Code::FailedPrecondition,
            K::Busy => Code::Aborted,
            K::CapacityExhausted => Code::ResourceExhausted,
            K::Corrupt => Code::DataLoss,
            K::Io => Code::Unavailable,
        },
        Error::Mount(error) => match error {
            M::InvalidPath { .. } | M::OutsideRoot { .. } | M::SymlinkInPath { .. } => {
                Code::InvalidArgument
            }
            M::MountOnParent { .. }
            | M::ParentMissing { .. }
            | M::NotADirectory { .. }
            | M::NotEmpty { .. }
            | M::StillMounted { .. }
            | M::ForeignMount { .. }
            | M::OutsideMount { .. }
            | M::NoMount { .. } => Code::FailedPrecondition,
            M::MountTable(_) => Code::Internal,
            M::Io { .. } => Code::Unavailable,
        },
    }
}

/// The status a client sees for an error: its [`code`] and its [`chain`].
pub fn status(error: &Error) -> Status {
    Status::new(code(error), chain(error))
}

impl From<Error> for Status {
    fn from(error: Error) -> Self {
        status(&error)
    }
}

/// A bounded name for a status code, for log fields and metric labels: the code's name in
/// lower case (`ok`, `invalid_argument`, `failed_precondition`).
pub fn outcome(code: Code) -> &'static str {
    csi_proto::code_name(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn the_chain_names_every_cause_once() {
        let io = std::io::Error::from_raw_os_error(libc_enoent());
        let error = Error::Mount(mounter::Error::Io {
            op: "bind mount",
            path: "/t".into(),
            source: io,
        });
        let status = status(&error);
        assert_eq!(status.code(), Code::Unavailable);
        assert!(
            status.message().starts_with("bind mount \"/t\" failed: "),
            "{}",
            status.message()
        );
        assert_eq!(status.message().matches("No such file").count(), 1);
    }

    fn libc_enoent() -> i32 {
        2
    }

    #[test]
    fn outcomes_are_lowercase_code_names() {
        assert_eq!(outcome(Code::Aborted), "aborted");
        assert_eq!(outcome(Code::Ok), "ok");
        assert_eq!(outcome(Code::FailedPrecondition), "failed_precondition");
    }

    #[test]
    fn statuses_keep_the_codes_and_messages_clients_rely_on() {
        let cases = [
            (
                Error::Missing { field: "volume_id" },
                Code::InvalidArgument,
                "volume_id is required",
            ),
            (
                Error::OutsideRoots {
                    target: PathBuf::from("/tmp/x"),
                    kubelet_root: PathBuf::from("/var/lib/kubelet"),
                    consumer_root: Some(PathBuf::from("/c")),
                },
                Code::InvalidArgument,
                "target \"/tmp/x\" is not below the kubelet root \"/var/lib/kubelet\" or the \
                 consumer mount root \"/c\"",
            ),
            (
                Error::OutsideRoots {
                    target: PathBuf::from("/tmp/x"),
                    kubelet_root: PathBuf::from("/var/lib/kubelet"),
                    consumer_root: None,
                },
                Code::InvalidArgument,
                "target \"/tmp/x\" is not below the kubelet root \"/var/lib/kubelet\"",
            ),
            (
                Error::ForeignToken { token: "t".into() },
                Code::Aborted,
                "starting_token \"t\" was not issued by this driver",
            ),
            (
                Error::NotInRequisiteTopology { node: "n".into() },
                Code::ResourceExhausted,
                "node n is not in the requisite topology; the volume can only live on this node",
            ),
            (
                Error::Unsupported {
                    rpc: "CreateSnapshot",
                },
                Code::Unimplemented,
                "CreateSnapshot is not supported by csi.local.tak-os.org",
            ),
            (
                Error::TooManyMounts {
                    target: PathBuf::from("/t"),
                    unmounts: 16,
                },
                Code::FailedPrecondition,
                "\"/t\" still holds mounts after 16 unmounts",
            ),
        ];
        for (error, code, message) in cases {
            let status = Status::from(error);
            assert_eq!((status.code(), status.message()), (code, message));
        }
    }

    #[test]
    fn store_errors_keep_their_kind_and_text() {
        let error = localstore::CapacityRange {
            required_bytes: 2,
            limit_bytes: 1,
        }
        .validate()
        .unwrap_err();
        let expected = chain(&error);
        let status = status(&Error::from(error));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), expected);
    }
}
