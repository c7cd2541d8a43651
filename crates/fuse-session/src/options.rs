//! Mount options: what mount(2) is given, what INIT announces, and how many requests are
//! handled at once.

use std::ffi::CString;
use std::fmt::Write as _;
use std::os::fd::RawFd;

use rustix::mount::MountFlags;

use crate::Error;

/// The `max_write` a session announces unless told otherwise: 1 MiB.
pub const DEFAULT_MAX_WRITE: u32 = 1 << 20;
/// The smallest `max_write` accepted: the kernel raises anything smaller to 4096.
pub const MIN_MAX_WRITE: u32 = 4096;
/// The largest `max_write` accepted, 16 MiB. The kernel caps a request at `max_pages` pages
/// anyway (`fs.fuse.max_pages_limit`, 256 by default), so more only grows the read buffer.
pub const MAX_MAX_WRITE: u32 = 16 << 20;
/// How many requests a session handles at once unless told otherwise.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;
/// The most requests a session handles at once.
pub const MAX_MAX_IN_FLIGHT: usize = 1 << 16;

/// How a session serves, fresh or adopted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeOptions {
    /// Requests handled at once (1 to [`MAX_MAX_IN_FLIGHT`]). At the limit, the session
    /// stops reading: further requests wait in the kernel's queue.
    pub max_in_flight: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        }
    }
}

impl ServeOptions {
    /// Checks the limits.
    pub fn validate(&self) -> Result<(), Error> {
        if self.max_in_flight == 0 || self.max_in_flight > MAX_MAX_IN_FLIGHT {
            return Err(Error::InvalidOption {
                option: "max_in_flight",
                reason: "must be 1 to 65536",
            });
        }
        Ok(())
    }
}

/// How to mount: the mount(2) call (source, type, flags and the `fuse` options string) and the
/// limits the INIT reply announces.
///
/// The mount is a privileged one: the caller is root, and no `fusermount` helper is involved.
/// The kernel's `blksize=` option exists only for `fuseblk` and is not offered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    /// The mount's source, as mountinfo shows it (any bytes but NUL, not empty).
    pub fs_name: String,
    /// The subtype: the filesystem type becomes `fuse.<subtype>` (no NUL, not empty).
    pub subtype: Option<String>,
    /// The root's file mode, type bits included (`rootmode=`, octal); 0o040755 by default.
    pub root_mode: u32,
    /// The mount's owner (`user_id=`): without `allow_other`, only this user may use it.
    /// The calling process's effective user by default.
    pub uid: u32,
    /// The mount's group (`group_id=`). The calling process's effective group by default.
    pub gid: u32,
    /// `default_permissions`: the kernel checks file modes itself (on by default).
    pub default_permissions: bool,
    /// `allow_other`: users other than `uid` may use the mount (off by default).
    pub allow_other: bool,
    /// `MS_RDONLY`.
    pub read_only: bool,
    /// `MS_NOSUID` (on by default).
    pub nosuid: bool,
    /// `MS_NODEV` (on by default).
    pub nodev: bool,
    /// `MS_NOEXEC`.
    pub noexec: bool,
    /// `max_read=`: the largest READ the kernel sends; `None` leaves the kernel's limit.
    pub max_read: Option<u32>,
    /// The largest WRITE payload, announced in the INIT reply ([`MIN_MAX_WRITE`] to
    /// [`MAX_MAX_WRITE`]); also sets `max_pages`.
    pub max_write: u32,
    /// Agree to `FUSE_ATOMIC_O_TRUNC`: the handler truncates in OPEN when its flags hold
    /// `O_TRUNC` (the kernel then sends no SETATTR for it). Off by default.
    pub atomic_o_trunc: bool,
    /// `max_background` in the INIT reply; 0 keeps the kernel's default (12).
    pub max_background: u16,
    /// `congestion_threshold` in the INIT reply; 0 keeps the kernel's default.
    pub congestion_threshold: u16,
    /// How the session serves once mounted.
    pub serve: ServeOptions,
}

/// `S_IFMT` and the file types the kernel accepts as a FUSE root.
const S_IFMT: u32 = 0o170_000;
const VALID_ROOT_TYPES: [u32; 7] = [
    0o010_000, // FIFO
    0o020_000, // character device
    0o040_000, // directory
    0o060_000, // block device
    0o100_000, // regular file
    0o120_000, // symbolic link
    0o140_000, // socket
];

impl MountOptions {
    /// Options with the defaults documented on each field, mounting `fs_name`.
    pub fn new(fs_name: impl Into<String>) -> MountOptions {
        MountOptions {
            fs_name: fs_name.into(),
            subtype: None,
            root_mode: 0o040_755,
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            default_permissions: true,
            allow_other: false,
            read_only: false,
            nosuid: true,
            nodev: true,
            noexec: false,
            max_read: None,
            max_write: DEFAULT_MAX_WRITE,
            atomic_o_trunc: false,
            max_background: 0,
            congestion_threshold: 0,
            serve: ServeOptions::default(),
        }
    }

