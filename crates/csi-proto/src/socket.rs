//! Serving and reaching gRPC services on Unix sockets.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::Router;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::endpoint::MAX_SOCKET_PATH_LEN;
use crate::error::{Error, FileKind};

/// Binds a listening Unix socket at `path`, replacing a stale socket left by an earlier run.
///
/// Before binding, the path is examined without following symbolic links:
/// - nothing there: bind;
/// - a socket: it is taken to be stale (the previous server is gone), removed, then bound;
/// - anything else (regular file, directory, symbolic link, device, pipe): nothing is
///   touched and [`Error::NotASocket`] names the path and what is there.
///
/// Liveness of an existing socket is not probed: callers that may run twice at once must
/// exclude each other first (the local driver holds its store lock before binding).
///
/// When this returns, clients can connect: the kernel queues them until the server accepts.
///
/// # Panics
///
/// Panics when called outside a Tokio runtime, as [`UnixListener::bind`] does.
pub fn bind_unix(path: impl AsRef<Path>) -> Result<UnixListener, Error> {
    let path = path.as_ref();
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH_LEN {
        return Err(Error::SocketPathTooLong {
            path: path.to_owned(),
            len,
            max: MAX_SOCKET_PATH_LEN,
        });
    }
    remove_stale_socket(path)?;
    UnixListener::bind(path).map_err(|source| Error::Bind {
        path: path.to_owned(),
        source,
    })
}

/// Removes `path` if and only if it is a socket (a stale one left by an earlier process); a
/// missing path is fine, and anything else is an error that names it.
pub fn remove_stale_socket(path: &Path) -> Result<(), Error> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(source) if source.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(Error::Inspect {
                path: path.to_owned(),
                source,
            });
        }
    };
    match FileKind::of(metadata.file_type()) {
        FileKind::Socket => match std::fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(source) if source.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::RemoveStale {
                path: path.to_owned(),
                source,
            }),
        },
        kind @ (FileKind::RegularFile
        | FileKind::Directory
        | FileKind::Symlink
        | FileKind::Fifo
        | FileKind::BlockDevice
        | FileKind::CharDevice
        | FileKind::Unknown) => Err(Error::NotASocket {
            path: path.to_owned(),
            kind,
        }),
    }
}

/// How long a shutdown waits for connections to finish before the server stops anyway.
///
/// A graceful HTTP/2 shutdown waits for each client to acknowledge it; a client that never
/// answers (stuck, or its runtime no longer polled) would otherwise hold the process past its
/// termination grace period, until it is killed.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves `router` on an already bound listener until `shutdown` completes.
///
/// Graceful within [`SHUTDOWN_GRACE`]: once `shutdown` resolves, no new connections are
/// accepted and calls in flight are allowed to finish; past the grace, the server stops
/// waiting and returns (connections still open are closed when the runtime ends). The socket
/// file is left in place; the next [`bind_unix`] on the same path replaces it.
pub async fn serve_on<F>(listener: UnixListener, router: Router, shutdown: F) -> Result<(), Error>
where
    F: Future<Output = ()>,
{
    serve_on_with_grace(listener, router, shutdown, SHUTDOWN_GRACE).await
}

/// [`serve_on`] with a grace of `grace` instead of [`SHUTDOWN_GRACE`].
pub async fn serve_on_with_grace<F>(
    listener: UnixListener,
    router: Router,
    shutdown: F,
    grace: std::time::Duration,
) -> Result<(), Error>
where
    F: Future<Output = ()>,
{
    let path = listener
        .local_addr()
        .ok()
        .and_then(|addr| addr.as_pathname().map(Path::to_owned));
    let (asked, shutting_down) = tokio::sync::oneshot::channel::<()>();
    let serving = router.serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
        shutdown.await;
        let _ = asked.send(());
    });
    tokio::pin!(serving);
    let result = tokio::select! {
        result = &mut serving => result,
        Ok(()) = shutting_down => {
            match tokio::time::timeout(grace, &mut serving).await {
                Ok(result) => result,
                // The connections that did not finish are given up on.
                Err(_) => Ok(()),
            }
        }
    };
    result.map_err(|source| Error::Serve { path, source })
}

/// Binds `path` (see [`bind_unix`]) and serves `router` on it until `shutdown` completes.
///
/// Use [`bind_unix`] and [`serve_on`] separately when the caller must know that the socket
/// is ready before the server runs, for example to report readiness.
pub async fn serve_unix<F>(router: Router, path: impl AsRef<Path>, shutdown: F) -> Result<(), Error>
where
    F: Future<Output = ()>,
{
    let listener = bind_unix(path)?;
    serve_on(listener, router, shutdown).await
}

