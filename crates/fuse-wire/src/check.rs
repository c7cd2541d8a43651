//! The invariants the fuzz target asserts over arbitrary bytes.

use std::ffi::OsStr;

use crate::abi::{
    InitFlags, InvalEntryFlags, KERNEL_VERSION, MIN_READ_BUFFER, NotifyCode, OUT_HEADER_SIZE,
};
use crate::dirent::{DirBuffer, DirEntry, DirPlusBuffer, dirent_size, direntplus_size};
use crate::error::Error;
use crate::init::{InitOut, InitRecord};
use crate::notify;
use crate::reply::{self, Errno};
use crate::request::{Operation, Request, Unique};
use crate::structs::{Attr, EntryOut, InHeader, OpenOut, WireStruct, WriteOut};

/// Decodes `input` as a request and as an [`InitRecord`], and asserts what must hold:
///
/// - Decoding never panics. A request that fails to decode names the opcode of its header
///   whenever there is a header.
/// - A request that decodes encodes to bytes of the same length that decode to the same
///   request, and encoding those again gives the same bytes.
/// - Its `unique` splits into an ID without flag bits and the two bits.
/// - The replies it can have encode to messages whose header length, error and `unique` are
///   right: an error, its entry or create reply, an INIT reply that makes a valid
///   [`InitRecord`] (which survives its own format), directory buffers within the size asked
///   for and 8-byte aligned, and an entry invalidation of a decoded name.
/// - An init record that decodes encodes to exactly the input.
///
/// # Panics
///
/// When an invariant does not hold: that is a bug for the fuzzer to report.
pub fn roundtrip_check(input: &[u8]) {
    record_check(input);
    let request = match Request::decode(input) {
        Ok(request) => request,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            match InHeader::read_from(input) {
                Some(header) => assert_eq!(e.opcode(), Some(header.opcode), "{e}"),
                None => assert!(matches!(e, Error::TruncatedHeader { .. }), "{e}"),
            }
            return;
        }
    };
    let mut bytes = Vec::new();
    if let Err(e) = request.encode(&mut bytes) {
        panic!("decoded request does not encode: {e}: {request:?}");
    }
    assert_eq!(
        bytes.len(),
        input.len(),
        "encoding changed the length of {request:?}"
    );
    let again = match Request::decode(&bytes) {
        Ok(again) => again,
        Err(e) => panic!("encoded request does not decode: {e}: {request:?}"),
    };
    assert_eq!(again, request, "encoded request decodes differently");
    let mut bytes_again = Vec::new();
    if let Err(e) = again.encode(&mut bytes_again) {
        panic!("request does not encode the second time: {e}");
    }
    assert!(bytes_again == bytes, "encoding is not stable");

    let unique = request.header.unique;
    let flag_bits = Unique::INTERRUPT_BIT | Unique::RESEND_BIT;
    assert_eq!(unique.id() & flag_bits, 0);
    assert_eq!(unique.id() | (unique.raw() & flag_bits), unique.raw());
    assert_eq!(unique.is_interrupt(), unique.raw() & 1 == 1);
    assert_eq!(unique.is_resend(), unique.raw() >> 63 == 1);

    reply_check(&request, input);
}

/// A message's header and body, with the header's length checked against the bytes.
fn split(message: &[u8]) -> (crate::OutHeader, &[u8]) {
    match reply::decode(message) {
        Ok(parts) => parts,
        Err(e) => panic!("encoded reply does not decode: {e}"),
    }
}

fn reply_check(request: &Request<'_>, input: &[u8]) {
    let unique = request.header.unique;
    let mut out = Vec::new();
    reply::error(&mut out, unique, Errno::ENOSYS);
    let (header, body) = split(&out);
    assert_eq!(
        (header.error, header.unique, body.len()),
        (-38, unique.raw(), 0)
    );

    let entry = EntryOut {
        nodeid: request.header.nodeid.wrapping_add(1),
        generation: 1,
        attr: Attr {
            ino: request.header.nodeid,
            mode: 0o100_644,
            ..Attr::default()
        },
        ..EntryOut::default()
    };
    match request.op {
        Operation::Init(init) => init_check(request, init, input),
        Operation::Lookup { name }
        | Operation::Mknod { name, .. }
        | Operation::Mkdir { name, .. }
        | Operation::Symlink { name, .. }
        | Operation::Link { name, .. } => {
            out.clear();
            reply::entry(&mut out, unique, &entry);
            let (_, body) = split(&out);
            assert_eq!(EntryOut::read_from(body), Some(entry));
            assert_eq!(body.len(), EntryOut::SIZE);
            inval_entry_check(request.header.nodeid, name);
        }
        Operation::Create { name, .. } => {
            out.clear();
            let open = OpenOut {
                fh: 7,
                ..OpenOut::default()
            };
            reply::create(&mut out, unique, &entry, &open);
            let (_, body) = split(&out);
            assert_eq!(body.len(), EntryOut::SIZE + OpenOut::SIZE);
            assert_eq!(
                OpenOut::read_from(body.get(EntryOut::SIZE..).unwrap_or_default()),
                Some(open)
            );
            inval_entry_check(request.header.nodeid, name);
        }
        Operation::Write { arg, data } => {
            out.clear();
            reply::write(&mut out, unique, &WriteOut { size: arg.size });
            let (_, body) = split(&out);
            assert_eq!(
                WriteOut::read_from(body),
                Some(WriteOut {
                    size: data.len() as u32
                })
            );
        }
        Operation::Read(arg) => {
            out.clear();
            let data = vec![0x5a; (arg.size as usize).min(64)];
            if let Err(e) = reply::data(&mut out, unique, &data) {
                panic!("a small READ reply does not encode: {e}");
            }
            let (_, body) = split(&out);
            assert!(body == data.as_slice());
        }
        Operation::Readdir(arg) => dir_check(arg.size, false),
        Operation::Readdirplus(arg) => dir_check(arg.size, true),
        _ => {}
    }

    out.clear();
    notify::resend(&mut out);
    let (header, body) = split(&out);
    assert_eq!(
        (header.error, header.unique, body.len()),
        (NotifyCode::RESEND.0, 0, 0)
    );
}

