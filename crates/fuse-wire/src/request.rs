//! Requests: decoding one read buffer, and encoding (for tests, fakes and fuzzers).

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;

use crate::abi::{IN_HEADER_SIZE, Opcode};
use crate::codec::{Reader, patch_u16, patch_u32};
use crate::error::Error;
use crate::init::InitIn;
use crate::structs::{
    BatchForgetIn, CreateIn, FlushIn, ForgetIn, ForgetOne, FsyncIn, GetattrIn, InHeader,
    InterruptIn, LinkIn, MkdirIn, MknodIn, OpenIn, ReadIn, ReleaseIn, Rename2In, RenameIn,
    SetattrIn, WireStruct, WriteIn,
};

/// A request's `unique`: its ID and two flag bits.
///
/// Ordinary IDs are even. The kernel sets bit 0 on INTERRUPT requests (`FUSE_INT_REQ_BIT`)
/// and bit 63 on requests it sends again after `FUSE_NOTIFY_RESEND` (`FUSE_UNIQUE_RESEND`,
/// 7.40). A reply must carry the raw value exactly as received: the kernel finds the waiting
/// request by comparing the whole `unique`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Unique(pub u64);

impl Unique {
    /// `FUSE_INT_REQ_BIT`: the request is an INTERRUPT.
    pub const INTERRUPT_BIT: u64 = 1 << 0;
    /// `FUSE_UNIQUE_RESEND`: the request was read before and is sent again.
    pub const RESEND_BIT: u64 = 1 << 63;

    /// The raw value, to put in the reply.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// The ID with both flag bits cleared: equal for a request and its resend.
    pub const fn id(self) -> u64 {
        self.0 & !(Self::INTERRUPT_BIT | Self::RESEND_BIT)
    }

    /// Whether bit 0 is set.
    pub const fn is_interrupt(self) -> bool {
        self.0 & Self::INTERRUPT_BIT != 0
    }

    /// Whether bit 63 is set.
    pub const fn is_resend(self) -> bool {
        self.0 & Self::RESEND_BIT != 0
    }
}

impl fmt::Debug for Unique {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Unique({}", self.id())?;
        if self.is_interrupt() {
            f.write_str(", interrupt")?;
        }
        if self.is_resend() {
            f.write_str(", resend")?;
        }
        f.write_str(")")
    }
}

/// The entries of a BATCH_FORGET, borrowed from the request.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ForgetList<'a> {
    bytes: &'a [u8],
}

impl<'a> ForgetList<'a> {
    /// A list over encoded `fuse_forget_one` entries, or `None` when `bytes` is not a whole
    /// number of them.
    pub fn from_bytes(bytes: &'a [u8]) -> Option<Self> {
        bytes
            .len()
            .is_multiple_of(ForgetOne::SIZE)
            .then_some(ForgetList { bytes })
    }

    /// The encoded entries.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// How many entries.
    pub fn len(&self) -> usize {
        self.bytes.len() / ForgetOne::SIZE
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The entries in order.
    pub fn iter(&self) -> impl Iterator<Item = ForgetOne> + 'a {
        self.bytes
            .chunks_exact(ForgetOne::SIZE)
            .filter_map(ForgetOne::read_from)
    }
}

