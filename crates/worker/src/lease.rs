//! The mount lease of one RWO volume as a pure state machine.
//!
//! [`LeaseState::apply`] takes a command and the worker's clock reading and returns what to
//! answer, touching nothing else. The apply loop journals the state before it answers whenever
//! [`Applied::changed`] is set, which is what makes ownership survive a restart.
//!
//! Time: the lease runs on the worker's clock (milliseconds since the Unix epoch) clamped by a
//! command-time floor, the latest time any command was applied at. A clock that steps backwards
//! therefore freezes lease time instead of rewinding it, and because every renewal sets the
//! expiry from the clamped time, a backwards step never moves an expiry later than a forward
//! clock would have. The floor is part of the durable state.
//!
//! Expiry is observed, not scheduled: the first command applied at or after a lease's expiry
//! retires its epoch (and reports a change, so the retirement is journaled). A retired epoch
//! never holds the lease again, whether it renews, claims or the clock steps back across a
//! restart.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// A mount epoch: the 128-bit random fencing token a node picks for one claim.
pub type Epoch = [u8; 16];

/// How many retired epochs are remembered. Epochs are random 128-bit values, so a collision
/// with an older one is not a practical concern; the bound keeps the checkpoint small.
pub const RETIRED_EPOCHS: usize = 1024;

/// The node and epoch that hold the lease, and until when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The claiming node, for records and logs only: the epoch is what fences.
    pub node: String,
    /// The epoch that holds the lease.
    #[serde(with = "hex_epoch")]
    pub epoch: Epoch,
    /// Lease time (milliseconds since the Unix epoch, clamped) at which the lease ends.
    pub expires_at_ms: u64,
}

/// The durable lease state of one volume.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseState {
    holder: Option<Holder>,
    floor_ms: u64,
    #[serde(with = "hex_epochs")]
    retired: VecDeque<Epoch>,
}

/// One command for the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseCommand<'a> {
    /// Take the lease with a new epoch (or renew it, when this epoch already holds it).
    Claim {
        /// The claiming node.
        node: &'a str,
        /// The new epoch.
        epoch: Epoch,
    },
    /// Extend the lease this epoch holds.
    Renew {
        /// The holder's epoch.
        epoch: Epoch,
    },
    /// Give up the lease this epoch holds; idempotent.
    Release {
        /// The epoch giving up.
        epoch: Epoch,
    },
    /// The epoch check before a read or a mutation (`None`: the request carried no epoch).
    Check {
        /// The request's epoch.
        epoch: Option<Epoch>,
    },
}

/// What a command came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// The claim succeeded; the lease runs for `lease_ms` from [`Applied::at_ms`].
    Granted {
        /// Lease length in milliseconds.
        lease_ms: u64,
    },
    /// The renewal succeeded; the lease runs for `lease_ms` from [`Applied::at_ms`].
    Renewed {
        /// Lease length in milliseconds.
        lease_ms: u64,
    },
    /// The release is done; `released` tells whether this command ended the epoch's lease.
    Released {
        /// True when the epoch held the lease until this command.
        released: bool,
    },
    /// The epoch holds the lease: the read or mutation may proceed.
    Valid,
    /// Another epoch holds an unexpired lease.
    Held {
        /// How long the other lease still runs.
        remaining_ms: u64,
    },
    /// The epoch does not hold the lease (expired, released, taken over, or never held).
    Stale,
    /// The request carried no epoch on a volume that needs one.
    MissingEpoch,
}

/// The result of [`LeaseState::apply`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct Applied {
    /// What to answer.
    pub outcome: LeaseOutcome,
    /// The clamped lease time the command was applied at.
    pub at_ms: u64,
    /// The durable state changed: journal it before answering.
    pub changed: bool,
}

impl LeaseState {
    /// A volume nobody has claimed yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current holder, as of the last applied command (it may have expired since).
    pub fn holder(&self) -> Option<&Holder> {
        self.holder.as_ref()
    }

