//! The worker wire protocol: typed identities, limits, encoding and decoding.
//!
//! The messages themselves are the generated `crate::v1` types. This module adds what
//! both ends need around them: fixed-size identities ([`RequestId`], [`MountEpoch`]),
//! [`VolumeGeneration`] and [`FileId`], the HTTP path and content type, the size limits, and
//! encoding and decoding functions that validate the envelope and never panic, whatever the
//! bytes.
//!
//! ```
//! use lease_client::protocol::{self, AccessMode, FileId, RequestId, ROOT_INO};
//! use lease_client::v1;
//!
//! let request = v1::Request {
//!     volume_id: "vol-a".into(),
//!     volume_generation: 1,
//!     request_id: RequestId([7; 16]).0.to_vec(),
//!     mount_epoch: Vec::new(),
//!     access_mode: AccessMode::Rwx.into(),
//!     op: Some(v1::request::Op::Getattr(v1::GetattrRequest {
//!         file: Some(FileId { ino: ROOT_INO, inode_generation: 0 }.into()),
//!         handle: None,
//!     })),
//! };
//! let body = protocol::encode_request(&request);
//! let decoded = protocol::decode_request(body).unwrap();
//! assert_eq!(decoded.op.name(), "getattr");
//! assert_eq!(decoded.request_id, RequestId([7; 16]));
//! assert!(protocol::decode_request(&b"\xff garbage"[..]).is_err());
//! ```

use std::fmt;
use std::time::Duration;

use bytes::{Buf, Bytes};
use prost::Message as _;

use crate::v1;
use crate::v1::reply::Result as ReplyResult;
use crate::v1::request::Op;

/// The HTTP path every call is POSTed to.
pub const CALL_PATH: &str = "/takos.worker.v1/call";

/// The content type of request and reply bodies.
pub const CONTENT_TYPE: &str = "application/x-protobuf";

/// The most file data one request or reply may carry (1 MiB).
pub const MAX_DATA_BYTES: usize = 1 << 20;

/// The largest request or reply body either end accepts: one full data payload plus room for
/// the envelope and, for a `readdir plus` reply, many entries.
pub const MAX_MESSAGE_BYTES: usize = MAX_DATA_BYTES + (256 << 10);

/// The inode number of every volume's root directory.
pub const ROOT_INO: u64 = 1;

/// The inode generation of the volume root; it never changes.
pub const ROOT_INODE_GENERATION: u64 = 1;

/// The 16 random bytes that name one logical call; every retry repeats them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub [u8; 16]);

/// The 16 random bytes of one RWO mount session: the fencing token of a mount lease.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MountEpoch(pub [u8; 16]);

macro_rules! random_id {
    ($ty:ident, $what:literal) => {
        impl $ty {
            #[doc = concat!("A fresh ", $what, " from the operating system's random source.")]
            pub fn random() -> Result<Self, crate::Error> {
                let mut bytes = [0u8; 16];
                getrandom::fill(&mut bytes).map_err(|err| crate::Error::Random {
                    reason: err.to_string(),
                })?;
                Ok(Self(bytes))
            }

            #[doc = concat!("The ", $what, " in `bytes`, if it is exactly 16 bytes long.")]
            pub fn from_slice(bytes: &[u8]) -> Option<Self> {
                bytes.try_into().ok().map(Self)
            }

            /// The 16 bytes.
            pub fn as_bytes(&self) -> &[u8; 16] {
                &self.0
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                for byte in self.0 {
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
        }

        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($ty), "({})"), self)
            }
        }
    };
}

random_id!(RequestId, "request ID");
random_id!(MountEpoch, "mount epoch");

/// The incarnation of a volume, fixed by the manager when the volume is created. Not to be
/// confused with an [inode generation](FileId::inode_generation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VolumeGeneration(pub u64);

/// One file on the worker: its inode number and the generation of that number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    /// The worker's stable inode number; [`ROOT_INO`] for the volume root.
    pub ino: u64,
    /// Changes whenever the worker reuses `ino` for another file.
    pub inode_generation: u64,
}

