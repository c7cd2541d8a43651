//! fusefs mounted for real, as root in a private mount namespace, against the reference worker
//! over loopback TLS with shortened budgets (the default proportions kept), and its `Fs` core
//! driven directly against the same worker (`fs_core`: no mount, so no root needed; an
//! unprivileged worker reopens files by descriptor).

// Helpers outside `#[test]` functions fail the test loudly, as the tests do.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod fencing;
mod fs_core;
mod model;
mod mounted;
mod outage;
mod posix;
mod setid;
mod support;
mod sys;
mod visibility;
