//! The RWO mount lease: claim, renew, release, and the renewal task.
//!
//! The timing decisions live in [`RenewalSchedule`], a pure state machine over `now`; the
//! task around it ([`MountLease::spawn_renewal`]) only sleeps and sends.

use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Error;
use crate::client::{Client, PreparedCall, error_label};
use crate::config::LeaseConfig;
use crate::config::later;
use crate::metrics as names;
use crate::protocol::{MountEpoch, Refusal};
use crate::transport::Transport;
use crate::v1;
use crate::v1::reply::Result as ReplyResult;
use crate::v1::request::Op;

/// A lease the worker granted (to a claim or a renewal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseGrant {
    /// The epoch holding the lease.
    pub epoch: MountEpoch,
    /// The lease length the worker granted.
    pub lease: Duration,
    /// No attempt of the granting call was sent before this instant, so the worker's lease
    /// cannot have started earlier.
    pub sent_at: Instant,
}

/// What became of a release.
#[derive(Debug)]
pub enum ReleaseOutcome {
    /// The worker applied the release; `was_holder` is false when the epoch held no lease
    /// any more (released before, expired, or taken over).
    Released {
        /// Whether this release ended the epoch's lease.
        was_holder: bool,
    },
    /// The release could not finish within its budget (no quorum, no credentials, no worker
    /// reachable, or uncertain). The lease then simply expires; the caller logs and counts
    /// this and carries on.
    Deferred {
        /// Why.
        error: Error,
    },
}

/// Why a lease counts as lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossReason {
    /// No renewal succeeded in time: the last successful one was sent too long ago.
    Expired,
    /// The worker refused a renewal definitely (stale epoch, identity mismatch, unknown
    /// volume): another session owns the volume now, or the volume is gone.
    Revoked(Refusal),
}

/// The mount lease of one RWO session: a client stamped with the session's epoch.
#[derive(Debug)]
pub struct MountLease<T> {
    client: Client<T>,
    epoch: MountEpoch,
    node_id: String,
    config: LeaseConfig,
}

impl<T> Clone for MountLease<T> {
    fn clone(&self) -> Self {
        MountLease {
            client: self.client.clone(),
            epoch: self.epoch,
            node_id: self.node_id.clone(),
            config: self.config,
        }
    }
}

impl<T: Transport> MountLease<T> {
    /// The lease of the session with `epoch` (fresh from [`MountEpoch::random`] for a new
    /// session, or read back from the session record), claimed in the name of `node_id`.
    pub fn new(client: &Client<T>, epoch: MountEpoch, node_id: &str, config: LeaseConfig) -> Self {
        MountLease {
            client: client.with_epoch(epoch),
            epoch,
            node_id: node_id.to_owned(),
            config,
        }
    }

    /// The client that stamps this session's epoch: use it for every file call.
    pub fn client(&self) -> &Client<T> {
        &self.client
    }

    /// The session's epoch.
    pub fn epoch(&self) -> MountEpoch {
        self.epoch
    }

    /// The lease timings.
    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// Prepares a claim. Keep it: after an [`Error::Uncertain`], re-send the same prepared
    /// claim with [`claim`](Self::claim).
    pub fn prepare_claim(&self) -> Result<PreparedCall, Error> {
        self.client.prepare(Op::ClaimMount(v1::ClaimMountRequest {
            node_id: self.node_id.clone(),
        }))
    }

    /// Sends a prepared claim. [`Refusal::LeaseHeld`] says another epoch holds the lease
    /// and for how long.
    pub async fn claim(&self, call: &PreparedCall) -> Result<LeaseGrant, Error> {
        let result = self.client.send(call).await?;
        self.grant(call, result)
    }

    /// Renews the lease once, as a new logical call (each renewal is its own command).
    pub async fn renew(&self) -> Result<LeaseGrant, Error> {
        self.renew_until(later(Instant::now(), self.client.config().budgets.call))
            .await
    }

