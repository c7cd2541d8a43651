//! Integration tests for lease-client, in one binary: the checked-in generated code, the
//! client against the fake transport, and the HTTPS transport against an in-test TLS server.

// Helpers outside `#[test]` functions panic on failure on purpose, as the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod codegen;
mod fuzz_seeds;
