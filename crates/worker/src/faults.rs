//! Fault injection for tests: what a real worker group does to a client on a bad day.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use worker_proto::v1;

/// How many arrivals [`Faults::arrivals`] remembers.
const ARRIVALS: usize = 4096;

/// One call as it reached the worker, before anything was decided about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Arrival {
    /// The request ID (zeros when the body did not decode).
    pub request_id: [u8; 16],
    /// The 128-bit XXH3 hash of the request body (equal for a retry of the same request).
    pub digest: [u8; 16],
}

/// Answers calls in a volume's place (see [`Faults::stand_in`]): the call's operation in, the
/// result to send, or `None` to leave the call to the volume.
pub type StandIn = Arc<dyn Fn(&v1::request::Op) -> Option<v1::reply::Result> + Send + Sync>;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A shared switchboard of injected faults, cloned into the server and the test.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    inner: Arc<FaultState>,
}

#[derive(Debug, Default)]
struct FaultState {
    drop_replies: AtomicU32,
    delay_ms: AtomicU64,
    hang: AtomicBool,
    minority: AtomicBool,
    /// One more than the writes still served before every later one hangs; 0: no such
    /// fault.
    writes_before_hang: AtomicU32,
    arrivals: Mutex<VecDeque<Arrival>>,
    logging_applied: AtomicBool,
    applied: Mutex<Vec<[u8; 16]>>,
    stand_in: StandInSlot,
}

#[derive(Default)]
struct StandInSlot {
    set: AtomicBool,
    answer: Mutex<Option<StandIn>>,
}

impl std::fmt::Debug for StandInSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandInSlot")
            .field("set", &self.set)
            .finish_non_exhaustive()
    }
}

/// The fault settings as the admin call carries them (`POST /takos.worker.v1/admin/faults`);
/// absent fields are left as they are.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSettings {
    /// Apply the next this many calls but drop their replies (the connection is reset).
    pub drop_replies: Option<u32>,
    /// Hold every reply this long after applying.
    pub delay_ms: Option<u64>,
    /// Accept calls and never answer them.
    pub hang: Option<bool>,
    /// Refuse every call with NO_QUORUM before proposing, as a minority partition would.
    pub minority: Option<bool>,
    /// Reload every volume from disk, as a restarted worker would (handles and the reply
    /// cache are lost; leases, inode numbers and generations are not).
    #[serde(default)]
    pub restart: bool,
}

impl Faults {
    /// Apply the next `count` calls but drop their replies.
    pub fn drop_next_replies(&self, count: u32) {
        self.inner.drop_replies.store(count, Ordering::SeqCst);
    }

    /// Hold every reply for `delay` after applying it (zero: no delay).
    pub fn set_delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.inner.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Accept calls and never answer them.
    pub fn set_hang(&self, hang: bool) {
        self.inner.hang.store(hang, Ordering::SeqCst);
    }

    /// Serves the next `count` writes of file data as usual, then accepts every later one
    /// without applying or answering it, until [`Faults::clear`]; other calls are served. For
    /// a request whose writes are split into parts: some applied, the rest never.
    pub fn hang_writes_after(&self, count: u32) {
        self.inner
            .writes_before_hang
            .store(count.saturating_add(1), Ordering::SeqCst);
    }

    /// Refuse every call as a minority (NO_QUORUM) before proposing it.
    pub fn set_minority(&self, minority: bool) {
        self.inner.minority.store(minority, Ordering::SeqCst);
    }

    /// Applies the settings of an admin call (all but `restart`, which the server handles).
    pub fn apply(&self, settings: &FaultSettings) {
        if let Some(count) = settings.drop_replies {
            self.drop_next_replies(count);
        }
        if let Some(ms) = settings.delay_ms {
            self.set_delay(Duration::from_millis(ms));
        }
        if let Some(hang) = settings.hang {
            self.set_hang(hang);
        }
        if let Some(minority) = settings.minority {
            self.set_minority(minority);
        }
    }

