//! Bad input gets a definite answer and never a panic.

use bytes::Bytes;
use lease_client::TransportError;
use worker_proto::MAX_MESSAGE_BYTES;
use worker_proto::v1;
use worker_proto::v1::ErrorKind;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_definite_errors() {
    let pki = pki("bad");
    let dir = tempfile::tempdir().unwrap();
    let rwo = rwo("vol-rwo");
    let rwx = rwx("vol-rwx");
    let server = leader(&pki, dir.path(), &[rwo.clone(), rwx.clone()]).await;
    let at = server.endpoint();

    // A body over the limit is refused while it is read.
    let huge = Bytes::from(vec![0u8; MAX_MESSAGE_BYTES + 1]);
    assert_eq!(
        raw(&pki, &at, huge).await.unwrap_err(),
        TransportError::Rejected { status: 413 }
    );

    // Garbage protobuf, and a message with a short request ID.
    for garbage in [
        Bytes::from_static(b"\xff\xff\xff\xff garbage"),
        Bytes::from_static(b"\x1a\x03abc"),
        Bytes::new(),
    ] {
        let reply = raw(&pki, &at, garbage).await.unwrap();
        assert_eq!(error_kind(&reply), Some(ErrorKind::InvalidRequest));
    }

    // An unknown volume.
    let reply = raw(
        &pki,
        &at,
        request(&crate::support::rwx("nope"), [1; 16], None, getattr(root())),
    )
    .await
    .unwrap();
    assert_eq!(error_kind(&reply), Some(ErrorKind::UnknownVolume));
    assert_eq!(reply.request_id, vec![1; 16]);

    // A wrong volume generation, and the wrong access mode.
    let mut wrong = rwx.clone();
    wrong.volume_generation = 2;
    let reply = raw(&pki, &at, request(&wrong, [2; 16], None, getattr(root())))
        .await
        .unwrap();
    assert_eq!(error_kind(&reply), Some(ErrorKind::IdentityMismatch));
    let mut wrong = rwx.clone();
    wrong.access_mode = worker::AccessMode::Rwo;
    let reply = raw(
        &pki,
        &at,
        request(&wrong, [3; 16], Some([9; 16]), getattr(root())),
    )
    .await
    .unwrap();
    assert_eq!(error_kind(&reply), Some(ErrorKind::IdentityMismatch));

    // A missing epoch on an RWO volume, for a read and for a mutation.
    for op in [getattr(root()), mkdir(root(), "d")] {
        let reply = raw(&pki, &at, request(&rwo, [4; 16], None, op))
            .await
            .unwrap();
        assert_eq!(error_kind(&reply), Some(ErrorKind::StaleEpoch));
    }
    // A claim without an epoch is malformed.
    let reply = raw(&pki, &at, request(&rwo, [5; 16], None, claim("n1")))
        .await
        .unwrap();
    assert_eq!(error_kind(&reply), Some(ErrorKind::InvalidRequest));
    // Lease commands on an RWX volume.
    let reply = raw(
        &pki,
        &at,
        request(&rwx, [6; 16], Some([1; 16]), claim("n1")),
    )
    .await
    .unwrap();
    assert_eq!(error_kind(&reply), Some(ErrorKind::InvalidRequest));

    // Names that would leave the directory, and file IDs the worker never issued.
    for name in ["..", ".", "a/b", ""] {
        let reply = raw(
            &pki,
            &at,
            request(&rwx, [7; 16], None, lookup(root(), name)),
        )
        .await
        .unwrap();
        let Some(v1::reply::Result::Error(error)) = reply.result else {
            panic!("{name:?} was accepted");
        };
        assert_eq!(error.kind(), ErrorKind::Errno);
        assert_eq!(error.errno, libc::EINVAL);
    }
    let bogus = v1::FileId {
        ino: 123_456_789,
        inode_generation: 5,
    };
    let reply = raw(&pki, &at, request(&rwx, [8; 16], None, getattr(bogus)))
        .await
        .unwrap();
    let Some(v1::reply::Result::Error(error)) = reply.result else {
        panic!("an unissued inode was accepted");
    };
    assert_eq!(error.errno, libc::ESTALE);
    let wrong_root = v1::FileId {
        ino: worker::ROOT_INO,
        inode_generation: 99,
    };
    let reply = raw(&pki, &at, request(&rwx, [9; 16], None, getattr(wrong_root)))
        .await
        .unwrap();
    assert!(
        matches!(reply.result, Some(v1::reply::Result::Error(ref e)) if e.errno == libc::ESTALE)
    );

    // A request ID reused for different bytes.
    let first = raw(&pki, &at, request(&rwx, [10; 16], None, mkdir(root(), "x")))
        .await
        .unwrap();
    assert_eq!(error_kind(&first), None);
    let reused = raw(&pki, &at, request(&rwx, [10; 16], None, mkdir(root(), "y")))
        .await
        .unwrap();
    assert_eq!(error_kind(&reused), Some(ErrorKind::InvalidRequest));

    // The server still answers normally.
    let reply = raw(&pki, &at, request(&rwx, [11; 16], None, getattr(root())))
        .await
        .unwrap();
    assert_eq!(error_kind(&reply), None);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_create_volumes_and_set_faults() {
    let pki = pki("admin");
    let dir = tempfile::tempdir().unwrap();
    let server = leader(&pki, dir.path(), &[]).await;
    let at = server.endpoint();
    let body = r#"{"volume_id":"made-by-admin","volume_generation":3,"access_mode":"rwx"}"#;
    assert_eq!(
        admin(&pki, &at, worker::ADMIN_VOLUMES_PATH, body, TOKEN).await,
        200
    );
    assert_eq!(
        admin(&pki, &at, worker::ADMIN_VOLUMES_PATH, body, TOKEN).await,
        200,
        "idempotent"
    );
    let other = r#"{"volume_id":"made-by-admin","volume_generation":3,"access_mode":"rwo"}"#;
    assert_eq!(
        admin(&pki, &at, worker::ADMIN_VOLUMES_PATH, other, TOKEN).await,
        409
    );
    let bad = r#"{"volume_id":"../x","volume_generation":3,"access_mode":"rwo"}"#;
    assert_eq!(
        admin(&pki, &at, worker::ADMIN_VOLUMES_PATH, bad, TOKEN).await,
        400
    );
    assert_eq!(
        admin(&pki, &at, worker::ADMIN_VOLUMES_PATH, "{", TOKEN).await,
        400
    );
    assert_eq!(
        admin(&pki, &at, worker::ADMIN_VOLUMES_PATH, body, "wrong").await,
        401
    );

    let mut spec = rwx("made-by-admin");
    spec.volume_generation = 3;
    let reply = raw(&pki, &at, request(&spec, [1; 16], None, getattr(root())))
        .await
        .unwrap();
    assert_eq!(error_kind(&reply), None);

    assert_eq!(
        admin(
            &pki,
            &at,
            worker::ADMIN_FAULTS_PATH,
            r#"{"minority":true}"#,
            TOKEN
        )
        .await,
        200
    );
    let reply = raw(&pki, &at, request(&spec, [2; 16], None, getattr(root())))
        .await
        .unwrap();
    assert_eq!(error_kind(&reply), Some(ErrorKind::NoQuorum));
    assert_eq!(
        admin(
            &pki,
            &at,
            worker::ADMIN_FAULTS_PATH,
            r#"{"minority":false,"restart":true}"#,
            TOKEN
        )
        .await,
        200
    );
    let reply = raw(&pki, &at, request(&spec, [3; 16], None, getattr(root())))
        .await
        .unwrap();
    assert_eq!(error_kind(&reply), None);
    assert_eq!(
        admin(
            &pki,
            &at,
            worker::ADMIN_FAULTS_PATH,
            r#"{"bogus":1}"#,
            TOKEN
        )
        .await,
        400
    );
    server.stop().await;
}
