//! Bad input gets a clear error and leaves the disk exactly as it was.

use std::fs;
use std::path::Path;

use localstore::{CapacityRange, ErrorKind, Store, StoreOptions, VolumeId};

use crate::common::{NODE, Root, request, snapshot};
use crate::require_root;

/// A store with one ready volume and one claim, opened and closed once so the lock file exists.
fn populated() -> (Root, VolumeId) {
    let root = Root::new();
    let store = root.open();
    let vol = store.create(&request("pvc-1")).unwrap();
    fs::write(store.data_dir(&vol.volume_id).join("file"), b"data").unwrap();
    store
        .claim(&vol.volume_id, Path::new("/consumer/1/r/mount"))
        .unwrap();
    store.create(&request("pvc-2")).unwrap();
    (root, vol.volume_id)
}

#[test]
fn bad_create_requests_change_nothing() {
    require_root!();
    let (root, _) = populated();
    let store = root.open();
    let before = snapshot(root.path());
    let cases = [
        (request(""), ErrorKind::InvalidArgument, "empty"),
        (request("a\0b"), ErrorKind::InvalidArgument, "NUL"),
        (
            request(&"n".repeat(10 * 1024)),
            ErrorKind::InvalidArgument,
            "too long",
        ),
        (
            request("pvc-3").with_capacity(CapacityRange {
                required_bytes: 10,
                limit_bytes: 9,
            }),
            ErrorKind::InvalidArgument,
            "limit 9 is below required 10",
        ),
        (
            request("pvc-3").with_capacity(CapacityRange::at_least(u64::MAX)),
            ErrorKind::CapacityExhausted,
            "18446744073709551615",
        ),
        (
            {
                let mut r = request("pvc-3");
                r.capabilities.clear();
                r
            },
            ErrorKind::InvalidArgument,
            "capability",
        ),
        (
            request("pvc-3").with_parameter("", "v"),
            ErrorKind::InvalidArgument,
            "parameter key",
        ),
        (
            request("pvc-3").with_parameter("k", "a\0"),
            ErrorKind::InvalidArgument,
            "NUL",
        ),
        (
            request("pvc-3").with_parameter("k", "v".repeat(64 * 1024)),
            ErrorKind::InvalidArgument,
            "too large",
        ),
    ];
    for (req, kind, needle) in cases {
        let err = store.create(&req).unwrap_err();
        assert_eq!(err.kind(), kind, "{err}");
        let msg = err.to_string();
        assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
        assert!(msg.len() < 400, "message too long: {msg}");
    }
    assert_eq!(snapshot(root.path()), before);
}

#[test]
fn malformed_volume_ids_are_invalid_arguments() {
    let good = VolumeId::new(localstore::NodeHash::of(NODE).unwrap(), "x")
        .unwrap()
        .to_string();
    let cases = [
        good.to_uppercase(),
        format!("v1.{}", &good[3..].to_uppercase()),
        good[..good.len() - 2].to_owned(),
        format!("{good}ab"),
        good.replacen("v1.", "", 1),
        String::new(),
        "v1..".to_owned(),
    ];
    for case in cases {
        let err = case.parse::<VolumeId>().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{case}");
        assert!(err.to_string().starts_with("invalid volume id"), "{err}");
    }
}

#[test]
fn metadata_symlink_is_refused() {
    require_root!();
    let root = Root::new();
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), root.metadata()).unwrap();
    let before = (snapshot(root.path()), snapshot(elsewhere.path()));
    for read_only in [false, true] {
        let err = if read_only {
            Store::open_read_only(root.path(), StoreOptions::new(NODE)).unwrap_err()
        } else {
            Store::open(root.path(), StoreOptions::new(NODE)).unwrap_err()
        };
        assert_eq!(err.kind(), ErrorKind::UnsafeStore, "{err}");
        assert!(err.to_string().contains(".metadata"), "{err}");
        assert!(err.to_string().contains("symlink"), "{err}");
    }
    assert_eq!((snapshot(root.path()), snapshot(elsewhere.path())), before);
}

