//! Frontend mode (`--mount-service`): this process faces kubelet and forwards every Node call,
//! unchanged, to the mount owner over its Unix socket. It holds no volume state and never reads
//! credentials, so it can be restarted at any time without touching a mount.
//!
//! Before it forwards anything it asks the owner for its node ID (NodeGetInfo) and refuses to
//! serve while the owner reports another one: a miswired socket must never mount one node's
//! volumes on behalf of another. Every forwarded call is bounded: while the owner is
//! unreachable, calls fail UNAVAILABLE promptly, so kubelet retries. Request bodies are never
//! logged (a misconfigured StorageClass may send secrets).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::identity_server::Identity;
use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::node_server::Node;
use csi_proto::v1::*;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

/// How long a forwarded call may take before it fails UNAVAILABLE: longer than any Node call
/// of the owner (a stage is a few worker calls of at most 15 s each, and a mount).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// How long connecting to the owner and asking its node ID may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The Identity and Node services of a frontend.
#[derive(Clone, Debug)]
pub struct Frontend {
    inner: std::sync::Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    owner_socket: PathBuf,
    channel: Channel,
    node_id: String,
    driver_name: String,
    call_timeout: Duration,
    connect_timeout: Duration,
    /// The owner answered with this node's ID since the last failure to reach it.
    verified: AtomicBool,
}

impl Frontend {
    /// A frontend for node `node_id` forwarding to the owner at `owner_socket` (connected on
    /// first use, and again after every failure).
    pub fn new(
        owner_socket: &Path,
        node_id: impl Into<String>,
        driver_name: impl Into<String>,
        call_timeout: Duration,
        connect_timeout: Duration,
    ) -> Self {
        Frontend {
            inner: std::sync::Arc::new(Inner {
                owner_socket: owner_socket.to_owned(),
                channel: csi_proto::connect_unix_lazy(owner_socket, connect_timeout),
                node_id: node_id.into(),
                driver_name: driver_name.into(),
                call_timeout,
                connect_timeout,
                verified: AtomicBool::new(false),
            }),
        }
    }

    /// A tonic router serving Identity and Node.
    pub fn router(self) -> tonic::transport::server::Router {
        tonic::transport::Server::builder()
            .add_service(identity_server::IdentityServer::new(self.clone()))
            .add_service(node_server::NodeServer::new(self))
    }

    fn unreachable(&self, why: impl std::fmt::Display) -> Status {
        Status::unavailable(format!(
            "the mount owner at {:?} does not answer: {why}",
            self.inner.owner_socket
        ))
    }

