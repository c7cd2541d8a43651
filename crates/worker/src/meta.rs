//! The durable metadata of one volume: identity, checkpoint and journal.
//!
//! ```text
//! <state-dir>/volumes/<volume-id>/
//!   identity.json     written once at creation: volume ID, volume generation, access mode
//!   checkpoint.json   lease state, next inode generation and inode table, as of a compaction
//!   journal.jsonl     one JSON record per line, appended and fsynced since that checkpoint
//!   data/             the volume's files
//! <state-dir>/trash/<volume-id>.<random>/
//!                     a deleted volume's directory, moved here whole by one rename
//! ```
//!
//! Recovery reads the checkpoint and replays the journal over it. Every record is a whole value
//! (the full lease state, or one inode's generation and handle), so replaying a record twice
//! is harmless; that is what makes compaction (write the checkpoint through the durable-write
//! helper, then truncate the journal) safe at every crash point. A torn last line (a crash
//! during an append, before the reply was sent) is dropped; a bad line anywhere else is
//! corruption and stops the volume from opening.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};

use rustix::fs::AtFlags;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::lease::LeaseState;
use crate::sys::FileHandle;
use crate::{AccessMode, VolumeSpec};

/// The format version of every metadata file.
pub(crate) const FORMAT: u32 = 1;

const IDENTITY: &str = "identity.json";
const CHECKPOINT: &str = "checkpoint.json";
const JOURNAL: &str = "journal.jsonl";
/// The directory below a volume's metadata that holds its files.
pub(crate) const DATA: &str = "data";
/// The directory below the state directory that holds one directory per volume.
pub(crate) const VOLUMES: &str = "volumes";
/// The directory below the state directory where deleted volumes wait to be removed.
pub(crate) const TRASH: &str = "trash";

#[derive(Serialize, Deserialize)]
struct IdentityFile {
    format: u32,
    volume_id: String,
    volume_generation: u64,
    access_mode: AccessMode,
}

/// One inode's generation and the filesystem handle that opens it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct InodeEntry {
    pub(crate) ino: u64,
    pub(crate) generation: u64,
    pub(crate) handle_type: i32,
    pub(crate) handle: String,
}

impl InodeEntry {
    pub(crate) fn new(ino: u64, generation: u64, handle: &FileHandle) -> Self {
        Self {
            ino,
            generation,
            handle_type: handle.handle_type,
            handle: crate::hex::encode(&handle.bytes),
        }
    }

    pub(crate) fn file_handle(&self) -> Option<FileHandle> {
        Some(FileHandle {
            handle_type: self.handle_type,
            bytes: crate::hex::decode(&self.handle)?,
        })
    }
}

/// One journal line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "snake_case")]
pub(crate) enum Record {
    /// The whole lease state after a lease command changed it.
    Lease { lease: LeaseState },
    /// An inode number got a (new) generation.
    Inode(InodeEntry),
    /// An inode number is no longer in use.
    Forget { ino: u64 },
}

/// The state a checkpoint holds and recovery rebuilds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Snapshot {
    pub(crate) lease: LeaseState,
    pub(crate) next_generation: u64,
    pub(crate) inodes: HashMap<u64, InodeEntry>,
}

impl Snapshot {
    fn apply(&mut self, record: Record) {
        match record {
            Record::Lease { lease } => self.lease = lease,
            Record::Inode(entry) => {
                self.next_generation = self.next_generation.max(entry.generation + 1);
                self.inodes.insert(entry.ino, entry);
            }
            Record::Forget { ino } => {
                self.inodes.remove(&ino);
            }
        }
    }
}

#[derive(Serialize, Deserialize)]
struct CheckpointFile {
    format: u32,
    lease: LeaseState,
    next_generation: u64,
    inodes: Vec<InodeEntry>,
}

/// The open metadata of one volume: appends go to the journal.
#[derive(Debug)]
pub(crate) struct MetaStore {
    dir: PathBuf,
    journal: File,
    records: usize,
}

