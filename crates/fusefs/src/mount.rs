//! Mounting a volume's filesystem, and taking it down without ever unmounting the wrong thing.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fuse3::MountOptions;
use fuse3::raw::{MountHandle, Session};
use rustix::fs::{AtFlags, StatxFlags};
use tokio::task::JoinHandle;

use crate::adapter::FuseAdapter;
use crate::fs::Fs;
use crate::service::FileService;

/// The FUSE subtype: mountinfo shows the filesystem type `fuse.tak-os-replicated`.
pub const SUBTYPE: &str = "tak-os-replicated";
/// The filesystem type as mountinfo shows it.
pub const FS_TYPE: &str = "fuse.tak-os-replicated";

/// Why a mount or unmount did not happen.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The kernel refused the mount.
    #[error("mounting volume {volume_id} at {path:?} failed")]
    Mount {
        /// The volume.
        volume_id: String,
        /// The mount point.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Other mounts (bind mounts of this one) still use the FUSE connection: unmounting now
    /// would block until they are gone.
    #[error("volume {volume_id} at {path:?} is still mounted at {others:?}; unmount those first")]
    StillReferenced {
        /// The volume.
        volume_id: String,
        /// This mount point.
        path: PathBuf,
        /// The other mount points of the same connection.
        others: Vec<PathBuf>,
    },
    /// What is mounted at the path is not this volume's FUSE mount.
    #[error("{path:?} does not hold volume {volume_id}'s mount (found {found})")]
    NotOurs {
        /// The volume.
        volume_id: String,
        /// The mount point.
        path: PathBuf,
        /// What is there instead.
        found: String,
    },
    /// A system call failed.
    #[error("{op} {path:?} failed")]
    Io {
        /// The operation.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// A mounted volume: the FUSE session, the filesystem serving it, and the tasks the volume
/// needs running beside it (today the renewal of its open handles).
///
/// [`Mounted::unmount`] takes the mount down and stops the tasks. [`Mounted::stop_tasks`] stops
/// the tasks and leaves the mount served, for an owner that hands the volume to another
/// process. Dropping it leaves the mount, its session and its tasks running: the process that
/// owns the FUSE connection must outlive the mount, and fuse3's own unmount on drop (by path,
/// unchecked) is never let happen.
#[derive(Debug)]
pub struct Mounted<S> {
    /// `None` once unmounted.
    handle: Option<MountHandle>,
    fs: Arc<Fs<S>>,
    tasks: Vec<JoinHandle<()>>,
    path: PathBuf,
    volume_id: String,
    device: (u32, u32),
}

/// Mounts `fs` at `path` (an existing empty directory) as volume `volume_id`: fs name = the
/// volume ID, subtype `tak-os-replicated`, `default_permissions`, `allow_other`, `nosuid` and
/// `nodev`, and starts
/// the renewal of the handles it opens ([`Fs::run_handle_renewal`]). Must be called from within
/// a tokio runtime, as root (no helper binary is used).
pub async fn mount<S: FileService>(
    fs: Arc<Fs<S>>,
    volume_id: &str,
    path: &Path,
) -> Result<Mounted<S>, MountError> {
    let mut options = MountOptions::default();
    options
        .fs_name(volume_id)
        .allow_other(true)
        .default_permissions(true)
        .custom_options(format!("subtype={SUBTYPE}"));
    let handle = Session::new(options)
        .mount(FuseAdapter::new(Arc::clone(&fs)), path)
        .await
        .map_err(|source| MountError::Mount {
            volume_id: volume_id.to_owned(),
            path: path.to_owned(),
            source,
        })?;
    // Until it is known, fuse3's handle owns the mount: an error here drops it, and it
    // unmounts what it has just mounted.
    restrict(path)?;
    let device = mount_device(path)?;
    let renewal = tokio::spawn({
        let fs = Arc::clone(&fs);
        async move { fs.run_handle_renewal().await }
    });
    Ok(Mounted {
        handle: Some(handle),
        fs,
        tasks: vec![renewal],
        path: path.to_owned(),
        volume_id: volume_id.to_owned(),
        device,
    })
}

/// Makes the new mount `nosuid` and `nodev` (fuse3 cannot pass those flags to the mount
/// itself): a volume shared across nodes must never become a way to a device node or a
/// set-user-ID program on this node. A bind remount changes only the mount's own flags, and
/// runs before the mount is used (binds of it, made later, inherit the flags).
fn restrict(path: &Path) -> Result<(), MountError> {
    use rustix::mount::MountFlags;
    rustix::mount::mount_remount(
        path,
        MountFlags::BIND | MountFlags::NOSUID | MountFlags::NODEV,
        c"",
    )
    .map_err(|e| MountError::Io {
        op: "make nosuid and nodev",
        path: path.to_owned(),
        source: e.into(),
    })
}

/// The device of the mount at `path`, learned without sending the filesystem a request
/// (`AT_STATX_DONT_SYNC` on the mount root answers from the kernel's cache).
fn mount_device(path: &Path) -> Result<(u32, u32), MountError> {
    let stx = rustix::fs::statx(
        rustix::fs::CWD,
        path,
        AtFlags::SYMLINK_NOFOLLOW | AtFlags::STATX_DONT_SYNC,
        StatxFlags::BASIC_STATS,
    )
    .map_err(|e| MountError::Io {
        op: "statx",
        path: path.to_owned(),
        source: e.into(),
    })?;
    Ok((stx.stx_dev_major, stx.stx_dev_minor))
}

impl<S: FileService> Mounted<S> {
    /// The filesystem serving the mount; its state (nodes and open handles) is
    /// [`Fs::state`].
    pub fn fs(&self) -> &Arc<Fs<S>> {
        &self.fs
    }

    /// Whether the volume's tasks still run (they stop on unmount or [`Mounted::stop_tasks`]).
    pub fn tasks_running(&self) -> bool {
        self.tasks.iter().any(|task| !task.is_finished())
    }

    /// Stops the volume's tasks and leaves the mount served: no handle is renewed from now on.
    /// For an owner handing the connection to its successor, which renews from then on.
    pub fn stop_tasks(&mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The volume.
    pub fn volume_id(&self) -> &str {
        &self.volume_id
    }

    /// The FUSE connection's device (`0:N`); `N` names its fusectl directory.
    pub fn device(&self) -> (u32, u32) {
        self.device
    }

    /// Unmounts after checking that the mount at the path is this volume's FUSE mount (device,
    /// root `/`, type, source) and that no other mount (a bind of it) still uses the
    /// connection, then stops the volume's tasks and waits for the session to end, at most
    /// `wait`. A refused unmount changes nothing: the mount and its tasks go on, and the call
    /// may be repeated. A mount detached by hand of which no mount is left anywhere counts as
    /// unmounted: the tasks stop, and nothing at the path is touched.
    pub async fn unmount(&mut self, wait: Duration) -> Result<(), MountError> {
        if self.handle.is_none() {
            return Ok(());
        }
        let path = self.path.clone();
        let io = |op, source| MountError::Io {
            op,
            path: path.clone(),
            source,
        };
        let bytes = mountinfo::read_self().map_err(|e| io("read the mount table for", e))?;
        let table = mountinfo::MountTable::parse(&bytes)
            .map_err(|e| io("parse the mount table for", io::Error::other(e.to_string())))?;
        let ours = |m: &&mountinfo::Mount<'_>| (m.major(), m.minor()) == self.device;
        match table.by_mount_point(&self.path) {
            Some(m)
                if ours(&m)
                    && m.root() == Path::new("/")
                    && m.fs_type() == FS_TYPE
                    && m.source() == self.volume_id.as_str() => {}
            Some(m) => {
                return Err(MountError::NotOurs {
                    volume_id: self.volume_id.clone(),
                    path: self.path.clone(),
                    found: format!(
                        "{} {}:{} root {} {}",
                        m.fs_type().to_string_lossy(),
                        m.major(),
                        m.minor(),
                        m.root().display(),
                        m.source().to_string_lossy()
                    ),
                });
            }
            // Detached by hand (a lazy unmount) and no bind of it left: the mount is gone
            // already. The session ends when the kernel closes the connection (once nothing
            // holds the detached tree open); there is nothing to unmount.
            None if !table.iter().any(|m| ours(&m)) => {
                self.stop_tasks();
                if let Some(handle) = self.handle.take() {
                    // Never its unmount by path: the path may hold something else now.
                    std::mem::forget(handle);
                }
                return Ok(());
            }
            None => {
                return Err(MountError::NotOurs {
                    volume_id: self.volume_id.clone(),
                    path: self.path.clone(),
                    found: "nothing".to_owned(),
                });
            }
        }
        let others: Vec<PathBuf> = table
            .iter()
            .filter(ours)
            .map(|m| m.mount_point().to_owned())
            .filter(|p| *p != self.path)
            .collect();
        if !others.is_empty() {
            return Err(MountError::StillReferenced {
                volume_id: self.volume_id.clone(),
                path: self.path.clone(),
                others,
            });
        }
        // Unmount through the parent held open without following symlinks, so that a parent
        // swapped for a symlink after the check cannot redirect the unmount.
        let (Some(parent), Some(name)) = (self.path.parent(), self.path.file_name()) else {
            return Err(io("unmount", io::Error::from_raw_os_error(libc::EINVAL)));
        };
        let parent = rustix::fs::openat2(
            rustix::fs::CWD,
            parent,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
            rustix::fs::ResolveFlags::NO_SYMLINKS,
        )
        .map_err(|e| io("open the parent of", e.into()))?;
        let pinned = Path::new("/proc/self/fd")
            .join(std::os::fd::AsRawFd::as_raw_fd(&parent).to_string())
            .join(name);
        // A file closed a moment ago may still hold the mount while the kernel sends its
        // RELEASE in the background: EBUSY for that short while is retried, within `wait`.
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match rustix::mount::unmount(&pinned, rustix::mount::UnmountFlags::NOFOLLOW) {
                Ok(()) => break,
                Err(rustix::io::Errno::BUSY) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(io("unmount", e.into())),
            }
        }
        self.stop_tasks();
        // The session ends when the kernel closes the connection; the handle's own unmount is
        // then a no-op because its task has finished.
        if let Some(handle) = self.handle.take() {
            let _ = tokio::time::timeout(wait, handle).await;
        }
        Ok(())
    }
}

impl<S> Drop for Mounted<S> {
    fn drop(&mut self) {
        // fuse3's handle would unmount by path, unchecked, when dropped: never let it. The
        // session task goes on serving the mount.
        if let Some(handle) = self.handle.take() {
            std::mem::forget(handle);
        }
    }
}

/// Where fusectl is mounted on a usual system.
pub const FUSECTL: &str = "/sys/fs/fuse/connections";

/// Aborts a FUSE connection through fusectl (`/sys/fs/fuse/connections/<minor>/abort`). Only for
/// a connection already known to be dead: every pending and future request fails.
///
/// fusectl must be mounted there (`mount -t fusectl fusectl /sys/fs/fuse/connections`); this
/// function never mounts anything itself, and says so when it is missing.
pub fn abort_connection(minor: u32) -> io::Result<()> {
    let abort = format!("{FUSECTL}/{minor}/abort");
    std::fs::write(&abort, b"1").map_err(|e| match e.kind() {
        io::ErrorKind::NotFound if !Path::new(FUSECTL).join(minor.to_string()).exists() => {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "no fusectl entry for connection {minor}: is fusectl mounted at {FUSECTL}? \
                 (mount -t fusectl fusectl {FUSECTL})"
                ),
            )
        }
        _ => e,
    })
}
