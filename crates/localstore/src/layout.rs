//! Opening the store's root and metadata directory safely (DESIGN.md 3.2).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, FlockOperation, Mode, OFlags, Stat};
use rustix::io::Errno;
use rustix::process::Pid;

use crate::Error;

/// Name of the metadata directory inside the store root.
pub const METADATA_DIR: &str = ".metadata";
/// Name of the lock file inside the metadata directory.
pub const LOCK_FILE: &str = "driver.lock";
/// Mode of a freshly created metadata directory.
pub(crate) const METADATA_MODE: u32 = 0o750;

/// Checks that `path` is absolute and free of `.` and `..`, and returns it with redundant
/// separators removed, as the kernel renders it in mountinfo.
pub(crate) fn normalize(path: &Path) -> Result<PathBuf, Error> {
    if !path.is_absolute() {
        return Err(Error::unsafe_store(path, "is not an absolute path"));
    }
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::RootDir => {}
            Component::Normal(name) => out.push(name),
            Component::CurDir | Component::ParentDir | Component::Prefix(_) => {
                return Err(Error::unsafe_store(
                    path,
                    "must not contain \".\" or \"..\"",
                ));
            }
        }
    }
    Ok(out)
}

fn open_path(
    dir: BorrowedFd<'_>,
    name: &std::ffi::OsStr,
    path: &Path,
) -> Result<(OwnedFd, Stat), Error> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::NOENT => Error::unsafe_store(path, "does not exist"),
        e => Error::io("open", path, e.into()),
    })?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| Error::io("stat", path, e.into()))?;
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::Directory => Ok((fd, stat)),
        FileType::Symlink => Err(Error::unsafe_store(path, "is a symlink")),
        _ => Err(Error::unsafe_store(path, "is not a directory")),
    }
}

fn reopen_readable(fd: &OwnedFd, path: &Path) -> Result<OwnedFd, Error> {
    rustix::fs::openat(
        fd,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io("open directory", path, e.into()))
}

fn check_not_shared_writable(stat: &Stat, path: &Path) -> Result<(), Error> {
    let mode = stat.st_mode & 0o7777;
    if mode & 0o022 != 0 {
        return Err(Error::unsafe_store(
            path,
            format!("is writable by group or others (mode {mode:04o})"),
        ));
    }
    Ok(())
}

/// Opens the store root: every component is opened without following symlinks, and the root
/// must be a directory owned by root (or by the driver user, the effective uid: a driver that
/// does not run as root, in tests or experiments) and not writable by group or others.
pub(crate) fn open_root(path: &Path) -> Result<OwnedFd, Error> {
    let mut fd = rustix::fs::openat(
        rustix::fs::CWD,
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io("open", "/", e.into()))?;
    let mut walked = PathBuf::from("/");
    let mut stat = rustix::fs::fstat(&fd).map_err(|e| Error::io("stat", "/", e.into()))?;
    for component in path.components() {
        let Component::Normal(name) = component else {
            continue;
        };
        walked.push(name);
        (fd, stat) = open_path(fd.as_fd(), name, &walked)?;
    }
    let euid = rustix::process::geteuid().as_raw();
    if stat.st_uid != 0 && stat.st_uid != euid {
        return Err(Error::unsafe_store(
            path,
            format!(
                "is owned by uid {}, neither root nor the driver user (uid {euid})",
                stat.st_uid
            ),
        ));
    }
    check_not_shared_writable(&stat, path)?;
    reopen_readable(&fd, path)
}

/// Opens (and with `create`, makes) the metadata directory: a real directory owned by the
/// driver user (the effective uid) and not writable by group or others.
pub(crate) fn open_metadata(
    root: BorrowedFd<'_>,
    root_path: &Path,
    create: bool,
) -> Result<OwnedFd, Error> {
    let path = root_path.join(METADATA_DIR);
    let created = create
        && match rustix::fs::mkdirat(root, METADATA_DIR, Mode::from_raw_mode(METADATA_MODE)) {
            Ok(()) => true,
            Err(Errno::EXIST) => false,
            Err(e) => return Err(Error::io("create directory", &path, e.into())),
        };
    let (fd, stat) = open_path(root, METADATA_DIR.as_ref(), &path)?;
    if created {
        // The umask may have narrowed the mode; it can only have removed bits, so a crash
        // before this line leaves a directory that still passes the checks below.
        rustix::fs::fchmod(
            reopen_readable(&fd, &path)?,
            Mode::from_raw_mode(METADATA_MODE),
        )
        .map_err(|e| Error::io("chmod", &path, e.into()))?;
        crate::fsio::fsync_dir(root, root_path)?;
    }
    let euid = rustix::process::geteuid().as_raw();
    if stat.st_uid != euid {
        return Err(Error::unsafe_store(
            &path,
            format!(
                "is owned by uid {}, not the driver user (uid {euid})",
                stat.st_uid
            ),
        ));
    }
    check_not_shared_writable(&stat, &path)?;
    reopen_readable(&fd, &path)
}

