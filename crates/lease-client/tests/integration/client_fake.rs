//! The client against the fake worker group: retries, endpoints, hints, outcomes, admission.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use tak_os_lease_client::Failure;
use tak_os_lease_client::protocol::{
    self, AccessMode, FileId, ROOT_INO, RequestId, VolumeGeneration,
};
use tak_os_lease_client::testing::{FakeTransport, FakeVolume, Fault};
use tak_os_lease_client::v1::request::Op;
use tak_os_lease_client::{Budgets, Client, ClientConfig, EndpointSet, Error, Refusal, v1};

pub(crate) const ENDPOINTS: [&str; 3] = ["w0.example:443", "w1.example:443", "w2.example:443"];

pub(crate) fn volume(access_mode: AccessMode) -> FakeVolume {
    FakeVolume {
        volume_id: "vol-1".into(),
        volume_generation: VolumeGeneration(3),
        access_mode,
    }
}

pub(crate) fn fake_client(budgets: Budgets, access_mode: AccessMode) -> Client<FakeTransport> {
    let config = ClientConfig {
        volume_id: "vol-1".into(),
        volume_generation: VolumeGeneration(3),
        access_mode,
        endpoints: EndpointSet::new(ENDPOINTS).unwrap(),
        budgets,
    };
    Client::new(config, FakeTransport::new(volume(access_mode)))
}

fn budgets() -> Budgets {
    // 150 ms per call, 30 ms per attempt, backoff from 1 ms.
    Budgets::default().scaled(0.01)
}

fn mkdir() -> Op {
    Op::Mkdir(v1::MkdirRequest {
        parent: Some(
            FileId {
                ino: ROOT_INO,
                inode_generation: 0,
            }
            .into(),
        ),
        name: b"d".to_vec(),
        mode: 0o755,
        umask: 0o022,
        caller: Some(v1::Caller {
            uid: 1000,
            gid: 1000,
        }),
    })
}

fn endpoints_tried(fake: &FakeTransport) -> Vec<String> {
    fake.received().into_iter().map(|r| r.endpoint).collect()
}

#[tokio::test]
async fn retries_carry_identical_bytes_and_request_id() {
    let client = fake_client(budgets(), AccessMode::Rwx);
    let fake = client.transport();
    fake.push_fault(None, Fault::Refuse);
    fake.push_fault(None, Fault::NoQuorum);
    fake.push_fault(None, Fault::DropReply);
    let call = client.prepare(mkdir()).unwrap();
    let result = client.send(&call).await.unwrap();
    assert!(matches!(result, v1::reply::Result::Mkdir(_)));

    let received = fake.received();
    assert_eq!(received.len(), 4);
    assert!(received.iter().all(|r| r.body == *call.body()));
    let decoded = protocol::decode_request(received[3].body.clone()).unwrap();
    assert_eq!(decoded.request_id, call.request_id());
    assert_eq!(
        fake.applications(call.request_id()),
        1,
        "applied once, then cached"
    );
}

#[tokio::test]
async fn a_dropped_reply_ends_uncertain_and_a_resend_gets_the_cached_result() {
    let client = fake_client(budgets(), AccessMode::Rwx);
    let fake = client.transport();
    // The first attempt is applied and its reply lost; every later one is refused.
    fake.push_fault(None, Fault::DropReply);
    for _ in 0..1_000 {
        fake.push_fault(None, Fault::Refuse);
    }
    let call = client.prepare(mkdir()).unwrap();
    let started = Instant::now();
    let err = client.send(&call).await.unwrap_err();
    assert!(started.elapsed() <= budgets().call + Duration::from_millis(50));
    let Error::Uncertain { request_id, .. } = err else {
        panic!("expected uncertain, got {err:?}")
    };
    assert_eq!(request_id, call.request_id());
    assert!(!err.is_definite());

    fake.clear_faults();
    let result = client.send(&call).await.unwrap();
    assert!(matches!(result, v1::reply::Result::Mkdir(_)));
    assert_eq!(
        fake.applications(call.request_id()),
        1,
        "never applied twice"
    );
    let bodies: HashSet<_> = fake.received().into_iter().map(|r| r.body).collect();
    assert_eq!(
        bodies.len(),
        1,
        "every attempt, re-sends included, carried the same bytes"
    );
}

