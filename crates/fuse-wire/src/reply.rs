//! Replies: a `fuse_out_header` and a body, appended to a caller's buffer. Write each reply
//! to `/dev/fuse` in one `write`.
//!
//! Every function appends to `out` (clear it first to reuse a buffer) and takes the request's
//! [`Unique`] exactly as received, flag bits included.

use std::fmt;

use crate::abi::OUT_HEADER_SIZE;
use crate::codec::patch_u32;
use crate::error::Error;
use crate::init::InitOut;
use crate::request::Unique;
use crate::structs::{AttrOut, EntryOut, OpenOut, OutHeader, StatfsOut, WireStruct, WriteOut};

/// An error number the kernel accepts in a reply: 1 to 511 (it rejects a reply whose
/// `error` is not in `-511..=0` with `EINVAL`, leaving the request unanswered).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(i32);

impl Errno {
    /// `EPERM`.
    pub const EPERM: Errno = Errno(1);
    /// `ENOENT`.
    pub const ENOENT: Errno = Errno(2);
    /// `EINTR`.
    pub const EINTR: Errno = Errno(4);
    /// `EIO`.
    pub const EIO: Errno = Errno(5);
    /// `EBADF`.
    pub const EBADF: Errno = Errno(9);
    /// `EAGAIN`: the only answer to an INTERRUPT (the request is not yet being processed).
    pub const EAGAIN: Errno = Errno(11);
    /// `EACCES`.
    pub const EACCES: Errno = Errno(13);
    /// `EEXIST`.
    pub const EEXIST: Errno = Errno(17);
    /// `ENOTDIR`.
    pub const ENOTDIR: Errno = Errno(20);
    /// `EISDIR`.
    pub const EISDIR: Errno = Errno(21);
    /// `EINVAL`.
    pub const EINVAL: Errno = Errno(22);
    /// `ENOSPC`.
    pub const ENOSPC: Errno = Errno(28);
    /// `EROFS`.
    pub const EROFS: Errno = Errno(30);
    /// `ERANGE`.
    pub const ERANGE: Errno = Errno(34);
    /// `ENAMETOOLONG`.
    pub const ENAMETOOLONG: Errno = Errno(36);
    /// `ENOSYS`: the answer to an opcode the filesystem does not implement.
    pub const ENOSYS: Errno = Errno(38);
    /// `ENOTEMPTY`.
    pub const ENOTEMPTY: Errno = Errno(39);
    /// `EPROTO`: an INIT whose major version cannot be served.
    pub const EPROTO: Errno = Errno(71);
    /// `EOPNOTSUPP`.
    pub const EOPNOTSUPP: Errno = Errno(95);
    /// `ESTALE`.
    pub const ESTALE: Errno = Errno(116);

    /// The error number, or `None` outside 1 to 511.
    pub const fn new(code: i32) -> Option<Errno> {
        if code > 0 && code < 512 {
            Some(Errno(code))
        } else {
            None
        }
    }

    /// The error number, or `EIO` for a number the kernel would reject.
    pub const fn new_or_eio(code: i32) -> Errno {
        match Errno::new(code) {
            Some(errno) => errno,
            None => Errno::EIO,
        }
    }

    /// The positive error number.
    pub const fn code(self) -> i32 {
        self.0
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Errno({})", self.0)
    }
}

/// The header of a successful reply with `body_len` bytes of body, for a caller that writes
/// the header and a large body with `writev` instead of copying the body.
pub fn header(unique: Unique, body_len: usize) -> Result<[u8; OUT_HEADER_SIZE], Error> {
    let len = OUT_HEADER_SIZE.saturating_add(body_len);
    let len32 = u32::try_from(len).map_err(|_| Error::TooLong { len })?;
    let mut bytes = [0u8; OUT_HEADER_SIZE];
    let encoded = OutHeader {
        len: len32,
        error: 0,
        unique: unique.raw(),
    }
    .to_vec();
    bytes.copy_from_slice(&encoded);
    Ok(bytes)
}

/// Appends a header whose length [`finish`] fixes, with room for `body_size` more bytes
/// (grown field by field, a reply would be reallocated several times); returns where the
/// message starts.
fn begin(out: &mut Vec<u8>, unique: u64, error: i32, body_size: usize) -> usize {
    out.reserve(OUT_HEADER_SIZE + body_size);
    let start = out.len();
    OutHeader {
        len: 0,
        error,
        unique,
    }
    .write_to(out);
    start
}

