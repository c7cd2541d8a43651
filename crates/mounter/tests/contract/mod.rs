//! The contract every `Mounter` keeps, run against the fake and the Linux mounter alike, so that
//! a test of the drivers over the fake proves something about the kernel.
//!
//! Only what the trait can observe is compared: what is mounted where, with which identity and
//! flags, what an unmount does, and which publications of a volume exist. (That a read-only bind
//! refuses writes is the kernel's business, tested in `mounts.rs`.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr,
    reason = "scenario helpers fail loudly and say which mounter failed"
)]

use std::fs;
use std::path::PathBuf;

use mounter::{
    BindOptions, Error, FakeMounter, MountAttrs, Mounter, Target, TargetRoot, Unmounted,
};
use tempfile::TempDir;

/// A temporary directory holding a store of sources and a root for targets.
struct Fixture {
    dir: TempDir,
    root: TargetRoot,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("targets")).unwrap();
        let root = TargetRoot::new(dir.path().join("targets")).unwrap();
        Fixture { dir, root }
    }

    /// A source directory (created with its parents).
    fn source(&self, rel: &str) -> PathBuf {
        let path = self.dir.path().join("store").join(rel);
        fs::create_dir_all(&path).unwrap();
        path
    }

    /// A validated target below the root; its directory is not created.
    fn target(&self, name: &str) -> Target {
        self.root.resolve(&self.root.path().join(name)).unwrap()
    }

    /// A target whose directory exists.
    fn target_dir(&self, name: &str) -> Target {
        let target = self.target(name);
        target.create_dir(0o750).unwrap();
        target
    }
}

type Scenario = fn(&dyn Mounter, &Fixture);

/// Every scenario, by name.
const SCENARIOS: &[(&str, Scenario)] = &[
    ("bind", bind_shows_the_source_identity_at_the_target),
    ("read-only bind", read_only_bind_is_reported_read_only),
    (
        "identity-checked unmount",
        unmount_refuses_a_foreign_identity_and_keeps_the_mount,
    ),
    ("publications", publications_of_a_volume_are_listed),
    ("probes", probes_answer_for_live_and_absent_targets),
];

fn bind_shows_the_source_identity_at_the_target(m: &dyn Mounter, f: &Fixture) {
    let source = f.source("v1");
    let target = f.target_dir("t");
    m.bind(&source, &target, BindOptions::default()).unwrap();
    let found = m.mounted_at(&target).unwrap().expect("mounted");
    let expected = m.source_mount(&source).unwrap();
    assert_eq!(found.identity, expected.identity);
    assert_eq!(found.identity, m.source_identity(&source).unwrap());
    assert_eq!(
        found.attrs, expected.attrs,
        "a bind inherits the source's flags"
    );
    assert!(!found.attrs.read_only);
    assert_eq!(
        m.unmount(&target, &expected.identity).unwrap(),
        Unmounted::Unmounted
    );
    assert!(m.remove_target(&target).unwrap());
}

fn read_only_bind_is_reported_read_only(m: &dyn Mounter, f: &Fixture) {
    let source = f.source("v1");
    let target = f.target_dir("t");
    let options = BindOptions {
        attrs: MountAttrs {
            read_only: true,
            nosuid: true,
            ..Default::default()
        },
        ..Default::default()
    };
    m.bind(&source, &target, options).unwrap();
    let found = m.mounted_at(&target).unwrap().expect("mounted");
    let inherited = m.source_mount(&source).unwrap().attrs;
    assert_eq!(found.attrs, options.attrs.union(inherited));
    assert!(found.attrs.read_only && found.attrs.nosuid);
    assert_eq!(found.identity, m.source_identity(&source).unwrap());
    m.unmount(&target, &found.identity).unwrap();
}

