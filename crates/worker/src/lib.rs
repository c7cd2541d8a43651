//! The reference worker of TAK-OS storage: the executable specification of the worker side of
//! the wire protocol (DESIGN.md 3.4), for tests and demos.
//!
//! One leader process holds each volume's state in a backing directory and applies every
//! operation of that volume in one order, on one thread per volume (the apply loop). What the
//! real workers are specified to do, it does:
//!
//! - **Fencing.** Every read and every mutation of an RWO volume (open, release and handle
//!   renewal included) is checked against the current mount epoch in committed order. The
//!   lease is a pure state machine ([`lease::LeaseState`]) whose every change is journaled and
//!   fsynced before the reply is sent, so a restarted worker keeps ownership; lease time is the
//!   worker's clock clamped by a durable command-time floor, so a clock stepping backwards
//!   never extends a lease; an expired epoch never renews or reacquires; release is idempotent
//!   and never clears a successor.
//! - **Exactly-once mutations.** Successful mutations are remembered by request ID in a bounded
//!   reply cache; a retry gets the cached reply, and only after the epoch check.
//! - **Stable file identity.** Inode numbers are the backing filesystem's (the root is always
//!   [`ROOT_INO`]) and inode generations are journaled, so both survive a restart, and a reused
//!   inode number gets a new generation. Files are opened by file handle, never by walking a
//!   path, and no symbolic link is ever followed. Tests and unprivileged experiments can
//!   instead reopen files through descriptors the worker keeps ([`Reopen::ByDescriptor`]).
//! - **Handles.** Open handles carry leases; expired ones are reclaimed in expiry order.
//! - **A group, honestly small.** Follower endpoints (the same binary with
//!   [`Role::Follower`]) hold no state: they answer NOT_LEADER with a hint naming the leader,
//!   or NO_QUORUM while they cannot reach it.
//! - **Faults on demand** ([`Faults`]): dropped or delayed replies, a hanging endpoint,
//!   minority refusal, and a restart that reloads every volume from disk.
//! - **Volumes created and deleted** by the manager's stand-in: in-process through a cloneable
//!   [`Admin`] handle ([`Server::admin`]), or over HTTPS ([`ADMIN_VOLUMES_PATH`],
//!   [`ADMIN_DELETE_VOLUME_PATH`]). Creates and deletes of a leader are serialized. A delete
//!   takes the volume out of service at once (new calls get UNKNOWN_VOLUME, queued ones are
//!   refused, none hangs), stops its apply loop, then moves its directory into a trash
//!   directory by one rename and removes it there: a crash leaves the volume whole or a trash
//!   entry that the next start removes. A later create of the same ID starts empty.
//!
//! All of it is served over HTTPS (TLS 1.3 with rustls and `ring`, client certificates from a
//! configured CA, bearer tokens compared in constant time, bodies limited while they are read).
//!
//! What it does not do: replicate (there is one copy, on the leader's disk), forward calls from
//! followers, keep open handles or the reply cache across a restart, or manage volumes beyond
//! creating and deleting them (no resizing, snapshots, capacity limits or listing: the admin
//! calls stand in for the manager, which owns the rest). Opening files by handle (the
//! default, [`Reopen::ByHandle`]) needs `CAP_DAC_READ_SEARCH`; both ways need a filesystem
//! that supports file handles (ext4, xfs, btrfs, tmpfs).
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use worker::{AccessMode, Config, Server, SystemClock, TlsMaterial, Tokens, VolumeSpec};
//!
//! # async fn example() -> Result<(), worker::Error> {
//! let tls = TlsMaterial::from_files(
//!     "server.pem".as_ref(),
//!     "server.key".as_ref(),
//!     "ca.pem".as_ref(),
//! )?;
//! let mut config = Config::new("127.0.0.1:0".parse().unwrap(), "/var/lib/tak-os-worker", tls);
//! config.volumes.push(VolumeSpec {
//!     volume_id: "pvc-1".into(),
//!     volume_generation: 1,
//!     access_mode: AccessMode::Rwo,
//! });
//! let server = Server::start(config, Tokens::new(["s3cret"]), Arc::new(SystemClock)).await?;
//! println!("serving on {}", server.endpoint());
//! server.stop().await;
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

mod admin;
mod auth;
mod clock;
mod config;
mod dedup;
mod error;
mod faults;
mod fsops;
mod handles;
mod hex;
mod inode;
pub mod lease;
mod listing;
mod meta;
mod server;
mod sys;
#[cfg(feature = "testing")]
pub mod testing;
mod tls;
mod volume;

pub use admin::{Admin, Deleted};
pub use auth::Tokens;
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{AccessMode, Config, Reopen, Role, Timings, VolumeSpec};
pub use error::Error;
pub use faults::{Arrival, FaultSettings, Faults, StandIn};
pub use inode::{ROOT_GENERATION, ROOT_INO};
pub use meta::validate_volume_id;
pub use server::{ADMIN_DELETE_VOLUME_PATH, ADMIN_FAULTS_PATH, ADMIN_VOLUMES_PATH, Server, run};
pub use tls::TlsMaterial;
