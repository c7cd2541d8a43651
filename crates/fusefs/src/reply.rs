//! What the core answers the kernel with, and the SETATTR request it takes, as the core's own
//! types: no FUSE library appears here. The adapter converts them to its library's types in one
//! place.

use std::ffi::OsString;
use std::time::Duration;

/// The type of a file, as the `S_IFMT` bits of its mode say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// A regular file.
    Regular,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// A block device node.
    BlockDevice,
    /// A character device node.
    CharDevice,
    /// A named pipe.
    Fifo,
    /// A Unix domain socket.
    Socket,
}

/// A point in time as seconds and nanoseconds since the Unix epoch.
///
/// A plain pair rather than [`std::time::SystemTime`]: the protocol and the kernel both carry
/// time this way, so a time passes between them unchanged (a SETATTR time reaches the worker
/// exactly as the kernel sent it), times before the epoch need no second branch, and nothing
/// depends on the range of the platform's clock type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Timestamp {
    /// Seconds since the epoch (negative before it).
    pub sec: i64,
    /// Nanoseconds within the second; below 1,000,000,000 in every attribute the core answers.
    pub nsec: u32,
}

/// The attributes of a node, as a GETATTR answers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Attributes {
    /// The node ID, which is the worker's inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Allocated 512-byte blocks.
    pub blocks: u64,
    /// Last access.
    pub atime: Timestamp,
    /// Last modification of the data.
    pub mtime: Timestamp,
    /// Last change of the inode.
    pub ctime: Timestamp,
    /// The file type.
    pub kind: FileKind,
    /// The permission bits of the mode, set-ID and sticky bits included (`mode & 0o7777`).
    pub perm: u16,
    /// Hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// The device a device node stands for (0 when it does not fit in 32 bits).
    pub rdev: u32,
    /// Preferred I/O block size.
    pub blksize: u32,
}

/// The answer to GETATTR and SETATTR: a node's attributes and how long the kernel may cache
/// them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stat {
    /// The attributes.
    pub attr: Attributes,
    /// How long the kernel may cache them.
    pub ttl: Duration,
}

/// A name's node handed to the kernel (LOOKUP, MKNOD, MKDIR, SYMLINK, LINK, CREATE): the kernel
/// holds one lookup of it until it sends FORGET.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The node's attributes; `attr.ino` is the node ID.
    pub attr: Attributes,
    /// The FUSE generation, which is the worker's inode generation.
    pub generation: u64,
    /// How long the kernel may cache the name and the attributes.
    pub ttl: Duration,
}

/// An open file or directory (OPEN, OPENDIR).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Opened {
    /// The file handle the kernel names in later requests (the worker's handle; 0 for a
    /// directory).
    pub handle: u64,
    /// The `FOPEN_*` flags for the kernel (`FOPEN_DIRECT_IO` ...).
    pub flags: u32,
}

/// A file created and opened in one request (CREATE).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Created {
    /// The new name's node.
    pub entry: Entry,
    /// Its open handle.
    pub opened: Opened,
}

/// One name in a READDIR reply.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DirEntry {
    /// The node ID (the worker's inode number; the directory's own for `.` and `..`).
    pub ino: u64,
    /// The file type the listing states.
    pub kind: FileKind,
    /// The name.
    pub name: OsString,
    /// The directory offset of the *next* entry, where the kernel resumes; at most `i64::MAX`
    /// (the kernel's directory offsets are signed).
    pub offset: u64,
}

/// One name in a READDIRPLUS reply: the listing's entry and the node handed to the kernel with
/// it (a lookup, once the kernel takes it; see [`PlusListing`](crate::PlusListing)).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DirEntryPlus {
    /// The name, its type and the offset after it.
    pub dirent: DirEntry,
    /// The node with its attributes.
    pub entry: Entry,
}

/// The answer to STATFS: the worker's filesystem.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StatFs {
    /// Blocks in all.
    pub blocks: u64,
    /// Free blocks.
    pub blocks_free: u64,
    /// Free blocks available to unprivileged users.
    pub blocks_available: u64,
    /// Inodes.
    pub files: u64,
    /// Free inodes.
    pub files_free: u64,
    /// The preferred block size.
    pub block_size: u32,
    /// The longest name.
    pub name_max: u32,
    /// The fragment size.
    pub fragment_size: u32,
}

/// What a SETATTR asks to change; `None` leaves a field as it is. A change of ctime or a lock
/// owner, which the kernel may also send, is not carried: the worker sets ctime itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SetAttrs {
    /// New mode; only its permission bits (`0o7777`) are applied.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<SetTime>,
    /// New modification time.
    pub mtime: Option<SetTime>,
}

/// A time a SETATTR sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SetTime {
    /// This instant.
    At(Timestamp),
    /// The worker's clock when it applies the change (`UTIME_NOW`). Never a time read on this
    /// host: a call's bytes must not depend on when it is sent, so that the successor of a
    /// crashed owner repeats the very same call.
    Now,
}
