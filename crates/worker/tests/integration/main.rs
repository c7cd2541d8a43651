//! Integration tests of the reference worker: over real TLS on loopback with the lease-client
//! transport and client, certificates generated per test.

// Helpers outside `#[test]` functions fail the test loudly, as the tests themselves do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bad_input;
mod client;
mod delete;
mod files;
mod lease_props;
mod support;
