//! fusefs mounted for real, as root in a private mount namespace, against the reference worker
//! over loopback TLS with shortened budgets (the default proportions kept).

// Helpers outside `#[test]` functions fail the test loudly, as the tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod posix;
mod support;
