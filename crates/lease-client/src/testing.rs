//! A stateful fake of a worker group, for tests of code that calls workers (feature
//! `testing`).
//!
//! [`FakeTransport`] implements [`Transport`] without a network. Behind it sits one
//! in-memory volume: the mount lease with epoch checks, a reply cache by request ID, and
//! canned results for file operations (it is not a file system; the reference worker is).
//! Faults are injected per endpoint or for the next attempt anywhere: refuse the
//! connection, drop the reply after applying, delay, hang, answer "not leader" with a hint,
//! "no quorum", "uncertain", refuse the credentials or answer an HTTP status.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::policy::Failure;
use crate::protocol::{
    AccessMode, MountEpoch, ROOT_INO, RequestId, VolumeGeneration, decode_request, encode_reply,
};
use crate::transport::{Transport, TransportError};
use crate::v1;
use crate::v1::reply::Result as ReplyResult;
use crate::v1::request::Op;

/// The identity of the fake's one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeVolume {
    /// The volume ID.
    pub volume_id: String,
    /// The volume generation.
    pub volume_generation: VolumeGeneration,
    /// The access mode; RWO volumes check the epoch on every call.
    pub access_mode: AccessMode,
}

/// A fault to inject into one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Refuse the connection: nothing is delivered.
    Refuse,
    /// Apply the request, then lose the reply.
    DropReply,
    /// Apply the request and answer after this long (the caller may give up first).
    Delay(Duration),
    /// Accept the request and never answer, applying nothing.
    Hang,
    /// Answer NOT_LEADER with this hint, applying nothing.
    NotLeader(Option<String>),
    /// Answer NO_QUORUM, applying nothing.
    NoQuorum,
    /// Apply the request but answer UNCERTAIN, as a worker that lost quorum after proposing.
    WorkerUncertain,
    /// Refuse the credentials (HTTP 401).
    Unauthorized,
    /// Answer this HTTP status without a reply.
    Status(u16),
}

/// One attempt as the fake received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The endpoint the attempt went to.
    pub endpoint: String,
    /// The request body, byte for byte.
    pub body: Bytes,
}

#[derive(Debug)]
struct Lease {
    epoch: MountEpoch,
    expires: Instant,
}

