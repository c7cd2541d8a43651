//! The real mounter: the new mount API where the kernel has it, `statx` + `statmount` to learn
//! about one mount without reading the whole table, and `/proc/self/mountinfo` as the fallback.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, StatxAttributes, StatxFlags};
use rustix::io::Errno;
use rustix::mount::{MountFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags};

use crate::identity::MountAttrs;
use crate::{BindOptions, Error, MountIdentity, MountedAt, Mounter, Target, Unmounted, sys};

/// `STATX_MNT_ID_UNIQUE` (Linux 6.8): `stx_mnt_id` is the 64-bit ID that `statmount` takes.
const STATX_MNT_ID_UNIQUE: u32 = 0x4000;

// statmount request bits (include/uapi/linux/mount.h).
const STATMOUNT_SB_BASIC: u64 = 0x1;
const STATMOUNT_MNT_BASIC: u64 = 0x2;
const STATMOUNT_MNT_ROOT: u64 = 0x8;
const STATMOUNT_MNT_POINT: u64 = 0x10;
const STATMOUNT_FS_TYPE: u64 = 0x20;
const STATMOUNT_FS_SUBTYPE: u64 = 0x100;
const STATMOUNT_SB_SOURCE: u64 = 0x200;

/// Fields without which a statmount answer cannot decide an identity.
const STATMOUNT_REQUIRED: u64 = STATMOUNT_SB_BASIC
    | STATMOUNT_MNT_BASIC
    | STATMOUNT_MNT_ROOT
    | STATMOUNT_MNT_POINT
    | STATMOUNT_FS_TYPE
    | STATMOUNT_SB_SOURCE;

/// How the mounter learns what is mounted at a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// `statx` and `statmount` (Linux 6.8+, the source field from about 6.13) for the one mount
    /// in question, falling back to the mount table when the kernel lacks a field.
    Kernel,
    /// Always read the whole of `/proc/self/mountinfo`.
    MountTable,
}

/// How the mounter makes mounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountCalls {
    /// `open_tree` + `mount_setattr` + `move_mount`: a read-only bind is never visible
    /// writable, and the target is reached through its held parent. Falls back to `Legacy`
    /// on kernels without these calls.
    New,
    /// `mount(MS_BIND)` then a bind remount for the flags.
    Legacy,
}

/// The mounter for Linux.
#[derive(Clone, Copy, Debug)]
pub struct LinuxMounter {
    probe: Probe,
    calls: MountCalls,
}

impl Default for LinuxMounter {
    fn default() -> Self {
        LinuxMounter::new()
    }
}

impl LinuxMounter {
    /// The mounter with the best methods the kernel offers.
    pub fn new() -> Self {
        LinuxMounter {
            probe: Probe::Kernel,
            calls: MountCalls::New,
        }
    }

    /// A mounter that uses the given methods (tests use this to cover the fallbacks).
    pub fn with_methods(probe: Probe, calls: MountCalls) -> Self {
        LinuxMounter { probe, calls }
    }

    /// Whether this kernel answers `statx` mount IDs and `statmount` with every field the
    /// per-target probe needs, so that no call reads the whole mount table.
    pub fn kernel_probe_available() -> bool {
        match rustix::fs::statx(
            rustix::fs::CWD,
            "/",
            AtFlags::SYMLINK_NOFOLLOW | AtFlags::STATX_DONT_SYNC,
            StatxFlags::from_bits_retain(STATX_MNT_ID_UNIQUE),
        ) {
            Ok(stx) if stx.stx_mask & STATX_MNT_ID_UNIQUE != 0 => {
                matches!(statmount_identity(stx.stx_mnt_id), Ok(Some(_)))
            }
            _ => false,
        }
    }

