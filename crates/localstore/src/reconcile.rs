//! Startup reconciliation: finish or roll back interrupted operations, report everything else.

use std::collections::BTreeSet;
use std::os::fd::AsFd;
use std::path::PathBuf;

use rustix::fs::{AtFlags, FileType};
use rustix::io::Errno;

use crate::crash::CrashPoint;
use crate::fsio;
use crate::layout::{LOCK_FILE, METADATA_DIR};
use crate::store::Store;
use crate::{Error, VolumeId, VolumeState};

/// What reconciliation found and did when a store opened.
///
/// A writable open acts on interrupted operations only: a `creating` volume is rolled back (its
/// empty data directory and its record removed: the create never returned success) and a
/// `deleting` volume's deletion is finished. Everything else is reported and left alone: the
/// store never deletes data it cannot account for and never recreates a missing data directory.
/// A read-only open acts on nothing and lists interrupted operations under `left_in_place`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reconciliation {
    /// `creating` volumes that were rolled back.
    pub rolled_back: Vec<VolumeId>,
    /// `deleting` volumes whose deletion was finished.
    pub deletes_finished: Vec<VolumeId>,
    /// Interrupted volumes that were not acted on, and why.
    pub left_in_place: Vec<LeftInPlace>,
    /// `ready` volumes without a data directory (a disk may be missing). They stay recorded and
    /// are refused by [`Store::publish_path`] until the store is reopened.
    pub unpublishable: Vec<VolumeId>,
    /// Data directories named like a volume of this node but without a record.
    pub orphan_directories: Vec<VolumeId>,
    /// Consumer claims without a volume record.
    pub orphan_claims: Vec<VolumeId>,
    /// Records or claims that could not be read, with the reason.
    pub unreadable: Vec<Unreadable>,
    /// Records, claims or data directories of volumes of other nodes.
    pub foreign: Vec<VolumeId>,
    /// Entries in the store root or `.metadata` that are none of the above.
    pub unknown_entries: Vec<PathBuf>,
    /// Leftover temp files of interrupted record writes: removed, or only found when read-only.
    pub temp_files: Vec<PathBuf>,
}

impl Reconciliation {
    /// Whether nothing needs an operator's attention: no interrupted volume left in place, no
    /// unpublishable volume, no orphan, no unreadable record, nothing foreign or unknown.
    /// (Rolled-back creates, finished deletes and removed temp files are routine.)
    pub fn needs_attention(&self) -> bool {
        !(self.left_in_place.is_empty()
            && self.unpublishable.is_empty()
            && self.orphan_directories.is_empty()
            && self.orphan_claims.is_empty()
            && self.unreadable.is_empty()
            && self.foreign.is_empty()
            && self.unknown_entries.is_empty())
    }
}

/// An interrupted volume that reconciliation did not act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftInPlace {
    /// The volume.
    pub volume_id: VolumeId,
    /// Its recorded state.
    pub state: VolumeState,
    /// Why it was left (read-only open, or the error that stopped the action).
    pub reason: String,
}

/// A record or claim that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// The file.
    pub path: PathBuf,
    /// Why (the error's message and its sources).
    pub reason: String,
}

/// An error's message followed by those of its sources, for a report.
pub(crate) fn describe(error: &Error) -> String {
    error_text::chain(error)
}

