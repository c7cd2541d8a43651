//! Two mounts of one RWX volume (two clients, two FUSE connections, as two nodes would have)
//! see each other's changes at once: no sleeps, no syncs, no reopening.

use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::time::Duration;

use worker::AccessMode;

use crate::support::{Mount, Volume, Watchdog, errno_of, runtime};

/// Two mounts of one RWX volume, as two nodes would have them, in the test's own mount
/// namespace.
///
/// Fields drop in order: the mounts, then the volume, its runtime and the watchdog last.
struct TwoMounts {
    a: Mount,
    b: Mount,
    _volume: Volume,
    rt: tokio::runtime::Runtime,
    _watchdog: Watchdog,
}

impl TwoMounts {
    /// `None` when the test cannot mount here (it says why and passes).
    fn new(test: &'static str) -> Option<TwoMounts> {
        if !test_support::private_mount_namespace_with_fuse(test) {
            return None;
        }
        let watchdog = Watchdog::arm(test, Duration::from_secs(60));
        let rt = runtime();
        let volume = rt.block_on(Volume::start(AccessMode::Rwx));
        let a = rt.block_on(Mount::new(&volume, &volume.mount_point("a"), "node-a"));
        let b = rt.block_on(Mount::new(&volume, &volume.mount_point("b"), "node-b"));
        Some(TwoMounts {
            a,
            b,
            _volume: volume,
            rt,
            _watchdog: watchdog,
        })
    }

    fn unmount(self) {
        self.rt.block_on(self.a.unmount());
        self.rt.block_on(self.b.unmount());
    }
}

#[test]
fn two_mounts_see_each_others_changes_at_once() {
    let Some(two) = TwoMounts::new("two_mounts_see_each_others_changes_at_once") else {
        return;
    };
    let (a, b) = (two.a.path().to_owned(), two.b.path().to_owned());

    // A write through A is read through B at once, by an open B had before the write too.
    let writer = fs::File::create(a.join("f")).unwrap();
    let reader = fs::File::open(b.join("f")).unwrap();
    let mut buf = [0u8; 64];
    for (at, chunk) in [(0u64, &b"one"[..]), (3, b" two"), (7, b" three")] {
        writer.write_all_at(chunk, at).unwrap();
        let n = reader.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf[..n], &b"one two three"[..(at as usize + chunk.len())]);
        assert_eq!(
            fs::metadata(b.join("f")).unwrap().len(),
            at + chunk.len() as u64
        );
    }
    // And back: B truncates and writes; A's descriptor sees it.
    let b_writer = fs::OpenOptions::new()
        .write(true)
        .open(b.join("f"))
        .unwrap();
    b_writer.set_len(3).unwrap();
    assert_eq!(writer.metadata().unwrap().len(), 3, "fstat through A");
    b_writer.write_all_at(b"ONE", 0).unwrap();
    let a_reader = fs::File::open(a.join("f")).unwrap();
    let n = a_reader.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"ONE");
    drop((writer, reader, b_writer, a_reader));

    // Names: created in A, listed in B; renamed in B, gone from A's old name; unlinked in B,
    // A's stat fails.
    fs::create_dir(a.join("dir")).unwrap();
    fs::write(a.join("dir/new"), b"x").unwrap();
    std::os::unix::fs::symlink("new", a.join("dir/link")).unwrap();
    let mut names: Vec<_> = fs::read_dir(b.join("dir"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["link", "new"]);
    assert_eq!(
        fs::read_link(b.join("dir/link")).unwrap().to_str(),
        Some("new")
    );
    fs::rename(b.join("dir/new"), b.join("dir/renamed")).unwrap();
    assert_eq!(
        errno_of(fs::metadata(a.join("dir/new"))),
        Some(libc::ENOENT)
    );
    assert_eq!(fs::read(a.join("dir/renamed")).unwrap(), b"x");
    fs::remove_file(b.join("dir/renamed")).unwrap();
    assert_eq!(
        errno_of(fs::metadata(a.join("dir/renamed"))),
        Some(libc::ENOENT)
    );
    // A name A looked up a moment ago (negative or positive) is not cached either.
    assert_eq!(errno_of(fs::metadata(a.join("later"))), Some(libc::ENOENT));
    fs::write(b.join("later"), b"now").unwrap();
    assert_eq!(fs::read(a.join("later")).unwrap(), b"now");

    // Attributes: chmod, chown and times set through B are what A's stat returns.
    fs::set_permissions(b.join("later"), fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::chown(b.join("later"), Some(1234), Some(5678)).unwrap();
    let meta = fs::metadata(a.join("later")).unwrap();
    assert_eq!(
        (meta.mode() & 0o7777, meta.uid(), meta.gid()),
        (0o640, 1234, 5678)
    );
    // A directory removed in A cannot be entered through B.
    fs::remove_file(a.join("dir/link")).unwrap();
    fs::remove_dir(a.join("dir")).unwrap();
    assert_eq!(errno_of(fs::read_dir(b.join("dir"))), Some(libc::ENOENT));

    // Locks are each mount's kernel's own: an exclusive flock through A does not stop one
    // through B (two nodes would not see each other's locks either).
    use rustix::fs::FlockOperation;
    let lock_a = fs::File::open(a.join("later")).unwrap();
    let lock_b = fs::File::open(b.join("later")).unwrap();
    rustix::fs::flock(&lock_a, FlockOperation::NonBlockingLockExclusive).unwrap();
    rustix::fs::flock(&lock_b, FlockOperation::NonBlockingLockExclusive).unwrap();
    drop((lock_a, lock_b));

    two.unmount();
}

/// The visibility promise every performance lever must keep (issue 15): a mode set through
/// one mount is what the other mount's `fstat` of a descriptor it already holds returns, at
/// once, every time; no attribute is answered from a cache, whatever asked for it before.
#[test]
fn an_fstat_sees_a_mode_set_through_another_mount_at_once() {
    let Some(two) = TwoMounts::new("an_fstat_sees_a_mode_set_through_another_mount_at_once") else {
        return;
    };
    let (a, b) = (two.a.path().to_owned(), two.b.path().to_owned());

    fs::write(a.join("f"), b"data").unwrap();
    let held = fs::File::open(a.join("f")).unwrap();
    for (round, mode) in [0o600, 0o644, 0o400, 0o755, 0o640, 0o604, 0o600]
        .into_iter()
        .cycle()
        .take(50)
        .enumerate()
    {
        // Asked just before the change, through A, by path and by descriptor.
        let before = held.metadata().unwrap().mode();
        assert_eq!(fs::metadata(a.join("f")).unwrap().mode(), before);
        fs::set_permissions(b.join("f"), fs::Permissions::from_mode(mode)).unwrap();
        assert_eq!(
            held.metadata().unwrap().mode() & 0o7777,
            mode,
            "round {round}: A's fstat after B's chmod"
        );
        assert_eq!(fs::metadata(a.join("f")).unwrap().mode() & 0o7777, mode);
    }
    drop(held);
    two.unmount();
}
