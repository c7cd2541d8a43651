//! The contract between whoever creates replicated volumes (the manager, or the reference CSI
//! controller in `tak-os-worker`) and the replicated node (`tak-os-node`) that mounts them. Both
//! sides build on this one crate, so that what a creator writes is exactly what the node reads.
//!
//! - [`context`]: the `volume_context` a creator returns for a new volume and the node
//!   validates on every Node call: the keys, [`VolumeMode`](context::VolumeMode),
//!   [`VolumeContext::new`](context::VolumeContext::new) and
//!   [`to_map`](context::VolumeContext::to_map) for the creator,
//!   [`VolumeContext::parse`](context::VolumeContext::parse) for the node.
//! - [`capability`]: which CSI volume capabilities a volume of each mode accepts, one table for
//!   a controller checking the capabilities of a volume it creates and for the node's stage and
//!   publish.
//! - [`credentials`]: the names of a volume's credentials (Secret keys, or files in
//!   development), written by the creator and read by the node.
//!
//! The context contract:
//!
//! | key | value | required |
//! |---|---|---|
//! | `replicated.tak-os.org/generation` | the volume generation, a decimal `u64` | yes |
//! | `replicated.tak-os.org/endpoints` | 1 to 16 worker endpoints `https://host:port`, comma-separated | yes |
//! | `replicated.tak-os.org/access-mode` | `rwx` or `rwo` | no (`rwx`) |
//! | `replicated.tak-os.org/credential-namespace` | the namespace of the volume's Secret | no |
//!
//! The capability table:
//!
//! | volume mode | access modes accepted | publications |
//! |---|---|---|
//! | `rwx` | MULTI_NODE_MULTI_WRITER | read-write unless `readonly` |
//! | `rwx` | MULTI_NODE_READER_ONLY | always read-only |
//! | `rwo` | SINGLE_NODE_WRITER, SINGLE_NODE_MULTI_WRITER (one contract) | read-write unless `readonly` |
//!
//! ```
//! use csi_proto::v1::VolumeCapability;
//! use csi_proto::v1::volume_capability::access_mode::Mode;
//! use csi_proto::v1::volume_capability::{AccessMode as CsiAccessMode, AccessType, MountVolume};
//! use replicated_contract::capability::{self, AccessMode};
//! use replicated_contract::context::{VolumeContext, VolumeMode};
//!
//! // The creator: a new RWO volume on three workers.
//! let endpoints = ["https://w1.example:7443", "https://w2.example:7443", "https://w3.example:7443"]
//!     .map(String::from);
//! let created = VolumeContext::new(1, &endpoints, VolumeMode::Rwo)?;
//! let volume_context = created.to_map(Some("tak-os-system"));
//!
//! // The node: the same context back, and a capability checked against it.
//! let parsed = VolumeContext::parse(&volume_context, "tak-os-system")?;
//! assert_eq!(parsed, created);
//! let capability = VolumeCapability {
//!     access_mode: Some(CsiAccessMode { mode: Mode::SingleNodeWriter as i32 }),
//!     access_type: Some(AccessType::Mount(MountVolume::default())),
//! };
//! assert_eq!(capability::check(Some(&capability), parsed.mode)?, AccessMode::SingleNode);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! What it does not do: any I/O. It does not create volumes, read credentials or their
//! Secrets, reach the workers, or map its errors to gRPC codes (each side has its own mapping:
//! a [`ContextError`](context::ContextError) is INVALID_ARGUMENT on the node; a
//! [`CapabilityError`](capability::CapabilityError) is INVALID_ARGUMENT when unsupported and
//! FAILED_PRECONDITION when it exceeds the volume).

#![deny(missing_docs)]

pub mod capability;
pub mod context;
pub mod credentials;
