//! The session record file beside one staging path.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;

use durable::{Options, Outcome, Replace};

use crate::checked::{self, RECORD_MODE, write_error};
use crate::{
    AccessMode, Error, MountEpoch, SessionIdentity, SessionPath, SessionRecord, parse, render,
};

/// What [`SessionFile::create_pending`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum CreateOutcome {
    /// There was no record; the caller's record is now durable. For RWO, send the claim.
    Created,
    /// A record for the same identity and access mode already exists and was left unchanged:
    /// an earlier attempt of the same NodeStageVolume. Resume it with *its* endpoints and, for
    /// RWO, *its* epoch (the caller's new epoch was never sent); if its stage completed, the
    /// volume is already staged.
    Existing(SessionRecord),
}

/// The session record of one staging path, with the directory that holds it open.
///
/// A staging path has at most one record, under one of two names: `<staging>.rwo-session` for
/// an RWO session or `<staging>.rwx-session` for an RWX one (see [`SessionPath`]). Every
/// operation looks at both names, so [`load`](Self::load) and [`remove`](Self::remove) need
/// no access mode: a restarted mount owner learns it from the record. Both names present at
/// once is [`Error::ConflictingRecords`]; a request of one access mode where a record of the
/// other exists is [`Error::AccessModeMismatch`]
/// ([`ErrorKind::Incompatible`](crate::ErrorKind::Incompatible)). Either way nothing changes.
///
/// Every operation works relative to that open directory and never follows a symlink at
/// either name. Before trusting a record, each operation checks on the opened descriptor that
/// it is a regular file owned by this process's effective uid, with mode 0600 or narrower and
/// one link, at most [`MAX_RECORD_BYTES`](crate::MAX_RECORD_BYTES) long, of a format version
/// this library reads, of the access mode its name says, naming the caller's identity. A
/// record failing any check is rejected with an error naming the check, and never repaired,
/// replaced or removed.
///
/// The caller serialises operations on one staging path (the CSI per-volume lock); this type
/// does not lock.
#[derive(Debug)]
pub struct SessionFile {
    path: SessionPath,
    dir: OwnedFd,
    euid: u32,
}

impl SessionFile {
    /// Opens the directory that holds `staging`'s records: the staging path's parent, which
    /// must be a directory (not a symlink to one), owned by root or this process's effective
    /// uid, and not writable by group or others. The staging path itself is not touched.
    pub fn open(staging: &Path) -> Result<Self, Error> {
        let path = SessionPath::new(staging)?;
        let euid = rustix::process::geteuid().as_raw();
        let unsafe_dir = |problem: String| Error::UnsafeDirectory {
            path: path.directory().to_owned(),
            problem,
        };
        let dir = match rustix::fs::open(
            path.directory(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(dir) => dir,
            Err(Errno::LOOP) => return Err(unsafe_dir("is a symlink".to_owned())),
            Err(Errno::NOTDIR) => {
                // O_DIRECTORY|O_NOFOLLOW on a symlink reports ENOTDIR on some kernels.
                let problem = match rustix::fs::lstat(path.directory()) {
                    Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
                        "is a symlink"
                    }
                    _ => "is not a directory",
                };
                return Err(unsafe_dir(problem.to_owned()));
            }
            Err(e) => return Err(Error::io("open directory", path.directory(), e.into())),
        };
        let stat = rustix::fs::fstat(&dir)
            .map_err(|e| Error::io("stat directory", path.directory(), e.into()))?;
        if stat.st_uid != euid && stat.st_uid != 0 {
            return Err(unsafe_dir(format!(
                "is owned by uid {}, not by root or this process's uid {euid}",
                stat.st_uid
            )));
        }
        if stat.st_mode & 0o022 != 0 {
            return Err(unsafe_dir(format!(
                "has mode {:04o}; it must not be writable by group or others",
                stat.st_mode & 0o7777
            )));
        }
        Ok(Self { path, dir, euid })
    }

    /// Where the records and their temp files are.
    pub fn path(&self) -> &SessionPath {
        &self.path
    }

    /// The record of either access mode, or `None` when there is none. A leftover temp file
    /// is ignored.
    ///
    /// Fails with [`ErrorKind::IdentityMismatch`](crate::ErrorKind::IdentityMismatch) when the
    /// record names another volume, generation or node than `expected`, and with
    /// [`Error::ConflictingRecords`] when both an RWO and an RWX record exist.
    pub fn load(&self, expected: &SessionIdentity) -> Result<Option<SessionRecord>, Error> {
        let Some(record) = self.read()? else {
            return Ok(None);
        };
        self.check_identity(&record, expected)?;
        Ok(Some(record))
    }

    /// Makes `record` durable as the session's record unless one exists, and returns only after
    /// it is fsynced with its directory: an RWO claim may be sent then, not before. The record
    /// goes to the name of its access mode.
    ///
    /// NodeStageVolume retries are idempotent: an existing record with the same identity and
    /// access mode is returned as [`CreateOutcome::Existing`], unchanged, whatever its epoch,
    /// endpoints or stage. An existing record for another identity is an error, not replaced;
    /// one for the same identity but the other access mode is [`Error::AccessModeMismatch`]
    /// ([`ErrorKind::Incompatible`](crate::ErrorKind::Incompatible), CSI `ALREADY_EXISTS`),
    /// and nothing is written. A leftover temp file of the record's name from an interrupted
    /// write is removed.
    pub fn create_pending(&self, record: &SessionRecord) -> Result<CreateOutcome, Error> {
        if let Some(existing) = self.load(record.identity())? {
            return self.resume(existing, record.access_mode());
        }
        let mode = record.access_mode();
        let options = Options {
            mode: RECORD_MODE,
            replace: Replace::No,
        };
        let outcome = durable::write(
            self.dir.as_fd(),
            self.path.record_name(mode),
            &render(record),
            options,
        )
        .map_err(write_error(&self.path))?;
        if outcome == Outcome::Written {
            return Ok(CreateOutcome::Created);
        }
        // Someone created it between the check and the rename.
        match self.load(record.identity())? {
            Some(existing) => self.resume(existing, mode),
            None => Err(Error::io(
                "create",
                self.path.record(mode),
                std::io::Error::from(std::io::ErrorKind::AlreadyExists),
            )),
        }
    }

