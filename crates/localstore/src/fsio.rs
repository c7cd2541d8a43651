//! File-system primitives, all relative to directory descriptors so that a path component swapped
//! for a symlink after the store opened is never followed.

use std::ffi::{CStr, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{
    AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, Statx, StatxAttributes, StatxFlags,
};
use rustix::io::Errno;

use crate::crash::{CrashPoint, Hook};
use crate::{Error, VolumeId};

/// Opens a directory below `dir` without following a symlink in its last component.
pub(crate) fn open_dir(dir: BorrowedFd<'_>, name: &str) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

pub(crate) fn fsync_dir(dir: BorrowedFd<'_>, path: &Path) -> Result<(), Error> {
    rustix::fs::fsync(dir).map_err(|e| Error::io("fsync directory", path, e.into()))
}

/// The three crash points of one durable write.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WritePoints {
    pub(crate) temp_written: CrashPoint,
    pub(crate) renamed: CrashPoint,
    pub(crate) durable: CrashPoint,
}

/// The mode of every record file.
const RECORD_MODE: u32 = 0o640;

/// The one helper every record write goes through, over the `durable` crate: write a temp file
/// in the same directory (`.<name>.tmp`, exclusive, never through a symlink), fsync it, rename
/// it over `name`, fsync the directory. A crash at any point leaves either the old or the new
/// record (plus, at worst, a stray temp file that the next write removes); `points` name the
/// steps for the crash hook.
pub(crate) fn write_durable(
    dir: BorrowedFd<'_>,
    dir_path: &Path,
    name: &str,
    bytes: &[u8],
    points: WritePoints,
    hook: &Hook,
) -> Result<(), Error> {
    let options = durable::Options {
        mode: RECORD_MODE,
        replace: durable::Replace::Yes,
    };
    durable::write_observed(dir, name, bytes, options, &mut |step| {
        hook.reach(match step {
            durable::Step::TempWritten => points.temp_written,
            durable::Step::Renamed => points.renamed,
            durable::Step::Durable => points.durable,
        });
    })
    .map_err(|e| Error::io(e.action(), dir_path.join(e.name()), e.into_io_error()))?;
    Ok(())
}

/// Reads a small regular file below `dir`. `Ok(None)` when it does not exist. A symlink, a FIFO,
/// a directory or an oversized file is a corrupt record, never followed or waited on.
pub(crate) fn read_record_file(
    dir: BorrowedFd<'_>,
    path: &Path,
    name: &str,
) -> Result<Option<Vec<u8>>, Error> {
    durable::read(dir, name, crate::record::MAX_RECORD_BYTES).map_err(|e| match e {
        durable::ReadError::Symlink { .. } => Error::corrupt(path, "is a symlink"),
        durable::ReadError::NotRegularFile { .. } => Error::corrupt(path, "is not a regular file"),
        durable::ReadError::TooLarge { .. } => Error::corrupt(path, "is too large"),
        durable::ReadError::Failed(e) => Error::io(e.action(), path, e.into_io_error()),
        durable::ReadError::Swapped { .. } => Error::io(
            "open",
            path,
            io::Error::other("the record was replaced while it was opened"),
        ),
        other => Error::io("open", path, io::Error::other(other)),
    })
}

/// Removes a file below `dir`; `Ok(false)` when it was already gone.
pub(crate) fn unlink(dir: BorrowedFd<'_>, path: &Path, name: &str) -> Result<bool, Error> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) => Ok(true),
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(Error::io("remove", path, e.into())),
    }
}

/// What sits at a name below a directory, without following a symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    Missing,
    Directory,
    Other,
}

pub(crate) fn entry(dir: BorrowedFd<'_>, path: &Path, name: &str) -> Result<Entry, Error> {
    match stat_child(dir, OsStr::new(name), StatxFlags::TYPE) {
        Ok(stx) if file_type(&stx) == FileType::Directory => Ok(Entry::Directory),
        Ok(_) => Ok(Entry::Other),
        Err(Errno::NOENT) => Ok(Entry::Missing),
        Err(e) => Err(Error::io("statx", path, e.into())),
    }
}

