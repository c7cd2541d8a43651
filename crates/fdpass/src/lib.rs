//! Messages of bytes plus open file descriptors over a unix socket, in versioned, checked frames.
//!
//! A FUSE connection lives as long as some process holds its `/dev/fuse` descriptor, not as
//! long as the process that mounted it. A mount owner therefore hands copies of its descriptors
//! to a long-lived keeper (and the keeper to the owner's successor), so the mount survives the
//! owner's upgrade or crash. gRPC cannot carry descriptors; this crate is the channel that can:
//! a [`Message`] is a payload of up to [`MAX_PAYLOAD`] bytes plus up to [`MAX_FDS`] descriptors,
//! sent with `SCM_RIGHTS` so that the receiver gets new descriptors for the *same* open files.
//! What a payload means is the caller's business (the keeper protocol is built on top).
//!
//! ```
//! use std::io::{Read, Write};
//! use std::os::fd::AsFd;
//!
//! let (owner, keeper) = fdpass::Channel::pair()?;
//!
//! // Send the read end of a pipe, then close ours: the keeper's copy keeps the pipe open.
//! let (reader, mut writer) = std::io::pipe()?;
//! owner.send(b"pipe v1", &[reader.as_fd()])?;
//! drop(reader);
//!
//! let message = keeper.recv()?.expect("the owner has not closed its end");
//! assert_eq!(message.payload, b"pipe v1");
//! let mut received = std::io::PipeReader::from(message.fds.into_iter().next().unwrap());
//!
//! writer.write_all(b"still connected")?;
//! drop(writer);
//! let mut text = String::new();
//! received.read_to_string(&mut text)?;
//! assert_eq!(text, "still connected");
//!
//! // Closing one end is an orderly end for the other.
//! drop(owner);
//! assert!(keeper.recv()?.is_none());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Between processes, the keeper binds a [`Listener`] and the owner calls [`Channel::connect`];
//! the keeper asks [`Channel::peer_credentials`] who connected.
//!
//! # Socket type: `SOCK_SEQPACKET`
//!
//! A seqpacket unix socket is connected like a stream socket and keeps record boundaries like
//! a datagram socket. Each frame is one `sendmsg` and one `recvmsg`: the header, the payload and
//! the descriptors arrive together or not at all, so a short read can never split a frame or
//! separate descriptors from the bytes that describe them, and no reassembly state exists that a
//! bad peer could put out of step. After a bad frame, the next `recv` starts at the next frame.
//! On a stream socket, descriptors ride on a byte range: a reader needs a length prefix, partial
//! reads, and care at every read about which bytes the descriptors came with. Unlike a datagram
//! socket, a seqpacket socket has `connect`/`accept`, `SO_PEERCRED` for the connecting process,
//! and an orderly end when the peer closes (`recv` returns `Ok(None)`, `send` fails with
//! `BrokenPipe`). The price is that one record must fit the sender's socket buffer, hence the
//! 64 KiB payload limit; the messages this crate is for are small.
//!
//! # Frame layout
//!
//! Every frame is one seqpacket record: a 16-byte header, then the payload. Integers are
//! little-endian.
//!
//! | Offset | Size | Field | Value |
//! |---:|---:|---|---|
//! | 0 | 4 | magic | [`MAGIC`], `TKFD` |
//! | 4 | 2 | format version | [`VERSION`], 1 |
//! | 6 | 2 | flags | 0; version 1 defines none |
//! | 8 | 4 | payload length | bytes after the header, at most [`MAX_PAYLOAD`] |
//! | 12 | 2 | descriptor count | descriptors attached with `SCM_RIGHTS`, at most [`MAX_FDS`] |
//! | 14 | 2 | reserved | 0 |
//! | 16 | n | payload | the caller's bytes |
//!
//! The receiver checks everything and refuses, each with its own [`Error`]: a record that the
//! kernel cut (`MSG_TRUNC`), descriptors the kernel dropped (`MSG_CTRUNC`: a full descriptor
//! table or a frame over the receiver's [limit](Channel::with_recv_fd_limit)), a record shorter
//! than the header, another magic, another version, any flag or reserved bit, a length that
//! disagrees with the bytes that arrived, and a descriptor count that disagrees with the
//! descriptors that arrived (including descriptors with a frame that declares none). On each of
//! these, every descriptor that did arrive is closed before the error is returned. No input from
//! the peer makes this crate panic.
//!
//! # Limits
//!
//! - [`MAX_PAYLOAD`]: 64 KiB of payload per message. [`Channel::send`] refuses more.
//! - [`MAX_FDS`]: 253 descriptors per message, the kernel's `SCM_MAX_FD`. `send` refuses more
//!   with [`Error::TooManyFds`] before sending anything: a message is never split.
//! - Every received descriptor is close-on-exec (`MSG_CMSG_CLOEXEC`), always, so none leaks into
//!   a child process.
//!
//! # What it does not do
//!
//! - Give payloads a meaning, match requests with replies, or retry: one message is one frame.
//! - Authenticate beyond what the kernel offers: a [`Listener`]'s socket file is 0600, so only
//!   its owner (and root) can connect, and [`Channel::peer_credentials`] reports the peer's pid,
//!   uid and gid for the caller to judge. Nothing is encrypted; nothing leaves the host.
//! - Abstract-namespace sockets (they have no file permissions) or sockets other than unix
//!   seqpacket ones.
//! - Run anywhere but Linux.
//!
//! # Async
//!
//! With the feature `tokio`, [`AsyncChannel`] and [`AsyncListener`] drive the same frames with
//! tokio's reactor (`AsyncFd` and readiness).
#![deny(missing_docs)]

mod channel;
mod error;
mod frame;
mod listener;
mod sys;

#[cfg(feature = "tokio")]
mod asynchronous;

pub use channel::{Channel, Message};
pub use error::Error;
pub use frame::{HEADER_LEN, MAGIC, MAX_FDS, MAX_PAYLOAD, VERSION};
pub use listener::Listener;

#[cfg(feature = "tokio")]
pub use asynchronous::{AsyncChannel, AsyncListener};

/// Who is at the other end of a unix socket (`SO_PEERCRED`), as seen from this process's
/// namespaces, captured when the connection was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerCredentials {
    /// The peer's process id, or `None` when the peer is in a pid namespace this process cannot
    /// see into (the kernel reports 0), such as a sibling container's. A pid can be reused once
    /// the peer exits; do not use it for anything but logs and checks made while connected.
    pub pid: Option<u32>,
    /// The peer's effective user id. A uid that has no mapping in this user namespace is the
    /// overflow uid (65534).
    pub uid: u32,
    /// The peer's effective group id, mapped like `uid`.
    pub gid: u32,
}

/// The sockets this crate registers with tokio: see the safety argument in `sys::register`.
#[cfg(feature = "tokio")]
pub(crate) trait Socket: std::os::fd::AsRawFd {}
#[cfg(feature = "tokio")]
impl Socket for Channel {}
#[cfg(feature = "tokio")]
impl Socket for Listener {}
