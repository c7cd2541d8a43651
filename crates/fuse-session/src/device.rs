//! `/dev/fuse` itself: opening it, recognising it, its `O_NONBLOCK` flag, reading one request,
//! writing one message, and `FUSE_NOTIFY_RESEND`.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use fuse_wire::InitRecord;
use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::Error;

/// The FUSE device.
pub const DEV_FUSE: &str = "/dev/fuse";

/// `/dev/fuse` is the misc character device 10:229 (`FUSE_MINOR` in `miscdevice.h`).
const FUSE_DEVICE: (u32, u32) = (10, 229);

/// Opens `/dev/fuse` for a new connection: `O_RDWR | O_CLOEXEC | O_NONBLOCK`.
///
/// `O_NONBLOCK` is set from the start rather than after INIT: the INIT request is then read
/// through the same readiness path as every later request, and no runtime thread ever sits in
/// a blocking read.
pub(crate) fn open() -> Result<OwnedFd, Error> {
    rustix::fs::open(
        DEV_FUSE,
        OFlags::RDWR | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| Error::OpenDevice {
        source: Error::io(e),
    })
}

/// Checks that `fd` is a `/dev/fuse` descriptor (character device 10:229). Reads only.
pub(crate) fn check_fuse_device(fd: BorrowedFd<'_>) -> Result<(), Error> {
    let stat = rustix::fs::fstat(fd).map_err(|e| Error::Descriptor {
        op: "fstat",
        source: Error::io(e),
    })?;
    let kind = FileType::from_raw_mode(stat.st_mode);
    let device = (
        rustix::fs::major(stat.st_rdev),
        rustix::fs::minor(stat.st_rdev),
    );
    if kind == FileType::CharacterDevice && device == FUSE_DEVICE {
        return Ok(());
    }
    Err(Error::NotFuseDevice {
        found: match kind {
            FileType::CharacterDevice | FileType::BlockDevice => {
                format!("{kind:?} {}:{}", device.0, device.1)
            }
            other => format!("{other:?}"),
        },
    })
}

/// Sets `O_NONBLOCK` on the open file description unless it is set already.
///
/// The flag belongs to the open file description, which every copy of the descriptor shares
/// (copies sent with `SCM_RIGHTS` included): setting it here sets it for every holder. Every
/// holder in this design tolerates it: a keeper never reads, and every session reads with
/// readiness and non-blocking reads.
pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>) -> Result<(), Error> {
    let failed = |op| {
        move |e| Error::Descriptor {
            op,
            source: Error::io(e),
        }
    };
    let flags = rustix::fs::fcntl_getfl(fd).map_err(failed("fcntl(F_GETFL)"))?;
    if !flags.contains(OFlags::NONBLOCK) {
        rustix::fs::fcntl_setfl(fd, flags | OFlags::NONBLOCK).map_err(failed("fcntl(F_SETFL)"))?;
    }
    Ok(())
}

/// Reads one request into `buf`: `Ok(Some(len))`, or `Ok(None)` when the connection is gone
/// (`ENODEV` after an unmount or an abort; `ECONNABORTED` when the kernel reports aborts that
/// way).
///
/// Waits for readiness while the queue is empty (`EAGAIN`), and retries `ENOENT` (the request
/// was interrupted while being read) and `EINTR`. Cancel-safe: a request is taken off the
/// kernel's queue only by a `read` that returns it, and nothing is awaited after that.
pub(crate) async fn read_request(
    fd: &AsyncFd<OwnedFd>,
    buf: &mut [u8],
) -> io::Result<Option<usize>> {
    loop {
        // A connection that goes away reports EPOLLERR, not EPOLLIN: wait for either.
        let mut ready = fd.ready(Interest::READABLE | Interest::ERROR).await?;
        let read = ready.try_io(|fd| match rustix::io::read(fd.get_ref(), &mut *buf) {
            Err(Errno::AGAIN) => Err(io::ErrorKind::WouldBlock.into()),
            other => Ok(other),
        });
        // `try_io` gives Err when the read would block (and forgets the readiness), and
        // Ok(Err) for an error of the closure's own, which it never returns.
        match read {
            Ok(Ok(Ok(len))) => return Ok(Some(len)),
            Ok(Ok(Err(Errno::NOENT | Errno::INTR))) | Err(_) => continue,
            Ok(Ok(Err(Errno::NODEV | Errno::CONNABORTED))) => return Ok(None),
            Ok(Ok(Err(e))) => return Err(Error::io(e)),
            Ok(Err(e)) => return Err(e),
        }
    }
}

