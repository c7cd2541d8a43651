//! Property tests: decoding arbitrary bytes never panics, well-formed requests of every
//! decoded opcode decode to what was put in and round-trip, and directory packing takes
//! exactly the entries that fit.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use fuse_wire::{
    DirBuffer, DirEntry, DirPlusBuffer, EntryOut, InitRecord, Opcode, Operation, Request,
    dirent_size, direntplus_size, roundtrip_check,
};
use proptest::prelude::*;

/// What one opcode's arguments are made of.
#[derive(Debug, Clone, Copy)]
struct Shape {
    opcode: Opcode,
    fixed: usize,
    names: usize,
}

const SHAPES: &[Shape] = &[
    Shape {
        opcode: Opcode::INIT,
        fixed: 64,
        names: 0,
    },
    Shape {
        opcode: Opcode::DESTROY,
        fixed: 0,
        names: 0,
    },
    Shape {
        opcode: Opcode::LOOKUP,
        fixed: 0,
        names: 1,
    },
    Shape {
        opcode: Opcode::FORGET,
        fixed: 8,
        names: 0,
    },
    Shape {
        opcode: Opcode::BATCH_FORGET,
        fixed: 8,
        names: 0,
    },
    Shape {
        opcode: Opcode::GETATTR,
        fixed: 16,
        names: 0,
    },
    Shape {
        opcode: Opcode::SETATTR,
        fixed: 88,
        names: 0,
    },
    Shape {
        opcode: Opcode::READLINK,
        fixed: 0,
        names: 0,
    },
    Shape {
        opcode: Opcode::SYMLINK,
        fixed: 0,
        names: 2,
    },
    Shape {
        opcode: Opcode::MKNOD,
        fixed: 16,
        names: 1,
    },
    Shape {
        opcode: Opcode::MKDIR,
        fixed: 8,
        names: 1,
    },
    Shape {
        opcode: Opcode::UNLINK,
        fixed: 0,
        names: 1,
    },
    Shape {
        opcode: Opcode::RMDIR,
        fixed: 0,
        names: 1,
    },
    Shape {
        opcode: Opcode::RENAME,
        fixed: 8,
        names: 2,
    },
    Shape {
        opcode: Opcode::RENAME2,
        fixed: 16,
        names: 2,
    },
    Shape {
        opcode: Opcode::LINK,
        fixed: 8,
        names: 1,
    },
    Shape {
        opcode: Opcode::OPEN,
        fixed: 8,
        names: 0,
    },
    Shape {
        opcode: Opcode::OPENDIR,
        fixed: 8,
        names: 0,
    },
    Shape {
        opcode: Opcode::CREATE,
        fixed: 16,
        names: 1,
    },
    Shape {
        opcode: Opcode::READ,
        fixed: 40,
        names: 0,
    },
    Shape {
        opcode: Opcode::READDIR,
        fixed: 40,
        names: 0,
    },
    Shape {
        opcode: Opcode::READDIRPLUS,
        fixed: 40,
        names: 0,
    },
    Shape {
        opcode: Opcode::WRITE,
        fixed: 40,
        names: 0,
    },
    Shape {
        opcode: Opcode::STATFS,
        fixed: 0,
        names: 0,
    },
    Shape {
        opcode: Opcode::RELEASE,
        fixed: 24,
        names: 0,
    },
    Shape {
        opcode: Opcode::RELEASEDIR,
        fixed: 24,
        names: 0,
    },
    Shape {
        opcode: Opcode::FLUSH,
        fixed: 24,
        names: 0,
    },
    Shape {
        opcode: Opcode::FSYNC,
        fixed: 16,
        names: 0,
    },
    Shape {
        opcode: Opcode::FSYNCDIR,
        fixed: 16,
        names: 0,
    },
    Shape {
        opcode: Opcode::INTERRUPT,
        fixed: 8,
        names: 0,
    },
    // Not decoded: the payload is kept as it is.
    Shape {
        opcode: Opcode::GETXATTR,
        fixed: 0,
        names: 0,
    },
    Shape {
        opcode: Opcode(4242),
        fixed: 0,
        names: 0,
    },
];

