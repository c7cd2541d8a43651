//! Notifications: messages the filesystem writes unasked, with `unique` 0 and the
//! notification code in the header's `error` field.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use crate::abi::{InvalEntryFlags, NotifyCode};
use crate::codec::patch_u32;
use crate::error::Error;
use crate::structs::{NotifyInvalEntryOut, NotifyInvalInodeOut, OutHeader, WireStruct};

fn begin(out: &mut Vec<u8>, code: NotifyCode) -> usize {
    let start = out.len();
    OutHeader {
        len: 0,
        error: code.0,
        unique: 0,
    }
    .write_to(out);
    start
}

fn finish(out: &mut Vec<u8>, start: usize) -> Result<(), Error> {
    let len = out.len() - start;
    match u32::try_from(len) {
        Ok(len32) => {
            patch_u32(out, start, len32);
            Ok(())
        }
        Err(_) => {
            out.truncate(start);
            Err(Error::TooLong { len })
        }
    }
}

/// `FUSE_NOTIFY_RESEND` (7.40, Linux 6.9): the kernel moves every request read from any
/// device of the connection but not yet answered back to the pending queue, and sends each
/// again with [`Unique::RESEND_BIT`](crate::Unique::RESEND_BIT) set. No body.
///
/// Send it before a successor starts reading: it also requeues requests a live reader is
/// still working on. Kernels without [`InitFlags::HAS_RESEND`](crate::InitFlags::HAS_RESEND)
/// reject the write with `EINVAL`.
pub fn resend(out: &mut Vec<u8>) {
    let start = begin(out, NotifyCode::RESEND);
    // A 16-byte message always fits.
    let _ = finish(out, start);
}

/// `FUSE_NOTIFY_INVAL_INODE`: drop the cached attributes of `ino` and, unless `off` is
/// negative, its cached data from `off` for `len` bytes (`len` 0 or less: to the end).
pub fn inval_inode(out: &mut Vec<u8>, ino: u64, off: i64, len: i64) {
    let start = begin(out, NotifyCode::INVAL_INODE);
    NotifyInvalInodeOut { ino, off, len }.write_to(out);
    let _ = finish(out, start);
}

/// `FUSE_NOTIFY_INVAL_ENTRY`: drop (or with [`InvalEntryFlags::EXPIRE_ONLY`], expire) the
/// cached entry `name` in directory `parent`. The name is sent with its NUL, as the kernel
/// requires. On error `out` is left as it was.
pub fn inval_entry(
    out: &mut Vec<u8>,
    parent: u64,
    name: &OsStr,
    flags: InvalEntryFlags,
) -> Result<(), Error> {
    let name = name.as_bytes();
    if name.contains(&0) {
        return Err(Error::NameHasNul { what: "name" });
    }
    let namelen = u32::try_from(name.len()).map_err(|_| Error::TooLong { len: name.len() })?;
    let start = begin(out, NotifyCode::INVAL_ENTRY);
    NotifyInvalEntryOut {
        parent,
        namelen,
        flags,
    }
    .write_to(out);
    out.extend_from_slice(name);
    out.push(0);
    finish(out, start)
}