    async fn renew_until(&self, deadline: Instant) -> Result<LeaseGrant, Error> {
        let call = self
            .client
            .prepare(Op::RenewMount(v1::RenewMountRequest {}))?;
        let result = self.client.send_until(&call, deadline).await?;
        self.grant(&call, result)
    }

    /// Releases the lease within the release budget. Never fails: what cannot finish is
    /// reported as [`ReleaseOutcome::Deferred`].
    pub async fn release(&self) -> ReleaseOutcome {
        let outcome = self.try_release().await;
        let label = match outcome {
            ReleaseOutcome::Released { .. } => "released",
            ReleaseOutcome::Deferred { .. } => "deferred",
        };
        metrics::counter!(names::RELEASES, "outcome" => label).increment(1);
        outcome
    }

    async fn try_release(&self) -> ReleaseOutcome {
        let deadline = later(Instant::now(), self.config.release_budget);
        let call = match self
            .client
            .prepare(Op::ReleaseMount(v1::ReleaseMountRequest {}))
        {
            Ok(call) => call,
            Err(error) => return ReleaseOutcome::Deferred { error },
        };
        match self.client.send_until(&call, deadline).await {
            Ok(ReplyResult::ReleaseMount(reply)) => ReleaseOutcome::Released {
                was_holder: reply.released,
            },
            Ok(other) => ReleaseOutcome::Deferred {
                error: self.unexpected(&call, &other),
            },
            Err(error) => ReleaseOutcome::Deferred { error },
        }
    }

    /// Starts the renewal task for a lease granted by `grant`. The task renews every
    /// renewal interval and reports through the returned handle; it stops renewing when the
    /// lease is lost, when [`RenewalTask::stop`] is called, or when the handle is dropped.
    pub fn spawn_renewal(&self, grant: LeaseGrant) -> RenewalTask {
        let schedule = RenewalSchedule::new(self.config, self.client.config().budgets.call, &grant);
        let (status_tx, status_rx) = watch::channel(LeaseStatus::Held {
            valid_until: schedule.valid_until(),
        });
        let lease = self.clone();
        let handle = tokio::spawn(renewal_loop(lease, schedule, status_tx));
        RenewalTask {
            status: status_rx,
            handle,
        }
    }

    fn grant(&self, call: &PreparedCall, result: ReplyResult) -> Result<LeaseGrant, Error> {
        match result {
            ReplyResult::ClaimMount(reply) | ReplyResult::RenewMount(reply)
                if MountEpoch::from_slice(&reply.mount_epoch) == Some(self.epoch) =>
            {
                Ok(LeaseGrant {
                    epoch: self.epoch,
                    lease: Duration::from_millis(reply.lease_ms),
                    sent_at: call.prepared_at(),
                })
            }
            other => Err(self.unexpected(call, &other)),
        }
    }

    fn unexpected(&self, call: &PreparedCall, result: &ReplyResult) -> Error {
        Error::UnexpectedReply {
            volume_id: self.client.config().volume_id.clone(),
            op: call.operation(),
            found: result.name(),
        }
    }
}

/// Where a lease stands, as the renewal task reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseStatus {
    /// Held; this node may use the volume until `valid_until` unless a renewal succeeds.
    Held {
        /// When the lease counts as lost without a further successful renewal.
        valid_until: Instant,
    },
    /// Lost: the task has stopped renewing. Stop using the volume.
    Lost(LossReason),
    /// The task was stopped (before a release, typically).
    Stopped,
}

/// The handle of a running renewal task. Dropping it stops the task.
#[derive(Debug)]
pub struct RenewalTask {
    status: watch::Receiver<LeaseStatus>,
    handle: JoinHandle<()>,
}

impl RenewalTask {
    /// The lease's current status.
    pub fn status(&self) -> LeaseStatus {
        self.status.borrow().clone()
    }

    /// A receiver that sees every status change.
    pub fn subscribe(&self) -> watch::Receiver<LeaseStatus> {
        self.status.clone()
    }