impl fmt::Debug for ForgetList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// A request's operation and its arguments, borrowed from the read buffer.
///
/// Names are the kernel's bytes without their terminating NUL. Every opcode outside the
/// operations this crate decodes is [`Unknown`](Operation::Unknown), to be answered `ENOSYS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation<'a> {
    /// INIT: the first request of a connection.
    Init(InitIn<'a>),
    /// DESTROY: the connection is being torn down.
    Destroy,
    /// LOOKUP `name` in the directory `nodeid`.
    Lookup {
        /// The name.
        name: &'a OsStr,
    },
    /// FORGET: drop lookups of `nodeid`. No reply.
    Forget(ForgetIn),
    /// BATCH_FORGET: drop lookups of many nodes. No reply.
    BatchForget(ForgetList<'a>),
    /// GETATTR of `nodeid`.
    Getattr(GetattrIn),
    /// SETATTR of `nodeid`.
    Setattr(SetattrIn),
    /// READLINK of `nodeid`.
    Readlink,
    /// SYMLINK: create `name` in `nodeid` pointing at `target`.
    Symlink {
        /// The new link's name.
        name: &'a OsStr,
        /// What it points at.
        target: &'a OsStr,
    },
    /// MKNOD `name` in `nodeid`.
    Mknod {
        /// Mode, device and umask.
        arg: MknodIn,
        /// The name.
        name: &'a OsStr,
    },
    /// MKDIR `name` in `nodeid`.
    Mkdir {
        /// Mode and umask.
        arg: MkdirIn,
        /// The name.
        name: &'a OsStr,
    },
    /// UNLINK `name` from `nodeid`.
    Unlink {
        /// The name.
        name: &'a OsStr,
    },
    /// RMDIR `name` from `nodeid`.
    Rmdir {
        /// The name.
        name: &'a OsStr,
    },
    /// RENAME `name` in `nodeid` to `new_name` in `arg.newdir`.
    Rename {
        /// The new parent.
        arg: RenameIn,
        /// The old name.
        name: &'a OsStr,
        /// The new name.
        new_name: &'a OsStr,
    },
    /// RENAME2: RENAME with flags.
    Rename2 {
        /// The new parent and flags.
        arg: Rename2In,
        /// The old name.
        name: &'a OsStr,
        /// The new name.
        new_name: &'a OsStr,
    },
    /// LINK `arg.oldnodeid` as `name` in `nodeid`.
    Link {
        /// The node to link.
        arg: LinkIn,
        /// The new name.
        name: &'a OsStr,
    },
    /// OPEN `nodeid`.
    Open(OpenIn),
    /// OPENDIR `nodeid`.
    Opendir(OpenIn),
    /// CREATE and open `name` in `nodeid`.
    Create {
        /// Flags, mode and umask.
        arg: CreateIn,
        /// The name.
        name: &'a OsStr,
    },
    /// READ from an open file.
    Read(ReadIn),
    /// READDIR from an open directory.
    Readdir(ReadIn),
    /// READDIRPLUS from an open directory.
    Readdirplus(ReadIn),
    /// WRITE to an open file.
    Write {
        /// Handle, offset, size and flags.
        arg: WriteIn,
        /// The data: exactly `arg.size` bytes.
        data: &'a [u8],
    },
    /// STATFS of the filesystem holding `nodeid`.
    Statfs,
    /// RELEASE an open file.
    Release(ReleaseIn),
    /// RELEASEDIR an open directory.
    Releasedir(ReleaseIn),
    /// FLUSH: a descriptor of an open file was closed.
    Flush(FlushIn),
    /// FSYNC an open file.
    Fsync(FsyncIn),
    /// FSYNCDIR an open directory.
    Fsyncdir(FsyncIn),
    /// INTERRUPT an earlier request. No reply unless `EAGAIN`.
    Interrupt(InterruptIn),
    /// Any other opcode, with its arguments undecoded.
    Unknown {
        /// The opcode.
        opcode: Opcode,
        /// The arguments (extensions excluded).
        payload: &'a [u8],
    },
}

impl Operation<'_> {
    /// The opcode the operation travels under.
    pub fn opcode(&self) -> Opcode {
        match self {
            Operation::Init(_) => Opcode::INIT,
            Operation::Destroy => Opcode::DESTROY,
            Operation::Lookup { .. } => Opcode::LOOKUP,
            Operation::Forget(_) => Opcode::FORGET,
            Operation::BatchForget(_) => Opcode::BATCH_FORGET,
            Operation::Getattr(_) => Opcode::GETATTR,
            Operation::Setattr(_) => Opcode::SETATTR,
            Operation::Readlink => Opcode::READLINK,
            Operation::Symlink { .. } => Opcode::SYMLINK,
            Operation::Mknod { .. } => Opcode::MKNOD,
            Operation::Mkdir { .. } => Opcode::MKDIR,
            Operation::Unlink { .. } => Opcode::UNLINK,
            Operation::Rmdir { .. } => Opcode::RMDIR,
            Operation::Rename { .. } => Opcode::RENAME,
            Operation::Rename2 { .. } => Opcode::RENAME2,
            Operation::Link { .. } => Opcode::LINK,
            Operation::Open(_) => Opcode::OPEN,
            Operation::Opendir(_) => Opcode::OPENDIR,
            Operation::Create { .. } => Opcode::CREATE,
            Operation::Read(_) => Opcode::READ,
            Operation::Readdir(_) => Opcode::READDIR,
            Operation::Readdirplus(_) => Opcode::READDIRPLUS,
            Operation::Write { .. } => Opcode::WRITE,
            Operation::Statfs => Opcode::STATFS,
            Operation::Release(_) => Opcode::RELEASE,
            Operation::Releasedir(_) => Opcode::RELEASEDIR,
            Operation::Flush(_) => Opcode::FLUSH,
            Operation::Fsync(_) => Opcode::FSYNC,
            Operation::Fsyncdir(_) => Opcode::FSYNCDIR,
            Operation::Interrupt(_) => Opcode::INTERRUPT,
            Operation::Unknown { opcode, .. } => *opcode,
        }
    }

    /// Whether the kernel expects no reply (FORGET, BATCH_FORGET). INTERRUPT is answered
    /// only with `EAGAIN`, and DESTROY's reply is optional: the loop decides those.
    pub fn is_forget(&self) -> bool {
        matches!(self, Operation::Forget(_) | Operation::BatchForget(_))
    }
}

