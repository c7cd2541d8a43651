//! Directory buffers: the bodies of READDIR and READDIRPLUS replies.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use crate::abi::NAME_MAX;
use crate::codec::{Put, align8};
use crate::error::Error;
use crate::structs::{DIRENT_NAME_OFFSET, DIRENTPLUS_NAME_OFFSET, EntryOut, WireStruct};

/// One directory entry to pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirEntry<'a> {
    /// Inode number (what `readdir` reports as `d_ino`).
    pub ino: u64,
    /// The offset of the *next* entry: the kernel sends it back as `fuse_read_in.offset` to
    /// continue after this one.
    pub off: u64,
    /// `DT_*` type; [`dirent_type`](crate::dirent_type) derives it from a mode.
    pub kind: u32,
    /// The name: 1 to [`NAME_MAX`] bytes, without `/` or NUL.
    pub name: &'a OsStr,
}

/// The bytes of one `fuse_dirent` record: 24 bytes and the name, padded to a multiple of 8
/// (`FUSE_DIRENT_SIZE`).
pub const fn dirent_size(name_len: usize) -> usize {
    align8(DIRENT_NAME_OFFSET.saturating_add(name_len))
}

/// The bytes of one `fuse_direntplus` record: a `fuse_entry_out`, 24 bytes and the name,
/// padded to a multiple of 8 (`FUSE_DIRENTPLUS_SIZE`).
pub const fn direntplus_size(name_len: usize) -> usize {
    align8(DIRENTPLUS_NAME_OFFSET.saturating_add(name_len))
}

/// Rejects the names the kernel answers with `EIO` for the whole buffer
/// (`fuse_parse_dirfile`): empty, longer than [`NAME_MAX`], or holding `/`; and NUL, which no
/// file name holds.
fn check_name(name: &[u8]) -> Result<(), Error> {
    if name.is_empty() || name.len() > NAME_MAX || name.iter().any(|&b| b == b'/' || b == 0) {
        return Err(Error::InvalidDirentName { len: name.len() });
    }
    Ok(())
}

/// The packing shared by both buffers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Packer {
    bytes: Vec<u8>,
    limit: usize,
    entries: usize,
}

impl Packer {
    fn new(limit: u32) -> Self {
        Packer {
            bytes: Vec::new(),
            limit: limit as usize,
            entries: 0,
        }
    }

    /// Appends a record of `size` bytes when it fits, padding it with zeros.
    fn push(&mut self, size: usize, write: impl FnOnce(&mut Vec<u8>)) -> bool {
        let start = self.bytes.len();
        if size > self.limit.saturating_sub(start) {
            return false;
        }
        write(&mut self.bytes);
        self.bytes.resize(start + size, 0);
        self.entries += 1;
        true
    }

    fn put_dirent(out: &mut Vec<u8>, entry: &DirEntry<'_>, name: &[u8]) {
        out.put_u64(entry.ino);
        out.put_u64(entry.off);
        // `check_name` bounds the length by NAME_MAX.
        out.put_u32(name.len() as u32);
        out.put_u32(entry.kind);
        out.extend_from_slice(name);
    }
}

/// The body of a READDIR reply: `fuse_dirent` records packed with 8-byte alignment into at
/// most the `size` the kernel asked for.
///
/// [`push`](Self::push) says whether each entry was taken, so the caller knows exactly which
/// entries the reply holds and where the next READDIR continues.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirBuffer(Packer);

impl DirBuffer {
    /// An empty buffer for a READDIR whose `fuse_read_in.size` is `limit`. Allocates only as
    /// entries are pushed.
    pub fn new(limit: u32) -> DirBuffer {
        DirBuffer(Packer::new(limit))
    }

    /// Appends the entry when it fits: `Ok(true)` when taken, `Ok(false)` when it does not
    /// fit (the buffer is unchanged; a shorter name may still fit). An invalid name is an
    /// error whether or not it would fit.
    pub fn push(&mut self, entry: &DirEntry<'_>) -> Result<bool, Error> {
        let name = entry.name.as_bytes();
        check_name(name)?;
        Ok(self.0.push(dirent_size(name.len()), |out| {
            Packer::put_dirent(out, entry, name)
        }))
    }
}

/// The accessors both directory buffers share, over their [`Packer`].
macro_rules! packed_accessors {
    ($buffer:ident) => {
        impl $buffer {
            /// The packed records.
            pub fn as_bytes(&self) -> &[u8] {
                &self.0.bytes
            }

            /// The packed records, by value.
            pub fn into_bytes(self) -> Vec<u8> {
                self.0.bytes
            }

            /// Bytes used.
            pub fn len(&self) -> usize {
                self.0.bytes.len()
            }

            /// Whether no entry was taken (an empty reply means the end of the directory).
            pub fn is_empty(&self) -> bool {
                self.0.bytes.is_empty()
            }

            /// Entries taken.
            pub fn entries(&self) -> usize {
                self.0.entries
            }

            /// The size the kernel asked for.
            pub fn limit(&self) -> usize {
                self.0.limit
            }
        }
    };
}

packed_accessors!(DirBuffer);
packed_accessors!(DirPlusBuffer);

/// The body of a READDIRPLUS reply: `fuse_direntplus` records (an entry reply and a
/// `fuse_dirent` each) packed with 8-byte alignment into at most the `size` the kernel asked
/// for.
///
/// Every entry taken with a nonzero `nodeid` counts as one lookup the kernel later FORGETs,
/// so the caller must know exactly which entries were taken: [`push`](Self::push) says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirPlusBuffer(Packer);

impl DirPlusBuffer {
    /// An empty buffer for a READDIRPLUS whose `fuse_read_in.size` is `limit`.
    pub fn new(limit: u32) -> DirPlusBuffer {
        DirPlusBuffer(Packer::new(limit))
    }

    /// Appends the entry and its entry reply when they fit: `Ok(true)` when taken,
    /// `Ok(false)` when not (the buffer is unchanged). An invalid name is an error.
    pub fn push(&mut self, entry: &DirEntry<'_>, entry_out: &EntryOut) -> Result<bool, Error> {
        let name = entry.name.as_bytes();
        check_name(name)?;
        Ok(self.0.push(direntplus_size(name.len()), |out| {
            entry_out.write_to(out);
            Packer::put_dirent(out, entry, name);
        }))
    }
}
