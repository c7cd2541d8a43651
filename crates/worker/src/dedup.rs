//! The reply cache that makes a retried request take effect once.
//!
//! Keyed by request ID, it keeps the reply of every successful mutation (lease commands
//! included) together with a digest of the request bytes, up to a fixed number of entries;
//! the oldest entry goes first. Reads are not cached: repeating a read is harmless, and a
//! cached 1 MiB read per request ID would cost memory for nothing. Errors are not cached
//! either: a definite error means nothing was applied, so applying the retry is correct.
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
    entries: HashMap<[u8; 16], (Digest, Bytes)>,
    order: VecDeque<[u8; 16]>,
}

impl DedupCache {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            entries: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    pub(crate) fn lookup(&self, request_id: &[u8; 16], digest: &Digest) -> Cached {
        match self.entries.get(request_id) {
            None => Cached::Miss,
            Some((known, reply)) if known == digest => Cached::Hit(reply.clone()),
            Some(_) => Cached::Conflict,
        }
    }

    pub(crate) fn insert(&mut self, request_id: [u8; 16], digest: Digest, reply: Bytes) {
        if self.entries.insert(request_id, (digest, reply)).is_none() {
            self.order.push_back(request_id);
            while self.order.len() > self.capacity {
                if let Some(old) = self.order.pop_front() {
                    self.entries.remove(&old);
                }
            }
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
        let mut cache = DedupCache::new(2);
        cache.insert([1; 16], [1; 16], Bytes::from_static(b"one"));
        cache.insert([2; 16], [2; 16], Bytes::from_static(b"two"));
        assert_eq!(
            cache.lookup(&[1; 16], &[1; 16]),
            Cached::Hit(Bytes::from_static(b"one"))
        );
        assert_eq!(cache.lookup(&[1; 16], &[9; 16]), Cached::Conflict);
        cache.insert([3; 16], [3; 16], Bytes::from_static(b"three"));
        assert_eq!(cache.lookup(&[1; 16], &[1; 16]), Cached::Miss);
        assert_eq!(cache.len(), 2);
    }
}