/// One request: the header, the operation, and any extensions (7.38: security contexts and
/// supplementary groups on create requests, when negotiated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// The header as received.
    pub header: InHeader,
    /// The operation and its arguments.
    pub op: Operation<'a>,
    /// The extension bytes at the end of the request (`total_extlen * 8` of them), raw.
    pub extensions: &'a [u8],
}

/// The arguments after the header, consumed in order.
struct Args<'a> {
    opcode: Opcode,
    reader: Reader<'a>,
}

impl<'a> Args<'a> {
    fn fixed<T: WireStruct>(&mut self) -> Result<T, Error> {
        let have = self.reader.rest().len();
        let short = Error::ShortStruct {
            opcode: self.opcode,
            what: T::C_NAME,
            need: T::SIZE,
            have,
        };
        let bytes = self.reader.take(T::SIZE).ok_or(short.clone())?;
        T::read_from(bytes).ok_or(short)
    }

    fn name(&mut self, what: &'static str) -> Result<&'a OsStr, Error> {
        let rest = self.reader.rest();
        let missing = Error::MissingNul {
            opcode: self.opcode,
            what,
        };
        let end = rest.iter().position(|&b| b == 0).ok_or(missing.clone())?;
        let with_nul = self.reader.take(end + 1).ok_or(missing.clone())?;
        let name = with_nul.get(..end).ok_or(missing)?;
        Ok(OsStr::from_bytes(name))
    }

    fn rest(&mut self) -> &'a [u8] {
        let rest = self.reader.rest();
        self.reader = Reader::new(&[]);
        rest
    }

    /// Ends decoding: every byte must have been an argument.
    fn finish<T>(self, value: T) -> Result<T, Error> {
        match self.reader.rest().len() {
            0 => Ok(value),
            extra => Err(Error::TrailingBytes {
                opcode: self.opcode,
                extra,
            }),
        }
    }
}

impl<'a> Request<'a> {
    /// Decodes the bytes of one read of `/dev/fuse` (the kernel delivers exactly one request
    /// per read). Never panics: malformed input is an [`Error`] naming the opcode and what
    /// was wrong.
    pub fn decode(buf: &'a [u8]) -> Result<Request<'a>, Error> {
        let header = InHeader::read_from(buf).ok_or(Error::TruncatedHeader { len: buf.len() })?;
        let opcode = header.opcode;
        if header.len as usize != buf.len() {
            return Err(Error::LengthMismatch {
                opcode,
                header_len: header.len,
                buffer_len: buf.len(),
            });
        }
        let payload = buf.get(IN_HEADER_SIZE..).unwrap_or_default();
        let extlen = usize::from(header.total_extlen) * 8;
        let split = payload
            .len()
            .checked_sub(extlen)
            .ok_or(Error::ExtensionsTooLong {
                opcode,
                extlen,
                payload: payload.len(),
            })?;
        let (args, extensions) = payload.split_at_checked(split).unwrap_or((payload, &[]));
        let op = decode_operation(opcode, args)?;
        Ok(Request {
            header,
            op,
            extensions,
        })
    }

    /// Encodes the request as the kernel would send it, appending to `out`.
    ///
    /// The header's `len`, `opcode` and `total_extlen` are computed from the operation and
    /// the extensions; the header's own values for them are ignored. Struct fields such as
    /// `fuse_write_in.size` are written as they are, so a test can encode a malformed
    /// request. On error `out` is left as it was.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), Error> {
        let start = out.len();
        let result = self.encode_unchecked(out, start);
        if result.is_err() {
            out.truncate(start);
        }
        result
    }

