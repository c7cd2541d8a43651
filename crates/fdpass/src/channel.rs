//! The blocking channel, and the one-shot `sendmsg`/`recvmsg` steps it shares with the tokio
//! wrapper.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::{MaybeUninit, align_of, size_of};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use crate::frame::{self, Arrival, Checked, HEADER_LEN, MAX_FDS, MAX_PAYLOAD};
use crate::{Error, PeerCredentials};

/// One message: bytes whose meaning is the caller's, and the descriptors sent with them.
#[derive(Debug)]
pub struct Message {
    /// At most [`MAX_PAYLOAD`] bytes.
    pub payload: Vec<u8>,
    /// At most [`MAX_FDS`] descriptors, in the order the sender listed them, each close-on-exec.
    /// Each is a new descriptor for the same open file as the sender's.
    pub fds: Vec<OwnedFd>,
}

/// A connected unix seqpacket socket that carries [`Message`]s, blocking.
///
/// `send` and `recv` take `&self`: the kernel keeps each record whole, so threads may share a
/// channel, and two concurrent receivers each get whole frames.
#[derive(Debug)]
pub struct Channel {
    fd: OwnedFd,
    recv_fd_limit: usize,
}

impl Channel {
    /// Two channels connected to each other (`socketpair`), each close-on-exec.
    pub fn pair() -> Result<(Channel, Channel), Error> {
        let (a, b) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| Error::SocketPair { source: e.into() })?;
        Ok((Channel::from_connected(a), Channel::from_connected(b)))
    }

    /// Connects to a [`Listener`](crate::Listener) at `path`. Connecting needs write permission
    /// on the socket file, which a listener grants to its owner only.
    pub fn connect(path: impl AsRef<Path>) -> Result<Channel, Error> {
        let path = path.as_ref();
        let fail = |source: io::Error| Error::Connect {
            path: path.to_owned(),
            source,
        };
        let addr = SocketAddrUnix::new(path).map_err(|e| fail(e.into()))?;
        let fd = seqpacket_socket().map_err(fail)?;
        retry_interrupted(|| rustix::net::connect(&fd, &addr).map_err(io::Error::from))
            .map_err(fail)?;
        Ok(Channel::from_connected(fd))
    }

    /// Wraps a connected unix seqpacket socket, such as one inherited across `exec`. The socket
    /// should be in blocking mode; on a non-blocking one `send` and `recv` fail with
    /// `WouldBlock` instead of waiting.
    pub fn from_fd(fd: OwnedFd) -> Result<Channel, Error> {
        let not = |source: Option<io::Error>| Error::NotSeqpacket { source };
        let domain = rustix::net::sockopt::socket_domain(&fd).map_err(|e| not(Some(e.into())))?;
        let kind = rustix::net::sockopt::socket_type(&fd).map_err(|e| not(Some(e.into())))?;
        if domain != AddressFamily::UNIX || kind != SocketType::SEQPACKET {
            return Err(not(None));
        }
        Ok(Channel::from_connected(fd))
    }

    pub(crate) fn from_connected(fd: OwnedFd) -> Channel {
        Channel {
            fd,
            recv_fd_limit: MAX_FDS,
        }
    }

    /// Accept at most `limit` descriptors per message (at most [`MAX_FDS`], which is the
    /// default). The receive buffer holds exactly `limit`; a frame with more fails with
    /// [`Error::ControlTruncated`] after closing those that arrived, and the kernel drops the
    /// rest. A receiver that expects one `/dev/fuse` descriptor per message can cap what a peer
    /// may make it hold.
    #[must_use]
    pub fn with_recv_fd_limit(mut self, limit: usize) -> Channel {
        self.recv_fd_limit = limit.min(MAX_FDS);
        self
    }

    /// Sends one message: `payload` and a copy of each of `fds` (the same open files; the
    /// caller's descriptors stay open). The message arrives whole or not at all.
    ///
    /// Refuses more than [`MAX_FDS`] descriptors or more than [`MAX_PAYLOAD`] bytes before
    /// sending anything. Blocks while the socket's send buffer is full (the peer is not
    /// reading). Fails with
    /// [`Error::Send`] (`BrokenPipe`) when the peer has closed its end; never raises `SIGPIPE`.
    pub fn send(&self, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), Error> {
        let head = outgoing_header(payload, fds)?;
        let sent = retry_interrupted(|| {
            send_frame(self.fd.as_fd(), &head, payload, fds, SendFlags::empty())
        })
        .map_err(|source| Error::Send { source })?;
        check_sent(sent, payload.len())
    }

    /// Receives one message, blocking until one arrives. `Ok(None)` when the peer has closed its
    /// end and every message it sent has been read.
    ///
    /// On a bad frame ([`Error::is_bad_frame`]) every descriptor that arrived with it is closed
    /// before the error is returned, and the next call reads the next frame.
    pub fn recv(&self) -> Result<Option<Message>, Error> {
        let received = retry_interrupted(|| recv_frame(self.fd.as_fd(), self.recv_fd_limit, false))
            .map_err(|source| Error::Recv { source })?;
        received.into_message()
    }

    /// The credentials of the process that created the peer socket (`SO_PEERCRED`): for a
    /// listener's connection, the process that called `connect`, as it was at that moment.
    pub fn peer_credentials(&self) -> Result<PeerCredentials, Error> {
        crate::sys::peer_credentials(self.fd.as_fd())
            .map_err(|source| Error::PeerCredentials { source })
    }

    #[cfg(feature = "tokio")]
    pub(crate) fn recv_fd_limit(&self) -> usize {
        self.recv_fd_limit
    }
}

