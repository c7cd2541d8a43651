//! What every binary of the workspace does the same way: JSON or text logs on stderr, the
//! Prometheus recorder, a small HTTP server for `/metrics` and `/healthz`, correlation IDs for
//! log lines, and waiting for the signal to stop.
//!
//! Text logs are coloured only when stderr is a terminal, never in a file. The health check
//! is the binary's own: a function that answers `Ok` or says what is wrong.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use metrics_exporter_prometheus::{BuildError, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::util::SubscriberInitExt as _;

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line, fields flattened.
    Json,
    /// Human-readable lines.
    Text,
}

/// Installs the global tracing subscriber (stderr; `RUST_LOG` filters, default `info`). Text
/// logs are coloured only when stderr is a terminal. A second call (tests start several
/// services in one process) changes nothing.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
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

/// Installs the Prometheus recorder once per process and returns its handle (the same handle
/// on every later call).
///
/// # Errors
/// The recorder could not be installed (another recorder is installed).
pub fn install_metrics() -> Result<PrometheusHandle, BuildError> {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
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

/// A process-unique correlation ID for one request's log lines: a random prefix drawn once
/// per process, then a counter (`5f0c1e2a9b3d4c71-2a`).
pub fn correlation_id() -> String {
    use std::hash::{BuildHasher as _, RandomState};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static SEED: OnceLock<u64> = OnceLock::new();
    let seed = *SEED.get_or_init(|| RandomState::new().hash_one(std::process::id()));
    format!("{seed:016x}-{:x}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// Resolves with the name of the first SIGTERM or SIGINT (never, if the handlers cannot be
/// installed).
pub async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

/// Binds the metrics listener.
///
/// # Errors
/// The bind's.
pub async fn bind_http(address: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(address).await
}

/// Serves `/metrics` (from `metrics`) and `/healthz` (200 `ok` when `health` answers `Ok`,
/// else 503 with its reason) on `listener` until the task is dropped.
pub async fn serve_http<H, F>(
    listener: tokio::net::TcpListener,
    metrics: PrometheusHandle,
    health: H,
) where
    H: Fn() -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), String>> + Send + 'static,
{
    let health = Arc::new(health);
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
        let health = Arc::clone(&health);
        let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
            let metrics = metrics.clone();
            let health = Arc::clone(&health);
            async move { Ok::<_, Infallible>(respond(req.uri().path(), &metrics, &*health).await) }
        });
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}

async fn respond<H, F>(path: &str, metrics: &PrometheusHandle, health: &H) -> Response<Full<Bytes>>
where
    H: Fn() -> F,
    F: Future<Output = Result<(), String>>,
{
    let (status, body) = match path {
        "/metrics" => (StatusCode::OK, metrics.render()),
        "/healthz" => match health().await {
            Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
            Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
        },
        _ => (
            StatusCode::NOT_FOUND,
            "not found; try /metrics or /healthz\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

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
        let bytes = captured
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[test]
    fn correlation_ids_differ_and_share_the_process_prefix() {
        let (a, b) = (correlation_id(), correlation_id());
        assert_ne!(a, b);
        assert_eq!(a.split('-').next(), b.split('-').next());
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

    async fn get(address: SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn healthz_answers_the_binarys_own_check() {
        let listener = bind_http("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let address = listener.local_addr().unwrap();
        let healthy = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let flag = Arc::clone(&healthy);
        let handle = install_metrics().unwrap();
        let server = tokio::spawn(serve_http(listener, handle, move || {
            let ok = flag.load(std::sync::atomic::Ordering::SeqCst);
            async move {
                if ok {
                    Ok(())
                } else {
                    Err("the store moved".to_owned())
                }
            }
        }));
        assert!(get(address, "/healthz").await.starts_with("HTTP/1.1 200"));
        healthy.store(false, std::sync::atomic::Ordering::SeqCst);
        let response = get(address, "/healthz").await;
        assert!(response.starts_with("HTTP/1.1 503"), "{response}");
        assert!(response.ends_with("the store moved\n"), "{response}");
        assert!(get(address, "/metrics").await.starts_with("HTTP/1.1 200"));
        assert!(get(address, "/other").await.starts_with("HTTP/1.1 404"));
        server.abort();
    }
}
