//! The lease-client `Client` against the reference worker over real TLS on loopback.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_client::{Error, Refusal};
use worker_proto::v1::ErrorKind;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_repeat_the_request_id_and_bytes_and_apply_once() {
    let pki = pki("retry");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("vol");
    let server = leader(&pki, dir.path(), std::slice::from_ref(&spec)).await;
    let client = client(&pki, &spec, &[server.endpoint()], budgets());

    // Two dropped replies: the third attempt gets the cached result of the first.
    server.faults().log_applied(true);
    server.faults().drop_next_replies(2);
    let made = client.call(mkdir(root(), "once")).await.unwrap();
    let arrivals = server.faults().arrivals();
    assert_eq!(arrivals.len(), 3, "{arrivals:?}");
    assert!(
        arrivals.iter().all(|a| *a == arrivals[0]),
        "same ID and bytes every time"
    );
    assert_eq!(
        server.faults().applied(),
        [arrivals[0].request_id],
        "applied once; the repeats were answered from the cache"
    );

    // The directory was made once: a fresh mkdir now fails with EEXIST (not applied), and a
    // read is no mutation.
    let again = client.call(mkdir(root(), "once")).await.unwrap_err();
    assert!(
        matches!(again.refusal(), Some(Refusal::Errno(libc::EEXIST))),
        "{again:?}"
    );
    let looked = client.call(lookup(root(), "once")).await.unwrap();
    assert_eq!(file_of(&looked), file_of(&made));
    assert_eq!(server.faults().applied().len(), 1);
    server.faults().log_applied(false);
    client.call(mkdir(root(), "unlogged")).await.unwrap();
    assert!(server.faults().applied().is_empty());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_reply_is_uncertain_and_the_same_call_gets_the_cached_result() {
    let pki = pki("uncertain");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("vol");
    let server = leader(&pki, dir.path(), std::slice::from_ref(&spec)).await;
    let client = client(&pki, &spec, &[server.endpoint()], budgets());

    server.faults().drop_next_replies(u32::MAX);
    let call = client.prepare(mkdir(root(), "maybe")).unwrap();
    let error = client.send(&call).await.unwrap_err();
    assert!(matches!(error, Error::Uncertain { .. }), "{error:?}");
    assert!(!error.is_definite());

    server.faults().drop_next_replies(0);
    let settled = client.send(&call).await.unwrap();
    assert!(
        matches!(settled, worker_proto::v1::reply::Result::Mkdir(_)),
        "{settled:?}"
    );
    let ids: HashSet<_> = server
        .faults()
        .arrivals()
        .iter()
        .map(|a| a.request_id)
        .collect();
    assert_eq!(ids.len(), 1, "every attempt carried one request ID");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_switches_endpoints_when_one_worker_is_down() {
    let pki = pki("switch");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("vol");
    let server = leader(&pki, dir.path(), std::slice::from_ref(&spec)).await;
    let client = client(
        &pki,
        &spec,
        &[dead_endpoint().await, server.endpoint()],
        budgets(),
    );
    // The first staged endpoint refuses connections: every call must still succeed, which it
    // can only do by moving on to the live worker, and each reaches that worker exactly once.
    for _ in 0..3 {
        let result = client.call(getattr(root())).await.unwrap();
        assert!(
            matches!(result, worker_proto::v1::reply::Result::Getattr(_)),
            "{}",
            result.name()
        );
    }
    assert_eq!(
        server.faults().arrivals().len(),
        3,
        "one arrival per call at the live worker"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_hint_to_a_staged_leader_is_followed() {
    let pki = pki("hint");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("vol");
    let server = leader(&pki, dir.path(), std::slice::from_ref(&spec)).await;
    let follower = follower(&pki, &server.endpoint()).await;
    let client = client(
        &pki,
        &spec,
        &[follower.endpoint(), server.endpoint()],
        budgets(),
    );
    client.call(mkdir(root(), "via-hint")).await.unwrap();
    assert!(
        !follower.faults().arrivals().is_empty(),
        "the follower was asked first"
    );
    assert_eq!(server.faults().arrivals().len(), 1);
    follower.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hint_outside_the_staged_set_is_ignored() {
    let pki = pki("outside");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("vol");
    let server = leader(&pki, dir.path(), std::slice::from_ref(&spec)).await;
    let follower = follower(&pki, &server.endpoint()).await;
    let client = client(&pki, &spec, &[follower.endpoint()], budgets());
    let error = client.call(getattr(root())).await.unwrap_err();
    assert!(error.is_definite(), "{error:?}");
    assert!(
        server.faults().arrivals().is_empty(),
        "the unstaged leader was never called"
    );
    follower.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_and_minorities_refuse_with_no_quorum() {
    let pki = pki("minority");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("vol");
    let orphan = follower(&pki, &dead_endpoint().await).await;
    let reply = raw(
        &pki,
        &orphan.endpoint(),
        request(&spec, [1; 16], None, getattr(root())),
    )
    .await
    .unwrap();
    assert_eq!(error_kind(&reply), Some(ErrorKind::NoQuorum));

    let server = leader(&pki, dir.path(), std::slice::from_ref(&spec)).await;
    let follower = follower(&pki, &server.endpoint()).await;
    let reply = raw(
        &pki,
        &follower.endpoint(),
        request(&spec, [2; 16], None, getattr(root())),
    )
    .await
    .unwrap();
    let Some(worker_proto::v1::reply::Result::Error(error)) = &reply.result else {
        panic!("a follower answered {reply:?}");
    };
    assert_eq!(error.kind(), ErrorKind::NotLeader);
    assert_eq!(error.leader_hint, server.endpoint());
    follower.faults().set_minority(true);
    let reply = raw(
        &pki,
        &follower.endpoint(),
        request(&spec, [3; 16], None, getattr(root())),
    )
    .await
    .unwrap();
    assert_eq!(error_kind(&reply), Some(ErrorKind::NoQuorum));

    server.faults().set_minority(true);
    let client = client(&pki, &spec, &[server.endpoint()], budgets());
    let error = client.call(mkdir(root(), "never")).await.unwrap_err();
    assert!(error.is_definite(), "{error:?}");
    server.faults().set_minority(false);
    let error = client.call(lookup(root(), "never")).await.unwrap_err();
    assert!(
        matches!(error.refusal(), Some(Refusal::Errno(libc::ENOENT))),
        "{error:?}"
    );
    orphan.stop().await;
    follower.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stand_in_answers_in_the_volumes_place_until_taken_away() {
    let pki = pki("stand-in");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("vol");
    let server = leader(&pki, dir.path(), std::slice::from_ref(&spec)).await;
    let volume = client(&pki, &spec, &[server.endpoint()], budgets());
    let made = file_of(&volume.call(mkdir(root(), "real")).await.unwrap());
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    server.faults().stand_in(Some(Arc::new({
        let seen = Arc::clone(&seen);
        move |op: &worker_proto::v1::request::Op| {
            seen.lock().unwrap().push(op.clone());
            match op {
                worker_proto::v1::request::Op::Getattr(_) => None,
                _ => Some(worker_proto::v1::reply::Result::Error(
                    worker_proto::v1::Error {
                        kind: ErrorKind::Errno.into(),
                        errno: libc::EROFS,
                        ..Default::default()
                    },
                )),
            }
        }
    })));

    // Answered by the stand-in: refused, and nothing applied.
    let error = volume.call(mkdir(root(), "stood-in")).await.unwrap_err();
    assert!(
        matches!(error.refusal(), Some(Refusal::Errno(libc::EROFS))),
        "{error:?}"
    );
    assert!(!dir.path().join("volumes/vol/data/stood-in").exists());
    // Left to the volume: the stand-in returns None for getattr.
    let attr = entry_of(&volume.call(getattr(made)).await.unwrap());
    assert_eq!(attr.file, Some(made));
    // A volume the worker does not serve is refused before any stand-in.
    let other = client(&pki, &rwx("other"), &[server.endpoint()], budgets());
    let error = other.call(getattr(root())).await.unwrap_err();
    assert!(
        matches!(error.refusal(), Some(Refusal::UnknownVolume)),
        "{error:?}"
    );
    assert_eq!(
        seen.lock().unwrap().len(),
        2,
        "the stand-in saw mkdir and getattr only"
    );

    // Taken away: the volume answers again.
    server.faults().stand_in(None);
    volume.call(mkdir(root(), "after")).await.unwrap();
    assert!(dir.path().join("volumes/vol/data/after").is_dir());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_to_an_endpoint_that_never_answers_ends_within_its_budget() {
    let pki = pki("hang");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("vol");
    let server = leader(&pki, dir.path(), std::slice::from_ref(&spec)).await;
    server.faults().set_hang(true);
    let budgets = budgets();
    let client = client(&pki, &spec, &[server.endpoint()], budgets);
    let started = Instant::now();
    let error = client.call(getattr(root())).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(error, Error::Uncertain { .. }), "{error:?}");
    assert!(
        took <= budgets.call + budgets.call / 5,
        "took {took:?} with a budget of {:?}",
        budgets.call
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_64_calls_are_in_flight() {
    let pki = pki("admission");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("vol");
    let server = leader(&pki, dir.path(), std::slice::from_ref(&spec)).await;
    // Every answer waits 3 s, so no admitted call ends (and lets another in) before the
    // first 64 have all arrived, however slowly a loaded machine lets them arrive: the count
    // is read once it stops growing, well inside those 3 s, with no fixed sleep to outrun.
    let mut budgets = budgets();
    budgets.call = Duration::from_secs(20);
    budgets.attempt = Duration::from_secs(8);
    let client = Arc::new(client(&pki, &spec, &[server.endpoint()], budgets));
    server.faults().set_delay(Duration::from_secs(3));
    let started = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let client = Arc::clone(&client);
        calls.spawn(async move { client.call(getattr(root())).await });
    }
    let mut arrived = 0;
    while started.elapsed() < Duration::from_millis(2500) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = server.faults().arrivals().len();
        if now == arrived && now >= 64 {
            break;
        }
        arrived = now;
    }
    let arrived = server.faults().arrivals().len();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the first answers came before the count settled"
    );
    assert_eq!(
        arrived, 64,
        "admission lets exactly 64 calls through at once"
    );
    let mut ok = 0;
    while let Some(result) = calls.join_next().await {
        result.unwrap().unwrap();
        ok += 1;
    }
    assert_eq!(ok, 100);
    assert_eq!(server.faults().arrivals().len(), 100, "no call was retried");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_certificate_or_ca_is_refused() {
    let pki = pki("auth");
    let rogue = pki_rogue(&pki);
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("vol");
    let server = leader(&pki, dir.path(), std::slice::from_ref(&spec)).await;
    let endpoint = [server.endpoint()];

    let wrong_token = client(&pki, &spec, &endpoint, budgets());
    wrong_token
        .transport()
        .set_credentials(&credentials(&pki, "not-the-token"));
    let error = wrong_token.call(getattr(root())).await.unwrap_err();
    assert!(matches!(error, Error::Unauthorized { .. }), "{error:?}");

    // A client certificate from another CA (server trusted correctly).
    let wrong_cert = client(&pki, &spec, &endpoint, budgets());
    wrong_cert.transport().set_credentials(
        &lease_client::Credentials::from_pem(
            TOKEN,
            pki.ca_pem.as_bytes(),
            rogue.client_pem.as_bytes(),
            rogue.client_key.as_bytes(),
        )
        .unwrap(),
    );
    // TLS 1.3 verifies the client certificate after the client has finished its side of the
    // handshake, so the client learns of the refusal (an UnknownCA alert) only when it reads;
    // whether it calls that definite is the client's policy. The worker's part, checked
    // below, is that nothing reached the protocol.
    let error = wrong_cert.call(getattr(root())).await.unwrap_err();
    assert!(!matches!(error, Error::Refused { .. }), "{error:?}");

    // A client that trusts another CA never accepts the server.
    let wrong_ca = client(&pki, &spec, &endpoint, budgets());
    wrong_ca.transport().set_credentials(
        &lease_client::Credentials::from_pem(
            TOKEN,
            rogue.ca_pem.as_bytes(),
            pki.client_pem.as_bytes(),
            pki.client_key.as_bytes(),
        )
        .unwrap(),
    );
    let error = wrong_ca.call(getattr(root())).await.unwrap_err();
    assert!(error.is_definite(), "{error:?}");

    assert!(
        server.faults().arrivals().is_empty(),
        "no refused call reached the protocol"
    );
    server.stop().await;
}

/// A second PKI whose client certificate the worker must not accept.
fn pki_rogue(_trusted: &Pki) -> Pki {
    pki("rogue")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_rotation_under_load_loses_no_call() {
    let pki = pki("rotation");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("vol");
    let server = leader(&pki, dir.path(), std::slice::from_ref(&spec)).await;
    let client = Arc::new(client(&pki, &spec, &[server.endpoint()], budgets()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = tokio::task::JoinSet::new();
    for task in 0..8 {
        let client = Arc::clone(&client);
        let stop = Arc::clone(&stop);
        load.spawn(async move {
            let mut done = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let name = format!("t{task}-{done}");
                client
                    .call(mkdir(root(), &name))
                    .await
                    .map_err(|e| format!("{name}: {e:?}"))?;
                done += 1;
            }
            Ok::<u32, String>(done)
        });
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The rotation as an operator runs it: accept both, switch the clients, drop the old.
    server.tokens().replace([TOKEN, "rotated-token"]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    client
        .transport()
        .set_credentials(&credentials(&pki, "rotated-token"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.tokens().replace(["rotated-token"]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut total = 0;
    while let Some(result) = load.join_next().await {
        total += result.unwrap().unwrap();
    }
    assert!(total > 16, "the load ran ({total} calls)");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mount_lease_fences_other_epochs() {
    let pki = pki("lease");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwo("vol");
    let server = leader(&pki, dir.path(), std::slice::from_ref(&spec)).await;
    let base = client(&pki, &spec, &[server.endpoint()], budgets());
    let a = base.with_epoch(epoch(0xa));
    let b = base.with_epoch(epoch(0xb));

    a.call(claim("node-a")).await.unwrap();
    let held = b.call(claim("node-b")).await.unwrap_err();
    assert!(
        matches!(held.refusal(), Some(Refusal::LeaseHeld { .. })),
        "{held:?}"
    );
    a.call(mkdir(root(), "mine")).await.unwrap();
    let stale = b.call(getattr(root())).await.unwrap_err();
    assert!(
        matches!(stale.refusal(), Some(Refusal::StaleEpoch)),
        "{stale:?}"
    );

    a.call(worker_proto::v1::request::Op::ReleaseMount(
        Default::default(),
    ))
    .await
    .unwrap();
    b.call(claim("node-b")).await.unwrap();
    // A late release from A never clears B.
    let late = a
        .call(worker_proto::v1::request::Op::ReleaseMount(
            Default::default(),
        ))
        .await
        .unwrap();
    assert!(matches!(
        late,
        worker_proto::v1::reply::Result::ReleaseMount(worker_proto::v1::ReleaseMountReply {
            released: false
        })
    ));
    b.call(getattr(root())).await.unwrap();
    let stale = a.call(getattr(root())).await.unwrap_err();
    assert!(matches!(stale.refusal(), Some(Refusal::StaleEpoch)));
    let reclaim = a.call(claim("node-a")).await.unwrap_err();
    assert!(reclaim.refusal().is_some(), "{reclaim:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_reply_cache_refuses_mutations_busy_and_forgets_no_reply() {
    let pki = pki("busy");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("vol");
    let clock = Arc::new(worker::ManualClock::new(1_000_000));
    let mut config = config(&pki, dir.path(), std::slice::from_ref(&spec));
    config.dedup_capacity = 2;
    let retention_ms = 4 * u64::try_from(config.timings.call_budget.as_millis()).unwrap();
    let server = worker::Server::start(config, worker::Tokens::new([TOKEN]), clock.clone())
        .await
        .unwrap();
    let endpoint = server.endpoint();
    let send = |id: u8, op| raw(&pki, &endpoint, request(&spec, [id; 16], None, op));

    // Two mutations fill the cache; every reply states the retention.
    let first = send(1, mkdir(root(), "a")).await.unwrap();
    assert_eq!(error_kind(&first), None, "{first:?}");
    assert_eq!(first.reply_retention_ms, retention_ms);
    let second = send(2, mkdir(root(), "b")).await.unwrap();
    assert_eq!(error_kind(&second), None, "{second:?}");

    // A third mutation is refused before it is applied; reads are still served.
    let third = send(3, mkdir(root(), "c")).await.unwrap();
    assert_eq!(error_kind(&third), Some(ErrorKind::Busy), "{third:?}");
    assert_eq!(third.reply_retention_ms, retention_ms);
    let missing = send(4, lookup(root(), "c")).await.unwrap();
    assert_eq!(error_kind(&missing), Some(ErrorKind::Errno), "{missing:?}");
    assert_eq!(error_kind(&send(5, getattr(root())).await.unwrap()), None);

    // A repeat of a cached mutation is answered from the cache, not applied again (EEXIST).
    let repeat = send(1, mkdir(root(), "a")).await.unwrap();
    assert_eq!(repeat.result, first.result);

    // Through the client: retried while busy, then a definite failure naming why.
    let client = client(&pki, &spec, std::slice::from_ref(&endpoint), budgets());
    let error = client.call(mkdir(root(), "d")).await.unwrap_err();
    assert!(
        matches!(
            error,
            Error::Unavailable {
                last: lease_client::Failure::WorkerBusy,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(error.is_definite());
    assert_eq!(
        client.reply_retention(),
        Some(Duration::from_millis(retention_ms))
    );

    // Once the first two are past their retention there is room again.
    clock.step(i64::try_from(retention_ms).unwrap() + 1);
    let third = send(3, mkdir(root(), "c")).await.unwrap();
    assert_eq!(error_kind(&third), None, "{third:?}");
    client.call(mkdir(root(), "d")).await.unwrap();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_reply_cache_still_renews_the_lease_and_the_handles() {
    let pki = pki("busy-lease");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwo("vol");
    let mut config = config(&pki, dir.path(), std::slice::from_ref(&spec));
    config.dedup_capacity = 2;
    let server = worker::Server::start(
        config,
        worker::Tokens::new([TOKEN]),
        Arc::new(worker::ManualClock::new(1_000_000)),
    )
    .await
    .unwrap();
    let owner = client(&pki, &spec, &[server.endpoint()], budgets()).with_epoch(epoch(1));
    owner.call(claim("a")).await.unwrap();
    owner.call(mkdir(root(), "a")).await.unwrap();
    let full = owner.call(mkdir(root(), "b")).await.unwrap_err();
    assert!(
        matches!(
            full,
            Error::Unavailable {
                last: lease_client::Failure::WorkerBusy,
                ..
            }
        ),
        "{full:?}"
    );
    // Full, and yet the lease and the open handles are kept alive.
    owner
        .call(worker_proto::v1::request::Op::RenewMount(Default::default()))
        .await
        .unwrap();
    owner
        .call(worker_proto::v1::request::Op::RenewHandles(
            Default::default(),
        ))
        .await
        .unwrap();
    server.stop().await;
}
