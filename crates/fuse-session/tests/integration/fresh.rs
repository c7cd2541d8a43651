//! A fresh mount: INIT, the calls an application makes, what the session answers itself.

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;

use fuse_session::{AGREED, Session};
use fuse_wire::{InitFlags, Opcode};

use crate::memfs::{DATA_LEN, HELLO, MemFs, data_byte};
use crate::support::{MountPoint, PROMPT, bounded, errno, mount_at, options, runtime};

#[test]
fn a_fresh_mount_serves_stat_read_write_readdir_and_statfs() {
    if !test_support::private_mount_namespace_with_fuse(
        "a_fresh_mount_serves_stat_read_write_readdir_and_statfs",
    ) {
        return;
    }
    let mnt = MountPoint::new();
    let rt = runtime();
    let handler = MemFs::new();
    let log = handler.log();
    let session = rt
        .block_on(Session::mount(&mnt.path, &options(), handler))
        .unwrap();

    assert_eq!(
        mount_at(&mnt.path),
        Some(("fuse.fuse-session-test".into(), "fuse-session-test".into()))
    );
    let record = session.record();
    assert_eq!(
        (record.major(), record.minor()),
        (7, fuse_wire::KERNEL_MINOR_VERSION)
    );
    assert_eq!(
        record.flags(),
        AGREED,
        "the kernel offers every agreed flag"
    );
    assert_eq!(record.max_write(), fuse_session::DEFAULT_MAX_WRITE);
    assert!(
        record.has_resend(),
        "Linux 6.9 and later offer FUSE_HAS_RESEND"
    );
    assert!(!record.reply_flags().contains(InitFlags::WRITEBACK_CACHE));

    let hello = mnt.file("hello");
    let meta = bounded("stat", move || std::fs::metadata(hello)).unwrap();
    assert_eq!(
        (meta.len(), meta.mode(), meta.ino()),
        (HELLO.len() as u64, 0o100_644, 2)
    );
    let hello = mnt.file("hello");
    assert_eq!(
        bounded("read", move || std::fs::read(hello)).unwrap(),
        HELLO
    );
    let data = mnt.file("data");
    let read = bounded("read 64 KiB", move || std::fs::read(data)).unwrap();
    assert_eq!(read.len(), DATA_LEN);
    assert!(read.iter().enumerate().all(|(i, &b)| b == data_byte(i)));

    // Create, write, read back; then truncate and rewrite through O_TRUNC (a SETATTR).
    let new = mnt.file("new");
    bounded("create and write", move || {
        let mut f = std::fs::File::create_new(&new)?;
        f.write_all(b"first version, long")?;
        std::fs::write(&new, b"second")?;
        let mut back = String::new();
        std::fs::File::open(&new)?.read_to_string(&mut back)?;
        Ok::<_, std::io::Error>(back)
    })
    .map(|back| assert_eq!(back, "second"))
    .unwrap();

    let root = mnt.path.clone();
    let mut names: Vec<String> = bounded("readdir", move || {
        std::fs::read_dir(root)?
            .map(|e| e.map(|e| e.file_name().into_string().unwrap()))
            .collect::<Result<Vec<_>, _>>()
    })
    .unwrap();
    names.sort();
    assert_eq!(names, ["data", "hello", "new", "stuck"]);
    assert!(
        log.count(Opcode::READDIRPLUS) > 0,
        "DO_READDIRPLUS: listings are READDIRPLUS"
    );

    let root = mnt.path.clone();
    let statfs = bounded("statfs", move || rustix::fs::statfs(&root)).unwrap();
    assert_eq!(
        (statfs.f_blocks, statfs.f_bfree, statfs.f_bavail),
        (1000, 500, 400)
    );

    // GETXATTR is not decoded: the session answers ENOSYS, and the kernel turns that into
    // EOPNOTSUPP and stops asking (it remembers `no_getxattr` for the connection).
    let getxattr = |mnt: &MountPoint| {
        let hello = mnt.file("hello");
        bounded("getxattr", move || {
            rustix::fs::getxattr(&hello, "user.test", &mut [0u8; 64])
        })
        .unwrap_err()
    };
    assert_eq!(getxattr(&mnt), rustix::io::Errno::OPNOTSUPP);
    let unsupported = session.counters().unsupported;
    assert!(unsupported >= 1, "GETXATTR was answered ENOSYS");
    assert_eq!(getxattr(&mnt), rustix::io::Errno::OPNOTSUPP);
    assert_eq!(
        session.counters().unsupported,
        unsupported,
        "after one ENOSYS the kernel answers by itself"
    );
    assert_eq!(log.count(Opcode::GETXATTR), 0, "never reaches the handler");

    // Every reply the kernel took is reported delivered, and no request without a reply
    // (FORGET) is reported at all.
    let replied = log.replied();
    let opens = replied.iter().filter(|r| r.0 == Opcode::OPEN).count();
    assert!(opens >= 3, "{replied:?}");
    assert_eq!(opens, log.count(Opcode::OPEN));
    assert!(
        replied.iter().all(|&(_, _, delivered)| delivered),
        "{replied:?}"
    );
    assert!(
        !replied
            .iter()
            .any(|r| r.0 == Opcode::FORGET || r.0 == Opcode::BATCH_FORGET)
    );

    let counters = session.counters();
    assert_eq!((counters.malformed, counters.unexpected_inits), (0, 0));
    assert_eq!(counters.replaced_replies, 0);
    assert_eq!(log.count(Opcode::INIT), 0, "INIT is the session's");

    mnt.unmount();
    rt.block_on(async { tokio::time::timeout(PROMPT, session.wait()).await })
        .unwrap()
        .unwrap();
    assert!(session.has_ended());
}

#[test]
fn a_failed_mount_mounts_nothing() {
    if !test_support::private_mount_namespace_with_fuse("a_failed_mount_mounts_nothing") {
        return;
    }
    let mnt = MountPoint::new();
    let rt = runtime();
    let missing = mnt.dir.path().join("missing");
    let e = rt
        .block_on(Session::mount(&missing, &options(), MemFs::new()))
        .unwrap_err();
    assert!(
        matches!(&e, fuse_session::Error::Mount { source, .. } if errno(source) == libc_enoent()),
        "{e:?}"
    );
    let bad = fuse_session::MountOptions {
        max_write: 1,
        ..options()
    };
    let e = rt
        .block_on(Session::mount(&mnt.path, &bad, MemFs::new()))
        .unwrap_err();
    assert!(
        matches!(
            e,
            fuse_session::Error::InvalidOption {
                option: "max_write",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(!crate::support::is_mounted(&mnt.path));
}

fn libc_enoent() -> i32 {
    rustix::io::Errno::NOENT.raw_os_error()
}
