//! Opening, creating, deleting, claiming: the ordinary paths and their refusals.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use localstore::{
    Capability, CapacityRange, ErrorKind, NodeHash, Store, StoreOptions, VolumeId, VolumeState,
};

use crate::common::{NODE, Root, assert_consistent, request};
use crate::require_root;

#[test]
fn store_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Store>();
    assert_send_sync::<localstore::Error>();
}

#[test]
fn fresh_store_gets_a_private_metadata_directory() {
    require_root!();
    let root = Root::new();
    let store = root.open();
    let meta = fs::metadata(root.metadata()).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.mode() & 0o7777, 0o750);
    assert_eq!(meta.uid(), rustix::process::geteuid().as_raw());
    assert!(root.metadata().join("driver.lock").is_file());
    assert!(!store.reconciliation().needs_attention());
    assert!(store.list().unwrap().is_empty());
}

#[test]
fn create_is_idempotent_and_checks_compatibility() {
    require_root!();
    let root = Root::new();
    let store = root.open();
    let req = request("pvc-1")
        .with_capacity(CapacityRange {
            required_bytes: 4096,
            limit_bytes: 8192,
        })
        .with_parameter("tier", "fast");
    let created = store.create(&req).unwrap();
    assert_eq!(created.state, VolumeState::Ready);
    assert_eq!(created.capacity_bytes, 4096);
    assert_eq!(created.node_name, NODE);
    assert_eq!(created.volume_id, store.volume_id("pvc-1").unwrap());
    assert_eq!(created.volume_id.node_hash(), NodeHash::of(NODE).unwrap());
    let dir = store.data_dir(&created.volume_id);
    assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o7777, 0o750);

    // Same request, and a wider range that still contains 4096: the same volume.
    assert_eq!(store.create(&req).unwrap(), created);
    let wider = req.clone().with_capacity(CapacityRange {
        required_bytes: 1,
        limit_bytes: 0,
    });
    assert_eq!(store.create(&wider).unwrap(), created);

    let incompatible = [
        (
            req.clone().with_capacity(CapacityRange::at_least(8192)),
            "capacity",
        ),
        (
            req.clone().with_capacity(CapacityRange {
                required_bytes: 0,
                limit_bytes: 100,
            }),
            "capacity",
        ),
        (req.clone().with_parameter("tier", "slow"), "parameters"),
        (
            {
                let mut r = req.clone();
                r.capabilities = BTreeSet::from([Capability::mount("MULTI_NODE_MULTI_WRITER")]);
                r
            },
            "capabilities",
        ),
    ];
    for (bad, what) in incompatible {
        let err = store.create(&bad).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Incompatible, "{err}");
        assert!(err.to_string().contains(what), "{err}");
    }
    assert_consistent(&store);
}

#[test]
fn unspecified_capacity_is_recorded_as_zero() {
    require_root!();
    let root = Root::new();
    let store = root.open();
    let a = store.create(&request("a")).unwrap();
    assert_eq!(a.capacity_bytes, 0);
    let b = store
        .create(&request("b").with_capacity(CapacityRange::default()))
        .unwrap();
    assert_eq!(b.capacity_bytes, 0);
    // A volume of unspecified size satisfies only a range without a minimum.
    assert_eq!(
        store
            .create(&request("a").with_capacity(CapacityRange::at_least(1)))
            .unwrap_err()
            .kind(),
        ErrorKind::Incompatible
    );
}

#[test]
fn capacity_is_free_space_minus_reserve() {
    require_root!();
    let root = Root::new();
    let store = root.open();
    let cap = store.capacity().unwrap();
    assert_eq!(cap.available_bytes, cap.free_bytes);
    drop(store);
    let store = Store::open(root.path(), StoreOptions::new(NODE).reserve_bytes(u64::MAX)).unwrap();
    let cap = store.capacity().unwrap();
    assert_eq!(cap.available_bytes, 0);
    let err = store
        .create(&request("big").with_capacity(CapacityRange::at_least(1)))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CapacityExhausted, "{err}");
    // An unspecified size is not checked against free space.
    store.create(&request("any")).unwrap();
}