fn unmount_refuses_a_foreign_identity_and_keeps_the_mount(m: &dyn Mounter, f: &Fixture) {
    let source = f.source("v1");
    let other = f.source("v2");
    let target = f.target_dir("t");
    m.bind(&source, &target, BindOptions::default()).unwrap();
    let mine = m.source_identity(&source).unwrap();
    let foreign = m.source_identity(&other).unwrap();
    assert_ne!(mine, foreign);

    let err = m.unmount(&target, &foreign).unwrap_err();
    match &err {
        Error::ForeignMount {
            path,
            found,
            expected,
        } => {
            assert_eq!(path, target.path());
            assert_eq!(**found, mine);
            assert_eq!(**expected, foreign);
        }
        other => panic!("expected a foreign mount, got {other}"),
    }
    assert_eq!(
        m.mounted_at(&target).unwrap().map(|f| f.identity),
        Some(mine.clone()),
        "a refused unmount leaves the mount"
    );
    assert!(matches!(
        m.remove_target(&target),
        Err(Error::StillMounted { .. })
    ));

    assert_eq!(m.unmount(&target, &mine).unwrap(), Unmounted::Unmounted);
    assert_eq!(m.unmount(&target, &mine).unwrap(), Unmounted::NotMounted);
    assert_eq!(m.unmount(&target, &foreign).unwrap(), Unmounted::NotMounted);
    assert!(m.remove_target(&target).unwrap());
}

fn publications_of_a_volume_are_listed(m: &dyn Mounter, f: &Fixture) {
    let volume = f.source("v1");
    let sub = f.source("v1/sub");
    let other = f.source("v10");
    let identity = m.source_identity(&volume).unwrap();
    assert_eq!(m.publications(&identity).unwrap(), Vec::<PathBuf>::new());

    let a = f.target_dir("a");
    let b = f.target_dir("b");
    let c = f.target_dir("c");
    m.bind(&volume, &a, BindOptions::default()).unwrap();
    m.bind(&sub, &b, BindOptions::default()).unwrap();
    m.bind(&other, &c, BindOptions::default()).unwrap();
    let mut listed = m.publications(&identity).unwrap();
    listed.sort();
    assert_eq!(
        listed,
        vec![a.path().to_owned(), b.path().to_owned()],
        "the volume and a subPath of it, not another volume whose name it prefixes"
    );
    let listed = m.publications(&m.source_identity(&other).unwrap()).unwrap();
    assert_eq!(listed, vec![c.path().to_owned()]);

    m.unmount(&a, &identity).unwrap();
    assert_eq!(
        m.publications(&identity).unwrap(),
        vec![b.path().to_owned()]
    );
    m.unmount(&b, &m.source_identity(&sub).unwrap()).unwrap();
    m.unmount(&c, &m.source_identity(&other).unwrap()).unwrap();
    assert_eq!(m.publications(&identity).unwrap(), Vec::<PathBuf>::new());
}

fn probes_answer_for_live_and_absent_targets(m: &dyn Mounter, f: &Fixture) {
    let source = f.source("v1");
    let absent = f.target("absent");
    assert_eq!(m.mounted_at(&absent).unwrap(), None, "no directory at all");
    let empty = f.target_dir("empty");
    assert_eq!(m.mounted_at(&empty).unwrap(), None, "a plain directory");

    let live = f.target_dir("live");
    m.bind(&source, &live, BindOptions::default()).unwrap();
    let found = m.mounted_at(&live).unwrap().expect("a live mount");
    assert_eq!(found.identity, m.source_identity(&source).unwrap());
    assert_eq!(m.mounted_at(&empty).unwrap(), None, "only the live target");
    m.unmount(&live, &found.identity).unwrap();
    assert_eq!(m.mounted_at(&live).unwrap(), None, "gone after the unmount");
}

#[test]
fn the_fake_mounter_keeps_the_contract() {
    for (name, scenario) in SCENARIOS {
        let fixture = Fixture::new();
        let fake = FakeMounter::new();
        scenario(&fake, &fixture);
        assert!(fake.mounts().is_empty(), "{name}: mounts left behind");
    }
}

#[test]
fn the_linux_mounter_keeps_the_contract() {
    if !test_support::private_mount_namespace("the_linux_mounter_keeps_the_contract") {
        return;
    }
    for (methods, linux) in super::mounters() {
        for (name, scenario) in SCENARIOS {
            let fixture = Fixture::new();
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                scenario(&linux, &fixture)
            }));
            // Detached either way, so that the temporary directory can go.
            let left = test_support::detach_mounts_below(fixture.dir.path());
            if let Err(panic) = outcome {
                eprintln!("contract scenario {name:?} failed with {methods}");
                std::panic::resume_unwind(panic);
            }
            assert_eq!(left, 0, "{methods}, {name}: mounts left behind");
        }
    }
}