    fn encode_unchecked(&self, out: &mut Vec<u8>, start: usize) -> Result<(), Error> {
        let ext_len = self.extensions.len();
        let total_extlen = u16::try_from(ext_len / 8)
            .ok()
            .filter(|_| ext_len.is_multiple_of(8))
            .ok_or(Error::ExtensionsLayout { len: ext_len })?;
        InHeader {
            opcode: self.op.opcode(),
            total_extlen,
            ..self.header
        }
        .write_to(out);
        encode_operation(&self.op, out)?;
        out.extend_from_slice(self.extensions);
        let len = out.len() - start;
        let len32 = u32::try_from(len).map_err(|_| Error::TooLong { len })?;
        patch_u32(out, start, len32);
        patch_u16(out, start + 36, total_extlen);
        Ok(())
    }
}

fn decode_operation(opcode: Opcode, args: &[u8]) -> Result<Operation<'_>, Error> {
    let mut a = Args {
        opcode,
        reader: Reader::new(args),
    };
    let op = match opcode {
        Opcode::INIT => Operation::Init(InitIn::decode(opcode, a.rest())?),
        Opcode::DESTROY => Operation::Destroy,
        Opcode::LOOKUP => Operation::Lookup {
            name: a.name("name")?,
        },
        Opcode::FORGET => Operation::Forget(a.fixed()?),
        Opcode::BATCH_FORGET => {
            let fixed: BatchForgetIn = a.fixed()?;
            let bytes = a.rest();
            let fits = (fixed.count as usize).checked_mul(ForgetOne::SIZE) == Some(bytes.len());
            match ForgetList::from_bytes(bytes) {
                Some(list) if fits => Operation::BatchForget(list),
                _ => {
                    return Err(Error::ForgetCountMismatch {
                        opcode,
                        count: fixed.count,
                        bytes: bytes.len(),
                    });
                }
            }
        }
        Opcode::GETATTR => Operation::Getattr(a.fixed()?),
        Opcode::SETATTR => Operation::Setattr(a.fixed()?),
        Opcode::READLINK => Operation::Readlink,
        Opcode::SYMLINK => Operation::Symlink {
            name: a.name("name")?,
            target: a.name("link target")?,
        },
        Opcode::MKNOD => Operation::Mknod {
            arg: a.fixed()?,
            name: a.name("name")?,
        },
        Opcode::MKDIR => Operation::Mkdir {
            arg: a.fixed()?,
            name: a.name("name")?,
        },
        Opcode::UNLINK => Operation::Unlink {
            name: a.name("name")?,
        },
        Opcode::RMDIR => Operation::Rmdir {
            name: a.name("name")?,
        },
        Opcode::RENAME => Operation::Rename {
            arg: a.fixed()?,
            name: a.name("old name")?,
            new_name: a.name("new name")?,
        },
        Opcode::RENAME2 => Operation::Rename2 {
            arg: a.fixed()?,
            name: a.name("old name")?,
            new_name: a.name("new name")?,
        },
        Opcode::LINK => Operation::Link {
            arg: a.fixed()?,
            name: a.name("new name")?,
        },
        Opcode::OPEN => Operation::Open(a.fixed()?),
        Opcode::OPENDIR => Operation::Opendir(a.fixed()?),
        Opcode::CREATE => Operation::Create {
            arg: a.fixed()?,
            name: a.name("name")?,
        },
        Opcode::READ => Operation::Read(a.fixed()?),
        Opcode::READDIR => Operation::Readdir(a.fixed()?),
        Opcode::READDIRPLUS => Operation::Readdirplus(a.fixed()?),
        Opcode::WRITE => {
            let arg: WriteIn = a.fixed()?;
            let data = a.rest();
            if arg.size as usize != data.len() {
                return Err(Error::WriteSizeMismatch {
                    opcode,
                    size: arg.size,
                    data: data.len(),
                });
            }
            Operation::Write { arg, data }
        }
        Opcode::STATFS => Operation::Statfs,
        Opcode::RELEASE => Operation::Release(a.fixed()?),
        Opcode::RELEASEDIR => Operation::Releasedir(a.fixed()?),
        Opcode::FLUSH => Operation::Flush(a.fixed()?),
        Opcode::FSYNC => Operation::Fsync(a.fixed()?),
        Opcode::FSYNCDIR => Operation::Fsyncdir(a.fixed()?),
        Opcode::INTERRUPT => Operation::Interrupt(a.fixed()?),
        _ => Operation::Unknown {
            opcode,
            payload: a.rest(),
        },
    };
    a.finish(op)
}