#[test]
fn delete_removes_data_and_record_and_is_idempotent() {
    require_root!();
    let root = Root::new();
    let store = root.open();
    let vol = store.create(&request("pvc-1")).unwrap();
    let dir = store.data_dir(&vol.volume_id);
    fs::create_dir_all(dir.join("a/b/c")).unwrap();
    fs::write(dir.join("a/b/c/file"), b"data").unwrap();
    fs::write(dir.join("top"), b"data").unwrap();
    std::os::unix::fs::symlink("/etc", dir.join("a/link")).unwrap();
    store.delete(&vol.volume_id).unwrap();
    assert!(!dir.exists());
    assert!(!root.record(&vol.volume_id).exists());
    store.delete(&vol.volume_id).unwrap();
    assert_eq!(
        store.get(&vol.volume_id).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert!(Path::new("/etc/passwd").exists());
    assert_consistent(&store);
}

#[test]
fn delete_never_follows_a_symlink_out_of_the_volume() {
    require_root!();
    let root = Root::new();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("precious"), b"keep").unwrap();
    let store = root.open();
    let vol = store.create(&request("pvc-1")).unwrap();
    let dir = store.data_dir(&vol.volume_id);
    std::os::unix::fs::symlink(outside.path(), dir.join("escape")).unwrap();
    fs::create_dir(dir.join("sub")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("precious"), dir.join("sub/file")).unwrap();
    store.delete(&vol.volume_id).unwrap();
    assert_eq!(fs::read(outside.path().join("precious")).unwrap(), b"keep");
}

