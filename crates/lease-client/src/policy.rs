//! The retry policy of one logical call, as a pure state machine over `now`.
//!
//! [`CallPolicy`] decides when to send, to which endpoint, how long an attempt may take, how
//! long to back off, and how the call ends. It never sleeps and never touches the network:
//! the caller alternates [`CallPolicy::poll`] (what next?) and [`CallPolicy::record`] (what
//! happened to the attempt?), passing the current time to both.
//!
//! The rules it holds:
//! - nothing it schedules reaches past the call's deadline, and no attempt runs longer than
//!   the attempt budget;
//! - a transport failure rotates to the next staged endpoint; a "not leader" hint is followed
//!   only when it names a staged endpoint, otherwise the policy rotates as if there were none;
//! - retries back off exponentially with jitter, except for a jump to a hinted leader or a
//!   retry after the credentials were rotated, which go at once (a bounded number in a row);
//! - once an attempt may have been delivered, a call that does not get a final answer ends
//!   [`Finish::Uncertain`], never as a definite failure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Budgets;
use crate::config::later;
use crate::endpoint::EndpointSet;

/// An attempt shorter than this is never started.
const MIN_ATTEMPT: Duration = Duration::from_millis(1);
/// The most budget an attempt is ever required to have left before it starts.
const MAX_ATTEMPT_FLOOR: Duration = Duration::from_millis(100);

/// How much of the call's budget must remain for another attempt to start: a twentieth of the
/// attempt budget, between [`MIN_ATTEMPT`] and [`MAX_ATTEMPT_FLOOR`]. An attempt started with
/// less would almost surely be cut off by the call's deadline after it may have been
/// delivered, turning a call that failed definitely (nothing applied) into an uncertain one.
fn attempt_floor(attempt_budget: Duration) -> Duration {
    (attempt_budget / 20).clamp(MIN_ATTEMPT, MAX_ATTEMPT_FLOOR)
}

/// What the caller should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Send the call's bytes to endpoint `endpoint` (an index into the set) and give up on
    /// this attempt at `deadline`.
    Send {
        /// The index of the endpoint in the [`EndpointSet`].
        endpoint: usize,
        /// When the attempt must be abandoned.
        deadline: Instant,
    },
    /// Poll again at this instant (a backoff).
    Wait(Instant),
    /// The call is over.
    Finish(Finish),
}

/// How a call ended, as far as the policy is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// The last attempt brought a final answer (a result or a definite refusal).
    Answered,
    /// The budget ended (or credentials were refused) after an attempt that may have been
    /// delivered: the operation may or may not take effect.
    Uncertain,
    /// The budget ended and no attempt can have been applied; `last` says why the last one
    /// failed.
    Unavailable {
        /// The last attempt's failure.
        last: Failure,
    },
    /// The worker refused the credentials and they did not change meanwhile; nothing was
    /// delivered before.
    Unauthorized,
}

/// Why an attempt did not bring a final answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Failure {
    /// No credentials were available to send with.
    NoCredentials,
    /// The TCP connection could not be made.
    Connect,
    /// The TLS handshake failed or the peer refused the certificate.
    Tls,
    /// The attempt's time ran out.
    Timeout,
    /// The connection broke during the exchange.
    Connection,
    /// The peer answered with something that is not a reply to this request.
    BadReply,
    /// The endpoint does not lead the group.
    NotLeader,
    /// The group had no quorum and proposed nothing.
    NoQuorum,
    /// The worker's reply cache was full and it applied nothing.
    WorkerBusy,
    /// The worker proposed the request and lost quorum.
    WorkerUncertain,
    /// The credentials were refused (HTTP 401 or 403).
    Unauthorized,
}

impl Failure {
    /// A short, bounded name, usable as a metric label.
    pub fn name(self) -> &'static str {
        match self {
            Failure::NoCredentials => "no_credentials",
            Failure::Connect => "connect",
            Failure::Tls => "tls",
            Failure::Timeout => "timeout",
            Failure::Connection => "connection",
            Failure::BadReply => "bad_reply",
            Failure::NotLeader => "not_leader",
            Failure::NoQuorum => "no_quorum",
            Failure::WorkerBusy => "worker_busy",
            Failure::WorkerUncertain => "worker_uncertain",
            Failure::Unauthorized => "unauthorized",
        }
    }
}

