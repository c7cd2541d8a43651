//! The keeper process (`tak-os-node --keeper`): it holds copies of the owners' FUSE
//! descriptors and nothing else. It never opens `/dev/fuse`, never mounts, never reads a
//! connection and serves no HTTP: one socket, root peers only.

use std::collections::HashMap;
use std::future::Future;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use fdpass::{AsyncChannel, AsyncListener, Listener};

use super::protocol::{self, Answer, Change, Deposit, Request, ResendWindow, StageState};
use super::tables::Tables;

/// One stage the keeper holds.
#[derive(Debug)]
struct Held {
    deposit: Deposit,
    /// The `/dev/fuse` copy.
    fuse: OwnedFd,
    /// Its tables, when the deposit came with them.
    tables: Option<Tables>,
    /// The connection of the owner that serves it; `None` once handed over, or once that
    /// owner died.
    owner: Option<u64>,
    /// When the owner died without handing the stage over and a successor may take it over:
    /// the deadline D after which the keeper ends the connection.
    orphaned_until: Option<Instant>,
    /// The resend rules the owner applies (from its deposit, bounded by its journals'
    /// [`Change::FirstRead`]), which a successor applies after it dies.
    rules: Vec<fusefs::ResendRule>,

    /// Which deposit this is (deposits replace each other at one staging path).
    serial: u64,
}

/// How the keeper treats a stage whose owner dies without handing it over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeeperOptions {
    /// Keep it for a successor until deadline D when the kernel can resend the requests the
    /// dead owner had read (`FUSE_NOTIFY_RESEND`); `false` ends it at once, as on kernels
    /// without resend (`--no-resend`).
    pub resend: bool,
}

impl Default for KeeperOptions {
    fn default() -> Self {
        KeeperOptions { resend: true }
    }
}

/// Everything the keeper holds, by staging path.
#[derive(Debug, Default)]
struct Keeper {
    held: Mutex<HashMap<PathBuf, Held>>,
    options: KeeperOptions,
    serials: std::sync::atomic::AtomicU64,
}

/// Serves the keeper on `socket` until `shutdown` resolves. A stale socket file left at the
/// path by an earlier keeper is replaced; the socket is root-only (0600), and connections from
/// peers other than root are refused.
///
/// When it returns, every copy it held closes with the process: a stage an owner still serves
/// goes on, and a handed-over stage whose owner has not taken it back ends.
pub async fn run_keeper(
    socket: &Path,
    options: KeeperOptions,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    csi_proto::remove_stale_socket(socket)
        .with_context(|| format!("cannot replace the socket file at {socket:?}"))?;
    let listener = Listener::bind(socket)
        .and_then(AsyncListener::new)
        .with_context(|| format!("cannot listen on {socket:?}"))?;
    tracing::info!(socket = %socket.display(), resend = options.resend, version = env!("CARGO_PKG_VERSION"), "keeping FUSE connections");
    let keeper = Arc::new(Keeper {
        options,
        ..Keeper::default()
    });
    let mut connections = tokio::task::JoinSet::new();
    let mut next = 0u64;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(channel) => {
                    next += 1;
                    connections.spawn(Arc::clone(&keeper).serve(channel, next));
                }
                Err(error) => {
                    tracing::warn!(error = %error_text::chain(&error), "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next() => {}
        }
    }
    connections.abort_all();
    let held = keeper.lock().len();
    tracing::info!(
        stages = held,
        "stopped; the copies close with this process (stages an owner serves go on)"
    );
    Ok(())
}

fn refused(reason: impl std::fmt::Display) -> Answer {
    Answer::Refused {
        reason: reason.to_string(),
    }
}

impl Keeper {
    fn lock(&self) -> MutexGuard<'_, HashMap<PathBuf, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One owner's connection, until it closes.
    async fn serve(self: Arc<Self>, channel: AsyncChannel, connection: u64) {
        match channel.peer_credentials() {
            Ok(peer) if peer.uid == 0 => {
                tracing::info!(connection, pid = ?peer.pid, "an owner connected");
            }
            Ok(peer) => {
                tracing::warn!(connection, uid = peer.uid, pid = ?peer.pid, "refused a connection from a peer that is not root");
                return;
            }
            Err(error) => {
                tracing::warn!(connection, error = %error_text::chain(&error), "refused a connection whose peer is unknown");
                return;
            }
        }
        loop {
            let answer = match channel.recv().await {
                Ok(Some(message)) => self.answer(&channel, connection, message).await,
                Ok(None) => break,
                Err(error) if error.is_bad_frame() => {
                    tracing::warn!(connection, error = %error_text::chain(&error), "refused a malformed frame");
                    refused(error_text::chain(&error))
                }
                Err(error) => {
                    tracing::warn!(connection, error = %error_text::chain(&error), "the connection failed");
                    break;
                }
            };
            if let Err(error) = channel.send(&protocol::encode(&answer), &[]).await {
                tracing::warn!(connection, error = %error_text::chain(&error), "answering failed");
                break;
            }
        }
        self.clone().disconnected(connection);
    }

