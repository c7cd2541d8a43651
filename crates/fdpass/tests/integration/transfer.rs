//! Well-formed messages: what arrives, and the limits on what may be sent.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use fdpass::{Channel, Error, MAX_FDS, MAX_PAYLOAD};
use rustix::fs::OFlags;
use rustix::io::FdFlags;

use crate::{assert_in_step, borrowed, pipe, reader_closed};

fn read_all(fd: OwnedFd) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    std::fs::File::from(fd).read_to_end(&mut out).unwrap();
    out
}

#[test]
fn pipe_read_end_sent_is_read_through_on_the_other_side() {
    let (a, b) = Channel::pair().unwrap();
    let (r, w) = pipe();
    a.send(b"here is a pipe", &[r.as_fd()]).unwrap();
    drop(r);

    let message = b.recv().unwrap().unwrap();
    assert_eq!(message.payload, b"here is a pipe");
    let [received]: [OwnedFd; 1] = message.fds.try_into().unwrap();
    rustix::io::write(&w, b"through the received end").unwrap();
    drop(w);
    assert_eq!(read_all(received), b"through the received end");
}

#[test]
fn received_descriptor_is_a_new_number_for_the_same_open_file() {
    let (a, b) = Channel::pair().unwrap();
    let (r, _w) = pipe();
    a.send(&[], &[r.as_fd()]).unwrap();
    let received = b.recv().unwrap().unwrap().fds.remove(0);

    assert_ne!(received.as_raw_fd(), r.as_raw_fd());
    let (ours, theirs) = (
        rustix::fs::fstat(&r).unwrap(),
        rustix::fs::fstat(&received).unwrap(),
    );
    assert_eq!((ours.st_dev, ours.st_ino), (theirs.st_dev, theirs.st_ino));
    // File status flags belong to the open file description, so a change through one
    // descriptor shows through the other only if both name the same description.
    assert!(
        !rustix::fs::fcntl_getfl(&r)
            .unwrap()
            .contains(OFlags::NONBLOCK)
    );
    rustix::fs::fcntl_setfl(&received, OFlags::NONBLOCK).unwrap();
    assert!(
        rustix::fs::fcntl_getfl(&r)
            .unwrap()
            .contains(OFlags::NONBLOCK)
    );
}

#[test]
fn received_descriptors_are_close_on_exec() {
    let (a, b) = Channel::pair().unwrap();
    let (r, w) = pipe();
    assert!(
        !rustix::io::fcntl_getfd(&r)
            .unwrap()
            .contains(FdFlags::CLOEXEC)
    );
    assert!(
        !rustix::io::fcntl_getfd(&w)
            .unwrap()
            .contains(FdFlags::CLOEXEC)
    );
    a.send(&[], &[r.as_fd(), w.as_fd()]).unwrap();
    let message = b.recv().unwrap().unwrap();
    assert_eq!(message.fds.len(), 2);
    for fd in &message.fds {
        assert!(
            rustix::io::fcntl_getfd(fd)
                .unwrap()
                .contains(FdFlags::CLOEXEC)
        );
    }
}

#[test]
fn descriptors_keep_their_order() {
    let (a, b) = Channel::pair().unwrap();
    let pipes: Vec<_> = (0..3).map(|_| pipe()).collect();
    let readers: Vec<_> = pipes.iter().map(|(r, _)| r.as_fd()).collect();
    a.send(b"three", &readers).unwrap();
    let message = b.recv().unwrap().unwrap();
    for (i, (_, w)) in pipes.iter().enumerate() {
        rustix::io::write(w, &[b'0' + u8::try_from(i).unwrap()]).unwrap();
    }
    for (i, fd) in message.fds.iter().enumerate() {
        let mut byte = [0u8; 1];
        rustix::io::read(fd, &mut byte).unwrap();
        assert_eq!(byte[0], b'0' + u8::try_from(i).unwrap());
    }
}

#[test]
fn zero_descriptors() {
    let (a, b) = Channel::pair().unwrap();
    a.send(b"bytes only", &[]).unwrap();
    let message = b.recv().unwrap().unwrap();
    assert_eq!(message.payload, b"bytes only");
    assert!(message.fds.is_empty());

    a.send(&[], &[]).unwrap();
    let empty = b.recv().unwrap().unwrap();
    assert!(empty.payload.is_empty() && empty.fds.is_empty());
}

