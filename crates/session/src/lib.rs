//! Session records for the replicated node (DESIGN.md 3.3): one small JSON file beside every
//! staging path that says which volume, generation and node a staged FUSE mount belongs to,
//! which worker endpoints it talks to, and whether NodeStageVolume finished, so that a
//! restarted mount owner knows every stage it is responsible for without walking a directory.
//!
//! The record's name says the session's [`AccessMode`]:
//!
//! - `<staging_target_path>.rwo-session`: an RWO session, which also holds the mount epoch of
//!   its lease claim ([`SessionRecord::pending_rwo`]);
//! - `<staging_target_path>.rwx-session`: an RWX session, which has no lease and so no epoch
//!   ([`SessionRecord::pending_rwx`]).
//!
//! A staging path has at most one of the two. [`SessionFile::load`] and
//! [`SessionFile::remove`] find whichever exists; a request of one access mode where a record
//! of the other exists is refused with [`ErrorKind::Incompatible`] (CSI `ALREADY_EXISTS`),
//! and both names at once is [`ErrorKind::Corrupt`]. RWO records are written as format
//! version 1, exactly as before RWX records existed, and RWX records as version 2; see
//! [`FORMAT_VERSION`] for why.
//!
//! The crate promises:
//!
//! - **durable, atomic writes**: every write goes through one helper (temp file created with
//!   `O_EXCL` and mode 0600, write, fsync, rename, fsync the directory), and
//!   [`SessionFile::create_pending`] returns only once the record is durable, so an RWO claim
//!   is sent after, never before; a crash leaves the old record or the new one;
//! - **rejected, never repaired**: a symlink at either record name (never followed), another
//!   owner, a mode wider than 0600, extra hard links, an oversized file, an unknown format
//!   version or field, a record whose content is not of its name's access mode, or a record
//!   naming another volume, generation or node is an error that says which check failed, and
//!   the file is left as it is;
//! - **no secrets**: a record has no field for TLS material or tokens, the parser refuses
//!   unknown fields, and an endpoint cannot carry user information, a query or a fragment.
//!
//! What it does not do: it does not generate epochs, send claims, mount, or lock. The caller
//! draws the epoch, talks to the workers, and serialises operations on one staging path. It
//! never prints or logs, and never looks at the staging path itself (it may be a dead FUSE
//! mount): only at its parent directory.
//!
//! [`parse`] and [`render`] are the pure core; [`roundtrip_check`] is the invariant the fuzz
//! target asserts.
//!
//! ```
//! use tak_os_session::{
//!     AccessMode, CreateOutcome, MountEpoch, SessionFile, SessionIdentity, SessionRecord,
//! };
//!
//! # fn main() -> Result<(), tak_os_session::Error> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let staging = dir.path().join("globalmount");
//! let identity = SessionIdentity::new("vol-1", 7, "node-a");
//! let endpoints = vec!["https://worker-1:7443".to_owned()];
//! let file = SessionFile::open(&staging)?;
//! assert_eq!(file.load(&identity)?, None);
//!
//! // RWO: the record is `<staging>.rwo-session` and holds the claim's epoch.
//! let epoch = MountEpoch::from_bytes([0x5a; 16]); // drawn at random by the caller
//! let record = SessionRecord::pending_rwo(identity.clone(), endpoints.clone(), epoch)?;
//! assert_eq!(file.create_pending(&record)?, CreateOutcome::Created);
//! // NodeUnstageVolume knows no generation: it reads the record and compares what it knows.
//! assert_eq!(file.read()?.map(|r| r.identity().clone()), Some(identity.clone()));
//! // ... the record is durable: send the claim with `epoch`, mount ...
//!
//! // A retried NodeStageVolume resumes the first attempt's session.
//! let retry = SessionRecord::pending_rwo(
//!     identity.clone(),
//!     endpoints.clone(),
//!     MountEpoch::from_bytes([0x11; 16]),
//! )?;
//! assert_eq!(file.create_pending(&retry)?, CreateOutcome::Existing(record));
//!
//! // The same volume asked for as RWX at this staging path is an incompatible repeat.
//! let rwx = SessionRecord::pending_rwx(identity.clone(), endpoints.clone())?;
//! let e = file.create_pending(&rwx).unwrap_err();
//! assert_eq!(e.kind(), tak_os_session::ErrorKind::Incompatible);
//!
//! assert!(file.mark_stage_completed(&identity, Some(epoch))?.stage_completed());
//! // A restarted owner learns the access mode (and epoch) from the record.
//! let loaded = file.load(&identity)?.expect("a record");
//! assert_eq!(loaded.access_mode(), AccessMode::ReadWriteOnce);
//! assert_eq!(loaded.epoch(), Some(epoch));
//!
//! // Another generation of the volume is refused, not repaired.
//! let other = SessionIdentity::new("vol-1", 8, "node-a");
//! assert!(file.load(&other).is_err());
//!
//! assert!(file.remove(&identity)?);
//! assert!(!file.remove(&identity)?); // removing a missing record is success
//!
//! // RWX: the record is `<staging>.rwx-session`, with no epoch anywhere.
//! assert_eq!(file.create_pending(&rwx)?, CreateOutcome::Created);
//! assert!(file.path().record(AccessMode::ReadWriteMany).exists());
//! let completed = file.mark_stage_completed(&identity, rwx.epoch())?;
//! assert_eq!(completed.epoch(), None);
//! assert!(file.remove(&identity)?);
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod checked;
mod epoch;
mod error;
mod file;
mod path;
mod record;

pub use epoch::MountEpoch;
pub use error::{Error, ErrorKind};
pub use file::{CreateOutcome, SessionFile};
pub use path::{RWO_RECORD_SUFFIX, RWX_RECORD_SUFFIX, SessionPath};
pub use record::{
    AccessMode, FORMAT_VERSION, MAX_ENDPOINT_BYTES, MAX_ENDPOINTS, MAX_ID_BYTES, MAX_RECORD_BYTES,
    SessionIdentity, SessionRecord, parse, render,
};

/// The invariant the `session_record_parse` fuzz target asserts, exported so this crate's own
/// tests exercise it too: any input, of either access mode and any format version, either
/// parses, renders within [`MAX_RECORD_BYTES`], parses back to the same record and renders to
/// the same bytes again, or is refused as corrupt, never with a panic. (The input's own bytes
/// need not come back: a version-2 RWO record renders as version 1.)
///
/// # Panics
///
/// When the invariant does not hold.
pub fn roundtrip_check(input: &[u8]) {
    let record = match parse(input) {
        Ok(record) => record,
        Err(e) => {
            assert!(
                e.kind() == ErrorKind::Corrupt,
                "parse refused input with a non-corrupt error: {e}"
            );
            return;
        }
    };
    let rendered = render(&record);
    assert!(
        rendered.len() as u64 <= MAX_RECORD_BYTES,
        "a valid record renders to {} bytes",
        rendered.len()
    );
    let again = match parse(&rendered) {
        Ok(again) => again,
        Err(e) => panic!(
            "rendered record does not parse: {e}: {}",
            rendered.escape_ascii()
        ),
    };
    assert_eq!(again, record, "rendered record parses to different values");
    assert!(render(&again) == rendered, "rendering is not stable");
}
