//! The crate's error type.

use crate::policy::Failure;
use crate::protocol::{ProtocolError, RandomUnavailable, RequestId};

pub use crate::protocol::Refusal;

/// Everything that can go wrong with a call (building a client is [`ConfigError`]'s).
///
/// The variants of a call fall in two groups: **definite** ones (the operation was not
/// applied and never will be under that request ID: [`Refused`](Error::Refused),
/// [`Unavailable`](Error::Unavailable), [`Unauthorized`](Error::Unauthorized),
/// [`Busy`](Error::Busy), [`Rejected`](Error::Rejected)), and
/// [`Uncertain`](Error::Uncertain), which only a re-send of the same prepared call can
/// settle. [`Error::is_definite`] tells them apart.
///
/// Deliberately not `#[non_exhaustive]`: the filesystem maps each variant to an errno with an
/// exhaustive `match`, and a new variant must force that decision.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The operating system's random source failed.
    #[error(transparent)]
    Random(#[from] RandomUnavailable),
    /// A request could not be built: it is over a limit or lacks a field.
    #[error("invalid {op} request for volume {volume_id}")]
    InvalidRequest {
        /// The volume.
        volume_id: String,
        /// The operation.
        op: &'static str,
        /// What is wrong.
        #[source]
        source: ProtocolError,
    },
    /// The worker refused definitely.
    #[error("{op} on volume {volume_id} refused: {refusal}")]
    Refused {
        /// The volume.
        volume_id: String,
        /// The operation.
        op: &'static str,
        /// The worker's reason.
        refusal: Refusal,
    },
    /// The call's budget ended after an attempt that may have been delivered: the operation
    /// may or may not take effect. Re-send the same prepared call (same request ID, same
    /// bytes) to learn which; never send it as a new request.
    #[error("{op} on volume {volume_id} is uncertain (request {request_id})")]
    Uncertain {
        /// The volume.
        volume_id: String,
        /// The operation.
        op: &'static str,
        /// The request ID to re-send with.
        request_id: RequestId,
    },
    /// The budget ended and no attempt can have been applied.
    #[error("{op} on volume {volume_id}: no worker answered ({})", last.name())]
    Unavailable {
        /// The volume.
        volume_id: String,
        /// The operation.
        op: &'static str,
        /// Why the last attempt failed.
        last: Failure,
    },
    /// The worker refused the token or certificate, and no newer credentials came.
    #[error("{op} on volume {volume_id}: credentials refused")]
    Unauthorized {
        /// The volume.
        volume_id: String,
        /// The operation.
        op: &'static str,
    },
    /// The call's budget ended while it waited for one of the client's in-flight slots.
    #[error("{op} on volume {volume_id}: too many calls in flight")]
    Busy {
        /// The volume.
        volume_id: String,
        /// The operation.
        op: &'static str,
    },
    /// The worker answered with an HTTP status that refuses the request outright (a 4xx
    /// other than 401 and 403, such as 413 for a body over its limit).
    #[error("{op} on volume {volume_id}: worker answered HTTP {status}")]
    Rejected {
        /// The volume.
        volume_id: String,
        /// The operation.
        op: &'static str,
        /// The HTTP status.
        status: u16,
    },
    /// A reply arrived that does not fit the call (the worker answered another operation
    /// than the helper expected).
    #[error("{op} on volume {volume_id}: unexpected {found} reply")]
    UnexpectedReply {
        /// The volume.
        volume_id: String,
        /// The operation.
        op: &'static str,
        /// The reply's kind.
        found: &'static str,
    },
}

impl Error {
    /// True when the failed call's operation was certainly not applied and never will be
    /// (a request that could not even be built counts: it was never sent). False for
    /// [`Error::Uncertain`], for a reply that makes no sense ([`Error::UnexpectedReply`]:
    /// the worker did something) and for a failed random source.
    pub fn is_definite(&self) -> bool {
        match self {
            Error::Refused { .. }
            | Error::Unavailable { .. }
            | Error::Unauthorized { .. }
            | Error::Busy { .. }
            | Error::Rejected { .. }
            | Error::InvalidRequest { .. } => true,
            Error::Uncertain { .. } | Error::UnexpectedReply { .. } | Error::Random(_) => false,
        }
    }

    /// The worker's refusal, if this is one.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            Error::Refused { refusal, .. } => Some(refusal),
            _ => None,
        }
    }
}

/// Why a client cannot be built: its endpoints or its credentials are unusable. Returned by
/// [`EndpointSet::new`](crate::EndpointSet::new) and
/// [`Credentials::from_pem`](crate::Credentials::from_pem), never by a call.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// An endpoint is not `host:port`. The endpoint itself is not kept: a refused endpoint
    /// may carry a credential (`user:password@host`), and this error is made to be logged.
    #[error("invalid worker endpoint (number {position} in the list): {problem}")]
    InvalidEndpoint {
        /// The endpoint's position in the list as given, counting from 1.
        position: usize,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The endpoint list is empty.
    #[error("no worker endpoints")]
    NoEndpoints,
    /// TLS material could not be used; `what` names which (never its contents).
    #[error("invalid credentials: {what}")]
    InvalidCredentials {
        /// Which part is wrong: "CA bundle", "client certificate", "client key", "token".
        what: &'static str,
        /// The parser's or TLS library's explanation, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}
