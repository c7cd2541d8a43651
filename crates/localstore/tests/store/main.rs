//! Integration tests for `localstore`: one binary, one module per concern.
//!
//! Store roots must be root-owned, so most tests need root; without it they print `SKIPPED` and
//! return. Privileged tests (real mounts) also need a private mount namespace.

mod bad_input;
mod common;
#[cfg(feature = "testing")]
mod crash;
mod lifecycle;
mod model;
mod privileged;
