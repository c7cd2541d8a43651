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

use crate::keeper::protocol::{Change, Deposit, STATE_VERSION, STATE_VERSION_UNMARKED, StageState};
use crate::keeper::{KeeperError, KeeperLink};

/// How long a reply waits for the keeper to take its changes. Past it the reply goes (the
/// exchange goes on in the background): a keeper that does not answer must not hold the
/// mount's requests, and an owner's replies must follow their last worker call closely (the
/// deadline of a crash take-over counts on it).
const RECORD_WAIT: Duration = Duration::from_secs(1);

/// Changes that came with version 3 of the stage state, which only a keeper that takes it
/// knows: delivery marks and resend boundaries.
fn marks_only(change: &TableChange) -> bool {
    matches!(
        change,
        TableChange::Delivered { .. } | TableChange::FirstRead { .. }
    )
}

/// Whether the keeper takes [`Change::Delivered`] and [`Change::FirstRead`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marks {
    /// It took a state of the newest version, which has them.
    Taken,
    /// It took only a state of the version before.
    Unknown,
}

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
    /// While the keeper holds a deposit of this stage with its tables: whether it takes
    /// delivery marks ([`Change::Delivered`]; a keeper that took only a version 2 state does
    /// not). Taken by every deposit and journal.
    deposited: tokio::sync::Mutex<Option<Marks>>,
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
                deposited: tokio::sync::Mutex::new(None),
                noted: std::sync::Mutex::new(Vec::new()),
            }),
        }
    }

    /// Deposits the stage with its tables as `snapshot` gives them now; from then on,
    /// changes are journaled. A `handed_over` deposit ends the journal: the stage is no longer
    /// served here. A keeper that refuses the tables in the newest state version is given
    /// them in the version before (without delivery marks, which it is then not sent); one
    /// that refuses those too (one older than the tables) is given the stage without them: it
    /// then keeps the connection for a hand-over, and ends it if this owner dies.
    pub(crate) async fn deposit(
        &self,
        deposit: &Deposit,
        fuse: BorrowedFd<'_>,
        snapshot: impl FnOnce() -> StageState,
    ) -> Result<StageState, String> {
        let inner = &*self.inner;
        let mut deposited = inner.deposited.lock().await;
        *deposited = None;
        // What was noted so far is in the snapshot, taken after: the tables change before
        // their changes are noted.
        crate::owner::lock(&inner.noted).clear();
        let state = snapshot();
        let mut refusal = String::new();
        for (version, marks) in [
            (STATE_VERSION, Marks::Taken),
            (STATE_VERSION_UNMARKED, Marks::Unknown),
        ] {
            let memfd = state
                .to_memfd_as(Some(version))
                .map_err(|e| format!("the state memfd: {e}"))?;
            match inner
                .keeper
                .deposit(deposit, fuse, Some(memfd.as_fd()))
                .await
            {
                Ok(()) => {
                    if marks == Marks::Unknown {
                        tracing::warn!(
                            volume = %inner.volume_id,
                            %refusal,
                            "the keeper took the stage's tables only without delivery marks (an older keeper?): after an owner crash, a handle whose open reply never reached the kernel stays open on the workers until unstage"
                        );
                    }
                    *deposited = (!deposit.handed_over).then_some(marks);
                    return Ok(state);
                }
                Err(KeeperError::Refused { reason }) => refusal = reason,
                Err(error) => return Err(error_text::chain(&error).to_string()),
            }
        }
        match deposit.handed_over {
            true => Err(format!("the keeper refused the stage's tables: {refusal}")),
            false => {
                let reason = refusal;
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
        }
    }

    /// Ends the journal: the stage is withdrawn or no longer served here.
    pub(crate) async fn stop(&self) {
        *self.inner.deposited.lock().await = None;
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
        let Some(marks) = *deposited else {
            return;
        };
        let noted = std::mem::take(&mut *crate::owner::lock(&self.noted));
        let all: Vec<Change> = noted
            .into_iter()
            .chain(changes)
            .filter(|c| marks == Marks::Taken || !marks_only(c))
            .map(Change::from)
            .collect();
        if all.is_empty() {
            return;
        }
        if let Err(error) = self.keeper.journal(&self.staging, all).await {
            // Until the stage is deposited again (with a snapshot holding every change), the
            // keeper's tables may lack what the kernel holds. A refused journal drops them in
            // the keeper (the stage then ends with its owner); a broken connection counts as
            // this owner's death there, and the next keeper check deposits the stage again.
            *deposited = None;
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use fusefs::{ConnectionNonce, HandleState, MountState};
    use lease_client::protocol::FileId;

    use super::*;
    use crate::keeper::protocol::{self, Answer, Request};

    /// What a stand-in keeper was given: the state version of each deposit it took, and the
    /// changes of each journal.
    #[derive(Debug, Default)]
    struct Given {
        deposits: Vec<u32>,
        journals: Vec<Vec<Change>>,
    }

    /// A keeper on `socket` that takes states up to `newest` and refuses later versions, as a
    /// keeper of an older release does.
    fn stand_in_keeper(socket: &std::path::Path, newest: u32) -> Arc<Mutex<Given>> {
        let listener = fdpass::AsyncListener::new(fdpass::Listener::bind(socket).unwrap()).unwrap();
        let given = Arc::new(Mutex::new(Given::default()));
        let record = Arc::clone(&given);
        tokio::spawn(async move {
            let channel = listener.accept().await.unwrap();
            while let Ok(Some(message)) = channel.recv().await {
                let request: Request = protocol::decode(&message.payload).unwrap();
                let answer = match request {
                    Request::Deposit { .. } => {
                        let memfd = &message.fds[1];
                        StageState::from_memfd(memfd).unwrap();
                        let mut head = [0u8; 8];
                        rustix::io::pread(memfd, &mut head, 0).unwrap();
                        let version = u32::from_le_bytes(head[4..].try_into().unwrap());
                        if version > newest {
                            Answer::Refused {
                                reason: format!("version {version}, not {newest}"),
                            }
                        } else {
                            crate::owner::lock(&record).deposits.push(version);
                            Answer::Ok
                        }
                    }
                    Request::Journal { changes, .. } => {
                        crate::owner::lock(&record).journals.push(changes);
                        Answer::Ok
                    }
                    _ => Answer::Ok,
                };
                channel.send(&protocol::encode(&answer), &[]).await.unwrap();
            }
        });
        given
    }

    fn handle(handle: u64, opened_by: Option<u64>) -> HandleState {
        HandleState {
            handle,
            file: FileId {
                ino: 9,
                inode_generation: 2,
            },
            flags: 0,
            opened_by,
        }
    }

    /// Deposits a stage with one undelivered handle, opens another, and marks both delivered.
    async fn deposit_open_deliver(keeper: &std::path::Path) {
        let journal = StageJournal::new(
            Arc::new(KeeperLink::new(keeper)),
            PathBuf::from("/staging"),
            "v".to_owned(),
        );
        let deposit = Deposit {
            volume_id: "v".to_owned(),
            staging: PathBuf::from("/staging"),
            device: (0, 1),
            record: String::new(),
            context: BTreeMap::new(),
            handed_over: false,
            tables: true,
            reply_retention_ms: 60_000,
            call_budget_ms: 15_000,
            resend_window_ms: None,
            resend_rules: Vec::new(),
        };
        let fuse = rustix::fs::memfd_create("fuse", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let state = StageState(MountState {
            nonce: ConnectionNonce([1; 16]),
            nodes: Vec::new(),
            handles: vec![handle(4, Some(10))],
        });
        journal
            .deposit(&deposit, fuse.as_fd(), || state)
            .await
            .unwrap();
        journal
            .record(vec![TableChange::Opened {
                handle: handle(5, Some(12)),
            }])
            .await;
        journal.note(vec![
            TableChange::Delivered { handle: 4 },
            TableChange::Delivered { handle: 5 },
        ]);
        journal.flush().await;
    }

    #[tokio::test]
    async fn delivery_marks_go_only_to_a_keeper_that_took_them() {
        let dir = tempfile::tempdir().unwrap();
        let opened = Change::Opened {
            handle: 5,
            ino: 9,
            generation: 2,
            flags: 0,
            unique: 12,
        };

        // A current keeper takes the newest state and every change.
        let socket = dir.path().join("current.sock");
        let given = stand_in_keeper(&socket, STATE_VERSION);
        deposit_open_deliver(&socket).await;
        {
            let given = crate::owner::lock(&given);
            assert_eq!(given.deposits, [STATE_VERSION]);
            assert_eq!(
                given.journals,
                [
                    vec![opened],
                    vec![
                        Change::Delivered { handle: 4 },
                        Change::Delivered { handle: 5 }
                    ]
                ]
            );
        }

        // A keeper of the release before refuses it, takes the version before, and is never
        // sent a mark it does not know.
        let socket = dir.path().join("older.sock");
        let given = stand_in_keeper(&socket, STATE_VERSION_UNMARKED);
        deposit_open_deliver(&socket).await;
        let given = crate::owner::lock(&given);
        assert_eq!(given.deposits, [STATE_VERSION_UNMARKED]);
        assert_eq!(given.journals, [vec![opened]]);
    }
}
