//! The write-ahead of one stage's tables to the keeper ([`fusefs::WriteAhead`]).
//!
//! A deposit carries a snapshot of the stage's tables; every change after it is sent as a
//! journal on the same keeper connection, in order. Deposits and journals of a stage take
//! one lock, so a change is either in the snapshot or sent after the deposit it follows
//! (both, when the change was made while the snapshot was taken: applying it twice is
//! harmless). With no deposit in the keeper (none yet, a keeper that restarted and was not
//! given the stage again) there is nothing to keep current: a crash would end the connection
//! anyway, so replies do not wait, and the next deposit's snapshot has every change. A
//! journal the keeper refuses makes it drop the stage's tables (the stage then ends with its
//! owner); a broken connection to the keeper counts as this owner's death there, and the
//! stage is deposited again at the next keeper check: in between, a crash could leave a
//! successor tables without the latest changes (logged).

use std::os::fd::{AsFd as _, BorrowedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fusefs::{Recorded, TableChange, WriteAhead};

use crate::keeper::protocol::{Change, Deposit, StageState};
use crate::keeper::{KeeperError, KeeperLink};

/// How long a reply waits for the keeper to take its changes. Past it the reply goes (the
/// exchange goes on in the background): a keeper that does not answer must not hold the
/// mount's requests, and an owner's replies must follow their last worker call closely (the
/// deadline of a crash take-over counts on it).
const RECORD_WAIT: Duration = Duration::from_secs(1);

/// One stage's write-ahead.
#[derive(Debug)]
pub(crate) struct StageJournal {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    keeper: Arc<KeeperLink>,
    staging: PathBuf,
    volume_id: String,
    /// Whether the keeper holds a deposit of this stage with its tables; taken by every
    /// deposit and journal.
    deposited: tokio::sync::Mutex<bool>,
    /// Changes no reply waits for, sent ahead of the next journal.
    noted: std::sync::Mutex<Vec<TableChange>>,
}

impl StageJournal {
    pub(crate) fn new(keeper: Arc<KeeperLink>, staging: PathBuf, volume_id: String) -> Self {
        StageJournal {
            inner: Arc::new(Inner {
                keeper,
                staging,
                volume_id,
                deposited: tokio::sync::Mutex::new(false),
                noted: std::sync::Mutex::new(Vec::new()),
            }),
        }
    }

    /// Deposits the stage with its tables as `snapshot` gives them now; from then on,
    /// changes are journaled. A `handed_over` deposit ends the journal: the stage is no longer
    /// served here. A keeper that refuses a deposit with tables (one older than the tables)
    /// is given the stage without them: it then keeps the connection for a hand-over, and
    /// ends it if this owner dies.
    pub(crate) async fn deposit(
        &self,
        deposit: &Deposit,
        fuse: BorrowedFd<'_>,
        snapshot: impl FnOnce() -> StageState,
    ) -> Result<StageState, String> {
        let inner = &*self.inner;
        let mut deposited = inner.deposited.lock().await;
        *deposited = false;
        // What was noted so far is in the snapshot, taken after: the tables change before
        // their changes are noted.
        crate::owner::lock(&inner.noted).clear();
        let state = snapshot();
        let memfd = state
            .to_memfd()
            .map_err(|e| format!("the state memfd: {e}"))?;
        match inner
            .keeper
            .deposit(deposit, fuse, Some(memfd.as_fd()))
            .await
        {
            Ok(()) => {
                *deposited = !deposit.handed_over;
                Ok(state)
            }
            Err(KeeperError::Refused { reason }) if !deposit.handed_over => {
                let plain = Deposit {
                    tables: false,
                    ..deposit.clone()
                };
                inner
                    .keeper
                    .deposit(&plain, fuse, None)
                    .await
                    .map_err(|e| error_text::chain(&e).to_string())?;
                tracing::warn!(
                    volume = %inner.volume_id,
                    %reason,
                    "the keeper refused the stage's tables (an older keeper?): it keeps the connection for a hand-over, but an owner crash ends the mount"
                );
                Ok(state)
            }
            Err(error) => Err(error_text::chain(&error).to_string()),
        }
    }

    /// Ends the journal: the stage is withdrawn or no longer served here.
    pub(crate) async fn stop(&self) {
        *self.inner.deposited.lock().await = false;
    }

    /// Sends the changes noted since the last journal.
    pub(crate) async fn flush(&self) {
        self.inner.send(Vec::new()).await;
    }
}

impl Inner {
    /// Sends what was noted and `changes`, if the keeper holds the stage.
    async fn send(&self, changes: Vec<TableChange>) {
        let mut deposited = self.deposited.lock().await;
        if !*deposited {
            return;
        }
        let mut all: Vec<Change> = std::mem::take(&mut *crate::owner::lock(&self.noted))
            .into_iter()
            .map(Change::from)
            .collect();
        all.extend(changes.into_iter().map(Change::from));
        if all.is_empty() {
            return;
        }
        if let Err(error) = self.keeper.journal(&self.staging, all).await {
            // Until the stage is deposited again (with a snapshot holding every change), the
            // keeper's tables may lack what the kernel holds. A refused journal drops them in
            // the keeper (the stage then ends with its owner); a broken connection counts as
            // this owner's death there, and the next keeper check deposits the stage again.
            *deposited = false;
            tracing::warn!(
                volume = %self.volume_id,
                error = %error_text::chain(&error),
                "the keeper did not take the stage's tables: until it is deposited again, an owner crash may leave a successor without them"
            );
        }
    }
}

impl WriteAhead for StageJournal {
    fn record(&self, changes: Vec<TableChange>) -> Recorded<'_> {
        // On a task of its own: a request aborted while it waits must not cut an exchange
        // with the keeper in half (the next request would read its answer).
        let inner = Arc::clone(&self.inner);
        let exchange = tokio::spawn(async move { inner.send(changes).await });
        let volume = self.inner.volume_id.clone();
        Box::pin(async move {
            if tokio::time::timeout(RECORD_WAIT, exchange).await.is_err() {
                tracing::warn!(
                    volume = %volume,
                    "the keeper did not take a change within a second: the reply goes without it"
                );
            }
        })
    }

    fn note(&self, changes: Vec<TableChange>) {
        crate::owner::lock(&self.inner.noted).extend(changes);
    }
}
