//! The fixed-size structs of the ABI, field for field in the kernel's order. Padding and
//! unused fields are not kept: they are skipped when read and written as zeros.

use crate::abi::{
    AttrFlags, FopenFlags, FsyncFlags, GetattrFlags, InvalEntryFlags, OpenInFlags, ReadFlags,
    ReleaseFlags, SetattrValid, WriteFlags,
};
use crate::codec::{Put, Reader};

/// A fixed-size struct of the FUSE ABI, read and written in the host's byte order.
pub trait WireStruct: Sized {
    /// Its size on the wire (`sizeof` in the kernel header).
    const SIZE: usize;
    /// The kernel's name for it (`"fuse_read_in"`).
    const C_NAME: &'static str;

    /// Reads the struct from the first [`SIZE`](Self::SIZE) bytes, or `None` when `bytes` is
    /// shorter. Bytes after those are ignored.
    fn read_from(bytes: &[u8]) -> Option<Self>;

    /// Appends exactly [`SIZE`](Self::SIZE) bytes.
    fn write_to(&self, out: &mut Vec<u8>);

    /// The struct's bytes.
    fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::SIZE);
        self.write_to(&mut out);
        out
    }
}

/// Implements [`WireStruct`] from a reading closure over a [`Reader`] and a writing closure.
macro_rules! wire_struct {
    ($name:ident, $c_name:literal, $size:literal, |$r:ident| $read:block, |$s:ident, $o:ident| $write:block) => {
        impl WireStruct for $name {
            const SIZE: usize = $size;
            const C_NAME: &'static str = $c_name;

            fn read_from(bytes: &[u8]) -> Option<Self> {
                let $r = &mut Reader::new(bytes);
                $read
            }

            fn write_to(&self, $o: &mut Vec<u8>) {
                let $s = self;
                $write
            }
        }
    };
}

/// `fuse_in_header`: the start of every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InHeader {
    /// The whole request's length, header included.
    pub len: u32,
    /// The operation.
    pub opcode: crate::Opcode,
    /// The request ID with its flag bits.
    pub unique: crate::Unique,
    /// The node the operation is on.
    pub nodeid: u64,
    /// The caller's user ID (`u32::MAX` when an idmapped mount cannot map it).
    pub uid: u32,
    /// The caller's group ID.
    pub gid: u32,
    /// The caller's thread group ID.
    pub pid: u32,
    /// Length of the request's extensions in 8-byte units (7.38).
    pub total_extlen: u16,
}

wire_struct!(
    InHeader,
    "fuse_in_header",
    40,
    |r| {
        let h = InHeader {
            len: r.u32()?,
            opcode: crate::Opcode(r.u32()?),
            unique: crate::Unique(r.u64()?),
            nodeid: r.u64()?,
            uid: r.u32()?,
            gid: r.u32()?,
            pid: r.u32()?,
            total_extlen: r.u16()?,
        };
        r.skip(2)?;
        Some(h)
    },
    |s, out| {
        out.put_u32(s.len);
        out.put_u32(s.opcode.0);
        out.put_u64(s.unique.0);
        out.put_u64(s.nodeid);
        out.put_u32(s.uid);
        out.put_u32(s.gid);
        out.put_u32(s.pid);
        out.put_u16(s.total_extlen);
        out.put_zeros(2);
    }
);

/// `fuse_forget_in`: FORGET.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ForgetIn {
    /// Lookups to drop.
    pub nlookup: u64,
}

wire_struct!(
    ForgetIn,
    "fuse_forget_in",
    8,
    |r| { Some(ForgetIn { nlookup: r.u64()? }) },
    |s, out| {
        out.put_u64(s.nlookup);
    }
);

/// `fuse_forget_one`: one entry of a BATCH_FORGET.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ForgetOne {
    /// The node.
    pub nodeid: u64,
    /// Lookups to drop.
    pub nlookup: u64,
}

wire_struct!(
    ForgetOne,
    "fuse_forget_one",
    16,
    |r| {
        Some(ForgetOne {
            nodeid: r.u64()?,
            nlookup: r.u64()?,
        })
    },
    |s, out| {
        out.put_u64(s.nodeid);
        out.put_u64(s.nlookup);
    }
);

/// `fuse_batch_forget_in`: the fixed part of BATCH_FORGET.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct BatchForgetIn {
    pub(crate) count: u32,
}

