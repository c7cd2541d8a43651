//! The FUSE keeper and the owner's side of it.
//!
//! A FUSE connection lives as long as any copy of its `/dev/fuse` descriptor is open. The
//! keeper (`tak-os-node --keeper`, a process of its own) holds a copy of every stage's
//! descriptor, deposited by the owner over a root-only Unix socket ([`protocol`]). When the
//! owner is told to stop (SIGTERM), it stops reading its connections, lets the requests in
//! flight finish, and hands each stage over: a final deposit with the stage's node and handle
//! tables. It then exits without unmounting, and the next owner process takes every handed-over
//! stage back and serves it without a new INIT, with the same RWO lease epoch. Applications see
//! a pause, not an error.
//!
//! While an owner serves a stage, it writes every node and open handle it hands the kernel
//! ahead to the keeper ([`protocol::Request::Journal`], [`tables`]) before the reply that
//! hands it over, so the keeper's tables always hold what the kernel may name.
//!
//! An owner that goes without handing over (SIGKILL, OOM) leaves its requests unanswered. When
//! the kernel can resend them (`FUSE_NOTIFY_RESEND`), the keeper keeps the stage for a
//! successor until deadline D; the successor takes it over with the tables written ahead and
//! has the kernel resend what the dead owner had read. At D, with `--no-resend`, or on an older
//! kernel, the keeper drops that owner's copies instead, which ends those connections (callers
//! get `ENOTCONN`, and NodeUnpublishVolume and NodeUnstageVolume clean up) rather than leaving
//! callers waiting. If the keeper restarts, the owner deposits every stage again.
//!
//! Why a keeper of its own rather than the frontend, and its privileges:
//! `bins/tak-os-node/HANDOFF.md`.

pub mod client;
pub mod protocol;
pub mod server;
pub mod tables;

pub use client::{Fetched, KeeperError, KeeperLink};
pub use server::{KeeperOptions, run_keeper};
