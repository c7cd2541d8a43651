//! The client side of the TAK-OS worker protocol: the wire messages, an HTTPS transport with
//! call budgets, retries and endpoint rotation, and the RWO mount lease.
//!
//! - [`v1`] holds the `takos.worker.v1` messages generated from `proto/worker.proto` (checked
//!   in; a test fails when regenerating would change them). [`protocol`] adds typed identities
//!   ([`protocol::RequestId`], [`protocol::MountEpoch`], [`protocol::VolumeGeneration`],
//!   [`protocol::FileId`]), the limits, and encoding and never-panicking decoding for both
//!   ends of the wire.
//!
//! What this crate does not do: serve the protocol (that is the worker's job), read
//! credentials from anywhere (callers hand it a snapshot), or install a metrics exporter.
//!
//! # Example
//!
//! ```
//! use lease_client::protocol::{self, FileId, RequestId, ROOT_INO};
//! use lease_client::v1;
//!
//! let request = v1::Request {
//!     volume_id: "vol-a".into(),
//!     volume_generation: 1,
//!     request_id: RequestId([7; 16]).0.to_vec(),
//!     mount_epoch: Vec::new(),
//!     access_mode: v1::AccessMode::Rwx.into(),
//!     op: Some(v1::request::Op::Getattr(v1::GetattrRequest {
//!         file: Some(FileId { ino: ROOT_INO, inode_generation: 0 }.into()),
//!         handle: None,
//!     })),
//! };
//! let body = protocol::encode_request(&request);
//! let decoded = protocol::decode_request(&body).unwrap();
//! assert_eq!(decoded.op.name(), "getattr");
//! ```
#![deny(missing_docs)]

mod client;
mod config;
mod endpoint;
mod error;
mod lease;
pub mod metrics;
pub mod policy;
pub mod protocol;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod transport;

pub use client::{Client, ClientConfig, PreparedCall};
pub use config::{Budgets, LeaseConfig};
pub use endpoint::EndpointSet;
pub use error::{Error, Refusal};
pub use lease::{
    LeaseGrant, LeaseStatus, LossReason, MountLease, ReleaseOutcome, RenewalSchedule, RenewalStep,
    RenewalTask,
};
pub use transport::{Credentials, HttpsTransport, Transport, TransportError};

/// The `takos.worker.v1` package, generated from `proto/worker.proto`.
///
/// prost names messages as structs, oneofs as enums in a module named after their message
/// (`request::Op`, `reply::Result`), and enums without their prefix (`ErrorKind::StaleEpoch`).
#[allow(missing_docs, clippy::all, unreachable_pub, unused_qualifications)]
pub mod v1 {
    include!("generated/takos.worker.v1.rs");
}
