//! Validated target paths: where a mount may be made, resolved without following a symlink or
//! crossing a mount on the way.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, StatxFlags};
use rustix::io::Errno;

use crate::Error;

/// The longest target path accepted, in bytes (`PATH_MAX` less room for the NUL).
const MAX_PATH_BYTES: usize = 4095;

/// A directory below which targets may be created, such as kubelet's root directory.
///
/// The root is a clean absolute path other than `/`. Targets are resolved below it with
/// `openat2(2)` so that a symlink anywhere in the path, or a mount on one of the target's
/// parents, is refused instead of followed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetRoot {
    path: PathBuf,
}

impl TargetRoot {
    /// Accepts `path` as a root if it is clean, absolute and not `/`.
    pub fn new(path: impl Into<PathBuf>) -> Result<Self, Error> {
        let path = path.into();
        check_clean_absolute(&path)?;
        if path == Path::new("/") {
            return Err(Error::InvalidPath {
                path,
                reason: "the root directory cannot be a target root",
            });
        }
        Ok(TargetRoot { path })
    }

    /// The root's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether `path` lies strictly below this root, compared by whole components.
    pub fn contains(&self, path: &Path) -> bool {
        path != self.path && path.starts_with(&self.path)
    }

    /// Checks, creating nothing, that the root is an existing directory whose path holds no
    /// symlink in any component: what [`TargetRoot::resolve`] requires of it.
    pub fn check_exists(&self) -> Result<(), Error> {
        self.open().map(drop).map_err(|errno| {
            let path = self.path.clone();
            match errno {
                Errno::LOOP => Error::SymlinkInPath { path },
                Errno::NOTDIR => Error::NotADirectory { path },
                other => Error::Io {
                    op: "open",
                    path,
                    source: other.into(),
                },
            }
        })
    }

    /// Opens the root itself (`O_PATH`) without following a symlink anywhere in its path.
    fn open(&self) -> rustix::io::Result<OwnedFd> {
        rustix::fs::openat2(
            rustix::fs::CWD,
            &self.path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
    }

    /// Validates `target` and opens its parent directory.
    ///
    /// The target must be a clean absolute path strictly below the root, with no `.` or `..`,
    /// no symlink in any component (the root's own components included) and no mount point
    /// between the root and the target's parent. The parent must exist; the target itself may
    /// or may not.
    pub fn resolve(&self, target: &Path) -> Result<Target, Error> {
        check_clean_absolute(target)?;
        if !self.contains(target) {
            return Err(Error::OutsideRoot {
                path: target.to_owned(),
                root: self.path.clone(),
            });
        }
        let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
            return Err(Error::InvalidPath {
                path: target.to_owned(),
                reason: "it has no last component",
            });
        };
        let open = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let root = self
            .open()
            .map_err(|e| resolve_error(e, &self.path, target))?;
        let parent_fd = match parent.strip_prefix(&self.path) {
            Ok(rel) if rel.as_os_str().is_empty() => root,
            Ok(rel) => rustix::fs::openat2(
                &root,
                rel,
                open,
                Mode::empty(),
                ResolveFlags::BENEATH
                    | ResolveFlags::NO_SYMLINKS
                    | ResolveFlags::NO_MAGICLINKS
                    | ResolveFlags::NO_XDEV,
            )
            .map_err(|e| resolve_error(e, parent, target))?,
            Err(_) => {
                return Err(Error::OutsideRoot {
                    path: target.to_owned(),
                    root: self.path.clone(),
                });
            }
        };
        Ok(Target {
            path: target.to_owned(),
            parent: parent_fd,
            name: name.to_owned(),
        })
    }
}

fn resolve_error(errno: Errno, at: &Path, target: &Path) -> Error {
    let path = target.to_owned();
    match errno {
        Errno::LOOP => Error::SymlinkInPath { path },
        Errno::XDEV => Error::MountOnParent { path },
        Errno::NOENT => Error::ParentMissing { path },
        Errno::NOTDIR => Error::NotADirectory {
            path: at.to_owned(),
        },
        other => Error::Io {
            op: "open",
            path: at.to_owned(),
            source: other.into(),
        },
    }
}