fn inval_entry_check(parent: u64, name: &OsStr) {
    let mut out = Vec::new();
    if let Err(e) = notify::inval_entry(&mut out, parent, name, InvalEntryFlags::EMPTY) {
        panic!("a decoded name does not encode in INVAL_ENTRY: {e}");
    }
    let (header, body) = split(&out);
    assert_eq!(
        (header.error, header.unique),
        (NotifyCode::INVAL_ENTRY.0, 0)
    );
    assert_eq!(body.len(), 16 + name.len() + 1);
}

fn init_check(request: &Request<'_>, init: crate::InitIn<'_>, input: &[u8]) {
    let wanted = InitFlags::ASYNC_READ
        | InitFlags::BIG_WRITES
        | InitFlags::MAX_PAGES
        | InitFlags::DO_READDIRPLUS
        | InitFlags::PARALLEL_DIROPS;
    let init_out = InitOut {
        major: KERNEL_VERSION,
        minor: init.reply_minor(),
        max_readahead: init.max_readahead,
        flags: init.capabilities() & wanted,
        max_background: 16,
        congestion_threshold: 12,
        max_write: 1 << 20,
        time_gran: 1,
        max_pages: 256,
        ..InitOut::default()
    };
    let mut reply_bytes = Vec::new();
    reply::init(
        &mut reply_bytes,
        request.header.unique,
        &init_out,
        init.minor,
    );
    assert_eq!(
        reply_bytes.len(),
        OUT_HEADER_SIZE + InitOut::size_for_minor(init.minor)
    );
    let record = match InitRecord::new(input.to_vec(), reply_bytes) {
        Ok(record) => record,
        Err(e) => panic!("an INIT and its reply do not make a record: {e}"),
    };
    let encoded = record.encode();
    match InitRecord::decode(&encoded) {
        Ok(again) => assert_eq!(again, record),
        Err(e) => panic!("an encoded init record does not decode: {e}"),
    }
    assert_eq!(record.kernel_minor(), init.minor);
    assert_eq!(record.kernel_flags(), init.capabilities());
    assert!(record.flags().difference(init.capabilities()).is_empty());
    assert_eq!(
        record.has_resend(),
        init.major == KERNEL_VERSION && init.capabilities().contains(InitFlags::HAS_RESEND)
    );
    assert!(record.read_buffer_size() >= MIN_READ_BUFFER);
    // A reply cut to an old kernel's size loses the fields past it, but never the versions.
    assert_eq!(
        (record.major(), record.minor()),
        (init_out.major, init_out.minor)
    );
}

fn dir_check(limit: u32, plus: bool) {
    let mut plain = DirBuffer::new(limit);
    let mut with_attrs = DirPlusBuffer::new(limit);
    let mut expected_len = 0;
    for i in 0..64u64 {
        let name = format!("entry-{i}");
        let entry = DirEntry {
            ino: i + 2,
            off: i + 1,
            kind: 8,
            name: OsStr::new(&name),
        };
        let (taken, size) = if plus {
            let taken = with_attrs.push(&entry, &EntryOut::default());
            (taken, direntplus_size(name.len()))
        } else {
            (plain.push(&entry), dirent_size(name.len()))
        };
        match taken {
            Ok(true) => expected_len += size,
            Ok(false) => break,
            Err(e) => panic!("a valid name is refused: {e}"),
        }
    }
    let (len, bytes_len) = if plus {
        (with_attrs.len(), with_attrs.as_bytes().len())
    } else {
        (plain.len(), plain.as_bytes().len())
    };
    assert_eq!(len, expected_len);
    assert_eq!(bytes_len, len);
    assert!(
        len <= limit as usize,
        "{len} bytes packed for a READDIR of {limit}"
    );
    assert_eq!(len % 8, 0);
}

fn record_check(input: &[u8]) {
    match InitRecord::decode(input) {
        Ok(record) => assert!(
            record.encode() == input,
            "a decoded init record encodes differently"
        ),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}