impl AsFd for Channel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Channel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl From<Channel> for OwnedFd {
    fn from(channel: Channel) -> OwnedFd {
        channel.fd
    }
}

/// Retries `f` while a signal interrupts it. Neither `sendmsg` nor `recvmsg` has moved any data
/// or descriptor when it fails with `EINTR`.
pub(crate) fn retry_interrupted<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            result => return result,
        }
    }
}

/// The header for `payload` and `fds`, or the error that refuses them.
pub(crate) fn outgoing_header(
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
) -> Result<[u8; HEADER_LEN], Error> {
    let fd_count = u16::try_from(fds.len())
        .ok()
        .filter(|_| fds.len() <= MAX_FDS)
        .ok_or(Error::TooManyFds { count: fds.len() })?;
    let payload_len = u32::try_from(payload.len())
        .ok()
        .filter(|_| payload.len() <= MAX_PAYLOAD)
        .ok_or(Error::PayloadTooLarge { len: payload.len() })?;
    Ok(frame::encode_header(payload_len, fd_count))
}

pub(crate) fn check_sent(sent: usize, payload_len: usize) -> Result<(), Error> {
    let expected = HEADER_LEN + payload_len;
    if sent == expected {
        Ok(())
    } else {
        Err(Error::IncompleteSend { sent, expected })
    }
}

/// One `sendmsg` of a frame. The caller has checked the limits.
pub(crate) fn send_frame(
    socket: BorrowedFd<'_>,
    head: &[u8; HEADER_LEN],
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
    flags: SendFlags,
) -> io::Result<usize> {
    let iov = [IoSlice::new(head), IoSlice::new(payload)];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "descriptors do not fit the control buffer",
        ));
    }
    // MSG_NOSIGNAL: a peer that has gone is an error to return, not a signal to die of.
    Ok(rustix::net::sendmsg(
        socket,
        &iov,
        &mut control,
        flags | SendFlags::NOSIGNAL,
    )?)
}

/// `sizeof(struct cmsghdr)`, which is already a multiple of its alignment: a `size_t` length
/// and two `int`s.
const CMSG_HEADER_LEN: usize = size_of::<usize>() + 2 * size_of::<i32>();
/// The alignment of `struct cmsghdr`, that of its `size_t` length.
const CMSG_ALIGN: usize = align_of::<usize>();
/// Room for one `SCM_RIGHTS` message of [`MAX_FDS`] descriptors, wherever the array lands.
const RECV_CONTROL_SPACE: usize = CMSG_ALIGN + CMSG_HEADER_LEN + MAX_FDS * size_of::<RawFd>();

/// A record as `recvmsg` left it. Dropping it closes its descriptors.
#[derive(Debug)]
pub(crate) struct Received {
    arrival: Arrival,
    head: [u8; HEADER_LEN],
    payload: Vec<u8>,
    fds: Vec<OwnedFd>,
}

impl Received {
    /// The message, or the error that refuses it; on error `self`, and with it every
    /// descriptor, is dropped here.
    pub(crate) fn into_message(mut self) -> Result<Option<Message>, Error> {
        match frame::check(&self.head, &self.arrival)? {
            Checked::End => Ok(None),
            Checked::Frame { payload_len } => {
                self.payload.truncate(payload_len);
                self.payload.shrink_to_fit();
                Ok(Some(Message {
                    payload: self.payload,
                    fds: self.fds,
                }))
            }
        }
    }
}

