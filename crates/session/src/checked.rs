//! The checked read of a record, relative to an open directory so a path component swapped for
//! a symlink after the directory was opened is never followed, and the mapping of the `durable`
//! crate's errors (it does the writing and the careful open; this module adds the record's
//! ownership, mode and link checks).

use std::os::fd::BorrowedFd;

use crate::{Error, MAX_RECORD_BYTES, SessionPath};

/// Mode of every record this crate writes.
pub(crate) const RECORD_MODE: u32 = 0o600;

/// A durable write's (or read's) error as this crate reports it: the step, the full path, the cause.
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
/// `durable::open` looks at the name without following it first, so a symlink is reported as
/// one and a device or FIFO is never opened; the opened descriptor must be that same inode.
pub(crate) fn read_checked(
    dir: BorrowedFd<'_>,
    path: &SessionPath,
    euid: u32,
) -> Result<Option<Vec<u8>>, Error> {
    let record = path.record();
    let Some(opened) = durable::open(dir, path.record_name()).map_err(read_error(path))? else {
        return Ok(None);
    };
    let stat = opened.stat();
    if stat.st_uid != euid {
        return Err(Error::ForeignOwner {
            path: record,
            owner: stat.st_uid,
            expected: euid,
        });
    }
    let mode = stat.st_mode & 0o7777;
    if mode & !RECORD_MODE != 0 {
        return Err(Error::WrongMode { path: record, mode });
    }
    // `st_nlink`'s type differs between targets.
    #[allow(clippy::useless_conversion)]
    let links = u64::from(stat.st_nlink);
    if links != 1 {
        return Err(Error::HardLinked {
            path: record,
            links,
        });
    }
    opened
        .read(MAX_RECORD_BYTES)
        .map(Some)
        .map_err(read_error(path))
}

/// A checked read's error as this crate reports it.
fn read_error(path: &SessionPath) -> impl Fn(durable::ReadError) -> Error + '_ {
    |e| match e {
        durable::ReadError::Symlink { .. } => Error::Symlink {
            path: path.record(),
        },
        durable::ReadError::NotRegularFile { .. } => Error::NotRegularFile {
            path: path.record(),
        },
        durable::ReadError::TooLarge { size, limit, .. } => Error::TooLarge {
            path: path.record(),
            size,
            limit,
        },
        durable::ReadError::Io(e) => write_error(path)(e),
    }
}