#[test]
fn deep_trees_are_removed_without_running_out_of_descriptors() {
    require_root!();
    let root = Root::new();
    let store = root.open();
    let vol = store.create(&request("deep")).unwrap();
    let mut dir = fs::File::open(store.data_dir(&vol.volume_id)).unwrap();
    // 2,000 levels: more than the default soft limit of 1,024 descriptors if each were held.
    for _ in 0..2000 {
        rustix::fs::mkdirat(&dir, "d", rustix::fs::Mode::from_raw_mode(0o700)).unwrap();
        dir = fs::File::from(
            rustix::fs::openat(
                &dir,
                "d",
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
                rustix::fs::Mode::empty(),
            )
            .unwrap(),
        );
        rustix::fs::openat(
            &dir,
            "f",
            rustix::fs::OFlags::CREATE | rustix::fs::OFlags::WRONLY,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .unwrap();
    }
    drop(dir);
    store.delete(&vol.volume_id).unwrap();
    assert!(!store.data_dir(&vol.volume_id).exists());
}

#[test]
fn foreign_volume_ids_are_refused_and_never_touched() {
    require_root!();
    let root = Root::new();
    let store = root.open();
    let other = VolumeId::new(NodeHash::of("node-b").unwrap(), "pvc-1").unwrap();
    // Even if something of that name exists here, it is not touched.
    fs::create_dir(root.path().join(other.to_string())).unwrap();
    let before = crate::common::snapshot(root.path());
    for err in [
        store.delete(&other).unwrap_err(),
        store.get(&other).unwrap_err(),
        store.claim(&other, Path::new("/t")).unwrap_err(),
        store.release(&other, Path::new("/t")).unwrap_err(),
        store.publish_path(&other).unwrap_err(),
    ] {
        assert_eq!(err.kind(), ErrorKind::FailedPrecondition, "{err}");
        assert!(err.to_string().contains("not this node"), "{err}");
    }
    assert_eq!(crate::common::snapshot(root.path()), before);
}

#[test]
fn claims_block_conflicts_and_deletion() {
    require_root!();
    let root = Root::new();
    let store = root.open();
    let vol = store.create(&request("pvc-1")).unwrap();
    let id = vol.volume_id;
    let t1 = Path::new("/var/lib/consumer/1/r/mount");
    let t2 = Path::new("/var/lib/consumer/2/r/mount");

    let claim = store.claim(&id, t1).unwrap();
    assert_eq!(claim.target, t1);
    assert!(
        root.metadata()
            .join(format!("{id}.consumer.json"))
            .is_file()
    );
    assert_eq!(store.claim(&id, t1).unwrap(), claim);
    assert_eq!(
        store.claim(&id, t2).unwrap_err().kind(),
        ErrorKind::FailedPrecondition
    );
    assert_eq!(
        store.release(&id, t2).unwrap_err().kind(),
        ErrorKind::FailedPrecondition
    );
    let err = store.delete(&id).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition);
    assert!(matches!(err, localstore::Error::Claimed { .. }), "{err}");
    assert_eq!(store.claims().unwrap(), vec![claim.clone()]);
    assert_eq!(store.claim_of(&id).unwrap(), Some(claim));

    // Claims survive a reopen.
    drop(store);
    let store = root.open();
    assert_eq!(store.claims().unwrap().len(), 1);

    store.release(&id, t1).unwrap();
    store.release(&id, t1).unwrap();
    assert!(store.claims().unwrap().is_empty());
    store.claim(&id, t2).unwrap();
    store.release(&id, t2).unwrap();
    store.delete(&id).unwrap();

    let missing = store.volume_id("nope").unwrap();
    assert_eq!(
        store.claim(&missing, t1).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    store.release(&missing, t1).unwrap();
    assert_eq!(
        store
            .claim(&missing, Path::new("relative"))
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
}

#[test]
fn second_opener_fails_at_once_in_the_same_process() {
    require_root!();
    let root = Root::new();
    let store = root.open();
    let err = Store::open(root.path(), StoreOptions::new(NODE)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StoreInUse);
    assert!(err.to_string().contains("store in use"), "{err}");
    // A read-only open takes no lock.
    let audit = Store::open_read_only(root.path(), StoreOptions::new(NODE)).unwrap();
    assert_eq!(
        audit.create(&request("x")).unwrap_err().kind(),
        ErrorKind::FailedPrecondition
    );
    drop(store);
    drop(root.open());
}

const OPEN_CHILD_ENV: &str = "LOCALSTORE_OPEN_CHILD";
const OPEN_CHILD_MARKER_ENV: &str = "LOCALSTORE_OPEN_CHILD_MARKER";

/// Exit codes of [`open_child_entry`], one per outcome. None is 0 or 101 (what the test harness
/// returns when the filter matched nothing, or when a test panicked), so neither can be
/// mistaken for an outcome.
const CHILD_OPENED: i32 = 40;
const CHILD_STORE_IN_USE: i32 = 41;
const CHILD_OTHER_ERROR: i32 = 42;

/// Not a test of its own: the child process of [`second_opener_fails_at_once_in_another_process`].
/// Without the environment variables it does nothing. With them it writes the marker file (proof
/// that this function ran), tries to open the store and exits with the code of the outcome.
#[test]
#[ignore = "the child process of second_opener_fails_at_once_in_another_process"]
#[allow(
    clippy::exit,
    reason = "the exit code is how the child reports its outcome"
)]
fn open_child_entry() {
    let (Some(root), Some(marker)) = (
        std::env::var_os(OPEN_CHILD_ENV),
        std::env::var_os(OPEN_CHILD_MARKER_ENV),
    ) else {
        return;
    };
    fs::write(&marker, b"ran").unwrap();
    let code = match Store::open(Path::new(&root), StoreOptions::new(NODE)) {
        Ok(_) => CHILD_OPENED,
        Err(e) if e.kind() == ErrorKind::StoreInUse => CHILD_STORE_IN_USE,
        Err(e) => {
            eprintln!("unexpected error: {e}");
            CHILD_OTHER_ERROR
        }
    };
    std::process::exit(code);
}

