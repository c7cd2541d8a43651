//! The local CSI driver's volume store: plain directories on a node's disk, each described by a
//! durable JSON record, laid out as DESIGN.md section 3.2 specifies.
//!
//! The store promises three things, and its tests check each one:
//!
//! - a volume's data is exactly where its record says (`<store>/<volume-id>/`), and a volume ID
//!   is derived from the node name and the CSI volume name alone ([`VolumeId`]);
//! - a crash at any moment neither loses a ready volume nor leaves an orphan: every record write
//!   goes through one durable helper (temp file, fsync, rename, fsync the directory), and
//!   opening the store reconciles interrupted creates and deletes ([`Reconciliation`]);
//! - it never writes into an unmounted disk's empty mount point: a missing data directory is
//!   reported and refused, never recreated, and [`StoreOptions::require_mount`] refuses to open
//!   a store that is not the root of its own filesystem.
//!
//! It also keeps trusted-consumer claims ([`Store::claim`]), answers capacity questions
//! ([`Store::capacity`]) and refuses concurrent operations on one volume ([`Error::Busy`]).
//!
//! What it does not do: it speaks no gRPC and knows no CSI messages (the driver maps
//! [`ErrorKind`] to status codes and fills [`Capability`] from CSI capabilities); it never mounts
//! or unmounts (the `mounter` crate does), never provisions, formats or resizes disks, and
//! enforces no quotas: capacity is a snapshot of free space, not a reservation.
//!
//! ```
//! use localstore::{Capability, CapacityRange, CreateRequest, Store, StoreOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! // A store root must be an absolute directory owned by root (or by the driver user), not
//! // writable by group or others.
//! let store = Store::open(dir.path(), StoreOptions::new("node-a"))?;
//!
//! let request = CreateRequest::new("pvc-1", Capability::mount("SINGLE_NODE_WRITER"))
//!     .with_capacity(CapacityRange::at_least(1024));
//! let volume = store.create(&request)?;
//! assert_eq!(store.create(&request)?, volume); // idempotent on the name
//! assert!(store.publish_path(&volume.volume_id)?.is_dir());
//!
//! store.delete(&volume.volume_id)?;
//! store.delete(&volume.volume_id)?; // deleting a missing volume is success
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod crash;
mod error;
mod fsio;
mod id;
mod layout;
mod reconcile;
mod record;
mod store;

#[cfg(feature = "testing")]
pub use crash::CrashHook;
pub use crash::CrashPoint;
pub use error::{Error, ErrorKind};
pub use id::{MAX_NAME_BYTES, MAX_NODE_NAME_BYTES, NameHash, NodeHash, VolumeId, validate_name};
pub use layout::{LOCK_FILE, METADATA_DIR};
pub use reconcile::{LeftInPlace, Reconciliation, Unreadable};
pub use record::{
    Capability, CapacityRange, ConsumerClaim, CreateRequest, FORMAT_VERSION, MAX_PARAMETER_BYTES,
    VolumeRecord, VolumeState, record_roundtrip_check,
};
pub use store::{Capacity, DEFAULT_DATA_DIR_MODE, Store, StoreOptions, Usage, VolumeGuard};

/// The pure check behind [`StoreOptions::require_mount`], exported for tests and audits: why the
/// mount table `mountinfo` (the bytes of a `/proc/<pid>/mountinfo`) says `store` is not the root
/// of its own filesystem, or `None` when it is.
pub fn own_mount_problem(
    mountinfo: &[u8],
    store: &std::path::Path,
) -> Result<Option<String>, Error> {
    let store = layout::normalize(store)?;
    let table = mountinfo::MountTable::parse(mountinfo).map_err(|source| Error::MountTable {
        path: store.clone(),
        source,
    })?;
    Ok(layout::own_mount_problem(&table, &store))
}
