//! The write-ahead of one stage's tables to the keeper ([`fusefs::WriteAhead`]).
//!
//! A deposit carries a snapshot of the stage's tables; every change after it is sent as a
//! journal on the same keeper connection, in order. Deposits and journals of a stage take
//! one lock, so a change is either in the snapshot or sent after the deposit it follows
//! (both, when the change was made while the snapshot was taken: applying it twice is
//! harmless). With no deposit in the keeper (none yet, a refused one, a keeper that restarted
//! and was not given the stage again) there is nothing to keep current: a crash would end the
//! connection anyway, so replies do not wait, and the next deposit's snapshot has every
//! change.

use std::os::fd::{AsFd as _, BorrowedFd};
use std::path::PathBuf;
use std::sync::Arc;

use fusefs::{Recorded, TableChange, WriteAhead};

use crate::keeper::KeeperLink;
use crate::keeper::protocol::{Change, Deposit, StageState};

/// One stage's write-ahead.
#[derive(Debug)]
pub(crate) struct StageJournal {
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
            keeper,
            staging,
            volume_id,
            deposited: tokio::sync::Mutex::new(false),
            noted: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Deposits the stage with its tables as `snapshot` gives them now; from then on,
    /// changes are journaled. A `handed_over` deposit ends the journal: the stage is no longer
    /// served here.
    pub(crate) async fn deposit(
        &self,
        deposit: &Deposit,
        fuse: BorrowedFd<'_>,
        snapshot: impl FnOnce() -> StageState,
    ) -> Result<StageState, String> {
        let mut deposited = self.deposited.lock().await;
        *deposited = false;
        // What was noted so far is in the snapshot, taken after: the tables change before
        // their changes are noted.
        crate::owner::lock(&self.noted).clear();
        let state = snapshot();
        let memfd = state
            .to_memfd()
            .map_err(|e| format!("the state memfd: {e}"))?;
        self.keeper
            .deposit(deposit, fuse, Some(memfd.as_fd()))
            .await
            .map_err(|e| error_text::chain(&e).to_string())?;
        *deposited = !deposit.handed_over;
        Ok(state)
    }

    /// Ends the journal: the stage is withdrawn or no longer served here.
    pub(crate) async fn stop(&self) {
        *self.deposited.lock().await = false;
    }

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
            // Until the stage is deposited again (with a snapshot holding every change), a
            // crash would end its connection: nothing more to keep current.
            *deposited = false;
            tracing::warn!(
                volume = %self.volume_id,
                error = %error_text::chain(&error),
                "the keeper did not take the stage's tables: until it is deposited again, an owner crash ends its mount"
            );
        }
    }

    /// Sends the changes noted since the last journal.
    pub(crate) async fn flush(&self) {
        self.send(Vec::new()).await;
    }
}

impl WriteAhead for StageJournal {
    fn record(&self, changes: Vec<TableChange>) -> Recorded<'_> {
        Box::pin(self.send(changes))
    }

    fn note(&self, changes: Vec<TableChange>) {
        crate::owner::lock(&self.noted).extend(changes);
    }
}
