//! Crash-safe writes of small files, relative to an open directory.
//!
//! One write is: remove a leftover temp file, create the temp file (`O_EXCL`, `O_NOFOLLOW`,
//! the exact mode asked for whatever the umask), write, `fsync` it, rename it over the name
//! (or, with [`Replace::No`], only if the name is free), then `fsync` the directory. A crash at
//! any point leaves the old file or the new one, and at worst a temp file that the next write
//! of the same name removes. Every step acts on the directory descriptor with a single name,
//! so a path component swapped for a symbolic link after the directory was opened is never
//! followed, and no step follows a link at the name itself.
//!
//! [`write_observed`] reports each [`Step`] as it is reached, so crash tests can stop a writer
//! between any two of them.
//!
//! [`read`] (or [`open`] then [`Opened::read`]) reads such a file back with the same care: no
//! link is followed, nothing but a regular file is opened, and a size limit holds; callers check
//! ownership, mode and contents in their own terms.
//!
//! What this crate does not do: choose file names or formats, lock (the caller keeps two writers of one name apart:
//! the temp name is fixed so that a leftover is recognised), or make a new directory durable in
//! its parent.
//!
//! ```
//! use std::os::fd::AsFd;
//! use tak_os_durable::{self as durable, Outcome, Replace};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let tmp = tempfile::tempdir()?;
//! let dir = std::fs::File::open(tmp.path())?;
//! let options = durable::Options { mode: 0o600, replace: Replace::No };
//! let first = durable::write(dir.as_fd(), "record.json", b"{}", options)?;
//! assert_eq!(first, Outcome::Written);
//! let again = durable::write(dir.as_fd(), "record.json", b"[]", options)?;
//! assert_eq!(again, Outcome::AlreadyExists);
//! assert_eq!(std::fs::read(tmp.path().join("record.json"))?, b"{}");
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

mod read;

pub use read::{Opened, ReadError, open, read};

use std::ffi::{OsStr, OsString};
use std::io::{self, Write as _};
use std::os::fd::BorrowedFd;

use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

/// Whether a write may replace a file that already has the name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replace {
    /// Replace it atomically.
    Yes,
    /// Write only when the name is free; an existing file is left as it is.
    No,
}

/// How to write one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// The file's permission bits, exactly (the process umask does not narrow them).
    pub mode: u32,
    /// Whether an existing file of that name is replaced.
    pub replace: Replace,
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The file now holds the new bytes, durably.
    Written,
    /// [`Replace::No`] and the name was taken: nothing changed (the temp file is removed).
    AlreadyExists,
}

/// A point inside one write, reached just after the action it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// The temp file is written and fsynced; the name still holds the old file (or none).
    TempWritten,
    /// The temp file has the name; the directory is not yet fsynced, so a crash may still
    /// bring the old file back.
    Renamed,
    /// The directory is fsynced: the new file survives a crash.
    Durable,
}

/// What failed, on which name inside the directory, and the operating system's error.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {name:?}")]
pub struct Error {
    action: &'static str,
    name: OsString,
    #[source]
    source: io::Error,
}

impl Error {
    pub(crate) fn new(action: &'static str, name: &OsStr, source: impl Into<io::Error>) -> Self {
        Error {
            action,
            name: name.to_owned(),
            source: source.into(),
        }
    }

    /// The step that failed, as a verb phrase ("create temp file", "fsync directory", ...).
    pub fn action(&self) -> &'static str {
        self.action
    }

    /// The name, inside the directory, that the failed step acted on (the temp file's or the
    /// file's; the directory's own steps name the file being written).
    pub fn name(&self) -> &OsStr {
        &self.name
    }

    /// The operating system's error.
    pub fn io_error(&self) -> &io::Error {
        &self.source
    }

    /// The operating system's error, owned.
    pub fn into_io_error(self) -> io::Error {
        self.source
    }
}

/// The temp file name a write of `name` uses: `.<name>.tmp`. Fixed, so that whoever cleans a
/// directory up can recognise leftovers, and the next write of `name` replaces one.
pub fn temp_name(name: impl AsRef<OsStr>) -> OsString {
    let mut temp = OsString::from(".");
    temp.push(name.as_ref());
    temp.push(".tmp");
    temp
}

/// `name` if it is one name inside the directory: not empty, `.` or `..`, and without a `/`
/// (which would make the calls walk, and follow, the components before it).
pub(crate) fn single_name(name: &OsStr) -> Result<&OsStr, Error> {
    use std::os::unix::ffi::OsStrExt as _;
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(Error::new(
            "use as a file name",
            name,
            io::Error::new(io::ErrorKind::InvalidInput, "not a single file name"),
        ));
    }
    Ok(name)
}

