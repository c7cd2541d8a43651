//! The owner's side of the hand-off ([`crate::keeper`]): every stage is deposited with the
//! keeper while it is served, handed over when the owner is told to stop, and taken back by
//! the next owner process before it serves.

use std::os::fd::AsFd as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_client::protocol::MountEpoch;
use mounter::MountIdentity;
use session::SessionFile;

use super::journal::StageJournal;
use super::stage::{check_same_stage, refresh_credentials, worker_error};
use super::{Lease, Owner, Stage, WorkerClient, lock};
use crate::context::VolumeContext;
use crate::error::Error;
use crate::keeper::Fetched;
use crate::keeper::protocol::{Deposit, ResendWindow, StageState, hex_encode};

/// What [`Owner::hand_over_all`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HandOverReport {
    /// Stages handed over to the keeper.
    pub handed_over: usize,
    /// Stages still served by this process: their pause or deposit failed. Their mounts end
    /// when this process exits.
    pub failed: usize,
}

/// The reply retention `fs`'s workers state, asked for with a `statfs` when no reply has
/// stated it yet; `None` when they do not answer (the keeper then ends the stage's connection
/// if this owner dies, as without resend).
async fn retention(fs: &fusefs::Fs<WorkerClient>) -> Option<Duration> {
    let client = fs.service();
    if client.reply_retention().is_none() {
        let statfs = lease_client::v1::request::Op::Statfs(lease_client::v1::StatfsRequest {});
        if let Err(error) = client.call(statfs).await {
            tracing::warn!(error = %error_text::chain(&error), "the workers did not state their reply retention");
        }
    }
    client.reply_retention()
}

impl Owner {
    /// The write-ahead of a new stage's tables, set on its filesystem, when there is a keeper.
    pub(crate) fn journal_of(
        &self,
        fs: &fusefs::Fs<WorkerClient>,
        staging: &Path,
        volume_id: &str,
    ) -> Option<Arc<StageJournal>> {
        let keeper = self.keeper.as_ref()?;
        let journal = Arc::new(StageJournal::new(
            Arc::clone(keeper),
            staging.to_owned(),
            volume_id.to_owned(),
        ));
        fs.write_ahead_to(Arc::clone(&journal) as Arc<dyn fusefs::WriteAhead>);
        Some(journal)
    }

    /// The keeper's record of `stage`, which comes with its tables; `retention` is the reply
    /// retention its workers stated.
    fn deposit_of(
        &self,
        stage: &Stage,
        record: &fuse_wire::InitRecord,
        retention: Option<Duration>,
        handed_over: bool,
    ) -> Deposit {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Deposit {
            volume_id: stage.volume_id.clone(),
            staging: stage.staging.clone(),
            device: (stage.identity.major, stage.identity.minor),
            record: hex_encode(&record.encode()),
            context: stage
                .context
                .to_map(Some(&self.config.credential_namespace))
                .into_iter()
                .collect(),
            handed_over,
            tables: true,
            reply_retention_ms: retention.map_or(0, ms),
            call_budget_ms: ms(self.config.budgets.call),
            resend_window_ms: None,
            resend_rules: Vec::new(),
        }
    }

    /// Deposits a copy of `stage`'s connection with the keeper, if there is one, with its
    /// tables as they are now; from then on its write-ahead keeps them current. A failure is
    /// logged: the stage serves, but does not survive an owner restart until the next deposit
    /// (every stage is deposited again once the keeper answers on a new connection).
    pub(crate) async fn deposit(&self, stage: &Stage) {
        let Some(journal) = &stage.journal else {
            return;
        };
        // Asked for before the stage is locked: the call may take a call budget, and unstage
        // and hand-over need the lock.
        let fs = match stage.mounted.lock().await.as_ref() {
            Some(mount) => Arc::clone(mount.fs()),
            None => return,
        };
        let retention = retention(&fs).await;
        let mounted = stage.mounted.lock().await;
        let Some((mount, fd, record)) = mounted
            .as_ref()
            .and_then(|m| Some((m, m.descriptor()?, m.init_record()?)))
        else {
            return;
        };
        let mut deposit = self.deposit_of(stage, record, retention, false);
        // Taken before the journal's lock: a first request read in between is noted and
        // then dropped with the snapshot's notes, and the keeper keeps the open rule (which
        // covers every request: the safe side).
        let now = Instant::now();
        deposit.resend_rules = fs
            .resend_rules()
            .into_iter()
            .map(|rule| ResendWindow::of(rule, now))
            .collect();
        let snapshot = || StageState(mount.fs().state());
        if let Err(error) = journal.deposit(&deposit, fd, snapshot).await {
            tracing::warn!(
                volume = %stage.volume_id,
                %error,
                "the keeper did not take the stage: it serves, but would not survive an owner restart"
            );
        }
    }

