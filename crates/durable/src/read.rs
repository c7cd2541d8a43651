//! Reading a small file back, as carefully as it was written.

use std::ffi::{OsStr, OsString};
use std::io::Read as _;
use std::os::fd::BorrowedFd;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use crate::Error;

/// What [`read`] found instead of a small regular file, or the step that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The name is a symbolic link; it was not followed.
    #[error("{name:?} is a symbolic link")]
    Symlink {
        /// The name inside the directory.
        name: OsString,
    },
    /// The name is a directory, a device, a FIFO or a socket; it was not opened.
    #[error("{name:?} is not a regular file")]
    NotRegularFile {
        /// The name inside the directory.
        name: OsString,
    },
    /// The file holds more than the limit.
    #[error("{name:?} holds {size} bytes, over the limit of {limit}")]
    TooLarge {
        /// The name inside the directory.
        name: OsString,
        /// Its size, or the limit plus one when it grew while it was read.
        size: u64,
        /// The limit the caller set.
        limit: u64,
    },
    /// The name was swapped for another file between the look and the open (something else
    /// writes the directory).
    #[error("{name:?} was swapped for another file while it was opened")]
    Swapped {
        /// The name inside the directory.
        name: OsString,
    },
    /// A step failed, or the name is not a single file name.
    #[error(transparent)]
    Failed(#[from] Error),
}

/// Reads the file `name` in `dir` whole, when it is a regular file of at most `limit` bytes.
/// `Ok(None)` when the name does not exist. [`open`] and [`Opened::read`] in one step, for a
/// caller with nothing to check between them.
///
/// # Errors
/// [`ReadError`]: what the name turned out to be, or the step that failed.
pub fn read(
    dir: BorrowedFd<'_>,
    name: impl AsRef<OsStr>,
    limit: u64,
) -> Result<Option<Vec<u8>>, ReadError> {
    open(dir, name)?.map(|file| file.read(limit)).transpose()
}

/// Opens the regular file `name` in `dir` for reading. `Ok(None)` when the name does not
/// exist.
///
/// The name is looked at without following it first, so a symbolic link is reported as one
/// and a device or FIFO is never opened (opening some devices has effects). The file is then
/// opened without following a link, without blocking and without becoming a controlling
/// terminal, and must be the inode that was looked at. Check [`Opened::metadata`] (the owner, the
/// mode, the link count: whatever the caller requires) before [`Opened::read`].
///
/// # Errors
/// [`ReadError`]: what the name turned out to be, or the step that failed; a `name` that is not
/// a single file name (empty, `.`, `..`, or with a `/`) is [`ReadError::Failed`].
pub fn open(dir: BorrowedFd<'_>, name: impl AsRef<OsStr>) -> Result<Option<Opened>, ReadError> {
    let name = crate::single_name(name.as_ref())?;
    let seen = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(Error::new("stat", name, e).into()),
    };
    regular(&seen, name)?;
    let fd = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::LOOP) => {
            return Err(ReadError::Symlink {
                name: name.to_owned(),
            });
        }
        Err(e) => return Err(Error::new("open", name, e).into()),
    };
    let stat = rustix::fs::fstat(&fd).map_err(|e| Error::new("stat", name, e))?;
    regular(&stat, name)?;
    if (stat.st_dev, stat.st_ino) != (seen.st_dev, seen.st_ino) {
        return Err(ReadError::Swapped {
            name: name.to_owned(),
        });
    }
    let file = std::fs::File::from(fd);
    let metadata = file.metadata().map_err(|e| Error::new("stat", name, e))?;
    Ok(Some(Opened {
        file,
        metadata,
        name: name.to_owned(),
    }))
}

/// A regular file [`open`] opened, not yet read.
#[derive(Debug)]
pub struct Opened {
    file: std::fs::File,
    metadata: std::fs::Metadata,
    name: OsString,
}

impl Opened {
    /// The opened file's status, taken from the descriptor itself
    /// ([`std::os::unix::fs::MetadataExt`] has the owner, mode and link count).
    pub fn metadata(&self) -> &std::fs::Metadata {
        &self.metadata
    }

    /// Reads the whole file, refusing it when it holds more than `limit` bytes (checked before
    /// reading, and again after, for a file that grew meanwhile).
    ///
    /// # Errors
    /// [`ReadError::TooLarge`], or the read's error.
    pub fn read(self, limit: u64) -> Result<Vec<u8>, ReadError> {
        let too_large = |size| ReadError::TooLarge {
            name: self.name.clone(),
            size,
            limit,
        };
        let size = self.metadata.len();
        if size > limit {
            return Err(too_large(size));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        (&self.file)
            .take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| Error::new("read", &self.name, e))?;
        if bytes.len() as u64 > limit {
            return Err(too_large(bytes.len() as u64));
        }
        Ok(bytes)
    }
}

fn regular(stat: &Stat, name: &OsStr) -> Result<(), ReadError> {
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => Ok(()),
        FileType::Symlink => Err(ReadError::Symlink {
            name: name.to_owned(),
        }),
        _ => Err(ReadError::NotRegularFile {
            name: name.to_owned(),
        }),
    }
}