wire_struct!(
    BatchForgetIn,
    "fuse_batch_forget_in",
    8,
    |r| {
        let count = r.u32()?;
        r.skip(4)?;
        Some(BatchForgetIn { count })
    },
    |s, out| {
        out.put_u32(s.count);
        out.put_zeros(4);
    }
);

/// `fuse_getattr_in`: GETATTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GetattrIn {
    /// [`GetattrFlags::FH`] when `fh` is valid.
    pub getattr_flags: GetattrFlags,
    /// The file handle of an `fstat`.
    pub fh: u64,
}

impl GetattrIn {
    /// The file handle, when the kernel sent one.
    pub fn fh(&self) -> Option<u64> {
        self.getattr_flags
            .contains(GetattrFlags::FH)
            .then_some(self.fh)
    }
}

wire_struct!(
    GetattrIn,
    "fuse_getattr_in",
    16,
    |r| {
        let getattr_flags = GetattrFlags(r.u32()?);
        r.skip(4)?;
        Some(GetattrIn {
            getattr_flags,
            fh: r.u64()?,
        })
    },
    |s, out| {
        out.put_u32(s.getattr_flags.0);
        out.put_zeros(4);
        out.put_u64(s.fh);
    }
);

/// `fuse_setattr_in`: SETATTR. Only the fields named in `valid` mean anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetattrIn {
    /// Which fields to apply.
    pub valid: SetattrValid,
    /// File handle ([`SetattrValid::FH`]).
    pub fh: u64,
    /// New size ([`SetattrValid::SIZE`]).
    pub size: u64,
    /// Lock owner ([`SetattrValid::LOCKOWNER`]).
    pub lock_owner: u64,
    /// Access time, seconds.
    pub atime: u64,
    /// Modification time, seconds.
    pub mtime: u64,
    /// Change time, seconds.
    pub ctime: u64,
    /// Access time, nanoseconds.
    pub atimensec: u32,
    /// Modification time, nanoseconds.
    pub mtimensec: u32,
    /// Change time, nanoseconds.
    pub ctimensec: u32,
    /// New mode.
    pub mode: u32,
    /// New owner.
    pub uid: u32,
    /// New group.
    pub gid: u32,
}

wire_struct!(
    SetattrIn,
    "fuse_setattr_in",
    88,
    |r| {
        let valid = SetattrValid(r.u32()?);
        r.skip(4)?; // padding
        let fh = r.u64()?;
        let size = r.u64()?;
        let lock_owner = r.u64()?;
        let atime = r.u64()?;
        let mtime = r.u64()?;
        let ctime = r.u64()?;
        let atimensec = r.u32()?;
        let mtimensec = r.u32()?;
        let ctimensec = r.u32()?;
        let mode = r.u32()?;
        r.skip(4)?; // unused4
        let uid = r.u32()?;
        let gid = r.u32()?;
        r.skip(4)?; // unused5
        Some(SetattrIn {
            valid,
            fh,
            size,
            lock_owner,
            atime,
            mtime,
            ctime,
            atimensec,
            mtimensec,
            ctimensec,
            mode,
            uid,
            gid,
        })
    },
    |s, out| {
        out.put_u32(s.valid.0);
        out.put_zeros(4);
        out.put_u64(s.fh);
        out.put_u64(s.size);
        out.put_u64(s.lock_owner);
        out.put_u64(s.atime);
        out.put_u64(s.mtime);
        out.put_u64(s.ctime);
        out.put_u32(s.atimensec);
        out.put_u32(s.mtimensec);
        out.put_u32(s.ctimensec);
        out.put_u32(s.mode);
        out.put_zeros(4);
        out.put_u32(s.uid);
        out.put_u32(s.gid);
        out.put_zeros(4);
    }
);

/// `fuse_mknod_in`: MKNOD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MknodIn {
    /// File type and permissions.
    pub mode: u32,
    /// Device number.
    pub rdev: u32,
    /// The caller's umask (applied by the filesystem unless [`InitFlags::DONT_MASK`](crate::InitFlags::DONT_MASK)).
    pub umask: u32,
}

wire_struct!(
    MknodIn,
    "fuse_mknod_in",
    16,
    |r| {
        let m = MknodIn {
            mode: r.u32()?,
            rdev: r.u32()?,
            umask: r.u32()?,
        };
        r.skip(4)?;
        Some(m)
    },
    |s, out| {
        out.put_u32(s.mode);
        out.put_u32(s.rdev);
        out.put_u32(s.umask);
        out.put_zeros(4);
    }
);

