//! The Linux FUSE wire format, protocol 7.45: decoding the requests the kernel writes to
//! `/dev/fuse` and encoding the replies and notifications a filesystem writes back. Bytes
//! in, bytes out.
//!
//! It is the bottom brick of a FUSE session loop of the project's own, one that can hand a
//! live, already initialized connection to a successor, pause reading, and ask the kernel to
//! resend what a crashed owner had read. So besides the operations the project's filesystem
//! serves, it covers what such a loop needs:
//!
//! - [`Request::decode`] takes one read buffer (the kernel delivers one request per read)
//!   and borrows names and data from it. Malformed input is an [`Error`] naming the opcode and
//!   what was wrong, never a panic. Opcodes outside the list below are
//!   [`Operation::Unknown`], to be answered with [`Errno::ENOSYS`].
//! - [`Unique`] exposes the interrupt bit (0) and the resend bit (63) of a request ID.
//! - [`reply`] encodes replies; [`DirBuffer`] and [`DirPlusBuffer`] pack READDIR and
//!   READDIRPLUS bodies into the size the kernel asked for and say which entries fitted;
//!   [`notify`] encodes `NOTIFY_RESEND`, `INVAL_INODE` and `INVAL_ENTRY`.
//! - [`InitRecord`] keeps the INIT request and reply bytes, so a successor can reload exactly
//!   what the connection negotiated (the kernel never sends a second INIT); [`read_buffer_size`]
//!   gives the read buffer that connection needs.
//! - The ABI's numbers: [`Opcode`], [`InitFlags`] (`flags` and `flags2` as one 64-bit set),
//!   [`FopenFlags`], [`SetattrValid`], [`WriteFlags`], [`ReleaseFlags`], [`NotifyCode`], and
//!   every struct with its kernel size ([`WireStruct::SIZE`]).
//!
//! Decoded operations: INIT, DESTROY, LOOKUP, FORGET, BATCH_FORGET, GETATTR, SETATTR, READLINK,
//! SYMLINK, MKNOD, MKDIR, UNLINK, RMDIR, RENAME, RENAME2, LINK, OPEN, OPENDIR, CREATE, READ,
//! READDIR, READDIRPLUS, WRITE, STATFS, RELEASE, RELEASEDIR, FLUSH, FSYNC, FSYNCDIR and
//! INTERRUPT.
//!
//! What it does not do: open, read or write `/dev/fuse`, mount, keep a session, decide which
//! INIT flags to accept, or track lookups. It has no I/O and no `unsafe`. Integers are in the
//! host's byte order, as the kernel writes them (the project targets little-endian x86_64 and
//! aarch64 Linux).
//!
//! Request layouts are those of a negotiated minor of at least
//! [`OLDEST_SUPPORTED_MINOR`] (7.12); they have not changed since.
//!
//! ```
//! use std::ffi::OsStr;
//! use fuse_wire::{Attr, EntryOut, InHeader, Operation, Request, Unique, reply};
//!
//! // A LOOKUP of "hello" in the root directory, as the kernel would send it.
//! let mut read_buffer = Vec::new();
//! Request {
//!     header: InHeader { unique: Unique(42), nodeid: fuse_wire::ROOT_ID, ..InHeader::default() },
//!     op: Operation::Lookup { name: OsStr::new("hello") },
//!     extensions: &[],
//! }
//! .encode(&mut read_buffer)?;
//!
//! let request = Request::decode(&read_buffer)?;
//! let Operation::Lookup { name } = request.op else { panic!("not a LOOKUP") };
//! assert_eq!(name, "hello");
//! assert_eq!(request.header.nodeid, fuse_wire::ROOT_ID);
//!
//! let entry = EntryOut {
//!     nodeid: 2,
//!     generation: 1,
//!     entry_valid: 1,
//!     attr_valid: 1,
//!     attr: Attr { ino: 2, mode: 0o100_644, nlink: 1, ..Attr::default() },
//!     ..EntryOut::default()
//! };
//! let mut out = Vec::new();
//! reply::entry(&mut out, request.header.unique, &entry);
//! assert_eq!(out.len(), 16 + 128); // fuse_out_header + fuse_entry_out
//! let (header, body) = reply::decode(&out)?;
//! assert_eq!((header.error, header.unique), (0, 42));
//! assert_eq!(body.len(), 128);
//! # Ok::<(), fuse_wire::Error>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod codec;
#[macro_use]
mod structs;
mod abi;
mod dirent;
mod error;
mod init;
pub mod notify;
pub mod reply;
mod request;

pub use abi::{
    AttrFlags, COMPAT_22_INIT_OUT_SIZE, COMPAT_ATTR_OUT_SIZE, COMPAT_ENTRY_OUT_SIZE,
    COMPAT_INIT_OUT_SIZE, COMPAT_MKNOD_IN_SIZE, COMPAT_STATFS_SIZE, COMPAT_WRITE_IN_SIZE,
    FopenFlags, FsyncFlags, GetattrFlags, IN_HEADER_SIZE, InitFlags, InvalEntryFlags,
    KERNEL_MINOR_VERSION, KERNEL_VERSION, MIN_READ_BUFFER, NAME_MAX, NotifyCode,
    OLDEST_SUPPORTED_MINOR, OUT_HEADER_SIZE, Opcode, OpenInFlags, ROOT_ID, ReadFlags, ReleaseFlags,
    SetattrValid, WriteFlags, dirent_type, read_buffer_size,
};
pub use dirent::{DirBuffer, DirEntry, DirPlusBuffer, dirent_size, direntplus_size};
pub use error::Error;
pub use init::{InitIn, InitInLayout, InitOut, InitRecord};
pub use reply::Errno;
pub use request::{ForgetList, Operation, Request, Unique};
pub use structs::{
    Attr, AttrOut, CreateIn, EntryOut, FlushIn, ForgetIn, ForgetOne, FsyncIn, GetattrIn, InHeader,
    InterruptIn, LinkIn, MkdirIn, MknodIn, NotifyInvalEntryOut, NotifyInvalInodeOut, OpenIn,
    OpenOut, OutHeader, ReadIn, ReleaseIn, Rename2In, RenameIn, SetattrIn, StatfsOut, WireStruct,
    WriteIn, WriteOut,
};

mod check;
pub use check::roundtrip_check;

#[cfg(test)]
mod tests;