    /// Waits until the lease is lost (or the task stops) and says why.
    pub async fn lost(&mut self) -> LeaseStatus {
        let status = self
            .status
            .wait_for(|status| !matches!(status, LeaseStatus::Held { .. }))
            .await
            .map(|status| status.clone());
        status.unwrap_or(LeaseStatus::Stopped)
    }

    /// Stops renewing and returns the last status, once the task has ended. A renewal in flight
    /// is abandoned (its request may still reach a worker, where a renewal that arrives after
    /// the release finds no lease to renew).
    pub async fn stop(mut self) -> LeaseStatus {
        self.handle.abort();
        // Wait until the task has really ended, so that no renewal is in flight once this
        // returns (a release sent next must come after the last renewal).
        let _ = (&mut self.handle).await;
        let status = self.status.borrow().clone();
        match status {
            LeaseStatus::Held { .. } => LeaseStatus::Stopped,
            other => other,
        }
    }
}

impl Drop for RenewalTask {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

async fn renewal_loop<T: Transport>(
    lease: MountLease<T>,
    mut schedule: RenewalSchedule,
    status: watch::Sender<LeaseStatus>,
) {
    loop {
        match schedule.poll(Instant::now()) {
            RenewalStep::Sleep(until) => {
                tokio::time::sleep_until(tokio::time::Instant::from_std(until)).await;
            }
            RenewalStep::Renew { deadline } => {
                let result = lease.renew_until(deadline).await;
                let now = Instant::now();
                match result {
                    Ok(grant) => {
                        metrics::counter!(names::RENEWALS, "outcome" => "ok").increment(1);
                        schedule.renewed(now, &grant);
                    }
                    Err(error) => {
                        metrics::counter!(names::RENEWALS, "outcome" => "failed").increment(1);
                        let label = error_label(&error);
                        metrics::counter!(names::RENEWAL_FAILURES, "outcome" => label).increment(1);
                        schedule.failed(now, &error);
                    }
                }
                if let Some(valid_until) = schedule.held_until() {
                    status.send_replace(LeaseStatus::Held { valid_until });
                }
            }
            RenewalStep::Lost(reason) => {
                let label = match reason {
                    LossReason::Expired => "expired",
                    LossReason::Revoked(_) => "revoked",
                };
                metrics::counter!(names::LEASES_LOST, "outcome" => label).increment(1);
                status.send_replace(LeaseStatus::Lost(reason));
                return;
            }
        }
    }
}

/// What the renewal task should do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RenewalStep {
    /// Sleep until this instant, then poll again.
    Sleep(Instant),
    /// Send a renewal now; it must end by `deadline` (the lease's safe end).
    Renew {
        /// The latest the renewal call may end.
        deadline: Instant,
    },
    /// The lease is lost; stop renewing.
    Lost(LossReason),
}

/// The renewal decisions of one lease, as a pure state machine over `now`.
///
/// The lease counts as lost once the last successful claim or renewal's send time, plus the
/// granted lease (at most the configured one), minus one call budget and the clock margin,
/// has passed; or as soon as the worker refuses a renewal definitely for a reason that
/// means another session or no volume. Once lost, it stays lost.
#[derive(Debug, Clone)]
pub(crate) struct RenewalSchedule {
    config: LeaseConfig,
    call_budget: Duration,
    valid_until: Instant,
    next_renewal: Instant,
    lost: Option<LossReason>,
}

impl RenewalSchedule {
    /// The schedule after `grant`, with renewals as `config` says and calls bounded by
    /// `call_budget`.
    pub(crate) fn new(config: LeaseConfig, call_budget: Duration, grant: &LeaseGrant) -> Self {
        RenewalSchedule {
            valid_until: later(
                grant.sent_at,
                config.safe_validity(grant.lease, call_budget),
            ),
            next_renewal: later(grant.sent_at, config.renew_interval),
            config,
            call_budget,
            lost: None,
        }
    }

