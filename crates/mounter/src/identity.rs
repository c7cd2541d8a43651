//! What a mount is: the identity the crate compares before it unmounts, and the attributes it
//! compares before it reports a publication as already done.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

/// The identity of a mount: which filesystem, which directory of it, and how it is labelled.
///
/// Two mounts with equal identities show the same files. A bind mount has the identity of the
/// directory it was made from: the same device, the same root within the filesystem, the same
/// filesystem type and source as the mount that directory lives on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MountIdentity {
    /// Major number of the filesystem's device (`st_dev`).
    pub major: u32,
    /// Minor number of the filesystem's device.
    pub minor: u32,
    /// The directory of the filesystem that the mount shows, relative to the filesystem's root
    /// (the fourth field of mountinfo).
    pub root: PathBuf,
    /// Filesystem type, with its subtype when there is one (`fuse.tak-os-replicated`).
    pub fs_type: OsString,
    /// The mount source (for FUSE, the name the filesystem gave itself).
    pub source: OsString,
}

impl MountIdentity {
    /// Whether a mount with identity `mount` shows this directory or one below it: the same
    /// filesystem (device, type and source) with a root at or below this root, compared by whole
    /// components.
    pub fn contains(&self, mount: &MountIdentity) -> bool {
        (self.major, self.minor, &self.fs_type, &self.source)
            == (mount.major, mount.minor, &mount.fs_type, &mount.source)
            && mount.root.starts_with(&self.root)
    }
}

impl fmt::Display for MountIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{} root {} type {} source {}",
            self.major,
            self.minor,
            self.root.display(),
            self.fs_type.to_string_lossy(),
            self.source.to_string_lossy()
        )
    }
}

/// Per-mount attributes that a publication may ask for.
///
/// The access-time policy is deliberately absent from equality checks on the kernel side: it is
/// applied when mounting, and a mismatch in it is not a different publication.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MountAttrs {
    /// Writes are refused (`ro`).
    pub read_only: bool,
    /// Set-user-ID and set-group-ID bits are ignored (`nosuid`).
    pub nosuid: bool,
    /// Device files cannot be opened (`nodev`).
    pub nodev: bool,
    /// Programs cannot be executed (`noexec`).
    pub noexec: bool,
}

/// How access times are updated on a new mount.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Atime {
    /// The filesystem's default (`relatime` on Linux).
    #[default]
    Relative,
    /// Never update access times (`noatime`).
    Never,
    /// Never update access times of directories (`nodiratime`), relative for files.
    NoDirectories,
}

/// What to ask of a new bind mount.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BindOptions {
    /// The flags of the mount.
    pub attrs: MountAttrs,
    /// Access-time policy.
    pub atime: Atime,
}

/// A mount found at a target: who it is and how it is mounted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountedAt {
    /// The mount's kernel ID (the unique 64-bit ID where the kernel has one).
    pub mount_id: u64,
    /// Its identity.
    pub identity: MountIdentity,
    /// Its flags.
    pub attrs: MountAttrs,
}

// MOUNT_ATTR_* bits (include/uapi/linux/mount.h), used by statmount and mount_setattr alike.
pub(crate) const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub(crate) const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub(crate) const MOUNT_ATTR_NODEV: u64 = 0x4;
pub(crate) const MOUNT_ATTR_NOEXEC: u64 = 0x8;
pub(crate) const MOUNT_ATTR_ATIME_MASK: u64 = 0x70;
pub(crate) const MOUNT_ATTR_NOATIME: u64 = 0x10;
pub(crate) const MOUNT_ATTR_NODIRATIME: u64 = 0x80;

impl MountAttrs {
    /// Both sets of flags: what a bind mount ends up with when it inherits `self` from its
    /// source and is asked for `other`.
    pub fn union(self, other: MountAttrs) -> MountAttrs {
        MountAttrs {
            read_only: self.read_only || other.read_only,
            nosuid: self.nosuid || other.nosuid,
            nodev: self.nodev || other.nodev,
            noexec: self.noexec || other.noexec,
        }
    }

    pub(crate) fn from_bits(bits: u64) -> Self {
        MountAttrs {
            read_only: bits & MOUNT_ATTR_RDONLY != 0,
            nosuid: bits & MOUNT_ATTR_NOSUID != 0,
            nodev: bits & MOUNT_ATTR_NODEV != 0,
            noexec: bits & MOUNT_ATTR_NOEXEC != 0,
        }
    }

    pub(crate) fn bits(self) -> u64 {
        let mut bits = 0;
        for (on, bit) in [
            (self.read_only, MOUNT_ATTR_RDONLY),
            (self.nosuid, MOUNT_ATTR_NOSUID),
            (self.nodev, MOUNT_ATTR_NODEV),
            (self.noexec, MOUNT_ATTR_NOEXEC),
        ] {
            if on {
                bits |= bit;
            }
        }
        bits
    }

    /// Reads the flags out of a mountinfo per-mount option list (`rw,nosuid,relatime`).
    pub(crate) fn from_mount_options(options: &mountinfo::Options<'_>) -> Self {
        MountAttrs {
            read_only: options.has_flag("ro"),
            nosuid: options.has_flag("nosuid"),
            nodev: options.has_flag("nodev"),
            noexec: options.has_flag("noexec"),
        }
    }
}

impl BindOptions {
    /// The `(attr_set, attr_clr)` pair for `mount_setattr(2)`.
    pub(crate) fn setattr_bits(self) -> (u64, u64) {
        let mut set = self.attrs.bits();
        let mut clear = 0;
        match self.atime {
            Atime::Relative => {}
            Atime::Never => {
                set |= MOUNT_ATTR_NOATIME;
                clear |= MOUNT_ATTR_ATIME_MASK;
            }
            Atime::NoDirectories => set |= MOUNT_ATTR_NODIRATIME,
        }
        (set, clear)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(root: &str) -> MountIdentity {
        MountIdentity {
            major: 8,
            minor: 1,
            root: PathBuf::from(root),
            fs_type: OsString::from("ext4"),
            source: OsString::from("/dev/sda1"),
        }
    }

    #[test]
    fn a_volume_contains_itself_and_directories_below_it_only() {
        let volume = identity("/store/v1");
        assert!(volume.contains(&identity("/store/v1")));
        assert!(volume.contains(&identity("/store/v1/sub/path")));
        assert!(
            !volume.contains(&identity("/store/v10")),
            "whole components"
        );
        assert!(!volume.contains(&identity("/store")));
        let other_device = MountIdentity {
            minor: 2,
            ..identity("/store/v1")
        };
        assert!(!volume.contains(&other_device));
        let other_source = MountIdentity {
            source: OsString::from("/dev/sdb1"),
            ..identity("/store/v1")
        };
        assert!(!volume.contains(&other_source));
    }

    #[test]
    fn attr_bits_round_trip() {
        for bits in 0..16u64 {
            assert_eq!(MountAttrs::from_bits(bits).bits(), bits);
        }
    }

    #[test]
    fn noatime_clears_the_atime_field_before_setting() {
        let options = BindOptions {
            attrs: MountAttrs::default(),
            atime: Atime::Never,
        };
        assert_eq!(
            options.setattr_bits(),
            (MOUNT_ATTR_NOATIME, MOUNT_ATTR_ATIME_MASK)
        );
    }
}