    /// The command-time floor: the latest lease time a command was applied at.
    pub fn floor_ms(&self) -> u64 {
        self.floor_ms
    }

    /// Whether `epoch` has held the lease and lost it (among the last [`RETIRED_EPOCHS`]).
    pub fn is_retired(&self, epoch: &Epoch) -> bool {
        self.retired.contains(epoch)
    }

    /// The lease time a command applied with the clock reading `now_ms` would run at.
    pub fn clamp(&self, now_ms: u64) -> u64 {
        now_ms.max(self.floor_ms)
    }

    /// Applies one command at the clock reading `now_ms`, with leases of `lease_ms`.
    pub fn apply(&mut self, command: LeaseCommand<'_>, now_ms: u64, lease_ms: u64) -> Applied {
        let at_ms = self.clamp(now_ms);
        self.floor_ms = at_ms;
        let mut changed = false;
        if self
            .holder
            .as_ref()
            .is_some_and(|h| h.expires_at_ms <= at_ms)
        {
            self.retire_holder();
            changed = true;
        }
        let outcome = match command {
            LeaseCommand::Claim { node, epoch } => {
                if self.is_retired(&epoch) {
                    LeaseOutcome::Stale
                } else {
                    match &mut self.holder {
                        Some(holder) if holder.epoch == epoch => {
                            holder.expires_at_ms = at_ms.saturating_add(lease_ms);
                            changed = true;
                            LeaseOutcome::Granted { lease_ms }
                        }
                        Some(holder) => LeaseOutcome::Held {
                            remaining_ms: holder.expires_at_ms - at_ms,
                        },
                        None => {
                            self.holder = Some(Holder {
                                node: node.to_owned(),
                                epoch,
                                expires_at_ms: at_ms.saturating_add(lease_ms),
                            });
                            changed = true;
                            LeaseOutcome::Granted { lease_ms }
                        }
                    }
                }
            }
            LeaseCommand::Renew { epoch } => match &mut self.holder {
                Some(holder) if holder.epoch == epoch => {
                    holder.expires_at_ms = at_ms.saturating_add(lease_ms);
                    changed = true;
                    LeaseOutcome::Renewed { lease_ms }
                }
                _ => LeaseOutcome::Stale,
            },
            LeaseCommand::Release { epoch } => {
                if self.holder.as_ref().is_some_and(|h| h.epoch == epoch) {
                    self.retire_holder();
                    changed = true;
                    LeaseOutcome::Released { released: true }
                } else {
                    LeaseOutcome::Released { released: false }
                }
            }
            LeaseCommand::Check { epoch: None } => LeaseOutcome::MissingEpoch,
            LeaseCommand::Check { epoch: Some(epoch) } => {
                if self.holder.as_ref().is_some_and(|h| h.epoch == epoch) {
                    LeaseOutcome::Valid
                } else {
                    LeaseOutcome::Stale
                }
            }
        };
        Applied {
            outcome,
            at_ms,
            changed,
        }
    }

    fn retire_holder(&mut self) {
        if let Some(holder) = self.holder.take() {
            if self.retired.len() == RETIRED_EPOCHS {
                self.retired.pop_front();
            }
            self.retired.push_back(holder.epoch);
        }
    }
}

mod hex_epoch {
    use serde::{Deserialize as _, Deserializer, Serializer};

    use super::Epoch;

    pub(super) fn serialize<S: Serializer>(epoch: &Epoch, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::hex::encode(epoch))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Epoch, D::Error> {
        let text = String::deserialize(d)?;
        crate::hex::decode(&text)
            .and_then(|bytes| Epoch::try_from(bytes.as_slice()).ok())
            .ok_or_else(|| serde::de::Error::custom("an epoch is 32 hex characters"))
    }
}

mod hex_epochs {
    use std::collections::VecDeque;

    use serde::{Deserialize as _, Deserializer, Serializer};

    use super::Epoch;

