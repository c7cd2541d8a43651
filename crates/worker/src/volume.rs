//! One volume's state and the single apply loop that changes it.
//!
//! [`Volume::apply`] decides one request synchronously, in the order requests arrive: identity
//! checks, handle reclamation, the epoch check (RWO), the reply cache, the operation, and the
//! journal write of any durable change, which happens before the reply exists. The loop in
//! [`spawn`] runs it on a dedicated thread; callers send requests over a channel with a
//! one-shot for the reply, so the order in which the thread receives requests is the committed
//! order.
//!
//! The volume sits in a [`Slot`], a mutex the loop holds while it applies a command. A lookup
//! or a getattr need not queue: [`apply_now`] applies it on the caller's thread when the slot
//! is free, which saves the hop to the loop's thread and back. Everything a request sees is
//! still applied one at a time under that mutex, and a read changes no file, so the committed
//! order of changes is the loop's, and a read sees every change acknowledged before it was
//! sent (its reply was written after the change was applied and the mutex released).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rustix::fs::{Mode, OFlags};
use tokio::sync::{mpsc, oneshot};
use worker_proto::v1;
use worker_proto::v1::reply::Result as Done;
use worker_proto::v1::request::Op;
use worker_proto::{DecodedRequest, encode_reply};

use crate::clock::Clock;
use crate::dedup::{Cached, DedupCache, Digest};
use crate::error::Error;
use crate::faults::Faults;
use crate::fsops::OpError;
use crate::handles::HandleTable;
use crate::inode::InodeTable;
use crate::lease::{LeaseCommand, LeaseOutcome, LeaseState};
use crate::listing::Listings;
use crate::meta::{self, MetaStore, Record, Snapshot};
use crate::{AccessMode, Reopen, VolumeSpec};

/// The settings of one volume's apply loop.
#[derive(Clone, Copy, Debug)]
pub(crate) struct VolumeOptions {
    pub(crate) lease_ms: u64,
    pub(crate) handle_lease_ms: u64,
    pub(crate) dedup_capacity: usize,
    pub(crate) dedup_retention_ms: u64,
    pub(crate) compact_after: usize,
    pub(crate) reopen: Reopen,
}

#[derive(Debug)]
pub(crate) struct Volume {
    pub(crate) spec: VolumeSpec,
    pub(crate) meta: MetaStore,
    lease: LeaseState,
    pub(crate) inodes: InodeTable,
    pub(crate) handles: HandleTable,
    /// Directory listings kept between the batches of a readdir.
    pub(crate) listings: Listings,
    dedup: DedupCache,
    options: VolumeOptions,
    /// A journal write failed: the durable state is unknown until the volume is reopened.
    failed: bool,
}

/// What the apply step decided.
enum Answer {
    /// A reply from the cache, already encoded.
    Cached(Bytes),
    /// A fresh result; `cache` when it is a successful mutation.
    Fresh { result: Done, cache: bool },
}

fn wire_error(kind: v1::ErrorKind, message: impl Into<String>) -> v1::Error {
    v1::Error {
        kind: kind.into(),
        message: message.into(),
        ..Default::default()
    }
}

fn refusal(kind: v1::ErrorKind, message: impl Into<String>) -> Done {
    Done::Error(wire_error(kind, message))
}

fn refused(error: v1::Error) -> Answer {
    Answer::Fresh {
        result: Done::Error(error),
        cache: false,
    }
}

/// The refusal of a mutation the reply cache has no room to remember.
fn busy() -> Answer {
    fresh_error(
        v1::ErrorKind::Busy,
        "the reply cache is full of replies within their retention; retry later",
    )
}

fn fresh_error(kind: v1::ErrorKind, message: impl Into<String>) -> Answer {
    Answer::Fresh {
        result: refusal(kind, message),
        cache: false,
    }
}

/// The encoded reply carrying `result`, stating the worker's reply retention.
pub(crate) fn reply_bytes(request_id: &[u8], result: Done, retention_ms: u64) -> Bytes {
    encode_reply(&v1::Reply {
        request_id: request_id.to_vec(),
        result: Some(result),
        reply_retention_ms: retention_ms,
    })
}

