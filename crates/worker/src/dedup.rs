//! The reply cache that makes a retried request take effect once.
//!
//! Keyed by request ID, it keeps the reply of every successful mutation (lease commands
//! included) together with a fingerprint of the request bytes. An entry is kept for the
//! retention, which every reply states (`Reply.reply_retention_ms`): a client sends every
//! repeat of a request within it, so the cache never drops an entry before it ends. When the
//! cache holds as many young entries as its capacity, the worker refuses new mutations with
//! `BUSY` before applying them, instead of dropping a reply a repeat may still need; the
//! refusal is definite and the client retries. Lease commands and handle renewals are never
//! refused (a lease or handle lapsing under a flood of writes would be worse): they may take
//! the cache a little past its capacity. Reads are not cached: repeating a read is
//! harmless, and a cached 1 MiB read per request ID would cost memory for nothing. Errors are
//! not cached either: a definite error means nothing was applied, so applying the retry is
//! correct.
//!
//! The cache never decides on its own: the apply loop checks the request's epoch against the
//! current lease first and only then looks here, so a cached reply never reaches an epoch
//! that has lost the volume.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

/// A request's fingerprint: the 128-bit XXH3 hash of its bytes.
///
/// It only tells a retry (the same bytes under the same ID) from a client that reused an ID for
/// another request, both from holders of the volume's credentials, so it needs no resistance to
/// a forger; a cryptographic hash cost half a millisecond per MiB of every write.
pub(crate) type Digest = [u8; 16];

/// The fingerprint of a request body.
pub(crate) fn digest(body: &[u8]) -> Digest {
    xxhash_rust::xxh3::xxh3_128(body).to_le_bytes()
}

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Cached {
    /// No entry: apply the request.
    Miss,
    /// The same request was applied: answer this.
    Hit(Bytes),
    /// The ID was used for a different request.
    Conflict,
}

#[derive(Debug)]
pub(crate) struct DedupCache {
    capacity: usize,
    retention_ms: u64,
    entries: HashMap<[u8; 16], (Digest, Bytes)>,
    /// Request IDs in the order they were inserted, with the clock reading at insertion.
    order: VecDeque<([u8; 16], u64)>,
    /// Whether a mutation was refused for want of room (logged once).
    warned: bool,
}

impl DedupCache {
    pub(crate) fn new(capacity: usize, retention_ms: u64) -> Self {
        Self {
            capacity: capacity.max(1),
            retention_ms,
            entries: HashMap::new(),
            order: VecDeque::new(),
            warned: false,
        }
    }

    pub(crate) fn lookup(&self, request_id: &[u8; 16], digest: &Digest) -> Cached {
        match self.entries.get(request_id) {
            None => Cached::Miss,
            Some((known, reply)) if known == digest => Cached::Hit(reply.clone()),
            Some(_) => Cached::Conflict,
        }
    }

    /// The retention every reply states, in milliseconds.
    pub(crate) fn retention_ms(&self) -> u64 {
        self.retention_ms
    }

    /// Whether a new reply may be kept at the clock reading `now_ms`: entries past their
    /// retention go first, and then there must be room below the capacity. A mutation that
    /// misses the cache is applied only when there is.
    pub(crate) fn has_room(&mut self, now_ms: u64) -> bool {
        self.expire(now_ms);
        let room = self.entries.len() < self.capacity;
        if !room && !self.warned {
            self.warned = true;
            tracing::warn!(
                capacity = self.capacity,
                retention_ms = self.retention_ms,
                "the reply cache is full of replies within their retention: new mutations are \
                 refused BUSY until the oldest age out (raise the dedup capacity)"
            );
        }
        room
    }

    /// Keeps `reply` for `request_id`, inserted at the clock reading `now_ms`. An entry is never
    /// dropped before its retention ends, so the capacity is a bound only through
    /// [`DedupCache::has_room`], which every mutation but lease commands and handle renewals
    /// passes first.
    pub(crate) fn insert(
        &mut self,
        request_id: [u8; 16],
        digest: Digest,
        reply: Bytes,
        now_ms: u64,
    ) {
        if self.entries.insert(request_id, (digest, reply)).is_none() {
            self.order.push_back((request_id, now_ms));
        }
        self.expire(now_ms);
    }

    /// Drops the entries that have outlived the retention.
    fn expire(&mut self, now_ms: u64) {
        while let Some(&(old, at)) = self.order.front() {
            if now_ms.saturating_sub(at) <= self.retention_ms {
                break;
            }
            self.order.pop_front();
            self.entries.remove(&old);
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_means_no_room_and_never_an_early_drop() {
        let mut cache = DedupCache::new(2, 1000);
        assert!(cache.has_room(0));
        cache.insert([1; 16], [1; 16], Bytes::from_static(b"one"), 0);
        assert!(cache.has_room(10));
        cache.insert([2; 16], [2; 16], Bytes::from_static(b"two"), 10);
        assert_eq!(
            cache.lookup(&[1; 16], &[1; 16]),
            Cached::Hit(Bytes::from_static(b"one"))
        );
        assert_eq!(cache.lookup(&[1; 16], &[9; 16]), Cached::Conflict);
        // Full of young replies: no room, and both are still answered.
        assert!(!cache.has_room(1000));
        assert_eq!(cache.len(), 2);
        assert_eq!(
            cache.lookup(&[1; 16], &[1; 16]),
            Cached::Hit(Bytes::from_static(b"one"))
        );
        // Once the first is past its retention there is room again, and it is gone.
        assert!(cache.has_room(1001));
        assert_eq!(cache.lookup(&[1; 16], &[1; 16]), Cached::Miss);
        assert_eq!(
            cache.lookup(&[2; 16], &[2; 16]),
            Cached::Hit(Bytes::from_static(b"two"))
        );
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn entries_stay_for_the_retention_whatever_the_rate_below_the_capacity() {
        let mut cache = DedupCache::new(100_000, 30_000);
        // 50,000 mutations within one retention: every one is still answered from the cache.
        for i in 0..50_000u32 {
            let id = u128::from(i).to_le_bytes();
            assert!(cache.has_room(u64::from(i / 100)));
            cache.insert(id, [0; 16], Bytes::from_static(b"ok"), u64::from(i / 100));
        }
        assert_eq!(cache.len(), 50_000);
        assert_eq!(
            cache.lookup(&0u128.to_le_bytes(), &[0; 16]),
            Cached::Hit(Bytes::from_static(b"ok"))
        );
        // Past the retention the old ones go with the next insertion.
        cache.insert([7; 16], [0; 16], Bytes::from_static(b"late"), 30_000 + 400);
        assert_eq!(cache.lookup(&0u128.to_le_bytes(), &[0; 16]), Cached::Miss);
        let young = u128::from(49_999u32).to_le_bytes();
        assert_eq!(
            cache.lookup(&young, &[0; 16]),
            Cached::Hit(Bytes::from_static(b"ok"))
        );
        assert!(cache.len() < 50_000);
    }
}