    fn mounted_at_kernel(&self, target: &Target) -> Result<Option<Option<MountedAt>>, Error> {
        let stx = match rustix::fs::statx(
            target.parent(),
            target.name(),
            AtFlags::SYMLINK_NOFOLLOW | AtFlags::STATX_DONT_SYNC,
            StatxFlags::TYPE | StatxFlags::from_bits_retain(STATX_MNT_ID_UNIQUE),
        ) {
            Ok(stx) => stx,
            Err(Errno::NOENT) => return Ok(Some(None)),
            Err(e) => return Err(io_error("statx", target.path(), e)),
        };
        let knows_mount_root = stx
            .stx_attributes_mask
            .contains(StatxAttributes::MOUNT_ROOT);
        if knows_mount_root && !stx.stx_attributes.contains(StatxAttributes::MOUNT_ROOT) {
            return Ok(Some(None));
        }
        if !knows_mount_root || stx.stx_mask & STATX_MNT_ID_UNIQUE == 0 {
            return Ok(None);
        }
        let Some(found) = statmount_identity(stx.stx_mnt_id)? else {
            return Ok(None);
        };
        // The kernel reports the mount point relative to our root; if it differs from the
        // target's path, something is off (another root, a renamed parent): ask the table.
        if found.mount_point != target.path() {
            return Ok(None);
        }
        Ok(Some(Some(found.mounted)))
    }

    fn source_mount_kernel(&self, source: &Path) -> Result<Option<MountedAt>, Error> {
        let stx = rustix::fs::statx(
            rustix::fs::CWD,
            source,
            AtFlags::SYMLINK_NOFOLLOW | AtFlags::STATX_DONT_SYNC,
            StatxFlags::from_bits_retain(STATX_MNT_ID_UNIQUE),
        )
        .map_err(|e| io_error("statx", source, e))?;
        if stx.stx_mask & STATX_MNT_ID_UNIQUE == 0 {
            return Ok(None);
        }
        let Some(found) = statmount_identity(stx.stx_mnt_id)? else {
            return Ok(None);
        };
        let mut mounted = found.mounted;
        mounted.identity.root = root_within(source, &found.mount_point, &mounted.identity.root)?;
        Ok(Some(mounted))
    }

    fn bind_new(
        &self,
        source: &Path,
        target: &Target,
        options: BindOptions,
    ) -> Result<bool, Error> {
        let tree = match rustix::mount::open_tree(
            rustix::fs::CWD,
            source,
            OpenTreeFlags::OPEN_TREE_CLONE
                | OpenTreeFlags::OPEN_TREE_CLOEXEC
                | OpenTreeFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(tree) => tree,
            Err(Errno::NOSYS) => return Ok(false),
            Err(e) => return Err(io_error("open_tree", source, e)),
        };
        let (set, clear) = options.setattr_bits();
        if set | clear != 0 {
            match sys::mount_setattr(std::os::fd::AsFd::as_fd(&tree), set, clear) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => return Ok(false),
                Err(e) => {
                    return Err(Error::Io {
                        op: "mount_setattr",
                        path: source.to_owned(),
                        source: e,
                    });
                }
            }
        }
        rustix::mount::move_mount(
            &tree,
            "",
            target.parent(),
            target.name(),
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )
        .map_err(|e| io_error("move_mount", target.path(), e))?;
        Ok(true)
    }

    fn bind_legacy(
        &self,
        source: &Path,
        target: &Target,
        options: BindOptions,
    ) -> Result<(), Error> {
        // A bind remount replaces every flag, so keep the ones the source mount has.
        let inherited = self.source_mount(source)?.attrs;
        let options = BindOptions {
            attrs: options.attrs.union(inherited),
            ..options
        };
        // mount(2) follows a symlink in the last component: mount on the directory itself,
        // held open without following one, instead of on its name.
        let dir = target
            .open_dir()
            .map_err(|e| io_error("open", target.path(), e))?;
        rustix::mount::mount_bind(source, fd_path(&dir))
            .map_err(|e| io_error("bind mount", target.path(), e))?;
        let (set, clear) = options.setattr_bits();
        if set | clear == 0 {
            return Ok(());
        }
        let mut flags = MountFlags::BIND;
        for (on, flag) in [
            (options.attrs.read_only, MountFlags::RDONLY),
            (options.attrs.nosuid, MountFlags::NOSUID),
            (options.attrs.nodev, MountFlags::NODEV),
            (options.attrs.noexec, MountFlags::NOEXEC),
            (options.atime == crate::Atime::Never, MountFlags::NOATIME),
            (
                options.atime == crate::Atime::NoDirectories,
                MountFlags::NODIRATIME,
            ),
        ] {
            if on {
                flags |= flag;
            }
        }
        // The held directory is now the covered mount point; the new mount's root is what the
        // name resolves to now (opened again without following a symlink).
        let remounted = target
            .open_dir()
            .map_err(|e| io_error("open", target.path(), e))
            .and_then(|root| {
                rustix::mount::mount_remount(fd_path(&root), flags, "")
                    .map_err(|e| io_error("bind remount", target.path(), e))
            });
        if let Err(error) = remounted {
            // Never leave a writable bind behind when a read-only one was asked for; but only
            // take down what is verifiably the bind just made.
            let expected = self.source_identity(source)?;
            let _ = self.unmount(target, &expected);
            return Err(error);
        }
        Ok(())
    }
}