/// An error result of the given kind.
pub(crate) fn error_result(kind: v1::ErrorKind, message: impl Into<String>) -> Done {
    refusal(kind, message)
}

impl Volume {
    /// Opens a created volume from its directory below `state_dir`, checking that it was
    /// created with `spec`'s identity.
    pub(crate) fn open(
        state_dir: &Path,
        spec: &VolumeSpec,
        options: VolumeOptions,
    ) -> Result<Self, Error> {
        let dir = meta::volume_dir(state_dir, &spec.volume_id);
        match meta::read_identity(&dir)? {
            None => {
                return Err(Error::UnknownVolume {
                    volume_id: spec.volume_id.clone(),
                });
            }
            Some(existing) if &existing != spec => {
                return Err(Error::IdentityMismatch {
                    existing,
                    requested: spec.clone(),
                });
            }
            Some(_) => {}
        }
        let (meta, snapshot) = MetaStore::open(&dir)?;
        let data = dir.join(meta::DATA);
        let root = rustix::fs::open(
            &data,
            // Not O_PATH: open_by_handle_at(2) refuses an O_PATH descriptor as its mount fd.
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::io("open", &data, e.into()))?;
        let inodes = InodeTable::new(
            root,
            &snapshot.inodes,
            snapshot.next_generation,
            options.reopen,
        )
        .map_err(|e| Error::io(e.action, &data, e.source))?;
        let mut nonce = [0u8; 4];
        rustix::rand::getrandom(&mut nonce, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| Error::io("draw a handle nonce for", &dir, e.into()))?;
        Ok(Self {
            spec: spec.clone(),
            meta,
            lease: snapshot.lease,
            inodes,
            handles: HandleTable::new(u32::from_ne_bytes(nonce)),
            listings: Listings::default(),
            dedup: DedupCache::new(options.dedup_capacity, options.dedup_retention_ms),
            options,
            failed: false,
        })
    }

    pub(crate) fn handle_lease_ms(&self) -> u64 {
        self.options.handle_lease_ms
    }

    /// The lease state, for inspection.
    pub(crate) fn lease(&self) -> &LeaseState {
        &self.lease
    }

    /// Reclaims expired handles without a request (the loop's idle tick).
    pub(crate) fn tick(&mut self, now_ms: u64) {
        self.handles.reclaim(self.lease.clamp(now_ms));
    }

    /// Applies one decoded request at the clock reading `now_ms`: the encoded reply, and
    /// whether it applied a mutation (one that succeeded and was not answered from the reply
    /// cache).
    pub(crate) fn apply(
        &mut self,
        request: &DecodedRequest,
        digest: Digest,
        now_ms: u64,
    ) -> (Bytes, bool) {
        let request_id = request.request_id.0;
        let answer = self.decide(request, digest, now_ms);
        if !self.failed && self.meta.journal_records() >= self.options.compact_after {
            let snapshot = Snapshot {
                lease: self.lease.clone(),
                next_generation: self.inodes.next_generation(),
                inodes: self.inodes.entries(),
            };
            if let Err(error) = self.meta.compact(&snapshot) {
                tracing::error!(volume = %self.spec.volume_id, error = %error, "journal compaction failed");
                self.failed = true;
            }
        }
        match answer {
            Answer::Cached(bytes) => (bytes, false),
            Answer::Fresh { result, cache } => {
                let bytes = reply_bytes(&request_id, result, self.dedup.retention_ms());
                if cache {
                    self.dedup.insert(request_id, digest, bytes.clone(), now_ms);
                }
                (bytes, cache)
            }
        }
    }

