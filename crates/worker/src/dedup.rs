//! The reply cache that makes a retried request take effect once.
//!
//! Keyed by request ID, it keeps the reply of every successful mutation (lease commands
//! included) together with a fingerprint of the request bytes. An entry is kept for the
//! retention (twice a client's call budget: a retry comes at most one budget after the first
//! attempt) and is dropped after it; only when more entries than the capacity arrive within
//! one retention does the oldest go early, and that is logged, because a retry of it would be
//! applied again. Reads are not cached: repeating a read is harmless, and a cached 1 MiB read
//! per request ID would cost memory for nothing. Errors are not cached either: a definite
//! error means nothing was applied, so applying the retry is correct.
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
    /// Whether an entry has gone before its retention ended (logged once).
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

    /// Keeps `reply` for `request_id`, inserted at the clock reading `now_ms`, and drops what
    /// has outlived the retention (and, over the capacity, the oldest).
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
        while let Some(&(old, at)) = self.order.front() {
            let expired = now_ms.saturating_sub(at) > self.retention_ms;
            if !expired && self.order.len() <= self.capacity {
                break;
            }
            if !expired && !self.warned {
                self.warned = true;
                tracing::warn!(
                    capacity = self.capacity,
                    retention_ms = self.retention_ms,
                    "the reply cache is full: replies go before their retention ends, so a late \
                     retry of one would be applied again (raise the dedup capacity)"
                );
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
    fn bounded_and_conflict_aware() {
        let mut cache = DedupCache::new(2, 1000);
        cache.insert([1; 16], [1; 16], Bytes::from_static(b"one"), 0);
        cache.insert([2; 16], [2; 16], Bytes::from_static(b"two"), 0);
        assert_eq!(
            cache.lookup(&[1; 16], &[1; 16]),
            Cached::Hit(Bytes::from_static(b"one"))
        );
        assert_eq!(cache.lookup(&[1; 16], &[9; 16]), Cached::Conflict);
        cache.insert([3; 16], [3; 16], Bytes::from_static(b"three"), 0);
        assert_eq!(cache.lookup(&[1; 16], &[1; 16]), Cached::Miss);
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn entries_stay_for_the_retention_whatever_the_rate_below_the_capacity() {
        let mut cache = DedupCache::new(100_000, 30_000);
        // 50,000 mutations within one retention: every one is still answered from the cache.
        for i in 0..50_000u32 {
            let id = u128::from(i).to_le_bytes();
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
