//! Budgets and lease timings: configuration with the protocol's defaults.

use std::time::Duration;

use crate::protocol::MAX_DATA_BYTES;

/// How long calls may take and how many may run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    /// The whole logical call, admission and every retry included (default 15 s).
    pub call: Duration,
    /// One HTTP attempt (default 3 s).
    pub attempt: Duration,
    /// The first retry waits about this long; later ones double it (default 100 ms).
    pub backoff_initial: Duration,
    /// No retry waits longer than this (default 2 s).
    pub backoff_max: Duration,
    /// Calls in flight per client; the next caller waits for a slot inside its own budget
    /// (default 64).
    pub max_in_flight: usize,
    /// The most file data one request may carry (default 1 MiB).
    pub max_data_bytes: usize,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            call: Duration::from_secs(15),
            attempt: Duration::from_secs(3),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
            max_in_flight: 64,
            max_data_bytes: MAX_DATA_BYTES,
        }
    }
}

impl Budgets {
    /// Every duration multiplied by `factor`, counts and sizes unchanged: tests shorten the
    /// budgets this way and keep their proportions.
    pub fn scaled(self, factor: f64) -> Self {
        Budgets {
            call: scale(self.call, factor),
            attempt: scale(self.attempt, factor),
            backoff_initial: scale(self.backoff_initial, factor),
            backoff_max: scale(self.backoff_max, factor),
            ..self
        }
    }
}

/// The timings of an RWO mount lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    /// How long a lease lasts after the worker applies a claim or renewal (default 90 s).
    /// A shorter lease granted by the worker wins.
    pub lease: Duration,
    /// How often the renewal task renews (default 20 s).
    pub renew_interval: Duration,
    /// How soon a failed renewal is tried again (default 5 s).
    pub retry_interval: Duration,
    /// Allowance for the node's and the worker's clocks running at different rates
    /// (default 5 s); subtracted, with one call budget, from the lease when deciding that it
    /// is lost.
    pub margin: Duration,
    /// The budget of a release, which must not hold up unstaging (default 5 s).
    pub release_budget: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            lease: Duration::from_secs(90),
            renew_interval: Duration::from_secs(20),
            retry_interval: Duration::from_secs(5),
            margin: Duration::from_secs(5),
            release_budget: Duration::from_secs(5),
        }
    }
}

impl LeaseConfig {
    /// Every duration multiplied by `factor`, proportions kept.
    pub fn scaled(self, factor: f64) -> Self {
        LeaseConfig {
            lease: scale(self.lease, factor),
            renew_interval: scale(self.renew_interval, factor),
            retry_interval: scale(self.retry_interval, factor),
            margin: scale(self.margin, factor),
            release_budget: scale(self.release_budget, factor),
        }
    }

    /// How long after a successful claim or renewal was *sent* this node must consider the
    /// lease lost: the lease, less one call budget (a request sent just before this point
    /// may still be in flight that long) and the clock margin.
    pub fn safe_validity(&self, granted: Duration, call_budget: Duration) -> Duration {
        granted
            .min(self.lease)
            .saturating_sub(call_budget)
            .saturating_sub(self.margin)
    }
}

/// The longest duration any timing is taken to be: far beyond any useful budget or lease, and
/// far from the end of `Instant`'s range, so adding it to a clock reading never overflows.
pub(crate) const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `now + duration`, with `duration` capped at [`LONGEST`]: a timing set absurdly high waits
/// a century instead of panicking.
pub(crate) fn later(now: std::time::Instant, duration: Duration) -> std::time::Instant {
    now.checked_add(duration.min(LONGEST))
        .or_else(|| now.checked_add(LONGEST))
        .unwrap_or(now)
}

fn scale(duration: Duration, factor: f64) -> Duration {
    if factor.is_finite() && factor > 0.0 {
        Duration::try_from_secs_f64(duration.as_secs_f64() * factor)
            .unwrap_or(LONGEST)
            .min(LONGEST)
    } else {
        Duration::ZERO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_protocols() {
        let budgets = Budgets::default();
        assert_eq!(budgets.call, Duration::from_secs(15));
        assert_eq!(budgets.attempt, Duration::from_secs(3));
        assert_eq!(budgets.max_in_flight, 64);
        assert_eq!(budgets.max_data_bytes, 1 << 20);
        let lease = LeaseConfig::default();
        assert_eq!(lease.lease, Duration::from_secs(90));
        assert_eq!(lease.renew_interval, Duration::from_secs(20));
        assert_eq!(lease.release_budget, Duration::from_secs(5));
        // 90 - 15 - 5: three renewals fit before the lease counts as lost.
        assert_eq!(
            lease.safe_validity(lease.lease, budgets.call),
            Duration::from_secs(70)
        );
    }

    #[test]
    fn scaling_keeps_proportions() {
        let budgets = Budgets::default().scaled(0.01);
        assert_eq!(budgets.call, Duration::from_millis(150));
        assert_eq!(budgets.attempt, Duration::from_millis(30));
        assert_eq!(budgets.max_in_flight, 64);
        let lease = LeaseConfig::default().scaled(0.01);
        assert_eq!(lease.lease, Duration::from_millis(900));
        assert_eq!(lease.renew_interval, Duration::from_millis(200));
        assert_eq!(Budgets::default().scaled(f64::NAN).call, Duration::ZERO);
    }

    #[test]
    fn a_shorter_grant_wins() {
        let lease = LeaseConfig::default();
        assert_eq!(
            lease.safe_validity(Duration::from_secs(30), Duration::from_secs(15)),
            Duration::from_secs(10)
        );
        assert_eq!(
            lease.safe_validity(Duration::from_secs(1), Duration::from_secs(15)),
            Duration::ZERO
        );
    }
}
