//! Integration tests for worker-proto, in one binary: the checked-in generated code and the
//! fuzz target's seeds.

// Helpers outside `#[test]` functions panic on failure on purpose, as the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod codegen;
mod fuzz_seeds;
