//! Unit tests: sizes against the kernel header, exact bytes, every decoder error, directory
//! packing, INIT of every layout, the unique bits, and the init record format.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use crate::*;

/// A request as the kernel would send it for `op`, with a fixed header.
fn encode(op: Operation<'_>) -> Vec<u8> {
    encode_with(op, &[])
}

fn encode_with(op: Operation<'_>, extensions: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    Request {
        header: header(),
        op,
        extensions,
    }
    .encode(&mut out)
    .unwrap();
    out
}

fn header() -> InHeader {
    InHeader {
        unique: Unique(0x10),
        nodeid: 5,
        uid: 1000,
        gid: 100,
        pid: 4242,
        ..InHeader::default()
    }
}

fn decode(bytes: &[u8]) -> Result<Request<'_>, Error> {
    Request::decode(bytes)
}

fn name(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Overwrites the header's `len` with the buffer's length after a test edited the buffer.
fn fix_len(bytes: &mut [u8]) {
    let len = bytes.len() as u32;
    bytes[..4].copy_from_slice(&len.to_ne_bytes());
}

// ---------------------------------------------------------------------------------------------
// Sizes: `sizeof` of each struct in include/uapi/linux/fuse.h (7.45).

#[test]
fn struct_sizes_match_the_kernel_header() {
    fn check<T: WireStruct + Default>(size: usize, c_name: &str) {
        assert_eq!(T::SIZE, size, "{c_name}");
        assert_eq!(T::C_NAME, c_name);
        assert_eq!(
            T::default().to_vec().len(),
            size,
            "{c_name} writes its size"
        );
        assert!(
            T::read_from(&vec![0; size - 1]).is_none(),
            "{c_name} needs all its bytes"
        );
        assert!(
            T::read_from(&vec![0; size]).is_some(),
            "{c_name} reads from its size"
        );
    }
    check::<InHeader>(40, "fuse_in_header");
    check::<OutHeader>(16, "fuse_out_header");
    check::<Attr>(88, "fuse_attr");
    check::<EntryOut>(128, "fuse_entry_out");
    check::<AttrOut>(104, "fuse_attr_out");
    check::<ForgetIn>(8, "fuse_forget_in");
    check::<ForgetOne>(16, "fuse_forget_one");
    check::<structs::BatchForgetIn>(8, "fuse_batch_forget_in");
    check::<GetattrIn>(16, "fuse_getattr_in");
    check::<SetattrIn>(88, "fuse_setattr_in");
    check::<MknodIn>(16, "fuse_mknod_in");
    check::<MkdirIn>(8, "fuse_mkdir_in");
    check::<RenameIn>(8, "fuse_rename_in");
    check::<Rename2In>(16, "fuse_rename2_in");
    check::<LinkIn>(8, "fuse_link_in");
    check::<OpenIn>(8, "fuse_open_in");
    check::<CreateIn>(16, "fuse_create_in");
    check::<OpenOut>(16, "fuse_open_out");
    check::<ReadIn>(40, "fuse_read_in");
    check::<WriteIn>(40, "fuse_write_in");
    check::<WriteOut>(8, "fuse_write_out");
    check::<ReleaseIn>(24, "fuse_release_in");
    check::<FlushIn>(24, "fuse_flush_in");
    check::<FsyncIn>(16, "fuse_fsync_in");
    check::<InterruptIn>(8, "fuse_interrupt_in");
    check::<StatfsOut>(80, "fuse_statfs_out");
    check::<InitOut>(64, "fuse_init_out");
    check::<NotifyInvalInodeOut>(24, "fuse_notify_inval_inode_out");
    check::<NotifyInvalEntryOut>(16, "fuse_notify_inval_entry_out");
    assert_eq!(
        InitInLayout::Extended.size(),
        64,
        "sizeof(struct fuse_init_in)"
    );
    assert_eq!(IN_HEADER_SIZE, InHeader::SIZE);
    assert_eq!(OUT_HEADER_SIZE, OutHeader::SIZE);
    // FUSE_NAME_OFFSET and FUSE_NAME_OFFSET_DIRENTPLUS.
    assert_eq!(dirent_size(0), 24);
    assert_eq!(direntplus_size(0), 152);
}

#[test]
fn compat_sizes_are_the_current_structs_cut_short() {
    // Before 7.9 fuse_attr had no blksize and no padding: 8 bytes fewer.
    assert_eq!(COMPAT_ENTRY_OUT_SIZE, EntryOut::SIZE - 8);
    assert_eq!(COMPAT_ATTR_OUT_SIZE, AttrOut::SIZE - 8);
    // fuse_write_in before 7.9: fh, offset, size, write_flags.
    assert_eq!(COMPAT_WRITE_IN_SIZE, 24);
    // fuse_mknod_in before 7.12: mode, rdev.
    assert_eq!(COMPAT_MKNOD_IN_SIZE, 8);
    // fuse_kstatfs before 7.4: blocks..ffree, bsize, namelen.
    assert_eq!(COMPAT_STATFS_SIZE, 48);
    assert_eq!(InitOut::size_for_minor(4), COMPAT_INIT_OUT_SIZE);
    assert_eq!(InitOut::size_for_minor(22), COMPAT_22_INIT_OUT_SIZE);
    assert_eq!(InitOut::size_for_minor(23), 64);
    assert_eq!(InitOut::size_for_minor(KERNEL_MINOR_VERSION), 64);
}

#[test]
fn read_buffer_size_follows_the_kernel_rule() {
    assert_eq!(read_buffer_size(0), MIN_READ_BUFFER);
    assert_eq!(read_buffer_size(4096), MIN_READ_BUFFER);
    assert_eq!(read_buffer_size(8192 - 80), MIN_READ_BUFFER);
    assert_eq!(read_buffer_size(8192 - 79), 8193);
    assert_eq!(read_buffer_size(1 << 20), (1 << 20) + 80);
}

// ---------------------------------------------------------------------------------------------
// Exact bytes.

#[test]
fn in_header_bytes_are_in_the_kernel_order() {
    let bytes = encode(Operation::Lookup { name: name("a") });
    let mut expected = Vec::new();
    expected.extend_from_slice(&42u32.to_ne_bytes()); // len: 40 + "a\0"
    expected.extend_from_slice(&1u32.to_ne_bytes()); // opcode LOOKUP
    expected.extend_from_slice(&0x10u64.to_ne_bytes()); // unique
    expected.extend_from_slice(&5u64.to_ne_bytes()); // nodeid
    expected.extend_from_slice(&1000u32.to_ne_bytes()); // uid
    expected.extend_from_slice(&100u32.to_ne_bytes()); // gid
    expected.extend_from_slice(&4242u32.to_ne_bytes()); // pid
    expected.extend_from_slice(&0u16.to_ne_bytes()); // total_extlen
    expected.extend_from_slice(&0u16.to_ne_bytes()); // padding
    expected.extend_from_slice(b"a\0");
    assert_eq!(bytes, expected);
}

#[test]
fn entry_reply_bytes_are_in_the_kernel_order() {
    let entry = EntryOut {
        nodeid: 0x0102,
        generation: 3,
        entry_valid: 4,
        attr_valid: 5,
        entry_valid_nsec: 6,
        attr_valid_nsec: 7,
        attr: Attr {
            ino: 8,
            size: 9,
            blocks: 10,
            atime: 11,
            mtime: 12,
            ctime: 13,
            atimensec: 14,
            mtimensec: 15,
            ctimensec: 16,
            mode: 0o100_644,
            nlink: 17,
            uid: 18,
            gid: 19,
            rdev: 20,
            blksize: 21,
            flags: AttrFlags::SUBMOUNT,
        },
    };
    let mut out = Vec::new();
    reply::entry(&mut out, Unique(0x8000_0000_0000_0022), &entry);

    let mut expected = Vec::new();
    expected.extend_from_slice(&144u32.to_ne_bytes()); // len
    expected.extend_from_slice(&0i32.to_ne_bytes()); // error
    expected.extend_from_slice(&0x8000_0000_0000_0022u64.to_ne_bytes()); // unique, resend bit kept
    for v in [0x0102u64, 3, 4, 5] {
        expected.extend_from_slice(&v.to_ne_bytes());
    }
    for v in [6u32, 7] {
        expected.extend_from_slice(&v.to_ne_bytes());
    }
    for v in [8u64, 9, 10, 11, 12, 13] {
        expected.extend_from_slice(&v.to_ne_bytes());
    }
    for v in [14u32, 15, 16, 0o100_644, 17, 18, 19, 20, 21, 1] {
        expected.extend_from_slice(&v.to_ne_bytes());
    }
    assert_eq!(out, expected);
    assert_eq!(EntryOut::read_from(&out[16..]), Some(entry));
}

#[test]
fn error_reply_is_a_header_with_a_negative_errno() {
    let mut out = Vec::new();
    reply::error(&mut out, Unique(7), Errno::ENOENT);
    let mut expected = Vec::new();
    expected.extend_from_slice(&16u32.to_ne_bytes());
    expected.extend_from_slice(&(-2i32).to_ne_bytes());
    expected.extend_from_slice(&7u64.to_ne_bytes());
    assert_eq!(out, expected);
}

#[test]
fn replies_append_and_set_their_own_length() {
    let mut out = vec![0xaa; 3];
    reply::empty(&mut out, Unique(2));
    reply::attr(&mut out, Unique(4), &AttrOut::default());
    reply::open(
        &mut out,
        Unique(6),
        &OpenOut {
            fh: 9,
            open_flags: FopenFlags::KEEP_CACHE,
            backing_id: -1,
        },
    );
    reply::create(
        &mut out,
        Unique(8),
        &EntryOut::default(),
        &OpenOut::default(),
    );
    reply::write(&mut out, Unique(10), &WriteOut { size: 5 });
    reply::statfs(
        &mut out,
        Unique(12),
        &StatfsOut {
            blocks: 1,
            ..StatfsOut::default()
        },
    );
    reply::data(&mut out, Unique(14), b"target").unwrap();
    let mut rest = &out[3..];
    for (unique, body) in [
        (2, 0),
        (4, 104),
        (6, 16),
        (8, 144),
        (10, 8),
        (12, 80),
        (14, 6),
    ] {
        let len = 16 + body;
        let (header, _) = reply::decode(&rest[..len]).unwrap();
        assert_eq!(
            (header.len as usize, header.error, header.unique),
            (len, 0, unique)
        );
        rest = &rest[len..];
    }
    assert!(rest.is_empty());
}

#[test]
fn reply_header_for_writev_counts_the_body() {
    let header = reply::header(Unique(3), 4096).unwrap();
    let decoded = OutHeader::read_from(&header).unwrap();
    assert_eq!(
        decoded,
        OutHeader {
            len: 4112,
            error: 0,
            unique: 3
        }
    );
    assert_eq!(
        reply::header(Unique(3), usize::MAX),
        Err(Error::TooLong { len: usize::MAX })
    );
}

#[test]
fn errno_is_limited_to_what_the_kernel_accepts() {
    assert_eq!(Errno::new(0), None);
    assert_eq!(Errno::new(-5), None);
    assert_eq!(Errno::new(512), None);
    assert_eq!(Errno::new(511).map(Errno::code), Some(511));
    assert_eq!(Errno::new_or_eio(4096), Errno::EIO);
    assert_eq!(Errno::ENOSYS.code(), 38);
}

#[test]
fn reply_decode_checks_the_length() {
    assert_eq!(
        reply::decode(&[0; 15]),
        Err(Error::TruncatedReply { len: 15 })
    );
    let mut out = Vec::new();
    reply::empty(&mut out, Unique(2));
    out.push(0);
    assert_eq!(
        reply::decode(&out),
        Err(Error::ReplyLengthMismatch {
            header_len: 16,
            buffer_len: 17
        })
    );
}

// ---------------------------------------------------------------------------------------------
// Round trips of every decoded operation.

#[test]
fn every_operation_round_trips() {
    let data = b"some bytes";
    let forgets: Vec<u8> = [
        ForgetOne {
            nodeid: 2,
            nlookup: 1,
        },
        ForgetOne {
            nodeid: 3,
            nlookup: 9,
        },
    ]
    .iter()
    .flat_map(|f| f.to_vec())
    .collect();
    let read = ReadIn {
        fh: 1,
        offset: 2,
        size: 4096,
        read_flags: ReadFlags::LOCKOWNER,
        lock_owner: 3,
        flags: 2,
    };
    let release = ReleaseIn {
        fh: 1,
        flags: 2,
        release_flags: ReleaseFlags::FLUSH,
        lock_owner: 4,
    };
    let fsync = FsyncIn {
        fh: 1,
        fsync_flags: FsyncFlags::FDATASYNC,
    };
    let open = OpenIn {
        flags: 0o2,
        open_flags: OpenInFlags::KILL_SUIDGID,
    };
    let ops = [
        Operation::Init(InitIn {
            major: 7,
            minor: 45,
            max_readahead: 1 << 17,
            flags: (InitFlags::ASYNC_READ | InitFlags::INIT_EXT).low(),
            flags2: InitFlags::HAS_RESEND.high(),
            unused: [0; 11],
            layout: InitInLayout::Extended,
            extra: &[],
        }),
        Operation::Destroy,
        Operation::Lookup { name: name("file") },
        Operation::Forget(ForgetIn { nlookup: 3 }),
        Operation::BatchForget(ForgetList::from_bytes(&forgets).unwrap()),
        Operation::Getattr(GetattrIn {
            getattr_flags: GetattrFlags::FH,
            fh: 9,
        }),
        Operation::Setattr(SetattrIn {
            valid: SetattrValid::SIZE | SetattrValid::MTIME,
            size: 10,
            mtime: 11,
            mtimensec: 12,
            uid: 13,
            gid: 14,
            ..SetattrIn::default()
        }),
        Operation::Readlink,
        Operation::Symlink {
            name: name("link"),
            target: name("../target"),
        },
        Operation::Mknod {
            arg: MknodIn {
                mode: 0o10_644,
                rdev: 0,
                umask: 0o22,
            },
            name: name("fifo"),
        },
        Operation::Mkdir {
            arg: MkdirIn {
                mode: 0o755,
                umask: 0o22,
            },
            name: name("dir"),
        },
        Operation::Unlink { name: name("gone") },
        Operation::Rmdir {
            name: name("gone-dir"),
        },
        Operation::Rename {
            arg: RenameIn { newdir: 8 },
            name: name("a"),
            new_name: name("b"),
        },
        Operation::Rename2 {
            arg: Rename2In {
                newdir: 8,
                flags: 1,
            },
            name: name("a"),
            new_name: name("b"),
        },
        Operation::Link {
            arg: LinkIn { oldnodeid: 6 },
            name: name("hard"),
        },
        Operation::Open(open),
        Operation::Opendir(open),
        Operation::Create {
            arg: CreateIn {
                flags: 0o101,
                mode: 0o100_600,
                umask: 0o77,
                open_flags: OpenInFlags::EMPTY,
            },
            name: name("new"),
        },
        Operation::Read(read),
        Operation::Readdir(read),
        Operation::Readdirplus(read),
        Operation::Write {
            arg: WriteIn {
                fh: 1,
                offset: 4,
                size: data.len() as u32,
                ..WriteIn::default()
            },
            data,
        },
        Operation::Statfs,
        Operation::Release(release),
        Operation::Releasedir(release),
        Operation::Flush(FlushIn {
            fh: 1,
            lock_owner: 2,
        }),
        Operation::Fsync(fsync),
        Operation::Fsyncdir(fsync),
        Operation::Interrupt(InterruptIn { unique: 0x10 }),
        Operation::Unknown {
            opcode: Opcode::GETXATTR,
            payload: b"\x10\0\0\0\0\0\0\0user.x\0",
        },
    ];
    for op in ops {
        let bytes = encode(op);
        let request = decode(&bytes).unwrap_or_else(|e| panic!("{op:?}: {e}"));
        assert_eq!(request.op, op);
        assert_eq!(request.header.opcode, op.opcode());
        assert_eq!(request.header.len as usize, bytes.len());
        assert_eq!(request.header.unique, Unique(0x10));
        assert_eq!(
            (request.header.uid, request.header.gid, request.header.pid),
            (1000, 100, 4242)
        );
        roundtrip_check(&bytes);
    }
}

#[test]
fn extensions_are_split_off_the_arguments() {
    // A supplementary-group extension: fuse_ext_header (size, type FUSE_EXT_GROUPS = 32),
    // then fuse_supp_groups with one group, padded to 8 bytes.
    let mut ext = Vec::new();
    for v in [16u32, 32, 1, 1234] {
        ext.extend_from_slice(&v.to_ne_bytes());
    }
    let op = Operation::Mkdir {
        arg: MkdirIn {
            mode: 0o755,
            umask: 0,
        },
        name: name("d"),
    };
    let bytes = encode_with(op, &ext);
    let request = decode(&bytes).unwrap();
    assert_eq!(request.header.total_extlen, 2);
    assert_eq!(request.op, op);
    assert_eq!(request.extensions, ext.as_slice());

    let mut out = Vec::new();
    let odd = Request {
        header: header(),
        op,
        extensions: &ext[..12],
    };
    assert_eq!(
        odd.encode(&mut out),
        Err(Error::ExtensionsLayout { len: 12 })
    );
    assert!(
        out.is_empty(),
        "a failed encode leaves the buffer as it was"
    );
}

#[test]
fn unknown_opcodes_keep_the_header() {
    let bytes = encode(Operation::Unknown {
        opcode: Opcode(9999),
        payload: b"xyz",
    });
    let request = decode(&bytes).unwrap();
    assert_eq!(
        request.op,
        Operation::Unknown {
            opcode: Opcode(9999),
            payload: b"xyz"
        }
    );
    assert_eq!(request.header.unique, Unique(0x10));
    assert_eq!(request.header.nodeid, 5);
    assert_eq!(request.op.opcode().to_string(), "opcode 9999");
}

// ---------------------------------------------------------------------------------------------
// Every decoder error.

#[test]
fn truncated_header_is_an_error() {
    for len in [0, 1, 39] {
        assert_eq!(
            decode(&vec![0; len]).unwrap_err(),
            Error::TruncatedHeader { len }
        );
    }
}

#[test]
fn header_length_must_match_the_buffer() {
    let mut bytes = encode(Operation::Statfs);
    bytes.push(0);
    assert_eq!(
        decode(&bytes).unwrap_err(),
        Error::LengthMismatch {
            opcode: Opcode::STATFS,
            header_len: 40,
            buffer_len: 41
        }
    );
    let bytes = encode(Operation::Lookup { name: name("abc") });
    assert_eq!(
        decode(&bytes[..42]).unwrap_err(),
        Error::LengthMismatch {
            opcode: Opcode::LOOKUP,
            header_len: 44,
            buffer_len: 42
        }
    );
}

#[test]
fn missing_nul_is_an_error() {
    let mut bytes = encode(Operation::Lookup { name: name("abc") });
    bytes.pop();
    fix_len(&mut bytes);
    assert_eq!(
        decode(&bytes).unwrap_err(),
        Error::MissingNul {
            opcode: Opcode::LOOKUP,
            what: "name"
        }
    );

    let mut bytes = encode(Operation::Symlink {
        name: name("l"),
        target: name("t"),
    });
    bytes.pop();
    fix_len(&mut bytes);
    let err = decode(&bytes).unwrap_err();
    assert_eq!(
        err,
        Error::MissingNul {
            opcode: Opcode::SYMLINK,
            what: "link target"
        }
    );
    assert_eq!(
        err.to_string(),
        "SYMLINK: link target has no terminating NUL"
    );

    let mut bytes = encode(Operation::Rename {
        arg: RenameIn { newdir: 1 },
        name: name("a"),
        new_name: name("b"),
    });
    bytes.pop();
    fix_len(&mut bytes);
    assert_eq!(
        decode(&bytes).unwrap_err(),
        Error::MissingNul {
            opcode: Opcode::RENAME,
            what: "new name"
        }
    );
}

#[test]
fn short_struct_is_an_error() {
    let mut bytes = encode(Operation::Getattr(GetattrIn::default()));
    bytes.truncate(40 + 8);
    fix_len(&mut bytes);
    let err = decode(&bytes).unwrap_err();
    assert_eq!(
        err,
        Error::ShortStruct {
            opcode: Opcode::GETATTR,
            what: "fuse_getattr_in",
            need: 16,
            have: 8
        }
    );
    assert_eq!(
        err.to_string(),
        "GETATTR: fuse_getattr_in needs 16 bytes but 8 remain"
    );
    assert_eq!(err.opcode(), Some(Opcode::GETATTR));

    // A MKNOD as a kernel older than 7.12 would send it (FUSE_COMPAT_MKNOD_IN_SIZE).
    let mut bytes = encode(Operation::Statfs);
    bytes[4..8].copy_from_slice(&Opcode::MKNOD.0.to_ne_bytes());
    bytes.extend_from_slice(&[0; COMPAT_MKNOD_IN_SIZE]);
    fix_len(&mut bytes);
    assert!(matches!(
        decode(&bytes).unwrap_err(),
        Error::ShortStruct {
            opcode: Opcode::MKNOD,
            what: "fuse_mknod_in",
            need: 16,
            have: 8
        }
    ));
}

#[test]
fn write_size_must_match_the_data() {
    let data = b"12345";
    let oversize = encode(Operation::Write {
        arg: WriteIn {
            size: 6,
            ..WriteIn::default()
        },
        data,
    });
    assert_eq!(
        decode(&oversize).unwrap_err(),
        Error::WriteSizeMismatch {
            opcode: Opcode::WRITE,
            size: 6,
            data: 5
        }
    );
    let huge = encode(Operation::Write {
        arg: WriteIn {
            size: u32::MAX,
            ..WriteIn::default()
        },
        data,
    });
    assert!(matches!(
        decode(&huge).unwrap_err(),
        Error::WriteSizeMismatch { .. }
    ));
    let undersize = encode(Operation::Write {
        arg: WriteIn {
            size: 4,
            ..WriteIn::default()
        },
        data,
    });
    assert!(matches!(
        decode(&undersize).unwrap_err(),
        Error::WriteSizeMismatch { .. }
    ));
}

#[test]
fn trailing_bytes_are_an_error() {
    let mut bytes = encode(Operation::Lookup { name: name("a") });
    bytes.push(b'x');
    fix_len(&mut bytes);
    assert_eq!(
        decode(&bytes).unwrap_err(),
        Error::TrailingBytes {
            opcode: Opcode::LOOKUP,
            extra: 1
        }
    );
    let mut bytes = encode(Operation::Forget(ForgetIn { nlookup: 1 }));
    bytes.extend_from_slice(&[0; 8]);
    fix_len(&mut bytes);
    assert_eq!(
        decode(&bytes).unwrap_err(),
        Error::TrailingBytes {
            opcode: Opcode::FORGET,
            extra: 8
        }
    );
}

#[test]
fn extensions_longer_than_the_payload_are_an_error() {
    let mut bytes = encode(Operation::Lookup { name: name("abc") });
    bytes[36..38].copy_from_slice(&1u16.to_ne_bytes());
    assert_eq!(
        decode(&bytes).unwrap_err(),
        Error::ExtensionsTooLong {
            opcode: Opcode::LOOKUP,
            extlen: 8,
            payload: 4
        }
    );
}

#[test]
fn batch_forget_count_must_match_the_entries() {
    let one = ForgetOne {
        nodeid: 2,
        nlookup: 1,
    }
    .to_vec();
    let mut bytes = encode(Operation::BatchForget(
        ForgetList::from_bytes(&one).unwrap(),
    ));
    bytes[40..44].copy_from_slice(&2u32.to_ne_bytes());
    assert_eq!(
        decode(&bytes).unwrap_err(),
        Error::ForgetCountMismatch {
            opcode: Opcode::BATCH_FORGET,
            count: 2,
            bytes: 16
        }
    );
    bytes[40..44].copy_from_slice(&u32::MAX.to_ne_bytes());
    assert!(matches!(
        decode(&bytes).unwrap_err(),
        Error::ForgetCountMismatch { .. }
    ));
    bytes[40..44].copy_from_slice(&1u32.to_ne_bytes());
    bytes.push(0);
    fix_len(&mut bytes);
    assert!(matches!(
        decode(&bytes).unwrap_err(),
        Error::ForgetCountMismatch { .. }
    ));
    assert!(ForgetList::from_bytes(&[0; 17]).is_none());
}

#[test]
fn init_of_an_odd_size_is_an_error() {
    for len in [0, 4, 12, 20, 63] {
        let mut bytes = encode(Operation::Destroy);
        bytes[4..8].copy_from_slice(&Opcode::INIT.0.to_ne_bytes());
        bytes.extend_from_slice(&vec![0; len]);
        fix_len(&mut bytes);
        assert_eq!(
            decode(&bytes).unwrap_err(),
            Error::InitInSize {
                opcode: Opcode::INIT,
                len
            },
            "{len}"
        );
    }
}

#[test]
fn names_with_nul_do_not_encode() {
    let mut out = vec![1, 2];
    let request = Request {
        header: header(),
        op: Operation::Lookup {
            name: OsStr::from_bytes(b"a\0b"),
        },
        extensions: &[],
    };
    assert_eq!(
        request.encode(&mut out),
        Err(Error::NameHasNul { what: "name" })
    );
    assert_eq!(out, [1, 2]);
}

// ---------------------------------------------------------------------------------------------
// INIT of every layout.

fn init_request(payload: &[u8]) -> Vec<u8> {
    let mut bytes = encode(Operation::Destroy);
    bytes[4..8].copy_from_slice(&Opcode::INIT.0.to_ne_bytes());
    bytes.extend_from_slice(payload);
    fix_len(&mut bytes);
    bytes
}

fn words(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

#[test]
fn init_before_7_36_has_no_flags2() {
    let flags = (InitFlags::ASYNC_READ | InitFlags::BIG_WRITES | InitFlags::MAX_PAGES).low();
    let bytes = init_request(&words(&[7, 31, 131_072, flags]));
    let Operation::Init(init) = decode(&bytes).unwrap().op else {
        panic!()
    };
    assert_eq!(init.layout, InitInLayout::Compat);
    assert_eq!(
        (init.major, init.minor, init.max_readahead),
        (7, 31, 131_072)
    );
    assert_eq!(init.flags2, 0);
    assert_eq!(
        init.capabilities(),
        InitFlags::ASYNC_READ | InitFlags::BIG_WRITES | InitFlags::MAX_PAGES
    );
    assert_eq!(init.reply_minor(), 31);
    roundtrip_check(&bytes);
}

#[test]
fn init_before_7_6_has_only_versions() {
    let bytes = init_request(&words(&[7, 5]));
    let Operation::Init(init) = decode(&bytes).unwrap().op else {
        panic!()
    };
    assert_eq!(init.layout, InitInLayout::Minimal);
    assert_eq!(
        (init.major, init.minor, init.max_readahead, init.flags),
        (7, 5, 0, 0)
    );
    roundtrip_check(&bytes);
}

#[test]
fn init_flags2_counts_only_with_init_ext() {
    let mut payload = words(&[
        7,
        45,
        0,
        InitFlags::ASYNC_READ.low(),
        InitFlags::HAS_RESEND.high(),
    ]);
    payload.extend_from_slice(&[0; 44]);
    let bytes = init_request(&payload);
    let Operation::Init(init) = decode(&bytes).unwrap().op else {
        panic!()
    };
    assert_eq!(init.layout, InitInLayout::Extended);
    assert_eq!(init.flags2, InitFlags::HAS_RESEND.high());
    assert_eq!(
        init.capabilities(),
        InitFlags::ASYNC_READ,
        "no INIT_EXT: flags2 ignored"
    );

    let ext = (InitFlags::ASYNC_READ | InitFlags::INIT_EXT).low();
    let mut payload = words(&[7, 45, 0, ext, InitFlags::HAS_RESEND.high()]);
    payload.extend_from_slice(&words(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]));
    payload.extend_from_slice(b"future");
    let bytes = init_request(&payload);
    let Operation::Init(init) = decode(&bytes).unwrap().op else {
        panic!()
    };
    assert!(
        init.capabilities()
            .contains(InitFlags::HAS_RESEND | InitFlags::ASYNC_READ)
    );
    assert_eq!(init.unused, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
    assert_eq!(init.extra, b"future");
    assert_eq!(init.reply_minor(), 45);
    roundtrip_check(&bytes);
}

#[test]
fn init_reply_is_cut_to_the_kernels_size_and_marks_flags2() {
    let body = InitOut {
        major: 7,
        minor: 45,
        flags: InitFlags::ASYNC_READ | InitFlags::ALLOW_IDMAP,
        max_write: 1 << 20,
        request_timeout: 30,
        ..InitOut::default()
    };
    assert_eq!(
        body.wire_flags(),
        InitFlags::ASYNC_READ | InitFlags::ALLOW_IDMAP | InitFlags::INIT_EXT
    );
    let mut out = Vec::new();
    reply::init(&mut out, Unique(2), &body, 45);
    assert_eq!(out.len(), 16 + 64);
    let decoded = InitOut::decode(&out[16..]).unwrap();
    assert_eq!(decoded.flags, body.wire_flags());
    assert_eq!(decoded.request_timeout, 30);
    // flags2 sits at offset 32 of fuse_init_out, request_timeout at 40.
    assert_eq!(
        out[16 + 32..16 + 36],
        InitFlags::ALLOW_IDMAP.high().to_ne_bytes()
    );
    assert_eq!(out[16 + 40..16 + 42], 30u16.to_ne_bytes());

    out.clear();
    reply::init(&mut out, Unique(2), &body, 22);
    assert_eq!(out.len(), 16 + 24);
    assert_eq!(InitOut::decode(&out[16..]).unwrap().max_write, 1 << 20);
    out.clear();
    reply::init(&mut out, Unique(2), &body, 4);
    assert_eq!(out.len(), 16 + 8);
    assert_eq!(
        InitOut::decode(&[0; 30]),
        Err(Error::InitOutSize { len: 30 })
    );
}

// ---------------------------------------------------------------------------------------------
// Init records.

fn negotiated_record() -> (Vec<u8>, Vec<u8>) {
    let flags = (InitFlags::ASYNC_READ | InitFlags::MAX_PAGES | InitFlags::INIT_EXT).low();
    let mut payload = words(&[7, 45, 131_072, flags, InitFlags::HAS_RESEND.high()]);
    payload.extend_from_slice(&[0; 44]);
    let request = init_request(&payload);
    let mut reply_bytes = Vec::new();
    let body = InitOut {
        major: 7,
        minor: 45,
        max_readahead: 131_072,
        flags: InitFlags::ASYNC_READ | InitFlags::MAX_PAGES | InitFlags::BIG_WRITES,
        max_write: 1 << 20,
        max_pages: 256,
        ..InitOut::default()
    };
    reply::init(&mut reply_bytes, Unique(0x10), &body, 45);
    (request, reply_bytes)
}

#[test]
fn init_record_accessors_report_the_negotiation() {
    let (request, reply_bytes) = negotiated_record();
    let record = InitRecord::new(request.clone(), reply_bytes.clone()).unwrap();
    assert_eq!((record.major(), record.minor()), (7, 45));
    assert_eq!((record.kernel_major(), record.kernel_minor()), (7, 45));
    assert!(record.has_resend());
    // BIG_WRITES was not offered: not negotiated. INIT_EXT is only the carrier of flags2.
    assert_eq!(record.flags(), InitFlags::ASYNC_READ | InitFlags::MAX_PAGES);
    assert!(record.reply_flags().contains(InitFlags::BIG_WRITES));
    assert_eq!(record.max_write(), 1 << 20);
    assert_eq!(record.max_pages(), Some(256));
    assert_eq!(record.read_buffer_size(), (1 << 20) + 80);
    assert_eq!(record.request_bytes(), request.as_slice());
    assert_eq!(record.reply_bytes(), reply_bytes.as_slice());
}

#[test]
fn init_record_round_trips_its_format() {
    let (request, reply_bytes) = negotiated_record();
    let record = InitRecord::new(request, reply_bytes).unwrap();
    let encoded = record.encode();
    assert_eq!(InitRecord::decode(&encoded).unwrap(), record);
    roundtrip_check(&encoded);
}

#[test]
fn init_record_reads_format_version_1() {
    // Written field by field, independently of `encode`: the format a successor must keep
    // reading.
    let (request, reply_bytes) = negotiated_record();
    let mut v1 = Vec::new();
    v1.extend_from_slice(b"FUSEINIT");
    v1.extend_from_slice(&[1, 0, 0, 0]);
    v1.extend_from_slice(&(request.len() as u32).to_le_bytes());
    v1.extend_from_slice(&(reply_bytes.len() as u32).to_le_bytes());
    v1.extend_from_slice(&request);
    v1.extend_from_slice(&reply_bytes);
    let record = InitRecord::decode(&v1).unwrap();
    assert_eq!(record.max_write(), 1 << 20);
    assert!(record.has_resend());
    assert_eq!(record.encode(), v1);
}

#[test]
fn init_record_refuses_what_was_not_a_negotiated_init() {
    let (request, reply_bytes) = negotiated_record();
    let good = InitRecord::new(request.clone(), reply_bytes.clone())
        .unwrap()
        .encode();

    assert_eq!(
        InitRecord::decode(b"short"),
        Err(Error::RecordLength {
            len: 5,
            expected: 20
        })
    );
    let mut bad = good.clone();
    bad[0] = b'X';
    assert_eq!(InitRecord::decode(&bad), Err(Error::RecordMagic));
    let mut bad = good.clone();
    bad[8] = 2;
    assert_eq!(
        InitRecord::decode(&bad),
        Err(Error::RecordVersion { version: 2 })
    );
    let mut bad = good.clone();
    bad.push(0);
    assert!(matches!(
        InitRecord::decode(&bad),
        Err(Error::RecordLength { .. })
    ));
    assert!(matches!(
        InitRecord::decode(&good[..good.len() - 1]),
        Err(Error::RecordLength { .. })
    ));

    let lookup = encode(Operation::Lookup { name: name("x") });
    assert_eq!(
        InitRecord::new(lookup, reply_bytes.clone()),
        Err(Error::NotInit {
            opcode: Opcode::LOOKUP
        })
    );
    let mut failed = Vec::new();
    reply::error(&mut failed, Unique(0x10), Errno::EPROTO);
    assert_eq!(
        InitRecord::new(request.clone(), failed),
        Err(Error::InitFailed { error: -71 })
    );
    let mut other = reply_bytes.clone();
    other[8..16].copy_from_slice(&0x12u64.to_ne_bytes());
    assert_eq!(
        InitRecord::new(request.clone(), other),
        Err(Error::UniqueMismatch {
            request: 0x10,
            reply: 0x12
        })
    );
    assert_eq!(
        InitRecord::new(request, reply_bytes[..40].to_vec()),
        Err(Error::ReplyLengthMismatch {
            header_len: 80,
            buffer_len: 40
        })
    );
}

// ---------------------------------------------------------------------------------------------
// Unique.

#[test]
fn unique_exposes_the_interrupt_and_resend_bits() {
    let plain = Unique(0x20);
    assert!(!plain.is_interrupt() && !plain.is_resend());
    assert_eq!(plain.id(), 0x20);

    let interrupt = Unique(0x21);
    assert!(interrupt.is_interrupt() && !interrupt.is_resend());
    assert_eq!(interrupt.id(), 0x20);

    let resent = Unique(0x8000_0000_0000_0020);
    assert!(resent.is_resend() && !resent.is_interrupt());
    assert_eq!(resent.id(), 0x20);
    assert_eq!(
        resent.raw(),
        0x8000_0000_0000_0020,
        "the reply carries the raw value"
    );
    assert_eq!(format!("{resent:?}"), "Unique(32, resend)");

    let mut bytes = encode(Operation::Statfs);
    bytes[8..16].copy_from_slice(&0x8000_0000_0000_0021u64.to_ne_bytes());
    let request = decode(&bytes).unwrap();
    assert!(request.header.unique.is_resend() && request.header.unique.is_interrupt());
    let mut out = Vec::new();
    reply::empty(&mut out, request.header.unique);
    assert_eq!(out[8..16], 0x8000_0000_0000_0021u64.to_ne_bytes());
}

// ---------------------------------------------------------------------------------------------
// Directory buffers.

fn parse_dirents(bytes: &[u8], plus: bool) -> Vec<(u64, u64, u32, Vec<u8>)> {
    let mut entries = Vec::new();
    let mut rest = bytes;
    let skip = if plus { 128 } else { 0 };
    while !rest.is_empty() {
        let d = &rest[skip..];
        let ino = u64::from_ne_bytes(d[0..8].try_into().unwrap());
        let off = u64::from_ne_bytes(d[8..16].try_into().unwrap());
        let namelen = u32::from_ne_bytes(d[16..20].try_into().unwrap()) as usize;
        let kind = u32::from_ne_bytes(d[20..24].try_into().unwrap());
        let name = d[24..24 + namelen].to_vec();
        let size = if plus {
            direntplus_size(namelen)
        } else {
            dirent_size(namelen)
        };
        assert!(
            rest[skip + 24 + namelen..size].iter().all(|&b| b == 0),
            "zero padding"
        );
        entries.push((ino, off, kind, name));
        rest = &rest[size..];
    }
    entries
}

#[test]
fn dirents_are_aligned_to_8_bytes() {
    let mut buf = DirBuffer::new(4096);
    for (i, n) in ["a", "bb", "ccccccc", "dddddddd", "eeeeeeeee"]
        .iter()
        .enumerate()
    {
        let entry = DirEntry {
            ino: i as u64 + 2,
            off: i as u64 + 1,
            kind: dirent_type(0o40_755),
            name: name(n),
        };
        assert!(buf.push(&entry).unwrap());
    }
    // 24 + name, rounded up to 8: 32, 32, 32, 32, 40.
    assert_eq!(buf.len(), 32 + 32 + 32 + 32 + 40);
    assert_eq!(buf.entries(), 5);
    let parsed = parse_dirents(buf.as_bytes(), false);
    assert_eq!(parsed[4], (6, 5, 4, b"eeeeeeeee".to_vec()));
    assert_eq!(dirent_type(0o100_644), 8);
}

#[test]
fn dirent_that_fits_exactly_is_taken_and_one_byte_more_is_not() {
    let entry = DirEntry {
        ino: 2,
        off: 1,
        kind: 8,
        name: name("exactly8"),
    };
    let mut exact = DirBuffer::new(32);
    assert!(exact.push(&entry).unwrap());
    assert_eq!(exact.len(), 32);
    let next = DirEntry {
        name: name("x"),
        ..entry
    };
    assert!(!exact.push(&next).unwrap());
    assert_eq!(
        exact.len(),
        32,
        "a refused entry leaves the buffer unchanged"
    );

    let mut short = DirBuffer::new(31);
    assert!(!short.push(&entry).unwrap());
    assert!(short.is_empty());
    assert_eq!(short.entries(), 0);

    // The padding counts: a 1-byte name needs 32 bytes, not 25.
    let mut padded = DirBuffer::new(25);
    assert!(!padded.push(&next).unwrap());
}

#[test]
fn direntplus_carries_the_entry_reply_first() {
    let entry_out = EntryOut {
        nodeid: 9,
        generation: 1,
        attr: Attr {
            ino: 9,
            ..Attr::default()
        },
        ..EntryOut::default()
    };
    let entry = DirEntry {
        ino: 9,
        off: 3,
        kind: 8,
        name: name("file"),
    };
    let mut buf = DirPlusBuffer::new(direntplus_size(4) as u32);
    assert!(buf.push(&entry, &entry_out).unwrap());
    assert_eq!(buf.len(), 160);
    assert_eq!(EntryOut::read_from(buf.as_bytes()), Some(entry_out));
    assert_eq!(
        parse_dirents(buf.as_bytes(), true),
        vec![(9, 3, 8, b"file".to_vec())]
    );
    assert!(!buf.push(&entry, &entry_out).unwrap());
    assert_eq!(buf.entries(), 1);
    assert_eq!(buf.limit(), 160);
}

#[test]
fn invalid_dirent_names_are_refused() {
    let long = vec![b'n'; NAME_MAX + 1];
    let max = vec![b'n'; NAME_MAX];
    let mut buf = DirBuffer::new(1 << 16);
    for bad in [&b""[..], b"a/b", b"a\0b", &long] {
        let entry = DirEntry {
            ino: 2,
            off: 1,
            kind: 8,
            name: OsStr::from_bytes(bad),
        };
        assert_eq!(
            buf.push(&entry),
            Err(Error::InvalidDirentName { len: bad.len() })
        );
    }
    let entry = DirEntry {
        ino: 2,
        off: 1,
        kind: 8,
        name: OsStr::from_bytes(&max),
    };
    assert!(buf.push(&entry).unwrap());
    assert_eq!(buf.len(), dirent_size(NAME_MAX));
}

// ---------------------------------------------------------------------------------------------
// Notifications.

#[test]
fn resend_notification_is_a_bare_header() {
    let mut out = Vec::new();
    notify::resend(&mut out);
    let mut expected = Vec::new();
    expected.extend_from_slice(&16u32.to_ne_bytes());
    expected.extend_from_slice(&7i32.to_ne_bytes());
    expected.extend_from_slice(&0u64.to_ne_bytes());
    assert_eq!(out, expected);
}

#[test]
fn invalidation_notifications_carry_their_bodies() {
    let mut out = Vec::new();
    notify::inval_inode(&mut out, 12, 0, -1);
    let (header, body) = reply::decode(&out).unwrap();
    assert_eq!((header.len, header.error, header.unique), (40, 2, 0));
    assert_eq!(
        NotifyInvalInodeOut::read_from(body),
        Some(NotifyInvalInodeOut {
            ino: 12,
            off: 0,
            len: -1
        })
    );

    out.clear();
    notify::inval_entry(&mut out, 1, name("gone"), InvalEntryFlags::EXPIRE_ONLY).unwrap();
    let (header, body) = reply::decode(&out).unwrap();
    assert_eq!((header.len, header.error), (16 + 16 + 5, 3));
    assert_eq!(
        NotifyInvalEntryOut::read_from(body),
        Some(NotifyInvalEntryOut {
            parent: 1,
            namelen: 4,
            flags: InvalEntryFlags::EXPIRE_ONLY
        })
    );
    assert_eq!(&body[16..], b"gone\0");

    let mut out = vec![9];
    assert_eq!(
        notify::inval_entry(
            &mut out,
            1,
            OsStr::from_bytes(b"a\0"),
            InvalEntryFlags::EMPTY
        ),
        Err(Error::NameHasNul { what: "name" })
    );
    assert_eq!(out, [9]);
}

// ---------------------------------------------------------------------------------------------
// Numbers.

#[test]
fn opcodes_have_the_kernel_numbers_and_names() {
    let expected = [
        (Opcode::LOOKUP, 1, "LOOKUP"),
        (Opcode::FORGET, 2, "FORGET"),
        (Opcode::GETATTR, 3, "GETATTR"),
        (Opcode::SETATTR, 4, "SETATTR"),
        (Opcode::READLINK, 5, "READLINK"),
        (Opcode::SYMLINK, 6, "SYMLINK"),
        (Opcode::MKNOD, 8, "MKNOD"),
        (Opcode::MKDIR, 9, "MKDIR"),
        (Opcode::UNLINK, 10, "UNLINK"),
        (Opcode::RMDIR, 11, "RMDIR"),
        (Opcode::RENAME, 12, "RENAME"),
        (Opcode::LINK, 13, "LINK"),
        (Opcode::OPEN, 14, "OPEN"),
        (Opcode::READ, 15, "READ"),
        (Opcode::WRITE, 16, "WRITE"),
        (Opcode::STATFS, 17, "STATFS"),
        (Opcode::RELEASE, 18, "RELEASE"),
        (Opcode::FSYNC, 20, "FSYNC"),
        (Opcode::FLUSH, 25, "FLUSH"),
        (Opcode::INIT, 26, "INIT"),
        (Opcode::OPENDIR, 27, "OPENDIR"),
        (Opcode::READDIR, 28, "READDIR"),
        (Opcode::RELEASEDIR, 29, "RELEASEDIR"),
        (Opcode::FSYNCDIR, 30, "FSYNCDIR"),
        (Opcode::CREATE, 35, "CREATE"),
        (Opcode::INTERRUPT, 36, "INTERRUPT"),
        (Opcode::DESTROY, 38, "DESTROY"),
        (Opcode::BATCH_FORGET, 42, "BATCH_FORGET"),
        (Opcode::READDIRPLUS, 44, "READDIRPLUS"),
        (Opcode::RENAME2, 45, "RENAME2"),
        (Opcode::COPY_FILE_RANGE_64, 53, "COPY_FILE_RANGE_64"),
    ];
    for (opcode, number, label) in expected {
        assert_eq!(opcode.0, number);
        assert_eq!(opcode.name(), Some(label));
        assert_eq!(opcode.to_string(), label);
    }
    assert_eq!(Opcode(7).name(), None, "7 was never assigned");
    assert_eq!(format!("{:?}", Opcode(54)), "Opcode(54)");
}

#[test]
fn init_flags_have_the_kernel_bits() {
    let bits = [
        (InitFlags::ASYNC_READ, 0),
        (InitFlags::POSIX_LOCKS, 1),
        (InitFlags::ATOMIC_O_TRUNC, 3),
        (InitFlags::EXPORT_SUPPORT, 4),
        (InitFlags::BIG_WRITES, 5),
        (InitFlags::DONT_MASK, 6),
        (InitFlags::SPLICE_WRITE, 7),
        (InitFlags::SPLICE_MOVE, 8),
        (InitFlags::SPLICE_READ, 9),
        (InitFlags::FLOCK_LOCKS, 10),
        (InitFlags::HAS_IOCTL_DIR, 11),
        (InitFlags::AUTO_INVAL_DATA, 12),
        (InitFlags::DO_READDIRPLUS, 13),
        (InitFlags::READDIRPLUS_AUTO, 14),
        (InitFlags::ASYNC_DIO, 15),
        (InitFlags::WRITEBACK_CACHE, 16),
        (InitFlags::NO_OPEN_SUPPORT, 17),
        (InitFlags::PARALLEL_DIROPS, 18),
        (InitFlags::HANDLE_KILLPRIV, 19),
        (InitFlags::POSIX_ACL, 20),
        (InitFlags::ABORT_ERROR, 21),
        (InitFlags::MAX_PAGES, 22),
        (InitFlags::CACHE_SYMLINKS, 23),
        (InitFlags::NO_OPENDIR_SUPPORT, 24),
        (InitFlags::EXPLICIT_INVAL_DATA, 25),
        (InitFlags::MAP_ALIGNMENT, 26),
        (InitFlags::SUBMOUNTS, 27),
        (InitFlags::HANDLE_KILLPRIV_V2, 28),
        (InitFlags::SETXATTR_EXT, 29),
        (InitFlags::INIT_EXT, 30),
        (InitFlags::INIT_RESERVED, 31),
        (InitFlags::SECURITY_CTX, 32),
        (InitFlags::HAS_INODE_DAX, 33),
        (InitFlags::CREATE_SUPP_GROUP, 34),
        (InitFlags::HAS_EXPIRE_ONLY, 35),
        (InitFlags::DIRECT_IO_ALLOW_MMAP, 36),
        (InitFlags::PASSTHROUGH, 37),
        (InitFlags::NO_EXPORT_SUPPORT, 38),
        (InitFlags::HAS_RESEND, 39),
        (InitFlags::ALLOW_IDMAP, 40),
        (InitFlags::OVER_IO_URING, 41),
        (InitFlags::REQUEST_TIMEOUT, 42),
    ];
    for (flag, bit) in bits {
        assert_eq!(flag.bits(), 1 << bit, "{flag:?}");
    }
    let split = InitFlags::HAS_RESEND | InitFlags::ASYNC_READ | InitFlags::INIT_EXT;
    assert_eq!(InitFlags::from_fields(split.low(), split.high()), split);
    assert_eq!(InitFlags::HAS_RESEND.high(), 1 << 7);
    assert_eq!(
        format!(
            "{:?}",
            InitFlags::ASYNC_READ | InitFlags::HAS_RESEND | InitFlags(1 << 50)
        ),
        "InitFlags(ASYNC_READ | HAS_RESEND | 0x4000000000000)"
    );
    assert_eq!(format!("{:?}", InitFlags::EMPTY), "InitFlags(empty)");
}

#[test]
fn other_flag_sets_have_the_kernel_bits() {
    assert_eq!(
        [
            FopenFlags::DIRECT_IO,
            FopenFlags::KEEP_CACHE,
            FopenFlags::NONSEEKABLE,
            FopenFlags::CACHE_DIR,
            FopenFlags::STREAM,
            FopenFlags::NOFLUSH,
            FopenFlags::PARALLEL_DIRECT_WRITES,
            FopenFlags::PASSTHROUGH,
        ]
        .map(FopenFlags::bits),
        [1, 2, 4, 8, 16, 32, 64, 128]
    );
    assert_eq!(
        [
            SetattrValid::MODE,
            SetattrValid::UID,
            SetattrValid::GID,
            SetattrValid::SIZE,
            SetattrValid::ATIME,
            SetattrValid::MTIME,
            SetattrValid::FH,
            SetattrValid::ATIME_NOW,
            SetattrValid::MTIME_NOW,
            SetattrValid::LOCKOWNER,
            SetattrValid::CTIME,
            SetattrValid::KILL_SUIDGID,
        ]
        .map(SetattrValid::bits),
        [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
    );
    assert_eq!(
        [
            WriteFlags::CACHE,
            WriteFlags::LOCKOWNER,
            WriteFlags::KILL_SUIDGID
        ]
        .map(WriteFlags::bits),
        [1, 2, 4]
    );
    assert_eq!(
        [ReleaseFlags::FLUSH, ReleaseFlags::FLOCK_UNLOCK].map(ReleaseFlags::bits),
        [1, 2]
    );
    assert_eq!(ReadFlags::LOCKOWNER.bits(), 2);
    assert_eq!(GetattrFlags::FH.bits(), 1);
    assert_eq!(FsyncFlags::FDATASYNC.bits(), 1);
    assert_eq!(OpenInFlags::KILL_SUIDGID.bits(), 1);
    assert_eq!(InvalEntryFlags::EXPIRE_ONLY.bits(), 1);
    assert_eq!(
        [AttrFlags::SUBMOUNT, AttrFlags::DAX].map(AttrFlags::bits),
        [1, 2]
    );
    assert_eq!(
        [
            NotifyCode::POLL,
            NotifyCode::INVAL_INODE,
            NotifyCode::INVAL_ENTRY,
            NotifyCode::STORE,
            NotifyCode::RETRIEVE,
            NotifyCode::DELETE,
            NotifyCode::RESEND,
            NotifyCode::INC_EPOCH,
            NotifyCode::PRUNE,
        ]
        .map(|c| c.0),
        [1, 2, 3, 4, 5, 6, 7, 8, 9]
    );
    assert_eq!((KERNEL_VERSION, KERNEL_MINOR_VERSION), (7, 45));
    assert_eq!(
        (ROOT_ID, MIN_READ_BUFFER, Unique::RESEND_BIT),
        (1, 8192, 1 << 63)
    );
}

#[test]
fn getattr_fh_is_present_only_with_its_flag() {
    assert_eq!(
        GetattrIn {
            getattr_flags: GetattrFlags::FH,
            fh: 3
        }
        .fh(),
        Some(3)
    );
    assert_eq!(
        GetattrIn {
            getattr_flags: GetattrFlags::EMPTY,
            fh: 3
        }
        .fh(),
        None
    );
}