/// The parts of a well-formed request.
#[derive(Debug, Clone)]
struct Parts {
    shape: Shape,
    unique: u64,
    nodeid: u64,
    fixed: Vec<u8>,
    names: Vec<Vec<u8>>,
    /// WRITE data, BATCH_FORGET entries, or an undecoded payload.
    tail: Vec<u8>,
    extensions: Vec<u8>,
}

impl Parts {
    /// The request as the kernel would send it: fields the decoder checks are made
    /// consistent, everything else is arbitrary.
    fn bytes(&self) -> Vec<u8> {
        let mut fixed = self.fixed.clone();
        let mut tail = self.tail.clone();
        match self.shape.opcode {
            Opcode::WRITE => fixed[16..20].copy_from_slice(&(tail.len() as u32).to_ne_bytes()),
            Opcode::BATCH_FORGET => {
                tail.truncate(tail.len() / 16 * 16);
                fixed[0..4].copy_from_slice(&((tail.len() / 16) as u32).to_ne_bytes());
            }
            Opcode::GETXATTR | Opcode(4242) => {}
            _ => tail.clear(),
        }
        let mut payload = fixed;
        for name in &self.names {
            payload.extend_from_slice(name);
            payload.push(0);
        }
        payload.extend_from_slice(&tail);
        payload.extend_from_slice(&self.extensions);

        let mut bytes = Vec::new();
        bytes.extend_from_slice(&((40 + payload.len()) as u32).to_ne_bytes());
        bytes.extend_from_slice(&self.shape.opcode.0.to_ne_bytes());
        bytes.extend_from_slice(&self.unique.to_ne_bytes());
        bytes.extend_from_slice(&self.nodeid.to_ne_bytes());
        bytes.extend_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0]);
        bytes.extend_from_slice(&((self.extensions.len() / 8) as u16).to_ne_bytes());
        bytes.extend_from_slice(&[0, 0]);
        bytes.extend_from_slice(&payload);
        bytes
    }
}

fn name() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(1u8..=255, 0..40)
}

fn parts() -> impl Strategy<Value = Parts> {
    prop::sample::select(SHAPES).prop_flat_map(|shape| {
        (
            any::<u64>(),
            any::<u64>(),
            prop::collection::vec(any::<u8>(), shape.fixed),
            prop::collection::vec(name(), shape.names),
            prop::collection::vec(any::<u8>(), 0..200),
            prop::collection::vec(any::<u8>(), 0..4).prop_map(|units| vec![0xee; units.len() * 8]),
        )
            .prop_map(
                move |(unique, nodeid, fixed, names, tail, extensions)| Parts {
                    shape,
                    unique,
                    nodeid,
                    fixed,
                    names,
                    tail,
                    extensions,
                },
            )
    })
}

