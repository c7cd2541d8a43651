//! The mount lease and its renewal task against the fake worker group.

use std::time::{Duration, Instant};

use tak_os_lease_client::protocol::{AccessMode, MountEpoch};
use tak_os_lease_client::testing::Fault;
use tak_os_lease_client::v1::request::Op;
use tak_os_lease_client::{
    Budgets, LeaseConfig, LeaseStatus, LossReason, MountLease, Refusal, ReleaseOutcome, v1,
};

use crate::client_fake::{ENDPOINTS, fake_client};

/// Everything at a fiftieth: 300 ms calls, 60 ms attempts, a 1.8 s lease renewed every
/// 400 ms and counted as lost 1.4 s after the last successful renewal was sent.
const SCALE: f64 = 0.02;

fn setup() -> (
    MountLease<tak_os_lease_client::testing::FakeTransport>,
    LeaseConfig,
) {
    let client = fake_client(Budgets::default().scaled(SCALE), AccessMode::Rwo);
    let config = LeaseConfig::default().scaled(SCALE);
    client.transport().set_lease_duration(config.lease);
    let lease = MountLease::new(&client, MountEpoch::random().unwrap(), "node-a", config);
    (lease, config)
}

#[tokio::test]
async fn claim_stamps_the_epoch_and_file_calls_carry_it() {
    let (lease, config) = setup();
    let claim = lease.prepare_claim().unwrap();
    let grant = lease.claim(&claim).await.unwrap();
    assert_eq!(grant.epoch, lease.epoch());
    assert_eq!(grant.lease, config.lease);
    assert!(grant.sent_at <= Instant::now());
    assert_eq!(
        lease.client().transport().lease_holder(),
        Some(lease.epoch())
    );

    // File calls made through the lease's client pass the worker's epoch check.
    lease
        .client()
        .call(Op::Statfs(v1::StatfsRequest {}))
        .await
        .unwrap();
    // A repeated claim by the same epoch succeeds (it renews).
    lease.claim(&lease.prepare_claim().unwrap()).await.unwrap();
}

#[tokio::test]
async fn a_claim_against_a_held_lease_is_refused_with_the_remaining_time() {
    let (lease, config) = setup();
    lease.client().transport().take_over(MountEpoch([8; 16]));
    let err = lease
        .claim(&lease.prepare_claim().unwrap())
        .await
        .unwrap_err();
    let Some(Refusal::LeaseHeld { remaining }) = err.refusal() else {
        panic!("expected LeaseHeld, got {err:?}")
    };
    assert!(*remaining <= config.lease && *remaining > Duration::ZERO);
}

#[tokio::test]
async fn an_uncertain_claim_is_settled_by_resending_it() {
    let (lease, _) = setup();
    let fake = lease.client().transport();
    fake.push_fault(None, Fault::DropReply);
    for _ in 0..1_000 {
        fake.push_fault(None, Fault::Refuse);
    }
    let claim = lease.prepare_claim().unwrap();
    let err = lease.claim(&claim).await.unwrap_err();
    assert!(!err.is_definite(), "{err:?}");
    fake.clear_faults();
    lease.claim(&claim).await.unwrap();
    assert_eq!(fake.applications(claim.request_id()), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_renewal_task_keeps_the_lease_past_its_length() {
    let (lease, config) = setup();
    let grant = lease.claim(&lease.prepare_claim().unwrap()).await.unwrap();
    let task = lease.spawn_renewal(grant);
    tokio::time::sleep(config.lease * 2).await;
    assert!(
        matches!(task.status(), LeaseStatus::Held { .. }),
        "{:?}",
        task.status()
    );
    let renewals = lease
        .client()
        .transport()
        .applied()
        .into_iter()
        .filter(|(_, op)| *op == "renew_mount")
        .count();
    // 3.6 s at one renewal per 400 ms.
    assert!((6..=10).contains(&renewals), "{renewals} renewals");
    assert_eq!(task.stop().await, LeaseStatus::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_lost_when_renewals_fail_for_too_long() {
    let (lease, config) = setup();
    let grant = lease.claim(&lease.prepare_claim().unwrap()).await.unwrap();
    let budgets = lease.client().config().budgets;
    let fake = lease.client().transport();
    for endpoint in ENDPOINTS {
        fake.set_down(endpoint, true);
    }
    let mut task = lease.spawn_renewal(grant);
    let status = task.lost().await;
    let lost_at = Instant::now();
    assert_eq!(status, LeaseStatus::Lost(LossReason::Expired));
    let safe_end = grant.sent_at + config.lease - budgets.call - config.margin;
    assert!(lost_at >= safe_end, "lost early");
    assert!(
        lost_at <= safe_end + Duration::from_millis(100),
        "lost late: {:?}",
        lost_at - safe_end
    );

    // Once lost, it stays lost and renews no more, even with the workers back.
    fake.clear_faults();
    let received = fake.received().len();
    tokio::time::sleep(config.renew_interval * 2).await;
    assert_eq!(fake.received().len(), received);
    assert!(matches!(task.status(), LeaseStatus::Lost(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_lost_at_once_when_another_epoch_takes_over() {
    let (lease, config) = setup();
    let grant = lease.claim(&lease.prepare_claim().unwrap()).await.unwrap();
    let mut task = lease.spawn_renewal(grant);
    lease.client().transport().take_over(MountEpoch([8; 16]));
    let started = Instant::now();
    let status = task.lost().await;
    assert_eq!(
        status,
        LeaseStatus::Lost(LossReason::Revoked(Refusal::StaleEpoch))
    );
    assert!(started.elapsed() <= config.renew_interval + Duration::from_millis(100));
}

#[tokio::test]
async fn release_gives_the_lease_back_and_is_idempotent() {
    let (lease, _) = setup();
    lease.claim(&lease.prepare_claim().unwrap()).await.unwrap();
    assert!(matches!(
        lease.release().await,
        ReleaseOutcome::Released { was_holder: true }
    ));
    assert_eq!(lease.client().transport().lease_holder(), None);
    assert!(matches!(
        lease.release().await,
        ReleaseOutcome::Released { was_holder: false }
    ));
}

#[tokio::test]
async fn a_release_without_quorum_is_deferred_within_its_budget() {
    let client = fake_client(Budgets::default().scaled(SCALE), AccessMode::Rwo);
    // A release budget shorter than the call budget wins.
    let config = LeaseConfig {
        release_budget: Duration::from_millis(100),
        ..LeaseConfig::default().scaled(SCALE)
    };
    let lease = MountLease::new(&client, MountEpoch::random().unwrap(), "node-a", config);
    lease.claim(&lease.prepare_claim().unwrap()).await.unwrap();
    for _ in 0..1_000 {
        client.transport().push_fault(None, Fault::NoQuorum);
    }
    let started = Instant::now();
    let outcome = lease.release().await;
    let elapsed = started.elapsed();
    let ReleaseOutcome::Deferred { error } = outcome else {
        panic!("expected deferred, got {outcome:?}")
    };
    assert!(error.is_definite(), "{error:?}");
    assert!(elapsed <= Duration::from_millis(150), "{elapsed:?}");
    assert_eq!(client.transport().lease_holder(), Some(lease.epoch()));
}
