//! Property tests of the lease: the pure state machine under random commands from several
//! nodes with clock steps both ways and restarts, and the server's reply cache under replays.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use worker::ManualClock;
use worker::lease::{Epoch, LeaseCommand, LeaseOutcome, LeaseState};
use worker_proto::v1;
use worker_proto::v1::request::Op;

use crate::support::*;

const LEASE: u64 = 90_000;
const NODES: usize = 3;

#[derive(Clone, Debug)]
enum Step {
    /// The node claims with a fresh epoch, or again with its current one.
    Claim {
        node: usize,
        fresh: bool,
    },
    Renew {
        node: usize,
    },
    Release {
        node: usize,
    },
    Check {
        node: usize,
    },
    /// The clock moves, forwards or backwards.
    Clock(i64),
    /// The worker restarts from its durable state.
    Restart,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..NODES, any::<bool>()).prop_map(|(node, fresh)| Step::Claim { node, fresh }),
        3 => (0..NODES).prop_map(|node| Step::Renew { node }),
        1 => (0..NODES).prop_map(|node| Step::Release { node }),
        2 => (0..NODES).prop_map(|node| Step::Check { node }),
        3 => (-120_000i64..150_000).prop_map(Step::Clock),
        1 => Just(Step::Restart),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn lease_state_machine_keeps_its_promises(steps in prop::collection::vec(step(), 1..80)) {
        let mut state = LeaseState::new();
        let mut durable = state.clone();
        let mut now: u64 = 1_000_000;
        let mut next_epoch: u128 = 1;
        let mut current: Vec<Epoch> = (0..NODES).map(|_| [0; 16]).collect();
        // Until when the worker promised each epoch the lease.
        let mut promised: HashMap<Epoch, u64> = HashMap::new();
        // Epochs that were granted and then lost; they must never hold again.
        let mut lost: HashSet<Epoch> = HashSet::new();
        let mut last_at = 0u64;

        for step in steps {
            let (command, node) = match step {
                Step::Clock(delta) => {
                    now = now.saturating_add_signed(delta);
                    continue;
                }
                Step::Restart => {
                    state = durable.clone();
                    last_at = state.floor_ms();
                    continue;
                }
                Step::Claim { node, fresh } => {
                    if fresh || current[node] == [0; 16] {
                        current[node] = next_epoch.to_le_bytes();
                        next_epoch += 1;
                    }
                    (LeaseCommand::Claim { node: "n", epoch: current[node] }, node)
                }
                Step::Renew { node } => (LeaseCommand::Renew { epoch: current[node] }, node),
                Step::Release { node } => (LeaseCommand::Release { epoch: current[node] }, node),
                Step::Check { node } => (LeaseCommand::Check { epoch: Some(current[node]) }, node),
            };
            let epoch = current[node];
            // The holder whose lease is still running when this command applies.
            let at = state.clamp(now);
            let holder_before = state
                .holder()
                .filter(|h| h.expires_at_ms > at)
                .map(|h| h.epoch);
            let applied = state.apply(command, now, LEASE);
            prop_assert!(applied.at_ms >= last_at, "lease time went backwards");
            prop_assert!(applied.at_ms >= now.min(applied.at_ms));
            last_at = applied.at_ms;
            if applied.changed {
                durable = state.clone();
            }
            match applied.outcome {
                LeaseOutcome::Granted { .. } | LeaseOutcome::Renewed { .. } | LeaseOutcome::Valid => {
                    prop_assert!(!lost.contains(&epoch), "a lost epoch held the lease again");
                    for (other, until) in &promised {
                        if *other != epoch && !lost.contains(other) {
                            prop_assert!(
                                *until <= applied.at_ms,
                                "two active epochs: another was promised until {until}, now {}",
                                applied.at_ms
                            );
                        }
                    }
                    if !matches!(applied.outcome, LeaseOutcome::Valid) {
                        promised.insert(epoch, applied.at_ms + LEASE);
                    }
                }
                LeaseOutcome::Released { released } => {
                    prop_assert_eq!(released, holder_before == Some(epoch));
                    if holder_before.is_some() && holder_before != Some(epoch) {
                        prop_assert_eq!(
                            state.holder().map(|h| h.epoch),
                            holder_before,
                            "a release cleared a successor"
                        );
                    }
                    if promised.contains_key(&epoch) {
                        lost.insert(epoch);
                    }
                }
                LeaseOutcome::Stale | LeaseOutcome::MissingEpoch => {
                    if promised.contains_key(&epoch) {
                        lost.insert(epoch);
                    }
                }
                LeaseOutcome::Held { remaining_ms } => {
                    prop_assert!(remaining_ms > 0 && remaining_ms <= LEASE);
                }
            }
            // Once lost, an epoch never holds again (also checked above).
            if let Some(holder) = state.holder() {
                prop_assert!(!lost.contains(&holder.epoch) || holder.epoch != epoch);
            }
        }
    }
}