    pub(super) fn serialize<S: Serializer>(
        epochs: &VecDeque<Epoch>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_seq(epochs.iter().map(|e| crate::hex::encode(e)))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<VecDeque<Epoch>, D::Error> {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|text| {
                crate::hex::decode(text)
                    .and_then(|bytes| Epoch::try_from(bytes.as_slice()).ok())
                    .ok_or_else(|| serde::de::Error::custom("an epoch is 32 hex characters"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: u64 = 90_000;
    const A: Epoch = [1; 16];
    const B: Epoch = [2; 16];

    fn claim(state: &mut LeaseState, epoch: Epoch, now: u64) -> LeaseOutcome {
        state
            .apply(LeaseCommand::Claim { node: "n", epoch }, now, LEASE)
            .outcome
    }

    #[test]
    fn claim_renew_release() {
        let mut s = LeaseState::new();
        assert_eq!(
            claim(&mut s, A, 1000),
            LeaseOutcome::Granted { lease_ms: LEASE }
        );
        assert_eq!(
            claim(&mut s, B, 2000),
            LeaseOutcome::Held {
                remaining_ms: LEASE - 1000
            }
        );
        let renewed = s.apply(LeaseCommand::Renew { epoch: A }, 50_000, LEASE);
        assert!(renewed.changed);
        assert_eq!(s.holder().unwrap().expires_at_ms, 50_000 + LEASE);
        let released = s.apply(LeaseCommand::Release { epoch: A }, 60_000, LEASE);
        assert_eq!(released.outcome, LeaseOutcome::Released { released: true });
        let again = s.apply(LeaseCommand::Release { epoch: A }, 60_001, LEASE);
        assert_eq!(again.outcome, LeaseOutcome::Released { released: false });
        assert!(!again.changed);
        assert_eq!(claim(&mut s, A, 60_002), LeaseOutcome::Stale);
        assert_eq!(
            claim(&mut s, B, 60_002),
            LeaseOutcome::Granted { lease_ms: LEASE }
        );
    }

    #[test]
    fn expired_epoch_neither_renews_nor_reclaims() {
        let mut s = LeaseState::new();
        let _ = claim(&mut s, A, 0);
        let late = s.apply(LeaseCommand::Renew { epoch: A }, LEASE, LEASE);
        assert_eq!(late.outcome, LeaseOutcome::Stale);
        assert!(late.changed, "observing the expiry is journaled");
        assert_eq!(claim(&mut s, A, LEASE + 1), LeaseOutcome::Stale);
        // Even when the clock steps back before the expiry afterwards.
        assert_eq!(
            s.apply(LeaseCommand::Check { epoch: Some(A) }, 10, LEASE)
                .outcome,
            LeaseOutcome::Stale
        );
    }

    #[test]
    fn backwards_clock_is_clamped_by_the_floor() {
        let mut s = LeaseState::new();
        let _ = claim(&mut s, A, 100_000);
        let renewed = s.apply(LeaseCommand::Renew { epoch: A }, 5, LEASE);
        assert_eq!(renewed.at_ms, 100_000);
        assert_eq!(s.holder().unwrap().expires_at_ms, 100_000 + LEASE);
    }

    #[test]
    fn release_never_clears_a_successor() {
        let mut s = LeaseState::new();
        let _ = claim(&mut s, A, 0);
        let _ = claim(&mut s, B, LEASE + 1);
        let released = s.apply(LeaseCommand::Release { epoch: A }, LEASE + 2, LEASE);
        assert_eq!(released.outcome, LeaseOutcome::Released { released: false });
        assert_eq!(s.holder().unwrap().epoch, B);
    }

    #[test]
    fn state_round_trips_through_json() {
        let mut s = LeaseState::new();
        let _ = claim(&mut s, A, 7);
        let _ = s.apply(LeaseCommand::Release { epoch: A }, 8, LEASE);
        let _ = claim(&mut s, B, 9);
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<LeaseState>(&text).unwrap(), s);
    }
}