    /// Checks, once per connection, that the owner serves this node.
    async fn verify(&self) -> Result<(), Status> {
        if self.inner.verified.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut client = NodeClient::new(self.inner.channel.clone());
        let info = tokio::time::timeout(
            self.inner.connect_timeout,
            client.node_get_info(NodeGetInfoRequest {}),
        )
        .await
        .map_err(|_| {
            self.unreachable(format!("no answer within {:?}", self.inner.connect_timeout))
        })?
        .map_err(|status| self.unreachable(status.message()))?
        .into_inner();
        if info.node_id != self.inner.node_id {
            tracing::error!(
                owner_socket = %self.inner.owner_socket.display(),
                owner_node = %info.node_id,
                node = %self.inner.node_id,
                "the mount owner serves another node: refusing to forward any call (is the socket miswired?)"
            );
            return Err(Status::unavailable(format!(
                "the mount owner at {:?} serves node {:?}, not {:?}: refusing to forward",
                self.inner.owner_socket, info.node_id, self.inner.node_id
            )));
        }
        self.inner.verified.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Forwards one Node call: verifies the owner, sends the request unchanged within the
    /// bound, logs one line and counts it.
    async fn forward<Req, Resp, F, Fut>(
        &self,
        operation: &'static str,
        volume: &str,
        request: Request<Req>,
        call: F,
    ) -> Result<Response<Resp>, Status>
    where
        F: FnOnce(NodeClient<Channel>, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let start = Instant::now();
        let result = async {
            self.verify().await?;
            let client = NodeClient::new(self.inner.channel.clone());
            let request = Request::new(request.into_inner());
            match tokio::time::timeout(self.inner.call_timeout, call(client, request)).await {
                Ok(result) => result,
                Err(_) => {
                    Err(self.unreachable(format!("no answer within {:?}", self.inner.call_timeout)))
                }
            }
        }
        .await;
        if matches!(&result, Err(status) if status.code() == Code::Unavailable) {
            // Whoever answers next is asked for its node ID again.
            self.inner.verified.store(false, Ordering::SeqCst);
        }
        self.observe(operation, volume, start, &result);
        result
    }

    fn observe<T>(
        &self,
        operation: &'static str,
        volume: &str,
        start: Instant,
        result: &Result<T, Status>,
    ) {
        let elapsed = start.elapsed();
        let code = result.as_ref().map_or_else(Status::code, |_| Code::Ok);
        let outcome = csi_proto::code_name(code);
        let labels = [("operation", operation), ("outcome", outcome)];
        metrics::counter!("tak_os_node_frontend_calls_total", &labels).increment(1);
        metrics::histogram!("tak_os_node_frontend_call_duration_seconds", &labels)
            .record(elapsed.as_secs_f64());
        let duration_ms = elapsed.as_secs_f64() * 1e3;
        let node = self.inner.node_id.as_str();
        let volume = (!volume.is_empty()).then_some(volume);
        let request_id = observe::correlation_id();
        match result {
            Ok(_) => tracing::info!(
                operation,
                volume,
                node,
                outcome,
                duration_ms,
                request_id,
                "forwarded"
            ),
            Err(status) => tracing::warn!(
                operation,
                volume,
                node,
                outcome,
                duration_ms,
                request_id,
                error = status.message(),
                "forwarded"
            ),
        }
    }
}

#[tonic::async_trait]
impl Identity for Frontend {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.inner.driver_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: Vec::new(),
        }))
    }

    /// Ready only when the owner answers, serves this node, and is ready itself.
    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        let start = Instant::now();
        let result = async {
            self.verify().await?;
            let mut client = IdentityClient::new(self.inner.channel.clone());
            tokio::time::timeout(self.inner.connect_timeout, client.probe(ProbeRequest {}))
                .await
                .map_err(|_| self.unreachable("no answer to Probe"))?
        }
        .await;
        if result.is_err() {
            self.inner.verified.store(false, Ordering::SeqCst);
        }
        self.observe("Probe", "", start, &result);
        result
    }
}

#[tonic::async_trait]
impl Node for Frontend {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let volume = request.get_ref().volume_id.clone();
        self.forward("NodeStageVolume", &volume, request, |mut c, r| async move {
            c.node_stage_volume(r).await
        })
        .await
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let volume = request.get_ref().volume_id.clone();
        self.forward(
            "NodeUnstageVolume",
            &volume,
            request,
            |mut c, r| async move { c.node_unstage_volume(r).await },
        )
        .await
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let volume = request.get_ref().volume_id.clone();
        self.forward(
            "NodePublishVolume",
            &volume,
            request,
            |mut c, r| async move { c.node_publish_volume(r).await },
        )
        .await
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let volume = request.get_ref().volume_id.clone();
        self.forward(
            "NodeUnpublishVolume",
            &volume,
            request,
            |mut c, r| async move { c.node_unpublish_volume(r).await },
        )
        .await
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let volume = request.get_ref().volume_id.clone();
        self.forward(
            "NodeGetVolumeStats",
            &volume,
            request,
            |mut c, r| async move { c.node_get_volume_stats(r).await },
        )
        .await
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let volume = request.get_ref().volume_id.clone();
        self.forward(
            "NodeExpandVolume",
            &volume,
            request,
            |mut c, r| async move { c.node_expand_volume(r).await },
        )
        .await
    }

    async fn node_get_capabilities(
        &self,
        request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        self.forward("NodeGetCapabilities", "", request, |mut c, r| async move {
            c.node_get_capabilities(r).await
        })
        .await
    }

    async fn node_get_info(
        &self,
        request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        self.forward("NodeGetInfo", "", request, |mut c, r| async move {
            c.node_get_info(r).await
        })
        .await
    }
}
