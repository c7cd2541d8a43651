//! Deadlines for requests the kernel resends after the owner that read them died.
//!
//! A resent mutation may have been applied already by the owner that died; the worker's reply
//! cache recognises the repeat, but only until the cached reply's retention ends. Each owner
//! that took a connection over after a crash therefore sends resent mutations only before a
//! deadline (D). When a successor dies in its turn, the kernel resends to the next one both
//! the requests the successor read first-hand and those it had been resent itself and not yet
//! answered: the latter were first applied before the earlier crash, and must keep the earlier
//! deadline. The kernel numbers requests in the order it queues them, and an owner reads them
//! in that order, so every request an earlier owner read has a lower ID than the first one its
//! successor read first-hand: the boundary each [`ResendRule`] carries.

use std::sync::atomic::Ordering;
use std::time::Instant;

use fuse_wire::Unique;
use lease_client::v1::request::Op;

use super::{Caller, Fs, TableChange, lock};
use crate::error::Error;
use crate::service::FileService;

/// The most rules a connection keeps; past it the two oldest merge into one, conservatively
/// (the higher boundary with the earlier deadline).
pub const MAX_RESEND_RULES: usize = 16;

/// A resent request whose ID (without its resend and interrupt bits) is below `below` may be
/// sent to the workers again only before `until`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResendRule {
    /// The first request ID the rule does not cover; `u64::MAX` while the owner that set it
    /// has read no request first-hand.
    pub below: u64,
    /// The deadline.
    pub until: Instant,
}

impl<S: FileService> Fs<S> {
    /// From now on, a mutation the kernel resends (its request was read by an owner that died)
    /// is sent to the workers again only before `deadline`, while their reply caches still
    /// hold what the dead owner may have applied; after it, it fails with `EIO`, its outcome
    /// unknown, and is never applied twice. Reads are sent again whenever. The rule covers
    /// every request up to the first this `Fs` is handed that is not resent
    /// ([`Fs::read_request`]). Set once; `false` if one was set before.
    pub fn resend_until(&self, deadline: Instant) -> bool {
        if self.resend_set.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.first_hand_pending.store(true, Ordering::SeqCst);
        self.add_rules(&[ResendRule {
            below: u64::MAX,
            until: deadline,
        }]);
        true
    }

    /// Takes over the rules an earlier owner of the connection applied (from its
    /// [`Fs::resend_rules`]), for requests it had been resent itself.
    pub fn inherit_resend_rules(&self, rules: &[ResendRule]) {
        self.add_rules(rules);
    }

    /// The rules in force, oldest boundary first, for the keeper to hand to a successor.
    pub fn resend_rules(&self) -> Vec<ResendRule> {
        lock(&self.resend_rules).clone()
    }

    fn add_rules(&self, rules: &[ResendRule]) {
        let mut all = lock(&self.resend_rules);
        all.extend_from_slice(rules);
        all.sort_by_key(|r| r.below);
        while all.len() > MAX_RESEND_RULES {
            let oldest = all.remove(0);
            all[0].until = all[0].until.min(oldest.until);
        }
    }

    /// The kernel handed this `Fs` request `unique`, one that gets a reply (not a FORGET).
    /// The first one that is not resent bounds this owner's resend rule, and is noted with
    /// the write-ahead ([`TableChange::FirstRead`]).
    pub fn read_request(&self, unique: u64) {
        let unique = Unique(unique);
        if unique.is_resend() || !self.first_hand_pending.load(Ordering::Relaxed) {
            return;
        }
        let first = unique.id();
        {
            let mut rules = lock(&self.resend_rules);
            // Under the lock: of requests read at once on several threads, the lowest counts.
            let Some(open) = rules.iter_mut().find(|r| r.below == u64::MAX) else {
                return;
            };
            open.below = first;
            rules.sort_by_key(|r| r.below);
            self.first_hand_pending.store(false, Ordering::Relaxed);
        }
        self.note(vec![TableChange::FirstRead { unique: first }]);
    }

    /// For a resent mutation, the deadline its attempts must start before (`EIO` past it):
    /// the earliest of the rules that cover it. `None` for everything else.
    pub(super) fn may_send(&self, caller: Caller, op: &Op) -> Result<Option<Instant>, Error> {
        let unique = Unique(caller.unique);
        if !unique.is_resend() || op.is_read_only() {
            return Ok(None);
        }
        let id = unique.id();
        let deadline = lock(&self.resend_rules)
            .iter()
            .filter(|r| id < r.below)
            .map(|r| r.until)
            .min();
        match deadline {
            None => Ok(None),
            Some(deadline) if Instant::now() < deadline => Ok(Some(deadline)),
            Some(_) => Err(Error::ResendTooLate { op: op.name() }),
        }
    }
}
