//! Integration tests for `localstore`: one binary, one module per concern.
//!
//! Store roots must be root-owned, so most tests need root; without it they print `SKIPPED` and
//! return, except when `CI=true`, where they fail. Privileged tests (real mounts) also need a
//! private mount namespace (`test_support::private_mount_namespace`, with the same CI rule).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr,
    reason = "test helpers fail loudly; skipped tests say so on stderr"
)]

mod bad_input;
mod common;
#[cfg(feature = "testing")]
mod crash;
mod fuzz_seeds;
mod lifecycle;
mod model;
mod privileged;