/// Checks that a volume ID can name a directory: 1 to 128 bytes of `[A-Za-z0-9._-]`, not
/// starting with a dot.
pub fn validate_volume_id(volume_id: &str) -> Result<(), Error> {
    let invalid = |reason| Error::InvalidVolumeId {
        volume_id: volume_id.to_owned(),
        reason,
    };
    if volume_id.is_empty() || volume_id.len() > 128 {
        return Err(invalid("it must be 1 to 128 bytes long"));
    }
    if volume_id.starts_with('.') {
        return Err(invalid("it must not start with a dot"));
    }
    if !volume_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(invalid(
            "it may only hold letters, digits, '.', '_' and '-'",
        ));
    }
    Ok(())
}

/// The metadata directory of a volume.
pub(crate) fn volume_dir(state_dir: &Path, volume_id: &str) -> PathBuf {
    state_dir.join(VOLUMES).join(volume_id)
}

/// The identity stored for the volume in `dir`, if it has been created.
pub(crate) fn read_identity(dir: &Path) -> Result<Option<VolumeSpec>, Error> {
    let path = dir.join(IDENTITY);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("read", path, e)),
    };
    let file: IdentityFile = serde_json::from_slice(&text).map_err(|e| Error::Corrupt {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    if file.format != FORMAT {
        return Err(Error::Corrupt {
            path,
            reason: format!("unknown format version {}", file.format),
        });
    }
    Ok(Some(VolumeSpec {
        volume_id: file.volume_id,
        volume_generation: file.volume_generation,
        access_mode: file.access_mode,
    }))
}

/// Creates the volume's directories and identity, or checks an existing identity.
pub(crate) fn create(dir: &Path, spec: &VolumeSpec) -> Result<(), Error> {
    if let Some(existing) = read_identity(dir)? {
        if &existing != spec {
            return Err(Error::IdentityMismatch {
                existing,
                requested: spec.clone(),
            });
        }
        return Ok(());
    }
    std::fs::create_dir_all(dir.join(DATA)).map_err(|e| Error::io("create", dir, e))?;
    let parent = dir.parent().unwrap_or(dir);
    sync_dir(parent)?;
    let identity = IdentityFile {
        format: FORMAT,
        volume_id: spec.volume_id.clone(),
        volume_generation: spec.volume_generation,
        access_mode: spec.access_mode,
    };
    let text = serde_json::to_vec_pretty(&identity).map_err(|e| Error::Corrupt {
        path: dir.join(IDENTITY),
        reason: e.to_string(),
    })?;
    write_durably(&dir.join(IDENTITY), &text)
}

impl MetaStore {
    /// Opens the metadata in `dir`: reads the checkpoint, replays the journal (dropping a torn
    /// last line) and keeps the journal open for appends.
    pub(crate) fn open(dir: &Path) -> Result<(Self, Snapshot), Error> {
        let mut snapshot = Snapshot {
            next_generation: crate::inode::FIRST_GENERATION,
            ..Snapshot::default()
        };
        let checkpoint_path = dir.join(CHECKPOINT);
        match std::fs::read(&checkpoint_path) {
            Ok(text) => {
                let file: CheckpointFile =
                    serde_json::from_slice(&text).map_err(|e| Error::Corrupt {
                        path: checkpoint_path.clone(),
                        reason: e.to_string(),
                    })?;
                if file.format != FORMAT {
                    return Err(Error::Corrupt {
                        path: checkpoint_path,
                        reason: format!("unknown format version {}", file.format),
                    });
                }
                snapshot.lease = file.lease;
                snapshot.next_generation = file.next_generation;
                snapshot.inodes = file.inodes.into_iter().map(|e| (e.ino, e)).collect();
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("read", checkpoint_path, e)),
        }
        let journal_path = dir.join(JOURNAL);
        let mut journal = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&journal_path)
            .map_err(|e| Error::io("open", &journal_path, e))?;
        let mut text = Vec::new();
        journal
            .read_to_end(&mut text)
            .map_err(|e| Error::io("read", &journal_path, e))?;
        let (records, good_len) = parse_journal(&text).map_err(|reason| Error::Corrupt {
            path: journal_path.clone(),
            reason,
        })?;
        if good_len < text.len() {
            journal
                .set_len(good_len as u64)
                .and_then(|()| journal.sync_all())
                .map_err(|e| Error::io("truncate the torn tail of", &journal_path, e))?;
        }
        let count = records.len();
        for record in records {
            snapshot.apply(record);
        }
        Ok((
            Self {
                dir: dir.to_owned(),
                journal,
                records: count,
            },
            snapshot,
        ))
    }

    /// Appends one record and makes it durable before returning.
    pub(crate) fn append(&mut self, record: &Record) -> io::Result<()> {
        let mut line = serde_json::to_vec(record).map_err(io::Error::other)?;
        line.push(b'\n');
        self.journal.write_all(&line)?;
        self.journal.sync_data()?;
        self.records += 1;
        Ok(())
    }

    /// Appends one record without waiting for it to be durable; a later synced append or
    /// compaction makes it durable.
    pub(crate) fn append_unsynced(&mut self, record: &Record) -> io::Result<()> {
        let mut line = serde_json::to_vec(record).map_err(io::Error::other)?;
        line.push(b'\n');
        self.journal.write_all(&line)?;
        self.records += 1;
        Ok(())
    }

    /// How many records the journal holds since the last checkpoint.
    pub(crate) fn journal_records(&self) -> usize {
        self.records
    }

    /// Writes `snapshot` as the new checkpoint, then empties the journal.
    pub(crate) fn compact(&mut self, snapshot: &Snapshot) -> Result<(), Error> {
        let mut inodes: Vec<InodeEntry> = snapshot.inodes.values().cloned().collect();
        inodes.sort_by_key(|e| e.ino);
        let file = CheckpointFile {
            format: FORMAT,
            lease: snapshot.lease.clone(),
            next_generation: snapshot.next_generation,
            inodes,
        };
        let path = self.dir.join(CHECKPOINT);
        let text = serde_json::to_vec(&file).map_err(|e| Error::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        write_durably(&path, &text)?;
        let journal_path = self.dir.join(JOURNAL);
        self.journal
            .set_len(0)
            .and_then(|()| self.journal.sync_all())
            .map_err(|e| Error::io("truncate", journal_path, e))?;
        self.records = 0;
        Ok(())
    }
}

/// Parses journal text into records and the length of its intact prefix.
fn parse_journal(text: &[u8]) -> Result<(Vec<Record>, usize), String> {
    let mut records = Vec::new();
    let mut offset = 0;
    while offset < text.len() {
        let Some(newline) = text[offset..].iter().position(|&b| b == b'\n') else {
            // A torn last line: its append never completed, so nobody was answered for it.
            break;
        };
        let line = &text[offset..offset + newline];
        match serde_json::from_slice::<Record>(line) {
            Ok(record) => records.push(record),
            Err(e) if offset + newline + 1 == text.len() => {
                // The last line is complete but unreadable: treat it as torn as well.
                let _ = e;
                break;
            }
            Err(e) => return Err(format!("line at byte {offset}: {e}")),
        }
        offset += newline + 1;
    }
    Ok((records, offset))
}

/// Moves the volume's directory, whole, into the trash by one rename, and makes the move
/// durable in both directories. Returns the name of the trash entry, or `None` when the volume
/// has no directory. A crash before the rename leaves the volume as it was; one after it
/// leaves a trash entry that [`purge_trash`] removes.
pub(crate) fn move_to_trash(state_dir: &Path, volume_id: &str) -> Result<Option<OsString>, Error> {
    let volumes_path = state_dir.join(VOLUMES);
    let Some(volumes) = open_dir_if_exists(&volumes_path)? else {
        return Ok(None);
    };
    match rustix::fs::statat(&volumes, volume_id, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => {}
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(Error::io("inspect", volumes_path.join(volume_id), e.into())),
    }
    let trash_path = state_dir.join(TRASH);
    match std::fs::create_dir(&trash_path) {
        Ok(()) => sync_dir(state_dir)?,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io("create", &trash_path, e)),
    }
    let trash = open_dir(&trash_path)?;
    let mut suffix = [0u8; 8];
    rustix::rand::getrandom(&mut suffix, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| Error::io("draw a trash name for", &trash_path, e.into()))?;
    let name = OsString::from(format!("{volume_id}.{}", crate::hex::encode(&suffix)));
    rustix::fs::renameat_with(
        &volumes,
        volume_id,
        &trash,
        &name,
        rustix::fs::RenameFlags::NOREPLACE,
    )
    .map_err(|e| Error::io("move to the trash", volumes_path.join(volume_id), e.into()))?;
    durable::sync_dir(volumes.as_fd(), volume_id)
        .map_err(|e| Error::io(e.action(), &volumes_path, e.into_io_error()))?;
    durable::sync_dir(trash.as_fd(), &name)
        .map_err(|e| Error::io(e.action(), &trash_path, e.into_io_error()))?;
    Ok(Some(name))
}

