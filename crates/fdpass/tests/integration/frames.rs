//! Hand-crafted bad frames sent with a raw `sendmsg`. Each attaches the only copies of pipe read
//! ends, so that a write end failing with `EPIPE` afterwards proves the receiver closed every
//! descriptor that arrived with the refused frame. After each refusal a good frame still arrives:
//! the channel stays in step.

use std::os::fd::{AsFd, OwnedFd};

use fdpass::{Channel, Error, HEADER_LEN, MAGIC, MAX_PAYLOAD, VERSION};

use crate::{assert_in_step, borrowed, header, pipe, reader_closed, send_raw};

/// Sends `bytes` raw with `fds` fresh pipe read ends attached (dropping the sender's copies),
/// receives on a channel built by `receiver`, and returns the error after checking that every
/// attached read end is closed and that the channel is still in step.
fn refused_with(receiver: impl FnOnce(Channel) -> Channel, bytes: &[u8], fds: usize) -> Error {
    let (a, b) = Channel::pair().unwrap();
    let b = receiver(b);
    let (readers, writers): (Vec<OwnedFd>, Vec<OwnedFd>) = (0..fds).map(|_| pipe()).unzip();
    send_raw(a.as_fd(), bytes, &borrowed(&readers));
    drop(readers);
    for w in &writers {
        assert!(!reader_closed(w), "the copy in flight keeps the pipe open");
    }

    let error = b.recv().expect_err("the frame must be refused");
    assert!(error.is_bad_frame(), "{error:?}");
    for (i, w) in writers.iter().enumerate() {
        assert!(reader_closed(w), "descriptor {i} of {fds} is still open");
    }
    assert_in_step(&a, &b);
    error
}

fn refused(bytes: &[u8], fds: usize) -> Error {
    refused_with(|b| b, bytes, fds)
}

fn frame(head: Vec<u8>, payload: &[u8]) -> Vec<u8> {
    let mut bytes = head;
    bytes.extend_from_slice(payload);
    bytes
}

#[test]
fn a_well_formed_raw_frame_is_accepted() {
    // The baseline for the refusals below: the same hand-written header, every field right.
    let (a, b) = Channel::pair().unwrap();
    let (r, _w) = pipe();
    send_raw(
        a.as_fd(),
        &frame(header(&MAGIC, VERSION, 0, 5, 1, 0), b"hello"),
        &[r.as_fd()],
    );
    let message = b.recv().unwrap().unwrap();
    assert_eq!(message.payload, b"hello");
    assert_eq!(message.fds.len(), 1);
}

#[test]
fn wrong_magic_is_refused() {
    let error = refused(&frame(header(b"JFS!", VERSION, 0, 2, 1, 0), b"hi"), 1);
    assert!(matches!(error, Error::BadMagic { found } if &found == b"JFS!"));
}

#[test]
fn version_99_is_refused() {
    let error = refused(&frame(header(&MAGIC, 99, 0, 2, 1, 0), b"hi"), 1);
    assert!(matches!(error, Error::UnsupportedVersion { version: 99 }));
}

#[test]
fn unknown_flags_are_refused() {
    let error = refused(&frame(header(&MAGIC, VERSION, 1, 0, 1, 0), b""), 1);
    assert!(matches!(error, Error::UnknownFlags { flags: 1 }));
}

#[test]
fn a_nonzero_reserved_field_is_refused() {
    let error = refused(&frame(header(&MAGIC, VERSION, 0, 0, 1, 0x100), b""), 1);
    assert!(matches!(error, Error::ReservedNotZero { value: 0x100 }));
}

#[test]
fn a_length_longer_than_the_payload_is_refused() {
    let error = refused(&frame(header(&MAGIC, VERSION, 0, 10, 1, 0), b"short"), 1);
    assert!(matches!(
        error,
        Error::LengthMismatch {
            declared: 10,
            received: 5
        }
    ));
}

#[test]
fn a_length_shorter_than_the_payload_is_refused() {
    let error = refused(&frame(header(&MAGIC, VERSION, 0, 1, 1, 0), b"longer"), 1);
    assert!(matches!(
        error,
        Error::LengthMismatch {
            declared: 1,
            received: 6
        }
    ));
}

#[test]
fn a_count_of_2_with_1_descriptor_is_refused() {
    let error = refused(&frame(header(&MAGIC, VERSION, 0, 0, 2, 0), b""), 1);
    assert!(matches!(
        error,
        Error::FdCountMismatch {
            declared: 2,
            received: 1
        }
    ));
}

#[test]
fn a_count_of_1_with_3_descriptors_is_refused() {
    let error = refused(&frame(header(&MAGIC, VERSION, 0, 0, 1, 0), b""), 3);
    assert!(matches!(
        error,
        Error::FdCountMismatch {
            declared: 1,
            received: 3
        }
    ));
}

#[test]
fn descriptors_with_a_count_of_0_are_refused() {
    let error = refused(&frame(header(&MAGIC, VERSION, 0, 4, 0, 0), b"none"), 2);
    assert!(matches!(error, Error::UnexpectedFds { received: 2 }));
}

#[test]
fn a_record_shorter_than_the_header_is_refused() {
    let error = refused(&MAGIC, 1);
    assert!(matches!(error, Error::ShortFrame { len: 4 }));
}

#[test]
fn an_empty_record_with_descriptors_is_refused_not_read_as_the_end() {
    let error = refused(&[], 1);
    assert!(matches!(error, Error::ShortFrame { len: 0 }));
}

#[test]
fn a_record_over_the_largest_frame_is_truncated_and_refused() {
    let payload = vec![0u8; MAX_PAYLOAD + 1];
    let head = header(
        &MAGIC,
        VERSION,
        0,
        u32::try_from(payload.len()).unwrap(),
        1,
        0,
    );
    let error = refused(&frame(head, &payload), 1);
    assert!(matches!(error, Error::FrameTruncated { max } if max == HEADER_LEN + MAX_PAYLOAD));
}

#[test]
fn descriptors_beyond_the_receive_limit_are_control_truncated() {
    // A well-formed frame with 3 descriptors to a receiver that holds 1: the kernel installs
    // one, drops two, and sets MSG_CTRUNC; the one that arrived is closed too.
    let error = refused_with(
        |b| b.with_recv_fd_limit(1),
        &frame(header(&MAGIC, VERSION, 0, 0, 3, 0), b""),
        3,
    );
    assert!(matches!(error, Error::ControlTruncated { received: 1 }));
}

#[test]
fn a_receiver_that_takes_no_descriptors_refuses_any() {
    let error = refused_with(
        |b| b.with_recv_fd_limit(0),
        &frame(header(&MAGIC, VERSION, 0, 0, 1, 0), b""),
        1,
    );
    assert!(matches!(error, Error::ControlTruncated { received: 0 }));
}

#[test]
fn the_receive_limit_is_exact() {
    // Odd limits leave no slack for one more descriptor in the control buffer.
    for limit in [1, 2, 3, 5] {
        let (a, b) = Channel::pair().unwrap();
        let b = b.with_recv_fd_limit(limit);
        let (r, _w) = pipe();
        a.send(&[], &vec![r.as_fd(); limit]).unwrap();
        assert_eq!(b.recv().unwrap().unwrap().fds.len(), limit);
        a.send(&[], &vec![r.as_fd(); limit + 1]).unwrap();
        assert!(matches!(
            b.recv(),
            Err(Error::ControlTruncated { received }) if received == limit
        ));
    }
}
