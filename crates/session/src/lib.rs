//! RWO session records for the replicated node (DESIGN.md 3.3): one small JSON file,
//! `<staging_target_path>.rwo-session`, that says which volume, generation and node a staged
//! FUSE mount belongs to, which worker endpoints it talks to, the mount epoch of its claim, and
//! whether NodeStageVolume finished.
//!
//! The crate promises:
//!
//! - **durable, atomic writes**: every write goes through one helper (temp file created with
//!   `O_EXCL` and mode 0600, write, fsync, rename, fsync the directory), and
//!   [`SessionFile::create_pending`] returns only once the record is durable, so the claim is
//!   sent after, never before; a crash leaves the old record or the new one;
//! - **rejected, never repaired**: a symlink at the record's name (never followed), another
//!   owner, a mode wider than 0600, extra hard links, an oversized file, an unknown format
//!   version or field, or a record naming another volume, generation or node is an error that
//!   says which check failed, and the file is left as it is;
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
//! use tak_os_session::{CreateOutcome, MountEpoch, SessionFile, SessionIdentity, SessionRecord};
//!
//! # fn main() -> Result<(), tak_os_session::Error> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let staging = dir.path().join("globalmount");
//! let identity = SessionIdentity::new("vol-1", 7, "node-a");
//! let file = SessionFile::open(&staging)?; // the record is `<staging>.rwo-session`
//! assert_eq!(file.load(&identity)?, None);
//!
//! let epoch = MountEpoch::from_bytes([0x5a; 16]); // drawn at random by the caller
//! let record = SessionRecord::pending(
//!     identity.clone(),
//!     vec!["https://worker-1:7443".to_owned()],
//!     epoch,
//! )?;
//! assert_eq!(file.create_pending(&record)?, CreateOutcome::Created);
//! // ... the record is durable: send the claim with `epoch`, mount ...
//!
//! // A retried NodeStageVolume resumes the first attempt's session.
//! let retry = SessionRecord::pending(
//!     identity.clone(),
//!     vec!["https://worker-1:7443".to_owned()],
//!     MountEpoch::from_bytes([0x11; 16]),
//! )?;
//! assert_eq!(file.create_pending(&retry)?, CreateOutcome::Existing(record));
//!
//! assert!(file.mark_stage_completed(&identity, epoch)?.stage_completed());
//! assert!(file.load(&identity)?.is_some_and(|r| r.stage_completed()));
//!
//! // Another generation of the volume is refused, not repaired.
//! let other = SessionIdentity::new("vol-1", 8, "node-a");
//! assert!(file.load(&other).is_err());
//!
//! assert!(file.remove(&identity)?);
//! assert!(!file.remove(&identity)?); // removing a missing record is success
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
pub use path::{RECORD_SUFFIX, SessionPath};
pub use record::{
    AccessMode, FORMAT_VERSION, MAX_ENDPOINT_BYTES, MAX_ENDPOINTS, MAX_ID_BYTES, MAX_RECORD_BYTES,
    SessionIdentity, SessionRecord, parse, render,
};

/// The invariant the `session_record_parse` fuzz target asserts, exported so this crate's own
/// tests exercise it too: any input either parses, renders within
/// [`MAX_RECORD_BYTES`], parses back to the same record and renders to the same bytes again,
/// or is refused as corrupt, never with a panic.
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