#[tokio::test]
async fn a_worker_that_lost_quorum_after_proposing_makes_the_call_uncertain() {
    let client = fake_client(budgets(), AccessMode::Rwx);
    let fake = client.transport();
    fake.push_fault(None, Fault::WorkerUncertain);
    for _ in 0..200 {
        fake.push_fault(None, Fault::NoQuorum);
    }
    let call = client.prepare(mkdir()).unwrap();
    let err = client.send(&call).await.unwrap_err();
    assert!(matches!(err, Error::Uncertain { .. }), "{err:?}");
    assert!(!err.is_definite());
}

#[tokio::test]
async fn no_quorum_before_proposing_is_definite() {
    let client = fake_client(budgets(), AccessMode::Rwx);
    let fake = client.transport();
    for _ in 0..500 {
        fake.push_fault(None, Fault::NoQuorum);
    }
    let err = client.call(mkdir()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unavailable {
                last: Failure::NoQuorum,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_definite());
    assert!(fake.applied().is_empty());
}

#[tokio::test]
async fn a_call_moves_on_when_an_endpoint_is_down() {
    let client = fake_client(budgets(), AccessMode::Rwx);
    let fake = client.transport();
    fake.set_down(ENDPOINTS[0], true);
    client.call(mkdir()).await.unwrap();
    assert_eq!(endpoints_tried(fake), [ENDPOINTS[0], ENDPOINTS[1]]);
    // The next call starts where the last answer came from.
    client.call(mkdir()).await.unwrap();
    assert_eq!(endpoints_tried(fake)[2], ENDPOINTS[1]);
}

#[tokio::test]
async fn a_hint_naming_a_staged_endpoint_is_followed() {
    let client = fake_client(budgets(), AccessMode::Rwx);
    let fake = client.transport();
    fake.set_leader(Some(ENDPOINTS[2]));
    client.call(mkdir()).await.unwrap();
    assert_eq!(endpoints_tried(fake), [ENDPOINTS[0], ENDPOINTS[2]]);
}

#[tokio::test]
async fn a_hint_outside_the_staged_set_is_ignored() {
    let client = fake_client(budgets(), AccessMode::Rwx);
    let fake = client.transport();
    fake.push_fault(
        Some(ENDPOINTS[0]),
        Fault::NotLeader(Some("intruder.example:443".into())),
    );
    client.call(mkdir()).await.unwrap();
    let tried = endpoints_tried(fake);
    assert_eq!(tried, [ENDPOINTS[0], ENDPOINTS[1]]);
    assert!(!tried.iter().any(|e| e.contains("intruder")));
}

#[tokio::test]
async fn a_call_to_silent_workers_ends_within_its_budget() {
    let client = fake_client(budgets(), AccessMode::Rwx);
    let fake = client.transport();
    for _ in 0..100 {
        fake.push_fault(None, Fault::Hang);
    }
    let started = Instant::now();
    let err = client.call(mkdir()).await.unwrap_err();
    let elapsed = started.elapsed();
    assert!(matches!(err, Error::Uncertain { .. }), "{err:?}");
    assert!(
        elapsed <= budgets().call + Duration::from_millis(50),
        "{elapsed:?}"
    );
    // Attempts rotated over every endpoint.
    let tried: HashSet<_> = endpoints_tried(fake).into_iter().collect();
    assert_eq!(tried.len(), 3);
}

#[tokio::test]
async fn all_endpoints_down_is_definite_unavailable() {
    let client = fake_client(budgets(), AccessMode::Rwx);
    let fake = client.transport();
    for endpoint in ENDPOINTS {
        fake.set_down(endpoint, true);
    }
    let err = client.call(mkdir()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unavailable {
                last: Failure::Connect,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn definite_refusals_end_the_call_at_once() {
    let client = fake_client(budgets(), AccessMode::Rwx);
    let fake = client.transport();
    fake.push_fault(None, Fault::Unauthorized);
    let err = client.call(mkdir()).await.unwrap_err();
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");

    fake.push_fault(None, Fault::Status(413));
    let err = client.call(mkdir()).await.unwrap_err();
    assert!(
        matches!(err, Error::Rejected { status: 413, .. }),
        "{err:?}"
    );
    assert_eq!(fake.received().len(), 2, "no retries");
}

#[tokio::test]
async fn identity_and_epoch_problems_are_refusals() {
    // The client staged RWX, the worker has RWO: identity mismatch.
    let config = ClientConfig {
        volume_id: "vol-1".into(),
        volume_generation: VolumeGeneration(3),
        access_mode: AccessMode::Rwx,
        endpoints: EndpointSet::new(ENDPOINTS).unwrap(),
        budgets: budgets(),
    };
    let client = Client::new(config.clone(), FakeTransport::new(volume(AccessMode::Rwo)));
    let err = client.call(mkdir()).await.unwrap_err();
    assert_eq!(err.refusal(), Some(&Refusal::IdentityMismatch));

    // RWO without an epoch: stale.
    let client = Client::new(
        ClientConfig {
            access_mode: AccessMode::Rwo,
            ..config.clone()
        },
        FakeTransport::new(volume(AccessMode::Rwo)),
    );
    let err = client.call(mkdir()).await.unwrap_err();
    assert_eq!(err.refusal(), Some(&Refusal::StaleEpoch));

    let client = Client::new(
        ClientConfig {
            volume_id: "vol-other".into(),
            ..config
        },
        FakeTransport::new(volume(AccessMode::Rwx)),
    );
    let err = client.call(mkdir()).await.unwrap_err();
    assert_eq!(err.refusal(), Some(&Refusal::UnknownVolume));
}

#[tokio::test]
async fn data_over_the_limit_is_refused_before_sending() {
    let client = fake_client(budgets(), AccessMode::Rwx);
    let write = Op::Write(v1::WriteRequest {
        data: vec![0u8; protocol::MAX_DATA_BYTES + 1].into(),
        ..Default::default()
    });
    let err = client.prepare(write).unwrap_err();
    assert!(matches!(err, Error::InvalidRequest { .. }), "{err:?}");
    assert!(client.transport().received().is_empty());
}

#[tokio::test]
async fn a_killing_write_is_applied_by_current_workers_and_refused_by_older_ones() {
    let client = fake_client(budgets(), AccessMode::Rwx);
    let kill = || {
        Op::WriteKillSuidgid(v1::WriteKillSuidgidRequest {
            write: Some(v1::WriteRequest {
                data: vec![1u8; 10].into(),
                ..Default::default()
            }),
            caller: Some(v1::Caller { uid: 1, gid: 1 }),
        })
    };
    let reply = client.call(kill()).await.unwrap();
    assert!(
        matches!(reply, v1::reply::Result::WriteKillSuidgid(w) if w.written == 10),
        "{reply:?}"
    );

    let fake = client.transport().clone();
    fake.set_knows_kill_suidgid(false);
    let applied = fake.applied().len();
    let err = client.call(kill()).await.unwrap_err();
    assert_eq!(err.refusal(), Some(&Refusal::InvalidRequest));
    assert_eq!(fake.applied().len(), applied, "nothing written");
    let plain = Op::Write(v1::WriteRequest {
        data: vec![1u8; 10].into(),
        ..Default::default()
    });
    assert!(client.call(plain).await.is_ok(), "plain writes still work");
}

#[tokio::test]
async fn the_same_id_gives_the_same_bytes() {
    let client = fake_client(budgets(), AccessMode::Rwx);
    let id = RequestId([4; 16]);
    let a = client.prepare_with_id(id, mkdir()).unwrap();
    let b = client.prepare_with_id(id, mkdir()).unwrap();
    assert_eq!(a.body(), b.body());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_lets_64_calls_in_and_the_next_waits_within_its_budget() {
    let budgets = Budgets {
        call: Duration::from_secs(5),
        attempt: Duration::from_secs(5),
        ..Budgets::default()
    };
    let client = fake_client(budgets, AccessMode::Rwx);
    let fake = client.transport().clone();
    fake.set_delay(Duration::from_millis(800));
    let calls: Vec<_> = (0..64)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.call(mkdir()).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;

    let extra = client.prepare(mkdir()).unwrap();
    let started = Instant::now();
    let err = client
        .send_until(&extra, started + Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(195) && waited < Duration::from_millis(400),
        "{waited:?}"
    );

    // A caller whose budget outlasts a slot's release gets in.
    let late = client.call(mkdir()).await;
    assert!(late.is_ok());
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(fake.max_in_flight(), 64);
}
