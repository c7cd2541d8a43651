//! The Unix-socket helpers end to end: a server bound with `bind_unix` and served with
//! `serve_on` or `serve_unix` answers a client from `connect_unix`, at the path a
//! `unix:///...` endpoint names; a restart replaces the stale socket and a file that is not a
//! socket is never replaced. One small Identity service is enough: what each CSI call means is
//! the drivers' to test, and how tonic carries it is tonic's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::identity_server::{Identity, IdentityServer};
use csi_proto::v1::{self as csi};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::{Request, Response, Status};

const DRIVER: &str = "csi.test.tak-os.org";

struct TestIdentity;

#[tonic::async_trait]
impl Identity for TestIdentity {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: DRIVER.into(),
            ..Default::default()
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::GetPluginCapabilitiesResponse::default()))
    }

    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

fn router() -> tonic::transport::server::Router {
    tonic::transport::Server::builder().add_service(IdentityServer::new(TestIdentity))
}

/// A test server on a Unix socket.
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), csi_proto::Error>>,
}

impl Running {
    async fn stop(self) {
        self.stop.send(()).expect("server still running");
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("server stops within 10 s")
            .expect("server task")
            .expect("server ends without error");
    }
}

fn start_at(path: &Path) -> Running {
    // The socket is bound before the server task runs, so clients can connect right away.
    let listener = csi_proto::bind_unix(path).expect("bind");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(csi_proto::serve_on(listener, router(), async {
        let _ = stopped.await;
    }));
    Running { stop, task }
}

async fn plugin_name(path: &Path) -> String {
    let channel = csi_proto::connect_unix(path).await.expect("connect");
    IdentityClient::new(channel)
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .expect("plugin info")
        .into_inner()
        .name
}

#[tokio::test]
async fn a_client_reaches_the_server_at_the_endpoints_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let text = format!("unix://{}", dir.path().join("csi.sock").display());
    let endpoint = csi_proto::UnixEndpoint::parse(&text).expect("endpoint");
    let server = start_at(endpoint.path());

    assert_eq!(plugin_name(endpoint.path()).await, DRIVER);

    // The literal path a kubelet or sidecar calls, independent of the generated client.
    let mut grpc = tonic::client::Grpc::new(
        csi_proto::connect_unix(endpoint.path())
            .await
            .expect("connect"),
    );
    grpc.ready().await.expect("ready");
    let probe = grpc
        .unary(
            Request::new(csi::ProbeRequest {}),
            PathAndQuery::from_static("/csi.v1.Identity/Probe"),
            tonic_prost::ProstCodec::<csi::ProbeRequest, csi::ProbeResponse>::default(),
        )
        .await
        .expect("probe by path")
        .into_inner();
    assert_eq!(probe.ready, Some(true));
    server.stop().await;
}

#[tokio::test]
async fn a_restarted_server_replaces_its_stale_socket() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("csi.sock");
    start_at(&path).stop().await;
    let left =
        std::fs::symlink_metadata(&path).expect("the stopped server's socket is still there");
    assert!(std::os::unix::fs::FileTypeExt::is_socket(&left.file_type()));

    let server = start_at(&path);
    assert_eq!(plugin_name(&path).await, DRIVER, "served after restart");
    server.stop().await;
}

#[tokio::test]
async fn serve_unix_binds_and_serves_until_shutdown() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path: PathBuf = dir.path().join("csi.sock");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(csi_proto::serve_unix(router(), path.clone(), async {
        let _ = stopped.await;
    }));

    // serve_unix binds inside the task, so wait for the socket to accept connections.
    let mut attempts = 0;
    let channel = loop {
        match csi_proto::connect_unix(&path).await {
            Ok(channel) => break channel,
            Err(_) if attempts < 200 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(err) => panic!("server never came up: {err}"),
        }
    };
    let info = IdentityClient::new(channel)
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .expect("info");
    assert_eq!(info.into_inner().name, DRIVER);

    stop.send(()).expect("server running");
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("server stops within 10 s")
        .expect("join")
        .expect("clean shutdown");
}