/// Runs [`open_child_entry`] in a new process of this test binary against `root`; returns its
/// exit code after checking that it really ran.
fn open_in_child(root: &Root) -> i32 {
    let scratch = tempfile::tempdir().unwrap();
    let marker = scratch.path().join("child-ran");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "lifecycle::open_child_entry",
            "--ignored",
            "--test-threads=1",
        ])
        .env(OPEN_CHILD_ENV, root.path())
        .env(OPEN_CHILD_MARKER_ENV, &marker)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(
        marker.exists(),
        "the child never ran open_child_entry (did the --exact filter match nothing?): {status}"
    );
    status
        .code()
        .unwrap_or_else(|| panic!("the child was killed: {status}"))
}

#[test]
fn second_opener_fails_at_once_in_another_process() {
    require_root!();
    let root = Root::new();
    let store = root.open();
    let start = std::time::Instant::now();
    assert_eq!(
        open_in_child(&root),
        CHILD_STORE_IN_USE,
        "the child should have seen StoreInUse"
    );
    assert!(
        start.elapsed() < std::time::Duration::from_secs(10),
        "the child blocked"
    );
    // Once the first opener is gone, another process may open the store.
    drop(store);
    assert_eq!(
        open_in_child(&root),
        CHILD_OPENED,
        "the child should have opened the store"
    );
}

/// Unblocks the child of [`drop_releases_the_lock_while_a_forked_child_has_not_exec_ed`] when
/// dropped, so a failing assertion cannot leave it (and the thread spawning it) hung forever.
struct LetChildExec(std::io::PipeWriter);

impl Drop for LetChildExec {
    fn drop(&mut self) {
        use std::io::Write as _;
        let _ = self.0.write_all(&[1]);
    }
}

/// A child forked while the store is open shares the lock's open file description until it
/// execs; under `cargo test` any test that spawns a process can fork one at any moment. Dropping
/// the store must release the lock anyway, so that a store reopened right after sees it free.
/// The child is held between fork and exec (by a `pre_exec` hook) for the whole check.
#[test]
#[allow(
    unsafe_code,
    reason = "pre_exec is the only way to hold a child between fork and exec"
)]
fn drop_releases_the_lock_while_a_forked_child_has_not_exec_ed() {
    use std::io::Read as _;
    use std::os::unix::process::CommandExt as _;

    require_root!();
    let root = Root::new();
    let store = root.open();
    let (mut ready_r, ready_w) = std::io::pipe().unwrap();
    let (go_r, go_w) = std::io::pipe().unwrap();
    let go = LetChildExec(go_w);
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .args(["--list", "--exact", "lifecycle::no_such_test"])
        .stdout(std::process::Stdio::null());
    // SAFETY: the hook runs in the forked child before exec and only calls write(2) and read(2)
    // on descriptors it owns: both are async-signal-safe, and nothing is allocated or locked.
    unsafe {
        command.pre_exec(move || {
            rustix::io::write(&ready_w, &[1])?;
            rustix::io::read(&go_r, &mut [0_u8])?;
            Ok(())
        });
    }
    // `spawn` returns only once the child has exec'd, so it runs on a thread of its own.
    let spawner = std::thread::spawn(move || command.spawn().unwrap());
    ready_r.read_exact(&mut [0_u8]).unwrap(); // The child now holds a copy of the lock's fd.

    drop(store);
    let reopened = Store::open(root.path(), StoreOptions::new(NODE));
    drop(go);
    let status = spawner.join().unwrap().wait().unwrap();
    assert!(status.success(), "{status}");
    if let Err(e) = reopened {
        panic!("reopening after drop failed while a forked child had not exec'd: {e}");
    }
}

