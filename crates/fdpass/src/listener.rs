//! A listening socket at a path that only its owner can connect to.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode};
use rustix::net::{SocketAddrUnix, SocketFlags};

use crate::channel::retry_interrupted;
use crate::{Channel, Error};

/// How many connections may wait for `accept`.
const BACKLOG: i32 = 64;

/// The only mode a listener's socket file has: read and write for its owner.
const SOCKET_MODE: u32 = 0o600;

/// A unix seqpacket socket bound to a path with mode 0600, accepting [`Channel`]s.
///
/// The socket file is never wider than 0600, not even for an instant, whatever the umask:
/// Linux creates the file of a bound unix socket with the mode of the socket's own inode less
/// the umask, so `bind` first sets that inode to 0600 (`fchmod` on the unbound socket). A umask
/// that narrows the file further (0400, say, which would lock out the owner too) is widened back
/// to exactly 0600 after `bind`; a file that is somehow wider, or not a socket, or not owned by
/// this process's effective user, is removed and reported as [`Error::UnsafeSocketFile`].
///
/// Connecting needs write permission on the file, so only its owner (and root, which bypasses
/// file permissions) can connect. A keeper that must accept only root checks
/// [`Channel::peer_credentials`] as well. Put the socket in a directory that others cannot
/// write to, so nobody can replace the file between these steps.
///
/// The socket file is not removed when the listener is dropped: a successor may already have
/// bound its own socket at the path. A stale file makes the next `bind` fail with
/// `AddrInUse`; remove it first when no listener can still be using it.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
    path: PathBuf,
}

impl Listener {
    /// Binds a new socket file at `path` and listens on it.
    pub fn bind(path: impl AsRef<Path>) -> Result<Listener, Error> {
        let path = path.as_ref();
        let fail = |source: io::Error| Error::Bind {
            path: path.to_owned(),
            source,
        };
        let addr = SocketAddrUnix::new(path).map_err(|e| fail(e.into()))?;
        let fd = crate::channel::seqpacket_socket().map_err(fail)?;
        // The socket inode's mode, less the umask, becomes the file's mode at `bind`.
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(SOCKET_MODE)).map_err(|e| fail(e.into()))?;
        rustix::net::bind(&fd, &addr).map_err(|e| fail(e.into()))?;
        // From here on the file exists and must not outlive a failure.
        let ready = secure_socket_file(path)
            .and_then(|()| rustix::net::listen(&fd, BACKLOG).map_err(|e| fail(e.into())));
        if let Err(e) = ready {
            // Best effort: the error being returned says more than a failed unlink would.
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        Ok(Listener {
            fd,
            path: path.to_owned(),
        })
    }

    /// Waits for a connection and returns it as a close-on-exec [`Channel`].
    pub fn accept(&self) -> Result<Channel, Error> {
        let fd = retry_interrupted(|| {
            rustix::net::accept_with(&self.fd, SocketFlags::CLOEXEC).map_err(io::Error::from)
        })
        .map_err(|source| Error::Accept { source })?;
        Ok(Channel::from_connected(fd))
    }

    /// The path the socket is bound to.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Listener {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Checks the file `bind` just made and widens a umask-narrowed mode back to 0600.
fn secure_socket_file(path: &Path) -> Result<(), Error> {
    let unsafe_file = |problem: String| Error::UnsafeSocketFile {
        path: path.to_owned(),
        problem,
    };
    let stat = rustix::fs::lstat(path).map_err(|e| Error::Bind {
        path: path.to_owned(),
        source: e.into(),
    })?;
    let file_type = FileType::from_raw_mode(stat.st_mode);
    if file_type != FileType::Socket {
        return Err(unsafe_file(format!("it is a {file_type:?}, not a socket")));
    }
    let owner = rustix::process::geteuid().as_raw();
    if stat.st_uid != owner {
        return Err(unsafe_file(format!(
            "it is owned by uid {}, not {owner}",
            stat.st_uid
        )));
    }
    let mode = stat.st_mode & 0o7777;
    if mode & !SOCKET_MODE != 0 {
        return Err(unsafe_file(format!(
            "mode {mode:04o} is wider than {SOCKET_MODE:04o}"
        )));
    }
    if mode != SOCKET_MODE {
        rustix::fs::chmod(path, Mode::from_raw_mode(SOCKET_MODE)).map_err(|e| Error::Bind {
            path: path.to_owned(),
            source: e.into(),
        })?;
    }
    Ok(())
}
