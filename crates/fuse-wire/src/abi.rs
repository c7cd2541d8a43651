//! Numbers of the kernel ABI (`include/uapi/linux/fuse.h`): the protocol version, opcodes,
//! notification codes, flag sets and limits.

use std::fmt;

/// The major protocol version this crate speaks (`FUSE_KERNEL_VERSION`).
pub const KERNEL_VERSION: u32 = 7;

/// The minor protocol version this crate speaks (`FUSE_KERNEL_MINOR_VERSION`): 7.45, the
/// version of the Linux 6.19 header.
///
/// Every struct this crate decodes or encodes has had its current size since 7.23 at the
/// latest (`fuse_init_out` reached 64 bytes in 7.23; `request_timeout` took two of its unused
/// bytes in 7.43). What 7.44 and 7.45 added is outside this crate's operations: the
/// `INC_EPOCH` and `PRUNE` notifications and the `COPY_FILE_RANGE_64` opcode, which decodes as
/// [`Operation::Unknown`](crate::Operation::Unknown) and is answered `ENOSYS`, after which the
/// kernel falls back to `COPY_FILE_RANGE`.
pub const KERNEL_MINOR_VERSION: u32 = 45;

/// The oldest negotiated minor version whose request layouts this crate decodes. Older
/// kernels send shorter `fuse_mknod_in`, `fuse_create_in`, `fuse_read_in` and
/// `fuse_write_in` (before 7.9 and 7.12), which decode as truncated structs.
pub const OLDEST_SUPPORTED_MINOR: u32 = 12;

/// The node ID of the filesystem root (`FUSE_ROOT_ID`).
pub const ROOT_ID: u64 = 1;

/// The smallest buffer a read of `/dev/fuse` accepts (`FUSE_MIN_READ_BUFFER`).
pub const MIN_READ_BUFFER: usize = 8192;

/// The longest name the kernel accepts in a directory entry (`FUSE_NAME_MAX` in
/// `fs/fuse/fuse_i.h`, a kernel-internal limit). Newer kernels may accept longer names on
/// some connections; 1024 is accepted by all.
pub const NAME_MAX: usize = 1024;

/// `fuse_in_header`: every request starts with it.
pub const IN_HEADER_SIZE: usize = 40;

/// `fuse_out_header`: every reply and notification starts with it.
pub const OUT_HEADER_SIZE: usize = 16;

/// `FUSE_COMPAT_ENTRY_OUT_SIZE`: `fuse_entry_out` for minor < 9.
pub const COMPAT_ENTRY_OUT_SIZE: usize = 120;
/// `FUSE_COMPAT_ATTR_OUT_SIZE`: `fuse_attr_out` for minor < 9.
pub const COMPAT_ATTR_OUT_SIZE: usize = 96;
/// `FUSE_COMPAT_MKNOD_IN_SIZE`: `fuse_mknod_in` for minor < 12.
pub const COMPAT_MKNOD_IN_SIZE: usize = 8;
/// `FUSE_COMPAT_WRITE_IN_SIZE`: `fuse_write_in` for minor < 9.
pub const COMPAT_WRITE_IN_SIZE: usize = 24;
/// `FUSE_COMPAT_STATFS_SIZE`: `fuse_statfs_out` for minor < 4.
pub const COMPAT_STATFS_SIZE: usize = 48;
/// `FUSE_COMPAT_INIT_OUT_SIZE`: `fuse_init_out` for minor < 5.
pub const COMPAT_INIT_OUT_SIZE: usize = 8;
/// `FUSE_COMPAT_22_INIT_OUT_SIZE`: `fuse_init_out` for minor < 23.
pub const COMPAT_22_INIT_OUT_SIZE: usize = 24;

/// The size of `fuse_write_in`, the largest fixed part of the request with the most payload.
const WRITE_IN_SIZE: usize = 40;

/// The smallest read buffer the kernel accepts on a connection with this `max_write`:
/// `max(FUSE_MIN_READ_BUFFER, sizeof(fuse_in_header) + sizeof(fuse_write_in) + max_write)`.
/// A read with a smaller buffer fails with `EINVAL` before any request is dequeued
/// (`fuse_dev_do_read`).
///
/// Pass the `max_write` the kernel applies: the kernel raises a `max_write` below 4096 to
/// 4096 ([`InitRecord::read_buffer_size`](crate::InitRecord::read_buffer_size) does this).
pub const fn read_buffer_size(max_write: u32) -> usize {
    let needed = IN_HEADER_SIZE + WRITE_IN_SIZE + max_write as usize;
    if needed > MIN_READ_BUFFER {
        needed
    } else {
        MIN_READ_BUFFER
    }
}