/// `fuse_mkdir_in`: MKDIR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MkdirIn {
    /// Permissions.
    pub mode: u32,
    /// The caller's umask.
    pub umask: u32,
}

wire_struct!(
    MkdirIn,
    "fuse_mkdir_in",
    8,
    |r| {
        Some(MkdirIn {
            mode: r.u32()?,
            umask: r.u32()?,
        })
    },
    |s, out| {
        out.put_u32(s.mode);
        out.put_u32(s.umask);
    }
);

/// `fuse_rename_in`: RENAME.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RenameIn {
    /// The new parent directory.
    pub newdir: u64,
}

wire_struct!(
    RenameIn,
    "fuse_rename_in",
    8,
    |r| { Some(RenameIn { newdir: r.u64()? }) },
    |s, out| {
        out.put_u64(s.newdir);
    }
);

/// `fuse_rename2_in`: RENAME2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rename2In {
    /// The new parent directory.
    pub newdir: u64,
    /// `RENAME_NOREPLACE`, `RENAME_EXCHANGE`, `RENAME_WHITEOUT`.
    pub flags: u32,
}

wire_struct!(
    Rename2In,
    "fuse_rename2_in",
    16,
    |r| {
        let v = Rename2In {
            newdir: r.u64()?,
            flags: r.u32()?,
        };
        r.skip(4)?;
        Some(v)
    },
    |s, out| {
        out.put_u64(s.newdir);
        out.put_u32(s.flags);
        out.put_zeros(4);
    }
);

/// `fuse_link_in`: LINK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkIn {
    /// The node to link.
    pub oldnodeid: u64,
}

wire_struct!(
    LinkIn,
    "fuse_link_in",
    8,
    |r| {
        Some(LinkIn {
            oldnodeid: r.u64()?,
        })
    },
    |s, out| {
        out.put_u64(s.oldnodeid);
    }
);

/// `fuse_open_in`: OPEN and OPENDIR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenIn {
    /// `open(2)` flags (`O_*`).
    pub flags: u32,
    /// FUSE open flags (7.33).
    pub open_flags: OpenInFlags,
}

wire_struct!(
    OpenIn,
    "fuse_open_in",
    8,
    |r| {
        Some(OpenIn {
            flags: r.u32()?,
            open_flags: OpenInFlags(r.u32()?),
        })
    },
    |s, out| {
        out.put_u32(s.flags);
        out.put_u32(s.open_flags.0);
    }
);

/// `fuse_create_in`: CREATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CreateIn {
    /// `open(2)` flags (`O_*`).
    pub flags: u32,
    /// File type and permissions.
    pub mode: u32,
    /// The caller's umask.
    pub umask: u32,
    /// FUSE open flags (7.33).
    pub open_flags: OpenInFlags,
}

wire_struct!(
    CreateIn,
    "fuse_create_in",
    16,
    |r| {
        Some(CreateIn {
            flags: r.u32()?,
            mode: r.u32()?,
            umask: r.u32()?,
            open_flags: OpenInFlags(r.u32()?),
        })
    },
    |s, out| {
        out.put_u32(s.flags);
        out.put_u32(s.mode);
        out.put_u32(s.umask);
        out.put_u32(s.open_flags.0);
    }
);

/// `fuse_read_in`: READ, READDIR and READDIRPLUS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadIn {
    /// The file handle.
    pub fh: u64,
    /// Offset (a directory offset for READDIR).
    pub offset: u64,
    /// Bytes wanted; the reply's data must not be longer.
    pub size: u32,
    /// Read flags.
    pub read_flags: ReadFlags,
    /// Lock owner ([`ReadFlags::LOCKOWNER`]).
    pub lock_owner: u64,
    /// The file's `open(2)` flags.
    pub flags: u32,
}

wire_struct!(
    ReadIn,
    "fuse_read_in",
    40,
    |r| {
        let v = ReadIn {
            fh: r.u64()?,
            offset: r.u64()?,
            size: r.u32()?,
            read_flags: ReadFlags(r.u32()?),
            lock_owner: r.u64()?,
            flags: r.u32()?,
        };
        r.skip(4)?;
        Some(v)
    },
    |s, out| {
        out.put_u64(s.fh);
        out.put_u64(s.offset);
        out.put_u32(s.size);
        out.put_u32(s.read_flags.0);
        out.put_u64(s.lock_owner);
        out.put_u32(s.flags);
        out.put_zeros(4);
    }
);

