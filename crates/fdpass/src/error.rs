//! The crate's one error type.

use std::io;
use std::path::PathBuf;

use crate::frame::{HEADER_LEN, MAGIC, MAX_FDS, MAX_PAYLOAD, VERSION};

/// An error from this crate. Messages are lowercase, name the offending value, and never repeat
/// the text of their `source`.
///
/// Three groups:
/// - refused before anything was sent ([`TooManyFds`](Error::TooManyFds),
///   [`PayloadTooLarge`](Error::PayloadTooLarge));
/// - a bad frame from the peer ([`Error::is_bad_frame`]): every descriptor that arrived with it
///   has already been closed, and the channel is still in step, so the next receive reads the
///   next frame;
/// - a failed system call, with the `io::Error` as its source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// More descriptors than one message can carry. Nothing was sent.
    #[error("refusing to send {count} descriptors in one message (at most {MAX_FDS})")]
    TooManyFds {
        /// Descriptors the caller passed.
        count: usize,
    },
    /// A payload over [`MAX_PAYLOAD`]. Nothing was sent.
    #[error("refusing to send a {len}-byte payload (at most {MAX_PAYLOAD} bytes)")]
    PayloadTooLarge {
        /// Bytes the caller passed.
        len: usize,
    },

    /// A record shorter than the header.
    #[error("frame of {len} bytes is shorter than the {HEADER_LEN}-byte header")]
    ShortFrame {
        /// Bytes the record held.
        len: usize,
    },
    /// The record does not start with [`MAGIC`]: the peer speaks another protocol.
    #[error("frame starts with {found:02x?}, not the magic {MAGIC:02x?}")]
    BadMagic {
        /// The record's first four bytes.
        found: [u8; 4],
    },
    /// A format version this side does not read.
    #[error("frame has format version {version}; this side reads version {VERSION}")]
    UnsupportedVersion {
        /// The version the frame declares.
        version: u16,
    },
    /// Flags that version 1 does not define.
    #[error("frame sets unknown flags {flags:#06x}")]
    UnknownFlags {
        /// The flags field.
        flags: u16,
    },
    /// The reserved header field is not zero.
    #[error("frame has {value:#06x} in its reserved field, not zero")]
    ReservedNotZero {
        /// The reserved field.
        value: u16,
    },
    /// The header's payload length disagrees with the bytes that arrived.
    #[error("frame declares a {declared}-byte payload but {received} bytes arrived")]
    LengthMismatch {
        /// The length the header declares.
        declared: u32,
        /// Payload bytes that arrived.
        received: usize,
    },
    /// The record was longer than the largest frame, and the kernel discarded its tail
    /// (`MSG_TRUNC`).
    #[error("frame is longer than {max} bytes and was cut")]
    FrameTruncated {
        /// The largest frame, header included.
        max: usize,
    },
    /// The kernel discarded descriptors that did not fit the receive buffer or the receiver's
    /// descriptor table (`MSG_CTRUNC`). Those that did arrive have been closed.
    #[error("descriptors were dropped in transit ({received} arrived)")]
    ControlTruncated {
        /// Descriptors that did arrive (and were closed).
        received: usize,
    },
    /// The header's descriptor count disagrees with the descriptors that arrived.
    #[error("frame declares {declared} descriptors but {received} arrived")]
    FdCountMismatch {
        /// The count the header declares.
        declared: u16,
        /// Descriptors that arrived (and were closed).
        received: usize,
    },
    /// Descriptors arrived with a frame that declares none.
    #[error("{received} descriptors arrived with a frame that declares none")]
    UnexpectedFds {
        /// Descriptors that arrived (and were closed).
        received: usize,
    },

    /// `socketpair` failed.
    #[error("cannot create a unix seqpacket socket pair")]
    SocketPair {
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// The descriptor given to [`Channel::from_fd`](crate::Channel::from_fd) is not a unix
    /// seqpacket socket.
    #[error("descriptor is not a unix seqpacket socket")]
    NotSeqpacket {
        /// Why the socket could not be inspected, when it could not.
        #[source]
        source: Option<io::Error>,
    },
    /// Creating, binding or listening on the listener's socket failed.
    #[error("cannot listen on {path:?}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// The listener's socket file is not what `bind` should have made. It has been removed.
    #[error("socket file {path:?} is unsafe: {problem}")]
    UnsafeSocketFile {
        /// The socket path.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// Connecting to a listener failed.
    #[error("cannot connect to {path:?}")]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// `accept` failed.
    #[error("cannot accept a connection")]
    Accept {
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// `sendmsg` failed (`BrokenPipe` when the peer has gone). Nothing was sent.
    #[error("cannot send a frame")]
    Send {
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// `sendmsg` reported fewer bytes than the frame has, which a seqpacket socket never does.
    #[error("sent {sent} of the frame's {expected} bytes")]
    IncompleteSend {
        /// Bytes sent.
        sent: usize,
        /// Bytes in the frame.
        expected: usize,
    },
    /// `recvmsg` failed. Nothing was received.
    #[error("cannot receive a frame")]
    Recv {
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// `SO_PEERCRED` failed.
    #[error("cannot read the peer's credentials")]
    PeerCredentials {
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// Registering the socket with tokio's reactor failed.
    #[cfg(feature = "tokio")]
    #[error("cannot register the socket with the tokio reactor")]
    Register {
        /// The failure.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Whether a frame arrived and was refused: the peer broke the protocol, or (only for
    /// [`ControlTruncated`](Error::ControlTruncated)) this process could not hold the frame's
    /// descriptors. Every descriptor that arrived has been closed and the channel is still in
    /// step: a receiver may read on, or drop the peer.
    pub fn is_bad_frame(&self) -> bool {
        match self {
            Error::ShortFrame { .. }
            | Error::BadMagic { .. }
            | Error::UnsupportedVersion { .. }
            | Error::UnknownFlags { .. }
            | Error::ReservedNotZero { .. }
            | Error::LengthMismatch { .. }
            | Error::FrameTruncated { .. }
            | Error::ControlTruncated { .. }
            | Error::FdCountMismatch { .. }
            | Error::UnexpectedFds { .. } => true,
            Error::TooManyFds { .. }
            | Error::PayloadTooLarge { .. }
            | Error::SocketPair { .. }
            | Error::NotSeqpacket { .. }
            | Error::Bind { .. }
            | Error::UnsafeSocketFile { .. }
            | Error::Connect { .. }
            | Error::Accept { .. }
            | Error::Send { .. }
            | Error::IncompleteSend { .. }
            | Error::Recv { .. }
            | Error::PeerCredentials { .. } => false,
            #[cfg(feature = "tokio")]
            Error::Register { .. } => false,
        }
    }
}