/// Connects a gRPC client channel to the Unix socket at `path`.
///
/// The first connection is made before this returns, so a missing socket or a server that
/// is not listening is reported here as [`Error::Connect`]. If the connection drops later,
/// the channel reconnects to the same path on the next call.
pub async fn connect_unix(path: impl AsRef<Path>) -> Result<Channel, Error> {
    let path = path.as_ref().to_owned();
    // The URI is required by tonic but unused: the connector below ignores it. Its
    // authority becomes the HTTP/2 `:authority`, which servers on a socket do not check.
    let endpoint = Endpoint::from_static("http://localhost");
    let socket: PathBuf = path.clone();
    endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|source| Error::Connect { path, source })
}

/// A channel to the gRPC server on the Unix socket at `path` that connects on first use, and
/// again after a failure, giving up on each connection attempt after `connect_timeout`. For a
/// client whose server may be down when it starts, or restart under it.
pub fn connect_unix_lazy(path: impl AsRef<Path>, connect_timeout: std::time::Duration) -> Channel {
    let socket: PathBuf = path.as_ref().to_owned();
    Endpoint::from_static("http://localhost")
        .connect_timeout(connect_timeout)
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn binds_when_nothing_is_there() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("csi.sock");
        runtime().block_on(async {
            let _listener = bind_unix(&path).expect("bind");
        });
        assert!(matches!(
            FileKind::of(std::fs::symlink_metadata(&path).expect("stat").file_type()),
            FileKind::Socket
        ));
    }

    #[test]
    fn replaces_a_stale_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("csi.sock");
        runtime().block_on(async {
            drop(bind_unix(&path).expect("first bind"));
            assert!(
                path.exists(),
                "a dropped listener leaves its socket file behind"
            );
            let listener = bind_unix(&path).expect("second bind replaces the stale socket");
            let client = tokio::spawn({
                let path = path.clone();
                async move { UnixStream::connect(path).await }
            });
            listener.accept().await.expect("accept");
            client.await.expect("join").expect("connect");
        });
    }

    #[test]
    fn leaves_a_regular_file_untouched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("csi.sock");
        std::fs::write(&path, b"precious").expect("write");
        let err = runtime().block_on(async { bind_unix(&path).expect_err("must refuse") });
        match &err {
            Error::NotASocket {
                path: reported,
                kind,
            } => {
                assert_eq!(reported, &path);
                assert_eq!(*kind, FileKind::RegularFile);
            }
            other => panic!("expected NotASocket, got {other:?}"),
        }
        let message = err.to_string();
        assert!(message.contains(&*path.to_string_lossy()), "{message}");
        assert!(message.contains("regular file"), "{message}");
        assert_eq!(std::fs::read(&path).expect("still there"), b"precious");
    }

    #[test]
    fn leaves_a_directory_untouched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("csi.sock");
        std::fs::create_dir(&path).expect("mkdir");
        std::fs::write(path.join("inside"), b"x").expect("write");
        let err = runtime().block_on(async { bind_unix(&path).expect_err("must refuse") });
        assert!(
            matches!(
                err,
                Error::NotASocket {
                    kind: FileKind::Directory,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(path.join("inside").exists());
    }

    #[test]
    fn never_follows_a_symlink_even_to_a_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().join("real.sock");
        let link = dir.path().join("csi.sock");
        runtime().block_on(async {
            let _listener = bind_unix(&real).expect("bind real");
            symlink(&real, &link).expect("symlink");
            let err = bind_unix(&link).expect_err("must refuse");
            assert!(
                matches!(
                    err,
                    Error::NotASocket {
                        kind: FileKind::Symlink,
                        ..
                    }
                ),
                "{err:?}"
            );
        });
        assert!(
            std::fs::symlink_metadata(&link)
                .expect("link kept")
                .file_type()
                .is_symlink()
        );
        assert!(real.exists(), "the link's target is not removed");
    }

    #[test]
    fn leaves_a_dangling_symlink_untouched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let link = dir.path().join("csi.sock");
        symlink(dir.path().join("missing"), &link).expect("symlink");
        let err = runtime().block_on(async { bind_unix(&link).expect_err("must refuse") });
        assert!(
            matches!(
                err,
                Error::NotASocket {
                    kind: FileKind::Symlink,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn rejects_a_path_too_long_for_the_kernel() {
        let path = PathBuf::from(format!("/tmp/{}", "x".repeat(MAX_SOCKET_PATH_LEN)));
        let err = runtime().block_on(async { bind_unix(&path).expect_err("too long") });
        assert!(matches!(err, Error::SocketPathTooLong { .. }), "{err:?}");
    }

    #[test]
    fn connect_to_a_missing_socket_names_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("absent.sock");
        let err = runtime().block_on(async { connect_unix(&path).await.expect_err("no server") });
        match &err {
            Error::Connect { path: reported, .. } => assert_eq!(reported, &path),
            other => panic!("expected Connect, got {other:?}"),
        }
    }
}
