//! Helpers shared by the integration tests.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use localstore::{Capability, CreateRequest, Store, StoreOptions, VolumeId, VolumeState};

pub(crate) const NODE: &str = "node-a";

/// A fresh store root (a root-owned 0700 temp directory) that is removed on drop.
pub(crate) struct Root {
    dir: tempfile::TempDir,
}

impl Root {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        Self { dir }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn open(&self) -> Store {
        Store::open(self.path(), StoreOptions::new(NODE)).unwrap()
    }

    pub(crate) fn metadata(&self) -> PathBuf {
        self.path().join(".metadata")
    }

    pub(crate) fn record(&self, id: &VolumeId) -> PathBuf {
        self.metadata().join(format!("{id}.json"))
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        // Mounts a privileged test made below the root would keep the directory from being
        // removed.
        test_support::detach_mounts_below(self.dir.path());
    }
}

/// Whether the tests run as root (store roots must be root-owned).
/// Whether a test that needs root may go on. Without root it prints `SKIPPED` and returns
/// `false` on a developer machine, and panics when `CI=true`: in CI a skipped test is a failure.
pub(crate) fn root_or_skip(test: &str) -> bool {
    test_support::requires_root(test, "store roots must be root-owned")
}

/// Returns early from a test that needs root, loudly; fails the test instead when `CI=true`.
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::common::root_or_skip(concat!(module_path!(), " line ", line!())) {
            return;
        }
    };
}

pub(crate) fn request(name: &str) -> CreateRequest {
    CreateRequest::new(name, Capability::mount("SINGLE_NODE_WRITER"))
}

/// Everything observable about a tree: per relative path, its type, mode, owner, size, and its
/// content or link target.
pub(crate) type Snapshot = BTreeMap<PathBuf, String>;

pub(crate) fn snapshot(root: &Path) -> Snapshot {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            let detail = if meta.file_type().is_symlink() {
                format!("link -> {:?}", fs::read_link(&path).unwrap())
            } else if meta.is_dir() {
                stack.push(path.clone());
                "dir".to_owned()
            } else if meta.len() > 64 * 1024 {
                format!("file of {} bytes", meta.len())
            } else if meta.file_type().is_file() {
                format!(
                    "file {:?}",
                    String::from_utf8_lossy(&fs::read(&path).unwrap())
                )
            } else {
                format!("special {:?}", meta.file_type())
            };
            out.insert(
                rel,
                format!(
                    "{detail} mode {:o} uid {} ino {}",
                    meta.mode(),
                    meta.uid(),
                    meta.ino()
                ),
            );
        }
    }
    out
}

/// The store-level invariants that must hold after any reconciliation: every record is a
/// readable `ready` record with a data directory, every data directory has a record, no temp
/// file is left, and the report asks for no attention.
pub(crate) fn assert_consistent(store: &Store) {
    let report = store.reconciliation();
    assert!(!report.needs_attention(), "{report:#?}");
    let records = store.list().unwrap();
    for record in &records {
        assert_eq!(record.state, VolumeState::Ready, "{record:?}");
        assert!(store.data_dir(&record.volume_id).is_dir(), "{record:?}");
        store.publish_path(&record.volume_id).unwrap();
    }
    let meta = store.root().join(".metadata");
    for entry in fs::read_dir(&meta).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(!name.ends_with(".tmp"), "temp file {name} left behind");
    }
    for entry in fs::read_dir(store.root()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name == ".metadata" {
            continue;
        }
        let id: VolumeId = name.parse().unwrap();
        assert!(
            records.iter().any(|r| r.volume_id == id),
            "orphan directory {name}"
        );
    }
    for claim in store.claims().unwrap() {
        assert!(
            records.iter().any(|r| r.volume_id == claim.volume_id),
            "orphan claim {claim:?}"
        );
    }
}

pub(crate) fn options() -> StoreOptions {
    StoreOptions::new(NODE)
}