/// Checks that `path` is absolute and clean: no `.`, `..` or empty components, no trailing
/// slash, no NUL, at most `PATH_MAX` bytes.
pub(crate) fn check_clean_absolute(path: &Path) -> Result<(), Error> {
    let bytes = path.as_os_str().as_bytes();
    let invalid = |reason| {
        Err(Error::InvalidPath {
            path: path.to_owned(),
            reason,
        })
    };
    if !path.is_absolute() {
        return invalid("it is not absolute");
    }
    if bytes.len() > MAX_PATH_BYTES {
        return invalid("it is longer than PATH_MAX");
    }
    if bytes.contains(&0) {
        return invalid("it contains a NUL byte");
    }
    if bytes.len() > 1 && bytes.ends_with(b"/") {
        return invalid("it ends with a slash");
    }
    if bytes.windows(2).any(|w| w == b"//") {
        return invalid("it contains an empty component");
    }
    // `Path::components` hides `.` components in the middle of a path, so check the raw ones.
    if bytes.split(|&b| b == b'/').any(|c| c == b"." || c == b"..") {
        return invalid("it contains a `.` or `..` component");
    }
    debug_assert!(
        path.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
    );
    Ok(())
}

/// A validated target: its path, and its parent directory held open.
///
/// Every operation works relative to the open parent, so replacing a parent with a symlink
/// after validation changes nothing.
#[derive(Debug)]
pub struct Target {
    path: PathBuf,
    parent: OwnedFd,
    name: OsString,
}

/// What is at a target path, as seen without asking the filesystem mounted there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetKind {
    /// Nothing.
    Absent,
    /// A directory (possibly a mount point).
    Directory,
    /// A symbolic link.
    Symlink,
    /// Any other kind of file.
    Other,
}

impl Target {
    /// The target's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open parent directory (an `O_PATH` descriptor).
    pub(crate) fn parent(&self) -> &OwnedFd {
        &self.parent
    }

    /// The last component.
    pub(crate) fn name(&self) -> &OsStr {
        &self.name
    }