    async fn answer(
        &self,
        channel: &AsyncChannel,
        connection: u64,
        message: fdpass::Message,
    ) -> Answer {
        let request = match protocol::decode::<Request>(&message.payload) {
            Ok(request) => request,
            Err(error) => {
                tracing::warn!(connection, error = %error_text::chain(&error), "refused a message");
                return refused(error_text::chain(&error));
            }
        };
        match request {
            Request::Deposit { stage } => self.deposit(connection, stage, message.fds),
            Request::Journal { staging, changes } => self.journal(connection, &staging, &changes),
            Request::Withdraw { staging } => {
                if let Some(held) = self.lock().remove(&staging) {
                    tracing::info!(connection, volume = %held.deposit.volume_id, staging = %staging.display(), "let go of an unstaged stage");
                }
                Answer::Ok
            }
            Request::Fetch => self.fetch(channel, connection).await,
            Request::Ping => Answer::Ok,
        }
    }

    fn deposit(&self, connection: u64, stage: Deposit, fds: Vec<OwnedFd>) -> Answer {
        let checked = stage.check(&fds).and_then(|_| {
            let mut fds = fds.into_iter();
            let fuse = fds.next();
            let tables = fds
                .next()
                .map(|memfd| StageState::from_memfd(&memfd).map(Tables::new))
                .transpose()?;
            Ok((fuse, tables))
        });
        let (fuse, tables) = match checked {
            Ok((Some(fuse), tables)) => (fuse, tables),
            Ok((None, _)) => return refused("a deposit without its descriptor"),
            Err(error) => {
                tracing::warn!(connection, volume = %stage.volume_id, staging = %stage.staging.display(), error = %error_text::chain(&error), "refused a deposit");
                return refused(error_text::chain(&error));
            }
        };
        let owner = (!stage.handed_over).then_some(connection);
        let now = Instant::now();
        // Owners send at most the cap, oldest first; past it the newest (the open rule among
        // them) are the ones kept.
        let skip = stage
            .resend_rules
            .len()
            .saturating_sub(fusefs::MAX_RESEND_RULES);
        let rules = stage.resend_rules[skip..]
            .iter()
            .map(|window| window.rule(now))
            .collect();
        tracing::info!(
            connection,
            volume = %stage.volume_id,
            staging = %stage.staging.display(),
            device = %format_args!("{}:{}", stage.device.0, stage.device.1),
            handed_over = stage.handed_over,
            "keeping a stage's connection"
        );
        let staging = stage.staging.clone();
        let held = Held {
            deposit: stage,
            fuse,
            tables,
            owner,
            orphaned_until: None,
            rules,
            serial: self
                .serials
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        };
        if let Some(earlier) = self.lock().insert(staging, held)
            && earlier.owner.is_some_and(|o| o != connection)
        {
            tracing::info!(
                connection,
                earlier = earlier.owner,
                volume = %earlier.deposit.volume_id,
                "a deposit replaced another owner's"
            );
        }
        Answer::Ok
    }

    /// Applies changes the serving owner wrote ahead to a stage's tables.
    fn journal(&self, connection: u64, staging: &Path, changes: &[Change]) -> Answer {
        let mut held = self.lock();
        let Some(stage) = held.get_mut(staging) else {
            return refused(format_args!("no deposit at {}", staging.display()));
        };
        if stage.owner != Some(connection) {
            return refused(format_args!(
                "the stage at {} is not served on this connection",
                staging.display()
            ));
        }
        let Some(tables) = stage.tables.as_mut() else {
            return refused(format_args!(
                "the stage at {} was deposited without its tables",
                staging.display()
            ));
        };
        match tables.apply(changes) {
            Ok(()) => {
                for change in changes {
                    if let Change::FirstRead { unique } = *change
                        && let Some(open) = stage.rules.iter_mut().find(|r| r.below == u64::MAX)
                    {
                        open.below = unique;
                    }
                }
                Answer::Ok
            }
            Err(error) => {
                // The tables no longer hold what the kernel does: no successor may take them
                // over after a crash, and the stage ends with its owner instead.
                stage.tables = None;
                tracing::warn!(connection, volume = %stage.deposit.volume_id, error = %error, "refused a journal: the stage's tables are dropped, and it ends if its owner dies");
                refused(error)
            }
        }
    }