#[derive(Debug)]
struct State {
    volume: FakeVolume,
    leader: Option<String>,
    down: HashSet<String>,
    faults: HashMap<String, VecDeque<Fault>>,
    next_faults: VecDeque<Fault>,
    delay: Duration,
    lease: Option<Lease>,
    lease_duration: Duration,
    cache: HashMap<RequestId, Bytes>,
    applied: Vec<(RequestId, &'static str)>,
    received: Vec<Received>,
    in_flight: usize,
    max_in_flight: usize,
    next_handle: u64,
    knows_kill_suidgid: bool,
}

/// The fake worker group. Clones share the same state.
#[derive(Debug, Clone)]
pub struct FakeTransport {
    state: Arc<Mutex<State>>,
}

impl FakeTransport {
    /// A group serving `volume` on every endpoint, each of which leads, with a 90 s lease.
    pub fn new(volume: FakeVolume) -> Self {
        FakeTransport {
            state: Arc::new(Mutex::new(State {
                volume,
                leader: None,
                down: HashSet::new(),
                faults: HashMap::new(),
                next_faults: VecDeque::new(),
                delay: Duration::ZERO,
                lease: None,
                lease_duration: Duration::from_secs(90),
                cache: HashMap::new(),
                applied: Vec::new(),
                received: Vec::new(),
                in_flight: 0,
                max_in_flight: 0,
                next_handle: 1,
                knows_kill_suidgid: true,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Only `leader` leads; every other endpoint answers NOT_LEADER naming it. `None`: every
    /// endpoint leads.
    pub fn set_leader(&self, leader: Option<&str>) {
        self.lock().leader = leader.map(str::to_owned);
    }

    /// Takes `endpoint` down (every connection refused) or back up.
    pub fn set_down(&self, endpoint: &str, down: bool) {
        let mut state = self.lock();
        if down {
            state.down.insert(endpoint.to_owned());
        } else {
            state.down.remove(endpoint);
        }
    }

    /// Queues a fault for the next attempt at `endpoint`, or at any endpoint when `None`.
    /// Faults apply once each, in order.
    pub fn push_fault(&self, endpoint: Option<&str>, fault: Fault) {
        let mut state = self.lock();
        match endpoint {
            Some(endpoint) => state
                .faults
                .entry(endpoint.to_owned())
                .or_default()
                .push_back(fault),
            None => state.next_faults.push_back(fault),
        }
    }

    /// Forgets every queued fault and brings every endpoint back up.
    pub fn clear_faults(&self) {
        let mut state = self.lock();
        state.faults.clear();
        state.next_faults.clear();
        state.down.clear();
    }

    /// Delays every answer by `delay` (after applying).
    pub fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    /// With `false`, the group acts as workers that predate `write_kill_suidgid` and
    /// `open_kill_suidgid`: they find no operation they know in such a request and refuse it
    /// as INVALID_REQUEST, applying nothing (which is what the protocol relies on to keep an
    /// older worker from writing with the set-user-ID bits kept).
    pub fn set_knows_kill_suidgid(&self, knows: bool) {
        self.lock().knows_kill_suidgid = knows;
    }

    /// The lease length granted by claims and renewals.
    pub fn set_lease_duration(&self, lease: Duration) {
        self.lock().lease_duration = lease;
    }

    /// Another session takes the lease over with `epoch`, as if its claim had won.
    pub fn take_over(&self, epoch: MountEpoch) {
        let mut state = self.lock();
        let expires = Instant::now() + state.lease_duration;
        state.lease = Some(Lease { epoch, expires });
    }

    /// The epoch holding an unexpired lease, if any.
    pub fn lease_holder(&self) -> Option<MountEpoch> {
        let state = self.lock();
        state
            .lease
            .as_ref()
            .filter(|lease| lease.expires > Instant::now())
            .map(|lease| lease.epoch)
    }

    /// Every attempt received, in order.
    pub fn received(&self) -> Vec<Received> {
        self.lock().received.clone()
    }

    /// Every application of an operation, in order: request ID and operation name. A
    /// request answered from the reply cache is not applied again.
    pub fn applied(&self) -> Vec<(RequestId, &'static str)> {
        self.lock().applied.clone()
    }

    /// How many times the request with `request_id` was applied (0 or 1 for a correct
    /// client and worker).
    pub fn applications(&self, request_id: RequestId) -> usize {
        self.lock()
            .applied
            .iter()
            .filter(|(id, _)| *id == request_id)
            .count()
    }

    /// The most attempts that were ever being answered at once.
    pub fn max_in_flight(&self) -> usize {
        self.lock().max_in_flight
    }

    fn next_fault(&self, endpoint: &str) -> Option<Fault> {
        let mut state = self.lock();
        if state.down.contains(endpoint) {
            return Some(Fault::Refuse);
        }
        if let Some(fault) = state.faults.get_mut(endpoint).and_then(VecDeque::pop_front) {
            return Some(fault);
        }
        if let Some(fault) = state.next_faults.pop_front() {
            return Some(fault);
        }
        match &state.leader {
            Some(leader) if leader != endpoint => Some(Fault::NotLeader(Some(leader.clone()))),
            _ => None,
        }
    }

    async fn exchange(
        &self,
        endpoint: &str,
        body: Bytes,
        deadline: Instant,
    ) -> Result<Bytes, TransportError> {
        let fault = self.next_fault(endpoint);
        let request_id = decode_request(&body[..])
            .map(|request| request.request_id.0.to_vec())
            .unwrap_or_default();
        let error_reply = |kind: v1::ErrorKind, hint: Option<String>| {
            encode_reply(&v1::Reply {
                request_id: request_id.clone(),
                result: Some(ReplyResult::Error(v1::Error {
                    kind: kind.into(),
                    leader_hint: hint.unwrap_or_default(),
                    ..Default::default()
                })),
                ..Default::default()
            })
        };
        match fault {
            Some(Fault::Refuse) => Err(TransportError::NotDelivered(Failure::Connect)),
            Some(Fault::Unauthorized) => Err(TransportError::Unauthorized {
                credentials_changed: false,
            }),
            Some(Fault::Status(status)) if (400..500).contains(&status) => {
                Err(TransportError::Rejected { status })
            }
            Some(Fault::Status(_)) => Err(TransportError::MaybeDelivered(Failure::BadReply)),
            Some(Fault::Hang) => {
                tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)).await;
                Err(TransportError::MaybeDelivered(Failure::Timeout))
            }
            Some(Fault::NotLeader(hint)) => Ok(error_reply(v1::ErrorKind::NotLeader, hint)),
            Some(Fault::NoQuorum) => Ok(error_reply(v1::ErrorKind::NoQuorum, None)),
            Some(Fault::DropReply) => {
                self.apply(&body);
                Err(TransportError::MaybeDelivered(Failure::Connection))
            }
            Some(Fault::WorkerUncertain) => {
                self.apply(&body);
                Ok(error_reply(v1::ErrorKind::Uncertain, None))
            }
            Some(Fault::Delay(delay)) => {
                let reply = self.apply(&body);
                tokio::time::sleep(delay).await;
                Ok(reply)
            }
            None => {
                let reply = self.apply(&body);
                let delay = self.lock().delay;
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                Ok(reply)
            }
        }
    }

    /// Applies one request in order, as the worker's apply loop would, and returns the
    /// encoded reply.
    fn apply(&self, body: &[u8]) -> Bytes {
        let mut state = self.lock();
        let now = Instant::now();
        let request = match decode_request(body) {
            Ok(request) => request,
            Err(err) => {
                return encode_reply(&v1::Reply {
                    request_id: Vec::new(),
                    result: Some(ReplyResult::Error(err.to_wire())),
                    ..Default::default()
                });
            }
        };
        let reply = |result: ReplyResult| {
            encode_reply(&v1::Reply {
                request_id: request.request_id.0.to_vec(),
                result: Some(result),
                ..Default::default()
            })
        };
        let error = |kind: v1::ErrorKind, lease_remaining: Duration| {
            reply(ReplyResult::Error(v1::Error {
                kind: kind.into(),
                lease_remaining_ms: u64::try_from(lease_remaining.as_millis()).unwrap_or(u64::MAX),
                ..Default::default()
            }))
        };
        if request.volume_id != state.volume.volume_id {
            return error(v1::ErrorKind::UnknownVolume, Duration::ZERO);
        }
        if request.volume_generation != state.volume.volume_generation
            || request.access_mode != state.volume.access_mode
        {
            return error(v1::ErrorKind::IdentityMismatch, Duration::ZERO);
        }
        let holder = state
            .lease
            .as_ref()
            .filter(|lease| lease.expires > now)
            .map(|lease| (lease.epoch, lease.expires));
        let is_lease_command = matches!(request.op, Op::ClaimMount(_) | Op::ReleaseMount(_));
        let epoch_ok = state.volume.access_mode != AccessMode::Rwo
            || is_lease_command
            || (request.mount_epoch.is_some()
                && holder.map(|(epoch, _)| epoch) == request.mount_epoch);
        if !epoch_ok {
            return error(v1::ErrorKind::StaleEpoch, Duration::ZERO);
        }
        if let Some(cached) = state.cache.get(&request.request_id) {
            return cached.clone();
        }
        let kill_suidgid = match &request.op {
            Op::WriteKillSuidgid(kill) => Some(kill.caller.is_some() && kill.write.is_some()),
            Op::OpenKillSuidgid(kill) => Some(kill.caller.is_some() && kill.open.is_some()),
            _ => None,
        };
        if kill_suidgid == Some(false) || (kill_suidgid.is_some() && !state.knows_kill_suidgid) {
            return error(v1::ErrorKind::InvalidRequest, Duration::ZERO);
        }

        let result = match &request.op {
            Op::ClaimMount(_) => match (holder, request.mount_epoch) {
                (_, None) => return error(v1::ErrorKind::InvalidRequest, Duration::ZERO),
                (Some((epoch, expires)), Some(mine)) if epoch != mine => {
                    return error(v1::ErrorKind::LeaseHeld, expires - now);
                }
                (_, Some(mine)) => {
                    let lease_duration = state.lease_duration;
                    state.lease = Some(Lease {
                        epoch: mine,
                        expires: now + lease_duration,
                    });
                    ReplyResult::ClaimMount(lease_reply(mine, lease_duration))
                }
            },
            Op::RenewMount(_) => {
                let lease_duration = state.lease_duration;
                let epoch = request.mount_epoch.unwrap_or(MountEpoch([0; 16]));
                state.lease = Some(Lease {
                    epoch,
                    expires: now + lease_duration,
                });
                ReplyResult::RenewMount(lease_reply(epoch, lease_duration))
            }
            Op::ReleaseMount(_) => {
                let released =
                    holder.is_some() && holder.map(|(epoch, _)| epoch) == request.mount_epoch;
                if released {
                    state.lease = None;
                }
                ReplyResult::ReleaseMount(v1::ReleaseMountReply { released })
            }
            op => canned(op, &mut state.next_handle),
        };
        let encoded = reply(result);
        state.applied.push((request.request_id, request.op.name()));
        state.cache.insert(request.request_id, encoded.clone());
        encoded
    }
}

fn lease_reply(epoch: MountEpoch, lease: Duration) -> v1::LeaseReply {
    v1::LeaseReply {
        mount_epoch: epoch.0.to_vec(),
        lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
    }
}

/// A plausible result of the right kind for a file operation.
fn canned(op: &Op, next_handle: &mut u64) -> ReplyResult {
    let entry = |ino: u64, mode: u32| v1::Entry {
        file: Some(v1::FileId {
            ino,
            inode_generation: 1,
        }),
        attr: Some(v1::Attr {
            mode,
            nlink: 1,
            blksize: 4096,
            ..Default::default()
        }),
    };
    let mut handle = || {
        let handle = *next_handle;
        *next_handle += 1;
        handle
    };
    match op {
        Op::Lookup(_) => ReplyResult::Lookup(entry(2, 0o100_644)),
        Op::Getattr(_) => ReplyResult::Getattr(entry(ROOT_INO, 0o040_755)),
        Op::Setattr(_) => ReplyResult::Setattr(entry(2, 0o100_644)),
        Op::Mknod(_) => ReplyResult::Mknod(entry(2, 0o100_644)),
        Op::Create(_) => ReplyResult::Create(v1::CreateReply {
            entry: Some(entry(2, 0o100_644)),
            handle: handle(),
            handle_lease_ms: 60_000,
        }),
        Op::Mkdir(_) => ReplyResult::Mkdir(entry(3, 0o040_755)),
        Op::Unlink(_) => ReplyResult::Unlink(v1::Empty {}),
        Op::Rmdir(_) => ReplyResult::Rmdir(v1::Empty {}),
        Op::Rename(_) => ReplyResult::Rename(v1::Empty {}),
        Op::Link(_) => ReplyResult::Link(entry(2, 0o100_644)),
        Op::Symlink(_) => ReplyResult::Symlink(entry(4, 0o120_777)),
        Op::Readlink(_) => ReplyResult::Readlink(v1::ReadlinkReply {
            target: b"target".to_vec(),
        }),
        Op::Readdir(_) => ReplyResult::Readdir(v1::ReaddirReply {
            entries: Vec::new(),
            end: true,
        }),
        Op::Open(_) => ReplyResult::Open(v1::OpenReply {
            handle: handle(),
            handle_lease_ms: 60_000,
        }),
        Op::OpenKillSuidgid(_) => ReplyResult::OpenKillSuidgid(v1::OpenReply {
            handle: handle(),
            handle_lease_ms: 60_000,
        }),
        Op::Read(read) => ReplyResult::Read(v1::ReadReply {
            data: Bytes::from(vec![0; usize::try_from(read.size).unwrap_or(0)]),
        }),
        Op::Write(_) => ReplyResult::Write(v1::WriteReply {
            written: u32::try_from(op.data_len()).unwrap_or(u32::MAX),
        }),
        Op::WriteKillSuidgid(_) => ReplyResult::WriteKillSuidgid(v1::WriteReply {
            written: u32::try_from(op.data_len()).unwrap_or(u32::MAX),
        }),
        Op::Flush(_) => ReplyResult::Flush(v1::Empty {}),
        Op::Fsync(_) => ReplyResult::Fsync(v1::Empty {}),
        Op::Release(_) => ReplyResult::Release(v1::Empty {}),
        Op::RenewHandles(_) => ReplyResult::RenewHandles(v1::RenewHandlesReply {
            handle_lease_ms: 60_000,
            expired: Vec::new(),
        }),
        Op::Statfs(_) => ReplyResult::Statfs(v1::StatfsReply {
            block_size: 4096,
            name_max: 255,
            ..Default::default()
        }),
        Op::ClaimMount(_) | Op::RenewMount(_) | Op::ReleaseMount(_) => {
            ReplyResult::Error(v1::Error {
                kind: v1::ErrorKind::InvalidRequest.into(),
                ..Default::default()
            })
        }
    }
}

/// Counts an attempt in flight for as long as it lives, dropped or not.
struct InFlight<'a>(&'a FakeTransport);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.lock().in_flight -= 1;
    }
}

impl Transport for FakeTransport {
    async fn send(
        &self,
        endpoint: &str,
        body: Bytes,
        deadline: Instant,
    ) -> Result<Bytes, TransportError> {
        let _in_flight = {
            let mut state = self.lock();
            state.received.push(Received {
                endpoint: endpoint.to_owned(),
                body: body.clone(),
            });
            state.in_flight += 1;
            state.max_in_flight = state.max_in_flight.max(state.in_flight);
            InFlight(self)
        };
        self.exchange(endpoint, body, deadline).await
    }
}
