//! The keeper protocol: what an owner and the keeper say to each other on the keeper's socket.
//!
//! Each message is one `fdpass` frame (SOCK_SEQPACKET, its own versioned header, at most 253
//! descriptors): a JSON payload and the descriptors it announces. Requests come from the owner
//! and each gets one answer, except [`Request::Fetch`], which is answered by one
//! [`Answer::Stage`] per deposit and a final [`Answer::Done`].
//!
//! A deposit carries one stage: its `/dev/fuse` descriptor and a sealed memfd holding the
//! stage's node and handle tables ([`StageState`], in a binary form of its own: a table of a
//! large directory tree does not fit in a frame). While the owner serves the stage it writes
//! every change to those tables ahead ([`Request::Journal`]), so that the keeper's tables hold
//! every node and handle the kernel was given.
//!
//! Compatibility within version 1: `Deposit::tables`, the deposit's retention and call budget,
//! `Deposit::resend_window_ms` and `Request::Journal` came later, all optional on the wire. A
//! deposit without `tables` (an older owner) carries no memfd unless handed over, and one
//! without a retention is never kept after its owner dies; a keeper that does not know
//! `journal` refuses it, and the owner then serves on without writing ahead, as it would
//! without a keeper. [`Change::Delivered`] came with version 3 of the stage state: an owner
//! sends it only to a keeper that took a version 3 state, and gives a keeper that refuses one
//! a version 2 state (its tables without delivery marks) instead.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;

use fusefs::{ConnectionNonce, HandleState, MountState, NodeState};
use lease_client::protocol::FileId;
use serde::{Deserialize, Serialize};

/// The protocol version in every message; a message of another version is refused.
pub const VERSION: u32 = 1;

/// The longest a keeper keeps a dead owner's stage for a successor: a day.
pub const MAX_CRASH_WINDOW_MS: u64 = 24 * 3600 * 1000;

/// The largest stage state a keeper or owner reads from a memfd: 64 MiB, about 2.6 million
/// nodes.
pub const MAX_STATE_BYTES: u64 = 64 << 20;

/// What an owner asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Keep a copy of this stage's connection: one descriptor (`/dev/fuse`), and a second (a
    /// sealed memfd with the stage's tables) when `handed_over`. A deposit replaces the
    /// keeper's earlier one of the same staging path.
    Deposit {
        /// The stage.
        stage: Deposit,
    },
    /// Apply `changes` to the tables of the stage at `staging`, in order. Only the owner
    /// connection that deposited the stage (and serves it) may; the keeper answers once the
    /// changes are applied, and the reply to the kernel that needs them waits for that.
    Journal {
        /// The staging path.
        staging: PathBuf,
        /// The changes.
        changes: Vec<Change>,
    },
    /// Drop the copies of the stage at `staging` (it was unstaged). Unknown paths are fine.
    Withdraw {
        /// The staging path.
        staging: PathBuf,
    },
    /// Send a copy of every deposit.
    Fetch,
    /// Is the keeper there?
    Ping,
}

/// What the keeper answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum Answer {
    /// Done.
    Ok,
    /// Refused, and nothing changed.
    Refused {
        /// Why, in words.
        reason: String,
    },
    /// One deposit, with its descriptors (during a fetch).
    Stage {
        /// The stage.
        stage: Deposit,
    },
    /// The end of a fetch: `count` stages were sent.
    Done {
        /// How many.
        count: usize,
    },
}