    fn decide(&mut self, request: &DecodedRequest, digest: Digest, now_ms: u64) -> Answer {
        use v1::ErrorKind as Kind;
        if self.failed {
            return fresh_error(
                Kind::NoQuorum,
                "the volume's journal failed; it serves again after a restart",
            );
        }
        if request.volume_generation.0 != self.spec.volume_generation {
            return fresh_error(
                Kind::IdentityMismatch,
                format!(
                    "volume generation {} is not the volume's {}",
                    request.volume_generation.0, self.spec.volume_generation
                ),
            );
        }
        if AccessMode::from_wire(request.access_mode) != Some(self.spec.access_mode) {
            return fresh_error(
                Kind::IdentityMismatch,
                format!("the volume's access mode is {}", self.spec.access_mode),
            );
        }
        self.handles.reclaim(self.lease.clamp(now_ms));
        let epoch = request.mount_epoch.map(|e| e.0);
        let lease_command = match &request.op {
            Op::ClaimMount(claim) => Some(match epoch {
                Some(epoch) => LeaseCommand::Claim {
                    node: &claim.node_id,
                    epoch,
                },
                None => {
                    return fresh_error(Kind::InvalidRequest, "claim_mount needs a mount epoch");
                }
            }),
            Op::RenewMount(_) => Some(match epoch {
                Some(epoch) => LeaseCommand::Renew { epoch },
                None => return fresh_error(Kind::StaleEpoch, "renew_mount without a mount epoch"),
            }),
            Op::ReleaseMount(_) => Some(match epoch {
                Some(epoch) => LeaseCommand::Release { epoch },
                None => {
                    return fresh_error(Kind::StaleEpoch, "release_mount without a mount epoch");
                }
            }),
            _ => None,
        };
        if let Some(command) = lease_command {
            if self.spec.access_mode != AccessMode::Rwo {
                return fresh_error(Kind::InvalidRequest, "lease commands are for RWO volumes");
            }
            return self.lease_command(request, command, digest, now_ms);
        }
        let at_ms = if self.spec.access_mode == AccessMode::Rwo {
            match self.check_epoch(epoch, now_ms) {
                Ok(at_ms) => at_ms,
                Err(error) => return refused(error),
            }
        } else {
            self.lease.clamp(now_ms)
        };
        let mutation = !request.op.is_read_only();
        if mutation {
            match self.dedup.lookup(&request.request_id.0, &digest) {
                Cached::Hit(bytes) => return Answer::Cached(bytes),
                Cached::Conflict => {
                    return fresh_error(
                        Kind::InvalidRequest,
                        "the request ID was used for a different request",
                    );
                }
                // Renewing handles keeps what is open alive: never refused for want of room.
                Cached::Miss
                    if !matches!(request.op, Op::RenewHandles(_))
                        && !self.dedup.has_room(now_ms) =>
                {
                    return busy();
                }
                Cached::Miss => {}
            }
        }
        match self.file_op(&request.op, at_ms) {
            Ok(result) => Answer::Fresh {
                result,
                cache: mutation,
            },
            Err(error) => Answer::Fresh {
                result: self.op_error(error),
                cache: false,
            },
        }
    }

    fn op_error(&mut self, error: OpError) -> Done {
        use v1::ErrorKind as Kind;
        match error {
            OpError::Errno(errno) => Done::Error(v1::Error {
                kind: Kind::Errno.into(),
                errno: errno.clamp(1, 4095),
                message: rustix::io::Errno::from_raw_os_error(errno).to_string(),
                ..Default::default()
            }),
            OpError::Invalid(why) => refusal(Kind::InvalidRequest, why),
            OpError::Journal(error) => {
                tracing::error!(volume = %self.spec.volume_id, error = %error, "journal write failed");
                self.failed = true;
                refusal(
                    Kind::Uncertain,
                    "the journal write failed; the operation may or may not have taken effect",
                )
            }
        }
    }

    /// Journals the lease state after a change; on failure the volume stops serving.
    fn journal_lease(&mut self) -> Result<(), v1::Error> {
        let record = Record::Lease {
            lease: self.lease.clone(),
        };
        self.meta.append(&record).map_err(|error| {
            tracing::error!(volume = %self.spec.volume_id, error = %error, "journal write failed");
            self.failed = true;
            wire_error(
                v1::ErrorKind::Uncertain,
                "the journal write failed; the lease command may or may not have taken effect",
            )
        })
    }

    /// The epoch check of a read or mutation on an RWO volume: the lease time to act at, or
    /// the refusal to answer.
    fn check_epoch(&mut self, epoch: Option<[u8; 16]>, now_ms: u64) -> Result<u64, v1::Error> {
        let applied =
            self.lease
                .apply(LeaseCommand::Check { epoch }, now_ms, self.options.lease_ms);
        if applied.changed {
            self.journal_lease()?;
        }
        match applied.outcome {
            LeaseOutcome::Valid => Ok(applied.at_ms),
            LeaseOutcome::MissingEpoch => Err(wire_error(
                v1::ErrorKind::StaleEpoch,
                "the request carries no mount epoch and the volume is RWO",
            )),
            _ => Err(wire_error(
                v1::ErrorKind::StaleEpoch,
                "the mount epoch does not hold the volume's lease",
            )),
        }
    }