/// `fuse_write_in`: the fixed part of WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteIn {
    /// The file handle.
    pub fh: u64,
    /// Offset.
    pub offset: u64,
    /// Bytes of data that follow.
    pub size: u32,
    /// Write flags.
    pub write_flags: WriteFlags,
    /// Lock owner ([`WriteFlags::LOCKOWNER`]).
    pub lock_owner: u64,
    /// The file's `open(2)` flags.
    pub flags: u32,
}

wire_struct!(
    WriteIn,
    "fuse_write_in",
    40,
    |r| {
        let v = WriteIn {
            fh: r.u64()?,
            offset: r.u64()?,
            size: r.u32()?,
            write_flags: WriteFlags(r.u32()?),
            lock_owner: r.u64()?,
            flags: r.u32()?,
        };
        r.skip(4)?;
        Some(v)
    },
    |s, out| {
        out.put_u64(s.fh);
        out.put_u64(s.offset);
        out.put_u32(s.size);
        out.put_u32(s.write_flags.0);
        out.put_u64(s.lock_owner);
        out.put_u32(s.flags);
        out.put_zeros(4);
    }
);

/// `fuse_release_in`: RELEASE and RELEASEDIR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReleaseIn {
    /// The file handle.
    pub fh: u64,
    /// The file's `open(2)` flags.
    pub flags: u32,
    /// Release flags.
    pub release_flags: ReleaseFlags,
    /// Lock owner.
    pub lock_owner: u64,
}

wire_struct!(
    ReleaseIn,
    "fuse_release_in",
    24,
    |r| {
        Some(ReleaseIn {
            fh: r.u64()?,
            flags: r.u32()?,
            release_flags: ReleaseFlags(r.u32()?),
            lock_owner: r.u64()?,
        })
    },
    |s, out| {
        out.put_u64(s.fh);
        out.put_u32(s.flags);
        out.put_u32(s.release_flags.0);
        out.put_u64(s.lock_owner);
    }
);

/// `fuse_flush_in`: FLUSH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlushIn {
    /// The file handle.
    pub fh: u64,
    /// Lock owner.
    pub lock_owner: u64,
}

wire_struct!(
    FlushIn,
    "fuse_flush_in",
    24,
    |r| {
        let fh = r.u64()?;
        r.skip(8)?; // unused, padding
        Some(FlushIn {
            fh,
            lock_owner: r.u64()?,
        })
    },
    |s, out| {
        out.put_u64(s.fh);
        out.put_zeros(8);
        out.put_u64(s.lock_owner);
    }
);

/// `fuse_fsync_in`: FSYNC and FSYNCDIR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FsyncIn {
    /// The file handle.
    pub fh: u64,
    /// Fsync flags.
    pub fsync_flags: FsyncFlags,
}

wire_struct!(
    FsyncIn,
    "fuse_fsync_in",
    16,
    |r| {
        let v = FsyncIn {
            fh: r.u64()?,
            fsync_flags: FsyncFlags(r.u32()?),
        };
        r.skip(4)?;
        Some(v)
    },
    |s, out| {
        out.put_u64(s.fh);
        out.put_u32(s.fsync_flags.0);
        out.put_zeros(4);
    }
);

/// `fuse_interrupt_in`: INTERRUPT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InterruptIn {
    /// The `unique` of the request to interrupt.
    pub unique: u64,
}

wire_struct!(
    InterruptIn,
    "fuse_interrupt_in",
    8,
    |r| { Some(InterruptIn { unique: r.u64()? }) },
    |s, out| {
        out.put_u64(s.unique);
    }
);

/// `fuse_out_header`: the start of every reply and notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutHeader {
    /// The whole message's length, header included.
    pub len: u32,
    /// 0, a negative errno, or for a notification (`unique` 0) the notification code.
    pub error: i32,
    /// The request answered, exactly as received; 0 for a notification.
    pub unique: u64,
}

wire_struct!(
    OutHeader,
    "fuse_out_header",
    16,
    |r| {
        Some(OutHeader {
            len: r.u32()?,
            error: r.i32()?,
            unique: r.u64()?,
        })
    },
    |s, out| {
        out.put_u32(s.len);
        out.put_i32(s.error);
        out.put_u64(s.unique);
    }
);