/// One stage as the keeper keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deposit {
    /// The volume.
    pub volume_id: String,
    /// The staging path: the key of the deposit.
    pub staging: PathBuf,
    /// The FUSE connection's device (`0:N`).
    pub device: (u32, u32),
    /// The INIT record (`fuse_wire::InitRecord::encode`), hex.
    pub record: String,
    /// The volume context the stage was made with, as NodeStageVolume gave it.
    pub context: BTreeMap<String, String>,
    /// Set when the owner handed the stage over (it has stopped serving it); clear while an
    /// owner serves it.
    pub handed_over: bool,
    /// Set when a second descriptor, a sealed memfd, holds the stage's tables; always set
    /// when handed over. An owner that serves the stage keeps them current with
    /// [`Request::Journal`].
    #[serde(default)]
    pub tables: bool,
    /// The reply retention the volume's workers state, in milliseconds; 0 when not known.
    #[serde(default)]
    pub reply_retention_ms: u64,
    /// The owner's call budget, in milliseconds.
    #[serde(default)]
    pub call_budget_ms: u64,
    /// In a fetch answer only: the owner of this stage died without handing it over, and a
    /// successor may take it over and repeat the dead owner's mutations for this many more
    /// milliseconds (until deadline D); the keeper ends the connection then if nobody took the
    /// stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resend_window_ms: Option<u64>,
    /// The deadlines for requests resent a second time or more ([`fusefs::ResendRule`]): in a
    /// deposit, the rules the owner applies since it took the stage over from an owner that
    /// died; in a fetch answer, those the successor must apply besides `resend_window_ms`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resend_rules: Vec<ResendWindow>,
}

/// A [`fusefs::ResendRule`] on the wire: resent requests with an ID below `below` may be sent
/// again for `window_ms` more milliseconds (0: no longer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResendWindow {
    /// The first request ID the rule does not cover.
    pub below: u64,
    /// The time left, in milliseconds.
    pub window_ms: u64,
}