/// The store's exclusive `flock` on `.metadata/driver.lock`, released on drop.
///
/// An `flock` belongs to the open file description, not to the descriptor, and every process
/// forked while the lock is held shares that description until it execs (the descriptor is
/// `O_CLOEXEC`) or exits. Closing our descriptor alone would leave the store locked for as long
/// as such a child lingers between fork and exec, so a store reopened right after a drop, while
/// another thread spawns a process (a mount helper in a driver, any test under `cargo test`),
/// would spuriously fail with [`Error::StoreInUse`]. Drop therefore unlocks explicitly:
/// `LOCK_UN` releases the lock on the shared description, whoever else still holds a copy.
///
/// Retrying the lock on open would instead slow down the refusal of a real second driver and
/// still fail against a child that never execs. POSIX record locks (`F_SETLK`) are not inherited
/// across fork, but they do not exclude a second opener in the same process and are dropped when
/// the process closes any descriptor of the file; OFD locks are shared across fork like `flock`.
#[derive(Debug)]
pub(crate) struct StoreLock {
    fd: OwnedFd,
    /// The process that took the lock. A forked child that drops its copy of a store without
    /// exec-ing must not unlock the description it shares with the driver it was forked from.
    owner: Pid,
}

impl Drop for StoreLock {
    fn drop(&mut self) {
        if rustix::process::getpid() == self.owner {
            // On failure (it cannot fail for a valid descriptor) the close that follows still
            // releases the lock once no forked child shares the description.
            let _ = rustix::fs::flock(&self.fd, FlockOperation::Unlock);
        }
    }
}

/// Takes the store's exclusive lock without blocking.
pub(crate) fn lock(metadata: BorrowedFd<'_>, metadata_path: &Path) -> Result<StoreLock, Error> {
    let path = metadata_path.join(LOCK_FILE);
    let fd = rustix::fs::openat(
        metadata,
        LOCK_FILE,
        OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| match e {
        Errno::LOOP => Error::unsafe_store(&path, "is a symlink"),
        e => Error::io("open lock file", &path, e.into()),
    })?;
    match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(StoreLock {
            fd,
            owner: rustix::process::getpid(),
        }),
        Err(Errno::WOULDBLOCK) => Err(Error::StoreInUse { path }),
        Err(e) => Err(Error::io("lock", &path, e.into())),
    }
}

/// Why a mount table says the store is not the root of its own filesystem, if it does.
///
/// The mount containing `store` must be mounted exactly at `store` and show the root (`/`) of
/// its filesystem: a bind mount of a subdirectory (which is what a hostPath on the root disk
/// looks like inside a pod) has some other root.
pub(crate) fn own_mount_problem(table: &mountinfo::MountTable<'_>, store: &Path) -> Option<String> {
    let Some(mount) = table.containing(store) else {
        return Some("no mount in the mount table contains it".to_owned());
    };
    if mount.mount_point() != store {
        return Some(format!(
            "is not a mount point; it lies inside the mount at {:?}",
            mount.mount_point()
        ));
    }
    if mount.root() != Path::new("/") {
        return Some(format!(
            "is mounted from {:?} of its filesystem, not from its root",
            mount.root()
        ));
    }
    None
}

/// Checks the process's own mount table (see [`own_mount_problem`]), and that the entry found
/// is the mount the store root was opened on (`root_mount_id`, from `statx`), so a mount stacked
/// on the path after the open cannot vouch for it.
pub(crate) fn require_own_mount(store: &Path, root_mount_id: u64) -> Result<(), Error> {
    let bytes = mountinfo::read_self().map_err(|e| Error::io("read", "/proc/self/mountinfo", e))?;
    let table = mountinfo::MountTable::parse(&bytes).map_err(|source| Error::MountTable {
        path: store.to_owned(),
        source,
    })?;
    let problem = own_mount_problem(&table, store).or_else(|| {
        let listed = table.containing(store).map(mountinfo::Mount::mount_id)?;
        (listed != root_mount_id).then(|| {
            format!("the mount table lists mount {listed} there, but it was opened on mount {root_mount_id}")
        })
    });
    match problem {
        None => Ok(()),
        Some(problem) => Err(Error::unsafe_store(
            store,
            format!("is not the root of its own filesystem: {problem}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_rejects_relative_and_dot_paths() {
        assert!(normalize(Path::new("var/lib")).is_err());
        assert!(normalize(Path::new("/var/../lib")).is_err());
        assert_eq!(
            normalize(Path::new("//var//lib/")).unwrap(),
            Path::new("/var/lib")
        );
        assert_eq!(
            normalize(Path::new("/var/./lib")).unwrap(),
            Path::new("/var/lib")
        );
    }
}
