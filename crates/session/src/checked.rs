//! The one durable write helper and the checked read, both relative to an open directory so a
//! path component swapped for a symlink after the directory was opened is never followed.

use std::io::{Read, Write};
use std::os::fd::BorrowedFd;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, Stat};
use rustix::io::Errno;

use crate::{Error, MAX_RECORD_BYTES, SessionPath};

/// Mode of every record this crate writes.
pub(crate) const RECORD_MODE: u32 = 0o600;

/// Whether a durable write may replace an existing record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replace {
    /// Replace the record atomically.
    Yes,
    /// Create the record only if none exists.
    No,
}

/// Writes `bytes` as the record: a temp file in the same directory created with `O_EXCL` and
/// mode 0600, written, fsynced, renamed over the record name, then the directory fsynced. A
/// crash at any point leaves the old record or the new one, and at worst a stray temp file.
///
/// With [`Replace::No`] an existing record is left alone and `Ok(false)` is returned.
pub(crate) fn write_durable(
    dir: BorrowedFd<'_>,
    path: &SessionPath,
    bytes: &[u8],
    replace: Replace,
) -> Result<bool, Error> {
    remove_temp(dir, path)?;
    let temp = path.temp_name();
    let fd = rustix::fs::openat(
        dir,
        temp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(RECORD_MODE),
    )
    .map_err(|e| Error::io("create temp file", path.temp(), e.into()))?;
    let written = (|| {
        // The umask may have narrowed the mode; a record is exactly 0600 when written.
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(RECORD_MODE))
            .map_err(|e| Error::io("chmod temp file", path.temp(), e.into()))?;
        let mut file = std::fs::File::from(fd);
        file.write_all(bytes)
            .map_err(|e| Error::io("write temp file", path.temp(), e))?;
        file.sync_all()
            .map_err(|e| Error::io("fsync temp file", path.temp(), e))?;
        let renamed = match replace {
            Replace::Yes => rustix::fs::renameat(dir, temp, dir, path.record_name()),
            Replace::No => {
                match rustix::fs::renameat_with(
                    dir,
                    temp,
                    dir,
                    path.record_name(),
                    RenameFlags::NOREPLACE,
                ) {
                    Err(Errno::INVAL) => {
                        // The file system lacks RENAME_NOREPLACE. The caller serialises
                        // operations on one staging path, so check-then-rename is enough.
                        exists(dir, path).and_then(|exists| {
                            if exists {
                                Err(Errno::EXIST)
                            } else {
                                rustix::fs::renameat(dir, temp, dir, path.record_name())
                            }
                        })
                    }
                    other => other,
                }
            }
        };
        match renamed {
            Ok(()) => Ok(true),
            Err(Errno::EXIST) => Ok(false),
            Err(e) => Err(Error::io("rename temp file", path.temp(), e.into())),
        }
    })();
    match written {
        Ok(true) => {
            fsync_dir(dir, path)?;
            Ok(true)
        }
        Ok(false) => {
            remove_temp(dir, path)?;
            Ok(false)
        }
        Err(e) => {
            // Best effort: the next write removes a leftover anyway.
            let _ = rustix::fs::unlinkat(dir, temp, AtFlags::empty());
            Err(e)
        }
    }
}

/// Removes a leftover temp file, never following a symlink (unlink removes the link itself).
pub(crate) fn remove_temp(dir: BorrowedFd<'_>, path: &SessionPath) -> Result<(), Error> {
    match rustix::fs::unlinkat(dir, path.temp_name(), AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(Error::io("remove stale temp file", path.temp(), e.into())),
    }
}

/// Removes the record and makes the removal durable; `Ok(false)` when it was already gone.
pub(crate) fn remove_record(dir: BorrowedFd<'_>, path: &SessionPath) -> Result<bool, Error> {
    match rustix::fs::unlinkat(dir, path.record_name(), AtFlags::empty()) {
        Ok(()) => {
            fsync_dir(dir, path)?;
            Ok(true)
        }
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(Error::io("remove", path.record(), e.into())),
    }
}

pub(crate) fn fsync_dir(dir: BorrowedFd<'_>, path: &SessionPath) -> Result<(), Error> {
    rustix::fs::fsync(dir).map_err(|e| Error::io("fsync directory", path.directory(), e.into()))
}

fn exists(dir: BorrowedFd<'_>, path: &SessionPath) -> Result<bool, Errno> {
    match rustix::fs::statat(dir, path.record_name(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => Ok(true),
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Reads the record's bytes after checking, on the opened descriptor itself, that it is a
/// regular file owned by `euid`, with mode 0600 or narrower, one link and at most
/// [`MAX_RECORD_BYTES`]. `Ok(None)` when there is no record.
///
/// The name is looked at without following it first, so a symlink is reported as one and a
/// device or FIFO is never opened; the opened descriptor must then be that same inode.
pub(crate) fn read_checked(
    dir: BorrowedFd<'_>,
    path: &SessionPath,
    euid: u32,
) -> Result<Option<Vec<u8>>, Error> {
    let name = path.record_name();
    let seen = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(Error::io("stat", path.record(), e.into())),
    };
    check_type(&seen, path)?;
    let fd = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::LOOP) => {
            return Err(Error::Symlink {
                path: path.record(),
            });
        }
        Err(e) => return Err(Error::io("open", path.record(), e.into())),
    };
    let stat = rustix::fs::fstat(&fd).map_err(|e| Error::io("stat", path.record(), e.into()))?;
    check_type(&stat, path)?;
    if (stat.st_dev, stat.st_ino) != (seen.st_dev, seen.st_ino) {
        return Err(Error::io(
            "open",
            path.record(),
            std::io::Error::other("the record was replaced while it was opened"),
        ));
    }
    if stat.st_uid != euid {
        return Err(Error::ForeignOwner {
            path: path.record(),
            owner: stat.st_uid,
            expected: euid,
        });
    }
    let mode = stat.st_mode & 0o7777;
    if mode & !RECORD_MODE != 0 {
        return Err(Error::WrongMode {
            path: path.record(),
            mode,
        });
    }
    // `st_nlink`'s type differs between targets.
    #[allow(clippy::useless_conversion)]
    let links = u64::from(stat.st_nlink);
    if links != 1 {
        return Err(Error::HardLinked {
            path: path.record(),
            links,
        });
    }
    let too_large = |size| Error::TooLarge {
        path: path.record(),
        size,
        limit: MAX_RECORD_BYTES,
    };
    let size = u64::try_from(stat.st_size).unwrap_or(u64::MAX);
    if size > MAX_RECORD_BYTES {
        return Err(too_large(size));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    std::fs::File::from(fd)
        .take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io("read", path.record(), e))?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(Some(bytes))
}

fn check_type(stat: &Stat, path: &SessionPath) -> Result<(), Error> {
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => Ok(()),
        FileType::Symlink => Err(Error::Symlink {
            path: path.record(),
        }),
        _ => Err(Error::NotRegularFile {
            path: path.record(),
        }),
    }
}
