//! The worker goes away and comes back on the same endpoint: while it is away every
//! operation fails within one call budget with the errno SEMANTICS.md documents, nothing
//! hangs, and once it is back the same mount works again without remounting.

use std::fs;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use worker::AccessMode;

use crate::support::{Setup, budgets, errno_of, timed};

const LIMIT: Duration = Duration::from_secs(90);

/// How much longer than one call budget a failing system call may take: the kernel's own
/// work, the scheduler of a loaded two-core machine, and the attempt in flight when the
/// budget ends.
const MARGIN: Duration = Duration::from_millis(1000);

/// Runs one operation that must fail, checks it ends within a call budget (plus the margin),
/// and returns its errno.
fn fails_in_budget<T>(what: &str, op: impl FnOnce() -> io::Result<T>) -> i32 {
    let (result, took) = timed(op);
    let errno = errno_of(result).unwrap_or_else(|| panic!("{what} succeeded"));
    let limit = budgets().call + MARGIN;
    eprintln!("{what}: errno {errno} after {took:?}");
    assert!(took <= limit, "{what} took {took:?}, over {limit:?}");
    errno
}

/// Every kind of operation, against a mount whose worker does not answer: each must fail with
/// `ETIMEDOUT` (no worker answered; nothing can have changed), except a write, which fails
/// with `write_errno`: `ETIMEDOUT` when it cannot have been delivered, `EIO` when it may have
/// been and its outcome is unknown. Creating, making and removing a name fail like the
/// reads: the kernel looks the name up first, and that read-only call fails.
fn every_operation_fails(root: &Path, held: &fs::File, write_errno: i32) {
    let mut buf = [0u8; 16];
    let checks: Vec<(&str, i32)> = vec![
        (
            "stat",
            fails_in_budget("stat", || fs::metadata(root.join("f"))),
        ),
        (
            "read",
            fails_in_budget("read of an open file", || held.read_at(&mut buf, 0)),
        ),
        (
            "write",
            fails_in_budget("write to an open file", || held.write_at(b"lost", 0)),
        ),
        ("fstat", fails_in_budget("fstat", || held.metadata())),
        (
            "create",
            fails_in_budget("create", || fs::File::create(root.join("new"))),
        ),
        (
            "readdir",
            fails_in_budget("readdir", || fs::read_dir(root)?.next().transpose()),
        ),
        (
            "mkdir",
            fails_in_budget("mkdir", || fs::create_dir(root.join("d"))),
        ),
        (
            "unlink",
            fails_in_budget("unlink", || fs::remove_file(root.join("f"))),
        ),
        (
            "statfs",
            fails_in_budget("statfs", || {
                rustix::fs::statvfs(root).map_err(io::Error::from)
            }),
        ),
    ];
    for (what, errno) in checks {
        let expected = if what == "write" {
            write_errno
        } else {
            libc::ETIMEDOUT
        };
        assert_eq!(errno, expected, "{what}");
    }
}

/// Every kind of operation works (again) and the file still holds `data`.
fn every_operation_works(root: &Path, data: &[u8]) {
    assert_eq!(fs::read(root.join("f")).unwrap(), data);
    assert_eq!(
        fs::metadata(root.join("f")).unwrap().len(),
        data.len() as u64
    );
    fs::write(root.join("new"), b"new").unwrap();
    fs::create_dir(root.join("d")).unwrap();
    let mut names: Vec<_> = fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["d", "f", "new"]);
    fs::remove_dir(root.join("d")).unwrap();
    fs::remove_file(root.join("new")).unwrap();
    rustix::fs::statvfs(root).unwrap();
}

