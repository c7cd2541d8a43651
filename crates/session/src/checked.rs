//! The checked read of a record, relative to an open directory so a path component swapped for
//! a symlink after the directory was opened is never followed, and the mapping of the `durable`
//! crate's errors (it does the writing and the careful open; this module adds the record's
//! ownership, mode and link checks).

use std::os::fd::BorrowedFd;
use std::os::unix::fs::MetadataExt as _;

use crate::{AccessMode, Error, MAX_RECORD_BYTES, SessionPath};

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

/// Reads the bytes of `access_mode`'s record after checking, on the opened descriptor itself,
/// that it is a regular file owned by `euid`, with mode 0600 or narrower, one link and at most
/// [`MAX_RECORD_BYTES`]. `Ok(None)` when there is no record.
///
/// `durable::open` looks at the name without following it first, so a symlink is reported as
/// one and a device or FIFO is never opened; the opened descriptor must be that same inode.
pub(crate) fn read_checked(
    dir: BorrowedFd<'_>,
    path: &SessionPath,
    access_mode: AccessMode,
    euid: u32,
) -> Result<Option<Vec<u8>>, Error> {
    let record = path.record(access_mode);
    let Some(opened) =
        durable::open(dir, path.record_name(access_mode)).map_err(read_error(path, access_mode))?
    else {
        return Ok(None);
    };
    let stat = opened.metadata();
    if stat.uid() != euid {
        return Err(Error::ForeignOwner {
            path: record,
            owner: stat.uid(),
            expected: euid,
        });
    }
    let mode = stat.mode() & 0o7777;
    if mode & !RECORD_MODE != 0 {
        return Err(Error::WrongMode { path: record, mode });
    }
    let links = stat.nlink();
    if links != 1 {
        return Err(Error::HardLinked {
            path: record,
            links,
        });
    }
    opened
        .read(MAX_RECORD_BYTES)
        .map(Some)
        .map_err(read_error(path, access_mode))
}

/// A checked read's error as this crate reports it.
fn read_error(path: &SessionPath, mode: AccessMode) -> impl Fn(durable::ReadError) -> Error + '_ {
    move |e| match e {
        durable::ReadError::Symlink { .. } => Error::Symlink {
            path: path.record(mode),
        },
        durable::ReadError::NotRegularFile { .. } => Error::NotRegularFile {
            path: path.record(mode),
        },
        durable::ReadError::TooLarge { size, limit, .. } => Error::TooLarge {
            path: path.record(mode),
            size,
            limit,
        },
        durable::ReadError::Swapped { .. } => Error::io(
            "open",
            path.record(mode),
            std::io::Error::other("the record was replaced while it was opened"),
        ),
        durable::ReadError::Failed(e) => write_error(path)(e),
        // A kind of refusal this crate does not know yet: reported as a failed open.
        other => Error::io("open", path.record(mode), std::io::Error::other(other)),
    }
}