/// The `/proc/self/fd` path of an open file: the kernel resolves it to that very file.
fn fd_path(fd: &std::os::fd::OwnedFd) -> PathBuf {
    PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(fd)
    ))
}

impl Mounter for LinuxMounter {
    fn source_mount(&self, source: &Path) -> Result<MountedAt, Error> {
        crate::target::check_clean_absolute(source)?;
        if self.probe == Probe::Kernel
            && let Some(mounted) = self.source_mount_kernel(source)?
        {
            return Ok(mounted);
        }
        let bytes = read_mount_table()?;
        let table = mountinfo::MountTable::parse(&bytes).map_err(Error::MountTable)?;
        let mount = table.containing(source).ok_or_else(|| Error::NoMount {
            path: source.to_owned(),
        })?;
        let mut identity = identity_from_table(mount);
        identity.root = root_within(source, mount.mount_point(), &identity.root)?;
        Ok(MountedAt {
            mount_id: mount.mount_id(),
            identity,
            attrs: MountAttrs::from_mount_options(&mount.mount_options()),
        })
    }

    fn mounted_at(&self, target: &Target) -> Result<Option<MountedAt>, Error> {
        if self.probe == Probe::Kernel
            && let Some(answer) = self.mounted_at_kernel(target)?
        {
            return Ok(answer);
        }
        let bytes = read_mount_table()?;
        let table = mountinfo::MountTable::parse(&bytes).map_err(Error::MountTable)?;
        Ok(table.by_mount_point(target.path()).map(|mount| MountedAt {
            mount_id: mount.mount_id(),
            identity: identity_from_table(mount),
            attrs: MountAttrs::from_mount_options(&mount.mount_options()),
        }))
    }

    fn bind(&self, source: &Path, target: &Target, options: BindOptions) -> Result<(), Error> {
        crate::target::check_clean_absolute(source)?;
        if self.calls == MountCalls::New && self.bind_new(source, target, options)? {
            return Ok(());
        }
        self.bind_legacy(source, target, options)
    }

    fn unmount(&self, target: &Target, expected: &MountIdentity) -> Result<Unmounted, Error> {
        let Some(found) = self.mounted_at(target)? else {
            return Ok(Unmounted::NotMounted);
        };
        if found.identity != *expected {
            return Err(Error::ForeignMount {
                path: target.path().to_owned(),
                found: Box::new(found.identity),
                expected: Box::new(expected.clone()),
            });
        }
        match rustix::mount::unmount(target.pinned_path(), UnmountFlags::NOFOLLOW) {
            Ok(()) => Ok(Unmounted::Unmounted),
            // Unmounted by someone else between the check and the call.
            Err(Errno::INVAL) => Ok(Unmounted::NotMounted),
            Err(Errno::BUSY) => Err(Error::StillMounted {
                path: target.path().to_owned(),
            }),
            Err(e) => Err(io_error("unmount", target.path(), e)),
        }
    }

    fn remove_target(&self, target: &Target) -> Result<bool, Error> {
        target.remove_dir()
    }

    fn publications(&self, volume: &MountIdentity) -> Result<Vec<PathBuf>, Error> {
        let bytes = read_mount_table()?;
        let table = mountinfo::MountTable::parse(&bytes).map_err(Error::MountTable)?;
        Ok(table
            .iter()
            .filter(|mount| volume.contains(&identity_from_table(mount)))
            .map(|mount| mount.mount_point().to_owned())
            .collect())
    }
}

fn io_error(op: &'static str, path: &Path, errno: Errno) -> Error {
    Error::Io {
        op,
        path: path.to_owned(),
        source: errno.into(),
    }
}

