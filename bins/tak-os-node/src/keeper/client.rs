//! The owner's side of the keeper: one connection, reopened when it breaks, and one request at
//! a time on it.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use fdpass::{AsyncChannel, Channel};

use super::protocol::{self, Answer, Change, Deposit, ProtocolError, Request};

/// Why a keeper request failed.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    /// The keeper's socket could not be reached.
    #[error("cannot reach the keeper at {path:?}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: fdpass::Error,
    },
    /// The connection failed while a request was on it.
    #[error("the keeper connection failed")]
    Io(#[source] fdpass::Error),
    /// The keeper closed the connection.
    #[error("the keeper closed the connection")]
    Closed,
    /// The keeper refused the request; nothing changed there.
    #[error("the keeper refused: {reason}")]
    Refused {
        /// Its reason.
        reason: String,
    },
    /// The keeper's answer did not make sense.
    #[error("the keeper's answer is unusable")]
    Protocol(#[from] ProtocolError),
    /// An answer of another kind than the request calls for.
    #[error("the keeper answered {found:?} to {request}")]
    Unexpected {
        /// The request.
        request: &'static str,
        /// The answer.
        found: Box<Answer>,
    },
}

/// One deposit as the keeper sent it back, with copies of its descriptors.
#[derive(Debug)]
pub struct Fetched {
    /// The stage.
    pub deposit: Deposit,
    /// The `/dev/fuse` copy, and its tables' memfd when the keeper holds them.
    pub fds: Vec<OwnedFd>,
}

/// The owner's connection to the keeper.
#[derive(Debug)]
pub struct KeeperLink {
    path: PathBuf,
    channel: tokio::sync::Mutex<Option<AsyncChannel>>,
    /// Connections made so far: a new one means a keeper that may hold nothing of ours.
    connects: AtomicU64,
}

impl KeeperLink {
    /// A link to the keeper at `path`; it connects on the first request.
    pub fn new(path: impl Into<PathBuf>) -> KeeperLink {
        KeeperLink {
            path: path.into(),
            channel: tokio::sync::Mutex::new(None),
            connects: AtomicU64::new(0),
        }
    }

    /// The keeper's socket.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many connections have been made: when it grows, the keeper may have restarted and
    /// lost every deposit.
    pub fn connects(&self) -> u64 {
        self.connects.load(Ordering::SeqCst)
    }

    /// Keeps a copy of a stage's connection: `fuse` is its `/dev/fuse` descriptor; `state`, a
    /// sealed memfd with its tables (always when handing the stage over; when serving it, a
    /// snapshot the journals then keep current, `Deposit::tables`).
    pub async fn deposit(
        &self,
        stage: &Deposit,
        fuse: BorrowedFd<'_>,
        state: Option<BorrowedFd<'_>>,
    ) -> Result<(), KeeperError> {
        let mut fds = vec![fuse];
        fds.extend(state);
        let request = Request::Deposit {
            stage: stage.clone(),
        };
        self.expect_ok("deposit", &request, &fds).await
    }

    /// Applies `changes` to the keeper's tables of the stage at `staging`, which this
    /// connection deposited; returns once the keeper has.
    pub async fn journal(&self, staging: &Path, changes: Vec<Change>) -> Result<(), KeeperError> {
        let request = Request::Journal {
            staging: staging.to_owned(),
            changes,
        };
        self.expect_ok("journal", &request, &[]).await
    }

    /// Lets the keeper drop its copies of the stage at `staging`.
    pub async fn withdraw(&self, staging: &Path) -> Result<(), KeeperError> {
        let request = Request::Withdraw {
            staging: staging.to_owned(),
        };
        self.expect_ok("withdraw", &request, &[]).await
    }

    /// Whether the keeper answers.
    pub async fn ping(&self) -> Result<(), KeeperError> {
        self.expect_ok("ping", &Request::Ping, &[]).await
    }

    /// Copies of every deposit the keeper holds.
    pub async fn fetch(&self) -> Result<Vec<Fetched>, KeeperError> {
        let mut channel = self.channel.lock().await;
        let mut answer = self.exchange(&mut channel, &Request::Fetch, &[]).await;
        let mut fetched = Vec::new();
        loop {
            match answer? {
                (Answer::Stage { stage }, fds) => fetched.push(Fetched {
                    deposit: stage,
                    fds,
                }),
                (Answer::Done { count }, _) if count == fetched.len() => return Ok(fetched),
                (other, _) => return Err(unexpected("fetch", other)),
            }
            answer = receive(&mut channel).await;
        }
    }

    async fn expect_ok(
        &self,
        name: &'static str,
        request: &Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), KeeperError> {
        let mut channel = self.channel.lock().await;
        match self.exchange(&mut channel, request, fds).await? {
            (Answer::Ok, _) => Ok(()),
            (other, _) => Err(unexpected(name, other)),
        }
    }

    /// Sends `request` and reads the first answer, connecting first when there is no
    /// connection. A failed connection is dropped, so the next request makes a new one.
    async fn exchange(
        &self,
        channel: &mut Option<AsyncChannel>,
        request: &Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(Answer, Vec<OwnedFd>), KeeperError> {
        if channel.is_none() {
            let connected = Channel::connect(&self.path)
                .and_then(AsyncChannel::new)
                .map_err(|source| KeeperError::Connect {
                    path: self.path.clone(),
                    source,
                })?;
            self.connects.fetch_add(1, Ordering::SeqCst);
            *channel = Some(connected);
        }
        let Some(open) = channel.as_ref() else {
            return Err(KeeperError::Closed);
        };
        if let Err(error) = open.send(&protocol::encode(request), fds).await {
            *channel = None;
            return Err(KeeperError::Io(error));
        }
        receive(channel).await
    }
}

/// Reads one answer; a refusal is an error. A failed or closed connection is dropped.
async fn receive(
    channel: &mut Option<AsyncChannel>,
) -> Result<(Answer, Vec<OwnedFd>), KeeperError> {
    let Some(open) = channel.as_ref() else {
        return Err(KeeperError::Closed);
    };
    let message = match open.recv().await {
        Ok(Some(message)) => message,
        Ok(None) => {
            *channel = None;
            return Err(KeeperError::Closed);
        }
        Err(error) => {
            *channel = None;
            return Err(KeeperError::Io(error));
        }
    };
    match protocol::decode::<Answer>(&message.payload)? {
        Answer::Refused { reason } => Err(KeeperError::Refused { reason }),
        answer => Ok((answer, message.fds)),
    }
}

fn unexpected(request: &'static str, found: Answer) -> KeeperError {
    KeeperError::Unexpected {
        request,
        found: Box::new(found),
    }
}