/// `statx` of a name below `dir` that never asks a mounted filesystem anything (DESIGN.md 5):
/// no symlink followed, no automount triggered, and `AT_STATX_DONT_SYNC`, so a FUSE mount root
/// is answered from the kernel's cache instead of a request to a daemon that may be dead.
fn stat_child(dir: BorrowedFd<'_>, name: &OsStr, mask: StatxFlags) -> rustix::io::Result<Statx> {
    rustix::fs::statx(
        dir,
        name,
        AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT | AtFlags::STATX_DONT_SYNC,
        mask,
    )
}

fn file_type(stx: &Statx) -> FileType {
    FileType::from_raw_mode(stx.stx_mode.into())
}

/// Whether the object `stx` describes lies on another mount than `mount`: it is a mount root
/// (`STATX_ATTR_MOUNT_ROOT`, Linux 5.8+) or its mount ID differs. An error when the kernel
/// reports neither.
fn on_other_mount(stx: &Statx, mount: u64) -> io::Result<bool> {
    let knows_root = stx
        .stx_attributes_mask
        .contains(StatxAttributes::MOUNT_ROOT);
    let knows_id = stx.stx_mask & StatxFlags::MNT_ID.bits() != 0;
    if !knows_root && !knows_id {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "statx returned neither a mount id nor the mount-root attribute",
        ));
    }
    Ok(
        (knows_root && stx.stx_attributes.contains(StatxAttributes::MOUNT_ROOT))
            || (knows_id && stx.stx_mnt_id != mount),
    )
}

/// Opens a directory below `dir` with `openat2`, refusing to resolve through any symlink or
/// mount point (`RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV`). `beneath` adds `RESOLVE_BENEATH`,
/// which a walk back up through `..` cannot use.
fn open_dir_no_xdev(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    beneath: bool,
) -> rustix::io::Result<OwnedFd> {
    let mut resolve = ResolveFlags::NO_XDEV | ResolveFlags::NO_SYMLINKS;
    if beneath {
        resolve |= ResolveFlags::BENEATH;
    }
    rustix::fs::openat2(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        resolve,
    )
}

/// The names in a directory, except `.` and `..`. Names that are not UTF-8 are returned lossily
/// converted; callers only act on names they recognise, which are all ASCII.
pub(crate) fn list_dir(dir: BorrowedFd<'_>, path: &Path) -> Result<Vec<(String, FileType)>, Error> {
    let mut reader =
        Dir::read_from(dir).map_err(|e| Error::io("open directory", path, e.into()))?;
    let mut names = Vec::new();
    while let Some(entry) = reader.read() {
        let entry = entry.map_err(|e| Error::io("read directory", path, e.into()))?;
        let name = entry.file_name();
        if is_dot(name) {
            continue;
        }
        names.push((
            OsStr::from_bytes(name.to_bytes())
                .to_string_lossy()
                .into_owned(),
            entry.file_type(),
        ));
    }
    Ok(names)
}

fn is_dot(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

/// The mount ID of an open file, from `statx` on the descriptor itself.
pub(crate) fn mount_id(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let stx = rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID)?;
    if stx.stx_mask & StatxFlags::MNT_ID.bits() == 0 {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "statx returned no mount id",
        ));
    }
    Ok(stx.stx_mnt_id)
}

