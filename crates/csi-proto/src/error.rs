//! The crate's one error type.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while parsing an endpoint, binding, serving or connecting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The endpoint string is not of the form `unix:///absolute/path`.
    #[error("invalid CSI endpoint {endpoint:?}: {problem}")]
    InvalidEndpoint {
        /// The string as given.
        endpoint: String,
        /// What is wrong with it.
        problem: EndpointProblem,
    },

    /// The socket path does not fit in `sockaddr_un`.
    #[error("socket path {path:?} is {len} bytes long; a Unix socket path may have at most {max}")]
    SocketPathTooLong {
        /// The path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// The longest path the kernel accepts.
        max: usize,
    },

    /// Something other than a socket sits at the socket path; it was left untouched.
    #[error("refusing to replace {path:?}: it is a {kind}, not a socket")]
    NotASocket {
        /// The socket path.
        path: PathBuf,
        /// What is there instead.
        kind: FileKind,
    },

    /// The socket path could not be inspected.
    #[error("cannot inspect socket path {path:?}")]
    Inspect {
        /// The socket path.
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: io::Error,
    },

    /// A stale socket could not be removed.
    #[error("cannot remove stale socket {path:?}")]
    RemoveStale {
        /// The socket path.
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: io::Error,
    },

    /// Binding the listening socket failed.
    #[error("cannot listen on Unix socket {path:?}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: io::Error,
    },

    /// The gRPC server stopped with an error.
    #[error("gRPC server on {path:?} failed")]
    Serve {
        /// The socket path, when the listener still knew it.
        path: Option<PathBuf>,
        /// The underlying failure.
        #[source]
        source: tonic::transport::Error,
    },

    /// Connecting a client to the socket failed.
    #[error("cannot connect to Unix socket {path:?}")]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: tonic::transport::Error,
    },
}

/// Why an endpoint string was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EndpointProblem {
    /// The string has no `scheme://` prefix (a bare path, for example).
    MissingScheme,
    /// The scheme is not `unix` (for example `tcp`).
    UnsupportedScheme(String),
    /// `unix:/path` or `unix:path`: only the `unix:///path` form is accepted.
    MissingSlashes,
    /// Nothing follows `unix://`.
    EmptyPath,
    /// The path is relative, or `unix://host/...` names an authority.
    NotAbsolute,
    /// The path names a directory (`/` or a trailing slash).
    NoFileName,
    /// The string carries a `?query` or `#fragment`.
    QueryOrFragment,
    /// The path contains a NUL byte.
    NulByte,
}

impl fmt::Display for EndpointProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingScheme => f.write_str("expected unix:///absolute/path"),
            Self::UnsupportedScheme(scheme) => {
                write!(
                    f,
                    "scheme {scheme:?} is not supported; only unix:/// endpoints are"
                )
            }
            Self::MissingSlashes => f.write_str("write the endpoint as unix:///absolute/path"),
            Self::EmptyPath => f.write_str("the socket path is empty"),
            Self::NotAbsolute => f.write_str(
                "the socket path must be absolute (unix:///path; unix://name names a host)",
            ),
            Self::NoFileName => f.write_str("the socket path names a directory"),
            Self::QueryOrFragment => f.write_str("a query or fragment is not allowed"),
            Self::NulByte => f.write_str("the socket path contains a NUL byte"),
        }
    }
}

/// The kind of file found at a socket path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileKind {
    /// A regular file.
    RegularFile,
    /// A directory.
    Directory,
    /// A symbolic link (never followed).
    Symlink,
    /// A named pipe.
    Fifo,
    /// A block device.
    BlockDevice,
    /// A character device.
    CharDevice,
    /// A Unix socket.
    Socket,
    /// Anything else.
    Unknown,
}

impl FileKind {
    pub(crate) fn of(file_type: std::fs::FileType) -> Self {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_symlink() {
            Self::Symlink
        } else if file_type.is_file() {
            Self::RegularFile
        } else if file_type.is_dir() {
            Self::Directory
        } else if file_type.is_socket() {
            Self::Socket
        } else if file_type.is_fifo() {
            Self::Fifo
        } else if file_type.is_block_device() {
            Self::BlockDevice
        } else if file_type.is_char_device() {
            Self::CharDevice
        } else {
            Self::Unknown
        }
    }
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::RegularFile => "regular file",
            Self::Directory => "directory",
            Self::Symlink => "symbolic link",
            Self::Fifo => "named pipe",
            Self::BlockDevice => "block device",
            Self::CharDevice => "character device",
            Self::Socket => "socket",
            Self::Unknown => "file of unknown type",
        })
    }
}
