//! The crate's one error type, and the two errors that hand something back.

use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fuse_wire::Opcode;

use crate::Session;

/// Why a session could not mount, start, adopt, pause or go on serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A [`MountOptions`](crate::MountOptions) or [`ServeOptions`](crate::ServeOptions) field
    /// the kernel would refuse or this crate cannot honour.
    #[error("invalid option {option}: {reason}")]
    InvalidOption {
        /// The field.
        option: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Not called within a tokio runtime (one with I/O enabled is needed).
    #[error("no tokio runtime is running on this thread")]
    NoRuntime,
    /// Opening `/dev/fuse` failed.
    #[error("opening /dev/fuse failed")]
    OpenDevice {
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// mount(2) failed; nothing was mounted.
    #[error("mounting at {target:?} failed")]
    Mount {
        /// The mount point.
        target: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// mount(2) succeeded but the connection did not start. The mount stays at `target`, its
    /// connection aborted (the descriptor is closed): the caller unmounts it as it would any
    /// dead mount.
    #[error("mounted at {target:?} but the connection did not start; the dead mount is left")]
    Initialize {
        /// The mount point.
        target: PathBuf,
        /// What went wrong.
        #[source]
        source: Box<Error>,
    },
    /// Reading the INIT request failed, or the connection ended before it came.
    #[error("reading the INIT request failed")]
    InitRead {
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The first request of a fresh connection was not INIT.
    #[error("the first request was {opcode}, not INIT")]
    NotInit {
        /// What came instead.
        opcode: Opcode,
    },
    /// The INIT request did not decode.
    #[error("the INIT request is malformed")]
    InitDecode {
        /// The cause.
        #[source]
        source: fuse_wire::Error,
    },
    /// The kernel's protocol version (or a record's) cannot be served.
    #[error(
        "protocol {major}.{minor} is not supported (major {}, minor at least {})",
        fuse_wire::KERNEL_VERSION,
        fuse_wire::OLDEST_SUPPORTED_MINOR
    )]
    UnsupportedProtocol {
        /// Major version.
        major: u32,
        /// Minor version.
        minor: u32,
    },
    /// Writing the INIT reply failed.
    #[error("writing the INIT reply failed")]
    InitWrite {
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// An INIT record did not decode, or the INIT exchange did not make one.
    #[error("the INIT record is unusable")]
    Record {
        /// The cause.
        #[source]
        source: fuse_wire::Error,
    },
    /// The descriptor offered for adoption is not a `/dev/fuse` descriptor.
    #[error("the descriptor is not /dev/fuse: {found}")]
    NotFuseDevice {
        /// What it is instead.
        found: String,
    },
    /// A call on the descriptor (`fstat`, `fcntl`, `dup`) failed.
    #[error("{op} on the descriptor failed")]
    Descriptor {
        /// The call.
        op: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Registering the descriptor with tokio's reactor failed.
    #[error("registering the descriptor with the reactor failed")]
    Register {
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Requests were still being handled when the pause deadline passed; the session serves
    /// again.
    #[error(
        "{in_flight} requests were still in flight when the pause deadline of {deadline:?} passed"
    )]
    PauseDeadline {
        /// The deadline given.
        deadline: Duration,
        /// Requests still being handled.
        in_flight: usize,
    },
    /// The kernel did not offer `FUSE_HAS_RESEND` on this connection (before Linux 6.9).
    #[error("the kernel did not offer FUSE_HAS_RESEND on this connection")]
    ResendUnsupported,
    /// Writing `FUSE_NOTIFY_RESEND` failed.
    #[error("writing FUSE_NOTIFY_RESEND failed")]
    Notify {
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Reading `/dev/fuse` failed with an error other than the connection's end; the session
    /// no longer reads.
    #[error("reading /dev/fuse failed")]
    Read {
        /// The cause.
        #[source]
        source: Arc<io::Error>,
    },
    /// The session's reader task stopped without the connection ending (it panicked).
    #[error("the session's reader stopped unexpectedly")]
    ReaderStopped,
}

impl Error {
    /// `io::Error` from a rustix error number.
    pub(crate) fn io(errno: rustix::io::Errno) -> io::Error {
        io::Error::from(errno)
    }
}

/// [`Session::adopt`] refused the descriptor. The descriptor comes back as it was given
/// (still open, its flags untouched unless [`error`](Self::error) is
/// [`Error::Register`], which comes after `O_NONBLOCK` was set): closing it could be closing
/// the connection's last copy, which aborts the connection.
#[derive(Debug, thiserror::Error)]
#[error("adopting the FUSE descriptor failed")]
pub struct AdoptError {
    /// Why.
    #[source]
    pub error: Error,
    /// The descriptor, still open.
    pub fd: OwnedFd,
}

/// [`Session::pause`] could not drain the requests in flight before its deadline. The session
/// reads and serves again, and comes back in [`session`](Self::session).
#[derive(Debug, thiserror::Error)]
#[error("pausing the FUSE session failed; it serves again")]
pub struct PauseError {
    /// Why.
    #[source]
    pub error: Error,
    /// The session, serving.
    pub session: Session,
}
