//! A stateful fake of the mount table, for tests of code that mounts.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::{BindOptions, Error, MountAttrs, MountIdentity, MountedAt, Mounter, Target, Unmounted};

/// An operation of the fake, for failure injection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FakeOp {
    /// [`Mounter::bind`].
    Bind,
    /// [`Mounter::unmount`].
    Unmount,
    /// [`Mounter::mounted_at`].
    MountedAt,
    /// [`Mounter::publications`].
    Publications,
}

/// A mount table in memory.
///
/// Target directories are real (tests create them in a temporary directory); mounts are not.
/// A bind of a source has the identity `0:0`, root = the source path, type `fake`, source
/// `fake`, unless [`FakeMounter::set_source_identity`] says otherwise; a bind inherits the
/// flags set with [`FakeMounter::set_source_attrs`], as the kernel's binds do. Mounts at one target
/// stack like the kernel's, [`Mounter::publications`] lists every mount of the table (covered
/// ones included) as `/proc/self/mountinfo` would, and [`FakeMounter::fail_next`] makes the next
/// call of an operation fail.
#[derive(Debug, Default)]
pub struct FakeMounter {
    state: Mutex<FakeState>,
}

#[derive(Debug, Default)]
struct FakeState {
    mounts: BTreeMap<PathBuf, Vec<MountedAt>>,
    sources: BTreeMap<PathBuf, MountedAt>,
    failures: BTreeMap<FakeOp, i32>,
    next_id: u64,
}

impl FakeMounter {
    /// An empty mount table.
    pub fn new() -> Self {
        FakeMounter::default()
    }

    fn state(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes the next call of `op` fail with the OS error `errno`.
    pub fn fail_next(&self, op: FakeOp, errno: i32) {
        self.state().failures.insert(op, errno);
    }

    /// Gives binds of `source`, and of every path below it, this identity (below it, with
    /// the root extended by the rest of the path).
    pub fn set_source_identity(&self, source: &Path, identity: MountIdentity) {
        let attrs = self
            .state()
            .sources
            .get(source)
            .map(|m| m.attrs)
            .unwrap_or_default();
        self.state().sources.insert(
            source.to_owned(),
            MountedAt {
                mount_id: 0,
                identity,
                attrs,
            },
        );
    }

    /// Gives `source`, and every path below it, these flags, which binds inherit as the
    /// kernel's binds do.
    pub fn set_source_attrs(&self, source: &Path, attrs: MountAttrs) {
        let identity = self
            .source_identity(source)
            .unwrap_or_else(|_| default_identity(source));
        self.state().sources.insert(
            source.to_owned(),
            MountedAt {
                mount_id: 0,
                identity,
                attrs,
            },
        );
    }

    /// Makes `source`, and every path below it, lie on this mount (its ID, identity and flags).
    pub fn set_source_mount(&self, source: &Path, mounted: MountedAt) {
        self.state().sources.insert(source.to_owned(), mounted);
    }

    /// Puts a mount with `identity` at `target`, as something outside the code under test
    /// would.
    pub fn mount_foreign(&self, target: &Path, identity: MountIdentity) {
        let mut state = self.state();
        state.next_id += 1;
        let mount_id = state.next_id;
        state
            .mounts
            .entry(target.to_owned())
            .or_default()
            .push(MountedAt {
                mount_id,
                identity,
                attrs: Default::default(),
            });
    }

    /// Every target with at least one mount, and the mounts there, bottom first.
    pub fn mounts(&self) -> BTreeMap<PathBuf, Vec<MountedAt>> {
        self.state().mounts.clone()
    }

    fn take_failure(&self, op: FakeOp, path: &Path) -> Result<(), Error> {
        match self.state().failures.remove(&op) {
            Some(errno) => Err(Error::Io {
                op: "fake",
                path: path.to_owned(),
                source: io::Error::from_raw_os_error(errno),
            }),
            None => Ok(()),
        }
    }
}

fn default_identity(source: &Path) -> MountIdentity {
    MountIdentity {
        major: 0,
        minor: 0,
        root: source.to_owned(),
        fs_type: OsString::from("fake"),
        source: OsString::from("fake"),
    }
}

impl Mounter for FakeMounter {
    fn source_mount(&self, source: &Path) -> Result<MountedAt, Error> {
        // Like the kernel: the registered source that contains `source` (longest prefix by
        // whole components) decides the device and flags; the root is the path below it.
        let state = self.state();
        let containing = state
            .sources
            .iter()
            .filter(|(p, _)| source.starts_with(p))
            .max_by_key(|(p, _)| p.components().count());
        Ok(match containing {
            Some((path, mounted)) => {
                let mut mounted = mounted.clone();
                if let Ok(rest) = source.strip_prefix(path)
                    && !rest.as_os_str().is_empty()
                {
                    mounted.identity.root = mounted.identity.root.join(rest);
                }
                mounted
            }
            None => MountedAt {
                mount_id: 0,
                identity: default_identity(source),
                attrs: MountAttrs::default(),
            },
        })
    }

    fn mounted_at(&self, target: &Target) -> Result<Option<MountedAt>, Error> {
        self.take_failure(FakeOp::MountedAt, target.path())?;
        Ok(self
            .state()
            .mounts
            .get(target.path())
            .and_then(|stack| stack.last().cloned()))
    }