    /// Lets the keeper drop its copies of an unstaged stage.
    pub(crate) async fn withdraw(&self, staging: &Path) {
        if let Some(keeper) = &self.keeper
            && let Err(error) = keeper.withdraw(staging).await
        {
            tracing::warn!(
                staging = %staging.display(),
                error = %error_text::chain(&error),
                "the keeper could not be told to let go of an unstaged stage"
            );
        }
    }

    /// Runs while the owner serves: asks the keeper every `keeper_check` whether it is there,
    /// and after a new connection to it (the keeper restarted and holds nothing of ours),
    /// deposits every stage again. Without a keeper, it never returns.
    pub async fn keep_deposits(self: Arc<Self>) {
        let Some(keeper) = self.keeper.clone() else {
            return std::future::pending().await;
        };
        let mut seen = keeper.connects();
        let mut reachable = true;
        loop {
            tokio::time::sleep(self.config.keeper_check).await;
            match keeper.ping().await {
                Ok(()) => {
                    reachable = true;
                    if keeper.connects() != seen {
                        seen = keeper.connects();
                        let stages: Vec<Arc<Stage>> =
                            lock(&self.stages).values().cloned().collect();
                        tracing::info!(
                            stages = stages.len(),
                            "connected to the keeper again: depositing every stage"
                        );
                        for stage in &stages {
                            self.deposit(stage).await;
                        }
                    }
                    let journals: Vec<Arc<StageJournal>> = lock(&self.stages)
                        .values()
                        .filter_map(|stage| stage.journal.clone())
                        .collect();
                    for journal in journals {
                        journal.flush().await;
                    }
                }
                Err(error) if reachable => {
                    reachable = false;
                    tracing::warn!(
                        keeper = %keeper.path().display(),
                        error = %error_text::chain(&error),
                        "the keeper does not answer: until it does, an owner restart ends the mounts"
                    );
                }
                Err(_) => {}
            }
        }
    }

    /// Hands every stage over to the keeper, for an owner that is about to exit: each stops
    /// reading its connection, finishes the requests in flight (up to `handoff_deadline`),
    /// stops renewing its lease without releasing it, and is deposited with its node and
    /// handle tables. Nothing is unmounted. A stage whose pause or deposit fails serves
    /// again (and ends when the process exits); the report counts both.
    pub async fn hand_over_all(&self) -> HandOverReport {
        if self.keeper.is_none() {
            return HandOverReport::default();
        }
        let stages: Vec<Arc<Stage>> = lock(&self.stages).values().cloned().collect();
        let started = Instant::now();
        let outcomes =
            futures_util::future::join_all(stages.iter().map(|stage| self.hand_over(stage))).await;
        let mut report = HandOverReport::default();
        for outcome in outcomes {
            match outcome {
                Ok(()) => report.handed_over += 1,
                Err(()) => report.failed += 1,
            }
        }
        tracing::info!(
            handed_over = report.handed_over,
            failed = report.failed,
            seconds = started.elapsed().as_secs_f64(),
            "handed the stages over to the keeper"
        );
        report
    }