fn read_mount_table() -> Result<Vec<u8>, Error> {
    mountinfo::read_self().map_err(|source| Error::Io {
        op: "read",
        path: PathBuf::from("/proc/self/mountinfo"),
        source,
    })
}

fn identity_from_table(mount: &mountinfo::Mount<'_>) -> MountIdentity {
    MountIdentity {
        major: mount.major(),
        minor: mount.minor(),
        root: mount.root().to_owned(),
        fs_type: mount.fs_type().to_owned(),
        source: mount.source().to_owned(),
    }
}

/// The directory of the filesystem that `path` is, given the mount that contains it.
fn root_within(path: &Path, mount_point: &Path, mount_root: &Path) -> Result<PathBuf, Error> {
    let rel = path
        .strip_prefix(mount_point)
        .map_err(|_| Error::OutsideMount {
            path: path.to_owned(),
            mount_point: mount_point.to_owned(),
        })?;
    Ok(if rel.as_os_str().is_empty() {
        mount_root.to_owned()
    } else {
        mount_root.join(rel)
    })
}

struct StatmountAnswer {
    mounted: MountedAt,
    mount_point: PathBuf,
}

/// Asks the kernel about one mount. `Ok(None)` means the kernel cannot answer everything the
/// identity needs (no statmount, or an older one without the source field).
fn statmount_identity(mnt_id: u64) -> Result<Option<StatmountAnswer>, Error> {
    let mask = STATMOUNT_REQUIRED | STATMOUNT_FS_SUBTYPE;
    let buf = match sys::statmount(mnt_id, mask) {
        Ok(buf) => buf,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EINVAL)) => return Ok(None),
        Err(source) => {
            return Err(Error::Io {
                op: "statmount",
                path: PathBuf::from(format!("mount {mnt_id}")),
                source,
            });
        }
    };
    Ok(decode_statmount(&buf))
}

// Offsets into `struct statmount` (include/uapi/linux/mount.h).
const SM_SIZE: usize = 0;
const SM_MASK: usize = 8;
const SM_DEV_MAJOR: usize = 16;
const SM_DEV_MINOR: usize = 20;
const SM_FS_TYPE: usize = 36;
const SM_MNT_ID: usize = 40;
const SM_MNT_ATTR: usize = 64;
const SM_MNT_ROOT: usize = 104;
const SM_MNT_POINT: usize = 108;
const SM_FS_SUBTYPE: usize = 120;
const SM_SB_SOURCE: usize = 124;
const SM_STRINGS: usize = 512;

fn decode_statmount(buf: &[u8]) -> Option<StatmountAnswer> {
    let size = usize::try_from(read_u32(buf, SM_SIZE)?).ok()?;
    let buf = buf.get(..size.min(buf.len()))?;
    let mask = read_u64(buf, SM_MASK)?;
    if mask & STATMOUNT_REQUIRED != STATMOUNT_REQUIRED {
        return None;
    }
    let string = |field: usize| -> Option<Vec<u8>> {
        let offset = usize::try_from(read_u32(buf, field)?).ok()?;
        let rest = buf.get(SM_STRINGS.checked_add(offset)?..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        Some(rest[..end].to_vec())
    };
    let mut fs_type = string(SM_FS_TYPE)?;
    if mask & STATMOUNT_FS_SUBTYPE != 0 {
        let subtype = string(SM_FS_SUBTYPE)?;
        if !subtype.is_empty() {
            fs_type.push(b'.');
            fs_type.extend_from_slice(&subtype);
        }
    }
    Some(StatmountAnswer {
        mounted: MountedAt {
            mount_id: read_u64(buf, SM_MNT_ID)?,
            identity: MountIdentity {
                major: read_u32(buf, SM_DEV_MAJOR)?,
                minor: read_u32(buf, SM_DEV_MINOR)?,
                root: PathBuf::from(OsString::from_vec(string(SM_MNT_ROOT)?)),
                fs_type: OsString::from_vec(fs_type),
                source: OsString::from_vec(string(SM_SB_SOURCE)?),
            },
            attrs: MountAttrs::from_bits(read_u64(buf, SM_MNT_ATTR)?),
        },
        mount_point: PathBuf::from(OsString::from_vec(string(SM_MNT_POINT)?)),
    })
}

fn read_u32(buf: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(buf.get(at..at + 4)?.try_into().ok()?))
}

