//! `tak-os-node`: the replicated node's mount owner for `fuse.tak-os-replicated` volumes. It
//! serves CSI Identity and Node: NodeStageVolume makes the one FUSE mount per volume and node
//! (with its session record, and for RWO its lease), NodePublishVolume binds it into Pods.
//!
//! This library is the binary's whole service, so that tests drive it in-process; `main.rs`
//! only parses flags. The parts: the volume context contract ([`context`]) and the capability
//! rules ([`capability`]), both from the `replicated-contract` crate that volume creators share,
//! re-exported here; where credentials come from ([`credentials`]), the owner itself
//! ([`owner`]), the FUSE keeper that lets mounts outlive an owner upgrade and the owner's side
//! of it ([`keeper`]), its errors and their status codes ([`error`], [`status`]), the tonic
//! services ([`grpc`]), the kubelet-facing frontend ([`frontend`]) and the flags ([`config`]).

use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;
use mounter::Mounter;

pub mod config;
pub mod credentials;
pub mod error;
pub mod frontend;
pub mod grpc;
pub mod keeper;
pub mod owner;
pub mod status;

pub use replicated_contract::{capability, context};

use config::{Config, Credentials};
use credentials::CredentialSource;
use owner::Owner;

/// The CSI driver name this node serves by default.
pub const DRIVER_NAME: &str = "csi.replicated.tak-os.org";

/// Serves `config` until `shutdown` resolves: CSI on the endpoint, metrics and health on the
/// metrics address. With a keeper (`--keeper-socket`), stages the keeper holds handed over are
/// taken back first, and every stage is handed over when `shutdown` resolves. Stages stay
/// mounted when it returns; their connections live on with the keeper, or else as long as
/// the process.
pub async fn run(
    config: Config,
    mounter: Arc<dyn Mounter>,
    credentials: Arc<dyn CredentialSource>,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let metrics = observe::install_metrics()?;
    let owner = Arc::new(Owner::new(config.owner.clone(), mounter, credentials)?);
    let listener = bind_root_only(config.endpoint.path())?;
    let adopted = owner.adopt_handed_over().await;
    let left = owner.recover()?;
    let mut background = tokio::task::JoinSet::new();
    background.spawn(Arc::clone(&owner).keep_deposits());
    if let Some(address) = config.metrics_address {
        let http = observe::bind_http(address)
            .await
            .with_context(|| format!("cannot listen on the metrics address {address}"))?;
        tracing::info!(address = %http.local_addr()?, "serving /metrics and /healthz");
        let health = Arc::clone(&owner);
        background.spawn(observe::serve_http(http, metrics, move || {
            let ready = health.is_ready();
            async move {
                if ready {
                    Ok(())
                } else {
                    Err("the mount owner is starting".to_owned())
                }
            }
        }));
    }
    tracing::info!(
        endpoint = %config.endpoint.path().display(),
        node = %config.owner.node_id,
        stages_taken_over = adopted,
        stages_left_by_an_earlier_owner = left,
        keeper = ?config.owner.keeper_socket,
        version = env!("CARGO_PKG_VERSION"),
        "serving {}", config.driver_name
    );
    let service = grpc::NodeService::new(Arc::clone(&owner), config.driver_name.clone());
    let served = csi_proto::serve_on(listener, service.router(), shutdown).await;
    background.abort_all();
    // No Node call runs any more: hand every stage to the keeper (if there is one), so the
    // next owner process serves them on.
    let report = owner.hand_over_all().await;
    served.context("the CSI server failed")?;
    tracing::info!(
        stages = owner.stage_count(),
        handed_over = report.handed_over,
        "stopped; the stages stay mounted"
    );
    Ok(())
}

/// Binds the CSI socket with permissions only root can use (0600): whoever reaches it can
/// mount volumes on this node.
fn bind_root_only(path: &std::path::Path) -> anyhow::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt as _;
    let listener =
        csi_proto::bind_unix(path).with_context(|| format!("cannot listen on {path:?}"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot restrict {path:?} to root"))?;
    Ok(listener)
}

/// Frontend mode: serves Identity and Node on `config.endpoint` and forwards every Node call
/// to the owner at `config.mount_service`, until `shutdown` resolves. Holds no volume state.
pub async fn run_frontend(
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let Some(owner) = &config.mount_service else {
        anyhow::bail!("frontend mode needs --mount-service");
    };
    let metrics = observe::install_metrics()?;
    let frontend = frontend::Frontend::new(
        owner.path(),
        config.owner.node_id.clone(),
        config.driver_name.clone(),
        frontend::DEFAULT_CALL_TIMEOUT,
        frontend::DEFAULT_CONNECT_TIMEOUT,
    );
    let listener = bind_root_only(config.endpoint.path())?;
    let mut background = tokio::task::JoinSet::new();
    if let Some(address) = config.metrics_address {
        let http = observe::bind_http(address)
            .await
            .with_context(|| format!("cannot listen on the metrics address {address}"))?;
        background.spawn(observe::serve_http(http, metrics, || async { Ok(()) }));
    }
    tracing::info!(
        endpoint = %config.endpoint.path().display(),
        owner = %owner.path().display(),
        node = %config.owner.node_id,
        version = env!("CARGO_PKG_VERSION"),
        "serving {} as a frontend of the mount owner", config.driver_name
    );
    let served = csi_proto::serve_on(listener, frontend.router(), shutdown).await;
    background.abort_all();
    served.context("the CSI server failed")?;
    tracing::info!("stopped");
    Ok(())
}

/// What the binary does: serves `config` with the real mounter until SIGTERM or SIGINT. Each
/// stage's FUSE session reads its connection with readiness on the runtime's reactor, so the
/// number of stages needs no thread of its own.
pub fn serve(config: Config) -> anyhow::Result<()> {
    if config.keeper {
        let Some(socket) = config.owner.keeper_socket.clone() else {
            anyhow::bail!("keeper mode needs --keeper-socket");
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let options = keeper::KeeperOptions {
            resend: !config.no_resend,
        };
        return runtime.block_on(keeper::run_keeper(&socket, options, async {
            let signal = observe::shutdown_signal().await;
            tracing::info!(signal, "shutting down");
        }));
    }
    if config.mount_service.is_some() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        return runtime.block_on(run_frontend(config, async {
            let signal = observe::shutdown_signal().await;
            tracing::info!(signal, "shutting down");
        }));
    }
    raise_open_file_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let credentials: Arc<dyn CredentialSource> = match &config.credentials {
            Credentials::Directory(dir) => Arc::new(credentials::DirectorySource::new(dir)),
            Credentials::Kubernetes => {
                let client = ::kube::Client::try_default()
                    .await
                    .context("cannot configure the Kubernetes API client for credentials")?;
                Arc::new(credentials::kube::KubeSecretSource::new(
                    client,
                    &config.owner.credential_namespace,
                    credentials::kube::WatchSettings::default(),
                    &tokio::runtime::Handle::current(),
                )?)
            }
        };
        run(
            config,
            Arc::new(mounter::LinuxMounter::new()),
            credentials,
            async {
                let signal = observe::shutdown_signal().await;
                tracing::info!(signal, "shutting down");
            },
        )
        .await
    })
}

/// Raises the soft limit of open files to the hard limit: each stage holds a `/dev/fuse`
/// descriptor and its worker connections.
fn raise_open_file_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(error) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(%error, "cannot raise the open-file limit");
        }
    }
}
