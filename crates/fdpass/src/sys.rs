//! The system calls rustix's safe API cannot make soundly here.
//!
//! This is the only module of the crate allowed to use `unsafe`:
//! - `getsockopt(SO_PEERCRED)`: rustix's `UCred` keeps the pid in a non-zero type, but Linux
//!   reports pid 0 when the peer is outside the reader's pid namespace (a keeper in one container,
//!   a mount owner in another), and reading 0 into it would be undefined behaviour;
//! - registering a socket with tokio's reactor, which tokio marks `unsafe` because the reactor
//!   trusts the descriptor to stay the same open file for as long as it is registered.
#![allow(unsafe_code)]

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd};

use crate::PeerCredentials;

/// `SO_PEERCRED` of a connected unix socket.
pub(crate) fn peer_credentials(socket: BorrowedFd<'_>) -> io::Result<PeerCredentials> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let expected = size_of::<libc::ucred>();
    let mut len = libc::socklen_t::try_from(expected).map_err(io::Error::other)?;
    // SAFETY: `cred` is a writable `struct ucred` and `len` says exactly how large it is, so the
    // kernel writes nothing beyond it; both outlive the call. Every bit pattern is a valid
    // `ucred` (three integers). `socket` is a live descriptor for the duration of the borrow.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast::<libc::c_void>(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if usize::try_from(len).ok() != Some(expected) {
        return Err(io::Error::other(format!(
            "SO_PEERCRED returned {len} bytes, expected {expected}"
        )));
    }
    Ok(PeerCredentials {
        pid: u32::try_from(cred.pid).ok().filter(|&pid| pid != 0),
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// Registers `socket` with the current tokio reactor for readable and writable readiness.
///
/// # Panics
///
/// Outside a tokio runtime with I/O enabled (tokio's rule for `AsyncFd`).
#[cfg(feature = "tokio")]
pub(crate) fn register<T: crate::Socket>(socket: T) -> io::Result<tokio::io::unix::AsyncFd<T>> {
    // SAFETY: `T: Socket` is a `Channel` or a `Listener`. Each owns its descriptor in a private
    // `OwnedFd` field that is set once at construction and never replaced, so `as_raw_fd`
    // returns the same open descriptor, for the same open file, until the value is dropped or
    // taken back with `AsyncFd::into_inner`.
    unsafe { tokio::io::unix::AsyncFd::register(socket) }.map_err(io::Error::from)
}
