//! Durable writes as their callers rely on them: exact modes, replace or not, leftovers and
//! symbolic links, the steps in order, and crashes between them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, File};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use tak_os_durable::{self as durable, Options, Outcome, Replace, Step};

fn open(dir: &Path) -> File {
    File::open(dir).unwrap()
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

const REPLACE: Options = Options {
    mode: 0o640,
    replace: Replace::Yes,
};
const CREATE: Options = Options {
    mode: 0o600,
    replace: Replace::No,
};

#[test]
fn a_write_gives_the_exact_mode_and_leaves_no_temp_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = open(tmp.path());
    // A umask that would narrow 0640 to 0600: the mode must come out exact all the same.
    // (The umask is the process's; the other tests set their modes exactly too.)
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let outcome = durable::write(dir.as_fd(), "a", b"one", REPLACE);
    rustix::process::umask(old);
    let outcome = outcome.unwrap();
    assert_eq!(outcome, Outcome::Written);
    assert_eq!(fs::read(tmp.path().join("a")).unwrap(), b"one");
    assert_eq!(mode(&tmp.path().join("a")), 0o640);
    let names: Vec<_> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["a"]);

    let outcome = durable::write(dir.as_fd(), "a", b"two", REPLACE).unwrap();
    assert_eq!(outcome, Outcome::Written);
    assert_eq!(fs::read(tmp.path().join("a")).unwrap(), b"two");
}

#[test]
fn without_replace_an_existing_file_stays_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = open(tmp.path());
    assert_eq!(
        durable::write(dir.as_fd(), "r", b"first", CREATE).unwrap(),
        Outcome::Written
    );
    assert_eq!(mode(&tmp.path().join("r")), 0o600);
    assert_eq!(
        durable::write(dir.as_fd(), "r", b"second", CREATE).unwrap(),
        Outcome::AlreadyExists
    );
    assert_eq!(fs::read(tmp.path().join("r")).unwrap(), b"first");
    assert!(!tmp.path().join(durable::temp_name("r")).exists());
}

#[test]
fn symbolic_links_are_never_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("target");
    fs::write(&target, b"keep").unwrap();
    let dir = open(tmp.path());

    // A link where the temp file goes is removed, not written through.
    std::os::unix::fs::symlink(&target, tmp.path().join(durable::temp_name("f"))).unwrap();
    durable::write(dir.as_fd(), "f", b"new", REPLACE).unwrap();
    assert_eq!(fs::read(&target).unwrap(), b"keep");
    assert_eq!(fs::read(tmp.path().join("f")).unwrap(), b"new");

    // A link at the name: replaced itself with Replace::Yes, kept with Replace::No.
    std::os::unix::fs::symlink(&target, tmp.path().join("g")).unwrap();
    assert_eq!(
        durable::write(dir.as_fd(), "g", b"x", CREATE).unwrap(),
        Outcome::AlreadyExists
    );
    assert!(
        fs::symlink_metadata(tmp.path().join("g"))
            .unwrap()
            .is_symlink()
    );
    durable::write(dir.as_fd(), "g", b"x", REPLACE).unwrap();
    assert!(
        fs::symlink_metadata(tmp.path().join("g"))
            .unwrap()
            .is_file()
    );
    assert_eq!(fs::read(&target).unwrap(), b"keep");
}

#[test]
fn the_steps_come_in_order_and_a_crash_between_them_keeps_the_old_or_the_new_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = open(tmp.path());
    let mut seen = Vec::new();
    durable::write_observed(dir.as_fd(), "s", b"old", REPLACE, &mut |step| {
        seen.push(step)
    })
    .unwrap();
    assert_eq!(seen, [Step::TempWritten, Step::Renamed, Step::Durable]);

    for (crash_at, holds) in [
        (Step::TempWritten, &b"old"[..]),
        (Step::Renamed, b"new"),
        (Step::Durable, b"new"),
    ] {
        durable::write(dir.as_fd(), "s", b"old", REPLACE).unwrap();
        let crashed = std::panic::catch_unwind(|| {
            let dir = open(tmp.path());
            let _ = durable::write_observed(dir.as_fd(), "s", b"new", REPLACE, &mut |step| {
                assert_ne!(step, crash_at, "crash");
            });
        });
        assert!(crashed.is_err(), "{crash_at:?} was reached");
        assert_eq!(
            fs::read(tmp.path().join("s")).unwrap(),
            holds,
            "{crash_at:?}"
        );
        // The next write cleans up whatever the crash left.
        durable::write(dir.as_fd(), "s", b"after", REPLACE).unwrap();
        assert!(!tmp.path().join(durable::temp_name("s")).exists());
        assert_eq!(fs::read(tmp.path().join("s")).unwrap(), b"after");
    }
}

