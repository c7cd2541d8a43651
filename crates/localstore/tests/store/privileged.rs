//! Tests with real mounts, each in a private mount namespace.

use std::fs;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::path::Path;

use localstore::{ErrorKind, Store, StoreOptions, VolumeState};
use rustix::fs::inotify;
use rustix::mount::{MountFlags, UnmountFlags, mount, mount_bind, unmount};

use crate::common::{NODE, Root, request};

fn mount_tmpfs(at: &Path) {
    mount(
        "tmpfs",
        at,
        "tmpfs",
        MountFlags::empty(),
        Some(c"mode=0700"),
    )
    .unwrap();
}

#[test]
fn require_mount_accepts_only_the_root_of_a_filesystem() {
    if !test_support::private_mount_namespace("require_mount_accepts_only_the_root_of_a_filesystem")
    {
        return;
    }
    let root = Root::new();
    let disk = root.path().join("disk");
    fs::create_dir(&disk).unwrap();
    let options = || StoreOptions::new(NODE).require_mount(true);

    // An unmounted disk's empty mount point: refused, and nothing is written into it.
    let err = Store::open(&disk, options()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsafeStore, "{err}");
    assert!(fs::read_dir(&disk).unwrap().next().is_none());

    // The disk mounted: accepted.
    mount_tmpfs(&disk);
    let store = Store::open(&disk, options()).unwrap();
    store.create(&request("pvc-1")).unwrap();
    drop(store);

    // A bind mount of a subdirectory (what a hostPath on the root disk looks like): refused,
    // although it is a mount point.
    fs::create_dir(disk.join("sub")).unwrap();
    let bound = root.path().join("bound");
    fs::create_dir(&bound).unwrap();
    mount_bind(disk.join("sub"), &bound).unwrap();
    let err = Store::open(&bound, options()).unwrap_err();
    assert!(err.to_string().contains("/sub"), "{err}");

    // A bind mount of the whole filesystem's root is its own filesystem's root: accepted.
    let whole = root.path().join("whole");
    fs::create_dir(&whole).unwrap();
    mount_bind(&disk, &whole).unwrap();
    drop(Store::open(&whole, options()).unwrap());

    unmount(&bound, UnmountFlags::empty()).unwrap();
    unmount(&whole, UnmountFlags::empty()).unwrap();
    unmount(&disk, UnmountFlags::empty()).unwrap();
}

#[test]
fn delete_never_crosses_into_a_mount_inside_the_volume() {
    if !test_support::private_mount_namespace("delete_never_crosses_into_a_mount_inside_the_volume")
    {
        return;
    }
    let root = Root::new();
    let store = root.open();
    let vol = store.create(&request("pvc-1")).unwrap();
    let dir = store.data_dir(&vol.volume_id);
    fs::write(dir.join("a"), b"x").unwrap();
    let inner = dir.join("mnt");
    fs::create_dir(&inner).unwrap();
    mount_tmpfs(&inner);
    fs::write(inner.join("precious"), b"keep").unwrap();

    let err = store.delete(&vol.volume_id).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition, "{err}");
    assert!(err.to_string().contains("mount point"), "{err}");
    assert_eq!(fs::read(inner.join("precious")).unwrap(), b"keep");
    assert_eq!(
        store.get(&vol.volume_id).unwrap().state,
        VolumeState::Deleting
    );

    // Reopening retries the delete and reports that it could not finish.
    drop(store);
    let store = root.open();
    assert_eq!(store.reconciliation().left_in_place.len(), 1);
    assert_eq!(fs::read(inner.join("precious")).unwrap(), b"keep");

    unmount(&inner, UnmountFlags::empty()).unwrap();
    store.delete(&vol.volume_id).unwrap();
    assert!(!dir.exists());
}

/// An inotify watch that records every open, read and directory listing on `dir` and on the
/// files directly in it.
fn watch_opens(dir: &Path) -> OwnedFd {
    let fd = inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC).unwrap();
    inotify::add_watch(
        &fd,
        dir,
        inotify::WatchFlags::OPEN | inotify::WatchFlags::ACCESS,
    )
    .unwrap();
    fd
}

/// The events the watch has seen so far, as `(flags, name)`.
fn seen(fd: &OwnedFd) -> Vec<String> {
    let mut buf = [MaybeUninit::uninit(); 4096];
    let mut reader = inotify::Reader::new(fd, &mut buf);
    let mut out = Vec::new();
    loop {
        match reader.next() {
            Ok(event) => out.push(format!("{:?} {:?}", event.events(), event.file_name())),
            Err(rustix::io::Errno::AGAIN) => return out,
            Err(e) => panic!("reading inotify events: {e}"),
        }
    }
}

/// DESIGN.md 5: deletion decides about a mount from the parent's side and never opens it. Opening
/// a FUSE mount's root sends an `OPENDIR` to its daemon, which blocks when the daemon hangs; here
/// a tmpfs stands in for it and inotify shows whether its root was ever opened.
#[test]
fn delete_never_opens_a_mount_inside_the_volume() {
    if !test_support::private_mount_namespace("delete_never_opens_a_mount_inside_the_volume") {
        return;
    }
    let root = Root::new();
    let store = root.open();
    let vol = store.create(&request("pvc-1")).unwrap();
    let dir = store.data_dir(&vol.volume_id);
    let inner = dir.join("sub");
    fs::create_dir(&inner).unwrap();
    mount_tmpfs(&inner);
    fs::write(inner.join("precious"), b"keep").unwrap();
    // The watch itself opens nothing; it is armed last so that the setup above is not counted.
    let watch = watch_opens(&inner);
    assert_eq!(
        seen(&watch),
        Vec::<String>::new(),
        "the watch saw its own setup"
    );

    let err = store.delete(&vol.volume_id).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition, "{err}");
    let message = err.to_string();
    assert!(message.contains("mount point"), "{message}");
    assert!(
        message.contains(&inner.display().to_string()),
        "the error names the mount: {message}"
    );
    let events = seen(&watch);
    assert!(events.is_empty(), "the mount was entered: {events:?}");

    // The same through reconciliation, which finishes the interrupted delete on open.
    drop(store);
    let store = root.open();
    assert_eq!(store.reconciliation().left_in_place.len(), 1);
    let events = seen(&watch);
    assert!(
        events.is_empty(),
        "reconciliation entered the mount: {events:?}"
    );
    assert_eq!(fs::read(inner.join("precious")).unwrap(), b"keep");
    assert_eq!(
        fs::read_dir(&inner).unwrap().count(),
        1,
        "the mount's contents changed"
    );
    unmount(&inner, UnmountFlags::empty()).unwrap();
}