#[test]
fn exactly_253_descriptors_arrive() {
    let (a, b) = Channel::pair().unwrap();
    let pipes: Vec<_> = (0..MAX_FDS).map(|_| pipe()).collect();
    let readers: Vec<_> = pipes.iter().map(|(r, _)| r.as_fd()).collect();
    a.send(b"many", &readers).unwrap();
    let message = b.recv().unwrap().unwrap();
    assert_eq!(message.fds.len(), MAX_FDS);
    for ((r, _), received) in pipes.iter().zip(&message.fds) {
        let (ours, theirs) = (
            rustix::fs::fstat(r).unwrap(),
            rustix::fs::fstat(received).unwrap(),
        );
        assert_eq!(ours.st_ino, theirs.st_ino);
    }
}

#[test]
fn descriptors_over_253_are_refused_with_nothing_sent() {
    let (a, b) = Channel::pair().unwrap();
    let (r, _w) = pipe();
    let fds = vec![r.as_fd(); MAX_FDS + 1];
    assert!(matches!(
        a.send(b"too many", &fds),
        Err(Error::TooManyFds { count: 254 })
    ));
    assert_in_step(&a, &b);
}

#[test]
fn payload_at_the_limit_arrives_whole() {
    let (a, b) = Channel::pair().unwrap();
    let payload: Vec<u8> = (0..MAX_PAYLOAD).map(|i| (i % 251) as u8).collect();
    let (r, _w) = pipe();
    a.send(&payload, &[r.as_fd()]).unwrap();
    let message = b.recv().unwrap().unwrap();
    assert_eq!(message.payload, payload);
    assert_eq!(message.fds.len(), 1);
}

#[test]
fn payload_over_the_limit_is_refused_with_nothing_sent() {
    let (a, b) = Channel::pair().unwrap();
    let (r, w) = pipe();
    let result = a.send(&vec![7; MAX_PAYLOAD + 1], &[r.as_fd()]);
    assert!(matches!(result, Err(Error::PayloadTooLarge { len }) if len == MAX_PAYLOAD + 1));
    drop(r);
    assert!(reader_closed(&w), "no copy of the read end is in flight");
    assert_in_step(&a, &b);
}

#[test]
fn peer_closed_is_ok_none_after_what_it_sent() {
    let (a, b) = Channel::pair().unwrap();
    a.send(b"one", &[]).unwrap();
    a.send(b"two", &[]).unwrap();
    drop(a);
    assert_eq!(b.recv().unwrap().unwrap().payload, b"one");
    assert_eq!(b.recv().unwrap().unwrap().payload, b"two");
    assert!(b.recv().unwrap().is_none());
    assert!(b.recv().unwrap().is_none(), "the end is sticky");
}

#[test]
fn descriptors_in_flight_to_a_peer_that_closes_are_closed() {
    let (a, b) = Channel::pair().unwrap();
    let (r, w) = pipe();
    a.send(&[], &[r.as_fd()]).unwrap();
    drop(r);
    assert!(!reader_closed(&w), "the copy in flight keeps the pipe open");
    drop(b);
    assert!(reader_closed(&w));
}

#[test]
fn send_to_a_closed_peer_is_broken_pipe_not_sigpipe() {
    let (a, b) = Channel::pair().unwrap();
    drop(b);
    match a.send(b"anyone?", &[]) {
        Err(Error::Send { source }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::BrokenPipe);
        }
        other => panic!("expected a send error, got {other:?}"),
    }
}

#[test]
fn from_fd_takes_seqpacket_sockets_only() {
    let (a, b) = Channel::pair().unwrap();
    let a = Channel::from_fd(OwnedFd::from(a)).unwrap();
    assert_in_step(&a, &b);

    let (stream, _other) = std::os::unix::net::UnixStream::pair().unwrap();
    assert!(matches!(
        Channel::from_fd(OwnedFd::from(stream)),
        Err(Error::NotSeqpacket { source: None })
    ));
    let (r, _w) = pipe();
    assert!(matches!(
        Channel::from_fd(r),
        Err(Error::NotSeqpacket { source: Some(_) })
    ));
}

#[test]
fn socketpair_peer_credentials_are_this_process() {
    let (a, _b) = Channel::pair().unwrap();
    let cred = a.peer_credentials().unwrap();
    assert_eq!(cred.pid, Some(std::process::id()));
    assert_eq!(cred.uid, rustix::process::geteuid().as_raw());
    assert_eq!(cred.gid, rustix::process::getegid().as_raw());
}

#[test]
fn channels_are_shared_between_threads() {
    let (a, b) = Channel::pair().unwrap();
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let a = &a;
            s.spawn(move || {
                for i in 0..25u8 {
                    let (r, _w) = pipe();
                    a.send(&[t, i], &borrowed(&[r])).unwrap();
                }
            });
        }
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..100 {
            let message = b.recv().unwrap().unwrap();
            assert_eq!(message.fds.len(), 1);
            assert!(seen.insert(message.payload));
        }
    });
}
