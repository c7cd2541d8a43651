//! Entering a private mount namespace: the one module allowed `unsafe`.
//!
//! Everything the demo mounts (the store's tmpfs, the driver's bind mounts) must stay out of the
//! host's mount table, and the driver, a separate process, must see the same mounts as the demo.
//! So the demo's main thread moves into a new mount namespace whose mounts are all private before
//! any other thread exists; the driver, spawned afterwards, inherits it.

use rustix::mount::{MountPropagationFlags, mount_change};
use rustix::thread::UnshareFlags;

/// Why the private mount namespace could not be entered.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    /// The demo mounts and unshares, which needs root.
    #[error("the demo must run as root (it mounts a tmpfs and the driver bind-mounts volumes)")]
    NotRoot,
    /// Threads already exist; they would stay in the host's namespace.
    #[error(
        "{threads} threads are running; the namespace must be entered before any other thread starts"
    )]
    Threads {
        /// How many threads the process has.
        threads: usize,
    },
    /// The kernel refused `unshare(CLONE_NEWNS)`.
    #[error("unshare(CLONE_NEWNS) failed")]
    Unshare(#[source] rustix::io::Errno),
    /// The kernel refused to make `/` recursively private.
    #[error("making / recursively private failed")]
    Private(#[source] rustix::io::Errno),
}

/// Moves the calling thread, which must be the process's only thread, into a new mount
/// namespace in which every mount is private. Processes spawned afterwards inherit it.
pub fn enter_private_mount_namespace() -> Result<(), NamespaceError> {
    if !rustix::process::geteuid().is_root() {
        return Err(NamespaceError::NotRoot);
    }
    let threads = thread_count();
    if threads > 1 {
        return Err(NamespaceError::Threads { threads });
    }
    unshare_mount_namespace().map_err(NamespaceError::Unshare)?;
    mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .map_err(NamespaceError::Private)?;
    Ok(())
}

/// The number of threads of this process, from `/proc/self/status`; 1 when it cannot be read.
fn thread_count() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(1)
}

#[allow(unsafe_code)]
fn unshare_mount_namespace() -> rustix::io::Result<()> {
    // SAFETY: only NEWNS (which implies FS) is unshared, never the file descriptor table, so no
    // thread can observe a descriptor from another table; and the process is single-threaded.
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNS) }
}
