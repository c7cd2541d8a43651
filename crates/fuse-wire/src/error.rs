//! The crate's one error type.

use crate::abi::{IN_HEADER_SIZE, NAME_MAX, OUT_HEADER_SIZE, Opcode};

/// Why bytes could not be decoded, or values could not be encoded.
///
/// Decoding errors name the request's opcode and what was wrong; none of them is a panic or
/// an out-of-bounds read. A session loop answers a request it cannot decode with `EIO` (the
/// header, and so the `unique` to answer, is intact whenever the variant has an `opcode`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Fewer bytes than a `fuse_in_header`.
    #[error("request of {len} bytes is shorter than the {IN_HEADER_SIZE}-byte fuse_in_header")]
    TruncatedHeader {
        /// Bytes in the buffer.
        len: usize,
    },
    /// `fuse_in_header.len` disagrees with the bytes read.
    #[error("{opcode}: fuse_in_header.len is {header_len} but the buffer holds {buffer_len} bytes")]
    LengthMismatch {
        /// The request's opcode.
        opcode: Opcode,
        /// The header's `len`.
        header_len: u32,
        /// Bytes in the buffer.
        buffer_len: usize,
    },
    /// `total_extlen` claims more extension bytes than the payload holds.
    #[error("{opcode}: total_extlen of {extlen} bytes exceeds the {payload}-byte payload")]
    ExtensionsTooLong {
        /// The request's opcode.
        opcode: Opcode,
        /// `total_extlen * 8`.
        extlen: usize,
        /// Bytes after the header.
        payload: usize,
    },
    /// The payload ends inside a fixed-size argument struct.
    #[error("{opcode}: {what} needs {need} bytes but {have} remain")]
    ShortStruct {
        /// The request's opcode.
        opcode: Opcode,
        /// The kernel's name of the struct (`"fuse_read_in"`).
        what: &'static str,
        /// The struct's size.
        need: usize,
        /// Bytes left in the payload.
        have: usize,
    },
    /// A name is not NUL-terminated within the payload.
    #[error("{opcode}: {what} has no terminating NUL")]
    MissingNul {
        /// The request's opcode.
        opcode: Opcode,
        /// Which name (`"name"`, `"new name"`, `"link target"`).
        what: &'static str,
    },
    /// Bytes left over after every argument of the opcode.
    #[error("{opcode}: {extra} bytes follow the last argument")]
    TrailingBytes {
        /// The request's opcode.
        opcode: Opcode,
        /// How many.
        extra: usize,
    },
    /// `fuse_write_in.size` disagrees with the data that follows.
    #[error("{opcode}: fuse_write_in.size is {size} but {data} bytes of data follow")]
    WriteSizeMismatch {
        /// The request's opcode.
        opcode: Opcode,
        /// The size field.
        size: u32,
        /// Bytes of data in the payload.
        data: usize,
    },
    /// `fuse_batch_forget_in.count` disagrees with the entries that follow.
    #[error("{opcode}: count is {count} but {bytes} bytes of 16-byte fuse_forget_one follow")]
    ForgetCountMismatch {
        /// The request's opcode.
        opcode: Opcode,
        /// The count field.
        count: u32,
        /// Bytes of entries in the payload.
        bytes: usize,
    },
    /// A `fuse_init_in` of a size no kernel sends.
    #[error("{opcode}: fuse_init_in of {len} bytes (kernels send 8, 16, or at least 64)")]
    InitInSize {
        /// The request's opcode (INIT).
        opcode: Opcode,
        /// Bytes of payload.
        len: usize,
    },
    /// A name to encode contains a NUL byte, which would end it early on the wire.
    #[error("{what} contains a NUL byte")]
    NameHasNul {
        /// Which name.
        what: &'static str,
    },
    /// A directory entry name the kernel would reject with `EIO` for the whole READDIR.
    #[error(
        "directory entry name of {len} bytes is empty, longer than {NAME_MAX}, or has '/' or NUL"
    )]
    InvalidDirentName {
        /// The name's length.
        len: usize,
    },
    /// Extension bytes to encode are not a whole number of 8-byte units that `total_extlen`
    /// can count.
    #[error("{len} bytes of request extensions are not a multiple of 8 up to {}", u16::MAX as usize * 8)]
    ExtensionsLayout {
        /// Bytes of extensions.
        len: usize,
    },
    /// A message longer than its 32-bit length field can say.
    #[error("message of {len} bytes does not fit the 32-bit length field")]
    TooLong {
        /// The message's length.
        len: usize,
    },
    /// Fewer bytes than a `fuse_out_header`.
    #[error("reply of {len} bytes is shorter than the {OUT_HEADER_SIZE}-byte fuse_out_header")]
    TruncatedReply {
        /// Bytes in the buffer.
        len: usize,
    },
    /// `fuse_out_header.len` disagrees with the bytes of the reply.
    #[error("fuse_out_header.len is {header_len} but the reply holds {buffer_len} bytes")]
    ReplyLengthMismatch {
        /// The header's `len`.
        header_len: u32,
        /// Bytes in the buffer.
        buffer_len: usize,
    },
    /// A `fuse_init_out` of a size no server sends.
    #[error("fuse_init_out of {len} bytes (servers send 8, 24 or 64)")]
    InitOutSize {
        /// Bytes of the reply body.
        len: usize,
    },
    /// An init record whose request is not an INIT.
    #[error("init record holds a {opcode} request, not INIT")]
    NotInit {
        /// The recorded request's opcode.
        opcode: Opcode,
    },
    /// An init record whose reply is an error: no connection was negotiated.
    #[error("init record's reply is error {error}, not a negotiated INIT")]
    InitFailed {
        /// The reply's `error` field.
        error: i32,
    },
    /// An init record whose reply answers another request.
    #[error("init record's reply answers unique {reply}, not the INIT's {request}")]
    UniqueMismatch {
        /// The INIT request's `unique`.
        request: u64,
        /// The reply's `unique`.
        reply: u64,
    },
    /// Bytes that do not start with the init record's magic.
    #[error("not an init record (bad magic)")]
    RecordMagic,
    /// An init record of a format this build does not read.
    #[error("init record format version {version} is not supported (this build reads 1)")]
    RecordVersion {
        /// The record's version field.
        version: u16,
    },
    /// An init record shorter or longer than its length fields say.
    #[error("init record of {len} bytes, but its fields say {expected}")]
    RecordLength {
        /// Bytes of the record.
        len: usize,
        /// Bytes its header promises.
        expected: usize,
    },
}

impl Error {
    /// The opcode of the request the error is about, when a request header was decoded.
    pub fn opcode(&self) -> Option<Opcode> {
        match self {
            Error::LengthMismatch { opcode, .. }
            | Error::ExtensionsTooLong { opcode, .. }
            | Error::ShortStruct { opcode, .. }
            | Error::MissingNul { opcode, .. }
            | Error::TrailingBytes { opcode, .. }
            | Error::WriteSizeMismatch { opcode, .. }
            | Error::ForgetCountMismatch { opcode, .. }
            | Error::InitInSize { opcode, .. }
            | Error::NotInit { opcode } => Some(*opcode),
            Error::TruncatedHeader { .. }
            | Error::NameHasNul { .. }
            | Error::InvalidDirentName { .. }
            | Error::ExtensionsLayout { .. }
            | Error::TooLong { .. }
            | Error::TruncatedReply { .. }
            | Error::ReplyLengthMismatch { .. }
            | Error::InitOutSize { .. }
            | Error::InitFailed { .. }
            | Error::UniqueMismatch { .. }
            | Error::RecordMagic
            | Error::RecordVersion { .. }
            | Error::RecordLength { .. } => None,
        }
    }
}
