//! Real mounts, as root, inside a private mount namespace per test, and the contract that the
//! fake and the Linux mounter both keep.

mod contract;

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use mounter::{
    Atime, BindOptions, Error, LinuxMounter, MountAttrs, MountCalls, Mounter, Probe, TargetRoot,
    Unmounted,
};

fn mounters() -> Vec<(&'static str, LinuxMounter)> {
    vec![
        (
            "kernel probe, new mount API",
            LinuxMounter::with_methods(Probe::Kernel, MountCalls::New),
        ),
        (
            "mount table, legacy calls",
            LinuxMounter::with_methods(Probe::MountTable, MountCalls::Legacy),
        ),
    ]
}

fn read_only() -> BindOptions {
    BindOptions {
        attrs: MountAttrs {
            read_only: true,
            nosuid: true,
            nodev: true,
            noexec: true,
        },
        atime: Atime::Never,
    }
}

#[test]
fn bind_then_identity_checked_unmount_then_rmdir() {
    if !test_support::private_mount_namespace("bind_then_identity_checked_unmount_then_rmdir") {
        return;
    }
    for (name, mounter) in mounters() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("store/volume");
        fs::create_dir_all(&source).unwrap();
        fs::write(source.join("file"), b"data").unwrap();
        fs::create_dir_all(dir.path().join("kubelet/pod")).unwrap();
        let root = TargetRoot::new(dir.path().join("kubelet")).unwrap();
        let target = root.resolve(&dir.path().join("kubelet/pod/mount")).unwrap();

        assert!(target.create_dir(0o750).unwrap());
        assert_eq!(mounter.mounted_at(&target).unwrap(), None, "{name}");
        mounter
            .bind(&source, &target, BindOptions::default())
            .unwrap();

        let expected = mounter.source_identity(&source).unwrap();
        let found = mounter.mounted_at(&target).unwrap().expect("mounted");
        assert_eq!(found.identity, expected, "{name}");
        assert!(!found.attrs.read_only, "{name}");
        assert_eq!(
            fs::read(target.path().join("file")).unwrap(),
            b"data",
            "{name}"
        );

        // The two probes agree on the same mount.
        for (other, m) in mounters() {
            assert_eq!(
                m.mounted_at(&target).unwrap().unwrap().identity,
                expected,
                "{other}"
            );
        }

        assert!(
            matches!(target.remove_dir(), Err(Error::StillMounted { .. })),
            "{name}"
        );
        assert_eq!(
            mounter.unmount(&target, &expected).unwrap(),
            Unmounted::Unmounted
        );
        assert_eq!(
            mounter.unmount(&target, &expected).unwrap(),
            Unmounted::NotMounted
        );
        assert!(target.remove_dir().unwrap());
        assert_eq!(
            fs::read(source.join("file")).unwrap(),
            b"data",
            "the source is untouched"
        );
    }
}

#[test]
fn read_only_bind_refuses_writes() {
    if !test_support::private_mount_namespace("read_only_bind_refuses_writes") {
        return;
    }
    for (name, mounter) in mounters() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("volume");
        fs::create_dir(&source).unwrap();
        let root = TargetRoot::new(dir.path()).unwrap();
        let target = root.resolve(&dir.path().join("mount")).unwrap();
        target.create_dir(0o750).unwrap();

        mounter.bind(&source, &target, read_only()).unwrap();
        let found = mounter.mounted_at(&target).unwrap().unwrap();
        assert_eq!(found.attrs, read_only().attrs, "{name}");
        let err = fs::write(target.path().join("new"), b"x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{name}: {err}");
        assert!(!source.join("new").exists());

        mounter
            .unmount(&target, &mounter.source_identity(&source).unwrap())
            .unwrap();
    }
}

