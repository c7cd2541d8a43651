//! INIT: the request, the reply, and the record of what a connection negotiated.

use crate::abi::{
    COMPAT_22_INIT_OUT_SIZE, COMPAT_INIT_OUT_SIZE, InitFlags, KERNEL_MINOR_VERSION, KERNEL_VERSION,
    OUT_HEADER_SIZE, Opcode, read_buffer_size,
};
use crate::codec::{Put, Reader};
use crate::error::Error;
use crate::request::{Operation, Request};
use crate::structs::{OutHeader, WireStruct};

/// Which `fuse_init_in` the kernel sent: the struct grew twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InitInLayout {
    /// 8 bytes: `major`, `minor` (protocol before 7.6).
    Minimal,
    /// 16 bytes: adds `max_readahead` and `flags` (7.6 to 7.35).
    Compat,
    /// 64 bytes or more: adds `flags2` and eleven unused words (7.36 and later). Bytes past
    /// 64, from a kernel newer than this crate, are kept in [`InitIn::extra`].
    Extended,
}

impl InitInLayout {
    /// The struct's size in this layout (without [`InitIn::extra`]).
    pub const fn size(self) -> usize {
        match self {
            InitInLayout::Minimal => 8,
            InitInLayout::Compat => 16,
            InitInLayout::Extended => 64,
        }
    }
}

/// `fuse_init_in`: what the kernel offers. Fields a shorter layout lacks are 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitIn<'a> {
    /// The kernel's major version.
    pub major: u32,
    /// The kernel's minor version.
    pub minor: u32,
    /// The kernel's maximum readahead.
    pub max_readahead: u32,
    /// Flags, bits 0..32.
    pub flags: u32,
    /// Flags, bits 32..64; they count only when `flags` has [`InitFlags::INIT_EXT`].
    pub flags2: u32,
    /// The unused words after `flags2`, as sent.
    pub unused: [u32; 11],
    /// Which struct the kernel sent.
    pub layout: InitInLayout,
    /// Bytes past the 64-byte struct, from a newer kernel.
    pub extra: &'a [u8],
}

impl<'a> InitIn<'a> {
    /// Decodes an INIT payload (what follows the header).
    pub(crate) fn decode(opcode: Opcode, payload: &'a [u8]) -> Result<Self, Error> {
        let len = payload.len();
        let layout = match len {
            8 => InitInLayout::Minimal,
            16 => InitInLayout::Compat,
            n if n >= 64 => InitInLayout::Extended,
            _ => return Err(Error::InitInSize { opcode, len }),
        };
        let bad = || Error::InitInSize { opcode, len };
        let r = &mut Reader::new(payload);
        let mut init = InitIn {
            major: r.u32().ok_or_else(bad)?,
            minor: r.u32().ok_or_else(bad)?,
            max_readahead: 0,
            flags: 0,
            flags2: 0,
            unused: [0; 11],
            layout,
            extra: &[],
        };
        if layout != InitInLayout::Minimal {
            init.max_readahead = r.u32().ok_or_else(bad)?;
            init.flags = r.u32().ok_or_else(bad)?;
        }
        if layout == InitInLayout::Extended {
            init.flags2 = r.u32().ok_or_else(bad)?;
            for word in &mut init.unused {
                *word = r.u32().ok_or_else(bad)?;
            }
            init.extra = r.rest();
        }
        Ok(init)
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.put_u32(self.major);
        out.put_u32(self.minor);
        if self.layout == InitInLayout::Minimal {
            return;
        }
        out.put_u32(self.max_readahead);
        out.put_u32(self.flags);
        if self.layout == InitInLayout::Compat {
            return;
        }
        out.put_u32(self.flags2);
        for word in self.unused {
            out.put_u32(word);
        }
        out.extend_from_slice(self.extra);
    }

    /// What the kernel offers, as one 64-bit set (the kernel's combination of `flags` and
    /// `flags2`).
    pub const fn capabilities(&self) -> InitFlags {
        InitFlags::from_fields(self.flags, self.flags2)
    }