    fn bind(&self, source: &Path, target: &Target, options: BindOptions) -> Result<(), Error> {
        self.take_failure(FakeOp::Bind, target.path())?;
        if !source.is_dir() {
            return Err(Error::Io {
                op: "bind mount",
                path: source.to_owned(),
                source: io::Error::from_raw_os_error(libc::ENOENT),
            });
        }
        if target.kind()? != crate::TargetKind::Directory {
            return Err(Error::NotADirectory {
                path: target.path().to_owned(),
            });
        }
        let origin = self.source_mount(source)?;
        let mut state = self.state();
        state.next_id += 1;
        let mount_id = state.next_id;
        state
            .mounts
            .entry(target.path().to_owned())
            .or_default()
            .push(MountedAt {
                mount_id,
                identity: origin.identity,
                attrs: options.attrs.union(origin.attrs),
            });
        Ok(())
    }

    fn unmount(&self, target: &Target, expected: &MountIdentity) -> Result<Unmounted, Error> {
        self.take_failure(FakeOp::Unmount, target.path())?;
        let mut state = self.state();
        let Some(stack) = state.mounts.get_mut(target.path()) else {
            return Ok(Unmounted::NotMounted);
        };
        let Some(top) = stack.last() else {
            return Ok(Unmounted::NotMounted);
        };
        if top.identity != *expected {
            return Err(Error::ForeignMount {
                path: target.path().to_owned(),
                found: Box::new(top.identity.clone()),
                expected: Box::new(expected.clone()),
            });
        }
        stack.pop();
        if stack.is_empty() {
            state.mounts.remove(target.path());
        }
        Ok(Unmounted::Unmounted)
    }

    fn remove_target(&self, target: &Target) -> Result<bool, Error> {
        if self.state().mounts.contains_key(target.path()) {
            return Err(Error::StillMounted {
                path: target.path().to_owned(),
            });
        }
        target.remove_dir()
    }

    fn publications(&self, volume: &MountIdentity) -> Result<Vec<PathBuf>, Error> {
        self.take_failure(FakeOp::Publications, Path::new("/proc/self/mountinfo"))?;
        Ok(self
            .state()
            .mounts
            .iter()
            .flat_map(|(point, stack)| stack.iter().map(move |mounted| (point, mounted)))
            .filter(|(_, mounted)| volume.contains(&mounted.identity))
            .map(|(point, _)| point.clone())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TargetRoot;

    #[test]
    fn the_fake_stacks_mounts_checks_identities_and_injects_failures() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("volume");
        std::fs::create_dir(&source).unwrap();
        let root = TargetRoot::new(dir.path()).unwrap();
        let target = root.resolve(&dir.path().join("mount")).unwrap();
        target.create_dir(0o750).unwrap();
        let fake = FakeMounter::new();
        let identity = fake.source_identity(&source).unwrap();

        fake.bind(&source, &target, BindOptions::default()).unwrap();
        assert_eq!(
            fake.mounted_at(&target).unwrap().unwrap().identity,
            identity
        );

        let foreign = MountIdentity {
            fs_type: "tmpfs".into(),
            ..identity.clone()
        };
        fake.mount_foreign(target.path(), foreign.clone());
        assert!(matches!(
            fake.unmount(&target, &identity),
            Err(Error::ForeignMount { .. })
        ));
        assert_eq!(
            fake.unmount(&target, &foreign).unwrap(),
            Unmounted::Unmounted
        );

        fake.fail_next(FakeOp::Unmount, libc::EBUSY);
        assert!(fake.unmount(&target, &identity).is_err());
        assert_eq!(
            fake.unmount(&target, &identity).unwrap(),
            Unmounted::Unmounted
        );
        assert_eq!(
            fake.unmount(&target, &identity).unwrap(),
            Unmounted::NotMounted
        );
        assert!(fake.mounts().is_empty());
    }

    #[test]
    fn the_fake_keeps_a_mounted_target_directory_as_the_kernel_does() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("volume");
        std::fs::create_dir(&source).unwrap();
        let root = TargetRoot::new(dir.path()).unwrap();
        let target = root.resolve(&dir.path().join("mount")).unwrap();
        target.create_dir(0o750).unwrap();
        let fake = FakeMounter::new();
        fake.bind(&source, &target, BindOptions::default()).unwrap();
        assert!(matches!(
            fake.remove_target(&target),
            Err(Error::StillMounted { .. })
        ));
        assert!(target.path().is_dir());
        fake.unmount(&target, &fake.source_identity(&source).unwrap())
            .unwrap();
        assert!(fake.remove_target(&target).unwrap());
        assert!(!fake.remove_target(&target).unwrap(), "already gone");
    }

    #[test]
    fn the_fake_lists_publications_of_a_volume_and_directories_below_it() {
        let dir = tempfile::tempdir().unwrap();
        let volume = dir.path().join("store/v1");
        let other = dir.path().join("store/v10");
        std::fs::create_dir_all(volume.join("sub")).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let root = TargetRoot::new(dir.path()).unwrap();
        let fake = FakeMounter::new();
        let mut targets = Vec::new();
        for (name, source) in [("a", &volume), ("b", &volume.join("sub")), ("c", &other)] {
            let target = root.resolve(&dir.path().join(name)).unwrap();
            target.create_dir(0o750).unwrap();
            fake.bind(source, &target, BindOptions::default()).unwrap();
            targets.push(target);
        }
        // Stacked twice at `a`: listed once per mount, as the kernel's table does.
        fake.bind(&volume, &targets[0], BindOptions::default())
            .unwrap();
        let identity = fake.source_identity(&volume).unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        assert_eq!(
            fake.publications(&identity).unwrap(),
            vec![a.clone(), a.clone(), b.clone()]
        );

        fake.fail_next(FakeOp::Publications, libc::EIO);
        assert!(fake.publications(&identity).is_err());
        fake.unmount(&targets[0], &identity).unwrap();
        fake.unmount(&targets[0], &identity).unwrap();
        assert_eq!(fake.publications(&identity).unwrap(), vec![b]);
    }
}
