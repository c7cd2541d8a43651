//! The session against the real kernel: fresh mounts, pause and adoption in one process,
//! hand-off to another process over `SCM_RIGHTS`, `FUSE_NOTIFY_RESEND` after a reader died,
//! the abort when the last copy closes, a pause past its deadline, interrupts, refusals, and
//! how the reader runs handlers (in its turn, or as tasks of their own when they wait).
//!
//! Privileged tests run as root in a private mount namespace (they print `SKIPPED` without
//! it, and fail under `CI=true`), unmount what they mount, and kill the processes they start.
//! Every call through a mount runs on a thread of its own with a timeout, so a wrong answer
//! fails a test instead of hanging it. What each kernel-fact test observes is printed with
//! `observed:` (`cargo nextest run -p fuse-session --no-capture`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr,
    clippy::panic
)]

mod abort;
mod dispatch;
mod fresh;
mod handoff;
mod interrupt;
mod memfs;
mod pause;
mod refusals;
mod resend;
mod support;
