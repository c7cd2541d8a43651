//! Logs, metrics and the small HTTP server for `/metrics` and `/healthz`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use localstore::VolumeState;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use tracing_subscriber::util::SubscriberInitExt as _;

use crate::config::LogFormat;
use crate::driver::Driver;

/// How often the store gauges are refreshed.
const GAUGE_INTERVAL: Duration = Duration::from_secs(30);

/// Installs the global tracing subscriber (stderr; `RUST_LOG` filters, default `info`). Text
/// logs are coloured only when stderr is a terminal.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // A second installation (tests start several drivers in one process) is harmless.
    let _ = subscriber(format, filter, ansi, std::io::stderr).try_init();
}

/// The subscriber [`init_logging`] installs, writing to `writer`; `ansi` colours text logs
/// (JSON is never coloured).
pub fn subscriber<W>(
    format: LogFormat,
    filter: tracing_subscriber::EnvFilter,
    ansi: bool,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Json => Box::new(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_ansi(false)
                .finish(),
        ),
        LogFormat::Text => Box::new(builder.with_ansi(ansi).finish()),
    }
}

/// Installs the Prometheus recorder once per process and returns its handle.
pub fn install_metrics() -> anyhow::Result<PrometheusHandle> {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    if let Some(handle) = HANDLE.get() {
        return Ok(handle.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets(&[
            0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
        ])?
        .install_recorder()?;
    Ok(HANDLE.get_or_init(|| handle).clone())
}

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

/// Serves `/metrics` and `/healthz` on `listener` until the task is dropped.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    metrics: PrometheusHandle,
    driver: Arc<Driver>,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of descriptors, say: wait instead of spinning on the same error.
                tracing::warn!(%error, "the metrics server cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        let driver = Arc::clone(&driver);
        let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
            let metrics = metrics.clone();
            let driver = Arc::clone(&driver);
            async move { Ok::<_, Infallible>(respond(req.uri().path(), &metrics, &driver).await) }
        });
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}

async fn respond(
    path: &str,
    metrics: &PrometheusHandle,
    driver: &Arc<Driver>,
) -> Response<Full<Bytes>> {
    let (status, body) = match path {
        "/metrics" => (StatusCode::OK, metrics.render()),
        "/healthz" => {
            let driver = Arc::clone(driver);
            match tokio::task::spawn_blocking(move || driver.probe()).await {
                Ok(Ok(_)) => (StatusCode::OK, "ok\n".to_owned()),
                Ok(Err(error)) => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("{}\n", crate::status::chain(&error)),
                ),
                Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
            }
        }
        _ => (
            StatusCode::NOT_FOUND,
            "not found; try /metrics or /healthz\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

/// Binds the metrics listener.
pub async fn bind_http(address: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    Ok(tokio::net::TcpListener::bind(address).await?)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn logged(format: LogFormat, ansi: bool) -> String {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = subscriber(
            format,
            tracing_subscriber::EnvFilter::new("info"),
            ansi,
            move || writer.clone(),
        );
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(operation = "Probe", outcome = "unavailable", "a line");
        });
        String::from_utf8_lossy(&captured.bytes()).into_owned()
    }

    #[test]
    fn text_logs_are_coloured_only_when_asked_to() {
        let plain = logged(LogFormat::Text, false);
        assert!(plain.contains("operation=\"Probe\""), "{plain}");
        assert!(!plain.contains('\u{1b}'), "{plain:?}");
        let coloured = logged(LogFormat::Text, true);
        assert!(coloured.contains('\u{1b}'), "{coloured:?}");
    }

    #[test]
    fn json_logs_are_one_plain_object_per_line() {
        let json = logged(LogFormat::Json, true);
        assert!(!json.contains('\u{1b}'), "{json:?}");
        let line: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
        assert_eq!(line["operation"], "Probe");
        assert_eq!(line["outcome"], "unavailable");
        assert_eq!(line["level"], "WARN");
    }
}
