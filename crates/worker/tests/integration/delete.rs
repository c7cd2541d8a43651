//! Deleting volumes: in-process through `Admin` and over the admin HTTP call.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_client::{HttpsTransport, Transport as _};
use worker::{Deleted, Error, SystemClock, Tokens};
use worker_proto::decode_reply;
use worker_proto::v1;
use worker_proto::v1::ErrorKind;

use crate::support::*;

/// Long enough for any one step here; a hang fails the test instead of stalling it.
const BOUND: Duration = Duration::from_secs(10);

fn trash_entries(state_dir: &Path) -> Vec<std::ffi::OsString> {
    match std::fs::read_dir(state_dir.join("trash")) {
        Ok(entries) => entries.map(|e| e.unwrap().file_name()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("cannot list the trash: {e}"),
    }
}

async fn delete(admin: &worker::Admin, volume_id: &str) -> Result<Deleted, Error> {
    tokio::time::timeout(BOUND, admin.delete_volume(volume_id))
        .await
        .expect("the delete hung")
}

async fn create(admin: &worker::Admin, spec: &worker::VolumeSpec) -> Result<(), Error> {
    let admin = admin.clone();
    let spec = spec.clone();
    tokio::task::spawn_blocking(move || admin.create_volume(&spec))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_removes_state_and_data_and_a_recreate_starts_empty() {
    let pki = pki("delete");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("vol");
    let server = leader(&pki, dir.path(), std::slice::from_ref(&spec)).await;
    let at = server.endpoint();
    let admin = server.admin();
    assert_eq!(admin.volume("vol"), Some(spec.clone()));
    let reply = raw(&pki, &at, request(&spec, [1; 16], None, mkdir(root(), "d")))
        .await
        .unwrap();
    assert_eq!(error_kind(&reply), None);

    assert_eq!(delete(&admin, "vol").await.unwrap(), Deleted::Removed);
    assert!(!dir.path().join("volumes/vol").exists());
    assert_eq!(trash_entries(dir.path()), Vec::<std::ffi::OsString>::new());
    assert_eq!(admin.volume("vol"), None);
    let reply = raw(&pki, &at, request(&spec, [2; 16], None, getattr(root())))
        .await
        .unwrap();
    assert_eq!(error_kind(&reply), Some(ErrorKind::UnknownVolume));
    assert!(matches!(
        server.lease("vol").await,
        Err(Error::UnknownVolume { .. })
    ));

    assert_eq!(delete(&admin, "vol").await.unwrap(), Deleted::Absent);
    assert!(matches!(
        delete(&admin, "../vol").await,
        Err(Error::InvalidVolumeId { .. })
    ));

    // The same ID again, as a new generation: a fresh, empty volume.
    let mut again = spec.clone();
    again.volume_generation = 2;
    create(&admin, &again).await.unwrap();
    assert_eq!(admin.volume("vol"), Some(again.clone()));
    let reply = raw(
        &pki,
        &at,
        request(&again, [3; 16], None, lookup(root(), "d")),
    )
    .await
    .unwrap();
    let Some(v1::reply::Result::Error(error)) = reply.result else {
        panic!("the deleted volume's directory is back");
    };
    assert_eq!(error.errno, libc::ENOENT);
    let reply = raw(&pki, &at, request(&spec, [4; 16], None, getattr(root())))
        .await
        .unwrap();
    assert_eq!(error_kind(&reply), Some(ErrorKind::IdentityMismatch));
    server.stop().await;
}

/// Sixteen callers keep a one-slot queue full while the volume is deleted: every call gets
/// an answer (applied, or UNKNOWN_VOLUME) and none hangs. Which calls land behind the stop is
/// up to timing here; `volume::tests` queues calls behind a stop deterministically.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_in_flight_and_queued_during_a_delete_all_get_an_answer() {
    let pki = pki("delete-in-flight");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("busy");
    let mut config = config(&pki, dir.path(), std::slice::from_ref(&spec));
    // A queue of one: most callers wait for room, the rest are queued behind the stop.
    config.queue_depth = 1;
    let server = worker::Server::start(config, Tokens::new([TOKEN]), Arc::new(SystemClock))
        .await
        .unwrap();
    let at = server.endpoint();
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..16u8 {
        let (pki, at, spec) = (pki.clone(), at.clone(), spec.clone());
        callers.spawn(async move {
            // Unscaled budgets: one attempt may wait behind fifteen others' fsyncs.
            let budgets = lease_client::Budgets::default();
            let transport = HttpsTransport::with_credentials(&budgets, &credentials(&pki, TOKEN));
            let mut answered = 0u32;
            let mut n = 0u32;
            loop {
                n += 1;
                let mut id = [caller; 16];
                id[..4].copy_from_slice(&n.to_le_bytes());
                let op = if n.is_multiple_of(2) {
                    getattr(root())
                } else {
                    mkdir(root(), &format!("{caller}-{n}"))
                };
                let deadline = Instant::now() + budgets.call;
                let bytes = transport
                    .send(&at, request(&spec, id, None, op), deadline)
                    .await
                    .unwrap();
                let reply = decode_reply(bytes).unwrap();
                answered += 1;
                match error_kind(&reply) {
                    None => {}
                    Some(ErrorKind::UnknownVolume) => return answered,
                    Some(other) => panic!("call {n} of caller {caller} got {other:?}"),
                }
            }
        });
    }
    // Let every caller get going before the delete.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let admin = server.admin();
    assert_eq!(delete(&admin, "busy").await.unwrap(), Deleted::Removed);
    tokio::time::timeout(BOUND, async {
        while let Some(answered) = callers.join_next().await {
            assert!(answered.unwrap() >= 1);
        }
    })
    .await
    .expect("a call during the delete got no answer");
    assert!(!dir.path().join("volumes/busy").exists());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_empties_the_trash_and_a_delete_removes_a_half_created_volume() {
    let pki = pki("delete-crash");
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep"), b"not the worker's").unwrap();

    // A delete that crashed after its rename left this; the link inside is not followed.
    let leftover = dir.path().join("trash/x.1");
    std::fs::create_dir_all(leftover.join("data/sub")).unwrap();
    std::fs::write(leftover.join("data/sub/file"), b"old data").unwrap();
    std::fs::write(leftover.join("identity.json"), b"{}").unwrap();
    std::os::unix::fs::symlink(outside.path(), leftover.join("data/link")).unwrap();
    // A create that crashed before writing the identity left this.
    let half = dir.path().join("volumes/half");
    std::fs::create_dir_all(half.join("data")).unwrap();

    let server = leader(&pki, dir.path(), &[]).await;
    assert_eq!(trash_entries(dir.path()), Vec::<std::ffi::OsString>::new());
    assert!(outside.path().join("keep").exists());

    let admin = server.admin();
    assert_eq!(admin.volume("half"), None);
    assert_eq!(delete(&admin, "half").await.unwrap(), Deleted::Removed);
    assert!(!half.exists());
    assert_eq!(delete(&admin, "half").await.unwrap(), Deleted::Absent);
    assert_eq!(trash_entries(dir.path()), Vec::<std::ffi::OsString>::new());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_delete_call_answers_over_https() {
    let pki = pki("delete-http");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwo("pvc-2");
    let server = leader(&pki, dir.path(), std::slice::from_ref(&spec)).await;
    let at = server.endpoint();
    let path = worker::ADMIN_DELETE_VOLUME_PATH;
    let body = r#"{"volume_id":"pvc-2"}"#;

    assert_eq!(admin_reply(&pki, &at, path, body, None).await.0, 401);
    assert_eq!(admin(&pki, &at, path, body, "wrong").await, 401);
    assert!(
        server.admin().volume("pvc-2").is_some(),
        "refused calls delete nothing"
    );

    for existed in [true, false] {
        let (status, reply) = admin_reply(&pki, &at, path, body, Some(TOKEN)).await;
        assert_eq!(status, 200, "{reply}");
        let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
        assert_eq!(
            reply,
            serde_json::json!({ "deleted": "pvc-2", "existed": existed })
        );
    }
    assert!(!dir.path().join("volumes/pvc-2").exists());

    for bad in [
        r#"{"volume_id":"../x"}"#,
        r#"{"volume_id":""}"#,
        "{",
        r#"{"id":"x"}"#,
    ] {
        let (status, reply) = admin_reply(&pki, &at, path, bad, Some(TOKEN)).await;
        assert_eq!(status, 400, "{bad}: {reply}");
        let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
        assert!(reply["error"].is_string(), "{bad}: {reply}");
    }

    let follower = follower(&pki, &at).await;
    let (status, reply) = admin_reply(&pki, &follower.endpoint(), path, body, Some(TOKEN)).await;
    assert_eq!(status, 421, "{reply}");
    assert!(matches!(
        follower.admin().delete_volume("pvc-2").await,
        Err(Error::UnknownVolume { .. })
    ));
    follower.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_and_deletes_leave_a_whole_volume_or_none() {
    let pki = pki("delete-race");
    let dir = tempfile::tempdir().unwrap();
    let server = leader(&pki, dir.path(), &[]).await;
    let at = server.endpoint();
    let admin = server.admin();
    let spec = rwx("raced");

    // Creates of one new volume at once: every one succeeds, and it is created once.
    let mut creates = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (admin, spec) = (admin.clone(), spec.clone());
        creates.spawn(async move { create(&admin, &spec).await });
    }
    while let Some(created) = creates.join_next().await {
        created.unwrap().unwrap();
    }
    assert_eq!(admin.volume("raced"), Some(spec.clone()));

    // Creates and deletes interleaved from several tasks.
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..6u32 {
        let (admin, spec) = (admin.clone(), spec.clone());
        tasks.spawn(async move {
            for round in 0..8u32 {
                if (task + round).is_multiple_of(2) {
                    create(&admin, &spec).await.unwrap();
                } else {
                    delete(&admin, &spec.volume_id).await.unwrap();
                }
            }
        });
    }
    tokio::time::timeout(BOUND * 3, async {
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
    })
    .await
    .expect("creates and deletes hung");

    let volume_dir = dir.path().join("volumes/raced");
    match admin.volume("raced") {
        Some(served) => {
            assert_eq!(served, spec);
            assert!(volume_dir.join("identity.json").exists());
            let reply = raw(&pki, &at, request(&spec, [1; 16], None, getattr(root())))
                .await
                .unwrap();
            assert_eq!(error_kind(&reply), None);
        }
        None => assert!(!volume_dir.exists()),
    }
    assert_eq!(trash_entries(dir.path()), Vec::<std::ffi::OsString>::new());

    // Either way, one more delete leaves none, and a restart finds none.
    delete(&admin, "raced").await.unwrap();
    server.stop().await;
    assert!(matches!(
        admin.create_volume(&spec),
        Err(Error::Stopped { .. })
    ));
    let server = leader(&pki, dir.path(), &[]).await;
    assert_eq!(server.admin().volume("raced"), None);
    server.stop().await;
}