impl ResendWindow {
    /// The rule as seen from `now`.
    pub fn of(rule: fusefs::ResendRule, now: std::time::Instant) -> ResendWindow {
        let left = rule.until.saturating_duration_since(now);
        ResendWindow {
            below: rule.below,
            window_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// The rule, counting the time left from `now` (clamped to [`MAX_CRASH_WINDOW_MS`]).
    pub fn rule(self, now: std::time::Instant) -> fusefs::ResendRule {
        let left = std::time::Duration::from_millis(self.window_ms.min(MAX_CRASH_WINDOW_MS));
        fusefs::ResendRule {
            below: self.below,
            until: now.checked_add(left).unwrap_or(now),
        }
    }
}

/// One change to a stage's tables ([`fusefs::TableChange`] on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum Change {
    /// The kernel was handed this node.
    Node {
        /// The node ID.
        node: u64,
        /// Its inode generation.
        generation: u64,
    },
    /// The kernel forgot the node.
    Forgotten {
        /// The node ID.
        node: u64,
    },
    /// Kernel request `unique` opened `handle` on the file (`ino`, `generation`).
    Opened {
        /// The FUSE file handle.
        handle: u64,
        /// The file's inode.
        ino: u64,
        /// The file's inode generation.
        generation: u64,
        /// The open flags.
        flags: u32,
        /// The kernel request that opened it, without its resend and interrupt bits
        /// ([`HandleState::opened_by`]).
        unique: u64,
    },
    /// The kernel took the reply that handed it the handle.
    Delivered {
        /// The FUSE file handle.
        handle: u64,
    },
    /// The kernel released the handle.
    Released {
        /// The FUSE file handle.
        handle: u64,
    },
    /// The first request the owner read first-hand after taking the stage over from an owner
    /// that died: the boundary of its open resend rule.
    FirstRead {
        /// The request's ID without its resend and interrupt bits.
        unique: u64,
    },
}

impl From<fusefs::TableChange> for Change {
    fn from(change: fusefs::TableChange) -> Change {
        use fusefs::TableChange as T;
        match change {
            T::Node {
                node,
                inode_generation,
            } => Change::Node {
                node,
                generation: inode_generation,
            },
            T::Forgotten { node } => Change::Forgotten { node },
            T::Opened { handle } => Change::Opened {
                handle: handle.handle,
                ino: handle.file.ino,
                generation: handle.file.inode_generation,
                flags: handle.flags,
                unique: handle.opened_by.unwrap_or(0),
            },
            T::Delivered { handle } => Change::Delivered { handle },
            T::Released { handle } => Change::Released { handle },
            T::FirstRead { unique } => Change::FirstRead { unique },
        }
    }
}

/// A message on the wire: the version and the request or answer.
#[derive(Debug, Serialize, Deserialize)]
struct Envelope<T> {
    v: u32,
    #[serde(flatten)]
    body: T,
}

/// Why a message could not be understood.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// Not JSON of a known message.
    #[error("not a message of this protocol: {0}")]
    Garbage(#[from] serde_json::Error),
    /// Another version.
    #[error("protocol version {found}, not {VERSION}")]
    Version {
        /// The version found.
        found: u32,
    },
    /// The descriptors do not match what the message announces.
    #[error("{found} descriptors where the message announces {expected}")]
    Descriptors {
        /// Announced.
        expected: usize,
        /// Received.
        found: usize,
    },
    /// A field is invalid.
    #[error("invalid {field}: {problem}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// The state memfd could not be read or is malformed.
    #[error("the stage state is unusable: {0}")]
    State(String),
}

/// Encodes a message.
pub fn encode<T: Serialize>(body: &T) -> Vec<u8> {
    // Serializing these plain types cannot fail; an empty payload would be refused anyway.
    serde_json::to_vec(&Envelope { v: VERSION, body }).unwrap_or_default()
}

/// Decodes a message, checking its version.
pub fn decode<T: for<'de> Deserialize<'de>>(payload: &[u8]) -> Result<T, ProtocolError> {
    #[derive(Deserialize)]
    struct Version {
        v: u32,
    }
    let version: Version = serde_json::from_slice(payload)?;
    if version.v != VERSION {
        return Err(ProtocolError::Version { found: version.v });
    }
    let envelope: Envelope<T> = serde_json::from_slice(payload)?;
    Ok(envelope.body)
}

impl Deposit {
    /// How long after the death of its owner a successor may still repeat the owner's
    /// mutations of this stage: the workers' reply retention, less two call budgets (a kernel
    /// request's calls all start within one budget of its first and each ends within one,
    /// so the replies a dead owner was given are at most two budgets old when it dies), less
    /// a second of margin. `None` when a successor cannot take over after a crash: the kernel
    /// has no `FUSE_NOTIFY_RESEND`, the retention is not known, or it leaves no time.
    pub fn crash_window(&self, record: &fuse_wire::InitRecord) -> Option<std::time::Duration> {
        if !record.has_resend() || self.reply_retention_ms == 0 {
            return None;
        }
        let window = self
            .reply_retention_ms
            .checked_sub(self.call_budget_ms.checked_mul(2)?)?
            .checked_sub(1_000)?;
        // A day at most, whatever a worker states: the deadline is an instant to compute.
        (window > 0).then(|| std::time::Duration::from_millis(window.min(MAX_CRASH_WINDOW_MS)))
    }

    /// How many descriptors travel with this deposit.
    pub fn descriptors(&self) -> usize {
        if self.handed_over || self.tables {
            2
        } else {
            1
        }
    }

