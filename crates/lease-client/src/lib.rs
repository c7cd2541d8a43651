//! The client side of the TAK-OS worker protocol: the wire messages, an HTTPS client that
//! keeps each logical call within its budget, and the RWO mount lease.
//!
//! - **Protocol.** The wire protocol lives in the `tak-os-worker-proto` crate (no I/O);
//!   it is re-exported here as [`protocol`] (typed identities such as
//!   [`protocol::RequestId`] and [`protocol::MountEpoch`], limits, encoding and decoding) and
//!   [`v1`] (the generated `takos.worker.v1` messages), so a client needs no second import.
//! - **Calls.** A [`Client`] serves one volume. Each logical call is encoded once
//!   ([`PreparedCall`]) and every attempt sends the identical bytes and request ID. The
//!   decisions (attempt deadlines, jittered backoff, rotation among the staged endpoints on
//!   transport failure, hints followed only when they name a staged endpoint, and the
//!   [`Error::Uncertain`] outcome when the budget ends after an attempt that may have been
//!   delivered) are a pure state machine inside the crate, tested on its own. At most
//!   [`Budgets::max_in_flight`] calls run at once; the next caller waits inside its own
//!   budget and fails with [`Error::Busy`] when it ends.
//! - **Transport.** [`HttpsTransport`] speaks HTTP/2 (or HTTP/1.1) over TLS 1.3 with a client
//!   certificate and a bearer token, verifying the worker against a CA bundle that may hold
//!   several certificates. [`Credentials`] are swapped while calls are in flight. The
//!   [`Transport`] trait is the network boundary; the `testing` feature adds a stateful fake
//!   worker group with fault injection (`testing::FakeTransport`).
//! - **Mount lease.** [`MountLease`] claims, renews and releases an RWO volume's lease and
//!   spawns the renewal task ([`RenewalTask`]), whose timing is a pure schedule inside the
//!   crate. A release has its own budget and ends
//!   [`ReleaseOutcome::Deferred`] when it cannot finish.
//! - **Metrics** go through the `metrics` facade; [`metrics`] lists the names and labels.
//!
//! Every duration is configuration ([`Budgets`], [`LeaseConfig`]) with the protocol's
//! defaults, and `scaled` shortens them all for tests while keeping their proportions.
//!
//! What this crate does not do: serve the protocol (the worker does), read credentials from
//! anywhere (callers hand it PEM), persist the session record (the `session` crate does),
//! map errors to errnos or gRPC statuses (each caller's boundary does), or install a metrics
//! recorder. It never retries an uncertain call under a new request ID on its own.
//!
//! # Example
//!
//! Claim an RWO volume's lease, keep it renewed, and make a file call under its epoch:
//!
//! ```no_run
//! use tak_os_lease_client::protocol::{
//!     AccessMode, FileId, MountEpoch, ROOT_INO, ROOT_INODE_GENERATION, VolumeGeneration,
//! };
//! use tak_os_lease_client::v1::{self, request::Op};
//! use tak_os_lease_client::{
//!     Budgets, Client, ClientConfig, Credentials, EndpointSet, HttpsTransport, LeaseConfig,
//!     LeaseStatus, MountLease, ReleaseOutcome,
//! };
//!
//! # async fn run(token: &str, ca: &[u8], cert: &[u8], key: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
//! let budgets = Budgets::default();
//! let credentials = Credentials::from_pem(token, ca, cert, key)?;
//! let client = Client::new(
//!     ClientConfig {
//!         volume_id: "vol-1".into(),
//!         volume_generation: VolumeGeneration(4),
//!         access_mode: AccessMode::Rwo,
//!         endpoints: EndpointSet::new(["w1.example:7443", "w2.example:7443"])?,
//!         budgets,
//!     },
//!     HttpsTransport::with_credentials(&budgets, &credentials),
//! );
//!
//! // The epoch is written to the session record (durably) before the claim is sent.
//! let lease = MountLease::new(&client, MountEpoch::random()?, "node-a", LeaseConfig::default());
//! let claim = lease.prepare_claim()?;
//! let grant = lease.claim(&claim).await?; // after Error::Uncertain: send `claim` again
//! let mut renewal = lease.spawn_renewal(grant);
//!
//! // File calls go through the lease's client, which stamps the epoch.
//! let getattr = Op::Getattr(v1::GetattrRequest {
//!     file: Some(FileId { ino: ROOT_INO, inode_generation: ROOT_INODE_GENERATION }.into()),
//!     handle: None,
//! });
//! match lease.client().call(getattr).await? {
//!     v1::reply::Result::Getattr(entry) => println!("root mode {:o}", entry.attr.unwrap_or_default().mode),
//!     other => println!("unexpected {}", other.name()),
//! }
//!
//! // Credentials rotate without dropping calls in flight.
//! lease.client().transport().set_credentials(&credentials.with_token("next-token")?);
//!
//! // Later: either the lease is lost (stop using the volume) or the volume is unstaged.
//! if let LeaseStatus::Lost(reason) = renewal.status() {
//!     println!("lease lost: {reason:?}");
//! }
//! renewal.stop().await;
//! if let ReleaseOutcome::Deferred { error } = lease.release().await {
//!     println!("release deferred, the lease will expire: {error}");
//! }
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod client;
mod config;
mod endpoint;
mod error;
mod lease;
pub mod metrics;
mod policy;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod transport;

pub use client::{Client, ClientConfig, PreparedCall};
pub use config::{Budgets, LeaseConfig};
pub use endpoint::EndpointSet;
pub use error::{ConfigError, Error, Refusal};
pub use lease::{LeaseGrant, LeaseStatus, LossReason, MountLease, ReleaseOutcome, RenewalTask};
pub use policy::Failure;
pub use transport::{Credentials, HttpsTransport, Transport, TransportError};

/// The worker wire protocol (the `tak-os-worker-proto` crate): identities, limits, encoding
/// and decoding.
pub use worker_proto as protocol;
/// The `takos.worker.v1` messages (`tak-os-worker-proto`'s generated code).
pub use worker_proto::v1;