    async fn hand_over(&self, stage: &Stage) -> Result<(), ()> {
        let volume = &stage.volume_id;
        let mut slot = stage.mounted.lock().await;
        let Some(mounted) = slot.take() else {
            return Ok(());
        };
        let handover = match mounted.pause(self.config.handoff_deadline).await {
            Ok(handover) => handover,
            Err(failed) => {
                tracing::error!(volume = %volume, error = %error_text::chain(&failed.error), "the stage could not pause and serves on; its mount ends when this process exits");
                *slot = Some(failed.mounted);
                return Err(());
            }
        };
        // The successor renews the same epoch; a release would end the lease it needs.
        if let Some(lease) = &stage.lease {
            let renewal = lock(&lease.renewal).take();
            if let Some(renewal) = renewal {
                renewal.stop().await;
            }
        }
        stage.refresh.abort();
        let retention = handover.fs.service().reply_retention();
        let deposit = self.deposit_of(stage, &handover.connection.record, retention, true);
        let deposited = match &stage.journal {
            Some(journal) => {
                let snapshot = || StageState(handover.fs.state());
                journal
                    .deposit(&deposit, handover.connection.fd.as_fd(), snapshot)
                    .await
            }
            None => Err("no keeper".to_owned()),
        };
        match deposited {
            Ok(state) => {
                tracing::info!(
                    volume = %volume,
                    nodes = state.0.nodes.len(),
                    handles = state.0.handles.len(),
                    "handed the stage over"
                );
                Ok(())
            }
            Err(error) => {
                tracing::error!(volume = %volume, %error, "the keeper did not take the stage: it serves on, and its mount ends when this process exits");
                match handover.resume() {
                    Ok(mounted) => *slot = Some(mounted),
                    Err(failed) => {
                        tracing::error!(volume = %volume, error = %error_text::chain(&failed.error), "the stage could not serve again");
                    }
                }
                Err(())
            }
        }
    }

    /// Takes back every stage the keeper holds handed over by an earlier owner process, before
    /// this one serves: each is served again without a new INIT, with the nodes and handles
    /// the earlier process held and (RWO) its lease epoch, renewed rather than claimed. A
    /// stage that cannot be taken back (no matching completed session record, a lease that
    /// was lost meanwhile, a refused descriptor) is let go of: its connection ends, and
    /// NodeUnpublishVolume and NodeUnstageVolume clean it up. Returns how many were taken
    /// back.
    pub async fn adopt_handed_over(&self) -> usize {
        let Some(keeper) = &self.keeper else { return 0 };
        let fetched = keeper.fetch().await;
        // The time left to repeat a crashed owner's mutations counts from the fetch answer,
        // whatever adopting takes afterwards.
        let fetched_at = Instant::now();
        let fetched = match fetched {
            Ok(fetched) => fetched,
            Err(error) => {
                tracing::warn!(
                    keeper = %keeper.path().display(),
                    error = %error_text::chain(&error),
                    "the keeper does not answer: no stage is taken over"
                );
                return 0;
            }
        };
        let mut adopted = 0;
        for fetched in fetched {
            let crashed = fetched.deposit.resend_window_ms.is_some();
            if !fetched.deposit.handed_over && !crashed {
                // Served by an owner that is still connected to the keeper.
                continue;
            }
            let volume = fetched.deposit.volume_id.clone();
            let staging = fetched.deposit.staging.clone();
            let started = Instant::now();
            match self.adopt(fetched, fetched_at).await {
                Ok(stage) => {
                    {
                        let mut stages = lock(&self.stages);
                        stages.insert(staging, Arc::clone(&stage));
                        metrics::gauge!("tak_os_node_stages").set(stages.len() as f64);
                    }
                    tracing::info!(
                        volume = %volume,
                        epoch = ?stage.lease.as_ref().map(|l| l.lease.epoch().to_string()),
                        seconds = started.elapsed().as_secs_f64(),
                        crashed,
                        "took a handed-over stage back"
                    );
                    self.deposit(&stage).await;
                    adopted += 1;
                }
                Err(error) => {
                    tracing::warn!(
                        volume = %volume,
                        staging = %staging.display(),
                        error = %error_text::chain(&error),
                        "a handed-over stage cannot be taken back: letting go of it ends its connection until NodeUnpublishVolume and NodeUnstageVolume clean it up"
                    );
                    if let Err(e) = keeper.withdraw(&staging).await {
                        tracing::warn!(error = %error_text::chain(&e), "the keeper could not be told to let go");
                    }
                }
            }
        }
        adopted
    }