fn read_u64(buf: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(buf.get(at..at + 8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_never_panics_on_short_or_garbage_buffers() {
        for len in [0, 4, 16, 100, 511, 512, 600] {
            assert!(decode_statmount(&vec![0xff; len]).is_none());
            assert!(decode_statmount(&vec![0; len]).is_none());
        }
    }

    /// A `struct statmount` as the kernel lays it out, built field by field.
    fn statmount_buffer(strings: &[(usize, &str)], mask: u64, attr: u64) -> Vec<u8> {
        let mut buf = vec![0u8; SM_STRINGS];
        let mut text = Vec::new();
        let put32 = |buf: &mut Vec<u8>, at: usize, v: u32| {
            buf[at..at + 4].copy_from_slice(&v.to_ne_bytes())
        };
        for (field, value) in strings {
            put32(&mut buf, *field, text.len() as u32);
            text.extend_from_slice(value.as_bytes());
            text.push(0);
        }
        buf[SM_MASK..SM_MASK + 8].copy_from_slice(&mask.to_ne_bytes());
        put32(&mut buf, SM_DEV_MAJOR, 8);
        put32(&mut buf, SM_DEV_MINOR, 3);
        buf[SM_MNT_ID..SM_MNT_ID + 8].copy_from_slice(&0x8000_0042u64.to_ne_bytes());
        buf[SM_MNT_ATTR..SM_MNT_ATTR + 8].copy_from_slice(&attr.to_ne_bytes());
        buf.extend_from_slice(&text);
        let size = buf.len() as u32;
        put32(&mut buf, SM_SIZE, size);
        buf
    }

    #[test]
    fn decoding_reads_every_field_and_joins_the_subtype() {
        let strings = [
            (SM_FS_TYPE, "fuse"),
            (SM_FS_SUBTYPE, "tak-os-replicated"),
            (SM_MNT_ROOT, "/sub"),
            (SM_MNT_POINT, "/mnt/x"),
            (SM_SB_SOURCE, "v1.volume"),
        ];
        let buf = statmount_buffer(
            &strings,
            STATMOUNT_REQUIRED | STATMOUNT_FS_SUBTYPE,
            0x1 | 0x2,
        );
        let answer = decode_statmount(&buf).unwrap();
        assert_eq!(answer.mount_point, Path::new("/mnt/x"));
        let m = answer.mounted;
        assert_eq!(m.mount_id, 0x8000_0042);
        assert_eq!((m.identity.major, m.identity.minor), (8, 3));
        assert_eq!(m.identity.root, Path::new("/sub"));
        assert_eq!(m.identity.fs_type, "fuse.tak-os-replicated");
        assert_eq!(m.identity.source, "v1.volume");
        assert!(m.attrs.read_only && m.attrs.nosuid && !m.attrs.nodev);
    }

    #[test]
    fn decoding_refuses_an_answer_without_a_required_field() {
        let strings = [
            (SM_FS_TYPE, "ext4"),
            (SM_MNT_ROOT, "/"),
            (SM_MNT_POINT, "/"),
            (SM_SB_SOURCE, "/dev/vda"),
        ];
        // An older kernel: no sb_source in the returned mask.
        let buf = statmount_buffer(&strings, STATMOUNT_REQUIRED & !STATMOUNT_SB_SOURCE, 0);
        assert!(decode_statmount(&buf).is_none());
        let complete = statmount_buffer(&strings, STATMOUNT_REQUIRED, 0);
        assert_eq!(
            decode_statmount(&complete)
                .unwrap()
                .mounted
                .identity
                .fs_type,
            "ext4"
        );
    }

    #[test]
    fn root_within_joins_the_path_below_the_mount_point() {
        let root =
            root_within(Path::new("/store/v1"), Path::new("/store"), Path::new("/")).unwrap();
        assert_eq!(root, Path::new("/v1"));
        let root = root_within(
            Path::new("/store"),
            Path::new("/store"),
            Path::new("/host/store"),
        )
        .unwrap();
        assert_eq!(root, Path::new("/host/store"));
        assert!(root_within(Path::new("/other"), Path::new("/store"), Path::new("/")).is_err());
    }
}