    /// Checks every field a keeper or successor relies on; `fds` are the descriptors that came
    /// with it (the first must be `/dev/fuse`, the second a sealed memfd).
    pub fn check(&self, fds: &[OwnedFd]) -> Result<fuse_wire::InitRecord, ProtocolError> {
        let invalid = |field, problem: &str| ProtocolError::Invalid {
            field,
            problem: problem.to_owned(),
        };
        if fds.len() != self.descriptors() {
            return Err(ProtocolError::Descriptors {
                expected: self.descriptors(),
                found: fds.len(),
            });
        }
        crate::owner::check_volume_id(&self.volume_id).map_err(|e| ProtocolError::Invalid {
            field: "volume_id",
            problem: e.to_string(),
        })?;
        if !self.staging.is_absolute() || self.staging.parent().is_none() {
            return Err(invalid("staging", "not an absolute path below /"));
        }
        if self.device.0 != 0 {
            return Err(invalid("device", "a FUSE connection's device is 0:N"));
        }
        let bytes = hex_decode(&self.record).ok_or_else(|| invalid("record", "not hex"))?;
        let record = fuse_wire::InitRecord::decode(&bytes).map_err(|e| ProtocolError::Invalid {
            field: "record",
            problem: e.to_string(),
        })?;
        if let Some(fd) = fds.first() {
            check_fuse_device(fd).map_err(|problem| ProtocolError::Invalid {
                field: "descriptor",
                problem,
            })?;
        }
        Ok(record)
    }
}

/// `/dev/fuse` is character device 10:229.
fn check_fuse_device(fd: &OwnedFd) -> Result<(), String> {
    let stat = rustix::fs::fstat(fd).map_err(|e| format!("fstat: {e}"))?;
    let kind = rustix::fs::FileType::from_raw_mode(stat.st_mode);
    let rdev = stat.st_rdev;
    if kind != rustix::fs::FileType::CharacterDevice
        || rustix::fs::major(rdev) != 10
        || rustix::fs::minor(rdev) != 229
    {
        return Err(format!(
            "not /dev/fuse (a {kind:?}, device {}:{})",
            rustix::fs::major(rdev),
            rustix::fs::minor(rdev)
        ));
    }
    Ok(())
}

/// Lower-case hex of `bytes`.
pub fn hex_encode(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

pub(crate) fn hex_decode(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The tables a successor needs to serve a stage: the connection's nonce, every node the
/// kernel holds and every open handle, [`MountState`] as bytes.
///
/// Layout (little endian): `TKST`, version `u32` (3), the connection nonce (16 bytes), node
/// count `u64`, then per node its ID, inode generation and lookup count (`u64` each); handle
/// count `u64`, then per handle the handle, inode, inode generation (`u64` each), open flags
/// (`u32`) and the request that opened it while it is not known to be delivered (`u64`, 0
/// once delivered: the kernel numbers no request 0).
///
/// Version 2 is version 3 without the opening request (every handle counts as delivered); it
/// is read, and written when every handle is delivered, so that an owner of the version
/// before can still take over most stages. Version 1, without the nonce, is refused: a
/// successor that made up a nonce would send a crashed owner's calls again under other
/// request IDs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageState(pub MountState);

const STATE_MAGIC: &[u8; 4] = b"TKST";
/// The newest version of the stage state.
pub const STATE_VERSION: u32 = 3;
/// The version before, without delivery marks.
pub const STATE_VERSION_UNMARKED: u32 = 2;
const NODE_BYTES: usize = 24;
/// The largest entry: a handle of version 3.
pub(crate) const HANDLE_BYTES: usize = 36;

impl StageState {
    /// The bytes, in the oldest version that holds the state: version 2 when every handle
    /// is delivered, else version 3.
    pub fn encode(&self) -> Vec<u8> {
        let marked = self.0.handles.iter().any(|h| h.opened_by.is_some());
        self.encode_as(if marked {
            STATE_VERSION
        } else {
            STATE_VERSION_UNMARKED
        })
    }

    /// The bytes in `version` (2 or 3); version 2 leaves the delivery marks out.
    pub fn encode_as(&self, version: u32) -> Vec<u8> {
        let MountState {
            nonce,
            nodes,
            handles,
        } = &self.0;
        let marked = version >= STATE_VERSION;
        let mut out =
            Vec::with_capacity(40 + nodes.len() * NODE_BYTES + handles.len() * HANDLE_BYTES);
        out.extend_from_slice(STATE_MAGIC);
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&nonce.0);
        out.extend_from_slice(&(nodes.len() as u64).to_le_bytes());
        for node in nodes {
            for v in [node.node, node.inode_generation, node.lookups] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out.extend_from_slice(&(handles.len() as u64).to_le_bytes());
        for handle in handles {
            for v in [handle.handle, handle.file.ino, handle.file.inode_generation] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&handle.flags.to_le_bytes());
            if marked {
                out.extend_from_slice(&handle.opened_by.unwrap_or(0).to_le_bytes());
            }
        }
        out
    }

    /// Reads what [`StageState::encode`] wrote; anything else is an error naming the problem.
    pub fn decode(bytes: &[u8]) -> Result<StageState, ProtocolError> {
        let mut cursor = Cursor(bytes);
        if &cursor.take::<4>()? != STATE_MAGIC {
            return Err(ProtocolError::State("not a stage state".to_owned()));
        }
        let version = cursor.u32()?;
        if !(STATE_VERSION_UNMARKED..=STATE_VERSION).contains(&version) {
            return Err(ProtocolError::State(format!(
                "version {version}, not {STATE_VERSION_UNMARKED} or {STATE_VERSION}"
            )));
        }
        let marked = version >= STATE_VERSION;
        let nonce = ConnectionNonce(cursor.take::<16>()?);
        let mut nodes = Vec::new();
        for _ in 0..cursor.u64()? {
            nodes.push(NodeState {
                node: cursor.u64()?,
                inode_generation: cursor.u64()?,
                lookups: cursor.u64()?,
            });
        }
        let mut handles = Vec::new();
        for _ in 0..cursor.u64()? {
            handles.push(HandleState {
                handle: cursor.u64()?,
                file: FileId {
                    ino: cursor.u64()?,
                    inode_generation: cursor.u64()?,
                },
                flags: cursor.u32()?,
                opened_by: match marked {
                    true => Some(cursor.u64()?).filter(|&unique| unique != 0),
                    false => None,
                },
            });
        }
        if !cursor.0.is_empty() {
            return Err(ProtocolError::State("trailing bytes".to_owned()));
        }
        Ok(StageState(MountState {
            nonce,
            nodes,
            handles,
        }))
    }

    /// The state in a sealed memfd (no write, grow or shrink: what the receiver reads is what
    /// was written), in the oldest version that holds it ([`StageState::encode`]).
    pub fn to_memfd(&self) -> io::Result<OwnedFd> {
        self.to_memfd_as(None)
    }

    /// [`StageState::to_memfd`] in `version`, when given.
    pub fn to_memfd_as(&self, version: Option<u32>) -> io::Result<OwnedFd> {
        use rustix::fs::{MemfdFlags, SealFlags};
        let fd = rustix::fs::memfd_create(
            "tak-os-stage-state",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        let bytes = match version {
            Some(version) => self.encode_as(version),
            None => self.encode(),
        };
        let mut written = 0;
        while written < bytes.len() {
            written += rustix::io::write(&fd, &bytes[written..])?;
        }
        rustix::fs::fcntl_add_seals(
            &fd,
            SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
        )?;
        Ok(fd)
    }

    /// Reads a state from a memfd sealed against writes, growth and shrinking, at most
    /// [`MAX_STATE_BYTES`].
    pub fn from_memfd(fd: impl AsFd) -> Result<StageState, ProtocolError> {
        use rustix::fs::SealFlags;
        let fd = fd.as_fd();
        let state = |e: String| ProtocolError::State(e);
        let seals = rustix::fs::fcntl_get_seals(fd).map_err(|e| state(format!("seals: {e}")))?;
        if !seals.contains(SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK) {
            return Err(state("the memfd is not sealed".to_owned()));
        }
        let size = rustix::fs::fstat(fd)
            .map_err(|e| state(format!("fstat: {e}")))?
            .st_size;
        let size = u64::try_from(size).map_err(|_| state("a negative size".to_owned()))?;
        if size > MAX_STATE_BYTES {
            return Err(state(format!("{size} bytes, more than {MAX_STATE_BYTES}")));
        }
        let mut bytes = vec![0u8; usize::try_from(size).unwrap_or(0)];
        let mut read = 0;
        while read < bytes.len() {
            let n = rustix::io::pread(fd, &mut bytes[read..], read as u64)
                .map_err(|e| state(format!("read: {e}")))?;
            if n == 0 {
                return Err(state("shorter than its size".to_owned()));
            }
            read += n;
        }
        StageState::decode(&bytes)
    }
}

/// Reads little-endian integers off the front of a byte slice.
struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], ProtocolError> {
        let (head, tail) = self
            .0
            .split_first_chunk::<N>()
            .ok_or_else(|| ProtocolError::State("truncated".to_owned()))?;
        self.0 = tail;
        Ok(*head)
    }

    fn u64(&mut self) -> Result<u64, ProtocolError> {
        self.take().map(u64::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, ProtocolError> {
        self.take().map(u32::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deposit(handed_over: bool) -> Deposit {
        Deposit {
            volume_id: "v1.volume".to_owned(),
            staging: PathBuf::from("/var/lib/kubelet/plugins/x/globalmount"),
            device: (0, 57),
            record: "00".to_owned(),
            context: BTreeMap::from([("generation".to_owned(), "7".to_owned())]),
            handed_over,
            tables: handed_over,
            reply_retention_ms: 60_000,
            call_budget_ms: 15_000,
            resend_window_ms: None,
            resend_rules: match handed_over {
                true => Vec::new(),
                false => vec![ResendWindow {
                    below: 1 << 20,
                    window_ms: 28_000,
                }],
            },
        }
    }

    #[test]
    fn messages_round_trip_with_their_version() {
        let requests = [
            Request::Deposit {
                stage: deposit(true),
            },
            Request::Withdraw {
                staging: PathBuf::from("/s"),
            },
            Request::Fetch,
            Request::Ping,
            Request::Journal {
                staging: PathBuf::from("/s"),
                changes: vec![
                    Change::Node {
                        node: 9,
                        generation: 2,
                    },
                    Change::Opened {
                        handle: 4,
                        ino: 9,
                        generation: 2,
                        flags: 1,
                        unique: 1 << 40,
                    },
                    Change::Delivered { handle: 4 },
                    Change::FirstRead { unique: 1 << 20 },
                    Change::Released { handle: 4 },
                    Change::Forgotten { node: 9 },
                ],
            },
        ];
        for request in requests {
            let bytes = encode(&request);
            assert_eq!(decode::<Request>(&bytes).unwrap(), request);
        }
        let answers = [
            Answer::Ok,
            Answer::Refused {
                reason: "no".to_owned(),
            },
            Answer::Stage {
                stage: deposit(false),
            },
            Answer::Done { count: 3 },
        ];
        for answer in answers {
            assert_eq!(decode::<Answer>(&encode(&answer)).unwrap(), answer);
        }
    }

    #[test]
    fn garbage_and_other_versions_are_refused_with_the_reason() {
        for garbage in [
            &b""[..],
            b"\xff\x00",
            b"{}",
            b"{\"v\":1,\"op\":\"explode\"}",
        ] {
            assert!(
                matches!(decode::<Request>(garbage), Err(ProtocolError::Garbage(_))),
                "{garbage:?}"
            );
        }
        let other = br#"{"v":2,"op":"ping"}"#;
        assert!(matches!(
            decode::<Request>(other),
            Err(ProtocolError::Version { found: 2 })
        ));
    }

    #[test]
    fn a_deposit_is_checked_before_it_is_kept() {
        let null = std::fs::File::open("/dev/null").unwrap();
        let fds = vec![OwnedFd::from(null)];
        // The descriptor count must match.
        assert!(matches!(
            deposit(true).check(&fds),
            Err(ProtocolError::Descriptors {
                expected: 2,
                found: 1
            })
        ));
        let bad_fields = [
            Deposit {
                volume_id: String::new(),
                ..deposit(false)
            },
            Deposit {
                volume_id: "a/b".to_owned(),
                ..deposit(false)
            },
            Deposit {
                staging: PathBuf::from("relative"),
                ..deposit(false)
            },
            Deposit {
                device: (8, 1),
                ..deposit(false)
            },
            Deposit {
                record: "zz".to_owned(),
                ..deposit(false)
            },
        ];
        for bad in bad_fields {
            assert!(
                matches!(bad.check(&fds), Err(ProtocolError::Invalid { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_stage_state_round_trips_and_refuses_what_it_did_not_write() {
        let state = StageState(MountState {
            nonce: ConnectionNonce([0xc3; 16]),
            nodes: vec![
                NodeState {
                    node: 1,
                    inode_generation: 1,
                    lookups: 1,
                },
                NodeState {
                    node: 99,
                    inode_generation: 7,
                    lookups: 3,
                },
            ],
            handles: vec![
                HandleState {
                    handle: 5,
                    file: FileId {
                        ino: 99,
                        inode_generation: 7,
                    },
                    flags: libc_o_append(),
                    opened_by: None,
                },
                HandleState {
                    handle: 6,
                    file: FileId {
                        ino: 99,
                        inode_generation: 7,
                    },
                    flags: 0,
                    opened_by: Some(0x8a),
                },
            ],
        });
        let bytes = state.encode();
        assert_eq!(bytes[4..8], STATE_VERSION.to_le_bytes());
        assert_eq!(StageState::decode(&bytes).unwrap(), state);

        // Every handle delivered: written as version 2, which an owner of the version before
        // reads; version 2 is read as every handle delivered.
        let mut delivered = state.clone();
        delivered.0.handles[1].opened_by = None;
        let v2 = delivered.encode();
        assert_eq!(v2[4..8], STATE_VERSION_UNMARKED.to_le_bytes());
        assert_eq!(v2.len(), bytes.len() - 2 * 8);
        assert_eq!(StageState::decode(&v2).unwrap(), delivered);
        let unmarked = state.encode_as(STATE_VERSION_UNMARKED);
        assert_eq!(StageState::decode(&unmarked).unwrap(), delivered);
        let fd = state.to_memfd_as(Some(STATE_VERSION)).unwrap();
        assert_eq!(StageState::from_memfd(&fd).unwrap(), state);

        let fd = state.to_memfd().unwrap();
        assert_eq!(StageState::from_memfd(&fd).unwrap(), state);
        // Sealed: it cannot be changed after the fact.
        assert!(rustix::io::write(&fd, b"x").is_err());

        for cut in [0, 3, 8, 20, bytes.len() - 1] {
            assert!(StageState::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(StageState::decode(&trailing).is_err());
        let mut future = bytes.clone();
        future[4..8].copy_from_slice(&4u32.to_le_bytes());
        let refused = StageState::decode(&future).unwrap_err();
        assert!(refused.to_string().contains("version 4"), "{refused}");
        let mut huge = bytes[..24].to_vec();
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(
            StageState::decode(&huge).is_err(),
            "a count beyond the bytes"
        );
        // Version 1 carried no nonce: refused, not read with a made-up one.
        let mut old = bytes.clone();
        old[4..8].copy_from_slice(&1u32.to_le_bytes());
        let refused = StageState::decode(&old).unwrap_err();
        assert!(refused.to_string().contains("version 1"), "{refused}");
        let unsealed = rustix::fs::memfd_create("x", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::io::write(&unsealed, &bytes).unwrap();
        assert!(StageState::from_memfd(&unsealed).is_err());
    }

    fn libc_o_append() -> u32 {
        0o2000
    }

    #[test]
    fn a_resend_window_is_the_time_left_and_never_more_than_a_day() {
        let now = std::time::Instant::now();
        let rule = fusefs::ResendRule {
            below: 12,
            until: now + std::time::Duration::from_secs(3),
        };
        let window = ResendWindow::of(rule, now);
        assert_eq!((window.below, window.window_ms), (12, 3_000));
        assert_eq!(window.rule(now), rule);
        let passed = ResendWindow::of(rule, now + std::time::Duration::from_secs(5));
        assert_eq!(passed.window_ms, 0);
        let huge = ResendWindow {
            below: 1,
            window_ms: u64::MAX,
        };
        assert_eq!(
            huge.rule(now).until,
            now + std::time::Duration::from_millis(MAX_CRASH_WINDOW_MS)
        );
    }

    #[test]
    fn hex_round_trips() {
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(hex_decode(&hex_encode(&bytes)).unwrap(), bytes);
        assert!(hex_decode("abc").is_none());
        assert!(hex_decode("g0").is_none());
    }
}