/// `fuse_attr`: a node's attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attr {
    /// Inode number (what `stat` reports).
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Allocated 512-byte blocks.
    pub blocks: u64,
    /// Access time, seconds.
    pub atime: u64,
    /// Modification time, seconds.
    pub mtime: u64,
    /// Change time, seconds.
    pub ctime: u64,
    /// Access time, nanoseconds.
    pub atimensec: u32,
    /// Modification time, nanoseconds.
    pub mtimensec: u32,
    /// Change time, nanoseconds.
    pub ctimensec: u32,
    /// File type and permissions.
    pub mode: u32,
    /// Hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number.
    pub rdev: u32,
    /// Preferred I/O size.
    pub blksize: u32,
    /// Attribute flags (7.32).
    pub flags: AttrFlags,
}

impl Attr {
    fn read(r: &mut Reader<'_>) -> Option<Attr> {
        Some(Attr {
            ino: r.u64()?,
            size: r.u64()?,
            blocks: r.u64()?,
            atime: r.u64()?,
            mtime: r.u64()?,
            ctime: r.u64()?,
            atimensec: r.u32()?,
            mtimensec: r.u32()?,
            ctimensec: r.u32()?,
            mode: r.u32()?,
            nlink: r.u32()?,
            uid: r.u32()?,
            gid: r.u32()?,
            rdev: r.u32()?,
            blksize: r.u32()?,
            flags: AttrFlags(r.u32()?),
        })
    }
}

wire_struct!(Attr, "fuse_attr", 88, |r| { Attr::read(r) }, |s, out| {
    out.put_u64(s.ino);
    out.put_u64(s.size);
    out.put_u64(s.blocks);
    out.put_u64(s.atime);
    out.put_u64(s.mtime);
    out.put_u64(s.ctime);
    out.put_u32(s.atimensec);
    out.put_u32(s.mtimensec);
    out.put_u32(s.ctimensec);
    out.put_u32(s.mode);
    out.put_u32(s.nlink);
    out.put_u32(s.uid);
    out.put_u32(s.gid);
    out.put_u32(s.rdev);
    out.put_u32(s.blksize);
    out.put_u32(s.flags.0);
});

/// `fuse_entry_out`: the reply to LOOKUP, MKNOD, MKDIR, SYMLINK and LINK, the first part of
/// CREATE's, and the head of each READDIRPLUS entry. Each such reply (except for node ID 0,
/// a negative entry) adds one lookup the kernel later drops with FORGET.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EntryOut {
    /// The node ID; 0 is a negative entry cached for `entry_valid`.
    pub nodeid: u64,
    /// Generation: `(nodeid, generation)` must be unique for the filesystem's lifetime.
    pub generation: u64,
    /// How long the name may be cached, seconds.
    pub entry_valid: u64,
    /// How long the attributes may be cached, seconds.
    pub attr_valid: u64,
    /// Name cache time, nanoseconds.
    pub entry_valid_nsec: u32,
    /// Attribute cache time, nanoseconds.
    pub attr_valid_nsec: u32,
    /// The attributes.
    pub attr: Attr,
}

impl EntryOut {
    fn read(r: &mut Reader<'_>) -> Option<EntryOut> {
        Some(EntryOut {
            nodeid: r.u64()?,
            generation: r.u64()?,
            entry_valid: r.u64()?,
            attr_valid: r.u64()?,
            entry_valid_nsec: r.u32()?,
            attr_valid_nsec: r.u32()?,
            attr: Attr::read(r)?,
        })
    }
}

wire_struct!(
    EntryOut,
    "fuse_entry_out",
    128,
    |r| { EntryOut::read(r) },
    |s, out| {
        out.put_u64(s.nodeid);
        out.put_u64(s.generation);
        out.put_u64(s.entry_valid);
        out.put_u64(s.attr_valid);
        out.put_u32(s.entry_valid_nsec);
        out.put_u32(s.attr_valid_nsec);
        s.attr.write_to(out);
    }
);

/// `fuse_attr_out`: the reply to GETATTR and SETATTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AttrOut {
    /// How long the attributes may be cached, seconds.
    pub attr_valid: u64,
    /// Attribute cache time, nanoseconds.
    pub attr_valid_nsec: u32,
    /// The attributes.
    pub attr: Attr,
}

wire_struct!(
    AttrOut,
    "fuse_attr_out",
    104,
    |r| {
        let attr_valid = r.u64()?;
        let attr_valid_nsec = r.u32()?;
        r.skip(4)?;
        Some(AttrOut {
            attr_valid,
            attr_valid_nsec,
            attr: Attr::read(r)?,
        })
    },
    |s, out| {
        out.put_u64(s.attr_valid);
        out.put_u32(s.attr_valid_nsec);
        out.put_zeros(4);
        s.attr.write_to(out);
    }
);