    /// The minor version to answer with when the majors match: the smaller of the kernel's
    /// and this crate's ([`KERNEL_MINOR_VERSION`]).
    pub const fn reply_minor(&self) -> u32 {
        if self.minor < KERNEL_MINOR_VERSION {
            self.minor
        } else {
            KERNEL_MINOR_VERSION
        }
    }
}

/// `fuse_init_out`: what the filesystem answers. Its flags are one 64-bit set, split into
/// `flags` and `flags2` on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InitOut {
    /// Major version; must be [`KERNEL_VERSION`] for the kernel to accept the reply.
    pub major: u32,
    /// Minor version: the smaller of the kernel's and the filesystem's.
    pub minor: u32,
    /// Maximum readahead, at most the kernel's.
    pub max_readahead: u32,
    /// The features the filesystem enables, a subset of what the kernel offered.
    pub flags: InitFlags,
    /// Maximum background requests (7.13).
    pub max_background: u16,
    /// Background requests at which the kernel reports congestion (7.13).
    pub congestion_threshold: u16,
    /// Largest WRITE payload (7.5).
    pub max_write: u32,
    /// Timestamp granularity in nanoseconds (7.23).
    pub time_gran: u32,
    /// Largest request in pages, with [`InitFlags::MAX_PAGES`] (7.28).
    pub max_pages: u16,
    /// DAX mapping alignment, log2 of bytes, with [`InitFlags::MAP_ALIGNMENT`] (7.31).
    pub map_alignment: u16,
    /// Stacking depth of passthrough backing files (7.40).
    pub max_stack_depth: u32,
    /// Request timeout in seconds, with [`InitFlags::REQUEST_TIMEOUT`] (7.43).
    pub request_timeout: u16,
}

impl InitOut {
    /// The size of the struct a kernel of minor version `kernel_minor` reads: it rejects a
    /// longer reply.
    pub const fn size_for_minor(kernel_minor: u32) -> usize {
        if kernel_minor < 5 {
            COMPAT_INIT_OUT_SIZE
        } else if kernel_minor < 23 {
            COMPAT_22_INIT_OUT_SIZE
        } else {
            Self::SIZE
        }
    }

    /// The flags as written: [`InitFlags::INIT_EXT`] is added whenever a bit of `flags2` is
    /// set, since the kernel ignores `flags2` without it.
    pub const fn wire_flags(&self) -> InitFlags {
        if self.flags.high() != 0 {
            self.flags.union(InitFlags::INIT_EXT)
        } else {
            self.flags
        }
    }

    /// Decodes a reply body of any size a server sends: 8, 24 or 64 bytes. Fields a short
    /// body lacks are 0.
    pub fn decode(body: &[u8]) -> Result<InitOut, Error> {
        let len = body.len();
        if ![COMPAT_INIT_OUT_SIZE, COMPAT_22_INIT_OUT_SIZE, Self::SIZE].contains(&len) {
            return Err(Error::InitOutSize { len });
        }
        let mut padded = [0u8; Self::SIZE];
        if let Some(prefix) = padded.get_mut(..len) {
            prefix.copy_from_slice(body);
        }
        InitOut::read_from(&padded).ok_or(Error::InitOutSize { len })
    }
}