/// Removes one entry of the trash with everything below it (symbolic links are removed, never
/// followed).
pub(crate) fn remove_from_trash(state_dir: &Path, name: &OsStr) -> Result<(), Error> {
    let path = state_dir.join(TRASH).join(name);
    let is_dir = match std::fs::symlink_metadata(&path) {
        Ok(metadata) => metadata.is_dir(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("inspect", path, e)),
    };
    let removed = if is_dir {
        std::fs::remove_dir_all(&path)
    } else {
        std::fs::remove_file(&path)
    };
    removed.map_err(|e| Error::io("remove", path, e))
}

/// Empties the trash: what a delete that crashed after its rename left behind. Returns the
/// names it removed.
pub(crate) fn purge_trash(state_dir: &Path) -> Result<Vec<OsString>, Error> {
    let trash_path = state_dir.join(TRASH);
    let entries = match std::fs::read_dir(&trash_path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("list", trash_path, e)),
    };
    let mut removed = Vec::new();
    for entry in entries {
        let name = entry
            .map_err(|e| Error::io("list", &trash_path, e))?
            .file_name();
        remove_from_trash(state_dir, &name)?;
        removed.push(name);
    }
    Ok(removed)
}

/// The directory `dir`, opened to write in it without following a symbolic link at its name.
fn open_dir(dir: &Path) -> Result<File, Error> {
    open_dir_if_exists(dir)?
        .ok_or_else(|| Error::io("open", dir, io::Error::from(io::ErrorKind::NotFound)))
}