fn decoded_names<'a>(op: &Operation<'a>) -> Vec<&'a OsStr> {
    match *op {
        Operation::Lookup { name }
        | Operation::Unlink { name }
        | Operation::Rmdir { name }
        | Operation::Mknod { name, .. }
        | Operation::Mkdir { name, .. }
        | Operation::Link { name, .. }
        | Operation::Create { name, .. } => vec![name],
        Operation::Symlink { name, target } => vec![name, target],
        Operation::Rename { name, new_name, .. } | Operation::Rename2 { name, new_name, .. } => {
            vec![name, new_name]
        }
        _ => Vec::new(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = Request::decode(&bytes);
        let _ = InitRecord::decode(&bytes);
        roundtrip_check(&bytes);
    }

    #[test]
    fn arbitrary_payloads_behind_a_valid_header_never_panic(
        shape in prop::sample::select(SHAPES),
        extlen in 0u16..4,
        payload in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&((40 + payload.len()) as u32).to_ne_bytes());
        bytes.extend_from_slice(&shape.opcode.0.to_ne_bytes());
        bytes.extend_from_slice(&[0; 28]);
        bytes.extend_from_slice(&extlen.to_ne_bytes());
        bytes.extend_from_slice(&[0, 0]);
        bytes.extend_from_slice(&payload);
        roundtrip_check(&bytes);
        if let Err(e) = Request::decode(&bytes) {
            prop_assert_eq!(e.opcode(), Some(shape.opcode));
        }
    }

    #[test]
    fn well_formed_requests_decode_to_their_parts(parts in parts()) {
        let bytes = parts.bytes();
        let request = Request::decode(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(request.op.opcode(), parts.shape.opcode);
        prop_assert_eq!(request.header.unique.raw(), parts.unique);
        prop_assert_eq!(request.header.nodeid, parts.nodeid);
        prop_assert_eq!(request.extensions, parts.extensions.as_slice());
        let names: Vec<&[u8]> = decoded_names(&request.op).iter().map(|n| n.as_bytes()).collect();
        let expected: Vec<&[u8]> = parts.names.iter().map(Vec::as_slice).collect();
        prop_assert_eq!(names, expected);
        if let Operation::Write { data, .. } = request.op {
            prop_assert_eq!(data, parts.tail.as_slice());
        }
        if let Operation::BatchForget(list) = request.op {
            prop_assert_eq!(list.len(), parts.tail.len() / 16);
        }
        roundtrip_check(&bytes);
    }

    #[test]
    fn damaged_requests_never_panic(parts in parts(), cut in any::<prop::sample::Index>(), fix in any::<bool>()) {
        let mut bytes = parts.bytes();
        bytes.truncate(cut.index(bytes.len() + 1));
        if fix && bytes.len() >= 4 {
            let len = bytes.len() as u32;
            bytes[..4].copy_from_slice(&len.to_ne_bytes());
        }
        roundtrip_check(&bytes);
    }

    #[test]
    fn dir_buffers_take_exactly_what_fits(
        names in prop::collection::vec(
            prop::collection::vec(prop::num::u8::ANY.prop_filter("no / or NUL", |b| *b != b'/' && *b != 0), 1..60),
            0..40,
        ),
        limit in 0u32..3000,
        plus in any::<bool>(),
    ) {
        let mut plain = DirBuffer::new(limit);
        let mut with_attrs = DirPlusBuffer::new(limit);
        let mut taken = Vec::new();
        let mut used = 0usize;
        for (i, name) in names.iter().enumerate() {
            let entry = DirEntry { ino: i as u64, off: i as u64 + 1, kind: 4, name: OsStr::from_bytes(name) };
            let size = if plus { direntplus_size(name.len()) } else { dirent_size(name.len()) };
            let fits = used + size <= limit as usize;
            let pushed = if plus {
                with_attrs.push(&entry, &EntryOut { nodeid: i as u64, ..EntryOut::default() })
            } else {
                plain.push(&entry)
            };
            prop_assert_eq!(pushed, Ok(fits));
            if fits {
                used += size;
                taken.push(name.clone());
            }
        }
        let bytes = if plus { with_attrs.as_bytes() } else { plain.as_bytes() };
        prop_assert_eq!(bytes.len(), used);
        prop_assert!(used <= limit as usize);
        // Walk the records as the kernel does and find exactly the entries taken.
        let mut rest = bytes;
        let mut found = Vec::new();
        let skip = if plus { 128 } else { 0 };
        while !rest.is_empty() {
            let namelen = u32::from_ne_bytes(rest[skip + 16..skip + 20].try_into().unwrap()) as usize;
            found.push(rest[skip + 24..skip + 24 + namelen].to_vec());
            let size = if plus { direntplus_size(namelen) } else { dirent_size(namelen) };
            prop_assert_eq!(size % 8, 0);
            rest = &rest[size..];
        }
        prop_assert_eq!(found, taken);
    }
}
