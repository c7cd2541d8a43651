//! The same channel driven by tokio's reactor (feature `tokio`).

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use rustix::net::{SendFlags, SocketFlags};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::channel::{self, Message};
use crate::{Channel, Error, Listener, PeerCredentials};

/// A [`Channel`] whose `send` and `recv` wait for readiness instead of blocking a thread.
///
/// Frames, limits, checks and errors are those of [`Channel`]. The socket's own file status
/// flags stay as they were: each call passes `MSG_DONTWAIT` and waits on tokio's reactor when
/// the kernel would block, so [`AsyncChannel::into_inner`] gives back a blocking channel.
///
/// Both methods are cancel safe: a frame moves in one system call, so a future dropped before it
/// completes has sent or received nothing.
#[derive(Debug)]
pub struct AsyncChannel {
    inner: AsyncFd<Channel>,
}

impl AsyncChannel {
    /// Registers `channel` with the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime with I/O enabled (tokio's rule for `AsyncFd`).
    pub fn new(channel: Channel) -> Result<AsyncChannel, Error> {
        let inner = crate::sys::register(channel).map_err(|source| Error::Register { source })?;
        Ok(AsyncChannel { inner })
    }

    /// Like [`Channel::send`], waiting while the socket's send buffer is full.
    pub async fn send(&self, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), Error> {
        let head = channel::outgoing_header(payload, fds)?;
        let sent = self
            .inner
            .async_io(Interest::WRITABLE, |ch| {
                channel::retry_interrupted(|| {
                    channel::send_frame(ch.as_fd(), &head, payload, fds, SendFlags::DONTWAIT)
                })
            })
            .await
            .map_err(|source| Error::Send { source })?;
        channel::check_sent(sent, payload.len())
    }

    /// Like [`Channel::recv`], waiting for a frame to arrive.
    pub async fn recv(&self) -> Result<Option<Message>, Error> {
        let received = self
            .inner
            .async_io(Interest::READABLE, |ch| {
                channel::retry_interrupted(|| {
                    channel::recv_frame(ch.as_fd(), ch.recv_fd_limit(), true)
                })
            })
            .await
            .map_err(|source| Error::Recv { source })?;
        received.into_message()
    }

    /// Like [`Channel::peer_credentials`].
    pub fn peer_credentials(&self) -> Result<PeerCredentials, Error> {
        self.inner.get_ref().peer_credentials()
    }

    /// Deregisters the channel and gives it back, still blocking.
    pub fn into_inner(self) -> Channel {
        self.inner.into_inner()
    }
}

impl AsFd for AsyncChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.get_ref().as_fd()
    }
}

/// A [`Listener`] whose `accept` waits for readiness instead of blocking a thread.
#[derive(Debug)]
pub struct AsyncListener {
    inner: AsyncFd<Listener>,
}

impl AsyncListener {
    /// Makes `listener`'s socket non-blocking (`accept` has no per-call flag for it) and
    /// registers it with the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime with I/O enabled (tokio's rule for `AsyncFd`).
    pub fn new(listener: Listener) -> Result<AsyncListener, Error> {
        let path = listener.path().to_owned();
        rustix::io::ioctl_fionbio(&listener, true).map_err(|e| Error::Bind {
            path,
            source: e.into(),
        })?;
        let inner = crate::sys::register(listener).map_err(|source| Error::Register { source })?;
        Ok(AsyncListener { inner })
    }

    /// Waits for a connection and returns it as a close-on-exec [`AsyncChannel`].
    pub async fn accept(&self) -> Result<AsyncChannel, Error> {
        let fd = self
            .inner
            .async_io(Interest::READABLE, |listener| {
                channel::retry_interrupted(|| {
                    rustix::net::accept_with(listener, SocketFlags::CLOEXEC)
                        .map_err(io::Error::from)
                })
            })
            .await
            .map_err(|source| Error::Accept { source })?;
        AsyncChannel::new(Channel::from_connected(fd))
    }

    /// The path the socket is bound to.
    pub fn path(&self) -> &std::path::Path {
        self.inner.get_ref().path()
    }
}
