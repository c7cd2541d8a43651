//! Bind mounts, read-only binds and identity-checked unmounts at validated target paths.
//!
//! This is the one place where the drivers change the mount table. It holds three rules:
//!
//! - **A target is validated before anything happens to it.** [`TargetRoot::resolve`] accepts
//!   only a clean absolute path below a configured root (kubelet's directory, say), opens the
//!   target's parent with `openat2(2)` refusing any symlink and any mount on the way, and every
//!   later operation acts relative to that open parent. Only the last component is ever
//!   created ([`Target::create_dir`]) or removed ([`Mounter::remove_target`], never
//!   recursively, never while mounted).
//! - **Nothing is unmounted without an identity check.** [`Mounter::unmount`] compares the
//!   mount at the target (device, root within the filesystem, filesystem type and source)
//!   with the identity the caller expects, and refuses a foreign mount.
//! - **Deciding about one target costs one target, and never touches a mounted filesystem.**
//!   [`LinuxMounter`] asks `statx(2)` with `AT_STATX_DONT_SYNC | AT_SYMLINK_NOFOLLOW` for the
//!   target's mount ID (no request reaches a FUSE daemon, dead or alive) and `statmount(2)`
//!   for that one mount's identity, on Linux 6.8 and later; older kernels fall back to reading
//!   `/proc/self/mountinfo` through the [`mountinfo`] crate.
//!
//! [`Mounter::publications`] answers the rare question that needs the whole table: where is
//! this volume (or a directory inside it) mounted?
//!
//! A read-only bind is made with the new mount API (`open_tree`, `mount_setattr`,
//! `move_mount`) so that it is never visible writable, even for an instant; kernels without it
//! get a bind followed by a read-only remount, undone if the remount fails.
//!
//! The crate does not mount filesystems other than binds, does not create parents, does not
//! retry, and keeps no state: what is mounted is always read back from the kernel.
//!
//! With the feature `testing`, [`FakeMounter`] keeps a mount table in memory. The contract test
//! (`tests/contract`) runs the same scenarios against it and against [`LinuxMounter`] (as root,
//! in a private mount namespace), so tests over the fake say something about the kernel.
//!
//! # Example
//!
//! ```no_run
//! use mounter::{BindOptions, LinuxMounter, MountAttrs, Mounter, TargetRoot};
//! use std::path::Path;
//!
//! # fn main() -> Result<(), mounter::Error> {
//! let mounter = LinuxMounter::new();
//! let root = TargetRoot::new("/var/lib/kubelet")?;
//! let target = root.resolve(Path::new("/var/lib/kubelet/pods/p/volumes/v/mount"))?;
//! let source = Path::new("/var/lib/tak-os/local-volumes/v1.a.b");
//!
//! target.create_dir(0o750)?;
//! let read_only = BindOptions { attrs: MountAttrs { read_only: true, ..Default::default() }, ..Default::default() };
//! mounter.bind(source, &target, read_only)?;
//!
//! // Later: unmount only if what is there is still this volume's bind, then remove the
//! // (now empty) directory.
//! let expected = mounter.source_identity(source)?;
//! mounter.unmount(&target, &expected)?;
//! mounter.remove_target(&target)?;
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

use std::path::{Path, PathBuf};

mod error;
#[cfg(any(test, feature = "testing"))]
mod fake;
mod identity;
mod linux;
mod sys;
mod target;

pub use error::Error;
#[cfg(any(test, feature = "testing"))]
pub use fake::{FakeMounter, FakeOp};
pub use identity::{Atime, BindOptions, MountAttrs, MountIdentity, MountedAt};
pub use linux::{LinuxMounter, MountCalls, Probe};
pub use target::{Target, TargetKind, TargetRoot};

/// What an unmount did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unmounted {
    /// The expected mount was there and is gone now.
    Unmounted,
    /// Nothing was mounted at the target.
    NotMounted,
}

/// The mount operations the drivers need, behind a trait so that tests can pass a fake.
pub trait Mounter: Send + Sync + std::fmt::Debug {
    /// The mount a bind of `source` would copy: its identity (with the root set to `source`
    /// itself) and the flags of the mount that contains `source`, which a bind inherits.
    fn source_mount(&self, source: &Path) -> Result<MountedAt, Error>;

    /// The identity a bind mount of `source` would have.
    fn source_identity(&self, source: &Path) -> Result<MountIdentity, Error> {
        Ok(self.source_mount(source)?.identity)
    }

    /// The topmost mount exactly at `target`, if any.
    fn mounted_at(&self, target: &Target) -> Result<Option<MountedAt>, Error>;

    /// Bind-mounts the directory `source` on `target` (which must exist) with `options`.
    fn bind(&self, source: &Path, target: &Target, options: BindOptions) -> Result<(), Error>;

    /// Unmounts the topmost mount at `target` if, and only if, its identity is `expected`.
    ///
    /// A target with nothing mounted is [`Unmounted::NotMounted`]; a mount with another
    /// identity is [`Error::ForeignMount`] and stays.
    fn unmount(&self, target: &Target, expected: &MountIdentity) -> Result<Unmounted, Error>;

    /// Removes the target directory if it is empty and nothing is mounted on it, never
    /// recursively: [`Target::remove_dir`], through the mounter so that a fake's mounts hold
    /// the directory as the kernel's do ([`Error::StillMounted`]).
    fn remove_target(&self, target: &Target) -> Result<bool, Error>;

    /// Every mount point that shows the directory `volume` identifies, or a directory below it
    /// (a kubelet subPath is a bind of a directory inside a volume), covered mounts included.
    ///
    /// This reads the whole mount table: only rare paths (deleting a volume, a consumer claim,
    /// a single-writer publication) may call it. The order is the kernel's (or the fake's); a
    /// mount point appears once per matching mount stacked there.
    fn publications(&self, volume: &MountIdentity) -> Result<Vec<PathBuf>, Error>;
}
