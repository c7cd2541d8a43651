//! The listener: its socket file's mode, connecting and accepting, and peer credentials.

use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;

use fdpass::{Channel, Error, Listener};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::Mode;

use crate::{assert_in_step, pipe};

/// The umask is per process; tests that create files hold this so that a test changing it
/// cannot race another one when the harness runs tests as threads of one process.
static UMASK: Mutex<()> = Mutex::new(());

fn lock_umask() -> std::sync::MutexGuard<'static, ()> {
    UMASK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn mode_of(path: &Path) -> u32 {
    let meta = std::fs::symlink_metadata(path).unwrap();
    assert!(meta.file_type().is_socket());
    meta.mode() & 0o7777
}

#[test]
fn socket_file_is_0600_whatever_the_umask() {
    let _guard = lock_umask();
    let dir = tempfile::tempdir().unwrap();
    // 0: `bind` alone would make 0777 without the fchmod first; `bind` refuses any file wider
    // than 0600 instead of narrowing it later, so success here shows no wider window existed.
    // 0o277: `bind` makes 0400, which even the owner could not connect to.
    for (i, umask) in [0o000, 0o022, 0o077, 0o277].into_iter().enumerate() {
        let path = dir.path().join(format!("keeper-{i}.sock"));
        let previous = rustix::process::umask(Mode::from_raw_mode(umask));
        let listener = Listener::bind(&path);
        rustix::process::umask(previous);
        let listener = listener.unwrap();
        assert_eq!(mode_of(&path), 0o600, "umask {umask:04o}");
        assert_eq!(listener.path(), path);
    }
}

#[test]
fn connect_and_accept_in_one_process() {
    let _guard = lock_umask();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keeper.sock");
    let listener = Listener::bind(&path).unwrap();
    assert_eq!(mode_of(&path), 0o600);

    let owner = Channel::connect(&path).unwrap();
    let keeper = listener.accept().unwrap();
    for cred in [
        keeper.peer_credentials().unwrap(),
        owner.peer_credentials().unwrap(),
    ] {
        assert_eq!(cred.pid, Some(std::process::id()));
        assert_eq!(cred.uid, rustix::process::geteuid().as_raw());
        assert_eq!(cred.gid, rustix::process::getegid().as_raw());
    }

    let (r, w) = pipe();
    owner.send(b"fuse fd", &[r.as_fd()]).unwrap();
    let message = keeper.recv().unwrap().unwrap();
    assert_eq!(message.payload, b"fuse fd");
    assert_eq!(message.fds.len(), 1);
    assert_in_step(&keeper, &owner);
    drop((r, w));

    drop(owner);
    assert!(keeper.recv().unwrap().is_none());
}

#[test]
fn bind_refuses_an_existing_path_and_leaves_it_alone() {
    let _guard = lock_umask();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("taken");
    std::fs::write(&path, b"not ours").unwrap();
    match Listener::bind(&path) {
        Err(Error::Bind { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse);
        }
        other => panic!("expected a bind error, got {other:?}"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), b"not ours");
}

#[test]
fn a_path_too_long_for_sun_path_is_a_bind_error() {
    let path = Path::new("/").join("x".repeat(200));
    assert!(matches!(Listener::bind(&path), Err(Error::Bind { .. })));
    assert!(matches!(
        Channel::connect(&path),
        Err(Error::Connect { .. })
    ));
}

#[test]
fn connect_to_nothing_is_a_connect_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nobody");
    match Channel::connect(&path) {
        Err(Error::Connect { path: p, source }) => {
            assert_eq!(p, path);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected a connect error, got {other:?}"),
    }
}

const PIDNS_HELPER_ENV: &str = "FDPASS_TEST_PIDNS_SOCKET";

/// Not a test on its own: `peer_in_another_pid_namespace_has_no_visible_pid` runs this test
/// binary again, with only this test, inside a new pid namespace. Without the variable it does
/// nothing.
#[test]
fn pid_namespace_helper() {
    let Some(path) = std::env::var_os(PIDNS_HELPER_ENV) else {
        return;
    };
    let channel = Channel::connect(path).unwrap();
    let cred = channel.peer_credentials().unwrap();
    channel
        .send(format!("{:?}", cred.pid).as_bytes(), &[])
        .unwrap();
    // Stay connected until the listener has read the message and hung up.
    assert!(channel.recv().unwrap().is_none());
}

/// A keeper and a mount owner in different containers see each other across pid namespaces.
/// From inside a child namespace, the parent's processes have no pid, and `SO_PEERCRED` says 0:
/// that must come out as `None` (rustix's own `UCred` cannot hold it).
#[test]
fn peer_in_another_pid_namespace_has_no_visible_pid() {
    if !test_support::requires_root(
        "peer_in_another_pid_namespace_has_no_visible_pid",
        "unshare --pid makes a new pid namespace",
    ) {
        return;
    }
    let _guard = lock_umask();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keeper.sock");
    let listener = Listener::bind(&path).unwrap();

    let child = Command::new("unshare")
        .args(["--pid", "--fork", "--"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "listener::pid_namespace_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PIDNS_HELPER_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let mut pollfd = [PollFd::new(&listener, PollFlags::IN)];
    let timeout = Timespec {
        tv_sec: 60,
        tv_nsec: 0,
    };
    let ready = rustix::event::poll(&mut pollfd, Some(&timeout)).unwrap();
    if ready == 0 {
        let output = child.wait_with_output().unwrap();
        panic!(
            "the helper never connected: {:?}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let keeper = listener.accept().unwrap();
    // Seen from the parent namespace, the helper has a pid (not ours).
    let cred = keeper.peer_credentials().unwrap();
    assert!(cred.pid.is_some_and(|pid| pid != std::process::id()));
    assert_eq!(cred.uid, 0);

    let message = keeper.recv().unwrap().unwrap();
    assert_eq!(String::from_utf8_lossy(&message.payload), "None");
    drop(keeper);

    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "helper failed: {:?}\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
