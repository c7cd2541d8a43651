//! Files, inode identity, handles and durable leases, across restarts.

use std::sync::Arc;

use lease_client::{Error, Refusal};
use worker::{ManualClock, Reopen, Server, SystemClock, Tokens};
use worker_proto::v1;
use worker_proto::v1::request::Op;

use crate::support::*;

fn errno(error: &Error) -> Option<i32> {
    match error.refusal() {
        Some(Refusal::Errno(errno)) => Some(*errno),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inode_numbers_and_generations_survive_restarts() {
    if !test_support::requires_root(
        "inode_numbers_and_generations_survive_restarts",
        "file IDs survive a restart only when files are opened by handle",
    ) {
        return;
    }
    let pki = pki("inodes");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("vol");
    let server = leader(&pki, dir.path(), std::slice::from_ref(&spec)).await;
    let c = client(&pki, &spec, &[server.endpoint()], budgets());

    let root_attr = c.call(getattr(root())).await.unwrap();
    assert_eq!(file_of(&root_attr), root());
    let sub = file_of(&c.call(mkdir(root(), "sub")).await.unwrap());
    let file = file_of(&c.call(create(sub, "file")).await.unwrap());
    assert_ne!(sub.ino, worker::ROOT_INO);
    assert!(file.inode_generation > worker::ROOT_GENERATION);

    // An in-process restart, then a whole new server on the same state directory.
    server.restart().await.unwrap();
    assert_eq!(file_of(&c.call(lookup(root(), "sub")).await.unwrap()), sub);
    assert_eq!(file_of(&c.call(getattr(file)).await.unwrap()), file);
    let endpoint = server.endpoint();
    server.stop().await;
    let mut config = config(&pki, dir.path(), &[]);
    config.listen = endpoint.parse().unwrap();
    let server = Server::start(config, Tokens::new([TOKEN]), Arc::new(SystemClock))
        .await
        .unwrap();
    assert_eq!(file_of(&c.call(getattr(file)).await.unwrap()), file);
    assert_eq!(file_of(&c.call(lookup(sub, "file")).await.unwrap()), file);

    // A rename keeps the identity: files are addressed by inode, not by path.
    c.call(Op::Rename(v1::RenameRequest {
        parent: Some(sub),
        name: b"file".to_vec(),
        new_parent: Some(root()),
        new_name: b"moved".to_vec(),
        flags: 0,
    }))
    .await
    .unwrap();
    assert_eq!(file_of(&c.call(getattr(file)).await.unwrap()), file);

    // Once its last link is gone, the old file ID is stale.
    c.call(unlink(root(), "moved")).await.unwrap();
    let gone = c.call(getattr(file)).await.unwrap_err();
    assert_eq!(errno(&gone), Some(libc::ESTALE));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_descriptor_a_restart_loses_file_ids_until_the_files_are_named_again() {
    let pki = pki("descriptors");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("vol");
    let mut config = config(&pki, dir.path(), std::slice::from_ref(&spec));
    config.reopen = Reopen::ByDescriptor;
    let server = Server::start(config, Tokens::new([TOKEN]), Arc::new(SystemClock))
        .await
        .unwrap();
    let c = client(&pki, &spec, &[server.endpoint()], budgets());
    let sub = file_of(&c.call(mkdir(root(), "sub")).await.unwrap());
    let file = file_of(&c.call(create(sub, "file")).await.unwrap());
    c.call(Op::Rename(v1::RenameRequest {
        parent: Some(sub),
        name: b"file".to_vec(),
        new_parent: Some(root()),
        new_name: b"moved".to_vec(),
        flags: 0,
    }))
    .await
    .unwrap();
    assert_eq!(file_of(&c.call(getattr(file)).await.unwrap()), file);

    // The restarted worker has no descriptors: every file ID but the root's is stale.
    server.restart().await.unwrap();
    for lost in [sub, file] {
        let error = c.call(getattr(lost)).await.unwrap_err();
        assert_eq!(errno(&error), Some(libc::ESTALE), "{lost:?}");
    }
    // Named again (a lookup, a listing), a file has its old ID back: its file handle is the same.
    assert_eq!(
        file_of(&c.call(lookup(root(), "moved")).await.unwrap()),
        file
    );
    assert_eq!(file_of(&c.call(getattr(file)).await.unwrap()), file);
    let listed = c
        .call(Op::Readdir(v1::ReaddirRequest {
            dir: Some(root()),
            handle: None,
            offset: 0,
            max_entries: 0,
            plus: false,
        }))
        .await
        .unwrap();
    let v1::reply::Result::Readdir(listed) = listed else {
        panic!("{listed:?}");
    };
    assert!(listed.entries.iter().any(|e| e.file == Some(sub)));
    assert_eq!(file_of(&c.call(getattr(sub)).await.unwrap()), sub);

    // Once its last link is gone, the file ID is stale, as by handle.
    c.call(unlink(root(), "moved")).await.unwrap();
    let gone = c.call(getattr(file)).await.unwrap_err();
    assert_eq!(errno(&gone), Some(libc::ESTALE));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopening_a_volume_with_the_other_access_mode_fails_before_service() {
    let pki = pki("mode");
    let dir = tempfile::tempdir().unwrap();
    let server = leader(&pki, dir.path(), &[rwo("vol")]).await;
    assert!(matches!(
        server.create_volume(&rwx("vol")),
        Err(worker::Error::IdentityMismatch { .. })
    ));
    server.stop().await;
    let started = Server::start(
        config(&pki, dir.path(), &[rwx("vol")]),
        Tokens::new([TOKEN]),
        Arc::new(SystemClock),
    )
    .await;
    assert!(
        matches!(started, Err(worker::Error::IdentityMismatch { .. })),
        "{started:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_worker_keeps_the_lease_and_an_expired_one_stays_expired() {
    let pki = pki("durable");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwo("vol");
    let clock = Arc::new(ManualClock::new(1_000_000));
    let server =
        leader_with_clock(&pki, dir.path(), std::slice::from_ref(&spec), clock.clone()).await;
    let base = client(&pki, &spec, &[server.endpoint()], budgets());
    let a = base.with_epoch(epoch(1));
    let b = base.with_epoch(epoch(2));
    a.call(claim("a")).await.unwrap();

    // A full restart keeps ownership.
    let endpoint = server.endpoint();
    server.stop().await;
    let mut cfg = config(&pki, dir.path(), &[]);
    cfg.listen = endpoint.parse().unwrap();
    let server = Server::start(cfg.clone(), Tokens::new([TOKEN]), clock.clone())
        .await
        .unwrap();
    a.call(Op::RenewMount(Default::default())).await.unwrap();
    assert!(matches!(
        b.call(claim("b")).await.unwrap_err().refusal(),
        Some(Refusal::LeaseHeld { .. })
    ));

    // The lease runs out; a read observes it, then the clock steps back before the expiry.
    let lease_ms = i64::try_from(timings().lease.as_millis()).unwrap();
    clock.step(lease_ms + 1);
    assert!(matches!(
        a.call(getattr(root())).await.unwrap_err().refusal(),
        Some(Refusal::StaleEpoch)
    ));
    clock.step(-2 * lease_ms);
    for op in [
        getattr(root()),
        Op::RenewMount(Default::default()),
        claim("a"),
    ] {
        let error = a.call(op).await.unwrap_err();
        assert!(
            matches!(error.refusal(), Some(Refusal::StaleEpoch)),
            "{error:?}"
        );
    }
    server.stop().await;
    let server = Server::start(cfg, Tokens::new([TOKEN]), clock.clone())
        .await
        .unwrap();
    let error = a
        .call(Op::RenewMount(Default::default()))
        .await
        .unwrap_err();
    assert!(
        matches!(error.refusal(), Some(Refusal::StaleEpoch)),
        "{error:?}"
    );
    b.call(claim("b")).await.unwrap();
    b.call(getattr(root())).await.unwrap();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_carry_leases_and_expired_ones_are_reclaimed() {
    let pki = pki("handles");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("vol");
    let clock = Arc::new(ManualClock::new(5_000_000));
    let server =
        leader_with_clock(&pki, dir.path(), std::slice::from_ref(&spec), clock.clone()).await;
    let c = client(&pki, &spec, &[server.endpoint()], budgets());
    let created = c.call(create(root(), "data")).await.unwrap();
    let v1::reply::Result::Create(created) = created else {
        panic!("{created:?}");
    };
    let file = created.entry.unwrap().file.unwrap();
    let handle = created.handle;
    let write = |data: &'static [u8], offset| {
        Op::Write(v1::WriteRequest {
            file: Some(file),
            handle,
            offset,
            data: bytes::Bytes::from_static(data),
            flags: 0,
        })
    };
    let read = Op::Read(v1::ReadRequest {
        file: Some(file),
        handle,
        offset: 0,
        size: 64,
    });
    c.call(write(b"hello ", 0)).await.unwrap();
    c.call(write(b"world", 6)).await.unwrap();
    let v1::reply::Result::Read(data) = c.call(read.clone()).await.unwrap() else {
        panic!();
    };
    assert_eq!(&data.data[..], b"hello world");

    // Renewal keeps the handle past its original lease.
    let lease = i64::try_from(created.handle_lease_ms).unwrap();
    clock.step(lease * 3 / 4);
    let renewed = c
        .call(Op::RenewHandles(v1::RenewHandlesRequest {
            handles: vec![handle, 42],
        }))
        .await
        .unwrap();
    let v1::reply::Result::RenewHandles(renewed) = renewed else {
        panic!();
    };
    assert_eq!(renewed.expired, vec![42]);
    clock.step(lease * 3 / 4);
    c.call(read.clone()).await.unwrap();

    // Without renewal it is reclaimed.
    clock.step(lease + 1);
    let error = c.call(read).await.unwrap_err();
    assert_eq!(errno(&error), Some(libc::EBADF));
    let released = c
        .call(Op::Release(v1::ReleaseRequest {
            file: Some(file),
            handle,
            flags: 0,
        }))
        .await;
    assert!(released.is_ok(), "releasing an expired handle succeeds");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symbolic_links_are_never_followed() {
    let pki = pki("symlinks");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("vol");
    let server = leader(&pki, dir.path(), std::slice::from_ref(&spec)).await;
    let c = client(&pki, &spec, &[server.endpoint()], budgets());
    let link = c
        .call(Op::Symlink(v1::SymlinkRequest {
            parent: Some(root()),
            name: b"escape".to_vec(),
            target: b"/etc".to_vec(),
            caller: None,
        }))
        .await
        .unwrap();
    let link = file_of(&link);
    let v1::reply::Result::Readlink(target) = c
        .call(Op::Readlink(v1::ReadlinkRequest { file: Some(link) }))
        .await
        .unwrap()
    else {
        panic!();
    };
    assert_eq!(target.target, b"/etc");
    let error = c.call(lookup(link, "passwd")).await.unwrap_err();
    assert_eq!(errno(&error), Some(libc::ENOTDIR));
    let error = c
        .call(Op::Open(v1::OpenRequest {
            file: Some(link),
            flags: libc::O_RDONLY as u32,
        }))
        .await
        .unwrap_err();
    assert_eq!(errno(&error), Some(libc::ELOOP));
    let error = c.call(create(link, "x")).await.unwrap_err();
    assert_eq!(errno(&error), Some(libc::ENOTDIR));

    // readdir lists the link as a link, without following it.
    let listed = c
        .call(Op::Readdir(v1::ReaddirRequest {
            dir: Some(root()),
            handle: None,
            offset: 0,
            max_entries: 0,
            plus: true,
        }))
        .await
        .unwrap();
    let v1::reply::Result::Readdir(listed) = listed else {
        panic!();
    };
    assert!(listed.end);
    assert_eq!(listed.entries.len(), 1);
    assert_eq!(listed.entries[0].file_type, libc::S_IFLNK);
    assert_eq!(listed.entries[0].file, Some(link));
    server.stop().await;
}

/// One readdir batch of at most `max` entries of `dir` after `offset`: the names and the
/// offset to resume from, `None` at the end.
async fn batch(
    c: &lease_client::Client<lease_client::HttpsTransport>,
    dir: v1::FileId,
    offset: u64,
    max: u32,
) -> (Vec<String>, Option<u64>) {
    let listed = c
        .call(Op::Readdir(v1::ReaddirRequest {
            dir: Some(dir),
            handle: None,
            offset,
            max_entries: max,
            plus: true,
        }))
        .await
        .unwrap();
    let v1::reply::Result::Readdir(listed) = listed else {
        panic!("{listed:?}");
    };
    let names = listed
        .entries
        .iter()
        .map(|e| String::from_utf8(e.name.clone()).unwrap())
        .collect();
    let next = listed.entries.last().map(|e| e.next_offset);
    (names, next.filter(|_| !listed.end))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_in_batches_returns_each_unchanged_entry_once_whatever_changes_meanwhile() {
    let pki = pki("listing");
    let dir = tempfile::tempdir().unwrap();
    let spec = rwx("vol");
    let server = leader(&pki, dir.path(), std::slice::from_ref(&spec)).await;
    let c = client(&pki, &spec, &[server.endpoint()], budgets());
    let sub = file_of(&c.call(mkdir(root(), "sub")).await.unwrap());
    let names: Vec<String> = (0..300).map(|n| format!("f{n}")).collect();
    for name in &names {
        c.call(create(sub, name)).await.unwrap();
    }

    // A listing in batches of 40; after the first batch a name is added and one not listed
    // yet is removed, and halfway the worker restarts (its kept listings are gone).
    let (first, mut next) = batch(&c, sub, 0, 40).await;
    assert_eq!(first.len(), 40);
    let removed = names.iter().find(|n| !first.contains(n)).unwrap().clone();
    c.call(unlink(sub, &removed)).await.unwrap();
    c.call(create(sub, "added")).await.unwrap();
    let mut listed = first;
    let mut batches = 1;
    while let Some(offset) = next {
        if batches == 4 {
            server.restart().await.unwrap();
        }
        let (more, after) = batch(&c, sub, offset, 40).await;
        listed.extend(more);
        next = after;
        batches += 1;
    }
    let mut sorted = listed.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), listed.len(), "no name twice");
    for name in names.iter().filter(|n| **n != removed) {
        assert!(listed.contains(name), "{name} was not listed");
    }
    assert!(
        !listed.contains(&removed),
        "a name removed before its batch is skipped"
    );
    assert!(batches >= 8, "{batches} batches");

    // A listing started after the changes has them.
    let mut again = Vec::new();
    let mut offset = Some(0);
    while let Some(from) = offset {
        let (more, after) = batch(&c, sub, from, 1000).await;
        again.extend(more);
        offset = after;
    }
    assert_eq!(again.len(), 300);
    assert!(again.contains(&"added".to_owned()) && !again.contains(&removed));
    server.stop().await;
}
