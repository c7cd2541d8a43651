//! The driver's gauges and its `/healthz` check, over the workspace's `observe` crate (logs,
//! the Prometheus recorder and the HTTP server).

use std::sync::Arc;
use std::time::Duration;

use localstore::VolumeState;

use crate::driver::Driver;

/// How often the store gauges are refreshed.
const GAUGE_INTERVAL: Duration = Duration::from_secs(30);

/// Refreshes the store gauges: volumes by state, consumer claims, free bytes and inodes.
pub fn refresh_gauges(driver: &Driver) {
    let store = driver.store();
    if let Ok(records) = store.list() {
        for state in [
            VolumeState::Creating,
            VolumeState::Ready,
            VolumeState::Deleting,
        ] {
            let count = records.iter().filter(|r| r.state == state).count();
            metrics::gauge!("tak_os_local_csi_volumes", "state" => state.to_string())
                .set(count as f64);
        }
    }
    if let Ok(claims) = store.claims() {
        metrics::gauge!("tak_os_local_csi_consumer_claims").set(claims.len() as f64);
    }
    if let Ok(capacity) = store.capacity() {
        metrics::gauge!("tak_os_local_csi_store_free_bytes").set(capacity.free_bytes as f64);
        metrics::gauge!("tak_os_local_csi_store_free_inodes").set(capacity.free_inodes as f64);
    }
}

/// Refreshes the gauges now and every 30 s until the task is dropped.
pub async fn gauge_loop(driver: Arc<Driver>) {
    let mut tick = tokio::time::interval(GAUGE_INTERVAL);
    loop {
        tick.tick().await;
        let driver = Arc::clone(&driver);
        let _ = tokio::task::spawn_blocking(move || refresh_gauges(&driver)).await;
    }
}

/// Serves `/metrics` and `/healthz` on `listener` until the task is dropped; `/healthz` is
/// the driver's probe.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    driver: Arc<Driver>,
) {
    ::observe::serve_http(listener, metrics, move || {
        let driver = Arc::clone(&driver);
        async move {
            match tokio::task::spawn_blocking(move || driver.probe()).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(error)) => Err(crate::status::chain(&error)),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await;
}

/// Log output written to memory, for the tests of what the driver logs.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl Captured {
    /// Everything written so far.
    pub(crate) fn bytes(&self) -> Vec<u8> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