#[test]
fn a_stopped_worker_fails_calls_in_budget_and_a_restarted_one_serves_again() {
    let Some(mut setup) = Setup::new(
        "a_stopped_worker_fails_calls_in_budget_and_a_restarted_one_serves_again",
        AccessMode::Rwx,
        LIMIT,
    ) else {
        return;
    };
    let root = setup.root();
    fs::write(root.join("f"), b"before").unwrap();
    let held = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(root.join("f"))
        .unwrap();

    // The endpoint refuses connections: nothing can have been delivered, ETIMEDOUT. (The
    // first call may still go out on the connection the worker has just closed, and end
    // uncertain: it is a read, so ETIMEDOUT all the same.)
    setup.rt.block_on(setup.volume.stop_worker());
    every_operation_fails(&root, &held, libc::ETIMEDOUT);

    // A worker on the same address and state: the mount serves again, unmounted never.
    setup.rt.block_on(setup.volume.start_worker_again());
    every_operation_works(&root, b"before");
    // Open handles do not survive a worker restart (the reference worker keeps them in
    // memory): the descriptor opened before fails with EBADF; a new open works.
    let mut buf = [0u8; 6];
    assert_eq!(errno_of(held.read_at(&mut buf, 0)), Some(libc::EBADF));
    drop(held);
    let again = fs::File::open(root.join("f")).unwrap();
    again.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"before");
    drop(again);
    setup.finish();
}

/// An open descriptor reads and writes.
fn still_open(held: &fs::File) {
    held.write_all_at(b"AFTER!", 0).unwrap();
    let mut buf = [0u8; 6];
    held.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"AFTER!");
    held.write_all_at(b"before", 0).unwrap();
}

/// The worker's handle lease (90 s, scaled): an outage longer than it loses open handles.
fn handle_lease() -> Duration {
    worker::Timings::default()
        .scaled(crate::support::SCALE)
        .handle_lease
}

/// The worker stays up but fails calls in the way `fault` sets up (and `heal` undoes), with
/// `write_errno` as a write's errno (see [`every_operation_fails`]): a short outage keeps
/// open descriptors; one longer than the handle lease loses them (EBADF), while everything
/// else works again.
fn outage_and_recovery(
    test: &'static str,
    fault: impl Fn(&worker::Faults),
    heal: impl Fn(&worker::Faults),
    write_errno: i32,
) {
    let Some(setup) = Setup::new(test, AccessMode::Rwx, LIMIT) else {
        return;
    };
    let root = setup.root();
    let faults = setup.volume.server().faults();
    fs::write(root.join("f"), b"before").unwrap();
    let held = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(root.join("f"))
        .unwrap();

    // A short outage: one call's budget.
    fault(faults);
    assert_eq!(
        fails_in_budget("stat", || fs::metadata(root.join("f"))),
        libc::ETIMEDOUT
    );
    heal(faults);
    still_open(&held);

    // A long one: every kind of operation fails within its budget, and nothing it attempted
    // was applied.
    let (_, took) = timed(|| {
        fault(faults);
        every_operation_fails(&root, &held, write_errno);
        heal(faults);
    });
    // Renewed at most just before the outage began, the handle expired a lease later.
    assert!(took > handle_lease() + Duration::from_secs(1), "{took:?}");
    every_operation_works(&root, b"before");
    let mut buf = [0u8; 6];
    assert_eq!(
        errno_of(held.read_at(&mut buf, 0)),
        Some(libc::EBADF),
        "the handle lease ran out during the outage"
    );
    drop(held);
    setup.finish();
}

#[test]
fn a_minority_worker_fails_calls_in_budget_and_serves_again_when_healed() {
    // The worker answers NO_QUORUM before proposing anything: retried until the budget
    // ends, then ETIMEDOUT (nothing was applied).
    outage_and_recovery(
        "a_minority_worker_fails_calls_in_budget_and_serves_again_when_healed",
        |faults| faults.set_minority(true),
        |faults| faults.set_minority(false),
        libc::ETIMEDOUT,
    );
}

#[test]
fn a_silent_worker_fails_calls_in_budget_as_uncertain_and_serves_again() {
    // The worker takes every request and never answers: each may have been delivered, so a
    // write's outcome is unknown, EIO, within the budget, while a read still cannot have
    // changed anything, ETIMEDOUT. (This worker hangs before applying, so nothing was.)
    outage_and_recovery(
        "a_silent_worker_fails_calls_in_budget_as_uncertain_and_serves_again",
        |faults| faults.set_hang(true),
        |faults| faults.set_hang(false),
        libc::EIO,
    );
}