#[test]
fn busy_volume_is_refused_at_once() {
    require_root!();
    let root = Root::new();
    let store = Arc::new(root.open());
    let vol = store.create(&request("pvc-1")).unwrap();
    let guard = store.lock_volume(&vol.volume_id).unwrap();
    for err in [
        store.delete(&vol.volume_id).unwrap_err(),
        store.create(&request("pvc-1")).unwrap_err(),
        store.claim(&vol.volume_id, Path::new("/t")).unwrap_err(),
        store.release(&vol.volume_id, Path::new("/t")).unwrap_err(),
    ] {
        assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
    }
    // Another thread sees the same.
    let s = Arc::clone(&store);
    let id = vol.volume_id;
    let err = std::thread::spawn(move || s.delete(&id).unwrap_err())
        .join()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::Busy);
    // Other volumes are unaffected, and the guard's own methods work.
    store.create(&request("pvc-2")).unwrap();
    guard.claim(Path::new("/t")).unwrap();
    guard.release(Path::new("/t")).unwrap();
    drop(guard);
    store.delete(&vol.volume_id).unwrap();
}

#[test]
fn missing_data_directory_is_unpublishable_and_never_recreated() {
    require_root!();
    let root = Root::new();
    let store = root.open();
    let vol = store.create(&request("pvc-1")).unwrap();
    drop(store);
    fs::remove_dir(root.path().join(vol.volume_id.to_string())).unwrap();
    let store = root.open();
    assert_eq!(store.reconciliation().unpublishable, vec![vol.volume_id]);
    assert!(store.reconciliation().needs_attention());
    assert_eq!(store.get(&vol.volume_id).unwrap().state, VolumeState::Ready);
    let err = store.publish_path(&vol.volume_id).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition);
    // Idempotent create returns the record but does not recreate the directory.
    store.create(&request("pvc-1")).unwrap();
    assert!(!store.data_dir(&vol.volume_id).exists());
    // A directory that reappears under a running store does not make it publishable.
    fs::create_dir(store.data_dir(&vol.volume_id)).unwrap();
    assert!(store.publish_path(&vol.volume_id).is_err());
    assert_eq!(store.unpublishable(), vec![vol.volume_id]);
    // Deleting it is still possible.
    store.delete(&vol.volume_id).unwrap();
    assert!(store.unpublishable().is_empty());
}

