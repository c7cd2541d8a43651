//! The frame header: encoding and checking, with no I/O.
//!
//! The socket code hands [`check`] what `recvmsg` reported (how many bytes, which truncation
//! flags, how many descriptors) and the first [`HEADER_LEN`] bytes; everything a peer can get
//! wrong is decided here, where it is cheap to test exhaustively.

use crate::Error;

/// The first four bytes of every frame: `TKFD` ("TAK-OS file descriptors").
pub const MAGIC: [u8; 4] = *b"TKFD";

/// The frame format version this crate writes and the only one it reads.
pub const VERSION: u16 = 1;

/// Bytes in the fixed header that opens every frame.
pub const HEADER_LEN: usize = 16;

/// The largest payload of one message, in bytes (64 KiB).
///
/// A seqpacket record must fit the sender's socket send buffer whole (Linux refuses a larger
/// one with `EMSGSIZE`), and the default buffer (`net.core.wmem_default`) is 208 KiB, while an
/// unprivileged process cannot raise its own above `net.core.wmem_max`, also 208 KiB by default.
/// 64 KiB fits with room to spare on any default configuration.
pub const MAX_PAYLOAD: usize = 64 * 1024;

/// The most descriptors one message carries: the kernel's `SCM_MAX_FD`.
pub const MAX_FDS: usize = 253;

/// What `recvmsg` reported about one record, without its bytes or descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Arrival {
    /// Bytes placed in the buffers: at most `HEADER_LEN + MAX_PAYLOAD`.
    pub(crate) len: usize,
    /// `MSG_TRUNC`: the record was longer than the buffers and its tail was discarded.
    pub(crate) truncated: bool,
    /// `MSG_CTRUNC`: control data did not fit, so the kernel discarded descriptors.
    pub(crate) control_truncated: bool,
    /// Descriptors that did arrive.
    pub(crate) fds: usize,
}

/// What a well-formed arrival is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Checked {
    /// An empty record with nothing attached: the peer closed its end (or sent an empty record,
    /// which no conforming sender does and which is read the same way).
    End,
    /// A frame whose payload is the `payload_len` bytes after the header.
    Frame { payload_len: usize },
}

/// The header for a frame with `payload_len` bytes and `fd_count` descriptors.
pub(crate) fn encode_header(payload_len: u32, fd_count: u16) -> [u8; HEADER_LEN] {
    let mut head = [0u8; HEADER_LEN];
    head[0..4].copy_from_slice(&MAGIC);
    head[4..6].copy_from_slice(&VERSION.to_le_bytes());
    // 6..8 flags and 14..16 reserved stay zero in version 1.
    head[8..12].copy_from_slice(&payload_len.to_le_bytes());
    head[12..14].copy_from_slice(&fd_count.to_le_bytes());
    head
}

