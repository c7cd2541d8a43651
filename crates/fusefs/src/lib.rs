//! The replicated volume's FUSE filesystem.
//!
//! Applications see a replicated volume as an ordinary directory. Every kernel request becomes
//! one or more calls of the worker protocol ([`lease_client`]), which attaches the volume's
//! identity, a request ID and the mount epoch, and which owns the call budget, retries and
//! endpoint choice. The crate has two layers:
//!
//! - [`Fs`], a plain type with one async method per FUSE operation. It keeps the kernel's node
//!   table (node ID = the worker's inode number, FUSE generation = the worker's inode
//!   generation, so nothing depends on this process's memory), open handles and their renewal.
//!   It answers with its own types ([`Entry`], [`Stat`], [`Opened`], [`DirEntryPlus`] ...),
//!   none of them a FUSE library's, and fails with an [`Error`] that keeps its cause (the
//!   client's error, a stale node, a malformed reply naming its operation, an interruption);
//!   [`Error::errno`] is the one mapping to an errno (a call's through [`errno_of`], except
//!   that an unanswered read-only call is `ETIMEDOUT` even when the client calls it
//!   uncertain), clamped to the range the kernel accepts. It is tested without `/dev/fuse`.
//! - [`FuseAdapter`], the [`fuse_session::Handler`]: each request goes to the one `Fs` method
//!   it names, and the answer is encoded with [`fuse_wire::reply`] (the one place the core's
//!   types meet the wire's). A failure is logged once, at a level that fits its
//!   [`ErrorClass`] (a worker outage is a warning, a malformed reply an error, `ENOENT` a
//!   debug line), and counted as `fusefs_errors_total{operation, class}`.
//!
//! [`mount`] mounts a volume as root without a helper binary (filesystem type
//! `fuse.tak-os-replicated`, source = the volume ID, `default_permissions`, `allow_other`,
//! `nosuid`, `nodev`, direct I/O on every open, zero entry and attribute lifetimes, 1 MiB per
//! read or write request, which `Fs` sends to the workers as concurrent calls of
//! [`FsConfig::call_data_bytes`]) and returns a [`Mounted`] that owns the FUSE session and
//! what the mounted volume needs running (the renewal of its open handles).
//! [`Mounted::unmount`] refuses while bind mounts of the volume remain and checks the mount's
//! identity before unmounting; [`abort_connection`] is for a connection known dead.
//! [`Fs::state`] gives the nodes and open handles the kernel holds as data ([`MountState`]).
//!
//! A mount can change hands without being unmounted: [`Mounted::pause`] stops reading, lets
//! the requests in flight finish, and hands back the live connection (its `/dev/fuse`
//! descriptor and INIT record) in a [`HandOver`]; [`adopt`] serves such a connection, in this
//! process or another, without a second INIT.
//!
//! Where a mount's tasks run decides how many threads each request wakes: [`ServingThreads`]
//! gives each mount one thread with a single-threaded runtime, on which its session, its
//! requests and its worker connections take turns.
//!
//! The FUSE session is this project's own ([`fuse_session`], over the wire format of
//! [`fuse_wire`]); until the owner hand-off work it was the `fuse3` crate, which cannot pause,
//! hand over or adopt a connection and unmounts when its handle is dropped.
//!
//! What the filesystem supports and why is in `SEMANTICS.md` beside this crate.
//!
//! What it does not do: it does not claim or renew the mount lease (the node's mount owner does,
//! with [`lease_client::MountLease`]), it caches nothing, and it has no locks or shared mmap.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use fusefs::{Fs, FsConfig};
//!
//! # async fn example<T: lease_client::Transport>(client: lease_client::Client<T>) -> Result<(), Box<dyn std::error::Error>> {
//! // `client` was built for the volume (and, for RWO, carries the epoch of a claimed lease).
//! // A new connection draws its nonce, from which every call's request ID is derived.
//! let fs = Arc::new(Fs::new(client, FsConfig::default())?);
//! // Mounting also starts the renewal of the handles the mount opens.
//! let mut mounted = fusefs::mount(fs, "v1.volume", std::path::Path::new("/staging/path")).await?;
//! // What the kernel holds, as data: nodes with their inode generations, open handles.
//! let state = mounted.fs().state();
//! assert_eq!(state.nodes[0].node, fusefs::ROOT_NODE);
//! // ... later, after every bind of it is gone (this also stops the renewal):
//! mounted.unmount(std::time::Duration::from_secs(15)).await?;
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

mod adapter;
mod attr;
mod errno;
mod error;
mod fs;
mod mount;
mod nodes;
mod reply;
mod service;
#[cfg(feature = "testing")]
pub mod testing;
mod threads;

pub use adapter::FuseAdapter;
pub use errno::{Errno, MAX_ERRNO, errno_of};
pub use error::{Error, ErrorClass};
pub use fs::{
    CallObserver, Caller, ConnectionNonce, FUSE_WRITE_KILL_SUIDGID, Fs, FsConfig, HandleState,
    MAX_RESEND_RULES, MountState, ObservedCall, PARALLEL_CALLS, PlusListing, ROOT_NODE, Recorded,
    ResendRule, TTL, TableChange, WriteAhead, WriteFlags,
};
pub use mount::{
    AdoptFailed, FS_TYPE, FUSECTL, HandOver, MountError, Mounted, PauseFailed, SUBTYPE,
    abort_connection, adopt, mount, mount_on,
};
pub use nodes::NodeState;
pub use reply::{
    Attributes, Created, DirEntry, DirEntryPlus, Entry, FileKind, Opened, SetAttrs, SetTime, Stat,
    StatFs, Timestamp,
};
pub use service::FileService;
pub use threads::ServingThreads;