/// One `recvmsg` of a record, with room for at most `fd_limit` descriptors. `dont_wait` makes it
/// fail with `WouldBlock` instead of waiting.
pub(crate) fn recv_frame(
    socket: BorrowedFd<'_>,
    fd_limit: usize,
    dont_wait: bool,
) -> io::Result<Received> {
    let mut head = [0u8; HEADER_LEN];
    let mut payload = vec![0u8; MAX_PAYLOAD];
    let mut space = [MaybeUninit::<u8>::uninit(); RECV_CONTROL_SPACE];
    let mut control = RecvAncillaryBuffer::new(exact_control_space(&mut space, fd_limit));
    let mut flags = RecvFlags::CMSG_CLOEXEC;
    if dont_wait {
        flags |= RecvFlags::DONTWAIT;
    }
    let msg = {
        let mut iov = [IoSliceMut::new(&mut head), IoSliceMut::new(&mut payload)];
        rustix::net::recvmsg(socket, &mut iov, &mut control, flags)?
    };
    // Take ownership of every descriptor before looking at anything else, so that every path
    // from here on closes them by dropping.
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    Ok(Received {
        arrival: Arrival {
            len: msg.bytes.min(HEADER_LEN + MAX_PAYLOAD),
            truncated: msg.flags.contains(ReturnFlags::TRUNC),
            control_truncated: msg.flags.contains(ReturnFlags::CTRUNC),
            fds: fds.len(),
        },
        head,
        payload,
        fds,
    })
}

/// The part of `space` that holds exactly one `SCM_RIGHTS` message of `fd_limit` descriptors:
/// aligned for `struct cmsghdr`, and so long that the kernel's room count
/// (`(msg_controllen - sizeof(struct cmsghdr)) / sizeof(int)`) is `fd_limit`, no more.
fn exact_control_space(
    space: &mut [MaybeUninit<u8>; RECV_CONTROL_SPACE],
    fd_limit: usize,
) -> &mut [MaybeUninit<u8>] {
    if fd_limit == 0 {
        return &mut [];
    }
    let addr = space.as_ptr().addr();
    let skip = addr.next_multiple_of(CMSG_ALIGN) - addr;
    let len = CMSG_HEADER_LEN + fd_limit.min(MAX_FDS) * size_of::<RawFd>();
    &mut space[skip..skip + len]
}

/// A new, unbound, close-on-exec Unix seqpacket socket.
pub(crate) fn seqpacket_socket() -> io::Result<OwnedFd> {
    rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmsg_header_constants_match_rustix() {
        assert_eq!(rustix::cmsg_aligned_space!(ScmRights(0)), CMSG_HEADER_LEN);
        assert_eq!(
            rustix::cmsg_space!(ScmRights(0)),
            CMSG_HEADER_LEN + CMSG_ALIGN
        );
    }

    #[test]
    fn control_space_is_aligned_and_exact() {
        let mut space = [MaybeUninit::<u8>::uninit(); RECV_CONTROL_SPACE];
        for limit in [1, 2, 3, 252, MAX_FDS, MAX_FDS + 1, usize::MAX] {
            let slice = exact_control_space(&mut space, limit);
            assert_eq!(slice.as_ptr().addr() % CMSG_ALIGN, 0);
            assert_eq!(
                slice.len(),
                CMSG_HEADER_LEN + limit.min(MAX_FDS) * size_of::<RawFd>()
            );
        }
        assert!(exact_control_space(&mut space, 0).is_empty());
    }

    #[test]
    fn limits_are_checked_before_sending() {
        let (a, _b) = Channel::pair().unwrap();
        let fd = a.as_fd();
        assert!(matches!(
            outgoing_header(&[], &[fd; MAX_FDS + 1]),
            Err(Error::TooManyFds { count: 254 })
        ));
        assert!(matches!(
            outgoing_header(&vec![0; MAX_PAYLOAD + 1], &[]),
            Err(Error::PayloadTooLarge { len }) if len == MAX_PAYLOAD + 1
        ));
        assert!(outgoing_header(&vec![0; MAX_PAYLOAD], &[fd; MAX_FDS]).is_ok());
    }
}
