//! Why a kernel request failed: the cause, kept until the adapter logs it once, counts it and
//! answers the kernel with its errno.

use lease_client::Refusal;

use crate::errno::{Errno, errno_of};

/// Why the filesystem could not serve a kernel request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the volume's workers failed: refused, unanswered, uncertain, ...
    #[error("{op} call failed")]
    Call {
        /// The operation of the call, as the protocol names it.
        op: &'static str,
        /// The operation changes nothing on the workers (a lookup, a read, ...), so whether
        /// an attempt of it was delivered does not matter to the application.
        read_only: bool,
        /// What the client says went wrong.
        #[source]
        source: lease_client::Error,
    },
    /// The kernel named a node this mount does not hold (forgotten, or never handed out by
    /// this process).
    #[error("node {node} is not known to this mount")]
    StaleNode {
        /// The FUSE node ID.
        node: u64,
    },
    /// A worker's reply lacks what the operation needs, or does not fit it.
    #[error("malformed {op} reply: {problem}")]
    MalformedReply {
        /// The operation the reply answers.
        op: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The kernel interrupted the request before anything was sent for it.
    #[error("interrupted before it was sent")]
    Interrupted,
    /// A mutation the kernel resent after its owner died came after the deadline for
    /// repeating it: it may or may not have been applied, and is not sent again.
    #[error("{op} was resent after the window for repeating it safely")]
    ResendTooLate {
        /// The operation.
        op: &'static str,
    },
}

/// A bounded kind of failure, for logs and metric labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// The volume's filesystem refused with an errno (`ENOENT`, `EEXIST` ...): an ordinary
    /// answer to the application.
    Refused,
    /// The mount's epoch is stale: another node holds the volume and this mount is fenced.
    Fenced,
    /// The workers hold no such volume, or another generation or access mode of it.
    VolumeGone,
    /// No worker answered within the budget, or too many calls were in flight.
    Unavailable,
    /// The outcome is unknown: the operation may have been applied.
    Uncertain,
    /// The workers refused the mount's credentials.
    Unauthorized,
    /// The request was interrupted before it was sent, or named a node this mount no longer
    /// holds: the kernel's business, not a fault.
    Kernel,
    /// A request or reply broke the protocol (malformed, over a limit, another operation's
    /// answer), or a local failure such as the random source: a bug somewhere.
    Protocol,
}

impl ErrorClass {
    /// The label: `refused`, `fenced`, `volume_gone`, `unavailable`, `uncertain`,
    /// `unauthorized`, `kernel` or `protocol`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Refused => "refused",
            ErrorClass::Fenced => "fenced",
            ErrorClass::VolumeGone => "volume_gone",
            ErrorClass::Unavailable => "unavailable",
            ErrorClass::Uncertain => "uncertain",
            ErrorClass::Unauthorized => "unauthorized",
            ErrorClass::Kernel => "kernel",
            ErrorClass::Protocol => "protocol",
        }
    }
}

impl Error {
    /// The errno the kernel answers the request with: a call's is [`errno_of`] its failure,
    /// except that a read-only call the workers did not answer is `ETIMEDOUT` even when an
    /// attempt may have been delivered, since it cannot have changed anything.
    pub fn errno(&self) -> Errno {
        match self {
            Error::Call { .. } if self.unanswered_read() => Errno::clamped(libc::ETIMEDOUT),
            Error::Call { source, .. } => errno_of(source),
            Error::StaleNode { .. } => Errno::clamped(libc::ESTALE),
            Error::MalformedReply { .. } => Errno::clamped(libc::EIO),
            Error::Interrupted => Errno::clamped(libc::EINTR),
            Error::ResendTooLate { .. } => Errno::clamped(libc::EIO),
        }
    }

    /// The kind of failure. Exhaustive by design: a new failure must be given one.
    #[deny(clippy::wildcard_enum_match_arm)]
    pub fn class(&self) -> ErrorClass {
        use lease_client::Error as Call;
        match self {
            Error::Call { source, .. } => match source {
                Call::Refused { refusal, .. } => match refusal {
                    Refusal::Errno(_) => ErrorClass::Refused,
                    Refusal::StaleEpoch => ErrorClass::Fenced,
                    Refusal::IdentityMismatch | Refusal::UnknownVolume => ErrorClass::VolumeGone,
                    Refusal::LeaseHeld { .. } | Refusal::InvalidRequest | Refusal::TooLarge => {
                        ErrorClass::Protocol
                    }
                },
                Call::Unavailable { .. } | Call::Busy { .. } => ErrorClass::Unavailable,
                Call::Uncertain { .. } if self.unanswered_read() => ErrorClass::Unavailable,
                Call::Uncertain { .. } => ErrorClass::Uncertain,
                Call::Unauthorized { .. } => ErrorClass::Unauthorized,
                Call::Rejected { .. }
                | Call::UnexpectedReply { .. }
                | Call::InvalidRequest { .. }
                | Call::Random(_) => ErrorClass::Protocol,
            },
            Error::StaleNode { .. } | Error::Interrupted => ErrorClass::Kernel,
            Error::MalformedReply { .. } => ErrorClass::Protocol,
            Error::ResendTooLate { .. } => ErrorClass::Uncertain,
        }
    }

