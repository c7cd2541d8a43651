//! The crate's error type.

use crate::protocol::{ProtocolError, Refusal, ReplyMismatch};

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The operating system's random source failed.
    #[error("cannot draw random bytes: {reason}")]
    Random {
        /// The source's explanation.
        reason: String,
    },
    /// A message did not decode or failed the envelope checks.
    #[error("malformed message")]
    Protocol(#[from] ProtocolError),
    /// A reply does not answer the request it came back for.
    #[error("reply does not match its request")]
    ReplyMismatch(#[from] ReplyMismatch),
    /// The worker refused definitely.
    #[error("worker refused: {0}")]
    Refused(Refusal),
}