#[derive(Clone, Debug)]
enum WireStep {
    Claim(usize),
    Renew(usize),
    Release(usize),
    Mkdir(usize),
    /// Send again the bytes of an earlier request (by index, modulo the history).
    Replay(usize),
    Clock(i64),
}

fn wire_step() -> impl Strategy<Value = WireStep> {
    prop_oneof![
        3 => (0..NODES).prop_map(WireStep::Claim),
        2 => (0..NODES).prop_map(WireStep::Renew),
        1 => (0..NODES).prop_map(WireStep::Release),
        2 => (0..NODES).prop_map(WireStep::Mkdir),
        4 => any::<usize>().prop_map(WireStep::Replay),
        2 => (-5_000i64..15_000).prop_map(WireStep::Clock),
    ]
}

/// The reply cache over the wire: replays of earlier requests (same ID, same bytes) never
/// give a lease or mutation result to an epoch that does not hold the lease at that moment.
#[test]
fn a_cached_reply_is_never_returned_to_a_stale_epoch() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let pki = pki("props");
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 12,
        ..ProptestConfig::default()
    });
    runner
        .run(&prop::collection::vec(wire_step(), 1..40), |steps| {
            runtime.block_on(replay_case(&pki, steps))
        })
        .unwrap();
}

async fn replay_case(pki: &Pki, steps: Vec<WireStep>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let spec = rwo("vol");
    let clock = Arc::new(ManualClock::new(10_000_000));
    let server =
        leader_with_clock(pki, dir.path(), std::slice::from_ref(&spec), clock.clone()).await;
    let endpoint = server.endpoint();
    let mut history: Vec<(Bytes, Epoch, bool)> = Vec::new();
    let mut epochs: Vec<Epoch> = (0..NODES).map(|n| [n as u8 + 1; 16]).collect();
    let mut counter: u64 = 0;
    fn id(counter: &mut u64) -> [u8; 16] {
        *counter += 1;
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&counter.to_le_bytes());
        id
    }
    for step in steps {
        let (body, epoch, is_lease) = match step {
            WireStep::Clock(delta) => {
                clock.step(delta);
                continue;
            }
            WireStep::Claim(node) => {
                epochs[node][15] = epochs[node][15].wrapping_add(NODES as u8);
                let epoch = epochs[node];
                (
                    request(&spec, id(&mut counter), Some(epoch), claim("n")),
                    epoch,
                    true,
                )
            }
            WireStep::Renew(node) => {
                let epoch = epochs[node];
                (
                    request(
                        &spec,
                        id(&mut counter),
                        Some(epoch),
                        Op::RenewMount(Default::default()),
                    ),
                    epoch,
                    true,
                )
            }
            WireStep::Release(node) => {
                let epoch = epochs[node];
                (
                    request(
                        &spec,
                        id(&mut counter),
                        Some(epoch),
                        Op::ReleaseMount(Default::default()),
                    ),
                    epoch,
                    false,
                )
            }
            WireStep::Mkdir(node) => {
                let epoch = epochs[node];
                let name = format!("d{counter}");
                (
                    request(&spec, id(&mut counter), Some(epoch), mkdir(root(), &name)),
                    epoch,
                    false,
                )
            }
            WireStep::Replay(index) => {
                if history.is_empty() {
                    continue;
                }
                history[index % history.len()].clone()
            }
        };
        history.push((body.clone(), epoch, is_lease));
        let reply = raw(pki, &endpoint, body).await.unwrap();
        let holder = server.lease("vol").await.unwrap().holder().map(|h| h.epoch);
        let succeeded = match &reply.result {
            Some(v1::reply::Result::ClaimMount(_))
            | Some(v1::reply::Result::RenewMount(_))
            | Some(v1::reply::Result::Mkdir(_)) => true,
            Some(v1::reply::Result::Error(_)) | Some(v1::reply::Result::ReleaseMount(_)) => false,
            other => return Err(TestCaseError::fail(format!("unexpected reply {other:?}"))),
        };
        if succeeded {
            prop_assert_eq!(
                holder,
                Some(epoch),
                "a reply went to an epoch that does not hold the lease"
            );
        }
    }
    server.stop().await;
    Ok(())
}