/// Writes `bytes` as the file `name` in `dir`, durably; see the crate docs for the steps.
///
/// # Errors
/// A `name` that is not a single file name (empty, `.`, `..`, or with a `/`); else the step
/// that failed: the temp file is removed on a best-effort basis, and the name holds what it
/// held before unless the failure came after the rename (the directory's fsync).
pub fn write(
    dir: BorrowedFd<'_>,
    name: impl AsRef<OsStr>,
    bytes: &[u8],
    options: Options,
) -> Result<Outcome, Error> {
    write_observed(dir, name, bytes, options, &mut |_| {})
}

/// [`write()`], calling `observe` at each [`Step`] it reaches, in order (for crash tests).
///
/// # Errors
/// As for [`write()`].
pub fn write_observed(
    dir: BorrowedFd<'_>,
    name: impl AsRef<OsStr>,
    bytes: &[u8],
    options: Options,
    observe: &mut dyn FnMut(Step),
) -> Result<Outcome, Error> {
    let name = single_name(name.as_ref())?;
    let temp = temp_name(name);
    remove_temp(dir, name)?;
    let written = write_temp(dir, &temp, bytes, options.mode).and_then(|()| {
        observe(Step::TempWritten);
        rename(dir, &temp, name, options.replace)
    });
    match written {
        Ok(Outcome::Written) => {
            observe(Step::Renamed);
            sync_dir(dir, name)?;
            observe(Step::Durable);
            Ok(Outcome::Written)
        }
        Ok(Outcome::AlreadyExists) => {
            remove_temp(dir, name)?;
            Ok(Outcome::AlreadyExists)
        }
        Err(e) => {
            // Best effort: the next write of this name removes a leftover anyway.
            let _ = rustix::fs::unlinkat(dir, &temp, AtFlags::empty());
            Err(e)
        }
    }
}

fn write_temp(dir: BorrowedFd<'_>, temp: &OsStr, bytes: &[u8], mode: u32) -> Result<(), Error> {
    let fd = rustix::fs::openat(
        dir,
        temp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )
    .map_err(|e| Error::new("create temp file", temp, e))?;
    // The umask may have narrowed the mode.
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
        .map_err(|e| Error::new("chmod temp file", temp, e))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)
        .map_err(|e| Error::new("write temp file", temp, e))?;
    file.sync_all()
        .map_err(|e| Error::new("fsync temp file", temp, e))
}

fn rename(
    dir: BorrowedFd<'_>,
    temp: &OsStr,
    name: &OsStr,
    replace: Replace,
) -> Result<Outcome, Error> {
    let renamed = match replace {
        Replace::Yes => rustix::fs::renameat(dir, temp, dir, name),
        Replace::No => {
            match rustix::fs::renameat_with(dir, temp, dir, name, RenameFlags::NOREPLACE) {
                // A filesystem without RENAME_NOREPLACE. The caller keeps writers of one name
                // apart, so check-then-rename is enough there.
                Err(Errno::INVAL) => match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                {
                    Ok(_) => Err(Errno::EXIST),
                    Err(Errno::NOENT) => rustix::fs::renameat(dir, temp, dir, name),
                    Err(e) => Err(e),
                },
                other => other,
            }
        }
    };
    match renamed {
        Ok(()) => Ok(Outcome::Written),
        Err(Errno::EXIST) if replace == Replace::No => Ok(Outcome::AlreadyExists),
        Err(e) => Err(Error::new("rename temp file", temp, e)),
    }
}

/// Removes the leftover temp file of a write of `name`, if there is one (unlink removes a
/// symbolic link itself, never what it points at).
///
/// # Errors
/// When the unlink fails for another reason than the file being absent.
pub fn remove_temp(dir: BorrowedFd<'_>, name: impl AsRef<OsStr>) -> Result<(), Error> {
    let temp = temp_name(single_name(name.as_ref())?);
    match rustix::fs::unlinkat(dir, &temp, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(Error::new("remove stale temp file", &temp, e)),
    }
}

/// Removes the file `name` from `dir` and makes the removal durable. `Ok(false)` when there
/// was no such file (nothing is fsynced then).
///
/// # Errors
/// The unlink or the directory's fsync.
pub fn remove(dir: BorrowedFd<'_>, name: impl AsRef<OsStr>) -> Result<bool, Error> {
    let name = single_name(name.as_ref())?;
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) => {
            sync_dir(dir, name)?;
            Ok(true)
        }
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(Error::new("remove", name, e)),
    }
}

/// Fsyncs the directory `dir`, making the names in it durable; `name` is what the caller
/// changed in it, for the error.
///
/// # Errors
/// The fsync's.
pub fn sync_dir(dir: BorrowedFd<'_>, name: impl AsRef<OsStr>) -> Result<(), Error> {
    rustix::fs::fsync(dir).map_err(|e| Error::new("fsync directory", name.as_ref(), e))
}