    fn lease_command(
        &mut self,
        request: &DecodedRequest,
        command: LeaseCommand<'_>,
        digest: Digest,
        now_ms: u64,
    ) -> Answer {
        use v1::ErrorKind as Kind;
        match self.dedup.lookup(&request.request_id.0, &digest) {
            Cached::Conflict => {
                return fresh_error(
                    Kind::InvalidRequest,
                    "the request ID was used for a different request",
                );
            }
            Cached::Hit(bytes) => {
                return match command {
                    // A release answers the same whoever holds the lease now.
                    LeaseCommand::Release { .. } => Answer::Cached(bytes),
                    LeaseCommand::Claim { epoch, .. } | LeaseCommand::Renew { epoch } => {
                        match self.check_epoch(Some(epoch), now_ms) {
                            Ok(_) => Answer::Cached(bytes),
                            Err(error) => refused(error),
                        }
                    }
                    LeaseCommand::Check { .. } => {
                        fresh_error(Kind::InvalidRequest, "not a lease command")
                    }
                };
            }
            // Lease commands are never refused for want of room: a lease lapsing under a flood
            // of writes would fence the mount. They are few (one renewal per interval).
            Cached::Miss => {}
        }
        let applied = self.lease.apply(command, now_ms, self.options.lease_ms);
        if applied.changed
            && let Err(error) = self.journal_lease()
        {
            return refused(error);
        }
        let epoch = request
            .mount_epoch
            .map(|e| e.0.to_vec())
            .unwrap_or_default();
        let result = match applied.outcome {
            LeaseOutcome::Granted { lease_ms } => Done::ClaimMount(v1::LeaseReply {
                mount_epoch: epoch,
                lease_ms,
            }),
            LeaseOutcome::Renewed { lease_ms } => Done::RenewMount(v1::LeaseReply {
                mount_epoch: epoch,
                lease_ms,
            }),
            LeaseOutcome::Released { released } => {
                Done::ReleaseMount(v1::ReleaseMountReply { released })
            }
            LeaseOutcome::Held { remaining_ms } => Done::Error(v1::Error {
                kind: Kind::LeaseHeld.into(),
                message: "another mount epoch holds the lease".into(),
                lease_remaining_ms: remaining_ms,
                ..Default::default()
            }),
            LeaseOutcome::Stale | LeaseOutcome::MissingEpoch => refusal(
                Kind::StaleEpoch,
                "the mount epoch does not hold the volume's lease",
            ),
            LeaseOutcome::Valid => refusal(Kind::InvalidRequest, "not a lease command"),
        };
        let cache = !matches!(result, Done::Error(_));
        Answer::Fresh { result, cache }
    }
}

/// A message to a volume's apply loop.
#[derive(Debug)]
pub(crate) enum Command {
    /// Apply a request and send back the encoded reply.
    Call {
        request: Box<DecodedRequest>,
        digest: Digest,
        reply: oneshot::Sender<Bytes>,
    },
    /// Reclaim expired handles.
    Tick,
    /// Drop all in-memory state and reload the volume from disk, as a restarted worker would.
    Reload {
        done: oneshot::Sender<Result<(), Error>>,
    },
    /// Report the lease state.
    Inspect {
        reply: oneshot::Sender<Option<LeaseState>>,
    },
    /// Drop the volume (closing every descriptor it holds), refuse whatever is queued behind
    /// this command with UNKNOWN_VOLUME, signal `done` and end the loop: the volume is being
    /// deleted.
    Stop { done: oneshot::Sender<()> },
}

/// A volume shared by its apply loop and [`apply_now`]: the loop locks it for every command
/// it applies. `None` while the loop reloads the volume and once it has stopped.
pub(crate) type Slot = Arc<Mutex<Option<Volume>>>;