/// What happened to one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AttemptOutcome {
    /// A final answer: the operation's result or a definite refusal.
    Answered,
    /// The request certainly did not reach the worker's protocol handling (no connection,
    /// TLS refused, no credentials).
    NotDelivered(Failure),
    /// No final answer, and the request may have reached the worker (timeout after sending,
    /// broken connection, a garbled reply).
    MaybeDelivered(Failure),
    /// The endpoint does not lead; `hint` is the endpoint it named, unchecked.
    NotLeader {
        /// The worker's hint, if any.
        hint: Option<String>,
    },
    /// No quorum and nothing proposed.
    NoQuorum,
    /// The worker's reply cache was full; nothing applied.
    WorkerBusy,
    /// The worker proposed the request and lost quorum.
    WorkerUncertain,
    /// The credentials were refused; `credentials_changed` is true when the caller's
    /// credentials were swapped after this attempt took them, so a retry may succeed.
    Unauthorized {
        /// Whether newer credentials are available.
        credentials_changed: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Ready { at: Instant },
    InFlight,
    Finished(Finish),
}

/// The retry state of one logical call. See the module docs.
#[derive(Debug, Clone)]
pub(crate) struct CallPolicy {
    endpoints: Arc<EndpointSet>,
    deadline: Instant,
    attempt_budget: Duration,
    backoff_initial: Duration,
    backoff_max: Duration,
    attempt_floor: Duration,
    state: State,
    current: usize,
    attempts: u32,
    backoffs: u32,
    immediate_in_row: usize,
    maybe_delivered: bool,
    last_failure: Failure,
    rng: u64,
}

impl CallPolicy {
    /// A policy for a call that must end by `deadline`, starting at endpoint `first` (wrapped
    /// into range), with backoff jitter drawn from `seed`.
    pub(crate) fn new(
        endpoints: Arc<EndpointSet>,
        budgets: &Budgets,
        first: usize,
        now: Instant,
        deadline: Instant,
        seed: u64,
    ) -> Self {
        let current = first % endpoints.len().max(1);
        CallPolicy {
            endpoints,
            deadline,
            attempt_budget: budgets.attempt,
            attempt_floor: attempt_floor(budgets.attempt),
            backoff_initial: budgets.backoff_initial,
            backoff_max: budgets.backoff_max,
            state: State::Ready { at: now },
            current,
            attempts: 0,
            backoffs: 0,
            immediate_in_row: 0,
            maybe_delivered: false,
            last_failure: Failure::Timeout,
            rng: seed,
        }
    }

    /// What to do at `now`. Call [`record`](Self::record) after every [`Step::Send`] before
    /// polling again; polling with an attempt outstanding counts that attempt as possibly
    /// delivered and lost.
    pub(crate) fn poll(&mut self, now: Instant) -> Step {
        match self.state {
            State::Finished(finish) => Step::Finish(finish),
            State::InFlight => {
                self.record(now, AttemptOutcome::MaybeDelivered(Failure::Timeout));
                self.poll(now)
            }
            State::Ready { at } if now < at => Step::Wait(at),
            State::Ready { .. } => {
                let remaining = self.deadline.saturating_duration_since(now);
                if remaining < self.attempt_floor {
                    return self.finish_out_of_budget();
                }
                self.state = State::InFlight;
                self.attempts += 1;
                Step::Send {
                    endpoint: self.current,
                    deadline: later(now, remaining.min(self.attempt_budget)),
                }
            }
        }
    }