/// [`open_dir`], or `None` when there is nothing at `dir`.
fn open_dir_if_exists(dir: &Path) -> Result<Option<File>, Error> {
    match rustix::fs::open(
        dir,
        rustix::fs::OFlags::RDONLY
            | rustix::fs::OFlags::DIRECTORY
            | rustix::fs::OFlags::NOFOLLOW
            | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        Ok(fd) => Ok(Some(File::from(fd))),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(Error::io("open", dir, e.into())),
    }
}

/// Writes a metadata file atomically and durably through the `durable` crate (temp file,
/// fsync, rename, fsync the directory; nothing followed through a symbolic link).
fn write_durably(path: &Path, contents: &[u8]) -> Result<(), Error> {
    let dir_path = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default();
    let dir = open_dir(dir_path)?;
    // Root's only: the checkpoint holds the lease and its mount epoch.
    let options = durable::Options {
        mode: 0o600,
        replace: durable::Replace::Yes,
    };
    durable::write(dir.as_fd(), name, contents, options)
        .map_err(|e| Error::io(e.action(), dir_path.join(e.name()), e.into_io_error()))?;
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), Error> {
    durable::sync_dir(open_dir(dir)?.as_fd(), ".")
        .map_err(|e| Error::io(e.action(), dir, e.into_io_error()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ino: u64, generation: u64) -> InodeEntry {
        InodeEntry {
            ino,
            generation,
            handle_type: 1,
            handle: "00ff".into(),
        }
    }

    #[test]
    fn journal_replays_over_checkpoint_and_survives_compaction() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, snapshot) = MetaStore::open(dir.path()).unwrap();
        assert_eq!(snapshot.next_generation, crate::inode::FIRST_GENERATION);
        store.append(&Record::Inode(entry(10, 5))).unwrap();
        store.append(&Record::Inode(entry(11, 6))).unwrap();
        store.append(&Record::Forget { ino: 10 }).unwrap();
        drop(store);
        let (mut store, snapshot) = MetaStore::open(dir.path()).unwrap();
        assert_eq!(snapshot.next_generation, 7);
        assert_eq!(snapshot.inodes.keys().copied().collect::<Vec<_>>(), [11]);
        store.compact(&snapshot).unwrap();
        store.append(&Record::Inode(entry(12, 7))).unwrap();
        drop(store);
        let (_, again) = MetaStore::open(dir.path()).unwrap();
        assert_eq!(again.next_generation, 8);
        assert_eq!(again.inodes.len(), 2);
    }

    #[test]
    fn torn_tail_is_dropped_but_middle_corruption_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = MetaStore::open(dir.path()).unwrap();
        store.append(&Record::Inode(entry(10, 5))).unwrap();
        drop(store);
        let journal = dir.path().join(JOURNAL);
        let mut text = std::fs::read(&journal).unwrap();
        text.extend_from_slice(b"{\"record\":\"ino");
        std::fs::write(&journal, &text).unwrap();
        let (_, snapshot) = MetaStore::open(dir.path()).unwrap();
        assert_eq!(snapshot.inodes.len(), 1);
        let good = std::fs::read(&journal).unwrap();
        std::fs::write(&journal, [b"garbage\n".as_slice(), &good].concat()).unwrap();
        assert!(matches!(
            MetaStore::open(dir.path()),
            Err(Error::Corrupt { .. })
        ));
    }

    #[test]
    fn reads_a_version_one_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(CHECKPOINT),
            br#"{"format":1,"lease":{"holder":{"node":"n1","epoch":"0101010101010101010101010101010101","expires_at_ms":5},"floor_ms":3,"retired":[]},"next_generation":9,"inodes":[{"ino":12,"generation":4,"handle_type":1,"handle":"0a0b"}]}"#,
        )
        .unwrap();
        assert!(
            MetaStore::open(dir.path()).is_err(),
            "a 17-byte epoch is refused"
        );
        std::fs::write(
            dir.path().join(CHECKPOINT),
            br#"{"format":1,"lease":{"holder":{"node":"n1","epoch":"01010101010101010101010101010101","expires_at_ms":5},"floor_ms":3,"retired":[]},"next_generation":9,"inodes":[{"ino":12,"generation":4,"handle_type":1,"handle":"0a0b"}]}"#,
        )
        .unwrap();
        let (_, snapshot) = MetaStore::open(dir.path()).unwrap();
        assert_eq!(snapshot.lease.floor_ms(), 3);
        assert_eq!(snapshot.lease.holder().unwrap().node, "n1");
        assert_eq!(snapshot.inodes[&12].generation, 4);
    }

    #[test]
    fn volume_ids_are_validated() {
        for bad in ["", ".", "..", ".hidden", "a/b", "a b", &"x".repeat(129)] {
            assert!(validate_volume_id(bad).is_err(), "{bad:?}");
        }
        validate_volume_id("pvc-1234.abc_DEF").unwrap();
    }
}