fn put_name(out: &mut Vec<u8>, name: &OsStr, what: &'static str) -> Result<(), Error> {
    let bytes = name.as_bytes();
    if bytes.contains(&0) {
        return Err(Error::NameHasNul { what });
    }
    out.extend_from_slice(bytes);
    out.push(0);
    Ok(())
}

fn encode_operation(op: &Operation<'_>, out: &mut Vec<u8>) -> Result<(), Error> {
    match op {
        Operation::Init(init) => init.encode(out),
        Operation::Destroy | Operation::Readlink | Operation::Statfs => {}
        Operation::Lookup { name } | Operation::Unlink { name } | Operation::Rmdir { name } => {
            put_name(out, name, "name")?;
        }
        Operation::Forget(arg) => arg.write_to(out),
        Operation::BatchForget(list) => {
            // The count the kernel would write; a list never holds more than fit the payload.
            let count = u32::try_from(list.len()).unwrap_or(u32::MAX);
            BatchForgetIn { count }.write_to(out);
            out.extend_from_slice(list.as_bytes());
        }
        Operation::Getattr(arg) => arg.write_to(out),
        Operation::Setattr(arg) => arg.write_to(out),
        Operation::Symlink { name, target } => {
            put_name(out, name, "name")?;
            put_name(out, target, "link target")?;
        }
        Operation::Mknod { arg, name } => {
            arg.write_to(out);
            put_name(out, name, "name")?;
        }
        Operation::Mkdir { arg, name } => {
            arg.write_to(out);
            put_name(out, name, "name")?;
        }
        Operation::Rename {
            arg,
            name,
            new_name,
        } => {
            arg.write_to(out);
            put_name(out, name, "old name")?;
            put_name(out, new_name, "new name")?;
        }
        Operation::Rename2 {
            arg,
            name,
            new_name,
        } => {
            arg.write_to(out);
            put_name(out, name, "old name")?;
            put_name(out, new_name, "new name")?;
        }
        Operation::Link { arg, name } => {
            arg.write_to(out);
            put_name(out, name, "new name")?;
        }
        Operation::Open(arg) | Operation::Opendir(arg) => arg.write_to(out),
        Operation::Create { arg, name } => {
            arg.write_to(out);
            put_name(out, name, "name")?;
        }
        Operation::Read(arg) | Operation::Readdir(arg) | Operation::Readdirplus(arg) => {
            arg.write_to(out);
        }
        Operation::Write { arg, data } => {
            arg.write_to(out);
            out.extend_from_slice(data);
        }
        Operation::Release(arg) | Operation::Releasedir(arg) => arg.write_to(out),
        Operation::Flush(arg) => arg.write_to(out),
        Operation::Fsync(arg) | Operation::Fsyncdir(arg) => arg.write_to(out),
        Operation::Interrupt(arg) => arg.write_to(out),
        Operation::Unknown { payload, .. } => out.extend_from_slice(payload),
    }
    Ok(())
}