/// Starts the apply loop of `volume` on its own thread; it ends when every sender is gone.
/// Each mutation it applies is noted in `faults` ([`Faults::log_applied`]). The sender and the
/// volume's slot, for [`apply_now`].
pub(crate) fn spawn(
    volume: Volume,
    state_dir: PathBuf,
    clock: Arc<dyn Clock>,
    queue: usize,
    faults: Faults,
) -> Result<(mpsc::Sender<Command>, Slot), Error> {
    let (tx, rx) = mpsc::channel(queue.max(1));
    let name = format!("apply-{}", volume.spec.volume_id);
    let name = name.chars().take(15).collect::<String>();
    let slot = Arc::new(Mutex::new(Some(volume)));
    let owned = Arc::clone(&slot);
    std::thread::Builder::new()
        .name(name)
        .spawn(move || apply_loop(&owned, rx, &state_dir, clock.as_ref(), &faults))
        .map_err(|e| Error::io("start the apply loop for", PathBuf::new(), e))?;
    Ok((tx, slot))
}

/// Applies a lookup or a getattr on the calling thread, if the volume is free: its reply.
/// `None`, and the request is to be queued, when it is another operation, when the apply loop
/// holds the volume (the request then waits behind what the loop is applying), when the volume
/// is not loaded, or when an earlier apply panicked.
///
/// These two need no queue: they change no file and read no file data, and applying them
/// under the slot's mutex keeps them in line with every change (see the module's
/// documentation). Most are a `stat` and a table lookup. The exceptions write the journal (an
/// `fsync`) on the calling thread: a lookup that names an inode for the first time, once per
/// inode, and an epoch check that retires an expired lease, once per lease.
pub(crate) fn apply_now(
    slot: &Slot,
    request: &DecodedRequest,
    digest: Digest,
    now_ms: u64,
) -> Option<Bytes> {
    if !matches!(request.op, Op::Lookup(_) | Op::Getattr(_)) {
        return None;
    }
    let mut guard = slot.try_lock().ok()?;
    let (bytes, _) = guard.as_mut()?.apply(request, digest, now_ms);
    Some(bytes)
}

fn apply_loop(
    slot: &Slot,
    mut rx: mpsc::Receiver<Command>,
    state_dir: &Path,
    clock: &dyn Clock,
    faults: &Faults,
) {
    // Poisoned: an apply panicked, on this thread or a caller's. The loop ends, as it did when
    // the volume was its own: queued callers see their reply dropped, later ones a closed queue.
    let lock = || slot.lock().ok();
    let Some((spec, options)) =
        lock().and_then(|v| v.as_ref().map(|v| (v.spec.clone(), v.options)))
    else {
        return;
    };
    while let Some(command) = rx.blocking_recv() {
        let Some(mut volume) = lock() else { return };
        match command {
            Command::Call {
                request,
                digest,
                reply,
            } => {
                let bytes = match volume.as_mut() {
                    Some(volume) => {
                        let (bytes, applied) = volume.apply(&request, digest, clock.now_ms());
                        if applied {
                            faults.note_applied(request.request_id.0);
                        }
                        bytes
                    }
                    None => reply_bytes(
                        &request.request_id.0,
                        refusal(v1::ErrorKind::NoQuorum, "the volume failed to reload"),
                        options.dedup_retention_ms,
                    ),
                };
                let _ = reply.send(bytes);
            }
            Command::Tick => {
                if let Some(volume) = volume.as_mut() {
                    volume.tick(clock.now_ms());
                }
            }
            Command::Reload { done } => {
                // The old state goes first (its descriptors closed), then the volume is read
                // from disk with the slot free: a lookup meanwhile finds no volume and queues.
                *volume = None;
                drop(volume);
                let reopened = Volume::open(state_dir, &spec, options);
                let result = match (reopened, lock()) {
                    (Ok(reopened), Some(mut volume)) => {
                        *volume = Some(reopened);
                        Ok(())
                    }
                    (Ok(_), None) => return,
                    (Err(error), _) => Err(error),
                };
                let _ = done.send(result);
            }
            Command::Inspect { reply } => {
                let _ = reply.send(volume.as_ref().map(|v| v.lease().clone()));
            }
            Command::Stop { done } => {
                drop(volume.take());
                drop(volume);
                // Senders still waiting for room now fail; what is already queued is refused.
                rx.close();
                while let Some(queued) = rx.blocking_recv() {
                    refuse_deleted(queued, &spec.volume_id, options.dedup_retention_ms);
                }
                let _ = done.send(());
                return;
            }
        }
    }
}