/// Removes the directory `name` below `parent` and everything in it, without following a symlink
/// and without entering another mount. A mount inside the tree stops the removal with an error,
/// leaving the rest in place.
///
/// Each directory is judged before it is opened, from its parent's side: `statx` with
/// `AT_STATX_DONT_SYNC` (which sends no request to a FUSE daemon) must show a directory that is
/// not a mount root and whose mount ID is `mount`. Only then is it opened, with `openat2` and
/// `RESOLVE_NO_XDEV`, so a mount that appears in between still cannot be crossed: opening a
/// directory on a mounted filesystem (a FUSE `OPENDIR`) could block on a hung daemon and would
/// act on data that is not the volume's. Symlinks are unlinked, never followed.
///
/// The walk holds one directory descriptor at a time and returns to a parent through `..`,
/// checking that the parent is still the same inode, so depth costs memory for names but not
/// file descriptors.
pub(crate) fn remove_tree(
    parent: BorrowedFd<'_>,
    root_path: &Path,
    name: &str,
    mount: u64,
    volume_id: VolumeId,
    hook: &Hook,
    partly_removed: CrashPoint,
) -> Result<(), Error> {
    let top_path = root_path.join(name);
    let unexpected = |path: PathBuf, problem| Error::UnexpectedData {
        volume_id,
        path,
        problem,
    };
    let crosses =
        |path: &Path| unexpected(path.to_owned(), "is a mount point; refusing to cross it");
    // Decides about a child without entering it, then opens it without crossing a mount.
    let enter = |dir: BorrowedFd<'_>, name: &OsStr, path: &Path| -> Result<OwnedFd, Error> {
        let stx = stat_child(dir, name, StatxFlags::TYPE | StatxFlags::MNT_ID)
            .map_err(|e| Error::io("statx", path, e.into()))?;
        if file_type(&stx) != FileType::Directory {
            return Err(unexpected(path.to_owned(), "is not a directory"));
        }
        if on_other_mount(&stx, mount).map_err(|e| Error::io("statx", path, e))? {
            return Err(crosses(path));
        }
        match open_dir_no_xdev(dir, name, true) {
            Ok(fd) => Ok(fd),
            Err(Errno::XDEV) => Err(crosses(path)),
            Err(Errno::LOOP | Errno::NOTDIR) => {
                Err(unexpected(path.to_owned(), "is not a directory"))
            }
            Err(e) => Err(Error::io("open directory", path, e.into())),
        }
    };

    let mut current = enter(parent, OsStr::new(name), &top_path)?;
    // Ancestors below the top: (device, inode) of the parent and the child's name in it.
    let mut stack: Vec<((u64, u64), Vec<u8>)> = Vec::new();
    let mut current_path = top_path.clone();
    let mut reported_progress = false;
    loop {
        let mut subdirs = Vec::new();
        let mut reader = Dir::read_from(current.as_fd())
            .map_err(|e| Error::io("open directory", &current_path, e.into()))?;
        while let Some(entry) = reader.read() {
            let entry = entry.map_err(|e| Error::io("read directory", &current_path, e.into()))?;
            let child = entry.file_name();
            if is_dot(child) {
                continue;
            }
            let child_path = current_path.join(OsStr::from_bytes(child.to_bytes()));
            let is_dir = match entry.file_type() {
                FileType::Directory => true,
                FileType::Unknown => {
                    let child_os = OsStr::from_bytes(child.to_bytes());
                    let stx = stat_child(current.as_fd(), child_os, StatxFlags::TYPE)
                        .map_err(|e| Error::io("statx", &child_path, e.into()))?;
                    file_type(&stx) == FileType::Directory
                }
                _ => false,
            };
            if is_dir {
                subdirs.push(child.to_bytes().to_vec());
                // One subdirectory at a time: the others are found again on the next scan.
                break;
            }
            match rustix::fs::unlinkat(current.as_fd(), child, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(Errno::BUSY) => {
                    return Err(unexpected(
                        child_path,
                        "is a mount point; refusing to remove it",
                    ));
                }
                Err(e) => return Err(Error::io("remove", child_path, e.into())),
            }
            if !reported_progress {
                reported_progress = true;
                hook.reach(partly_removed);
            }
        }
        drop(reader);
        if let Some(child) = subdirs.pop() {
            let child_os = OsStr::from_bytes(&child);
            let child_path = current_path.join(child_os);
            let next = enter(current.as_fd(), child_os, &child_path)?;
            let st = rustix::fs::fstat(&current)
                .map_err(|e| Error::io("stat directory", &current_path, e.into()))?;
            stack.push(((st.st_dev, st.st_ino), child));
            current = next;
            current_path = child_path;
            continue;
        }
        // `current` is empty: remove it from its parent.
        let Some((parent_identity, child)) = stack.pop() else {
            drop(current);
            match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
                Ok(()) | Err(Errno::NOENT) => return Ok(()),
                Err(Errno::BUSY) => {
                    return Err(unexpected(
                        top_path,
                        "is a mount point; refusing to remove it",
                    ));
                }
                Err(e) => return Err(Error::io("remove directory", top_path, e.into())),
            }
        };
        let parent_path = current_path
            .parent()
            .map_or_else(|| top_path.clone(), Path::to_path_buf);
        // `..` of a directory inside the volume's mount is in that mount too; `RESOLVE_NO_XDEV`
        // refuses the walk if something was mounted over the parent meanwhile.
        let up = match open_dir_no_xdev(current.as_fd(), OsStr::new(".."), false) {
            Ok(fd) => fd,
            Err(Errno::XDEV) => return Err(crosses(&parent_path)),
            Err(e) => return Err(Error::io("open directory", &parent_path, e.into())),
        };
        let st = rustix::fs::fstat(&up)
            .map_err(|e| Error::io("stat directory", &parent_path, e.into()))?;
        if (st.st_dev, st.st_ino) != parent_identity {
            return Err(unexpected(parent_path, "was moved during deletion"));
        }
        drop(current);
        match rustix::fs::unlinkat(up.as_fd(), OsStr::from_bytes(&child), AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(Errno::BUSY) => {
                return Err(unexpected(
                    current_path,
                    "is a mount point; refusing to remove it",
                ));
            }
            Err(e) => return Err(Error::io("remove directory", current_path, e.into())),
        }
        current = up;
        current_path = parent_path;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guard against a mount that appears between the `statx` check and the open: the open
    /// itself refuses to cross it, and the check sees it without entering it.
    #[test]
    fn a_mount_point_is_seen_from_outside_and_never_opened() {
        if !test_support::private_mount_namespace(
            "fsio::tests::a_mount_point_is_seen_from_outside_and_never_opened",
        ) {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("plain")).unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        rustix::mount::mount(
            "tmpfs",
            &sub,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            None,
        )
        .unwrap();
        let fd = rustix::fs::open(
            dir.path(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let mount = mount_id(fd.as_fd()).unwrap();

        let plain = stat_child(fd.as_fd(), OsStr::new("plain"), StatxFlags::MNT_ID).unwrap();
        assert!(!on_other_mount(&plain, mount).unwrap());
        let inner = stat_child(fd.as_fd(), OsStr::new("sub"), StatxFlags::MNT_ID).unwrap();
        assert!(on_other_mount(&inner, mount).unwrap());

        let plain_fd = open_dir_no_xdev(fd.as_fd(), OsStr::new("plain"), true).unwrap();
        assert_eq!(
            open_dir_no_xdev(fd.as_fd(), OsStr::new("sub"), true).unwrap_err(),
            Errno::XDEV
        );
        // `..` stays on the mount; `RESOLVE_BENEATH` would refuse it, so the walk up omits it.
        open_dir_no_xdev(plain_fd.as_fd(), OsStr::new(".."), false).unwrap();
        assert_eq!(
            open_dir_no_xdev(plain_fd.as_fd(), OsStr::new(".."), true).unwrap_err(),
            Errno::XDEV
        );
        rustix::mount::unmount(&sub, rustix::mount::UnmountFlags::empty()).unwrap();
    }
}
