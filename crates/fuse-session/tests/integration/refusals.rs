//! Bad input to adoption and to RESEND: a typed error, and nothing changed. The descriptor
//! comes back open, with its flags as they were.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use fuse_session::{Error, ServeOptions, Session, notify_resend};
use fuse_wire::{
    InHeader, InitFlags, InitIn, InitInLayout, InitOut, InitRecord, Operation, Request, Unique,
};
use rustix::fs::{Mode, OFlags};

use crate::memfs::MemFs;
use crate::support::{MountPoint, bounded, options, runtime};

/// A record of an INIT exchange at protocol 7.`minor` in which the kernel offered `offered`.
fn record(minor: u32, offered: InitFlags) -> InitRecord {
    let mut request = Vec::new();
    Request {
        header: InHeader {
            unique: Unique(2),
            ..InHeader::default()
        },
        op: Operation::Init(InitIn {
            major: 7,
            minor,
            max_readahead: 131_072,
            flags: offered.low(),
            flags2: offered.high(),
            unused: [0; 11],
            layout: InitInLayout::Extended,
            extra: &[],
        }),
        extensions: &[],
    }
    .encode(&mut request)
    .unwrap();
    let out = InitOut {
        major: 7,
        minor,
        max_write: 1 << 20,
        ..InitOut::default()
    };
    let mut reply = Vec::new();
    fuse_wire::reply::init(&mut reply, Unique(2), &out, minor);
    InitRecord::new(request, reply).unwrap()
}

fn with_resend() -> InitFlags {
    InitFlags::INIT_EXT | InitFlags::HAS_RESEND
}

fn open(path: &str, flags: OFlags) -> OwnedFd {
    rustix::fs::open(path, flags | OFlags::CLOEXEC, Mode::empty()).unwrap()
}

/// The refused descriptor came back: the same number, the same flags.
fn unchanged(fd: &OwnedFd, raw: i32, flags: OFlags) {
    assert_eq!(fd.as_raw_fd(), raw);
    assert_eq!(rustix::fs::fcntl_getfl(fd).unwrap(), flags);
    assert!(!flags.contains(OFlags::NONBLOCK));
}

#[test]
fn adopting_what_is_not_dev_fuse_is_refused_and_changes_nothing() {
    let rt = runtime();
    let _entered = rt.enter();
    for path in ["/dev/null", "/"] {
        let fd = open(path, OFlags::RDONLY);
        let (raw, flags) = (fd.as_raw_fd(), rustix::fs::fcntl_getfl(&fd).unwrap());
        let refused = Session::adopt(
            fd,
            record(45, with_resend()),
            MemFs::new(),
            &ServeOptions::default(),
        )
        .unwrap_err();
        assert!(
            matches!(refused.error, Error::NotFuseDevice { .. }),
            "{path}: {:?}",
            refused.error
        );
        unchanged(&refused.fd, raw, flags);
    }
}

#[test]
fn bad_records_and_limits_are_refused_and_change_nothing() {
    let rt = runtime();
    let _entered = rt.enter();
    // Any descriptor will do: records and limits are checked before the descriptor.
    let mut fd = open("/dev/null", OFlags::RDONLY);
    let (raw, flags) = (fd.as_raw_fd(), rustix::fs::fcntl_getfl(&fd).unwrap());

    let good = record(45, with_resend()).encode();
    for bad in [&b"garbage"[..], &good[..good.len() - 1], &[]] {
        let refused =
            Session::adopt_encoded(fd, bad, MemFs::new(), &ServeOptions::default()).unwrap_err();
        assert!(
            matches!(refused.error, Error::Record { .. }),
            "{:?}",
            refused.error
        );
        fd = refused.fd;
        unchanged(&fd, raw, flags);
    }

    let refused = Session::adopt(
        fd,
        record(11, with_resend()),
        MemFs::new(),
        &ServeOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(
            refused.error,
            Error::UnsupportedProtocol {
                major: 7,
                minor: 11
            }
        ),
        "{:?}",
        refused.error
    );
    let fd = refused.fd;

    let refused = Session::adopt(
        fd,
        record(45, with_resend()),
        MemFs::new(),
        &ServeOptions { max_in_flight: 0 },
    )
    .unwrap_err();
    assert!(matches!(
        refused.error,
        Error::InvalidOption {
            option: "max_in_flight",
            ..
        }
    ));
    unchanged(&refused.fd, raw, flags);
}

#[test]
fn adopting_outside_a_runtime_is_refused() {
    let fd = open("/dev/null", OFlags::RDONLY);
    let raw = fd.as_raw_fd();
    let refused = Session::adopt(
        fd,
        record(45, with_resend()),
        MemFs::new(),
        &ServeOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(refused.error, Error::NoRuntime),
        "{:?}",
        refused.error
    );
    assert_eq!(refused.fd.as_raw_fd(), raw);
}

#[test]
fn resend_is_refused_without_the_kernel_capability_or_on_another_file() {
    let null = open("/dev/null", OFlags::WRONLY);
    let old_kernel = record(39, InitFlags::ASYNC_READ);
    assert!(!old_kernel.has_resend());
    assert!(matches!(
        notify_resend(null.as_fd(), &old_kernel),
        Err(Error::ResendUnsupported)
    ));
    // Nothing is written to a file that is not /dev/fuse.
    assert!(matches!(
        notify_resend(null.as_fd(), &record(45, with_resend())),
        Err(Error::NotFuseDevice { .. })
    ));
}

#[test]
fn a_bad_adoption_of_a_live_connection_changes_nothing() {
    if !test_support::private_mount_namespace_with_fuse(
        "a_bad_adoption_of_a_live_connection_changes_nothing",
    ) {
        return;
    }
    // A /dev/fuse descriptor never mounted: not O_NONBLOCK, and it stays so.
    let rt = runtime();
    let fresh = open(fuse_session::DEV_FUSE, OFlags::RDWR);
    let (raw, flags) = (fresh.as_raw_fd(), rustix::fs::fcntl_getfl(&fresh).unwrap());
    let refused = {
        let _entered = rt.enter();
        Session::adopt_encoded(fresh, b"FUSEINIT", MemFs::new(), &ServeOptions::default())
            .unwrap_err()
    };
    assert!(
        matches!(refused.error, Error::Record { .. }),
        "{:?}",
        refused.error
    );
    unchanged(&refused.fd, raw, flags);

    // A copy of a live session's descriptor, refused: the session serves on.
    let mnt = MountPoint::new();
    let session = rt
        .block_on(Session::mount(&mnt.path, &options(), MemFs::new()))
        .unwrap();
    let copy = session.descriptor().try_clone_to_owned().unwrap();
    let refused = {
        let _entered = rt.enter();
        Session::adopt_encoded(
            copy,
            b"not a record",
            MemFs::new(),
            &ServeOptions::default(),
        )
        .unwrap_err()
    };
    assert!(matches!(refused.error, Error::Record { .. }));
    drop(refused);
    let hello = mnt.file("hello");
    bounded("stat after the refusal", move || std::fs::metadata(hello)).unwrap();
    assert_eq!(session.counters().unexpected_inits, 0);

    mnt.unmount();
    crate::support::wait_ended(rt.handle(), &session);
}
