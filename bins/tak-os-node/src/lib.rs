//! `tak-os-node`: the replicated node's CSI Node service for `fuse.tak-os-replicated` volumes.
//!
//! This library is the binary's whole service, so that tests drive it in-process; `main.rs`
//! only parses flags. It is built in steps: so far the volume context contract
//! ([`context`]), the capability rules ([`capability`]) and the credential sources
//! ([`credentials`]).

pub mod capability;
pub mod context;
pub mod credentials;

/// The CSI driver name this node serves by default.
pub const DRIVER_NAME: &str = "csi.replicated.tak-os.org";