impl From<FileId> for v1::FileId {
    fn from(id: FileId) -> Self {
        v1::FileId {
            ino: id.ino,
            inode_generation: id.inode_generation,
        }
    }
}

impl From<v1::FileId> for FileId {
    fn from(id: v1::FileId) -> Self {
        FileId {
            ino: id.ino,
            inode_generation: id.inode_generation,
        }
    }
}

/// The access mode as the protocol carries it.
pub use v1::AccessMode;

impl Op {
    /// The operation's name as the `.proto` spells it; bounded, so usable as a metric label.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Lookup(_) => "lookup",
            Op::Getattr(_) => "getattr",
            Op::Setattr(_) => "setattr",
            Op::Mknod(_) => "mknod",
            Op::Create(_) => "create",
            Op::Mkdir(_) => "mkdir",
            Op::Unlink(_) => "unlink",
            Op::Rmdir(_) => "rmdir",
            Op::Rename(_) => "rename",
            Op::Link(_) => "link",
            Op::Symlink(_) => "symlink",
            Op::Readlink(_) => "readlink",
            Op::Readdir(_) => "readdir",
            Op::Open(_) => "open",
            Op::Read(_) => "read",
            Op::Write(_) => "write",
            Op::Flush(_) => "flush",
            Op::Fsync(_) => "fsync",
            Op::Release(_) => "release",
            Op::RenewHandles(_) => "renew_handles",
            Op::Statfs(_) => "statfs",
            Op::WriteKillSuidgid(_) => "write_kill_suidgid",
            Op::OpenKillSuidgid(_) => "open_kill_suidgid",
            Op::ClaimMount(_) => "claim_mount",
            Op::RenewMount(_) => "renew_mount",
            Op::ReleaseMount(_) => "release_mount",
        }
    }

    /// True for operations that change nothing on the worker, so repeating one is harmless
    /// even without the worker's reply cache.
    pub fn is_read_only(&self) -> bool {
        matches!(
            self,
            Op::Lookup(_)
                | Op::Getattr(_)
                | Op::Readlink(_)
                | Op::Readdir(_)
                | Op::Read(_)
                | Op::Statfs(_)
        )
    }

    /// The file data the operation carries (a write) or asks for (a read), in bytes; zero for
    /// every other operation.
    pub fn data_len(&self) -> usize {
        match self {
            Op::Write(write) => write.data.len(),
            Op::WriteKillSuidgid(kill) => kill.write.as_ref().map_or(0, |write| write.data.len()),
            Op::Read(read) => usize::try_from(read.size).unwrap_or(usize::MAX),
            _ => 0,
        }
    }
}

impl ReplyResult {
    /// The name of the operation this result answers, or `"error"`.
    pub fn name(&self) -> &'static str {
        match self {
            ReplyResult::Error(_) => "error",
            ReplyResult::Lookup(_) => "lookup",
            ReplyResult::Getattr(_) => "getattr",
            ReplyResult::Setattr(_) => "setattr",
            ReplyResult::Mknod(_) => "mknod",
            ReplyResult::Create(_) => "create",
            ReplyResult::Mkdir(_) => "mkdir",
            ReplyResult::Unlink(_) => "unlink",
            ReplyResult::Rmdir(_) => "rmdir",
            ReplyResult::Rename(_) => "rename",
            ReplyResult::Link(_) => "link",
            ReplyResult::Symlink(_) => "symlink",
            ReplyResult::Readlink(_) => "readlink",
            ReplyResult::Readdir(_) => "readdir",
            ReplyResult::Open(_) => "open",
            ReplyResult::Read(_) => "read",
            ReplyResult::Write(_) => "write",
            ReplyResult::Flush(_) => "flush",
            ReplyResult::Fsync(_) => "fsync",
            ReplyResult::Release(_) => "release",
            ReplyResult::RenewHandles(_) => "renew_handles",
            ReplyResult::Statfs(_) => "statfs",
            ReplyResult::WriteKillSuidgid(_) => "write_kill_suidgid",
            ReplyResult::OpenKillSuidgid(_) => "open_kill_suidgid",
            ReplyResult::ClaimMount(_) => "claim_mount",
            ReplyResult::RenewMount(_) => "renew_mount",
            ReplyResult::ReleaseMount(_) => "release_mount",
        }
    }
}