    /// Marks the session's stage completed, durably, and returns the updated record. Call it
    /// before NodeStageVolume reports success. Marking a completed record again changes
    /// nothing.
    ///
    /// `epoch` is the [`SessionRecord::epoch`] of the caller's session: `Some` for RWO, `None`
    /// for RWX. The record must exist, name `identity`, be of that access mode (else
    /// [`Error::AccessModeMismatch`]) and, for RWO, hold that epoch: a record of another claim
    /// is [`Error::EpochMismatch`], so one claim's stage can never complete another's.
    pub fn mark_stage_completed(
        &self,
        identity: &SessionIdentity,
        epoch: Option<MountEpoch>,
    ) -> Result<SessionRecord, Error> {
        let mode = match epoch {
            Some(_) => AccessMode::ReadWriteOnce,
            None => AccessMode::ReadWriteMany,
        };
        let record = self.load(identity)?.ok_or_else(|| Error::NotFound {
            path: self.path.record(mode),
        })?;
        self.check_access_mode(&record, mode)?;
        if let (Some(found), Some(expected)) = (record.epoch(), epoch)
            && found != expected
        {
            return Err(Error::EpochMismatch {
                path: self.path.record(mode),
                found,
                expected,
            });
        }
        if record.stage_completed() {
            return Ok(record);
        }
        let completed = record.completed();
        let options = Options {
            mode: RECORD_MODE,
            replace: Replace::Yes,
        };
        durable::write(
            self.dir.as_fd(),
            self.path.record_name(mode),
            &render(&completed),
            options,
        )
        .map_err(write_error(&self.path))?;
        Ok(completed)
    }

    /// Removes the session's record, of either access mode, durably, after checking it like
    /// [`load`](Self::load) does, and any leftover temp file of either name. Returns whether a
    /// record was removed; removing a missing record is success, so NodeUnstageVolume retries
    /// are idempotent. A record that fails a check (another identity, a symlink, a wrong mode,
    /// corrupt content, both names present) stays in place.
    pub fn remove(&self, identity: &SessionIdentity) -> Result<bool, Error> {
        for mode in AccessMode::ALL {
            durable::remove_temp(self.dir.as_fd(), self.path.record_name(mode))
                .map_err(write_error(&self.path))?;
        }
        let Some(record) = self.load(identity)? else {
            return Ok(false);
        };
        durable::remove(
            self.dir.as_fd(),
            self.path.record_name(record.access_mode()),
        )
        .map_err(write_error(&self.path))
    }

    /// The record of either access mode, checked like [`load`](Self::load) does except for its
    /// identity, or `None` when there is none: for a caller that learns the identity from the
    /// record (NodeUnstageVolume knows the volume ID and the staging path, not the
    /// generation). The caller compares [`SessionRecord::identity`] with what it knows.
    pub fn read(&self) -> Result<Option<SessionRecord>, Error> {
        let read = |mode| checked::read_checked(self.dir.as_fd(), &self.path, mode, self.euid);
        let (mode, bytes) = match (
            read(AccessMode::ReadWriteOnce)?,
            read(AccessMode::ReadWriteMany)?,
        ) {
            (None, None) => return Ok(None),
            (Some(bytes), None) => (AccessMode::ReadWriteOnce, bytes),
            (None, Some(bytes)) => (AccessMode::ReadWriteMany, bytes),
            (Some(_), Some(_)) => {
                return Err(Error::ConflictingRecords {
                    rwo: self.path.record(AccessMode::ReadWriteOnce),
                    rwx: self.path.record(AccessMode::ReadWriteMany),
                });
            }
        };
        let path = self.path.record(mode);
        let record = parse(&bytes).map_err(|e| e.at_path(&path))?;
        if record.access_mode() != mode {
            return Err(Error::Malformed {
                path: Some(path),
                problem: format!(
                    "holds an {} record; its name is for {mode} records",
                    record.access_mode()
                ),
                source: None,
            });
        }
        Ok(Some(record))
    }

    /// The outcome of `create_pending` for a caller of access mode `mode` when `existing`, of
    /// the caller's identity, is already there.
    fn resume(&self, existing: SessionRecord, mode: AccessMode) -> Result<CreateOutcome, Error> {
        self.check_access_mode(&existing, mode)?;
        Ok(CreateOutcome::Existing(existing))
    }

    fn check_access_mode(&self, record: &SessionRecord, expected: AccessMode) -> Result<(), Error> {
        let found = record.access_mode();
        if found == expected {
            return Ok(());
        }
        Err(Error::AccessModeMismatch {
            path: self.path.record(found),
            found,
            expected,
        })
    }

    fn check_identity(
        &self,
        record: &SessionRecord,
        expected: &SessionIdentity,
    ) -> Result<(), Error> {
        match record.identity().first_difference(expected) {
            None => Ok(()),
            Some((field, found, expected)) => Err(Error::IdentityMismatch {
                path: self.path.record(record.access_mode()),
                field,
                found,
                expected,
            }),
        }
    }
}
