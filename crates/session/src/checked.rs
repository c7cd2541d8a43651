//! The checked read of a record, relative to an open directory so a path component swapped for
//! a symlink after the directory was opened is never followed, and the mapping of the durable
//! writes' errors (the `durable` crate does the writing).

use std::io::Read;
use std::os::fd::BorrowedFd;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use crate::{Error, MAX_RECORD_BYTES, SessionPath};

/// Mode of every record this crate writes.
pub(crate) const RECORD_MODE: u32 = 0o600;

/// A durable write's error as this crate reports it: the step, the full path, the cause.
pub(crate) fn write_error(path: &SessionPath) -> impl Fn(durable::Error) -> Error + '_ {
    |e| {
        Error::io(
            e.action(),
            path.directory().join(e.name()),
            e.into_io_error(),
        )
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