/// Checks one arrival against its header. `head` holds the first `min(arrival.len, HEADER_LEN)`
/// bytes of the record; the rest of it is not read.
///
/// The order matters: truncation first (a cut record proves nothing about its header), then the
/// end of the stream, then the header fields from the most basic (is this our protocol at all)
/// to the most specific.
pub(crate) fn check(head: &[u8; HEADER_LEN], arrival: &Arrival) -> Result<Checked, Error> {
    if arrival.control_truncated {
        return Err(Error::ControlTruncated {
            received: arrival.fds,
        });
    }
    if arrival.truncated {
        return Err(Error::FrameTruncated {
            max: HEADER_LEN + MAX_PAYLOAD,
        });
    }
    if arrival.len == 0 && arrival.fds == 0 {
        return Ok(Checked::End);
    }
    if arrival.len < HEADER_LEN {
        return Err(Error::ShortFrame { len: arrival.len });
    }
    let [
        m0,
        m1,
        m2,
        m3,
        v0,
        v1,
        f0,
        f1,
        l0,
        l1,
        l2,
        l3,
        c0,
        c1,
        r0,
        r1,
    ] = *head;
    let magic = [m0, m1, m2, m3];
    if magic != MAGIC {
        return Err(Error::BadMagic { found: magic });
    }
    let version = u16::from_le_bytes([v0, v1]);
    if version != VERSION {
        return Err(Error::UnsupportedVersion { version });
    }
    let flags = u16::from_le_bytes([f0, f1]);
    if flags != 0 {
        return Err(Error::UnknownFlags { flags });
    }
    let reserved = u16::from_le_bytes([r0, r1]);
    if reserved != 0 {
        return Err(Error::ReservedNotZero { value: reserved });
    }
    let declared_len = u32::from_le_bytes([l0, l1, l2, l3]);
    let received_len = arrival.len - HEADER_LEN;
    if usize::try_from(declared_len) != Ok(received_len) {
        return Err(Error::LengthMismatch {
            declared: declared_len,
            received: received_len,
        });
    }
    let declared_fds = u16::from_le_bytes([c0, c1]);
    if declared_fds == 0 && arrival.fds > 0 {
        return Err(Error::UnexpectedFds {
            received: arrival.fds,
        });
    }
    if usize::from(declared_fds) != arrival.fds {
        return Err(Error::FdCountMismatch {
            declared: declared_fds,
            received: arrival.fds,
        });
    }
    Ok(Checked::Frame {
        payload_len: received_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arrival(len: usize, fds: usize) -> Arrival {
        Arrival {
            len,
            truncated: false,
            control_truncated: false,
            fds,
        }
    }

    #[test]
    fn layout_is_the_documented_one() {
        let head = encode_header(0x0102_0304, 0x0506);
        assert_eq!(
            head,
            [
                b'T', b'K', b'F', b'D', 1, 0, 0, 0, 0x04, 0x03, 0x02, 0x01, 0x06, 0x05, 0, 0
            ]
        );
    }

    #[test]
    fn an_empty_arrival_is_the_end_unless_descriptors_or_truncation_came_with_it() {
        let head = [0; HEADER_LEN];
        assert_eq!(check(&head, &arrival(0, 0)).ok(), Some(Checked::End));
        assert!(matches!(
            check(&head, &arrival(0, 1)),
            Err(Error::ShortFrame { len: 0 })
        ));
        let mut cut = arrival(0, 0);
        cut.control_truncated = true;
        assert!(matches!(
            check(&head, &cut),
            Err(Error::ControlTruncated { received: 0 })
        ));
    }

    #[test]
    fn truncation_is_reported_before_anything_in_the_header() {
        let mut cut = arrival(HEADER_LEN + MAX_PAYLOAD, 2);
        cut.truncated = true;
        cut.control_truncated = true;
        assert!(matches!(
            check(&[0; HEADER_LEN], &cut),
            Err(Error::ControlTruncated { received: 2 })
        ));
        cut.control_truncated = false;
        assert!(matches!(
            check(&[0; HEADER_LEN], &cut),
            Err(Error::FrameTruncated { .. })
        ));
    }

    #[test]
    fn each_header_field_is_checked() {
        let good = encode_header(3, 1);
        let at = |i: usize, v: u8| {
            let mut h = good;
            h[i] = v;
            check(&h, &arrival(HEADER_LEN + 3, 1))
        };
        assert!(matches!(at(0, b'X'), Err(Error::BadMagic { found }) if &found == b"XKFD"));
        assert!(matches!(
            at(4, 99),
            Err(Error::UnsupportedVersion { version: 99 })
        ));
        assert!(matches!(
            at(5, 1),
            Err(Error::UnsupportedVersion { version: 0x0101 })
        ));
        assert!(matches!(
            at(7, 0x80),
            Err(Error::UnknownFlags { flags: 0x8000 })
        ));
        assert!(matches!(
            at(14, 1),
            Err(Error::ReservedNotZero { value: 1 })
        ));
        assert!(matches!(
            at(8, 4),
            Err(Error::LengthMismatch {
                declared: 4,
                received: 3
            })
        ));
        assert!(matches!(
            at(12, 2),
            Err(Error::FdCountMismatch {
                declared: 2,
                received: 1
            })
        ));
        assert!(matches!(
            at(12, 0),
            Err(Error::UnexpectedFds { received: 1 })
        ));
        assert_eq!(
            check(&good, &arrival(HEADER_LEN + 3, 1)).ok(),
            Some(Checked::Frame { payload_len: 3 })
        );
    }

    #[test]
    fn a_huge_declared_length_is_a_mismatch() {
        let head = encode_header(u32::MAX, 0);
        assert!(matches!(
            check(&head, &arrival(HEADER_LEN, 0)),
            Err(Error::LengthMismatch {
                declared: u32::MAX,
                received: 0
            })
        ));
    }

    proptest! {
        #[test]
        fn encoded_frames_check(payload_len in 0..=MAX_PAYLOAD, fds in 0..=MAX_FDS) {
            let head = encode_header(
                u32::try_from(payload_len).unwrap_or(u32::MAX),
                u16::try_from(fds).unwrap_or(u16::MAX),
            );
            prop_assert_eq!(
                check(&head, &arrival(HEADER_LEN + payload_len, fds)).ok(),
                Some(Checked::Frame { payload_len })
            );
        }

        /// Any arrival at all: no panic, and success only for a header that says exactly what
        /// arrived.
        #[test]
        fn arbitrary_arrivals_never_panic_and_only_exact_headers_pass(
            head in any::<[u8; HEADER_LEN]>(),
            len in 0..=HEADER_LEN + MAX_PAYLOAD,
            fds in 0..=MAX_FDS,
            truncated in any::<bool>(),
            control_truncated in any::<bool>(),
        ) {
            let a = Arrival { len, truncated, control_truncated, fds };
            match check(&head, &a) {
                Ok(Checked::End) => prop_assert!(len == 0 && fds == 0),
                Ok(Checked::Frame { payload_len }) => {
                    prop_assert!(!truncated && !control_truncated);
                    prop_assert_eq!(len, HEADER_LEN + payload_len);
                    let expected = encode_header(
                        u32::try_from(payload_len).unwrap_or(u32::MAX),
                        u16::try_from(fds).unwrap_or(u16::MAX),
                    );
                    prop_assert_eq!(head, expected);
                }
                Err(e) => prop_assert!(e.is_bad_frame()),
            }
        }
    }
}
