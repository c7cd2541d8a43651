//! The one mapping from library errors to gRPC status codes, and the error category that logs
//! and metrics use (a bounded label, never a path or an ID).

use tonic::{Code, Status};

/// The full error chain, `outer: cause: cause`, for a status message.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// Maps a store error to its status. Exhaustive by design: a new kind forces a decision.
#[deny(clippy::wildcard_enum_match_arm)]
pub fn store(error: &localstore::Error) -> Status {
    use localstore::ErrorKind;
    let code = match error.kind() {
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::Incompatible => Code::AlreadyExists,
        ErrorKind::FailedPrecondition | ErrorKind::StoreInUse | ErrorKind::UnsafeStore => {
            Code::FailedPrecondition
        }
        ErrorKind::Busy => Code::Aborted,
        ErrorKind::CapacityExhausted => Code::ResourceExhausted,
        ErrorKind::Corrupt => Code::DataLoss,
        ErrorKind::Io => Code::Unavailable,
    };
    Status::new(code, chain(error))
}

/// Maps a mounter error to its status. Exhaustive by design.
#[deny(clippy::wildcard_enum_match_arm)]
pub fn mount(error: &mounter::Error) -> Status {
    use mounter::Error as E;
    let code = match error {
        E::InvalidPath { .. } | E::OutsideRoot { .. } | E::SymlinkInPath { .. } => {
            Code::InvalidArgument
        }
        E::MountOnParent { .. }
        | E::ParentMissing { .. }
        | E::NotADirectory { .. }
        | E::NotEmpty { .. }
        | E::StillMounted { .. }
        | E::ForeignMount { .. }
        | E::OutsideMount { .. }
        | E::NoMount { .. } => Code::FailedPrecondition,
        E::MountTable(_) => Code::Internal,
        E::Io { .. } => Code::Unavailable,
    };
    Status::new(code, chain(error))
}

/// A bounded name for a status code, for log fields and metric labels.
pub fn outcome(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// `INVALID_ARGUMENT` for a missing required field.
pub fn missing(field: &str) -> Status {
    Status::invalid_argument(format!("{field} is required"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_names_every_cause_once() {
        let io = std::io::Error::from_raw_os_error(libc_enoent());
        let error = mounter::Error::Io {
            op: "bind mount",
            path: "/t".into(),
            source: io,
        };
        let status = mount(&error);
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
    }
}
