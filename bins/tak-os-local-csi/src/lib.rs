//! The node-local CSI driver `csi.local.tak-os.org`.
//!
//! One process per node serves Identity, Controller and Node on one Unix socket, for this node
//! only: CreateVolume makes a directory in the node's volume store (`localstore`), and
//! NodePublishVolume bind-mounts it at kubelet's target (`mounter`). There is no central
//! controller; the external-provisioner runs beside the driver in node deployment mode, and
//! topology (`csi.local.tak-os.org/node` = a hash of the node name) keeps each volume's Pods on
//! its node.
//!
//! `main.rs` parses flags and calls [`run`]; tests build a [`Driver`] with a fake or real
//! mounter and serve it on a socket in a temporary directory.

pub mod audit;
pub mod capability;
pub mod config;
pub mod driver;
pub mod error;
pub mod grpc;
pub mod observe;
pub mod place;
pub mod status;

use std::sync::Arc;

use anyhow::Context as _;
use localstore::{Store, StoreOptions};
use mounter::Mounter;

pub use config::{Cli, Config};
pub use driver::Driver;
pub use error::Error;
pub use grpc::LocalCsi;

/// Opens the store and builds the driver: everything that can fail at startup.
pub fn open(config: &Config, mounter: Arc<dyn Mounter>) -> anyhow::Result<Arc<Driver>> {
    let options = StoreOptions::new(&config.node_id)
        .reserve_bytes(config.reserve_bytes)
        .require_mount(config.require_mounted_store);
    let store = Store::open(&config.volume_path, options)
        .with_context(|| format!("cannot open the volume store {:?}", config.volume_path))?;
    let found = store.reconciliation();
    if found.needs_attention() {
        tracing::warn!(report = ?found, "the volume store needs attention; see `tak-os-local-csi audit`");
    }
    if let Some(root) = &config.consumer_root {
        // Never created here: creating it could follow a symlink in one of its parents.
        root.check_exists().with_context(|| {
            format!(
                "the consumer mount root {:?} must be a directory without symlinks",
                root.path()
            )
        })?;
    }
    let driver = Driver::new(
        store,
        mounter,
        config.kubelet_root.clone(),
        config.consumer_root.clone(),
        config.max_volumes_per_node,
    )
    .with_context(|| {
        format!(
            "cannot identify the mount of the store {:?}",
            config.volume_path
        )
    })?;
    Ok(Arc::new(driver))
}

/// Serves the driver until `shutdown` resolves: CSI on the endpoint, metrics and health on the
/// metrics address.
pub async fn run(
    config: Config,
    mounter: Arc<dyn Mounter>,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let metrics = ::observe::install_metrics()?;
    let driver = open(&config, mounter)?;
    let listener = csi_proto::bind_unix(config.endpoint.path())
        .with_context(|| format!("cannot listen on {:?}", config.endpoint.path()))?;
    let mut background = tokio::task::JoinSet::new();
    background.spawn(observe::gauge_loop(Arc::clone(&driver)));
    if let Some(address) = config.metrics_address {
        let http = ::observe::bind_http(address)
            .await
            .with_context(|| format!("cannot listen on the metrics address {address}"))?;
        tracing::info!(address = %http.local_addr()?, "serving /metrics and /healthz");
        background.spawn(observe::serve_http(http, metrics, Arc::clone(&driver)));
    }
    tracing::info!(
        endpoint = %config.endpoint.path().display(),
        node = %config.node_id,
        store = %config.volume_path.display(),
        version = env!("CARGO_PKG_VERSION"),
        "serving {}", driver::DRIVER_NAME
    );
    let served = csi_proto::serve_on(listener, LocalCsi::new(driver).router(), shutdown).await;
    background.abort_all();
    served.context("the CSI server failed")?;
    tracing::info!("stopped");
    Ok(())
}

/// What the binary does: serves `config` with the real mounter on a multi-threaded runtime
/// until SIGTERM or SIGINT.
pub fn serve(config: Config) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(config, Arc::new(mounter::LinuxMounter::new()), async {
        let signal = ::observe::shutdown_signal().await;
        tracing::info!(signal, "shutting down");
    }))
}