    /// What to do at `now`.
    pub(crate) fn poll(&mut self, now: Instant) -> RenewalStep {
        if self.lost.is_none() && now >= self.valid_until {
            self.lost = Some(LossReason::Expired);
        }
        if let Some(reason) = &self.lost {
            return RenewalStep::Lost(reason.clone());
        }
        if now >= self.next_renewal {
            RenewalStep::Renew {
                deadline: self.valid_until,
            }
        } else {
            RenewalStep::Sleep(self.next_renewal.min(self.valid_until))
        }
    }

    /// A renewal succeeded, observed at `now`.
    pub(crate) fn renewed(&mut self, now: Instant, grant: &LeaseGrant) {
        if self.lost.is_some() {
            return;
        }
        let valid_until = later(
            grant.sent_at,
            self.config.safe_validity(grant.lease, self.call_budget),
        );
        self.valid_until = self.valid_until.max(valid_until);
        self.next_renewal = later(grant.sent_at, self.config.renew_interval).max(now);
        if now >= self.valid_until {
            self.lost = Some(LossReason::Expired);
        }
    }

    /// A renewal failed at `now` with `error`.
    pub(crate) fn failed(&mut self, now: Instant, error: &Error) {
        if self.lost.is_some() {
            return;
        }
        match error.refusal() {
            Some(
                refusal
                @ (Refusal::StaleEpoch | Refusal::IdentityMismatch | Refusal::UnknownVolume),
            ) => {
                self.lost = Some(LossReason::Revoked(refusal.clone()));
            }
            _ => self.next_renewal = later(now, self.config.retry_interval),
        }
    }

