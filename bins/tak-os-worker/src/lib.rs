//! The `tak-os-worker` binary's service: [`run`] serves a [`worker::Server`] until shutdown
//! and keeps its accepted tokens in step with the token file; with `--csi-endpoint` a leader
//! also serves the reference CSI controller ([`controller`]). `main.rs` only parses flags and
//! sets up logging.

pub mod config;
pub mod controller;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use worker::{Server, SystemClock, Tokens};

use crate::controller::ControllerService;

pub use config::{Cli, LogFormat, Settings};

/// How often the token file is checked for changes.
const TOKEN_POLL: Duration = Duration::from_secs(1);

/// Reads the token file: one token per line, blank lines and `#` comments ignored.
pub fn read_tokens(path: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the token file {path:?}"))?;
    let tokens: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    if tokens.is_empty() {
        anyhow::bail!("the token file {path:?} holds no token");
    }
    Ok(tokens)
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

async fn watch_tokens(path: PathBuf, tokens: Tokens) {
    let mut seen = modified(&path);
    loop {
        tokio::time::sleep(TOKEN_POLL).await;
        let now = modified(&path);
        if now == seen {
            continue;
        }
        seen = now;
        match read_tokens(&path) {
            Ok(list) => {
                tokens.replace(&list);
                tracing::info!(count = list.len(), "reloaded the accepted tokens");
            }
            Err(error) => {
                tracing::warn!(error = format!("{error:#}"), "kept the previous tokens");
            }
        }
    }
}

/// What the binary does: serves `settings` on a runtime of its own until SIGTERM or SIGINT.
pub fn serve(settings: Settings) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(settings, async {
        let signal = observe::shutdown_signal().await;
        tracing::info!(signal, "shutting down");
    }))
}

/// Serves until `shutdown` resolves.
pub async fn run(
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let tokens = Tokens::new(read_tokens(&settings.token_file)?);
    let state_dir = settings.worker.state_dir.clone();
    let server = Server::start(settings.worker, tokens.clone(), Arc::new(SystemClock))
        .await
        .context("cannot start the worker")?;
    tracing::info!(
        endpoint = %server.endpoint(),
        version = env!("CARGO_PKG_VERSION"),
        "serving"
    );
    let (stop_controller, controller_stopped) = tokio::sync::watch::channel(false);
    let controller = match settings.controller {
        None => None,
        Some(controller) => {
            let endpoint = controller.endpoint.clone();
            let service = ControllerService::new(
                server.admin(),
                controller,
                &state_dir,
                settings.token_file.clone(),
            )?;
            let listener = csi_proto::bind_unix(endpoint.path())
                .context("cannot serve the reference controller")?;
            tracing::info!(%endpoint, "serving the reference CSI controller");
            let mut stopped = controller_stopped;
            Some(tokio::spawn(csi_proto::serve_on(
                listener,
                service.router(),
                async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                },
            )))
        }
    };
    let watcher = tokio::spawn(watch_tokens(settings.token_file, tokens));
    shutdown.await;
    watcher.abort();
    let _ = stop_controller.send(true);
    if let Some(controller) = controller {
        match controller.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(error = error_text::chain(&error), "the controller failed")
            }
            Err(_) => tracing::warn!("the controller's task failed"),
        }
    }
    server.stop().await;
    tracing::info!("stopped");
    Ok(())
}