    /// Records what happened to the outstanding attempt, observed at `now`.
    pub(crate) fn record(&mut self, now: Instant, outcome: AttemptOutcome) {
        if self.state != State::InFlight {
            return;
        }
        match outcome {
            AttemptOutcome::Answered => {
                self.state = State::Finished(Finish::Answered);
            }
            AttemptOutcome::NotDelivered(failure) => {
                self.last_failure = failure;
                self.rotate();
                self.back_off(now);
            }
            AttemptOutcome::MaybeDelivered(failure) => {
                self.maybe_delivered = true;
                self.last_failure = failure;
                self.rotate();
                self.back_off(now);
            }
            AttemptOutcome::NotLeader { hint } => {
                self.last_failure = Failure::NotLeader;
                match hint
                    .as_deref()
                    .and_then(|hint| self.endpoints.position(hint))
                {
                    Some(leader) if leader != self.current => {
                        self.current = leader;
                        self.retry_at_once(now);
                    }
                    _ => {
                        self.rotate();
                        self.back_off(now);
                    }
                }
            }
            AttemptOutcome::NoQuorum => {
                self.last_failure = Failure::NoQuorum;
                self.back_off(now);
            }
            AttemptOutcome::WorkerBusy => {
                // Room comes back as replies age out: wait, on the same endpoint.
                self.last_failure = Failure::WorkerBusy;
                self.back_off(now);
            }
            AttemptOutcome::WorkerUncertain => {
                self.maybe_delivered = true;
                self.last_failure = Failure::WorkerUncertain;
                self.back_off(now);
            }
            AttemptOutcome::Unauthorized {
                credentials_changed: true,
            } => {
                self.last_failure = Failure::Unauthorized;
                self.retry_at_once(now);
            }
            AttemptOutcome::Unauthorized {
                credentials_changed: false,
            } => {
                self.last_failure = Failure::Unauthorized;
                self.state = State::Finished(if self.maybe_delivered {
                    Finish::Uncertain
                } else {
                    Finish::Unauthorized
                });
            }
        }
    }