    /// Checks every field the kernel would refuse, before anything is opened or mounted.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |option, reason| Err(Error::InvalidOption { option, reason });
        if self.fs_name.is_empty() || self.fs_name.contains('\0') {
            return bad("fs_name", "must be non-empty and hold no NUL");
        }
        if let Some(subtype) = &self.subtype
            && (subtype.is_empty() || subtype.contains('\0'))
        {
            return bad("subtype", "must be non-empty and hold no NUL");
        }
        if !VALID_ROOT_TYPES.contains(&(self.root_mode & S_IFMT)) || self.root_mode > 0o177_777 {
            return bad("root_mode", "must be a file mode with a valid file type");
        }
        if self.max_read == Some(0) {
            return bad("max_read", "must not be 0");
        }
        if !(MIN_MAX_WRITE..=MAX_MAX_WRITE).contains(&self.max_write) {
            return bad("max_write", "must be 4096 to 16 MiB");
        }
        self.serve.validate()
    }

    /// The filesystem type given to mount(2): `fuse`, or `fuse.<subtype>` (the kernel takes
    /// the subtype from what follows the dot).
    pub fn fs_type(&self) -> String {
        match &self.subtype {
            Some(subtype) => format!("fuse.{subtype}"),
            None => "fuse".to_owned(),
        }
    }

    /// The mount flags.
    pub fn mount_flags(&self) -> MountFlags {
        let mut flags = MountFlags::empty();
        for (set, flag) in [
            (self.read_only, MountFlags::RDONLY),
            (self.nosuid, MountFlags::NOSUID),
            (self.nodev, MountFlags::NODEV),
            (self.noexec, MountFlags::NOEXEC),
        ] {
            if set {
                flags |= flag;
            }
        }
        flags
    }

    /// The `fuse` options string for a connection on descriptor `fd`:
    /// `fd=N,rootmode=O,user_id=U,group_id=G[,default_permissions][,allow_other][,max_read=R]`.
    pub fn mount_data(&self, fd: RawFd) -> Result<CString, Error> {
        self.validate()?;
        let mut data = format!(
            "fd={fd},rootmode={:o},user_id={},group_id={}",
            self.root_mode, self.uid, self.gid
        );
        if self.default_permissions {
            data.push_str(",default_permissions");
        }
        if self.allow_other {
            data.push_str(",allow_other");
        }
        if let Some(max_read) = self.max_read {
            let _ = write!(data, ",max_read={max_read}");
        }
        // Only digits, letters, '=', ',' and '_' went in.
        CString::new(data).map_err(|_| Error::InvalidOption {
            option: "mount data",
            reason: "holds a NUL",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> MountOptions {
        MountOptions {
            uid: 1000,
            gid: 100,
            ..MountOptions::new("v1.volume")
        }
    }

    #[test]
    fn mount_data_names_the_descriptor_root_mode_and_owner() {
        let data = options().mount_data(7).unwrap();
        assert_eq!(
            data.to_str().unwrap(),
            "fd=7,rootmode=40755,user_id=1000,group_id=100,default_permissions"
        );
        let all = MountOptions {
            allow_other: true,
            default_permissions: false,
            max_read: Some(131_072),
            root_mode: 0o040_700,
            ..options()
        };
        assert_eq!(
            all.mount_data(12).unwrap().to_str().unwrap(),
            "fd=12,rootmode=40700,user_id=1000,group_id=100,allow_other,max_read=131072"
        );
    }

    #[test]
    fn fs_type_carries_the_subtype() {
        assert_eq!(options().fs_type(), "fuse");
        let with = MountOptions {
            subtype: Some("tak-os-replicated".into()),
            ..options()
        };
        assert_eq!(with.fs_type(), "fuse.tak-os-replicated");
    }

    #[test]
    fn flags_follow_the_options() {
        assert_eq!(
            options().mount_flags(),
            MountFlags::NOSUID | MountFlags::NODEV
        );
        let ro = MountOptions {
            read_only: true,
            nosuid: false,
            nodev: false,
            noexec: true,
            ..options()
        };
        assert_eq!(ro.mount_flags(), MountFlags::RDONLY | MountFlags::NOEXEC);
    }

    #[test]
    fn invalid_options_are_refused_by_name() {
        let refused = |o: MountOptions| match o.validate() {
            Err(Error::InvalidOption { option, .. }) => option,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert_eq!(refused(MountOptions::new("")), "fs_name");
        assert_eq!(refused(MountOptions::new("a\0b")), "fs_name");
        let o = options;
        assert_eq!(
            refused(MountOptions {
                subtype: Some(String::new()),
                ..o()
            }),
            "subtype"
        );
        assert_eq!(
            refused(MountOptions {
                root_mode: 0o755,
                ..o()
            }),
            "root_mode"
        );
        assert_eq!(
            refused(MountOptions {
                max_read: Some(0),
                ..o()
            }),
            "max_read"
        );
        for max_write in [0, 4095, MAX_MAX_WRITE + 1] {
            assert_eq!(refused(MountOptions { max_write, ..o() }), "max_write");
        }
        for max_in_flight in [0, MAX_MAX_IN_FLIGHT + 1] {
            assert_eq!(
                refused(MountOptions {
                    serve: ServeOptions { max_in_flight },
                    ..o()
                }),
                "max_in_flight"
            );
        }
        assert!(o().validate().is_ok());
        assert!(o().mount_data(3).is_ok());
    }
}