/// Why bytes are not a valid request or reply. Each maps to the protocol error the worker
/// answers with ([`ProtocolError::to_wire`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The body is longer than [`MAX_MESSAGE_BYTES`].
    #[error("message of {len} bytes is over the {max}-byte limit")]
    MessageTooLarge {
        /// The body's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// File data (a write's payload or a read's size) is over [`MAX_DATA_BYTES`].
    #[error("{len} bytes of file data is over the {max}-byte limit")]
    DataTooLarge {
        /// The requested or carried length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The bytes are not a protobuf message of the expected type.
    #[error("not a valid protobuf message: {reason}")]
    Undecodable {
        /// The decoder's explanation.
        reason: String,
    },
    /// A field is missing or out of range.
    #[error("invalid {field}: {problem}")]
    InvalidField {
        /// The field, as the `.proto` names it.
        field: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
}

impl ProtocolError {
    /// The error a worker answers a request with when decoding it failed this way.
    pub fn to_wire(&self) -> v1::Error {
        let kind = match self {
            ProtocolError::MessageTooLarge { .. } | ProtocolError::DataTooLarge { .. } => {
                v1::ErrorKind::TooLarge
            }
            ProtocolError::Undecodable { .. } | ProtocolError::InvalidField { .. } => {
                v1::ErrorKind::InvalidRequest
            }
        };
        v1::Error {
            kind: kind.into(),
            message: self.to_string(),
            ..Default::default()
        }
    }
}

/// A request that decoded and passed the envelope checks.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedRequest {
    /// The volume the request is for.
    pub volume_id: String,
    /// The volume generation the caller staged.
    pub volume_generation: VolumeGeneration,
    /// The logical call's ID.
    pub request_id: RequestId,
    /// The caller's mount epoch; `None` when the request carries none.
    pub mount_epoch: Option<MountEpoch>,
    /// The access mode the caller staged (never `Unspecified`).
    pub access_mode: AccessMode,
    /// The operation.
    pub op: Op,
}

impl DecodedRequest {
    /// The wire message for this request.
    pub fn to_message(&self) -> v1::Request {
        v1::Request {
            volume_id: self.volume_id.clone(),
            volume_generation: self.volume_generation.0,
            request_id: self.request_id.0.to_vec(),
            mount_epoch: self
                .mount_epoch
                .map(|epoch| epoch.0.to_vec())
                .unwrap_or_default(),
            access_mode: self.access_mode.into(),
            op: Some(self.op.clone()),
        }
    }
}

/// Encodes a request message into the bytes sent on every attempt of a call.
pub fn encode_request(request: &v1::Request) -> Bytes {
    Bytes::from(request.encode_to_vec())
}

/// Encodes a reply message into the body a worker answers with.
pub fn encode_reply(reply: &v1::Reply) -> Bytes {
    Bytes::from(reply.encode_to_vec())
}

/// Decodes and checks a request body, as a worker does before acting on it.
///
/// Checks the body length, the protobuf encoding, the 16-byte request ID, an epoch that is
/// empty or 16 bytes, a known access mode, the presence of an operation and the data limit
/// of reads and writes. It does not know volumes, so it cannot check the epoch's presence
/// for an RWO volume. Never panics.
///
/// Decoding from [`Bytes`] shares the body's buffer with the decoded data of a write instead of
/// copying it; a `&[u8]` works too.
pub fn decode_request(body: impl Buf) -> Result<DecodedRequest, ProtocolError> {
    check_len(body.remaining())?;
    let message = v1::Request::decode(body).map_err(|err| ProtocolError::Undecodable {
        reason: err.to_string(),
    })?;
    let request_id =
        RequestId::from_slice(&message.request_id).ok_or(ProtocolError::InvalidField {
            field: "request_id",
            problem: "must be 16 bytes",
        })?;
    let mount_epoch = match message.mount_epoch.len() {
        0 => None,
        _ => Some(MountEpoch::from_slice(&message.mount_epoch).ok_or(
            ProtocolError::InvalidField {
                field: "mount_epoch",
                problem: "must be empty or 16 bytes",
            },
        )?),
    };
    let access_mode = match AccessMode::try_from(message.access_mode) {
        Ok(AccessMode::Unspecified) | Err(_) => {
            return Err(ProtocolError::InvalidField {
                field: "access_mode",
                problem: "must be RWO or RWX",
            });
        }
        Ok(mode) => mode,
    };
    let op = message.op.ok_or(ProtocolError::InvalidField {
        field: "op",
        problem: "no operation",
    })?;
    check_data_len(op.data_len())?;
    Ok(DecodedRequest {
        volume_id: message.volume_id,
        volume_generation: VolumeGeneration(message.volume_generation),
        request_id,
        mount_epoch,
        access_mode,
        op,
    })
}

/// Decodes a reply body. Checks only that it is a reply of bounded size; what it means for a
/// call is [`classify_reply`]'s job. Never panics.
///
/// Decoding from [`Bytes`] shares the body's buffer with the decoded data of a read instead of
/// copying it; a `&[u8]` works too.
pub fn decode_reply(body: impl Buf) -> Result<v1::Reply, ProtocolError> {
    check_len(body.remaining())?;
    v1::Reply::decode(body).map_err(|err| ProtocolError::Undecodable {
        reason: err.to_string(),
    })
}

/// The fuzzing invariant over [`decode_request`]: a request that decodes re-encodes to bytes
/// that decode to the same request, and encoding that again gives the same bytes. Bytes that
/// do not decode must be refused with an error, never a panic.
///
/// # Panics
///
/// When the invariant does not hold; that is the bug the fuzzer looks for.
pub fn request_roundtrip_check(body: &[u8]) {
    let Ok(first) = decode_request(body) else {
        return;
    };
    let encoded = encode_request(&first.to_message());
    let second = match decode_request(encoded.clone()) {
        Ok(second) => second,
        Err(err) => panic!("re-encoded request does not decode: {err}"),
    };
    assert_eq!(first, second, "decode, encode, decode changed the request");
    assert_eq!(
        encoded,
        encode_request(&second.to_message()),
        "encoding is not stable"
    );
}

fn check_len(len: usize) -> Result<(), ProtocolError> {
    if len > MAX_MESSAGE_BYTES {
        return Err(ProtocolError::MessageTooLarge {
            len,
            max: MAX_MESSAGE_BYTES,
        });
    }
    Ok(())
}

fn check_data_len(len: usize) -> Result<(), ProtocolError> {
    if len > MAX_DATA_BYTES {
        return Err(ProtocolError::DataTooLarge {
            len,
            max: MAX_DATA_BYTES,
        });
    }
    Ok(())
}

/// A definite refusal from the worker: the operation was not applied and never will be under
/// this request ID. Not `#[non_exhaustive]`, for the same reason as [`crate::Error`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The file system refused with this Linux errno (positive; not yet clamped).
    Errno(i32),
    /// The request's mount epoch is not the current lease's: the volume is lost to this
    /// caller.
    StaleEpoch,
    /// The volume has another generation or access mode.
    IdentityMismatch,
    /// The worker group has no such volume.
    UnknownVolume,
    /// A claim met another epoch's unexpired lease, which runs for this much longer.
    LeaseHeld {
        /// The remaining lease time at the worker's clock.
        remaining: Duration,
    },
    /// The worker could not read the request.
    InvalidRequest,
    /// The request is over a size limit.
    TooLarge,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Errno(errno) => write!(f, "errno {errno}"),
            Refusal::StaleEpoch => f.write_str("stale mount epoch"),
            Refusal::IdentityMismatch => f.write_str("volume generation or access mode mismatch"),
            Refusal::UnknownVolume => f.write_str("unknown volume"),
            Refusal::LeaseHeld { remaining } => {
                write!(f, "lease held by another epoch for {remaining:?}")
            }
            Refusal::InvalidRequest => f.write_str("invalid request"),
            Refusal::TooLarge => f.write_str("request too large"),
        }
    }
}

