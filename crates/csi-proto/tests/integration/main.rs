//! Integration tests for csi-proto, in one binary: the checked-in generated code, the wire
//! format against hand-derived bytes, and a round trip of each service over a Unix socket.

// Helpers outside `#[test]` functions panic on failure on purpose, as the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod codegen;
mod roundtrip;
mod wire;
