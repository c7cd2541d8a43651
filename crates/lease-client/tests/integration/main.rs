//! Integration tests for lease-client, in one binary: the client and the mount lease against
//! the fake worker group, and the HTTPS transport against an in-test TLS server.

// Helpers outside `#[test]` functions panic on failure on purpose, as the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod client_fake;
mod lease;
mod server;
mod tls;