    /// A call's failure, naming its operation and whether it is read-only
    /// ([`Op::is_read_only`](lease_client::v1::request::Op::is_read_only)).
    pub(crate) fn call(op: &'static str, read_only: bool, source: lease_client::Error) -> Self {
        Error::Call {
            op,
            read_only,
            source,
        }
    }

    /// A read-only call whose budget ended with an attempt that may have been delivered:
    /// uncertain to the client, but nothing can have been applied.
    fn unanswered_read(&self) -> bool {
        matches!(
            self,
            Error::Call {
                read_only: true,
                source: lease_client::Error::Uncertain { .. },
                ..
            }
        )
    }

    /// A reply without a field the operation needs, or with one it cannot use.
    pub(crate) fn malformed(op: &'static str, problem: &'static str) -> Self {
        Error::MalformedReply { op, problem }
    }
}

/// Logs `error` once, at a level that fits its class (a worker outage is not a bug), counts it
/// by operation and class (`fusefs_errors_total`), and returns the errno for the kernel.
pub(crate) fn report(operation: &'static str, error: &Error) -> Errno {
    let errno = error.errno();
    let class = error.class();
    metrics::counter!(
        "fusefs_errors_total",
        "operation" => operation,
        "class" => class.as_str(),
    )
    .increment(1);
    let error = error_text::chain(error);
    match class {
        ErrorClass::Refused | ErrorClass::Kernel => {
            tracing::debug!(operation, class = class.as_str(), errno = errno.raw(), %error, "request failed");
        }
        ErrorClass::Fenced
        | ErrorClass::VolumeGone
        | ErrorClass::Unavailable
        | ErrorClass::Uncertain
        | ErrorClass::Unauthorized => {
            tracing::warn!(operation, class = class.as_str(), errno = errno.raw(), %error, "request failed");
        }
        ErrorClass::Protocol => {
            tracing::error!(operation, class = class.as_str(), errno = errno.raw(), %error, "request failed");
        }
    }
    errno
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_has_its_errno_and_class() {
        let refused = |refusal| Error::Call {
            op: "lookup",
            read_only: true,
            source: lease_client::Error::Refused {
                volume_id: "v".into(),
                op: "lookup",
                refusal,
            },
        };
        let uncertain = |op, read_only| {
            Error::call(
                op,
                read_only,
                lease_client::Error::Uncertain {
                    volume_id: "v".into(),
                    op,
                    request_id: lease_client::protocol::RequestId([7; 16]),
                },
            )
        };
        let cases = [
            (
                refused(Refusal::Errno(libc::ENOENT)),
                libc::ENOENT,
                ErrorClass::Refused,
            ),
            (refused(Refusal::StaleEpoch), libc::EIO, ErrorClass::Fenced),
            (
                refused(Refusal::UnknownVolume),
                libc::ENODEV,
                ErrorClass::VolumeGone,
            ),
            (
                refused(Refusal::InvalidRequest),
                libc::EINVAL,
                ErrorClass::Protocol,
            ),
            (
                Error::StaleNode { node: 9 },
                libc::ESTALE,
                ErrorClass::Kernel,
            ),
            (Error::Interrupted, libc::EINTR, ErrorClass::Kernel),
            // An unanswered call that may have been delivered: the outcome of a mutation is
            // unknown, a read cannot have changed anything.
            (uncertain("write", false), libc::EIO, ErrorClass::Uncertain),
            (
                uncertain("getattr", true),
                libc::ETIMEDOUT,
                ErrorClass::Unavailable,
            ),
            (
                Error::malformed("read", "too much data"),
                libc::EIO,
                ErrorClass::Protocol,
            ),
        ];
        for (error, errno, class) in cases {
            assert_eq!(error.errno().raw(), errno, "{error}");
            assert_eq!(error.class(), class, "{error}");
        }
        let text = error_text::chain(&refused(Refusal::StaleEpoch));
        assert!(
            text.contains("lookup call failed") && text.contains("stale"),
            "{text}"
        );
        assert_eq!(
            report("read", &Error::malformed("read", "too much data")).raw(),
            libc::EIO
        );
    }
}
