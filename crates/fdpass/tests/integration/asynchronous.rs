//! The tokio wrapper: the same frames, waiting on the reactor.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use fdpass::{AsyncChannel, AsyncListener, Channel, Error, Listener, MAGIC, MAX_PAYLOAD, VERSION};
use rustix::io::FdFlags;

use crate::{header, pipe, reader_closed, send_raw};

fn async_pair() -> (AsyncChannel, AsyncChannel) {
    let (a, b) = Channel::pair().unwrap();
    (AsyncChannel::new(a).unwrap(), AsyncChannel::new(b).unwrap())
}

#[tokio::test]
async fn a_descriptor_round_trips() {
    let (a, b) = async_pair();
    let (r, w) = pipe();
    a.send(b"async", &[r.as_fd()]).await.unwrap();
    drop(r);
    let message = b.recv().await.unwrap().unwrap();
    assert_eq!(message.payload, b"async");
    let [received]: [OwnedFd; 1] = message.fds.try_into().unwrap();
    assert!(
        rustix::io::fcntl_getfd(&received)
            .unwrap()
            .contains(FdFlags::CLOEXEC)
    );
    rustix::io::write(&w, b"z").unwrap();
    let mut byte = [0u8; 1];
    rustix::io::read(&received, &mut byte).unwrap();
    assert_eq!(&byte, b"z");
}

#[tokio::test]
async fn recv_waits_for_a_frame_without_blocking_the_runtime() {
    let (a, b) = async_pair();
    let receiver = tokio::spawn(async move { b.recv().await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!receiver.is_finished());
    a.send(b"late", &[]).await.unwrap();
    let message = receiver.await.unwrap().unwrap().unwrap();
    assert_eq!(message.payload, b"late");
}

#[tokio::test]
async fn send_waits_for_room_in_a_full_queue() {
    let (a, b) = async_pair();
    // A connected pair's queue is bounded by the sender's socket buffer (208 KiB by default):
    // sixteen 64 KiB frames do not fit, so the sender must wait until the receiver drains.
    let sender = tokio::spawn(async move {
        for i in 0..16u8 {
            a.send(&vec![i; MAX_PAYLOAD], &[]).await.unwrap();
        }
        a
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !sender.is_finished(),
        "16 x 64 KiB fit no default socket buffer"
    );
    for i in 0..16u8 {
        assert_eq!(
            b.recv().await.unwrap().unwrap().payload,
            vec![i; MAX_PAYLOAD]
        );
    }
    drop(sender.await.unwrap());
    assert!(b.recv().await.unwrap().is_none());
}

#[tokio::test]
async fn a_bad_frame_is_refused_and_its_descriptors_closed() {
    let (a, b) = Channel::pair().unwrap();
    let b = AsyncChannel::new(b).unwrap();
    let (r, w) = pipe();
    let mut bytes = header(&MAGIC, VERSION, 0, 0, 0, 0);
    bytes.extend_from_slice(b"");
    send_raw(a.as_fd(), &bytes, &[r.as_fd()]);
    drop(r);
    assert!(matches!(
        b.recv().await,
        Err(Error::UnexpectedFds { received: 1 })
    ));
    assert!(reader_closed(&w));
}

#[tokio::test]
async fn listener_accepts_and_into_inner_gives_back_a_blocking_channel() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keeper.sock");
    let listener = AsyncListener::new(Listener::bind(&path).unwrap()).unwrap();
    assert_eq!(listener.path(), path);

    let connect = tokio::task::spawn_blocking(move || {
        let owner = Channel::connect(&path).unwrap();
        owner.send(b"hello keeper", &[]).unwrap();
        owner
    });
    let keeper = listener.accept().await.unwrap();
    assert_eq!(
        keeper.peer_credentials().unwrap().pid,
        Some(std::process::id())
    );
    assert_eq!(
        keeper.recv().await.unwrap().unwrap().payload,
        b"hello keeper"
    );

    let owner = connect.await.unwrap();
    let keeper = keeper.into_inner();
    owner.send(b"blocking again", &[]).unwrap();
    assert_eq!(keeper.recv().unwrap().unwrap().payload, b"blocking again");
}