    async fn adopt(&self, fetched: Fetched, fetched_at: Instant) -> Result<Arc<Stage>, Error> {
        let Fetched { deposit, mut fds } = fetched;
        let volume_id = deposit.volume_id.clone();
        let refused = |problem: String| Error::FailedPrecondition {
            volume_id: volume_id.clone(),
            problem,
        };
        let record = deposit
            .check(&fds)
            .map_err(|e| refused(error_text::chain(&e).to_string()))?;
        let (Some(memfd), Some(fuse)) = (fds.pop(), fds.pop()) else {
            return Err(refused("a handed-over stage without its tables".to_owned()));
        };
        let state = StageState::from_memfd(&memfd)
            .map_err(|e| refused(error_text::chain(&e).to_string()))?;
        let staging = deposit.staging.as_path();
        let session = |source| Error::Session {
            staging: staging.to_owned(),
            source,
        };
        let file = SessionFile::open(staging).map_err(session)?;
        let session_record = file
            .read()
            .map_err(session)?
            .ok_or_else(|| refused(format!("no session record at {staging:?}")))?;
        let identity = session_record.identity();
        if identity.volume_id != volume_id
            || identity.node_id != self.config.node_id
            || !session_record.stage_completed()
        {
            return Err(refused(format!(
                "the session record at {staging:?} is not a completed stage of this volume on this node"
            )));
        }
        let map = deposit.context.clone().into_iter().collect();
        let context = VolumeContext::parse(&map, &self.config.credential_namespace)?;
        if context.generation != identity.volume_generation {
            return Err(refused(format!(
                "generation {} in the deposit, {} in the session record",
                context.generation, identity.volume_generation
            )));
        }
        check_same_stage(&session_record, &context, staging)?;
        // The stage's serving thread runs its worker connections and its FUSE session.
        let runtime = self.serving.next();
        let (client, material) = self
            .worker_client(&volume_id, &context, runtime.clone())
            .await?;
        let (client, lease) = match session_record.epoch() {
            None => (client, None),
            Some(epoch) => {
                let lease = lease_client::MountLease::new(
                    &client,
                    MountEpoch(*epoch.as_bytes()),
                    &self.config.node_id,
                    self.config.lease,
                );
                let grant = lease.renew().await.map_err(|source| {
                    worker_error(&volume_id, context.generation, "renew_mount", source)
                })?;
                let renewal = lease.spawn_renewal(grant);
                let client = lease.client().clone();
                (
                    client,
                    Some(Lease {
                        lease,
                        renewal: Mutex::new(Some(renewal)),
                    }),
                )
            }
        };
        let mut state = state.0;
        let crashed = deposit.resend_window_ms.map(|ms| {
            fetched_at
                .checked_add(Duration::from_millis(ms))
                .unwrap_or(fetched_at)
        });
        if crashed.is_some() {
            // The kernel's lookup counts died with the owner: every node it may hold stays
            // until unmount (a FORGET never takes the count to zero).
            for node in &mut state.nodes {
                node.lookups = u64::MAX;
            }
        }
        let fs = Arc::new(fusefs::Fs::with_state(client, self.fs_config(), &state));
        self.observe(&fs);
        if let Some(deadline) = crashed {
            // Requests the dead owner had been resent itself keep the deadlines of the
            // crashes before; the rest get this one.
            let rules: Vec<fusefs::ResendRule> = deposit
                .resend_rules
                .iter()
                .map(|window| window.rule(fetched_at))
                .collect();
            fs.inherit_resend_rules(&rules);
            fs.resend_until(deadline);
            self.config.hook.reach(crate::owner::StagePoint::TakingOver);
            // Before anything reads the connection: the requests the dead owner had read come
            // again, marked as resent.
            fuse_session::notify_resend(fuse.as_fd(), &record).map_err(|source| {
                refused(format!(
                    "FUSE_NOTIFY_RESEND failed: {}",
                    error_text::chain(&source)
                ))
            })?;
        }
        let journal = self.journal_of(&fs, &deposit.staging, &volume_id);
        let connection = fuse_session::Paused { fd: fuse, record };
        let mounted = {
            let _on = runtime.enter();
            fusefs::adopt(
                Arc::clone(&fs),
                &volume_id,
                staging,
                deposit.device,
                connection,
            )
        }
        .map_err(|failed| Error::Mount {
            volume_id: volume_id.clone(),
            source: failed.error,
        })?;
        let refresh = tokio::spawn(refresh_credentials(
            Arc::clone(&self.credentials),
            volume_id.clone(),
            fs,
            material,
        ));
        Ok(Arc::new(Stage {
            volume_id: volume_id.clone(),
            context,
            staging: staging.to_owned(),
            identity: MountIdentity {
                major: deposit.device.0,
                minor: deposit.device.1,
                root: std::path::PathBuf::from("/"),
                fs_type: fusefs::FS_TYPE.into(),
                source: volume_id.into(),
            },
            mounted: tokio::sync::Mutex::new(Some(mounted)),
            lease,
            refresh,
            journal,
        }))
    }
}