wire_struct!(
    InitOut,
    "fuse_init_out",
    64,
    |r| {
        let major = r.u32()?;
        let minor = r.u32()?;
        let max_readahead = r.u32()?;
        let flags = r.u32()?;
        let max_background = r.u16()?;
        let congestion_threshold = r.u16()?;
        let max_write = r.u32()?;
        let time_gran = r.u32()?;
        let max_pages = r.u16()?;
        let map_alignment = r.u16()?;
        let flags2 = r.u32()?;
        let max_stack_depth = r.u32()?;
        let request_timeout = r.u16()?;
        r.skip(22)?; // unused[11]
        Some(InitOut {
            major,
            minor,
            max_readahead,
            flags: InitFlags::from_fields(flags, flags2),
            max_background,
            congestion_threshold,
            max_write,
            time_gran,
            max_pages,
            map_alignment,
            max_stack_depth,
            request_timeout,
        })
    },
    |s, out| {
        let flags = s.wire_flags();
        out.put_u32(s.major);
        out.put_u32(s.minor);
        out.put_u32(s.max_readahead);
        out.put_u32(flags.low());
        out.put_u16(s.max_background);
        out.put_u16(s.congestion_threshold);
        out.put_u32(s.max_write);
        out.put_u32(s.time_gran);
        out.put_u16(s.max_pages);
        out.put_u16(s.map_alignment);
        out.put_u32(flags.high());
        out.put_u32(s.max_stack_depth);
        out.put_u16(s.request_timeout);
        out.put_zeros(22);
    }
);

/// What a connection negotiated: the INIT request exactly as the kernel sent it and the reply
/// exactly as the filesystem wrote it.
///
/// The kernel sends INIT once per connection. A successor that takes over a live
/// `/dev/fuse` descriptor reloads this record instead of waiting for an INIT that never
/// comes; it needs at least `max_write` (the read buffer size) and the negotiated flags.
///
/// [`encode`](Self::encode) and [`decode`](Self::decode) use a small versioned format (all
/// integers little-endian):
///
/// | bytes | field |
/// | --- | --- |
/// | 8 | magic `FUSEINIT` |
/// | 2 | format version, 1 |
/// | 2 | reserved, 0 |
/// | 4 | request length |
/// | 4 | reply length |
/// | … | the request, then the reply |
///
/// The request and the reply inside are FUSE messages in the host's byte order: a record
/// moves between processes on one host, not between hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitRecord {
    request: Vec<u8>,
    reply: Vec<u8>,
    kernel_major: u32,
    kernel_minor: u32,
    kernel_flags: InitFlags,
    init_out: InitOut,
}

const RECORD_MAGIC: &[u8; 8] = b"FUSEINIT";
const RECORD_VERSION: u16 = 1;
const RECORD_HEADER_SIZE: usize = 20;

impl InitRecord {
    /// Checks and keeps an INIT request (the whole read buffer, header included) and the
    /// reply written to it (header included): the request must decode as INIT, and the reply
    /// must be a successful INIT reply to it.
    pub fn new(request: Vec<u8>, reply: Vec<u8>) -> Result<InitRecord, Error> {
        let decoded = Request::decode(&request)?;
        let Operation::Init(init_in) = decoded.op else {
            return Err(Error::NotInit {
                opcode: decoded.header.opcode,
            });
        };
        let header =
            OutHeader::read_from(&reply).ok_or(Error::TruncatedReply { len: reply.len() })?;
        if header.len as usize != reply.len() {
            return Err(Error::ReplyLengthMismatch {
                header_len: header.len,
                buffer_len: reply.len(),
            });
        }
        if header.error != 0 {
            return Err(Error::InitFailed {
                error: header.error,
            });
        }
        if header.unique != decoded.header.unique.0 {
            return Err(Error::UniqueMismatch {
                request: decoded.header.unique.0,
                reply: header.unique,
            });
        }
        let init_out = InitOut::decode(reply.get(OUT_HEADER_SIZE..).unwrap_or_default())?;
        Ok(InitRecord {
            kernel_major: init_in.major,
            kernel_minor: init_in.minor,
            kernel_flags: init_in.capabilities(),
            init_out,
            request,
            reply,
        })
    }