#[test]
fn a_foreign_mount_is_never_unmounted() {
    if !test_support::private_mount_namespace("a_foreign_mount_is_never_unmounted") {
        return;
    }
    for (name, mounter) in mounters() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("volume");
        fs::create_dir(&source).unwrap();
        let root = TargetRoot::new(dir.path()).unwrap();
        let target = root.resolve(&dir.path().join("mount")).unwrap();
        target.create_dir(0o750).unwrap();
        rustix::mount::mount(
            "tmpfs",
            target.path(),
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            None,
        )
        .unwrap();

        let expected = mounter.source_identity(&source).unwrap();
        let err = mounter.unmount(&target, &expected).unwrap_err();
        assert!(matches!(err, Error::ForeignMount { .. }), "{name}: {err}");
        let still = mounter.mounted_at(&target).unwrap().unwrap();
        assert_eq!(still.identity.fs_type, "tmpfs", "{name}");
        rustix::mount::unmount(target.path(), rustix::mount::UnmountFlags::empty()).unwrap();
    }
}

#[test]
fn a_mount_on_a_parent_is_refused() {
    if !test_support::private_mount_namespace("a_mount_on_a_parent_is_refused") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pods = dir.path().join("pods");
    fs::create_dir(&pods).unwrap();
    rustix::mount::mount(
        "tmpfs",
        &pods,
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        None,
    )
    .unwrap();
    fs::create_dir(pods.join("p")).unwrap();

    let root = TargetRoot::new(dir.path()).unwrap();
    let err = root.resolve(&pods.join("p/mount")).unwrap_err();
    assert!(matches!(err, Error::MountOnParent { .. }), "{err}");
    // The root itself may be a mount point (a hostPath inside a pod always is).
    let root = TargetRoot::new(&pods).unwrap();
    root.resolve(&pods.join("p/mount")).unwrap();
    test_support::detach_mounts_below(dir.path());
}

#[test]
fn binding_a_missing_source_creates_nothing() {
    if !test_support::private_mount_namespace("binding_a_missing_source_creates_nothing") {
        return;
    }
    for (name, mounter) in mounters() {
        let dir = tempfile::tempdir().unwrap();
        let root = TargetRoot::new(dir.path()).unwrap();
        let target = root.resolve(&dir.path().join("mount")).unwrap();
        target.create_dir(0o750).unwrap();
        let missing = dir.path().join("store/missing");
        let err = mounter
            .bind(&missing, &target, BindOptions::default())
            .unwrap_err();
        match &err {
            Error::Io { source, .. } => assert_eq!(source.kind(), ErrorKind::NotFound, "{name}"),
            other => panic!("{name}: {other}"),
        }
        assert!(!Path::new(&missing).exists(), "{name}");
        assert_eq!(mounter.mounted_at(&target).unwrap(), None, "{name}");
    }
}

#[test]
fn kernels_with_statmount_sources_answer_the_per_target_probe() {
    // statmount's sb_source field arrived in Linux 6.13; from there on no per-target call may
    // need the whole mount table.
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if version >= (6, 13) {
        assert!(
            LinuxMounter::kernel_probe_available(),
            "kernel {release} should answer statmount"
        );
    } else {
        eprintln!(
            "NOTE: kernel {release} predates statmount sources; the mount table fallback is used"
        );
    }
}

#[test]
fn binds_inherit_the_source_mount_flags_on_every_path() {
    if !test_support::private_mount_namespace("binds_inherit_the_source_mount_flags_on_every_path")
    {
        return;
    }
    for (name, mounter) in mounters() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        fs::create_dir(&store).unwrap();
        use rustix::mount::MountFlags;
        rustix::mount::mount(
            "tmpfs",
            &store,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            None,
        )
        .unwrap();
        let source = store.join("volume");
        fs::create_dir(&source).unwrap();
        let inherited = mounter.source_mount(&source).unwrap().attrs;
        assert!(
            inherited.nosuid && inherited.nodev && !inherited.read_only,
            "{name}"
        );

        let root = TargetRoot::new(dir.path()).unwrap();
        let target = root.resolve(&dir.path().join("mount")).unwrap();
        target.create_dir(0o750).unwrap();
        let ro = BindOptions {
            attrs: MountAttrs {
                read_only: true,
                ..Default::default()
            },
            ..Default::default()
        };
        mounter.bind(&source, &target, ro).unwrap();
        let found = mounter.mounted_at(&target).unwrap().unwrap();
        assert_eq!(
            found.attrs,
            ro.attrs.union(inherited),
            "{name}: a bind keeps nosuid and nodev"
        );
        mounter
            .unmount(&target, &mounter.source_identity(&source).unwrap())
            .unwrap();
        test_support::detach_mounts_below(dir.path());
    }
}