/// `fuse_open_out`: the reply to OPEN and OPENDIR, the second part of CREATE's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenOut {
    /// The file handle later requests carry.
    pub fh: u64,
    /// How the kernel treats the open file.
    pub open_flags: FopenFlags,
    /// The backing file of [`FopenFlags::PASSTHROUGH`] (7.40; was padding).
    pub backing_id: i32,
}

wire_struct!(
    OpenOut,
    "fuse_open_out",
    16,
    |r| {
        Some(OpenOut {
            fh: r.u64()?,
            open_flags: FopenFlags(r.u32()?),
            backing_id: r.i32()?,
        })
    },
    |s, out| {
        out.put_u64(s.fh);
        out.put_u32(s.open_flags.0);
        out.put_i32(s.backing_id);
    }
);

/// `fuse_write_out`: the reply to WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteOut {
    /// Bytes written.
    pub size: u32,
}

wire_struct!(
    WriteOut,
    "fuse_write_out",
    8,
    |r| {
        let size = r.u32()?;
        r.skip(4)?;
        Some(WriteOut { size })
    },
    |s, out| {
        out.put_u32(s.size);
        out.put_zeros(4);
    }
);

/// `fuse_kstatfs`, the body of `fuse_statfs_out`: the reply to STATFS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatfsOut {
    /// Total blocks of `frsize`.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Free blocks for unprivileged users.
    pub bavail: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Block size.
    pub bsize: u32,
    /// Longest name.
    pub namelen: u32,
    /// Fragment size.
    pub frsize: u32,
}

wire_struct!(
    StatfsOut,
    "fuse_statfs_out",
    80,
    |r| {
        let v = StatfsOut {
            blocks: r.u64()?,
            bfree: r.u64()?,
            bavail: r.u64()?,
            files: r.u64()?,
            ffree: r.u64()?,
            bsize: r.u32()?,
            namelen: r.u32()?,
            frsize: r.u32()?,
        };
        r.skip(4 + 6 * 4)?; // padding, spare[6]
        Some(v)
    },
    |s, out| {
        out.put_u64(s.blocks);
        out.put_u64(s.bfree);
        out.put_u64(s.bavail);
        out.put_u64(s.files);
        out.put_u64(s.ffree);
        out.put_u32(s.bsize);
        out.put_u32(s.namelen);
        out.put_u32(s.frsize);
        out.put_zeros(4 + 6 * 4);
    }
);

/// `fuse_notify_inval_inode_out`: the body of an INVAL_INODE notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NotifyInvalInodeOut {
    /// The node.
    pub ino: u64,
    /// Start of the cached data to drop; negative: attributes only.
    pub off: i64,
    /// Bytes of cached data to drop; 0 or less: to the end.
    pub len: i64,
}

wire_struct!(
    NotifyInvalInodeOut,
    "fuse_notify_inval_inode_out",
    24,
    |r| {
        Some(NotifyInvalInodeOut {
            ino: r.u64()?,
            off: r.i64()?,
            len: r.i64()?,
        })
    },
    |s, out| {
        out.put_u64(s.ino);
        out.put_i64(s.off);
        out.put_i64(s.len);
    }
);

/// `fuse_notify_inval_entry_out`: the fixed part of an INVAL_ENTRY notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NotifyInvalEntryOut {
    /// The parent directory.
    pub parent: u64,
    /// Length of the name that follows (without its NUL).
    pub namelen: u32,
    /// Invalidation flags (7.38).
    pub flags: InvalEntryFlags,
}

wire_struct!(
    NotifyInvalEntryOut,
    "fuse_notify_inval_entry_out",
    16,
    |r| {
        Some(NotifyInvalEntryOut {
            parent: r.u64()?,
            namelen: r.u32()?,
            flags: InvalEntryFlags(r.u32()?),
        })
    },
    |s, out| {
        out.put_u64(s.parent);
        out.put_u32(s.namelen);
        out.put_u32(s.flags.0);
    }
);

/// `fuse_dirent`'s fixed part: 24 bytes before the name.
pub(crate) const DIRENT_NAME_OFFSET: usize = 24;

/// `fuse_direntplus`'s fixed part: a `fuse_entry_out` and a `fuse_dirent` before the name.
pub(crate) const DIRENTPLUS_NAME_OFFSET: usize = 128 + DIRENT_NAME_OFFSET;