impl Store {
    pub(crate) fn reconcile(&self) -> Result<Reconciliation, Error> {
        let mut report = Reconciliation::default();
        let mut records = BTreeSet::new();
        let mut claims = BTreeSet::new();
        let mut removed_any = false;
        for (name, _) in fsio::list_dir(self.metadata_fd.as_fd(), &self.metadata_path)? {
            let path = self.metadata_path.join(&name);
            if name == LOCK_FILE {
                continue;
            }
            if name.starts_with('.') && name.ends_with(".tmp") {
                if !self.read_only {
                    removed_any |= fsio::unlink(self.metadata_fd.as_fd(), &path, &name)?;
                }
                report.temp_files.push(path);
                continue;
            }
            if let Some(id) = name
                .strip_suffix(".consumer.json")
                .and_then(|s| s.parse().ok())
            {
                claims.insert(id);
            } else if let Some(id) = name.strip_suffix(".json").and_then(|s| s.parse().ok()) {
                records.insert(id);
            } else {
                report.unknown_entries.push(path);
            }
        }
        let mut data_dirs = BTreeSet::new();
        for (name, file_type) in fsio::list_dir(self.root_fd.as_fd(), &self.root)? {
            if name == METADATA_DIR || name == "lost+found" {
                continue;
            }
            match name.parse::<VolumeId>() {
                Ok(id) if file_type == FileType::Directory => {
                    data_dirs.insert(id);
                }
                Ok(_) | Err(_) => report.unknown_entries.push(self.root.join(&name)),
            }
        }
        let mut foreign = BTreeSet::new();
        for id in records.iter().chain(&claims).chain(&data_dirs) {
            if id.node_hash() != self.node_hash {
                foreign.insert(*id);
            }
        }
        report.foreign = foreign.iter().copied().collect();

        for id in records.iter().filter(|id| !foreign.contains(id)) {
            let record = match self.read_record(id) {
                Ok(Some(record)) => record,
                // Removed between listing and reading: nothing to do.
                Ok(None) => continue,
                Err(e) => {
                    report.unreadable.push(Unreadable {
                        path: self.record_path(id),
                        reason: describe(&e),
                    });
                    continue;
                }
            };
            match record.state {
                VolumeState::Ready => {
                    if !data_dirs.contains(id) {
                        report.unpublishable.push(*id);
                    }
                }
                VolumeState::Creating | VolumeState::Deleting if self.read_only => {
                    report.left_in_place.push(LeftInPlace {
                        volume_id: *id,
                        state: record.state,
                        reason: "the store is open read-only".to_owned(),
                    });
                }
                VolumeState::Creating => match self.roll_back(id) {
                    Ok(()) => report.rolled_back.push(*id),
                    Err(e) => report.left_in_place.push(LeftInPlace {
                        volume_id: *id,
                        state: record.state,
                        reason: describe(&e),
                    }),
                },
                VolumeState::Deleting => match self.finish_delete(id) {
                    Ok(()) => report.deletes_finished.push(*id),
                    Err(e) => report.left_in_place.push(LeftInPlace {
                        volume_id: *id,
                        state: record.state,
                        reason: describe(&e),
                    }),
                },
            }
        }
        for id in data_dirs.difference(&records) {
            if !foreign.contains(id) {
                report.orphan_directories.push(*id);
            }
        }
        for id in claims.difference(&records) {
            if !foreign.contains(id) {
                report.orphan_claims.push(*id);
            }
        }
        for id in claims.intersection(&records) {
            if let Err(e) = self.read_claim(id) {
                report.unreadable.push(Unreadable {
                    path: self.metadata_path.join(Store::claim_name(id)),
                    reason: describe(&e),
                });
            }
        }
        if removed_any {
            fsio::fsync_dir(self.metadata_fd.as_fd(), &self.metadata_path)?;
        }
        self.unpublishable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(report.unpublishable.iter().copied());
        Ok(report)
    }

    /// Undoes an interrupted create. Its data directory was never published, so it can only be
    /// empty; one that is not is left in place (with its record) for an operator.
    fn roll_back(&self, id: &VolumeId) -> Result<(), Error> {
        let path = self.data_dir(id);
        match rustix::fs::unlinkat(&self.root_fd, id.to_string().as_str(), AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(Errno::NOTEMPTY | Errno::EXIST) => {
                return Err(Error::UnexpectedData {
                    volume_id: *id,
                    path,
                    problem: "is not empty although its create never finished",
                });
            }
            Err(Errno::NOTDIR) => {
                return Err(Error::UnexpectedData {
                    volume_id: *id,
                    path,
                    problem: "is not a directory",
                });
            }
            Err(e) => return Err(Error::io("remove directory", path, e.into())),
        }
        fsio::fsync_dir(self.root_fd.as_fd(), &self.root)?;
        self.remove_record(id, CrashPoint::DeleteRecordRemoved)
    }

    fn finish_delete(&self, id: &VolumeId) -> Result<(), Error> {
        if let Some(claim) = self.read_claim(id)? {
            return Err(Error::Claimed {
                volume_id: *id,
                target: claim.target,
            });
        }
        self.remove_data(id)?;
        self.remove_record(id, CrashPoint::DeleteRecordRemoved)
    }
}