#[tokio::test]
async fn serve_unix_refuses_a_regular_file_at_the_socket_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("csi.sock");
    std::fs::write(&path, b"not a socket").expect("write");
    let err = csi_proto::serve_unix(router(), &path, std::future::pending())
        .await
        .expect_err("must refuse");
    assert!(
        matches!(
            err,
            csi_proto::Error::NotASocket {
                kind: csi_proto::FileKind::RegularFile,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(std::fs::read(&path).expect("file kept"), b"not a socket");
}

#[test]
fn service_names_and_rpc_paths_are_the_specifications() {
    assert_eq!(csi::identity_server::SERVICE_NAME, "csi.v1.Identity");
    assert_eq!(csi::controller_server::SERVICE_NAME, "csi.v1.Controller");
    assert_eq!(csi::node_server::SERVICE_NAME, "csi.v1.Node");

    // Every RPC of CSI v1.12's Identity, Controller and Node services, as kubelet and the
    // sidecars call it. The generated server routes on these literal paths, so a misspelt
    // `rpc` in `proto/csi.proto` would leave one out.
    const PATHS: [&str; 26] = [
        "/csi.v1.Identity/GetPluginInfo",
        "/csi.v1.Identity/GetPluginCapabilities",
        "/csi.v1.Identity/Probe",
        "/csi.v1.Controller/CreateVolume",
        "/csi.v1.Controller/DeleteVolume",
        "/csi.v1.Controller/ControllerPublishVolume",
        "/csi.v1.Controller/ControllerUnpublishVolume",
        "/csi.v1.Controller/ValidateVolumeCapabilities",
        "/csi.v1.Controller/ListVolumes",
        "/csi.v1.Controller/GetCapacity",
        "/csi.v1.Controller/ControllerGetCapabilities",
        "/csi.v1.Controller/CreateSnapshot",
        "/csi.v1.Controller/DeleteSnapshot",
        "/csi.v1.Controller/ListSnapshots",
        "/csi.v1.Controller/GetSnapshot",
        "/csi.v1.Controller/ControllerExpandVolume",
        "/csi.v1.Controller/ControllerGetVolume",
        "/csi.v1.Controller/ControllerModifyVolume",
        "/csi.v1.Node/NodeStageVolume",
        "/csi.v1.Node/NodeUnstageVolume",
        "/csi.v1.Node/NodePublishVolume",
        "/csi.v1.Node/NodeUnpublishVolume",
        "/csi.v1.Node/NodeGetVolumeStats",
        "/csi.v1.Node/NodeExpandVolume",
        "/csi.v1.Node/NodeGetCapabilities",
        "/csi.v1.Node/NodeGetInfo",
    ];
    let generated = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src/generated/csi.v1.rs"),
    )
    .expect("generated code");
    for path in PATHS {
        assert!(
            generated.contains(&format!("\"{path}\" =>")),
            "the generated servers do not route {path}"
        );
    }
}

/// A client whose connection nobody drives any more: one call made on a runtime of its own,
/// after which that runtime is never polled again (it answers no HTTP/2 ping, sends no
/// GOAWAY acknowledgement, never closes). Returns the runtime and channel, to be dropped only
/// after the test.
fn parked_client(
    path: &Path,
) -> (
    tokio::runtime::Runtime,
    IdentityClient<tonic::transport::Channel>,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let client = runtime.block_on(async {
        let channel = csi_proto::connect_unix(path).await.expect("connect");
        let mut client = IdentityClient::new(channel);
        client
            .get_plugin_info(csi::GetPluginInfoRequest {})
            .await
            .expect("plugin info");
        client
    });
    (runtime, client)
}

#[test]
fn a_shutdown_ends_within_its_grace_even_when_a_client_never_answers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("csi.sock");
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("server runtime");
    let listener = server.block_on(async { csi_proto::bind_unix(&path).expect("bind") });
    let (stop, stopped) = oneshot::channel::<()>();
    let grace = Duration::from_millis(300);
    let task = server.spawn(csi_proto::serve_on_with_grace(
        listener,
        router(),
        async {
            let _ = stopped.await;
        },
        grace,
    ));
    let parked = parked_client(&path);

    let asked = std::time::Instant::now();
    stop.send(()).expect("server still running");
    let served = server
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), task).await })
        .expect("the shutdown ended")
        .expect("server task");
    let took = asked.elapsed();
    assert!(served.is_ok(), "{served:?}");
    assert!(
        took >= grace / 2,
        "ended before the client could have answered: {took:?}"
    );
    assert!(took < grace * 5, "took {took:?} for a grace of {grace:?}");
    drop(parked);
}

#[tokio::test]
async fn a_shutdown_with_live_clients_that_answer_is_prompt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("csi.sock");
    let server = start_at(&path);
    // A client that stays connected, on this (running) runtime: it answers the server's
    // shutdown handshake, so the graceful path ends well inside the grace.
    let channel = csi_proto::connect_unix(&path).await.expect("connect");
    let mut client = IdentityClient::new(channel);
    client.probe(csi::ProbeRequest {}).await.expect("probe");
    let asked = std::time::Instant::now();
    server.stop().await;
    assert!(
        asked.elapsed() < csi_proto::SHUTDOWN_GRACE,
        "took {:?}",
        asked.elapsed()
    );
    drop(client);
}