    /// The record in its versioned format.
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(RECORD_HEADER_SIZE + self.request.len() + self.reply.len());
        out.extend_from_slice(RECORD_MAGIC);
        out.extend_from_slice(&RECORD_VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        // Both lengths come from messages whose own u32 length fields were checked in `new`.
        out.extend_from_slice(&(self.request.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.reply.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.request);
        out.extend_from_slice(&self.reply);
        out
    }

    /// Reads a record written by [`encode`](Self::encode), checking it as [`new`](Self::new)
    /// does.
    pub fn decode(bytes: &[u8]) -> Result<InitRecord, Error> {
        let short = || Error::RecordLength {
            len: bytes.len(),
            expected: RECORD_HEADER_SIZE,
        };
        let (magic, rest) = bytes.split_first_chunk::<8>().ok_or_else(short)?;
        if magic != RECORD_MAGIC {
            return Err(Error::RecordMagic);
        }
        let (version, rest) = rest.split_first_chunk::<2>().ok_or_else(short)?;
        let (reserved, rest) = rest.split_first_chunk::<2>().ok_or_else(short)?;
        let version = u16::from_le_bytes(*version);
        if version != RECORD_VERSION || u16::from_le_bytes(*reserved) != 0 {
            return Err(Error::RecordVersion { version });
        }
        let (request_len, rest) = rest.split_first_chunk::<4>().ok_or_else(short)?;
        let (reply_len, rest) = rest.split_first_chunk::<4>().ok_or_else(short)?;
        let request_len = u32::from_le_bytes(*request_len) as usize;
        let reply_len = u32::from_le_bytes(*reply_len) as usize;
        let expected = RECORD_HEADER_SIZE
            .saturating_add(request_len)
            .saturating_add(reply_len);
        let mismatch = Error::RecordLength {
            len: bytes.len(),
            expected,
        };
        if bytes.len() != expected {
            return Err(mismatch);
        }
        let (request, reply) = rest.split_at_checked(request_len).ok_or(mismatch)?;
        InitRecord::new(request.to_vec(), reply.to_vec())
    }

    /// The INIT request as the kernel sent it.
    pub fn request_bytes(&self) -> &[u8] {
        &self.request
    }

    /// The reply as the filesystem wrote it.
    pub fn reply_bytes(&self) -> &[u8] {
        &self.reply
    }

    /// The decoded reply.
    pub fn init_out(&self) -> &InitOut {
        &self.init_out
    }

    /// The negotiated major version (the reply's).
    pub fn major(&self) -> u32 {
        self.init_out.major
    }

    /// The negotiated minor version: the reply's, which the kernel adopts.
    pub fn minor(&self) -> u32 {
        self.init_out.minor
    }

    /// The kernel's major version.
    pub fn kernel_major(&self) -> u32 {
        self.kernel_major
    }

    /// The kernel's minor version.
    pub fn kernel_minor(&self) -> u32 {
        self.kernel_minor
    }

    /// What the kernel offered.
    pub fn kernel_flags(&self) -> InitFlags {
        self.kernel_flags
    }

    /// What the filesystem's reply enabled, as the kernel reads it.
    pub fn reply_flags(&self) -> InitFlags {
        self.init_out.flags
    }

    /// The negotiated features: offered by the kernel and enabled by the reply.
    pub fn flags(&self) -> InitFlags {
        self.kernel_flags & self.init_out.flags
    }

    /// `max_write` as the reply set it.
    pub fn max_write(&self) -> u32 {
        self.init_out.max_write
    }

    /// `max_pages` when [`InitFlags::MAX_PAGES`] was negotiated; otherwise the kernel uses
    /// its default.
    pub fn max_pages(&self) -> Option<u16> {
        self.flags()
            .contains(InitFlags::MAX_PAGES)
            .then_some(self.init_out.max_pages)
    }

    /// Whether the kernel supports `FUSE_NOTIFY_RESEND` and marks resent requests
    /// ([`InitFlags::HAS_RESEND`], Linux 6.9). The kernel offers it; the reply need not echo
    /// it.
    pub fn has_resend(&self) -> bool {
        self.kernel_major == KERNEL_VERSION && self.kernel_flags.contains(InitFlags::HAS_RESEND)
    }

    /// The smallest read buffer the kernel accepts on this connection: [`read_buffer_size`]
    /// of the `max_write` the kernel applies (the reply's, raised to at least 4096).
    pub fn read_buffer_size(&self) -> usize {
        read_buffer_size(self.init_out.max_write.max(4096))
    }
}