    /// Sends a copy of every deposit, with its current tables, then `Done`.
    async fn fetch(&self, channel: &AsyncChannel, connection: u64) -> Answer {
        let copies: Vec<(Deposit, Vec<OwnedFd>)> = self
            .lock()
            .values()
            .filter_map(|held| {
                let copied = held.fuse.try_clone().and_then(|fuse| {
                    let mut fds = vec![fuse];
                    if let Some(tables) = &held.tables {
                        fds.push(tables.state().to_memfd()?);
                    }
                    Ok(fds)
                });
                match copied {
                    Ok(fds) => {
                        let mut deposit = held.deposit.clone();
                        deposit.tables = held.tables.is_some();
                        let now = Instant::now();
                        deposit.resend_window_ms = held.orphaned_until.map(|until| {
                            let left = until.saturating_duration_since(now);
                            u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
                        });
                        deposit.resend_rules = match held.orphaned_until {
                            Some(_) => held
                                .rules
                                .iter()
                                .map(|&rule| ResendWindow::of(rule, now))
                                .collect(),
                            None => Vec::new(),
                        };
                        Some((deposit, fds))
                    }
                    Err(error) => {
                        tracing::warn!(volume = %held.deposit.volume_id, %error, "cannot copy a stage's descriptors");
                        None
                    }
                }
            })
            .collect();
        let count = copies.len();
        for (stage, fds) in copies {
            let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
            let message = protocol::encode(&Answer::Stage { stage });
            if let Err(error) = channel.send(&message, &borrowed).await {
                return refused(error_text::chain(&error));
            }
        }
        tracing::info!(connection, stages = count, "sent every stage");
        Answer::Done { count }
    }

    /// An owner's connection closed: the stages it served and did not hand over have
    /// requests nobody will answer. When a successor can take one over (the kernel resends
    /// the dead owner's requests, and the workers' retention leaves time: see
    /// [`Deposit::crash_window`]), the keeper keeps it until deadline D and ends it then if
    /// nobody took it; otherwise it drops the copies at once, which ends the connection (if no
    /// other copy is open), so callers get `ENOTCONN` instead of waiting forever.
    fn disconnected(self: Arc<Self>, connection: u64) {
        let mut held = self.lock();
        let orphans: Vec<PathBuf> = held
            .iter()
            .filter(|(_, h)| h.owner == Some(connection))
            .map(|(staging, _)| staging.clone())
            .collect();
        let mut kept = 0;
        for staging in &orphans {
            let Some(stage) = held.get_mut(staging) else {
                continue;
            };
            let now = Instant::now();
            let deadline = protocol::hex_decode(&stage.deposit.record)
                .and_then(|bytes| fuse_wire::InitRecord::decode(&bytes).ok())
                .and_then(|record| stage.deposit.crash_window(&record))
                .filter(|_| self.options.resend && stage.tables.is_some())
                .and_then(|window| Some((window, now.checked_add(window)?)));
            match deadline {
                Some((window, deadline)) => {
                    kept += 1;
                    stage.owner = None;
                    stage.orphaned_until = Some(deadline);
                    tracing::warn!(
                        connection,
                        volume = %stage.deposit.volume_id,
                        staging = %staging.display(),
                        seconds = window.as_secs_f64(),
                        "the owner went without handing this stage over: keeping it for a successor"
                    );
                    let keeper = Arc::clone(&self);
                    let (staging, serial) = (staging.clone(), stage.serial);
                    tokio::spawn(async move {
                        tokio::time::sleep(window).await;
                        keeper.expire(&staging, serial);
                    });
                }
                None => {
                    if let Some(gone) = held.remove(staging) {
                        tracing::warn!(
                            connection,
                            volume = %gone.deposit.volume_id,
                            staging = %staging.display(),
                            "the owner went without handing this stage over: its connection ends until NodeUnpublishVolume and NodeUnstageVolume clean it up"
                        );
                    }
                }
            }
        }
        tracing::info!(
            connection,
            ended = orphans.len() - kept,
            kept,
            "an owner disconnected"
        );
    }

    /// Deadline D of a stage kept after its owner died: unless a successor took it over
    /// (deposited it again), its connection ends now.
    fn expire(&self, staging: &Path, serial: u64) {
        let mut held = self.lock();
        if held
            .get(staging)
            .is_some_and(|h| h.serial == serial && h.orphaned_until.is_some())
            && let Some(gone) = held.remove(staging)
        {
            tracing::warn!(
                volume = %gone.deposit.volume_id,
                staging = %staging.display(),
                "no successor took over the stage of an owner that died: its connection ends until NodeUnpublishVolume and NodeUnstageVolume clean it up"
            );
        }
    }
}