/// Sets the length of the message that starts at `start`: fixed-size bodies only, never
/// near `u32::MAX`.
fn finish(out: &mut [u8], start: usize) {
    let len = u32::try_from(out.len() - start).unwrap_or(u32::MAX);
    patch_u32(out, start, len);
}

/// A header followed by one fixed-size struct.
fn one<T: WireStruct>(out: &mut Vec<u8>, unique: Unique, body: &T) {
    let start = begin(out, unique.raw(), 0, T::SIZE);
    body.write_to(out);
    finish(out, start);
}

/// An error reply: the header alone, with `error` = `-errno`.
pub fn error(out: &mut Vec<u8>, unique: Unique, errno: Errno) {
    let start = begin(out, unique.raw(), -errno.code(), 0);
    finish(out, start);
}

/// A successful reply without a body (UNLINK, RMDIR, RENAME, RELEASE, FLUSH, FSYNC, …).
pub fn empty(out: &mut Vec<u8>, unique: Unique) {
    let start = begin(out, unique.raw(), 0, 0);
    finish(out, start);
}

/// The reply to LOOKUP, MKNOD, MKDIR, SYMLINK and LINK.
pub fn entry(out: &mut Vec<u8>, unique: Unique, body: &EntryOut) {
    one(out, unique, body);
}

/// The reply to GETATTR and SETATTR.
pub fn attr(out: &mut Vec<u8>, unique: Unique, body: &AttrOut) {
    one(out, unique, body);
}

/// The reply to OPEN and OPENDIR.
pub fn open(out: &mut Vec<u8>, unique: Unique, body: &OpenOut) {
    one(out, unique, body);
}

/// The reply to CREATE: the new entry, then the open file.
pub fn create(out: &mut Vec<u8>, unique: Unique, entry: &EntryOut, open: &OpenOut) {
    let start = begin(out, unique.raw(), 0, EntryOut::SIZE + OpenOut::SIZE);
    entry.write_to(out);
    open.write_to(out);
    finish(out, start);
}

/// The reply to WRITE.
pub fn write(out: &mut Vec<u8>, unique: Unique, body: &WriteOut) {
    one(out, unique, body);
}

/// The reply to STATFS.
pub fn statfs(out: &mut Vec<u8>, unique: Unique, body: &StatfsOut) {
    one(out, unique, body);
}

/// The reply to INIT, cut to the `fuse_init_out` a kernel of minor `kernel_minor` reads
/// ([`InitOut::size_for_minor`]): the kernel fails an INIT whose reply is longer.
pub fn init(out: &mut Vec<u8>, unique: Unique, body: &InitOut, kernel_minor: u32) {
    let start = begin(out, unique.raw(), 0, InitOut::SIZE);
    body.write_to(out);
    out.truncate(start + OUT_HEADER_SIZE + InitOut::size_for_minor(kernel_minor));
    finish(out, start);
}

/// A reply whose body is bytes: READLINK (the target, no NUL), READ (at most the size asked
/// for), READDIR and READDIRPLUS (a [`DirBuffer`](crate::DirBuffer)'s or
/// [`DirPlusBuffer`](crate::DirPlusBuffer)'s bytes). On error `out` is left as it was.
pub fn data(out: &mut Vec<u8>, unique: Unique, data: &[u8]) -> Result<(), Error> {
    let header = header(unique, data.len())?;
    out.reserve(header.len() + data.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(data);
    Ok(())
}

/// Splits a reply or notification into its header and body, checking the header's `len`.
/// For tests and fakes that play the kernel's side.
pub fn decode(bytes: &[u8]) -> Result<(OutHeader, &[u8]), Error> {
    let header = OutHeader::read_from(bytes).ok_or(Error::TruncatedReply { len: bytes.len() })?;
    if header.len as usize != bytes.len() {
        return Err(Error::ReplyLengthMismatch {
            header_len: header.len,
            buffer_len: bytes.len(),
        });
    }
    Ok((header, bytes.get(OUT_HEADER_SIZE..).unwrap_or_default()))
}