#[test]
fn lock_file_symlink_is_refused() {
    require_root!();
    let root = Root::new();
    drop(root.open());
    let target = root.path().join("elsewhere");
    fs::remove_file(root.metadata().join("driver.lock")).unwrap();
    std::os::unix::fs::symlink(&target, root.metadata().join("driver.lock")).unwrap();
    let before = snapshot(root.path());
    let err = Store::open(root.path(), StoreOptions::new(NODE)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsafeStore, "{err}");
    assert_eq!(snapshot(root.path()), before);
}

/// Replaces the first volume's record with `bad` and checks that opening reports it, and that
/// every operation on that volume fails clearly and changes nothing.
fn corrupt_record_is_reported_and_untouched(bad: impl FnOnce(&Path)) {
    let (root, id) = populated();
    bad(&root.record(&id));
    let before = snapshot(root.path());
    let store = root.open();
    let report = store.reconciliation();
    assert_eq!(report.unreadable.len(), 1, "{report:#?}");
    assert_eq!(report.unreadable[0].path, root.record(&id));
    assert!(report.orphan_directories.is_empty(), "{report:#?}");
    for err in [
        store.get(&id).unwrap_err(),
        store.create(&request("pvc-1")).unwrap_err(),
        store.delete(&id).unwrap_err(),
        store
            .claim(&id, Path::new("/consumer/1/r/mount"))
            .unwrap_err(),
        store.publish_path(&id).unwrap_err(),
    ] {
        assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
        assert!(err.to_string().contains(&id.to_string()), "{err}");
    }
    // Other volumes still work, and listing skips only the unreadable record.
    let pvc2 = store.volume_id("pvc-2").unwrap();
    store.get(&pvc2).unwrap();
    let listed: Vec<_> = store.list().unwrap().iter().map(|r| r.volume_id).collect();
    assert_eq!(listed, vec![pvc2]);
    let (records, problems) = store.list_with_problems().unwrap();
    assert_eq!(records, store.list().unwrap());
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_eq!(problems[0].path, root.record(&id));
    assert_eq!(problems[0], report.unreadable[0]);
    drop(store);
    assert_eq!(snapshot(root.path()), before);
}

#[test]
fn record_replaced_by_a_symlink() {
    require_root!();
    corrupt_record_is_reported_and_untouched(|record| {
        let copy = record.with_extension("saved");
        fs::rename(record, &copy).unwrap();
        std::os::unix::fs::symlink(&copy, record).unwrap();
    });
}

#[test]
fn record_replaced_by_garbage_json() {
    require_root!();
    corrupt_record_is_reported_and_untouched(|record| {
        fs::write(record, b"{\"format_version\": 1, \"name\": ").unwrap();
    });
}

#[test]
fn record_replaced_by_a_directory() {
    require_root!();
    corrupt_record_is_reported_and_untouched(|record| {
        fs::remove_file(record).unwrap();
        fs::create_dir(record).unwrap();
    });
}

#[test]
fn record_replaced_by_a_fifo() {
    require_root!();
    corrupt_record_is_reported_and_untouched(|record| {
        fs::remove_file(record).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            record,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
    });
}

#[test]
fn record_from_a_newer_format() {
    require_root!();
    corrupt_record_is_reported_and_untouched(|record| {
        let text = fs::read_to_string(record).unwrap();
        fs::write(
            record,
            text.replace("\"format_version\": 1", "\"format_version\": 7"),
        )
        .unwrap();
    });
}

#[test]
fn record_under_another_volumes_name() {
    require_root!();
    corrupt_record_is_reported_and_untouched(|record| {
        let text = fs::read_to_string(record).unwrap();
        fs::write(record, text.replace("\"pvc-1\"", "\"pvc-9\"")).unwrap();
    });
}

#[test]
fn huge_record_is_not_read_into_memory() {
    require_root!();
    corrupt_record_is_reported_and_untouched(|record| {
        let f = fs::OpenOptions::new().write(true).open(record).unwrap();
        f.set_len(1 << 30).unwrap();
    });
}