/// What one reply means for the call that received it.
#[derive(Debug, Clone, PartialEq)]
pub enum Classified {
    /// The operation's result (never [`ReplyResult::Error`]).
    Success(ReplyResult),
    /// A definite refusal; the call ends with it.
    Refused(Refusal),
    /// This endpoint does not lead; `hint` may name one that does.
    NotLeader {
        /// The leader the worker named, if any (not yet checked against the staged set).
        hint: Option<String>,
    },
    /// No quorum, and nothing was proposed: definite, but worth retrying within the budget.
    NoQuorum,
    /// The worker proposed the request and lost quorum: it may still take effect.
    Uncertain,
}

/// Why a reply does not answer the request it was received for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplyMismatch {
    /// The reply echoes another request ID.
    #[error("reply echoes another request ID")]
    RequestId,
    /// The reply answers another operation than the request carried.
    #[error("reply to {expected} carries a {found} result")]
    Operation {
        /// The request's operation.
        expected: &'static str,
        /// The reply's result.
        found: &'static str,
    },
    /// The reply has neither a result nor an error, or an error of unknown kind.
    #[error("reply has no result or an unknown error kind")]
    Empty,
}

/// Classifies a decoded reply to a request with `request_id` carrying an `op`-named operation.
pub fn classify_reply(
    reply: v1::Reply,
    request_id: &RequestId,
    op: &'static str,
) -> Result<Classified, ReplyMismatch> {
    if reply.request_id != request_id.0 {
        return Err(ReplyMismatch::RequestId);
    }
    let result = reply.result.ok_or(ReplyMismatch::Empty)?;
    let error = match result {
        ReplyResult::Error(error) => error,
        result if result.name() == op => return Ok(Classified::Success(result)),
        result => {
            return Err(ReplyMismatch::Operation {
                expected: op,
                found: result.name(),
            });
        }
    };
    let kind = v1::ErrorKind::try_from(error.kind).map_err(|_| ReplyMismatch::Empty)?;
    Ok(match kind {
        v1::ErrorKind::Unspecified => return Err(ReplyMismatch::Empty),
        v1::ErrorKind::Errno => Classified::Refused(Refusal::Errno(error.errno)),
        v1::ErrorKind::StaleEpoch => Classified::Refused(Refusal::StaleEpoch),
        v1::ErrorKind::IdentityMismatch => Classified::Refused(Refusal::IdentityMismatch),
        v1::ErrorKind::UnknownVolume => Classified::Refused(Refusal::UnknownVolume),
        v1::ErrorKind::LeaseHeld => Classified::Refused(Refusal::LeaseHeld {
            remaining: Duration::from_millis(error.lease_remaining_ms),
        }),
        v1::ErrorKind::InvalidRequest => Classified::Refused(Refusal::InvalidRequest),
        v1::ErrorKind::TooLarge => Classified::Refused(Refusal::TooLarge),
        v1::ErrorKind::NotLeader => Classified::NotLeader {
            hint: Some(error.leader_hint).filter(|hint| !hint.is_empty()),
        },
        v1::ErrorKind::NoQuorum => Classified::NoQuorum,
        v1::ErrorKind::Uncertain => Classified::Uncertain,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(op: Op) -> v1::Request {
        v1::Request {
            volume_id: "vol-a".into(),
            volume_generation: 7,
            request_id: vec![3; 16],
            mount_epoch: vec![9; 16],
            access_mode: AccessMode::Rwo.into(),
            op: Some(op),
        }
    }

    #[test]
    fn a_valid_request_decodes_to_its_typed_form() {
        let op = Op::Getattr(v1::GetattrRequest {
            file: Some(
                FileId {
                    ino: ROOT_INO,
                    inode_generation: 0,
                }
                .into(),
            ),
            handle: None,
        });
        let decoded = decode_request(encode_request(&request(op.clone()))).unwrap();
        assert_eq!(decoded.request_id, RequestId([3; 16]));
        assert_eq!(decoded.mount_epoch, Some(MountEpoch([9; 16])));
        assert_eq!(decoded.volume_generation, VolumeGeneration(7));
        assert_eq!(decoded.op, op);
        assert_eq!(decoded.to_message(), request(op));
    }

    #[test]
    fn envelope_problems_are_invalid_requests() {
        let statfs = Op::Statfs(v1::StatfsRequest {});
        let mut short_id = request(statfs.clone());
        short_id.request_id = vec![1; 15];
        let mut odd_epoch = request(statfs.clone());
        odd_epoch.mount_epoch = vec![1; 3];
        let mut no_mode = request(statfs.clone());
        no_mode.access_mode = 0;
        let mut unknown_mode = request(statfs);
        unknown_mode.access_mode = 99;
        let mut no_op = request(Op::Statfs(v1::StatfsRequest {}));
        no_op.op = None;
        for bad in [short_id, odd_epoch, no_mode, unknown_mode, no_op] {
            let err = decode_request(encode_request(&bad)).unwrap_err();
            assert_eq!(
                err.to_wire().kind,
                i32::from(v1::ErrorKind::InvalidRequest),
                "{err}"
            );
        }
        let garbage = decode_request(&b"\xff\xff\xff"[..]).unwrap_err();
        assert!(matches!(garbage, ProtocolError::Undecodable { .. }));
    }

    #[test]
    fn data_over_the_limit_is_too_large() {
        let write = Op::Write(v1::WriteRequest {
            data: Bytes::from(vec![0; MAX_DATA_BYTES + 1]),
            ..Default::default()
        });
        let err = decode_request(encode_request(&request(write))).unwrap_err();
        assert_eq!(err.to_wire().kind, i32::from(v1::ErrorKind::TooLarge));
        let read = Op::Read(v1::ReadRequest {
            size: u32::MAX,
            ..Default::default()
        });
        assert!(matches!(
            decode_request(encode_request(&request(read))),
            Err(ProtocolError::DataTooLarge { .. })
        ));
        let exact = Op::Write(v1::WriteRequest {
            data: Bytes::from(vec![0; MAX_DATA_BYTES]),
            ..Default::default()
        });
        assert!(decode_request(encode_request(&request(exact))).is_ok());
        let huge = vec![0u8; MAX_MESSAGE_BYTES + 1];
        assert!(matches!(
            decode_request(&huge[..]),
            Err(ProtocolError::MessageTooLarge { .. })
        ));
    }

    #[test]
    fn replies_are_classified_by_kind() {
        let id = RequestId([5; 16]);
        let error = |kind: v1::ErrorKind, hint: &str| v1::Reply {
            request_id: id.0.to_vec(),
            result: Some(ReplyResult::Error(v1::Error {
                kind: kind.into(),
                errno: 2,
                leader_hint: hint.into(),
                lease_remaining_ms: 1500,
                ..Default::default()
            })),
        };
        let classify = |reply| classify_reply(reply, &id, "lookup").unwrap();
        assert_eq!(
            classify(error(v1::ErrorKind::Errno, "")),
            Classified::Refused(Refusal::Errno(2))
        );
        assert_eq!(
            classify(error(v1::ErrorKind::NotLeader, "")),
            Classified::NotLeader { hint: None }
        );
        assert_eq!(
            classify(error(v1::ErrorKind::NotLeader, "b:1")),
            Classified::NotLeader {
                hint: Some("b:1".into())
            }
        );
        assert_eq!(
            classify(error(v1::ErrorKind::NoQuorum, "")),
            Classified::NoQuorum
        );
        assert_eq!(
            classify(error(v1::ErrorKind::Uncertain, "")),
            Classified::Uncertain
        );
        assert_eq!(
            classify(error(v1::ErrorKind::LeaseHeld, "")),
            Classified::Refused(Refusal::LeaseHeld {
                remaining: Duration::from_millis(1500)
            })
        );
        assert_eq!(
            classify_reply(error(v1::ErrorKind::Unspecified, ""), &id, "lookup"),
            Err(ReplyMismatch::Empty)
        );

        let entry = v1::Reply {
            request_id: id.0.to_vec(),
            result: Some(ReplyResult::Lookup(v1::Entry::default())),
        };
        assert!(matches!(
            classify(entry.clone()),
            Classified::Success(ReplyResult::Lookup(_))
        ));
        assert_eq!(
            classify_reply(entry.clone(), &id, "getattr"),
            Err(ReplyMismatch::Operation {
                expected: "getattr",
                found: "lookup"
            })
        );
        assert_eq!(
            classify_reply(entry, &RequestId([6; 16]), "lookup"),
            Err(ReplyMismatch::RequestId)
        );
    }

    #[test]
    fn every_operation_name_matches_its_reply_name() {
        // The request and reply oneofs use the same field numbers and names; `name()` ties
        // them together for `classify_reply`.
        use prost::Message as _;
        for tag in (10..=32).chain(40..=42) {
            // A request with only the oneof field set, empty message: tag << 3 | 2, length 0.
            let mut body = encode_request(&v1::Request {
                request_id: vec![0; 16],
                access_mode: AccessMode::Rwx.into(),
                ..Default::default()
            })
            .to_vec();
            prost::encoding::encode_key(tag, prost::encoding::WireType::LengthDelimited, &mut body);
            body.push(0);
            let op = decode_request(&body[..]).unwrap().op;
            let reply = v1::Reply::decode(&body[..0]).unwrap();
            let mut reply_body = reply.encode_to_vec();
            prost::encoding::encode_key(
                tag,
                prost::encoding::WireType::LengthDelimited,
                &mut reply_body,
            );
            reply_body.push(0);
            let result = decode_reply(&reply_body[..]).unwrap().result.unwrap();
            assert_eq!(op.name(), result.name(), "field {tag}");
        }
    }

    /// A request as a worker that predates `write_kill_suidgid` decodes it: the envelope and
    /// the operations it knew (here, `write`).
    #[derive(Clone, PartialEq, prost::Message)]
    struct OlderRequest {
        #[prost(bytes = "vec", tag = "3")]
        request_id: Vec<u8>,
        #[prost(oneof = "OlderOp", tags = "25, 23")]
        op: Option<OlderOp>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    enum OlderOp {
        #[prost(message, tag = "25")]
        Write(v1::WriteRequest),
        #[prost(message, tag = "23")]
        Open(v1::OpenRequest),
    }

    #[test]
    fn an_older_worker_finds_no_operation_in_a_killing_write_or_open() {
        let write = v1::WriteRequest {
            data: Bytes::from_static(b"data"),
            ..Default::default()
        };
        let caller = Some(v1::Caller {
            uid: 1000,
            gid: 1000,
        });
        let killing = [
            Op::WriteKillSuidgid(v1::WriteKillSuidgidRequest {
                write: Some(write.clone()),
                caller,
            }),
            Op::OpenKillSuidgid(v1::OpenKillSuidgidRequest {
                open: Some(v1::OpenRequest {
                    flags: 0o1000, // O_TRUNC
                    ..Default::default()
                }),
                caller,
            }),
        ];
        for op in killing {
            let name = op.name();
            let body = encode_request(&request(op));
            let older = OlderRequest::decode(&body[..]).unwrap();
            assert_eq!(older.request_id, vec![3; 16]);
            // No operation: the older worker answers INVALID_REQUEST ("no operation", as
            // `envelope_problems_are_invalid_requests` shows) instead of writing or truncating
            // with the privileges kept.
            assert_eq!(older.op, None, "{name}");
        }
        let plain = OlderRequest::decode(&encode_request(&request(Op::Write(write)))[..]).unwrap();
        assert!(
            matches!(plain.op, Some(OlderOp::Write(_))),
            "the same decoder knows writes"
        );
    }

    #[test]
    fn ids_print_as_hex() {
        assert_eq!(RequestId([0xab; 16]).to_string(), "ab".repeat(16));
        assert_eq!(
            format!("{:?}", MountEpoch([1; 16])),
            format!("MountEpoch({})", "01".repeat(16))
        );
        assert_ne!(MountEpoch::random().unwrap(), MountEpoch::random().unwrap());
    }
}