    /// How many attempts were sent.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    fn rotate(&mut self) {
        self.current = (self.current + 1) % self.endpoints.len().max(1);
    }

    fn retry_at_once(&mut self, now: Instant) {
        // A hint or a credential swap earns an immediate retry, but a group that keeps
        // bouncing the call around gets the ordinary backoff.
        if self.immediate_in_row <= self.endpoints.len() {
            self.immediate_in_row += 1;
            self.schedule(now, now);
        } else {
            self.back_off(now);
        }
    }

    fn back_off(&mut self, now: Instant) {
        self.immediate_in_row = 0;
        let exponent = self.backoffs.min(20);
        self.backoffs += 1;
        let ceiling = self
            .backoff_initial
            .saturating_mul(1u32 << exponent)
            .min(self.backoff_max);
        // Jitter within [ceiling / 2, ceiling], so callers that failed together spread out.
        let half = ceiling / 2;
        let spread = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let jitter = match spread {
            0 => 0,
            spread => self.next_random() % (spread + 1),
        };
        self.schedule(now, later(now, half + Duration::from_nanos(jitter)));
    }

    fn schedule(&mut self, now: Instant, at: Instant) {
        let at = at.max(now);
        if self.deadline.saturating_duration_since(at) < self.attempt_floor {
            self.finish_out_of_budget();
        } else {
            self.state = State::Ready { at };
        }
    }

    fn finish_out_of_budget(&mut self) -> Step {
        let finish = if self.maybe_delivered {
            Finish::Uncertain
        } else if self.attempts == 0 {
            Finish::Unavailable {
                last: Failure::Timeout,
            }
        } else {
            Finish::Unavailable {
                last: self.last_failure,
            }
        };
        self.state = State::Finished(finish);
        Step::Finish(finish)
    }

    /// splitmix64: jitter only needs to be spread, not unpredictable.
    fn next_random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(n: usize) -> Arc<EndpointSet> {
        Arc::new(EndpointSet::new((0..n).map(|i| format!("w{i}.example:443"))).unwrap())
    }

    fn policy(n: usize, now: Instant) -> CallPolicy {
        let budgets = Budgets::default();
        CallPolicy::new(set(n), &budgets, 0, now, now + budgets.call, 7)
    }

    fn send(step: Step) -> (usize, Instant) {
        match step {
            Step::Send { endpoint, deadline } => (endpoint, deadline),
            other => panic!("expected a send, got {other:?}"),
        }
    }

    #[test]
    fn no_attempt_starts_too_late_to_be_answered() {
        // A worker without quorum answers at once: the call ends Unavailable (nothing can have
        // been applied), never Uncertain because a last attempt was started with a sliver of
        // budget left and cut off by the deadline.
        let budgets = Budgets::default().scaled(0.1);
        let floor = attempt_floor(budgets.attempt);
        assert_eq!(floor, budgets.attempt / 20);
        let start = Instant::now();
        let end = start + budgets.call;
        let mut policy = CallPolicy::new(set(2), &budgets, 0, start, end, 7);
        let mut now = start;
        let finish = loop {
            match policy.poll(now) {
                Step::Send { .. } => {
                    assert!(end - now >= floor, "an attempt with {:?} left", end - now);
                    now += Duration::from_millis(1);
                    policy.record(now, AttemptOutcome::NoQuorum);
                }
                Step::Wait(at) => now = at,
                Step::Finish(finish) => break finish,
            }
        };
        assert_eq!(
            finish,
            Finish::Unavailable {
                last: Failure::NoQuorum
            }
        );
        assert_eq!(attempt_floor(Duration::ZERO), MIN_ATTEMPT);
        assert_eq!(attempt_floor(Duration::from_secs(60)), MAX_ATTEMPT_FLOOR);
    }

    #[test]
    fn a_first_answer_ends_the_call() {
        let now = Instant::now();
        let mut policy = policy(3, now);
        let (endpoint, deadline) = send(policy.poll(now));
        assert_eq!(endpoint, 0);
        assert_eq!(deadline, now + Duration::from_secs(3));
        policy.record(now, AttemptOutcome::Answered);
        assert_eq!(policy.poll(now), Step::Finish(Finish::Answered));
    }

    #[test]
    fn transport_failures_rotate_and_back_off() {
        let now = Instant::now();
        let mut policy = policy(3, now);
        send(policy.poll(now));
        policy.record(now, AttemptOutcome::NotDelivered(Failure::Connect));
        let Step::Wait(at) = policy.poll(now) else {
            panic!("expected a backoff")
        };
        assert!(at >= now + Duration::from_millis(50) && at <= now + Duration::from_millis(100));
        assert_eq!(send(policy.poll(at)).0, 1);
    }

    #[test]
    fn a_hint_inside_the_set_is_followed_at_once() {
        let now = Instant::now();
        let mut policy = policy(3, now);
        send(policy.poll(now));
        policy.record(
            now,
            AttemptOutcome::NotLeader {
                hint: Some("w2.example:443".into()),
            },
        );
        assert_eq!(send(policy.poll(now)).0, 2);
    }

    #[test]
    fn a_hint_outside_the_set_is_ignored() {
        let now = Instant::now();
        let mut policy = policy(3, now);
        send(policy.poll(now));
        policy.record(
            now,
            AttemptOutcome::NotLeader {
                hint: Some("evil.example:443".into()),
            },
        );
        let Step::Wait(at) = policy.poll(now) else {
            panic!("an ignored hint backs off like any failure")
        };
        assert_eq!(send(policy.poll(at)).0, 1);
    }

    #[test]
    fn a_timeout_then_the_end_of_the_budget_is_uncertain() {
        let now = Instant::now();
        let mut policy = policy(1, now);
        let (_, deadline) = send(policy.poll(now));
        policy.record(deadline, AttemptOutcome::MaybeDelivered(Failure::Timeout));
        let mut t = deadline;
        loop {
            match policy.poll(t) {
                Step::Send { deadline, .. } => {
                    t = deadline;
                    policy.record(t, AttemptOutcome::NotDelivered(Failure::Connect));
                }
                Step::Wait(at) => t = at,
                Step::Finish(finish) => {
                    assert_eq!(finish, Finish::Uncertain);
                    break;
                }
            }
        }
        assert!(t <= now + Duration::from_secs(15));
    }

    #[test]
    fn refused_credentials_end_the_call_unless_they_changed() {
        let now = Instant::now();
        let mut policy = policy(2, now);
        send(policy.poll(now));
        policy.record(
            now,
            AttemptOutcome::Unauthorized {
                credentials_changed: true,
            },
        );
        assert_eq!(send(policy.poll(now)).0, 0, "same endpoint, at once");
        policy.record(
            now,
            AttemptOutcome::Unauthorized {
                credentials_changed: false,
            },
        );
        assert_eq!(policy.poll(now), Step::Finish(Finish::Unauthorized));
    }

    #[derive(Debug, Clone)]
    enum Event {
        Answered,
        NotDelivered,
        MaybeDelivered,
        Hint(Option<u8>),
        Foreign,
        NoQuorum,
        WorkerUncertain,
        Unauthorized(bool),
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            1 => Just(Event::Answered),
            4 => Just(Event::NotDelivered),
            3 => Just(Event::MaybeDelivered),
            2 => proptest::option::of(0u8..6).prop_map(Event::Hint),
            2 => Just(Event::Foreign),
            2 => Just(Event::NoQuorum),
            1 => Just(Event::WorkerUncertain),
            1 => any::<bool>().prop_map(Event::Unauthorized),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn policy_invariants(
            n in 1usize..5,
            first in 0usize..8,
            seed in any::<u64>(),
            events in proptest::collection::vec((event(), 0u64..4_000), 0..60),
        ) {
            let endpoints = set(n);
            let budgets = Budgets::default();
            let start = Instant::now();
            let deadline = start + budgets.call;
            let mut policy =
                CallPolicy::new(endpoints.clone(), &budgets, first, start, deadline, seed);
            let mut now = start;
            let mut events = events.into_iter();
            let mut may_have_been_delivered = false;
            let mut last_outcome_was_answer = false;
            let mut expected_endpoint = first % n;
            let mut steps = 0;
            let finish = loop {
                steps += 1;
                prop_assert!(steps < 10_000, "the policy does not terminate");
                match policy.poll(now) {
                    Step::Finish(finish) => break finish,
                    Step::Wait(at) => {
                        prop_assert!(at > now && at <= deadline, "waits stay in the budget");
                        now = at;
                    }
                    Step::Send { endpoint, deadline: attempt_deadline } => {
                        prop_assert!(now < deadline);
                        prop_assert!(attempt_deadline <= deadline, "attempt past the call budget");
                        prop_assert!(attempt_deadline <= now + budgets.attempt);
                        prop_assert_eq!(endpoint, expected_endpoint);
                        // Without more events the worker stays silent until the deadline.
                        let (event, elapsed_ms) =
                            events.next().unwrap_or((Event::MaybeDelivered, u64::MAX));
                        now = (now + Duration::from_millis(elapsed_ms.min(3_000))).min(attempt_deadline);
                        let outcome = match event {
                            Event::Answered => AttemptOutcome::Answered,
                            Event::NotDelivered => AttemptOutcome::NotDelivered(Failure::Connect),
                            Event::MaybeDelivered => AttemptOutcome::MaybeDelivered(Failure::Timeout),
                            Event::Hint(hint) => AttemptOutcome::NotLeader {
                                hint: hint.map(|i| format!("w{i}.example:443")),
                            },
                            Event::Foreign => AttemptOutcome::NotLeader {
                                hint: Some("elsewhere.example:443".into()),
                            },
                            Event::NoQuorum => AttemptOutcome::NoQuorum,
                            Event::WorkerUncertain => AttemptOutcome::WorkerUncertain,
                            Event::Unauthorized(changed) => AttemptOutcome::Unauthorized {
                                credentials_changed: changed,
                            },
                        };
                        may_have_been_delivered |= matches!(
                            outcome,
                            AttemptOutcome::MaybeDelivered(_) | AttemptOutcome::WorkerUncertain
                        );
                        last_outcome_was_answer = outcome == AttemptOutcome::Answered;
                        expected_endpoint = match &outcome {
                            AttemptOutcome::NotDelivered(_) | AttemptOutcome::MaybeDelivered(_) => {
                                (endpoint + 1) % n
                            }
                            AttemptOutcome::NotLeader { hint } => {
                                match hint.as_deref().and_then(|h| endpoints.position(h)) {
                                    Some(i) if i != endpoint => i,
                                    _ => (endpoint + 1) % n,
                                }
                            }
                            _ => endpoint,
                        };
                        policy.record(now, outcome);
                    }
                }
            };
            prop_assert!(now <= deadline, "the call outlived its budget");
            match finish {
                Finish::Answered => prop_assert!(last_outcome_was_answer),
                Finish::Uncertain => prop_assert!(may_have_been_delivered),
                Finish::Unavailable { .. } | Finish::Unauthorized => {
                    prop_assert!(!may_have_been_delivered, "a possibly delivered call ended definite")
                }
            }
            if may_have_been_delivered {
                prop_assert!(matches!(finish, Finish::Answered | Finish::Uncertain));
            }
        }
    }
}
