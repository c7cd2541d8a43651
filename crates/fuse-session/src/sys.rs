//! The one call that needs `unsafe`: registering the FUSE descriptor with tokio's reactor,
//! which tokio marks `unsafe` because the reactor trusts the descriptor to stay the same open
//! file for as long as it is registered. Everything else (mount(2), `fcntl`, `fstat`, `read`,
//! `write`) goes through rustix's safe API.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::OwnedFd;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Registers `fd` with the current runtime's reactor for readable readiness (errors are
/// always reported). On failure the descriptor comes back, still open.
///
/// # Panics
///
/// Outside a tokio runtime, or in one without I/O enabled (tokio's rule).
pub(crate) fn register(fd: OwnedFd) -> Result<AsyncFd<OwnedFd>, (io::Error, OwnedFd)> {
    // SAFETY: `fd` is an `OwnedFd`, so it is a valid open descriptor that nothing else
    // closes. The `AsyncFd` takes ownership of it and this crate never replaces it:
    // `OwnedFd::as_raw_fd` returns the same number, for the same open file, until the
    // `AsyncFd` is dropped (which deregisters first) or taken apart with `into_inner`.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
        .map_err(|e| e.into_parts())
        .map_err(|(fd, cause)| (cause, fd))
}