    /// Opens the target directory itself (`O_PATH`), never following a symlink at its name.
    pub(crate) fn open_dir(&self) -> rustix::io::Result<OwnedFd> {
        rustix::fs::openat(
            &self.parent,
            &self.name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
    }

    /// The target's path through the held parent descriptor, for syscalls that only take a
    /// path: the kernel resolves `/proc/self/fd/N` to the directory we validated.
    pub(crate) fn pinned_path(&self) -> PathBuf {
        Path::new("/proc/self/fd")
            .join(self.parent.as_raw_fd().to_string())
            .join(&self.name)
    }

    /// What is at the target, without following a symlink and without syncing attributes with
    /// a filesystem that may be mounted there (`AT_STATX_DONT_SYNC`: no FUSE request is sent).
    pub fn kind(&self) -> Result<TargetKind, Error> {
        match rustix::fs::statx(
            &self.parent,
            &self.name,
            AtFlags::SYMLINK_NOFOLLOW | AtFlags::STATX_DONT_SYNC,
            StatxFlags::TYPE,
        ) {
            Ok(stx) => {
                let file_type = rustix::fs::FileType::from_raw_mode(stx.stx_mode.into());
                Ok(match file_type {
                    rustix::fs::FileType::Directory => TargetKind::Directory,
                    rustix::fs::FileType::Symlink => TargetKind::Symlink,
                    _ => TargetKind::Other,
                })
            }
            Err(Errno::NOENT) => Ok(TargetKind::Absent),
            Err(e) => Err(Error::Io {
                op: "statx",
                path: self.path.clone(),
                source: e.into(),
            }),
        }
    }

    /// Creates the target directory with `mode` unless a directory is already there.
    ///
    /// Returns whether it created one. Anything other than a directory at the target is an
    /// error: a symlink is never followed or replaced.
    pub fn create_dir(&self, mode: u32) -> Result<bool, Error> {
        match rustix::fs::mkdirat(&self.parent, &self.name, Mode::from_raw_mode(mode)) {
            Ok(()) => Ok(true),
            Err(Errno::EXIST) => match self.kind()? {
                TargetKind::Directory => Ok(false),
                TargetKind::Symlink => Err(Error::SymlinkInPath {
                    path: self.path.clone(),
                }),
                TargetKind::Absent | TargetKind::Other => Err(Error::NotADirectory {
                    path: self.path.clone(),
                }),
            },
            Err(e) => Err(Error::Io {
                op: "mkdir",
                path: self.path.clone(),
                source: e.into(),
            }),
        }
    }

    /// Removes the target if it is an empty directory that nothing is mounted on.
    ///
    /// Returns whether it removed one; an absent target is `Ok(false)`. Never removes anything
    /// recursively: a non-empty directory or a mount point is an error.
    pub fn remove_dir(&self) -> Result<bool, Error> {
        match rustix::fs::unlinkat(&self.parent, &self.name, AtFlags::REMOVEDIR) {
            Ok(()) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(Errno::BUSY) => Err(Error::StillMounted {
                path: self.path.clone(),
            }),
            Err(Errno::NOTEMPTY | Errno::EXIST) => Err(Error::NotEmpty {
                path: self.path.clone(),
            }),
            Err(Errno::NOTDIR) => Err(Error::NotADirectory {
                path: self.path.clone(),
            }),
            Err(e) => Err(Error::Io {
                op: "rmdir",
                path: self.path.clone(),
                source: e.into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(path: &str) -> &'static str {
        match check_clean_absolute(Path::new(path)) {
            Err(Error::InvalidPath { reason, .. }) => reason,
            other => panic!("{path}: expected an invalid path, got {other:?}"),
        }
    }

    #[test]
    fn unclean_paths_are_refused_with_the_reason() {
        assert_eq!(reason("relative/x"), "it is not absolute");
        assert_eq!(reason("/a//b"), "it contains an empty component");
        assert_eq!(reason("/a/./b"), "it contains a `.` or `..` component");
        assert_eq!(reason("/a/../b"), "it contains a `.` or `..` component");
        assert_eq!(reason("/a/b/"), "it ends with a slash");
        assert_eq!(
            reason(&format!("/{}", "a".repeat(5000))),
            "it is longer than PATH_MAX"
        );
    }

    #[test]
    fn clean_paths_pass() {
        check_clean_absolute(Path::new("/var/lib/kubelet/pods/x/volumes/v/mount")).unwrap();
        check_clean_absolute(Path::new("/")).unwrap();
    }

    #[test]
    fn containment_is_by_whole_components() {
        let root = TargetRoot::new("/var/lib/kubelet").unwrap();
        assert!(root.contains(Path::new("/var/lib/kubelet/pods")));
        assert!(!root.contains(Path::new("/var/lib/kubelet")));
        assert!(!root.contains(Path::new("/var/lib/kubelet-other/pods")));
        assert!(TargetRoot::new("/").is_err());
    }

    #[test]
    fn resolve_refuses_symlinks_and_missing_parents_and_creates_only_the_last_component() {
        let dir = tempfile::tempdir().unwrap();
        let root = TargetRoot::new(dir.path()).unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("link")).unwrap();

        let err = root.resolve(&dir.path().join("link/target")).unwrap_err();
        assert!(matches!(err, Error::SymlinkInPath { .. }), "{err}");
        let err = root
            .resolve(&dir.path().join("missing/target"))
            .unwrap_err();
        assert!(matches!(err, Error::ParentMissing { .. }), "{err}");
        assert!(
            !dir.path().join("missing").exists(),
            "a missing parent is never created"
        );

        let target = root.resolve(&dir.path().join("real/target")).unwrap();
        assert_eq!(target.kind().unwrap(), TargetKind::Absent);
        assert!(target.create_dir(0o750).unwrap());
        assert!(
            !target.create_dir(0o750).unwrap(),
            "an existing directory is reused"
        );
        assert_eq!(target.kind().unwrap(), TargetKind::Directory);
        assert!(target.remove_dir().unwrap());
        assert!(
            !target.remove_dir().unwrap(),
            "an absent target is not an error"
        );

        // A symlink as the last component is neither followed nor replaced.
        let at_link = root.resolve(&dir.path().join("link")).unwrap();
        assert!(matches!(
            at_link.create_dir(0o750),
            Err(Error::SymlinkInPath { .. })
        ));
        assert!(dir.path().join("link").is_symlink());
    }

    #[test]
    fn check_exists_accepts_only_an_existing_directory_reached_without_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::fs::create_dir(dir.path().join("real/root")).unwrap();
        std::fs::write(dir.path().join("file"), b"").unwrap();
        std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("link")).unwrap();
        let check = |rel: &str| {
            TargetRoot::new(dir.path().join(rel))
                .unwrap()
                .check_exists()
        };

        check("real/root").unwrap();
        assert!(matches!(
            check("link/root"),
            Err(Error::SymlinkInPath { .. })
        ));
        assert!(matches!(check("link"), Err(Error::SymlinkInPath { .. })));
        assert!(matches!(check("file"), Err(Error::NotADirectory { .. })));
        match check("missing") {
            Err(Error::Io { op, source, .. }) => {
                assert_eq!((op, source.raw_os_error()), ("open", Some(libc::ENOENT)));
            }
            other => panic!("expected ENOENT, got {other:?}"),
        }
        assert!(
            !dir.path().join("missing").exists(),
            "a missing root is never created"
        );
    }

    #[test]
    fn remove_dir_never_removes_a_non_empty_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = TargetRoot::new(dir.path()).unwrap();
        std::fs::create_dir(dir.path().join("t")).unwrap();
        std::fs::write(dir.path().join("t/data"), b"keep").unwrap();
        let target = root.resolve(&dir.path().join("t")).unwrap();
        assert!(matches!(target.remove_dir(), Err(Error::NotEmpty { .. })));
        assert_eq!(std::fs::read(dir.path().join("t/data")).unwrap(), b"keep");
    }
}