#[test]
fn orphans_are_reported_never_deleted() {
    require_root!();
    let root = Root::new();
    drop(root.open());
    let store_id = VolumeId::new(NodeHash::of(NODE).unwrap(), "lost").unwrap();
    let orphan = root.path().join(store_id.to_string());
    fs::create_dir(&orphan).unwrap();
    fs::write(orphan.join("data"), b"x").unwrap();
    fs::write(root.path().join("stray"), b"x").unwrap();
    let claim_only = VolumeId::new(NodeHash::of(NODE).unwrap(), "gone").unwrap();
    fs::write(
        root.metadata().join(format!("{claim_only}.consumer.json")),
        format!(r#"{{"format_version":1,"volume_id":"{claim_only}","target":"/t"}}"#),
    )
    .unwrap();
    let before = crate::common::snapshot(root.path());
    let store = root.open();
    let report = store.reconciliation();
    assert_eq!(report.orphan_directories, vec![store_id]);
    assert_eq!(report.orphan_claims, vec![claim_only]);
    assert_eq!(report.unknown_entries, vec![root.path().join("stray")]);
    assert_eq!(crate::common::snapshot(root.path()), before);
    // A create of the orphan's name does not adopt the directory.
    let err = store.create(&request("lost")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition, "{err}");
    assert_eq!(crate::common::snapshot(root.path()), before);
}

#[test]
fn read_only_open_writes_nothing() {
    require_root!();
    let root = Root::new();
    let store = root.open();
    let vol = store.create(&request("pvc-1")).unwrap();
    drop(store);
    // Leave an interrupted delete and a stray temp file behind.
    let record = root.record(&vol.volume_id);
    let text = fs::read_to_string(&record)
        .unwrap()
        .replace("\"ready\"", "\"deleting\"");
    fs::write(&record, text).unwrap();
    fs::write(
        root.metadata().join(format!(".{}.json.tmp", vol.volume_id)),
        b"{",
    )
    .unwrap();
    let before = crate::common::snapshot(root.path());
    let audit = Store::open_read_only(root.path(), StoreOptions::new(NODE)).unwrap();
    let report = audit.reconciliation();
    assert_eq!(report.left_in_place.len(), 1);
    assert_eq!(report.temp_files.len(), 1);
    assert_eq!(
        audit.get(&vol.volume_id).unwrap().state,
        VolumeState::Deleting
    );
    for err in [
        audit.delete(&vol.volume_id).unwrap_err(),
        audit.claim(&vol.volume_id, Path::new("/t")).unwrap_err(),
        audit.release(&vol.volume_id, Path::new("/t")).unwrap_err(),
    ] {
        assert!(matches!(err, localstore::Error::ReadOnly { .. }), "{err}");
    }
    drop(audit);
    assert_eq!(crate::common::snapshot(root.path()), before);
    // A writable open finishes the delete.
    let store = root.open();
    assert_eq!(store.reconciliation().deletes_finished, vec![vol.volume_id]);
    assert_consistent(&store);
}

#[test]
fn read_only_open_of_an_uninitialised_store_is_refused() {
    require_root!();
    let root = Root::new();
    let err = Store::open_read_only(root.path(), StoreOptions::new(NODE)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsafeStore, "{err}");
    assert!(fs::read_dir(root.path()).unwrap().next().is_none());
}

#[test]
fn store_root_must_be_safe() {
    require_root!();
    let root = Root::new();
    let path = root.path();
    let open = |p: &Path| Store::open(p, StoreOptions::new(NODE)).unwrap_err();

    let err = open(Path::new("relative/store"));
    assert!(err.to_string().contains("absolute"), "{err}");

    fs::set_permissions(path, fs::Permissions::from_mode(0o770)).unwrap();
    let err = open(path);
    assert!(
        err.to_string().contains("writable by group or others"),
        "{err}"
    );
    fs::set_permissions(path, fs::Permissions::from_mode(0o700)).unwrap();

    let real = path.join("real");
    fs::create_dir(&real).unwrap();
    fs::create_dir(real.join("store")).unwrap();
    std::os::unix::fs::symlink(&real, path.join("link")).unwrap();
    let err = open(&path.join("link/store"));
    assert_eq!(err.kind(), ErrorKind::UnsafeStore);
    assert!(err.to_string().contains("symlink"), "{err}");
    let err = open(&path.join("link"));
    assert!(err.to_string().contains("symlink"), "{err}");

    fs::write(path.join("file"), b"").unwrap();
    let err = open(&path.join("file"));
    assert!(err.to_string().contains("not a directory"), "{err}");

    rustix::fs::chown(
        real.join("store"),
        Some(rustix::process::Uid::from_raw(1000)),
        None,
    )
    .unwrap();
    let err = open(&real.join("store"));
    assert!(
        err.to_string().contains("neither root nor the driver user"),
        "{err}"
    );
    // Nothing was created anywhere.
    assert!(!real.join("store/.metadata").exists());
    assert!(!path.join(".metadata").exists());
}

#[test]
fn existing_metadata_with_wrong_owner_or_mode_is_refused() {
    require_root!();
    let root = Root::new();
    drop(root.open());
    fs::set_permissions(root.metadata(), fs::Permissions::from_mode(0o770)).unwrap();
    let err = Store::open(root.path(), StoreOptions::new(NODE)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsafeStore);
    assert!(err.to_string().contains(".metadata"), "{err}");
    assert!(err.to_string().contains("0770"), "{err}");
    fs::set_permissions(root.metadata(), fs::Permissions::from_mode(0o700)).unwrap();
    drop(root.open());
    rustix::fs::chown(
        root.metadata(),
        Some(rustix::process::Uid::from_raw(1000)),
        None,
    )
    .unwrap();
    let err = Store::open(root.path(), StoreOptions::new(NODE)).unwrap_err();
    assert!(err.to_string().contains("not the driver user"), "{err}");
}

#[test]
fn own_mount_check_on_parsed_tables() {
    let table = b"\
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
30 22 8:16 / /var/lib/tak-os/local-volumes rw,relatime - ext4 /dev/sdb rw
31 22 8:1 /var/lib/host-dir /mnt/bind rw,relatime - ext4 /dev/sda1 rw
";
    let check = |p: &str| localstore::own_mount_problem(table, Path::new(p)).unwrap();
    assert_eq!(check("/var/lib/tak-os/local-volumes"), None);
    assert_eq!(check("/var/lib/tak-os/local-volumes/"), None);
    let inside = check("/var/lib/tak-os/local-volumes/sub").unwrap();
    assert!(inside.contains("not a mount point"), "{inside}");
    let root_fs = check("/var/lib/other").unwrap();
    assert!(root_fs.contains("not a mount point"), "{root_fs}");
    // A hostPath bind of a root-disk directory is a mount point, but not a filesystem root.
    let bind = check("/mnt/bind").unwrap();
    assert!(bind.contains("/var/lib/host-dir"), "{bind}");
    assert!(localstore::own_mount_problem(b"garbage\n", Path::new("/x")).is_err());
}

#[test]
fn require_mount_on_the_real_table() {
    require_root!();
    // A temp directory is not the root of its own filesystem.
    let root = Root::new();
    let err = Store::open(root.path(), StoreOptions::new(NODE).require_mount(true)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsafeStore);
    assert!(err.to_string().contains("own filesystem"), "{err}");
    assert!(!root.metadata().exists());
}

#[test]
fn errors_name_the_value() {
    let err = "V1.abc".parse::<VolumeId>().unwrap_err();
    assert!(err.to_string().contains("V1.abc"), "{err}");
    let msg = localstore::Error::CapacityExhausted {
        requested_bytes: 7,
        available_bytes: 3,
    }
    .to_string();
    assert_eq!(msg, "requested 7 bytes but only 3 are available");
}

#[test]
fn usage_and_check_answer_for_the_store_and_its_volumes() {
    require_root!();
    let root = Root::new();
    let store = root.open();
    let vol = store.create(&request("pvc-usage")).unwrap();
    let whole = store.usage().unwrap();
    assert!(
        whole.total_bytes > 0 && whole.used_bytes <= whole.total_bytes,
        "{whole:?}"
    );
    assert!(whole.available_inodes <= whole.total_inodes);
    let volume = store.volume_usage(&vol.volume_id).unwrap();
    assert_eq!(
        volume.total_bytes, whole.total_bytes,
        "the same filesystem here"
    );
    let capacity = store.capacity().unwrap();
    assert!(capacity.free_inodes > 0);
    store.check().unwrap();

    // The data directory swapped for a symbolic link is not followed.
    let data = store.data_dir(&vol.volume_id);
    fs::remove_dir(&data).unwrap();
    std::os::unix::fs::symlink("/", &data).unwrap();
    let err = store.volume_usage(&vol.volume_id).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    fs::remove_file(&data).unwrap();
    fs::create_dir(&data).unwrap();

    // The metadata directory moved away: the store is no longer where it was opened.
    let metadata = root.path().join(localstore::METADATA_DIR);
    let moved = root.path().join("moved");
    fs::rename(&metadata, &moved).unwrap();
    let err = store.check().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsafeStore, "{err}");
    // Another directory under the name is not the one the store holds open either.
    fs::create_dir(&metadata).unwrap();
    let err = store.check().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsafeStore, "{err}");
    fs::remove_dir(&metadata).unwrap();
    fs::rename(&moved, &metadata).unwrap();
    store.check().unwrap();
}
