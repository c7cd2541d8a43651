//! The integration tests of `tak-os-node`, one binary: each module drives the crate's public
//! API against stand-ins on loopback (`kube_secrets`: a Kubernetes API stand-in) or, as root
//! in a private mount namespace, against the reference worker with real FUSE mounts
//! (`owner`).

// Helpers outside `#[test]` functions panic on failure on purpose, as the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::print_stderr)]

mod crash;
mod frontend;
mod handoff;
mod kube_secrets;
mod owner;
mod support;