    /// From now on, `answer` answers every call to a registered volume before the volume sees
    /// it (the reply is encoded and sent as the volume's would be; nothing is applied or
    /// cached); `None` gives the calls back to the volumes. A worker with no service time
    /// behind the real transport, for measuring everything around it. [`Faults::clear`] leaves
    /// it as it is.
    pub fn stand_in(&self, answer: Option<StandIn>) {
        let slot = &self.inner.stand_in;
        let mut held = lock(&slot.answer);
        slot.set.store(answer.is_some(), Ordering::SeqCst);
        *held = answer;
    }

    /// The stand-in's answer to `op`, if one is set and answers it.
    pub(crate) fn stand_in_answer(&self, op: &v1::request::Op) -> Option<v1::reply::Result> {
        let slot = &self.inner.stand_in;
        if !slot.set.load(Ordering::Relaxed) {
            return None;
        }
        let answer = lock(&slot.answer).clone()?;
        answer(op)
    }

    /// Clears every fault.
    pub fn clear(&self) {
        self.drop_next_replies(0);
        self.set_delay(Duration::ZERO);
        self.set_hang(false);
        self.set_minority(false);
        self.inner.writes_before_hang.store(0, Ordering::SeqCst);
    }

    /// The calls that reached this endpoint, oldest first (the last few thousand).
    pub fn arrivals(&self) -> Vec<Arrival> {
        lock(&self.inner.arrivals).iter().copied().collect()
    }

    /// From now on (`true`), remembers the request ID of every mutation a volume applies:
    /// one that succeeded and was not answered from the reply cache. Off by default; `false`
    /// stops and forgets.
    pub fn log_applied(&self, on: bool) {
        self.inner.logging_applied.store(on, Ordering::SeqCst);
        if !on {
            lock(&self.inner.applied).clear();
        }
    }

    /// The request IDs of the mutations applied since [`Faults::log_applied`], in order.
    pub fn applied(&self) -> Vec<[u8; 16]> {
        lock(&self.inner.applied).clone()
    }

    pub(crate) fn note_applied(&self, request_id: [u8; 16]) {
        if self.inner.logging_applied.load(Ordering::Relaxed) {
            lock(&self.inner.applied).push(request_id);
        }
    }

    pub(crate) fn record(&self, arrival: Arrival) {
        let mut arrivals = lock(&self.inner.arrivals);
        if arrivals.len() == ARRIVALS {
            arrivals.pop_front();
        }
        arrivals.push_back(arrival);
    }

    pub(crate) fn minority(&self) -> bool {
        self.inner.minority.load(Ordering::SeqCst)
    }

    /// Whether to hang a call, `write` when it writes file data.
    pub(crate) fn hang(&self, write: bool) -> bool {
        if self.inner.hang.load(Ordering::SeqCst) {
            return true;
        }
        write
            && self
                .inner
                .writes_before_hang
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| match left {
                    0 | 1 => None,
                    left => Some(left - 1),
                })
                .is_err_and(|left| left == 1)
    }

    pub(crate) fn delay(&self) -> Duration {
        Duration::from_millis(self.inner.delay_ms.load(Ordering::SeqCst))
    }

    /// Whether to drop this reply (consumes one from the count).
    pub(crate) fn take_drop(&self) -> bool {
        self.inner
            .drop_replies
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_hang_after_the_count_until_cleared_and_other_calls_never() {
        let faults = Faults::default();
        assert!(!faults.hang(true), "no fault by default");
        faults.hang_writes_after(2);
        let writes: Vec<bool> = (0..4).map(|_| faults.hang(true)).collect();
        assert_eq!(writes, [false, false, true, true]);
        assert!(!faults.hang(false), "other calls are served");
        faults.clear();
        assert!(!faults.hang(true));
        faults.hang_writes_after(0);
        assert!(faults.hang(true), "zero: the next write hangs");
        faults.set_hang(true);
        assert!(faults.hang(false), "a full hang holds every call");
    }
}