    /// When the lease counts as lost without a further successful renewal.
    pub(crate) fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// `Some(valid_until)` while the lease is not known to be lost.
    pub(crate) fn held_until(&self) -> Option<Instant> {
        self.lost.is_none().then_some(self.valid_until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Failure;
    use proptest::prelude::*;

    fn grant(sent_at: Instant, lease: Duration) -> LeaseGrant {
        LeaseGrant {
            epoch: MountEpoch([1; 16]),
            lease,
            sent_at,
        }
    }

    fn unavailable() -> Error {
        Error::Unavailable {
            volume_id: "v".into(),
            op: "renew_mount",
            last: Failure::NoQuorum,
        }
    }

    #[test]
    fn renewals_every_interval_keep_the_lease() {
        let config = LeaseConfig::default();
        let start = Instant::now();
        let mut schedule =
            RenewalSchedule::new(config, Duration::from_secs(15), &grant(start, config.lease));
        assert_eq!(schedule.valid_until(), start + Duration::from_secs(70));
        assert_eq!(
            schedule.poll(start),
            RenewalStep::Sleep(start + Duration::from_secs(20))
        );
        let t = start + Duration::from_secs(20);
        assert!(matches!(schedule.poll(t), RenewalStep::Renew { .. }));
        schedule.renewed(t + Duration::from_secs(1), &grant(t, config.lease));
        assert_eq!(schedule.valid_until(), t + Duration::from_secs(70));
        assert_eq!(
            schedule.poll(t + Duration::from_secs(1)),
            RenewalStep::Sleep(t + Duration::from_secs(20))
        );
    }

    #[test]
    fn failures_retry_sooner_and_the_lease_expires() {
        let config = LeaseConfig::default();
        let start = Instant::now();
        let mut schedule =
            RenewalSchedule::new(config, Duration::from_secs(15), &grant(start, config.lease));
        let mut now = start + Duration::from_secs(20);
        let mut renewals = 0;
        loop {
            match schedule.poll(now) {
                RenewalStep::Sleep(until) => now = until,
                RenewalStep::Renew { deadline } => {
                    assert_eq!(deadline, start + Duration::from_secs(70));
                    renewals += 1;
                    now += Duration::from_secs(1);
                    schedule.failed(now, &unavailable());
                }
                RenewalStep::Lost(reason) => {
                    assert_eq!(reason, LossReason::Expired);
                    break;
                }
            }
        }
        assert_eq!(now, start + Duration::from_secs(70));
        assert!(renewals >= 8, "{renewals} renewals");
    }

    #[test]
    fn a_stale_epoch_loses_the_lease_at_once() {
        let config = LeaseConfig::default();
        let start = Instant::now();
        let mut schedule =
            RenewalSchedule::new(config, Duration::from_secs(15), &grant(start, config.lease));
        schedule.failed(
            start,
            &Error::Refused {
                volume_id: "v".into(),
                op: "renew_mount",
                refusal: Refusal::StaleEpoch,
            },
        );
        assert_eq!(
            schedule.poll(start),
            RenewalStep::Lost(LossReason::Revoked(Refusal::StaleEpoch))
        );
        // A late success does not revive it.
        schedule.renewed(start, &grant(start, config.lease));
        assert!(matches!(schedule.poll(start), RenewalStep::Lost(_)));
    }

    #[derive(Debug, Clone)]
    enum Event {
        Success {
            send_delay_ms: u64,
            duration_ms: u64,
            granted_ms: u64,
        },
        Failure {
            duration_ms: u64,
            stale: bool,
        },
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (0u64..2_000, 0u64..20_000, 0u64..120_000).prop_map(
                |(send_delay_ms, duration_ms, granted_ms)| {
                    Event::Success {
                        send_delay_ms,
                        duration_ms,
                        granted_ms,
                    }
                }
            ),
            (0u64..20_000, proptest::bool::weighted(0.05))
                .prop_map(|(duration_ms, stale)| Event::Failure { duration_ms, stale }),
        ]
    }

    proptest! {
        #[test]
        fn the_lease_is_never_held_past_its_safe_end(
            events in proptest::collection::vec(event(), 0..40),
            initial_grant_ms in 0u64..120_000,
        ) {
            let config = LeaseConfig::default();
            let budget = Duration::from_secs(15);
            let start = Instant::now();
            let first = grant(start, Duration::from_millis(initial_grant_ms));
            let mut schedule = RenewalSchedule::new(config, budget, &first);
            // The real bound: the latest successful send plus its (capped) grant.
            let mut true_end = start + config.safe_validity(first.lease, budget);
            let mut now = start;
            let mut events = events.into_iter();
            for _ in 0..200 {
                match schedule.poll(now) {
                    RenewalStep::Sleep(until) => {
                        prop_assert!(until > now);
                        prop_assert!(until <= true_end, "sleeps past the safe end");
                        now = until;
                    }
                    RenewalStep::Renew { deadline } => {
                        prop_assert!(now < true_end, "renewing a lease that has run out");
                        prop_assert_eq!(deadline, true_end);
                        let Some(event) = events.next() else { break };
                        match event {
                            Event::Success { send_delay_ms, duration_ms, granted_ms } => {
                                let sent_at = now + Duration::from_millis(send_delay_ms);
                                now = sent_at + Duration::from_millis(duration_ms);
                                let g = grant(sent_at, Duration::from_millis(granted_ms));
                                true_end = true_end.max(sent_at + config.safe_validity(g.lease, budget));
                                schedule.renewed(now, &g);
                            }
                            Event::Failure { duration_ms, stale } => {
                                now += Duration::from_millis(duration_ms);
                                let error = if stale {
                                    Error::Refused { volume_id: "v".into(), op: "renew_mount", refusal: Refusal::StaleEpoch }
                                } else {
                                    unavailable()
                                };
                                schedule.failed(now, &error);
                                if stale {
                                    prop_assert!(matches!(schedule.poll(now), RenewalStep::Lost(_)));
                                }
                            }
                        }
                    }
                    RenewalStep::Lost(reason) => {
                        if reason == LossReason::Expired {
                            prop_assert!(now >= true_end, "lost before the safe end");
                        }
                        // Lost is final.
                        now += Duration::from_secs(1);
                        schedule.renewed(now, &grant(now, config.lease));
                        prop_assert!(matches!(schedule.poll(now), RenewalStep::Lost(_)));
                        break;
                    }
                }
                if let Some(until) = schedule.held_until() {
                    prop_assert!(until <= true_end);
                }
            }
        }
    }
}