/// Writes one whole message (a reply or a notification) in one `write`. Writes to
/// `/dev/fuse` never wait, `O_NONBLOCK` or not.
pub(crate) fn write_message(fd: BorrowedFd<'_>, message: &[u8]) -> io::Result<()> {
    loop {
        match rustix::io::write(fd, message) {
            Ok(written) if written == message.len() => return Ok(()),
            Ok(written) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("wrote {written} of {} bytes", message.len()),
                ));
            }
            Err(Errno::INTR) => continue,
            Err(e) => return Err(Error::io(e)),
        }
    }
}

/// Writes one reply made of a header and a body in one `writev`, without joining them.
pub(crate) fn write_message_vectored(
    fd: BorrowedFd<'_>,
    header: &[u8],
    body: &[u8],
) -> io::Result<()> {
    let total = header.len() + body.len();
    loop {
        let parts = [io::IoSlice::new(header), io::IoSlice::new(body)];
        match rustix::io::writev(fd, &parts) {
            Ok(written) if written == total => return Ok(()),
            Ok(written) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("wrote {written} of {total} bytes"),
                ));
            }
            Err(Errno::INTR) => continue,
            Err(e) => return Err(Error::io(e)),
        }
    }
}

/// Writes `FUSE_NOTIFY_RESEND` on `fd`: the kernel moves every request that was read from this
/// connection's device but not yet answered (by any holder of the descriptor, a dead one
/// included) back to its queue, and sends each again with
/// [`Unique::RESEND_BIT`](fuse_wire::Unique::RESEND_BIT) set in its `unique`.
///
/// Send it **before** a session starts reading the descriptor ([`Session::adopt`]): it also
/// requeues requests a live session is still working on, which would then be handled twice.
///
/// Refused with [`Error::ResendUnsupported`], writing nothing, when `record` shows the kernel
/// did not offer `FUSE_HAS_RESEND` (Linux 6.9 and later do).
///
/// [`Session::adopt`]: crate::Session::adopt
pub fn notify_resend(fd: BorrowedFd<'_>, record: &InitRecord) -> Result<(), Error> {
    if !record.has_resend() {
        return Err(Error::ResendUnsupported);
    }
    check_fuse_device(fd.as_fd())?;
    let mut message = Vec::new();
    fuse_wire::notify::resend(&mut message);
    write_message(fd, &message).map_err(|source| Error::Notify { source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_dev_fuse_is_a_fuse_device() {
        let null = rustix::fs::open("/dev/null", OFlags::RDONLY, Mode::empty()).unwrap();
        match check_fuse_device(null.as_fd()) {
            Err(Error::NotFuseDevice { found }) => assert_eq!(found, "CharacterDevice 1:3"),
            other => panic!("{other:?}"),
        }
        let dir = rustix::fs::open("/", OFlags::RDONLY, Mode::empty()).unwrap();
        match check_fuse_device(dir.as_fd()) {
            Err(Error::NotFuseDevice { found }) => assert_eq!(found, "Directory"),
            other => panic!("{other:?}"),
        }
        if let Ok(fuse) = rustix::fs::open(DEV_FUSE, OFlags::RDWR, Mode::empty()) {
            check_fuse_device(fuse.as_fd()).unwrap();
        }
    }

    #[test]
    fn nonblocking_is_set_once_and_kept() {
        let (reader, _writer) = io::pipe().unwrap();
        set_nonblocking(reader.as_fd()).unwrap();
        assert!(
            rustix::fs::fcntl_getfl(&reader)
                .unwrap()
                .contains(OFlags::NONBLOCK)
        );
        set_nonblocking(reader.as_fd()).unwrap();
        assert!(
            rustix::fs::fcntl_getfl(&reader)
                .unwrap()
                .contains(OFlags::NONBLOCK)
        );
    }
}
