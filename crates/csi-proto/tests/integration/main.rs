//! Integration tests for csi-proto, in one binary: the checked-in generated code, the wire
//! format of the fields the drivers rely on against hand-derived bytes, and the Unix-socket
//! helpers end to end.

// Helpers outside `#[test]` functions panic on failure on purpose, as the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod codegen;
mod socket;
mod wire;