/// A request's operation code (`enum fuse_opcode`), known or not.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Opcode(pub u32);

macro_rules! opcodes {
    ($($(#[$meta:meta])* $name:ident = $value:literal,)*) => {
        impl Opcode {
            $($(#[$meta])* pub const $name: Opcode = Opcode($value);)*

            /// The kernel's name for this opcode without the `FUSE_` prefix (`"LOOKUP"`), or
            /// `None` for a number the 7.45 ABI does not define.
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $($value => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        }
    };
}

opcodes! {
    /// Look up a name in a directory.
    LOOKUP = 1,
    /// Drop lookups of one node; no reply.
    FORGET = 2,
    /// Attributes of a node.
    GETATTR = 3,
    /// Change attributes.
    SETATTR = 4,
    /// Read a symbolic link.
    READLINK = 5,
    /// Create a symbolic link.
    SYMLINK = 6,
    /// Create a file node.
    MKNOD = 8,
    /// Create a directory.
    MKDIR = 9,
    /// Remove a file.
    UNLINK = 10,
    /// Remove a directory.
    RMDIR = 11,
    /// Rename.
    RENAME = 12,
    /// Create a hard link.
    LINK = 13,
    /// Open a file.
    OPEN = 14,
    /// Read file data.
    READ = 15,
    /// Write file data.
    WRITE = 16,
    /// Filesystem statistics.
    STATFS = 17,
    /// Close a file.
    RELEASE = 18,
    /// Synchronize a file.
    FSYNC = 20,
    /// Set an extended attribute.
    SETXATTR = 21,
    /// Get an extended attribute.
    GETXATTR = 22,
    /// List extended attributes.
    LISTXATTR = 23,
    /// Remove an extended attribute.
    REMOVEXATTR = 24,
    /// A file descriptor was closed.
    FLUSH = 25,
    /// Start the connection.
    INIT = 26,
    /// Open a directory.
    OPENDIR = 27,
    /// Read directory entries.
    READDIR = 28,
    /// Close a directory.
    RELEASEDIR = 29,
    /// Synchronize a directory.
    FSYNCDIR = 30,
    /// Test for a POSIX lock.
    GETLK = 31,
    /// Take a POSIX lock.
    SETLK = 32,
    /// Take a POSIX lock, waiting.
    SETLKW = 33,
    /// Check access permissions.
    ACCESS = 34,
    /// Create and open a file.
    CREATE = 35,
    /// Interrupt an earlier request.
    INTERRUPT = 36,
    /// Map a block (block-device filesystems).
    BMAP = 37,
    /// The connection is going away.
    DESTROY = 38,
    /// An ioctl.
    IOCTL = 39,
    /// Poll.
    POLL = 40,
    /// The reply to a retrieve notification.
    NOTIFY_REPLY = 41,
    /// Drop lookups of many nodes; no reply.
    BATCH_FORGET = 42,
    /// Allocate space.
    FALLOCATE = 43,
    /// Read directory entries with their attributes.
    READDIRPLUS = 44,
    /// Rename with flags.
    RENAME2 = 45,
    /// Find data or holes.
    LSEEK = 46,
    /// Copy a file range (32-bit result).
    COPY_FILE_RANGE = 47,
    /// DAX: set up a mapping.
    SETUPMAPPING = 48,
    /// DAX: remove mappings.
    REMOVEMAPPING = 49,
    /// Synchronize the filesystem.
    SYNCFS = 50,
    /// Create an unnamed temporary file.
    TMPFILE = 51,
    /// Extended attributes (statx).
    STATX = 52,
    /// Copy a file range (64-bit result), 7.45.
    COPY_FILE_RANGE_64 = 53,
    /// CUSE's INIT.
    CUSE_INIT = 4096,
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name}"),
            None => write!(f, "Opcode({})", self.0),
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "opcode {}", self.0),
        }
    }
}

/// Notification codes (`enum fuse_notify_code`): what a message with `unique` 0 carries in
/// its `error` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NotifyCode(pub i32);

impl NotifyCode {
    /// Wake up a poller.
    pub const POLL: NotifyCode = NotifyCode(1);
    /// Invalidate an inode's attributes and cached data.
    pub const INVAL_INODE: NotifyCode = NotifyCode(2);
    /// Invalidate a directory entry.
    pub const INVAL_ENTRY: NotifyCode = NotifyCode(3);
    /// Store data in the page cache.
    pub const STORE: NotifyCode = NotifyCode(4);
    /// Retrieve data from the page cache.
    pub const RETRIEVE: NotifyCode = NotifyCode(5);
    /// A directory entry was deleted.
    pub const DELETE: NotifyCode = NotifyCode(6);
    /// Requeue every request read but not answered (7.40, Linux 6.9).
    pub const RESEND: NotifyCode = NotifyCode(7);
    /// Make every cached dentry revalidate (7.44).
    pub const INC_EPOCH: NotifyCode = NotifyCode(8);
    /// Ask the kernel to drop unused inodes (7.45).
    pub const PRUNE: NotifyCode = NotifyCode(9);
}

/// Defines a flag-set newtype over an integer with named bits.
macro_rules! flag_set {
    (
        $(#[$meta:meta])*
        pub struct $name:ident($ty:ty) {
            $($(#[$fmeta:meta])* $flag:ident = $value:expr;)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub $ty);

        impl $name {
            $($(#[$fmeta])* pub const $flag: $name = $name($value);)*

            /// No bit set.
            pub const EMPTY: $name = $name(0);

            const NAMED: &'static [(&'static str, $ty)] = &[$((stringify!($flag), $value)),*];

            /// The raw bits.
            pub const fn bits(self) -> $ty {
                self.0
            }

            /// Whether every bit of `other` is set.
            pub const fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0
            }

            /// Whether any bit of `other` is set.
            pub const fn intersects(self, other: $name) -> bool {
                self.0 & other.0 != 0
            }

            /// Whether no bit is set.
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }

            /// The bits set in either.
            pub const fn union(self, other: $name) -> $name {
                $name(self.0 | other.0)
            }

            /// The bits set in both.
            pub const fn intersection(self, other: $name) -> $name {
                $name(self.0 & other.0)
            }

            /// The bits of `self` not set in `other`.
            pub const fn difference(self, other: $name) -> $name {
                $name(self.0 & !other.0)
            }
        }

        impl std::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, other: $name) -> $name {
                self.union(other)
            }
        }

        impl std::ops::BitOrAssign for $name {
            fn bitor_assign(&mut self, other: $name) {
                *self = self.union(other);
            }
        }

        impl std::ops::BitAnd for $name {
            type Output = $name;
            fn bitand(self, other: $name) -> $name {
                self.intersection(other)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}(", stringify!($name))?;
                let mut rest = self.0;
                let mut first = true;
                for (name, bit) in Self::NAMED {
                    // An alias names bits already printed; only bits still left count.
                    if *bit != 0 && rest & bit == *bit {
                        if !first {
                            f.write_str(" | ")?;
                        }
                        f.write_str(name)?;
                        rest &= !bit;
                        first = false;
                    }
                }
                if rest != 0 {
                    if !first {
                        f.write_str(" | ")?;
                    }
                    write!(f, "{rest:#x}")?;
                } else if first {
                    f.write_str("empty")?;
                }
                f.write_str(")")
            }
        }
    };
}

flag_set! {
    /// INIT flags as one 64-bit set: bits 0..32 travel in `flags`, bits 32..64 in `flags2`
    /// (`fuse_init_in.flags2`, `fuse_init_out.flags2`, 7.36), which count only when
    /// [`INIT_EXT`](Self::INIT_EXT) is set, the way the kernel combines them
    /// (`flags | (u64)flags2 << 32`).
    pub struct InitFlags(u64) {
        /// Asynchronous read requests.
        ASYNC_READ = 1 << 0;
        /// Remote POSIX file locks.
        POSIX_LOCKS = 1 << 1;
        /// Not supported by the kernel.
        FILE_OPS = 1 << 2;
        /// The filesystem handles `O_TRUNC` in OPEN.
        ATOMIC_O_TRUNC = 1 << 3;
        /// The filesystem handles lookups of `.` and `..` (NFS export).
        EXPORT_SUPPORT = 1 << 4;
        /// Writes larger than 4 KiB.
        BIG_WRITES = 1 << 5;
        /// The kernel does not apply the umask on create.
        DONT_MASK = 1 << 6;
        /// The kernel supports splice writes on the device.
        SPLICE_WRITE = 1 << 7;
        /// The kernel supports splice moves on the device.
        SPLICE_MOVE = 1 << 8;
        /// The kernel supports splice reads on the device.
        SPLICE_READ = 1 << 9;
        /// Remote BSD (`flock`) locks.
        FLOCK_LOCKS = 1 << 10;
        /// The kernel supports ioctl on directories.
        HAS_IOCTL_DIR = 1 << 11;
        /// Invalidate cached pages automatically on size or mtime change.
        AUTO_INVAL_DATA = 1 << 12;
        /// READDIRPLUS.
        DO_READDIRPLUS = 1 << 13;
        /// Adaptive READDIRPLUS.
        READDIRPLUS_AUTO = 1 << 14;
        /// Asynchronous direct I/O.
        ASYNC_DIO = 1 << 15;
        /// Writeback caching of buffered writes.
        WRITEBACK_CACHE = 1 << 16;
        /// The kernel supports zero-message opens (ENOSYS to OPEN).
        NO_OPEN_SUPPORT = 1 << 17;
        /// Parallel lookups and readdir.
        PARALLEL_DIROPS = 1 << 18;
        /// The filesystem clears suid/sgid/capabilities on write, chown and truncate.
        HANDLE_KILLPRIV = 1 << 19;
        /// POSIX ACLs.
        POSIX_ACL = 1 << 20;
        /// Reading an aborted connection returns `ECONNABORTED`.
        ABORT_ERROR = 1 << 21;
        /// `fuse_init_out.max_pages` is valid.
        MAX_PAGES = 1 << 22;
        /// Cache READLINK replies.
        CACHE_SYMLINKS = 1 << 23;
        /// The kernel supports zero-message opendirs.
        NO_OPENDIR_SUPPORT = 1 << 24;
        /// Invalidate cached pages only on explicit request.
        EXPLICIT_INVAL_DATA = 1 << 25;
        /// `fuse_init_out.map_alignment` is valid (DAX).
        MAP_ALIGNMENT = 1 << 26;
        /// The kernel supports submounts.
        SUBMOUNTS = 1 << 27;
        /// Version 2 of killpriv handling.
        HANDLE_KILLPRIV_V2 = 1 << 28;
        /// The extended `fuse_setxattr_in`.
        SETXATTR_EXT = 1 << 29;
        /// `flags2` is valid: the extended INIT.
        INIT_EXT = 1 << 30;
        /// Reserved; never set.
        INIT_RESERVED = 1 << 31;
        /// Security contexts on create requests (an extension).
        SECURITY_CTX = 1 << 32;
        /// Per-inode DAX.
        HAS_INODE_DAX = 1 << 33;
        /// Supplementary group on create requests (an extension).
        CREATE_SUPP_GROUP = 1 << 34;
        /// The kernel supports expire-only entry invalidation.
        HAS_EXPIRE_ONLY = 1 << 35;
        /// Shared mmap of `FOPEN_DIRECT_IO` files.
        DIRECT_IO_ALLOW_MMAP = 1 << 36;
        /// Passthrough to backing files.
        PASSTHROUGH = 1 << 37;
        /// Explicitly disable NFS export.
        NO_EXPORT_SUPPORT = 1 << 38;
        /// The kernel supports `FUSE_NOTIFY_RESEND` and marks resent requests (7.40).
        HAS_RESEND = 1 << 39;
        /// Idmapped mounts (7.41).
        ALLOW_IDMAP = 1 << 40;
        /// FUSE over io_uring (7.42).
        OVER_IO_URING = 1 << 41;
        /// `fuse_init_out.request_timeout` is valid (7.43).
        REQUEST_TIMEOUT = 1 << 42;
    }
}

impl InitFlags {
    /// The kernel's combination of the two 32-bit fields: `flags2` counts only when `flags`
    /// has [`INIT_EXT`](Self::INIT_EXT).
    pub const fn from_fields(flags: u32, flags2: u32) -> InitFlags {
        let low = flags as u64;
        if low & Self::INIT_EXT.0 != 0 {
            InitFlags(low | (flags2 as u64) << 32)
        } else {
            InitFlags(low)
        }
    }

    /// The bits carried in `flags`.
    pub const fn low(self) -> u32 {
        self.0 as u32
    }

    /// The bits carried in `flags2`.
    pub const fn high(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

flag_set! {
    /// `fuse_open_out.open_flags` (`FOPEN_*`): how the kernel treats an open file.
    pub struct FopenFlags(u32) {
        /// Bypass the page cache.
        DIRECT_IO = 1 << 0;
        /// Keep the data cache on open.
        KEEP_CACHE = 1 << 1;
        /// Not seekable.
        NONSEEKABLE = 1 << 2;
        /// Cache this directory's entries.
        CACHE_DIR = 1 << 3;
        /// Stream-like: no file position.
        STREAM = 1 << 4;
        /// No FLUSH on close (unless writeback caching).
        NOFLUSH = 1 << 5;
        /// Parallel direct writes on the same file.
        PARALLEL_DIRECT_WRITES = 1 << 6;
        /// Passthrough reads and writes to `backing_id`.
        PASSTHROUGH = 1 << 7;
    }
}

flag_set! {
    /// `fuse_setattr_in.valid` (`FATTR_*`): which fields of a SETATTR to apply.
    pub struct SetattrValid(u32) {
        /// `mode`.
        MODE = 1 << 0;
        /// `uid`.
        UID = 1 << 1;
        /// `gid`.
        GID = 1 << 2;
        /// `size`.
        SIZE = 1 << 3;
        /// `atime`, `atimensec`.
        ATIME = 1 << 4;
        /// `mtime`, `mtimensec`.
        MTIME = 1 << 5;
        /// `fh` is valid.
        FH = 1 << 6;
        /// Set atime to now.
        ATIME_NOW = 1 << 7;
        /// Set mtime to now.
        MTIME_NOW = 1 << 8;
        /// `lock_owner` is valid.
        LOCKOWNER = 1 << 9;
        /// `ctime`, `ctimensec`.
        CTIME = 1 << 10;
        /// Clear suid/sgid.
        KILL_SUIDGID = 1 << 11;
    }
}

flag_set! {
    /// `fuse_write_in.write_flags` (`FUSE_WRITE_*`).
    pub struct WriteFlags(u32) {
        /// A delayed write from the page cache; the file handle is guessed.
        CACHE = 1 << 0;
        /// `lock_owner` is valid.
        LOCKOWNER = 1 << 1;
        /// Clear suid/sgid (formerly `FUSE_WRITE_KILL_PRIV`).
        KILL_SUIDGID = 1 << 2;
    }
}

flag_set! {
    /// `fuse_read_in.read_flags` (`FUSE_READ_*`).
    pub struct ReadFlags(u32) {
        /// `lock_owner` is valid.
        LOCKOWNER = 1 << 1;
    }
}

flag_set! {
    /// `fuse_release_in.release_flags` (`FUSE_RELEASE_*`).
    pub struct ReleaseFlags(u32) {
        /// Flush before releasing.
        FLUSH = 1 << 0;
        /// Release the `flock` lock of `lock_owner`.
        FLOCK_UNLOCK = 1 << 1;
    }
}

flag_set! {
    /// `fuse_getattr_in.getattr_flags` (`FUSE_GETATTR_*`).
    pub struct GetattrFlags(u32) {
        /// `fh` is valid.
        FH = 1 << 0;
    }
}

flag_set! {
    /// `fuse_fsync_in.fsync_flags` (`FUSE_FSYNC_*`).
    pub struct FsyncFlags(u32) {
        /// Data only (`fdatasync`).
        FDATASYNC = 1 << 0;
    }
}

flag_set! {
    /// `fuse_open_in.open_flags` and `fuse_create_in.open_flags` (`FUSE_OPEN_*`).
    pub struct OpenInFlags(u32) {
        /// Clear suid/sgid if the file is executable.
        KILL_SUIDGID = 1 << 0;
    }
}

flag_set! {
    /// `fuse_notify_inval_entry_out.flags`.
    pub struct InvalEntryFlags(u32) {
        /// Only expire the entry, do not drop it (needs [`InitFlags::HAS_EXPIRE_ONLY`]).
        EXPIRE_ONLY = 1 << 0;
    }
}

flag_set! {
    /// `fuse_attr.flags` (`FUSE_ATTR_*`).
    pub struct AttrFlags(u32) {
        /// The node is a submount root.
        SUBMOUNT = 1 << 0;
        /// DAX for this file in per-inode DAX mode.
        DAX = 1 << 1;
    }
}

/// The directory-entry type of a file mode (`(mode & S_IFMT) >> 12`, the `DT_*` value
/// `fuse_dirent.type` carries).
pub const fn dirent_type(mode: u32) -> u32 {
    (mode & 0o170_000) >> 12
}
