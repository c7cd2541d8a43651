//! The channel through its public API, over real sockets in one process: descriptors that stay
//! usable on the other side, the limits, every refusal of a hand-crafted bad frame (each closing
//! the descriptors that came with it), the listener's file mode and peer credentials, and the
//! tokio wrapper.
//!
//! One test needs root (a peer in another pid namespace); without root it prints `SKIPPED` and
//! returns, except when `CI=true`, where it fails.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly"
)]

#[cfg(feature = "tokio")]
mod asynchronous;
mod frames;
mod listener;
mod transfer;

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::io::Errno;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

/// A pipe whose ends are not close-on-exec, so that a close-on-exec received copy proves the
/// receiver set the flag. Returns (read end, write end).
pub(crate) fn pipe() -> (OwnedFd, OwnedFd) {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::empty()).unwrap()
}

/// A frame header written field by field, independently of the crate's encoder.
pub(crate) fn header(
    magic: &[u8; 4],
    version: u16,
    flags: u16,
    payload_len: u32,
    fd_count: u16,
    reserved: u16,
) -> Vec<u8> {
    let mut h = Vec::with_capacity(16);
    h.extend_from_slice(magic);
    h.extend_from_slice(&version.to_le_bytes());
    h.extend_from_slice(&flags.to_le_bytes());
    h.extend_from_slice(&payload_len.to_le_bytes());
    h.extend_from_slice(&fd_count.to_le_bytes());
    h.extend_from_slice(&reserved.to_le_bytes());
    h
}

/// One raw `sendmsg` of `bytes` with `fds` attached, bypassing the crate's checks.
pub(crate) fn send_raw(socket: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    }
    let sent = rustix::net::sendmsg(
        socket,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::empty(),
    )
    .unwrap();
    assert_eq!(sent, bytes.len());
}

/// Whether the pipe behind `write_end` has lost its last reader: a write fails with `EPIPE`
/// (the test harness ignores `SIGPIPE`). Writes one byte when it has not.
pub(crate) fn reader_closed(write_end: &OwnedFd) -> bool {
    match rustix::io::write(write_end, b"x") {
        Err(Errno::PIPE) => true,
        Ok(1) => false,
        other => panic!("unexpected write result {other:?}"),
    }
}

/// Sends a good frame from `from` and checks that `to` receives exactly it: the channel is in
/// step and nothing else was queued before it.
pub(crate) fn assert_in_step(from: &fdpass::Channel, to: &fdpass::Channel) {
    from.send(b"marker", &[]).unwrap();
    let message = to.recv().unwrap().unwrap();
    assert_eq!(message.payload, b"marker");
    assert!(message.fds.is_empty());
}

pub(crate) fn borrowed(fds: &[OwnedFd]) -> Vec<BorrowedFd<'_>> {
    fds.iter().map(AsFd::as_fd).collect()
}