#[test]
fn remove_is_durable_and_tells_whether_there_was_a_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = open(tmp.path());
    durable::write(dir.as_fd(), "x", b"", CREATE).unwrap();
    assert!(durable::remove(dir.as_fd(), "x").unwrap());
    assert!(!durable::remove(dir.as_fd(), "x").unwrap());
    assert!(!tmp.path().join("x").exists());
}

#[test]
fn a_failure_names_its_step_and_file_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = open(tmp.path());
    durable::write(dir.as_fd(), "y", b"kept", REPLACE).unwrap();
    // Something that is not a leftover file sits at the temp name.
    let blocker = tmp.path().join(durable::temp_name("y"));
    fs::create_dir(&blocker).unwrap();
    fs::write(blocker.join("inside"), b"").unwrap();
    let err = durable::write(dir.as_fd(), "y", b"lost", REPLACE).unwrap_err();
    assert_eq!(err.action(), "remove stale temp file");
    assert_eq!(err.name(), durable::temp_name("y"));
    assert_eq!(
        err.io_error().raw_os_error(),
        Some(rustix::io::Errno::ISDIR.raw_os_error())
    );
    assert_eq!(fs::read(tmp.path().join("y")).unwrap(), b"kept");
    assert!(blocker.join("inside").exists());
}

#[test]
fn only_a_single_file_name_is_accepted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = open(tmp.path());
    fs::create_dir(tmp.path().join("sub")).unwrap();
    for bad in ["", ".", "..", "sub/x", "/etc/x", "x/"] {
        let err = durable::write(dir.as_fd(), bad, b"x", REPLACE).unwrap_err();
        assert_eq!(
            err.io_error().kind(),
            std::io::ErrorKind::InvalidInput,
            "{bad:?}"
        );
        assert!(durable::remove(dir.as_fd(), bad).is_err(), "{bad:?}");
        assert!(durable::remove_temp(dir.as_fd(), bad).is_err(), "{bad:?}");
    }
    assert!(!tmp.path().join("sub/x").exists());
}

#[test]
fn a_read_returns_what_a_write_wrote_and_none_for_a_missing_name() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = open(tmp.path());
    assert!(durable::read(dir.as_fd(), "a", 16).unwrap().is_none());
    durable::write(dir.as_fd(), "a", b"sixteen bytes!!!", CREATE).unwrap();
    assert_eq!(
        durable::read(dir.as_fd(), "a", 16).unwrap().unwrap(),
        b"sixteen bytes!!!"
    );
    let opened = durable::open(dir.as_fd(), "a").unwrap().unwrap();
    assert_eq!(opened.metadata().permissions().mode() & 0o7777, 0o600);
    assert_eq!(opened.read(16).unwrap().len(), 16);
}

#[test]
fn a_read_refuses_a_file_over_the_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = open(tmp.path());
    durable::write(dir.as_fd(), "a", &[7; 17], CREATE).unwrap();
    let error = durable::read(dir.as_fd(), "a", 16).unwrap_err();
    assert!(
        matches!(
            error,
            durable::ReadError::TooLarge {
                size: 17,
                limit: 16,
                ..
            }
        ),
        "{error:?}"
    );
}

#[test]
fn a_read_follows_no_link_and_opens_nothing_but_a_regular_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = open(tmp.path());
    fs::write(tmp.path().join("target"), b"secret").unwrap();
    std::os::unix::fs::symlink("target", tmp.path().join("link")).unwrap();
    fs::create_dir(tmp.path().join("sub")).unwrap();
    rustix::fs::mknodat(
        dir.as_fd(),
        "fifo",
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let error = durable::read(dir.as_fd(), "link", 64).unwrap_err();
    assert!(
        matches!(error, durable::ReadError::Symlink { .. }),
        "{error:?}"
    );
    for name in ["sub", "fifo"] {
        // Neither is opened: the name is looked at before the open.
        let error = durable::read(dir.as_fd(), name, 64).unwrap_err();
        assert!(
            matches!(error, durable::ReadError::NotRegularFile { .. }),
            "{name}: {error:?}"
        );
        assert!(error.to_string().contains(name), "{error}");
    }
}

#[test]
fn a_read_takes_one_name_and_never_walks_a_path() {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir(tmp.path().join("sub")).unwrap();
    fs::write(tmp.path().join("sub/a"), b"a").unwrap();
    let dir = open(tmp.path());
    for name in ["sub/a", "../a", "", ".", ".."] {
        let error = durable::read(dir.as_fd(), name, 64).unwrap_err();
        assert!(
            matches!(error, durable::ReadError::Failed(_)),
            "{name:?}: {error:?}"
        );
    }
}