/// Answers a command that reached a deleted volume's loop after its [`Command::Stop`].
fn refuse_deleted(command: Command, volume_id: &str, retention_ms: u64) {
    match command {
        Command::Call { request, reply, .. } => {
            let _ = reply.send(reply_bytes(
                &request.request_id.0,
                refusal(v1::ErrorKind::UnknownVolume, "the volume was deleted"),
                retention_ms,
            ));
        }
        Command::Tick => {}
        Command::Reload { done } => {
            let _ = done.send(Err(Error::UnknownVolume {
                volume_id: volume_id.to_owned(),
            }));
        }
        Command::Inspect { reply } => {
            let _ = reply.send(None);
        }
        Command::Stop { done } => {
            let _ = done.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::{Arc, Mutex};

    use tokio::sync::{mpsc, oneshot};
    use worker_proto::v1;
    use worker_proto::v1::request::Op;
    use worker_proto::{
        AccessMode, DecodedRequest, ROOT_INO, ROOT_INODE_GENERATION, decode_reply, decode_request,
        encode_request,
    };

    use super::{Command, Slot, Volume, VolumeOptions, apply_loop, apply_now};
    use crate::clock::ManualClock;
    use crate::config::VolumeSpec;
    use crate::error::Error;
    use crate::{dedup, meta};

    fn root() -> Option<v1::FileId> {
        Some(v1::FileId {
            ino: ROOT_INO,
            inode_generation: ROOT_INODE_GENERATION,
        })
    }

    /// A decoded request of volume `v` with the request ID `[id; 16]`, and its digest.
    fn request(id: u8, op: Op) -> (DecodedRequest, dedup::Digest) {
        let body = encode_request(&v1::Request {
            volume_id: "v".into(),
            volume_generation: 1,
            request_id: vec![id; 16],
            mount_epoch: Vec::new(),
            access_mode: AccessMode::Rwx.into(),
            op: Some(op),
        });
        (decode_request(body.clone()).unwrap(), dedup::digest(&body))
    }

    fn getattr_op() -> Op {
        Op::Getattr(v1::GetattrRequest {
            file: root(),
            handle: None,
        })
    }

    /// A call of `op` for the loop, and where its reply arrives.
    fn call(id: u8, op: Op) -> (Command, oneshot::Receiver<bytes::Bytes>) {
        let (request, digest) = request(id, op);
        let (reply, answer) = oneshot::channel();
        let command = Command::Call {
            request: Box::new(request),
            digest,
            reply,
        };
        (command, answer)
    }

    fn getattr(id: u8) -> (Command, oneshot::Receiver<bytes::Bytes>) {
        call(id, getattr_op())
    }

    /// Volume `v` (RWX), created and opened in `state`.
    fn open_volume(state: &Path) -> Volume {
        let spec = VolumeSpec {
            volume_id: "v".into(),
            volume_generation: 1,
            access_mode: crate::AccessMode::Rwx,
        };
        meta::create(&meta::volume_dir(state, "v"), &spec).unwrap();
        let options = VolumeOptions {
            lease_ms: 90_000,
            handle_lease_ms: 60_000,
            dedup_capacity: 64,
            dedup_retention_ms: 30_000,
            compact_after: 1000,
            reopen: crate::inode::reopen_for_tests(),
        };
        Volume::open(state, &spec, options).unwrap()
    }

    fn decoded(bytes: bytes::Bytes) -> v1::reply::Result {
        decode_reply(bytes).unwrap().result.unwrap()
    }

    fn result(answer: oneshot::Receiver<bytes::Bytes>) -> v1::reply::Result {
        decoded(answer.blocking_recv().unwrap())
    }

    #[test]
    fn a_stop_drops_the_volume_and_refuses_what_is_queued_behind_it() {
        let state = tempfile::tempdir().unwrap();
        let volume = open_volume(state.path());

        // Everything is queued before the loop runs, so the order is fixed.
        let (tx, rx) = mpsc::channel(8);
        let (before, answered) = getattr(1);
        tx.try_send(before).unwrap();
        let (done, stopped) = oneshot::channel();
        tx.try_send(Command::Stop { done }).unwrap();
        let (behind, refused) = getattr(2);
        tx.try_send(behind).unwrap();
        let (reply, inspected) = oneshot::channel();
        tx.try_send(Command::Inspect { reply }).unwrap();
        let (done_reload, reloaded) = oneshot::channel();
        tx.try_send(Command::Reload { done: done_reload }).unwrap();
        tx.try_send(Command::Tick).unwrap();

        // The loop returns at the stop although `tx` is still alive.
        apply_loop(
            &Arc::new(Mutex::new(Some(volume))),
            rx,
            state.path(),
            &ManualClock::new(1),
            &crate::Faults::default(),
        );

        assert!(matches!(result(answered), v1::reply::Result::Getattr(_)));
        stopped.blocking_recv().unwrap();
        let v1::reply::Result::Error(error) = result(refused) else {
            panic!("a call behind the stop was applied");
        };
        assert_eq!(error.kind(), v1::ErrorKind::UnknownVolume);
        assert_eq!(inspected.blocking_recv().unwrap(), None);
        assert!(matches!(
            reloaded.blocking_recv().unwrap(),
            Err(Error::UnknownVolume { .. })
        ));
        assert!(tx.is_closed(), "later senders fail instead of waiting");
    }

    /// A lookup or a getattr is applied on the caller's thread when the volume is free, and
    /// sees what the loop acknowledged before it; it is left to the queue while the loop holds
    /// the volume and once the loop has stopped, and every other operation always is.
    #[test]
    fn lookups_and_getattrs_are_applied_at_once_in_line_with_the_loop() {
        let state = tempfile::tempdir().unwrap();
        let slot: Slot = Arc::new(Mutex::new(Some(open_volume(state.path()))));
        let (tx, rx) = mpsc::channel(8);
        let apply = {
            let slot = Arc::clone(&slot);
            let dir = state.path().to_owned();
            std::thread::spawn(move || {
                apply_loop(
                    &slot,
                    rx,
                    &dir,
                    &ManualClock::new(1),
                    &crate::Faults::default(),
                );
            })
        };
        let lookup = |id| {
            request(
                id,
                Op::Lookup(v1::LookupRequest {
                    parent: root(),
                    name: b"d".to_vec(),
                }),
            )
        };
        let now = |(request, digest): (DecodedRequest, _)| apply_now(&slot, &request, digest, 1);

        let missing = decoded(now(lookup(1)).expect("the volume is free"));
        assert!(
            matches!(missing, v1::reply::Result::Error(_)),
            "{missing:?}"
        );
        let (mkdir, made) = call(
            2,
            Op::Mkdir(v1::MkdirRequest {
                parent: root(),
                name: b"d".to_vec(),
                mode: 0o755,
                umask: 0,
                caller: Some(v1::Caller::default()),
            }),
        );
        tx.blocking_send(mkdir).unwrap();
        let made = result(made);
        assert!(matches!(made, v1::reply::Result::Mkdir(_)), "{made:?}");
        let found = decoded(now(lookup(3)).expect("the volume is free"));
        assert!(matches!(found, v1::reply::Result::Lookup(_)), "{found:?}");
        let root = decoded(now(request(4, getattr_op())).expect("the volume is free"));
        assert!(matches!(root, v1::reply::Result::Getattr(_)), "{root:?}");

        let held = slot.lock().unwrap();
        assert!(
            now(lookup(5)).is_none(),
            "applied while the loop held the volume"
        );
        drop(held);
        let statfs = request(6, Op::Statfs(v1::StatfsRequest {}));
        assert!(
            now(statfs).is_none(),
            "only lookups and getattrs skip the queue"
        );

        let (done, stopped) = oneshot::channel();
        tx.blocking_send(Command::Stop { done }).unwrap();
        stopped.blocking_recv().unwrap();
        apply.join().unwrap();
        assert!(now(lookup(7)).is_none(), "applied after the loop stopped");
    }
}
