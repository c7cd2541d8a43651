//! Mounting a volume's filesystem, and taking it down without ever unmounting the wrong thing.

use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fuse_session::Session;
use lease_client::protocol::MAX_DATA_BYTES;
use tokio::task::JoinHandle;

use crate::adapter::FuseAdapter;
use crate::fs::Fs;
use crate::service::FileService;

/// The FUSE subtype: mountinfo shows the filesystem type `fuse.tak-os-replicated`.
pub const SUBTYPE: &str = "tak-os-replicated";
/// The filesystem type as mountinfo shows it.
pub const FS_TYPE: &str = "fuse.tak-os-replicated";

/// Why a mount, an unmount, a pause or an adoption did not happen.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The kernel refused the mount, or the new connection did not start (the dead mount it
    /// left was taken down again).
    #[error("mounting volume {volume_id} at {path:?} failed")]
    Mount {
        /// The volume.
        volume_id: String,
        /// The mount point.
        path: PathBuf,
        /// The cause.
        #[source]
        source: fuse_session::Error,
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
    /// The session could not pause (requests still in flight at the deadline) or could not
    /// adopt the connection (not `/dev/fuse`, an unusable INIT record ...).
    #[error("{op} the FUSE session of volume {volume_id} failed")]
    Session {
        /// What was tried.
        op: &'static str,
        /// The volume.
        volume_id: String,
        /// The cause.
        #[source]
        source: fuse_session::Error,
    },
    /// The operating system gave no random bytes for a new connection's nonce
    /// ([`crate::Fs::new`]).
    #[error("drawing the connection nonce failed")]
    Nonce(#[from] lease_client::protocol::RandomUnavailable),
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
/// [`Mounted::unmount`] takes the mount down and stops the tasks. [`Mounted::pause`] stops
/// serving and hands the live connection back for a successor, without unmounting.
/// [`Mounted::stop_tasks`] stops the tasks and leaves the mount served. Dropping it leaves
/// the mount and its tasks running, and the connection served until the kernel ends it: the
/// process that owns the FUSE connection must outlive the mount, and nothing ever unmounts
/// by path without the identity check of [`Mounted::unmount`].
#[derive(Debug)]
pub struct Mounted<S> {
    /// `None` once unmounted or paused.
    session: Option<Session>,
    /// The runtime the session runs on, where a dropped mount goes on being served.
    runtime: tokio::runtime::Handle,
    fs: Arc<Fs<S>>,
    tasks: Vec<JoinHandle<()>>,
    path: PathBuf,
    volume_id: String,
    device: (u32, u32),
}

/// A mount taken out of service without unmounting it ([`Mounted::pause`]): the live
/// connection and what serving it again needs. Nothing reads the connection while this
/// exists; requests wait in the kernel's queue for [`HandOver::resume`] or for a successor's
/// [`adopt`].
///
/// Dropping it closes this process's copy of the descriptor: if it was the last one, the
/// kernel aborts the connection (callers get `ENOTCONN`). Send a copy to a keeper first.
#[derive(Debug)]
pub struct HandOver<S> {
    /// The descriptor and the INIT record.
    pub connection: fuse_session::Paused,
    /// The filesystem that served it, with the nodes and handles the kernel holds.
    pub fs: Arc<Fs<S>>,
    /// The volume.
    pub volume_id: String,
    /// The mount point.
    pub path: PathBuf,
    /// The connection's device (`0:N`).
    pub device: (u32, u32),
}

impl<S: FileService> HandOver<S> {
    /// Serves the connection again in this process, with the same filesystem: [`adopt`] of
    /// what the pause handed back.
    pub fn resume(self) -> Result<Mounted<S>, Box<AdoptFailed>> {
        adopt(
            self.fs,
            &self.volume_id,
            &self.path,
            self.device,
            self.connection,
        )
    }
}

/// A refused [`adopt`]: the error and the connection, handed back untouched (closing it
/// could end the connection).
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct AdoptFailed {
    /// Why.
    #[source]
    pub error: MountError,
    /// The descriptor and record, as given.
    pub connection: fuse_session::Paused,
}

/// A [`Mounted::pause`] that did not complete: the mount serves again.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct PauseFailed<S> {
    /// Why.
    #[source]
    pub error: MountError,
    /// The mount, served again.
    pub mounted: Mounted<S>,
}

/// How the session mounts: fs name = the volume ID, subtype `tak-os-replicated`,
/// `default_permissions`, `allow_other`, `nosuid` and `nodev` (a volume shared across nodes
/// must never become a way to a device node or a set-user-ID program on this node), requests
/// of up to [`MAX_DATA_BYTES`], and `FUSE_ATOMIC_O_TRUNC`: an `open` with `O_TRUNC` arrives
/// as one OPEN, which [`Fs::open`] truncates with the caller's credentials (the set-ID rules
/// of a truncation apply), rather than as a SETATTR followed by an OPEN.
fn mount_options(volume_id: &str) -> fuse_session::MountOptions {
    let mut options = fuse_session::MountOptions::new(volume_id);
    options.subtype = Some(SUBTYPE.to_owned());
    options.default_permissions = true;
    options.allow_other = true;
    options.nosuid = true;
    options.nodev = true;
    options.max_write = u32::try_from(MAX_DATA_BYTES).unwrap_or(fuse_session::DEFAULT_MAX_WRITE);
    options.atomic_o_trunc = true;
    options
}

/// Mounts `fs` at `path` (an existing empty directory) as volume `volume_id` (see
/// [`crate`] for the options), and starts the renewal of the handles it opens
/// ([`Fs::run_handle_renewal`]). Must be called from within a tokio runtime, as root (no
/// helper binary is used).
///
/// If the kernel mounts but the connection does not start (its INIT fails), the dead mount
/// is taken down again before the error is returned.
pub async fn mount<S: FileService>(
    fs: Arc<Fs<S>>,
    volume_id: &str,
    path: &Path,
) -> Result<Mounted<S>, MountError> {
    let failed = |source| MountError::Mount {
        volume_id: volume_id.to_owned(),
        path: path.to_owned(),
        source,
    };
    let options = mount_options(volume_id);
    let session = match Session::mount(path, &options, FuseAdapter::new(Arc::clone(&fs))).await {
        Ok(session) => session,
        Err(error @ fuse_session::Error::Initialize { .. }) => {
            remove_dead_mount(path, volume_id);
            return Err(failed(error));
        }
        Err(error) => return Err(failed(error)),
    };
    let device = match connection_at(path, volume_id) {
        Ok(device) => device,
        Err(error) => {
            // Serve it until the caller, who cannot know its device, tears it down by hand.
            serve_until_gone(&tokio::runtime::Handle::current(), session);
            return Err(error);
        }
    };
    Ok(Mounted::start(fs, session, path, volume_id, device))
}

/// [`mount`] run as a task on `runtime` (a serving thread's: [`crate::ServingThreads`]), so
/// that the session and the tasks the mount starts run there, wherever the caller runs. A
/// runtime that shuts down before the mount is done fails it with [`MountError::Io`].
pub async fn mount_on<S: FileService>(
    runtime: &tokio::runtime::Handle,
    fs: Arc<Fs<S>>,
    volume_id: &str,
    path: &Path,
) -> Result<Mounted<S>, MountError> {
    let (id, at) = (volume_id.to_owned(), path.to_owned());
    match runtime
        .spawn(async move { mount(fs, &id, &at).await })
        .await
    {
        Ok(mounted) => mounted,
        Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
        Err(_) => Err(MountError::Io {
            op: "serving",
            path: path.to_owned(),
            source: io::Error::other("the serving thread's runtime shut down"),
        }),
    }
}

/// Serves a live, initialized connection of volume `volume_id` mounted at `path`, handed
/// over by a paused mount of this or another process, with `fs`: no INIT is exchanged, and
/// the renewal of the handles `fs` holds starts again. `fs` must know the nodes and handles
/// the kernel holds (the previous owner's).
///
/// Checked before anything changes: the mount at `path` is this volume's FUSE mount on the
/// connection's `device`, and the session accepts the descriptor and record. A refusal hands
/// the connection back. Must be called from within a tokio runtime.
pub fn adopt<S: FileService>(
    fs: Arc<Fs<S>>,
    volume_id: &str,
    path: &Path,
    device: (u32, u32),
    connection: fuse_session::Paused,
) -> Result<Mounted<S>, Box<AdoptFailed>> {
    match connection_at(path, volume_id) {
        Ok(found) if found == device => {}
        Ok(found) => {
            let error = MountError::NotOurs {
                volume_id: volume_id.to_owned(),
                path: path.to_owned(),
                found: format!(
                    "connection {}:{}, not {}:{}",
                    found.0, found.1, device.0, device.1
                ),
            };
            return Err(Box::new(AdoptFailed { error, connection }));
        }
        Err(error) => return Err(Box::new(AdoptFailed { error, connection })),
    }
    let fuse_session::Paused { fd, record } = connection;
    let serve = fuse_session::ServeOptions::default();
    let adapter = FuseAdapter::new(Arc::clone(&fs));
    match Session::adopt(fd, record.clone(), adapter, &serve) {
        Ok(session) => Ok(Mounted::start(fs, session, path, volume_id, device)),
        Err(refused) => Err(Box::new(AdoptFailed {
            error: MountError::Session {
                op: "adopting",
                volume_id: volume_id.to_owned(),
                source: refused.error,
            },
            connection: fuse_session::Paused {
                fd: refused.fd,
                record,
            },
        })),
    }
}

/// The device of this volume's FUSE mount at `path`, from the mount table: nothing is asked
/// of the filesystem, which may not be served at this moment.
fn connection_at(path: &Path, volume_id: &str) -> Result<(u32, u32), MountError> {
    with_mount_table(path, |table| match table.by_mount_point(path) {
        Some(m)
            if m.root() == Path::new("/") && m.fs_type() == FS_TYPE && m.source() == volume_id =>
        {
            Ok((m.major(), m.minor()))
        }
        found => Err(MountError::NotOurs {
            volume_id: volume_id.to_owned(),
            path: path.to_owned(),
            found: found.map_or_else(|| "nothing".to_owned(), |m| describe(m)),
        }),
    })?
}

/// `inspect`'s answer about this process's mount table; an error names `path`, the mount
/// point it was read for.
fn with_mount_table<T>(
    path: &Path,
    inspect: impl FnOnce(&mountinfo::MountTable<'_>) -> T,
) -> Result<T, MountError> {
    let io = |op, source| MountError::Io {
        op,
        path: path.to_owned(),
        source,
    };
    let bytes = mountinfo::read_self().map_err(|e| io("read the mount table for", e))?;
    let table = mountinfo::MountTable::parse(&bytes)
        .map_err(|e| io("parse the mount table for", io::Error::other(e.to_string())))?;
    Ok(inspect(&table))
}

fn describe(m: &mountinfo::Mount<'_>) -> String {
    format!(
        "{} {}:{} root {} {}",
        m.fs_type().to_string_lossy(),
        m.major(),
        m.minor(),
        m.root().display(),
        m.source().to_string_lossy()
    )
}

/// Takes down the mount a failed start left at `path`, if it is this volume's FUSE mount
/// (type and source checked in the mount table). Detached: its connection is dead, and
/// nothing may wait on it.
fn remove_dead_mount(path: &Path, volume_id: &str) {
    if connection_at(path, volume_id).is_ok()
        && let Err(error) = unmount_pinned(path, rustix::mount::UnmountFlags::DETACH)
    {
        tracing::warn!(path = %path.display(), volume_id, error = %error_text::chain(&error),
            "the dead mount of a failed start could not be removed");
    }
}

/// Unmounts `path` through its parent held open without following symlinks, so that a parent
/// swapped for a symlink after a check cannot redirect the unmount.
fn unmount_pinned(path: &Path, flags: rustix::mount::UnmountFlags) -> Result<(), MountError> {
    let io = |op, source| MountError::Io {
        op,
        path: path.to_owned(),
        source,
    };
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
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
        .join(parent.as_raw_fd().to_string())
        .join(name);
    rustix::mount::unmount(&pinned, flags | rustix::mount::UnmountFlags::NOFOLLOW)
        .map_err(|e| io("unmount", e.into()))
}

/// Goes on serving `session` on `runtime` until the kernel ends its connection: for a mount
/// whose owner let go of it, which callers may still be using.
fn serve_until_gone(runtime: &tokio::runtime::Handle, session: Session) {
    runtime.spawn(async move {
        let _ = session.wait().await;
        drop(session);
    });
}

impl<S: FileService> Mounted<S> {
    fn start(
        fs: Arc<Fs<S>>,
        session: Session,
        path: &Path,
        volume_id: &str,
        device: (u32, u32),
    ) -> Mounted<S> {
        let renewal = tokio::spawn({
            let fs = Arc::clone(&fs);
            async move { fs.run_handle_renewal().await }
        });
        Mounted {
            session: Some(session),
            runtime: tokio::runtime::Handle::current(),
            fs,
            tasks: vec![renewal],
            path: path.to_owned(),
            volume_id: volume_id.to_owned(),
            device,
        }
    }

    /// Stops serving without unmounting: no request is read from now on (requests the
    /// kernel queues meanwhile wait for whoever serves next), the requests being handled are
    /// answered, the volume's tasks stop, and the live connection comes back in a
    /// [`HandOver`], for [`HandOver::resume`] here or [`adopt`] by a successor (which renews
    /// the handles from then on).
    ///
    /// If requests are still being handled after `deadline`, the mount serves again and
    /// comes back in the error: no caller is left waiting on a mount nobody reads.
    pub async fn pause(mut self, deadline: Duration) -> Result<HandOver<S>, PauseFailed<S>> {
        let Some(session) = self.session.take() else {
            let error = MountError::Session {
                op: "pausing",
                volume_id: self.volume_id.clone(),
                source: fuse_session::Error::ReaderStopped,
            };
            return Err(PauseFailed {
                error,
                mounted: self,
            });
        };
        match session.pause(deadline).await {
            Ok(connection) => {
                self.stop_tasks();
                Ok(HandOver {
                    connection,
                    fs: Arc::clone(&self.fs),
                    volume_id: self.volume_id.clone(),
                    path: self.path.clone(),
                    device: self.device,
                })
            }
            Err(refused) => {
                self.session = Some(refused.session);
                let error = MountError::Session {
                    op: "pausing",
                    volume_id: self.volume_id.clone(),
                    source: refused.error,
                };
                Err(PauseFailed {
                    error,
                    mounted: self,
                })
            }
        }
    }

    /// What the connection negotiated at INIT, while it is served.
    pub fn init_record(&self) -> Option<&fuse_wire::InitRecord> {
        self.session.as_ref().map(Session::record)
    }

    /// The descriptor of the connection, to send a copy to a keeper; `None` once unmounted
    /// or paused. Never read from a copy while this mount is served.
    pub fn descriptor(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.session.as_ref().map(Session::descriptor)
    }

    /// The session's counts of requests read and answered by the session itself; zero once
    /// unmounted or paused.
    pub fn counters(&self) -> fuse_session::Counters {
        self.session
            .as_ref()
            .map(Session::counters)
            .unwrap_or_default()
    }

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
        if self.session.is_none() {
            return Ok(());
        }
        let ours = |m: &&mountinfo::Mount<'_>| (m.major(), m.minor()) == self.device;
        let not_ours = |found| MountError::NotOurs {
            volume_id: self.volume_id.clone(),
            path: self.path.clone(),
            found,
        };
        let found =
            with_mount_table(&self.path, |table| match table.by_mount_point(&self.path) {
                Some(m)
                    if ours(&m)
                        && m.root() == Path::new("/")
                        && m.fs_type() == FS_TYPE
                        && m.source() == self.volume_id.as_str() =>
                {
                    // Every other mount point of the connection: binds of it.
                    let others: Vec<PathBuf> = table
                        .iter()
                        .filter(ours)
                        .map(|m| m.mount_point().to_owned())
                        .filter(|p| *p != self.path)
                        .collect();
                    Ok(Some(others))
                }
                Some(m) => Err(not_ours(describe(m))),
                // Detached by hand (a lazy unmount) and no bind of it left: the mount is gone
                // already.
                None if !table.iter().any(|m| ours(&m)) => Ok(None),
                None => Err(not_ours("nothing".to_owned())),
            })??;
        let Some(others) = found else {
            // The connection ends when the kernel closes it (once nothing holds the detached
            // tree open), and is served until then; there is nothing to unmount.
            self.stop_tasks();
            if let Some(session) = self.session.take() {
                serve_until_gone(&self.runtime, session);
            }
            return Ok(());
        };
        if !others.is_empty() {
            return Err(MountError::StillReferenced {
                volume_id: self.volume_id.clone(),
                path: self.path.clone(),
                others,
            });
        }
        // A file closed a moment ago may still hold the mount while the kernel sends its
        // RELEASE in the background: EBUSY for that short while is retried, within `wait`.
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match unmount_pinned(&self.path, rustix::mount::UnmountFlags::empty()) {
                Ok(()) => break,
                Err(MountError::Io { source, .. })
                    if source.raw_os_error() == Some(libc::EBUSY)
                        && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(e),
            }
        }
        self.stop_tasks();
        // The kernel ends the connection with the unmount; the session sees it gone.
        if let Some(session) = self.session.take() {
            let _ = tokio::time::timeout(wait, session.wait()).await;
        }
        Ok(())
    }
}

impl<S> Drop for Mounted<S> {
    fn drop(&mut self) {
        // A session stops serving when dropped; the mount must go on being served for as
        // long as the kernel keeps the connection.
        if let Some(session) = self.session.take() {
            serve_until_gone(&self.runtime, session);
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
