//! What the controller remembers of each volume it created, one small JSON file per volume in
//! `<state-dir>/controller/`, written durably: the generation it chose, the capacity it
//! reported and the access mode asked for. A repeated CreateVolume is judged against it.
//!
//! The record is written before the worker creates the volume and removed after the worker
//! deleted it, so a crash between the two steps leaves a record that the retried call finishes
//! from (same generation), never a volume without a record.

use std::fs::File;
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};

use replicated_contract::context::VolumeMode;
use serde::{Deserialize, Serialize};

/// The record format this controller reads and writes.
const FORMAT: u32 = 1;
/// The largest record file read back.
const MAX_RECORD_BYTES: u64 = 4096;

/// One volume as the controller created it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The volume ID (the CSI name).
    pub volume_id: String,
    /// The generation chosen at creation.
    pub generation: u64,
    /// The access mode asked for.
    pub mode: VolumeMode,
    /// The capacity reported at creation (0: none was asked for).
    pub capacity_bytes: i64,
}

#[derive(Serialize, Deserialize)]
struct RecordFile {
    format: u32,
    volume_id: String,
    generation: u64,
    access_mode: String,
    capacity_bytes: i64,
}

/// Why a record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The records directory could not be created or opened.
    #[error("cannot open the controller's records directory {path:?}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A read failed.
    #[error("cannot read the controller's record of {volume_id:?}")]
    Read {
        /// The volume.
        volume_id: String,
        /// The cause.
        #[source]
        source: durable::ReadError,
    },
    /// A write or removal failed.
    #[error("cannot write the controller's record of {volume_id:?}")]
    Write {
        /// The volume.
        volume_id: String,
        /// The cause.
        #[source]
        source: durable::Error,
    },
    /// The file holds something else than a record of this format.
    #[error("the controller's record of {volume_id:?} is corrupt: {reason}")]
    Corrupt {
        /// The volume.
        volume_id: String,
        /// What is wrong.
        reason: String,
    },
}

/// The records directory, held open.
#[derive(Debug)]
pub struct Records {
    dir: File,
}

impl Records {
    /// Opens (creating it when absent) `<state_dir>/controller`.
    pub fn open(state_dir: &Path) -> Result<Self, RecordError> {
        let path = state_dir.join("controller");
        let directory = |source| RecordError::Directory {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&path).map_err(directory)?;
        let dir = File::open(&path).map_err(directory)?;
        Ok(Records { dir })
    }

    /// The record of `volume_id`, if there is one.
    pub fn get(&self, volume_id: &str) -> Result<Option<Record>, RecordError> {
        let bytes = durable::read(self.dir.as_fd(), file_name(volume_id), MAX_RECORD_BYTES)
            .map_err(|source| RecordError::Read {
                volume_id: volume_id.to_owned(),
                source,
            })?;
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        let corrupt = |reason: String| RecordError::Corrupt {
            volume_id: volume_id.to_owned(),
            reason,
        };
        let file: RecordFile =
            serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        if file.format != FORMAT {
            return Err(corrupt(format!("unknown format {}", file.format)));
        }
        if file.volume_id != volume_id {
            return Err(corrupt(format!("it names {:?}", file.volume_id)));
        }
        let mode = VolumeMode::parse(&file.access_mode)
            .ok_or_else(|| corrupt(format!("access mode {:?}", file.access_mode)))?;
        Ok(Some(Record {
            volume_id: file.volume_id,
            generation: file.generation,
            mode,
            capacity_bytes: file.capacity_bytes,
        }))
    }

    /// Writes `record` durably, replacing an older one.
    pub fn put(&self, record: &Record) -> Result<(), RecordError> {
        let file = RecordFile {
            format: FORMAT,
            volume_id: record.volume_id.clone(),
            generation: record.generation,
            access_mode: record.mode.as_str().to_owned(),
            capacity_bytes: record.capacity_bytes,
        };
        let bytes = serde_json::to_vec_pretty(&file).map_err(|e| RecordError::Corrupt {
            volume_id: record.volume_id.clone(),
            reason: e.to_string(),
        })?;
        let options = durable::Options {
            mode: 0o600,
            replace: durable::Replace::Yes,
        };
        durable::write(
            self.dir.as_fd(),
            file_name(&record.volume_id),
            &bytes,
            options,
        )
        .map(drop)
        .map_err(|source| RecordError::Write {
            volume_id: record.volume_id.clone(),
            source,
        })
    }

    /// Removes the record of `volume_id`; `false` when there was none.
    pub fn remove(&self, volume_id: &str) -> Result<bool, RecordError> {
        let write = |source| RecordError::Write {
            volume_id: volume_id.to_owned(),
            source,
        };
        durable::remove_temp(self.dir.as_fd(), file_name(volume_id)).map_err(write)?;
        durable::remove(self.dir.as_fd(), file_name(volume_id)).map_err(write)
    }
}

/// A volume ID is already checked to be a single safe name (`[A-Za-z0-9._-]`, no leading dot).
fn file_name(volume_id: &str) -> String {
    format!("{volume_id}.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> Record {
        Record {
            volume_id: id.to_owned(),
            generation: 1_700_000_000_000,
            mode: VolumeMode::Rwo,
            capacity_bytes: 1 << 30,
        }
    }

    #[test]
    fn a_record_round_trips_and_is_removed_once() {
        let state = tempfile::tempdir().unwrap();
        let records = Records::open(state.path()).unwrap();
        assert_eq!(records.get("pvc-1").unwrap(), None);
        records.put(&record("pvc-1")).unwrap();
        assert_eq!(records.get("pvc-1").unwrap(), Some(record("pvc-1")));
        let reopened = Records::open(state.path()).unwrap();
        assert_eq!(reopened.get("pvc-1").unwrap(), Some(record("pvc-1")));
        assert!(records.remove("pvc-1").unwrap());
        assert!(!records.remove("pvc-1").unwrap());
        assert_eq!(records.get("pvc-1").unwrap(), None);
    }

    #[test]
    fn a_foreign_or_damaged_record_is_corrupt_not_trusted() {
        let state = tempfile::tempdir().unwrap();
        let records = Records::open(state.path()).unwrap();
        records.put(&record("pvc-1")).unwrap();
        let dir = state.path().join("controller");
        std::fs::copy(dir.join("pvc-1.json"), dir.join("pvc-2.json")).unwrap();
        let error = records.get("pvc-2").unwrap_err();
        assert!(error.to_string().contains("names \"pvc-1\""), "{error}");
        std::fs::write(dir.join("pvc-3.json"), b"{").unwrap();
        assert!(matches!(
            records.get("pvc-3"),
            Err(RecordError::Corrupt { .. })
        ));
        let text = std::fs::read_to_string(dir.join("pvc-1.json"))
            .unwrap()
            .replace("\"rwo\"", "\"RWO\"");
        std::fs::write(dir.join("pvc-1.json"), text).unwrap();
        assert!(matches!(
            records.get("pvc-1"),
            Err(RecordError::Corrupt { .. })
        ));
    }
}
