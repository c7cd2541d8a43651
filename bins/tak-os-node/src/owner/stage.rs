//! NodeStageVolume and NodeUnstageVolume: the one FUSE mount per volume and node, its session
//! record, and for RWO its lease.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use csi_proto::v1::{
    NodeStageVolumeRequest, NodeStageVolumeResponse, NodeUnstageVolumeRequest,
    NodeUnstageVolumeResponse,
};
use lease_client::protocol::{
    AccessMode as WireAccessMode, FileId, MountEpoch, ROOT_INO, ROOT_INODE_GENERATION,
    VolumeGeneration,
};
use lease_client::v1::request::Op;
use lease_client::{ClientConfig, Refusal, ReleaseOutcome};
use mounter::{MountIdentity, Target};
use session::{CreateOutcome, SessionFile, SessionIdentity, SessionRecord};

use super::{Busy, Lease, Owner, Stage, StagePoint, WorkerClient, check_volume_id, lock};
use crate::capability;
use crate::context::{VolumeContext, VolumeMode};
use crate::error::Error;

impl Owner {
    /// NodeStageVolume: validates everything first and changes nothing on a refusal; then
    /// writes the session record, claims the lease (RWO), mounts, and marks the record
    /// completed. A retry resumes where an earlier call stopped.
    pub async fn stage(
        &self,
        req: &NodeStageVolumeRequest,
    ) -> Result<NodeStageVolumeResponse, Error> {
        check_volume_id(&req.volume_id)?;
        if req.staging_target_path.is_empty() {
            return Err(Error::Missing {
                field: "staging_target_path",
            });
        }
        if !req.secrets.is_empty() {
            return Err(Error::SecretsGiven);
        }
        let context = VolumeContext::parse(&req.volume_context, &self.config.credential_namespace)?;
        capability::check(req.volume_capability.as_ref(), context.mode)?;
        let staging = PathBuf::from(&req.staging_target_path);
        let target = self.resolve("staging_target_path", &staging)?;
        let busy = self.begin(&req.volume_id)?;
        let identity = SessionIdentity::new(
            req.volume_id.as_str(),
            context.generation,
            self.config.node_id.as_str(),
        );
        let file = SessionFile::open(&staging).map_err(|source| Error::Session {
            staging: staging.clone(),
            source,
        })?;
        let session = |source| Error::Session {
            staging: staging.clone(),
            source,
        };
        let existing = file.load(&identity).map_err(session)?;

        // A stage this process holds: the same request again, or another one.
        if let Some(stage) = self.stage_at(&staging) {
            if stage.volume_id != req.volume_id
                || stage.context != context
                || existing.as_ref().is_none_or(|r| !r.stage_completed())
            {
                return Err(Error::AlreadyExists {
                    path: staging,
                    found: format!(
                        "a stage of volume {} at generation {} ({})",
                        stage.volume_id, stage.context.generation, stage.context.mode
                    ),
                });
            }
            if let Some(problem) = stage.unhealthy() {
                tracing::warn!(volume = %req.volume_id, %problem, "a retried stage lost its lease");
                return Err(Error::LeaseExpired {
                    volume_id: req.volume_id.clone(),
                    path: staging,
                });
            }
            return Ok(NodeStageVolumeResponse {});
        }
        if let Some(stage) = self.stage_of(&req.volume_id) {
            return Err(Error::AlreadyExists {
                path: staging,
                found: format!(
                    "nothing, but volume {} is staged at {:?} on this node",
                    stage.volume_id, stage.staging
                ),
            });
        }

        // What the kernel shows at the staging path, without asking a filesystem there.
        let record = match existing {
            Some(record) => {
                check_same_stage(&record, &context, &staging)?;
                if record.stage_completed() {
                    // Completed by an earlier owner process, whose connection is gone: the stage
                    // stays until NodeUnstageVolume cleans it up.
                    return Err(match context.mode {
                        VolumeMode::Rwo => Error::LeaseExpired {
                            volume_id: req.volume_id.clone(),
                            path: staging,
                        },
                        VolumeMode::Rwx => Error::Retry {
                            volume_id: req.volume_id.clone(),
                            what: format!(
                                "the stage at {staging:?} was made by an earlier owner process and stays until NodeUnstageVolume"
                            ),
                        },
                    });
                }
                self.resume(&busy, &target, &record, &context).await?;
                record
            }
            None => {
                self.check_empty_stage(&target, &req.volume_id)?;
                let record = match context.mode {
                    VolumeMode::Rwx => {
                        SessionRecord::pending_rwx(identity.clone(), context.endpoint_urls.clone())
                    }
                    VolumeMode::Rwo => {
                        let epoch =
                            MountEpoch::random().map_err(|e| Error::FailedPrecondition {
                                volume_id: req.volume_id.clone(),
                                problem: format!("no random mount epoch: {e}"),
                            })?;
                        SessionRecord::pending_rwo(
                            identity.clone(),
                            context.endpoint_urls.clone(),
                            session::MountEpoch::from_bytes(*epoch.as_bytes()),
                        )
                    }
                }
                .map_err(session)?;
                match file.create_pending(&record).map_err(session)? {
                    CreateOutcome::Created => {
                        self.config.hook.reach(StagePoint::RecordWritten);
                        record
                    }
                    // Another process wrote it since the load: whatever it is, not ours.
                    CreateOutcome::Existing(other) => {
                        return Err(Error::AlreadyExists {
                            path: staging,
                            found: format!(
                                "a session record of volume {}",
                                other.identity().volume_id
                            ),
                        });
                    }
                }
            }
        };
        // From here on, a final error must undo what this call created.
        match self.complete_stage(&file, &record, context, &staging).await {
            Ok(stage) => {
                {
                    let mut stages = lock(&self.stages);
                    stages.insert(staging, Arc::clone(&stage));
                    metrics::gauge!("tak_os_node_stages").set(stages.len() as f64);
                }
                self.deposit(&stage).await;
                Ok(NodeStageVolumeResponse {})
            }
            Err(error) => {
                if crate::status::is_final(crate::status::code(&error))
                    && let Err(e) = file.remove(&identity)
                {
                    tracing::error!(
                        error = %error_text::chain(&e),
                        "a failed stage could not remove its pending session record"
                    );
                    return Err(Error::Retry {
                        volume_id: req.volume_id.clone(),
                        what: format!(
                            "the stage failed ({}) and its session record stays",
                            error_text::chain(&error)
                        ),
                    });
                }
                Err(error)
            }
        }
    }

    /// The pending record exists and this process holds no stage there: an earlier call
    /// stopped part-way (a crash, a timeout). A mount of ours left at the path, whose
    /// connection this process does not hold and which nothing references, is taken down.
    async fn resume(
        &self,
        _busy: &Busy<'_>,
        target: &Target,
        record: &SessionRecord,
        context: &VolumeContext,
    ) -> Result<(), Error> {
        let volume_id = &record.identity().volume_id;
        let mounter_error = |source| Error::Mounter {
            volume_id: volume_id.clone(),
            source,
        };
        let Some(found) = self.mounter.mounted_at(target).map_err(mounter_error)? else {
            return Ok(());
        };
        if !is_stage_of(&found.identity, volume_id) {
            return Err(Error::AlreadyExists {
                path: target.path().to_owned(),
                found: describe(&found.identity),
            });
        }
        let others = self.references(&found.identity, target.path())?;
        if !others.is_empty() {
            return Err(Error::Retry {
                volume_id: volume_id.clone(),
                what: format!(
                    "the stage at {:?} was left by an earlier owner process and is still mounted at {others:?}; unpublish those first",
                    target.path()
                ),
            });
        }
        tracing::info!(
            volume = %volume_id,
            mode = %context.mode,
            "taking down a stage an earlier owner process left unfinished"
        );
        self.mounter
            .unmount(target, &found.identity)
            .map_err(mounter_error)?;
        Ok(())
    }

    /// Refuses a staging path that is not an empty directory with nothing mounted on it.
    fn check_empty_stage(&self, target: &Target, volume_id: &str) -> Result<(), Error> {
        if let Some(found) = self
            .mounter
            .mounted_at(target)
            .map_err(|source| Error::Mounter {
                volume_id: volume_id.to_owned(),
                source,
            })?
        {
            return Err(Error::AlreadyExists {
                path: target.path().to_owned(),
                found: describe(&found.identity),
            });
        }
        // The path itself must be a directory, not a symlink to one (which the read below and
        // the mount would follow, possibly into a dead FUSE mount): asked without following it
        // and without syncing with a filesystem there.
        let kind = target.kind().map_err(|source| Error::Mounter {
            volume_id: volume_id.to_owned(),
            source,
        })?;
        if kind != mounter::TargetKind::Directory {
            return Err(Error::Path {
                field: "staging_target_path",
                source: match kind {
                    mounter::TargetKind::Symlink => mounter::Error::SymlinkInPath {
                        path: target.path().to_owned(),
                    },
                    mounter::TargetKind::Absent
                    | mounter::TargetKind::Directory
                    | mounter::TargetKind::Other => mounter::Error::NotADirectory {
                        path: target.path().to_owned(),
                    },
                },
            });
        }
        // Nothing is mounted there, so reading the directory asks no FUSE daemon.
        let mut entries = std::fs::read_dir(target.path()).map_err(|source| Error::Mounter {
            volume_id: volume_id.to_owned(),
            source: mounter::Error::Io {
                op: "read the staging directory",
                path: target.path().to_owned(),
                source,
            },
        })?;
        if entries.next().is_some() {
            return Err(Error::AlreadyExists {
                path: target.path().to_owned(),
                found: "a directory that is not empty".to_owned(),
            });
        }
        Ok(())
    }

    /// Claims (RWO), mounts and completes the record; on an error, undoes what it did here.
    async fn complete_stage(
        &self,
        file: &SessionFile,
        record: &SessionRecord,
        context: VolumeContext,
        staging: &Path,
    ) -> Result<Arc<Stage>, Error> {
        let volume_id = record.identity().volume_id.clone();
        // The stage's serving thread runs its worker connections and its FUSE session.
        let runtime = self.serving.next();
        let (client, material) = self
            .worker_client(&volume_id, &context, runtime.clone())
            .await?;
        let (client, lease) = match record.epoch() {
            None => {
                self.check_volume(&client, &volume_id, context.generation)
                    .await?;
                (client, None)
            }
            Some(epoch) => {
                let epoch = MountEpoch(*epoch.as_bytes());
                let lease = lease_client::MountLease::new(
                    &client,
                    epoch,
                    &self.config.node_id,
                    self.config.lease,
                );
                let grant = self.claim(&lease, &volume_id, context.generation).await?;
                self.config.hook.reach(StagePoint::Claimed);
                (lease.client().clone(), Some((lease, grant)))
            }
        };
        let mounted = match fusefs::Fs::new(client, self.fs_config()) {
            Ok(fs) => {
                self.observe(&fs);
                fusefs::mount_on(&runtime, Arc::new(fs), &volume_id, staging).await
            }
            Err(nonce) => Err(fusefs::MountError::from(nonce)),
        };
        let mounted = match mounted {
            Ok(mounted) => mounted,
            Err(source) => {
                if let Some((lease, _)) = &lease {
                    self.release(lease, &volume_id).await;
                }
                return Err(Error::Mount { volume_id, source });
            }
        };
        self.config.hook.reach(StagePoint::Mounted);
        let fs = Arc::clone(mounted.fs());
        let (major, minor) = mounted.device();
        let identity = MountIdentity {
            major,
            minor,
            root: PathBuf::from("/"),
            fs_type: fusefs::FS_TYPE.into(),
            source: volume_id.clone().into(),
        };
        if let Err(source) = file.mark_stage_completed(record.identity(), record.epoch()) {
            // Not completed: leave nothing mounted behind a pending record.
            let mut mounted = mounted;
            if let Err(e) = mounted.unmount(self.config.unmount_wait).await {
                tracing::error!(error = %error_text::chain(&e), "a stage that could not complete could not unmount either");
            }
            if let Some((lease, _)) = &lease {
                self.release(lease, &volume_id).await;
            }
            return Err(Error::Session {
                staging: staging.to_owned(),
                source,
            });
        }
        self.config.hook.reach(StagePoint::Completed);
        let lease = lease.map(|(lease, grant)| {
            let renewal = lease.spawn_renewal(grant);
            Lease {
                lease,
                renewal: Mutex::new(Some(renewal)),
            }
        });
        let refresh = tokio::spawn(refresh_credentials(
            Arc::clone(&self.credentials),
            volume_id.clone(),
            Arc::clone(&fs),
            material,
        ));
        let journal = self.journal_of(&fs, staging, &volume_id);
        Ok(Arc::new(Stage {
            volume_id,
            context,
            staging: staging.to_owned(),
            identity,
            mounted: tokio::sync::Mutex::new(Some(mounted)),
            lease,
            refresh,
            journal,
        }))
    }

    /// A worker client of the volume with the stage's context and the volume's credentials,
    /// its connections run on the stage's serving thread (`runtime`), and those credentials
    /// (whose changes the stage's refresh task watches for).
    pub(crate) async fn worker_client(
        &self,
        volume_id: &str,
        context: &VolumeContext,
        runtime: tokio::runtime::Handle,
    ) -> Result<(WorkerClient, crate::credentials::Material), Error> {
        let material =
            self.credentials
                .load(volume_id)
                .await
                .map_err(|source| Error::Credentials {
                    volume_id: volume_id.to_owned(),
                    source,
                })?;
        let credentials = material
            .credentials()
            .map_err(|source| Error::Credentials {
                volume_id: volume_id.to_owned(),
                source,
            })?;
        let client = WorkerClient::new(
            ClientConfig {
                volume_id: volume_id.to_owned(),
                volume_generation: VolumeGeneration(context.generation),
                access_mode: match context.mode {
                    VolumeMode::Rwx => WireAccessMode::Rwx,
                    VolumeMode::Rwo => WireAccessMode::Rwo,
                },
                endpoints: context.endpoints.clone(),
                budgets: self.config.budgets,
            },
            {
                let transport =
                    lease_client::HttpsTransport::on_runtime(&self.config.budgets, runtime);
                transport.set_credentials(&credentials);
                transport
            },
        );
        Ok((client, material))
    }

    /// One read call: do the workers serve this volume at this generation?
    async fn check_volume(
        &self,
        client: &WorkerClient,
        volume_id: &str,
        generation: u64,
    ) -> Result<(), Error> {
        let op = Op::Getattr(lease_client::v1::GetattrRequest {
            file: Some(
                FileId {
                    ino: ROOT_INO,
                    inode_generation: ROOT_INODE_GENERATION,
                }
                .into(),
            ),
            handle: None,
        });
        client
            .call(op)
            .await
            .map(drop)
            .map_err(|source| worker_error(volume_id, generation, "getattr", source))
    }

    /// Claims the lease; a definite refusal has changed nothing.
    async fn claim(
        &self,
        lease: &lease_client::MountLease<lease_client::HttpsTransport>,
        volume_id: &str,
        generation: u64,
    ) -> Result<lease_client::LeaseGrant, Error> {
        let call = lease
            .prepare_claim()
            .map_err(|source| worker_error(volume_id, generation, "claim_mount", source))?;
        let grant = lease
            .claim(&call)
            .await
            .map_err(|source| worker_error(volume_id, generation, "claim_mount", source))?;
        tracing::info!(
            volume = %volume_id,
            epoch = %grant.epoch,
            lease_seconds = grant.lease.as_secs_f64(),
            "mount lease claimed"
        );
        Ok(grant)
    }

    /// Releases the lease within its own budget; a release that cannot finish is deferred
    /// (the lease expires on its own), logged and counted.
    pub(crate) async fn release(
        &self,
        lease: &lease_client::MountLease<lease_client::HttpsTransport>,
        volume_id: &str,
    ) {
        match lease.release().await {
            ReleaseOutcome::Released { was_holder } => {
                tracing::info!(
                    volume = %volume_id,
                    epoch = %lease.epoch(),
                    was_holder,
                    "mount lease released"
                );
            }
            ReleaseOutcome::Deferred { error } => {
                metrics::counter!("tak_os_node_mount_release_deferred_total").increment(1);
                tracing::warn!(
                    volume = %volume_id,
                    event = "mount_release_deferred",
                    error = %error_text::chain(&error),
                    "the mount lease could not be released; it expires on its own"
                );
            }
        }
    }

    /// NodeUnstageVolume: refuses while any bind of the stage remains anywhere, then unmounts
    /// (identity-checked), releases the lease (RWO) and removes the session record last. Any
    /// failure leaves the record in place.
    pub async fn unstage(
        &self,
        req: &NodeUnstageVolumeRequest,
    ) -> Result<NodeUnstageVolumeResponse, Error> {
        check_volume_id(&req.volume_id)?;
        if req.staging_target_path.is_empty() {
            return Err(Error::Missing {
                field: "staging_target_path",
            });
        }
        let staging = PathBuf::from(&req.staging_target_path);
        let target = self.resolve("staging_target_path", &staging)?;
        let _busy = self.begin(&req.volume_id)?;
        let session = |source| Error::Session {
            staging: staging.clone(),
            source,
        };
        let file = SessionFile::open(&staging).map_err(session)?;
        let record = file.read().map_err(session)?;
        if let Some(record) = &record {
            let found = record.identity();
            if found.volume_id != req.volume_id || found.node_id != self.config.node_id {
                return Err(Error::AlreadyExists {
                    path: staging,
                    found: format!(
                        "the session of volume {} on node {}",
                        found.volume_id, found.node_id
                    ),
                });
            }
        }
        let mounter_error = |source| Error::Mounter {
            volume_id: req.volume_id.clone(),
            source,
        };
        let held = self.stage_at(&staging);
        let found = self.mounter.mounted_at(&target).map_err(mounter_error)?;
        // The identity of the stage's FUSE connection: this process's, or the kernel's.
        let identity = match (&held, &found) {
            (Some(stage), _) => Some(stage.identity.clone()),
            (None, Some(found)) if is_stage_of(&found.identity, &req.volume_id) => {
                Some(found.identity.clone())
            }
            (None, Some(found)) => {
                return Err(Error::FailedPrecondition {
                    volume_id: req.volume_id.clone(),
                    problem: format!(
                        "{staging:?} holds {}, not this volume's stage",
                        describe(&found.identity)
                    ),
                });
            }
            (None, None) => None,
        };
        if let Some(identity) = &identity {
            let others = self.references(identity, &staging)?;
            if !others.is_empty() {
                return Err(Error::FailedPrecondition {
                    volume_id: req.volume_id.clone(),
                    problem: format!("the stage is still mounted at {others:?}"),
                });
            }
        }
        match &held {
            Some(stage) => {
                let mut mounted = stage.mounted.lock().await;
                if let Some(mount) = mounted.as_mut() {
                    mount
                        .unmount(self.config.unmount_wait)
                        .await
                        .map_err(|source| Error::Mount {
                            volume_id: req.volume_id.clone(),
                            source,
                        })?;
                }
                *mounted = None;
                stage.refresh.abort();
                if let Some(journal) = &stage.journal {
                    journal.stop().await;
                }
                if let Some(lease) = &stage.lease {
                    let renewal = lock(&lease.renewal).take();
                    if let Some(renewal) = renewal {
                        renewal.stop().await;
                    }
                    self.release(&lease.lease, &req.volume_id).await;
                }
                let mut stages = lock(&self.stages);
                stages.remove(&staging);
                metrics::gauge!("tak_os_node_stages").set(stages.len() as f64);
            }
            None => {
                if let (Some(found), Some(identity)) = (&found, &identity) {
                    debug_assert_eq!(&found.identity, identity);
                    self.mounter
                        .unmount(&target, identity)
                        .map_err(mounter_error)?;
                }
                if let Some(record) = &record
                    && let Some(epoch) = record.epoch()
                {
                    self.release_left(record, epoch).await;
                }
            }
        }
        self.withdraw(&staging).await;
        if let Some(record) = &record {
            file.remove(record.identity()).map_err(session)?;
        }
        self.credentials.forget(&req.volume_id);
        Ok(NodeUnstageVolumeResponse {})
    }

    /// Releases the lease of a stage an earlier owner process made, with the epoch from its
    /// session record, so the next stage on any node succeeds at once.
    async fn release_left(&self, record: &SessionRecord, epoch: session::MountEpoch) {
        let volume_id = &record.identity().volume_id;
        let material = match self.credentials.load(volume_id).await {
            Ok(material) => material,
            Err(e) => {
                return self.defer(volume_id, &e);
            }
        };
        let credentials = match material.credentials() {
            Ok(credentials) => credentials,
            Err(e) => return self.defer(volume_id, &e),
        };
        let hosts = record
            .endpoints()
            .iter()
            .map(|url| url.strip_prefix("https://").unwrap_or(url));
        let endpoints = match lease_client::EndpointSet::new(hosts) {
            Ok(endpoints) => endpoints,
            Err(e) => return self.defer(volume_id, &e),
        };
        let client = WorkerClient::new(
            ClientConfig {
                volume_id: volume_id.clone(),
                volume_generation: VolumeGeneration(record.identity().volume_generation),
                access_mode: WireAccessMode::Rwo,
                endpoints,
                budgets: self.config.budgets,
            },
            lease_client::HttpsTransport::with_credentials(&self.config.budgets, &credentials),
        );
        let lease = lease_client::MountLease::new(
            &client,
            MountEpoch(*epoch.as_bytes()),
            &self.config.node_id,
            self.config.lease,
        );
        self.release(&lease, volume_id).await;
    }

    fn defer(&self, volume_id: &str, error: &(dyn std::error::Error + 'static)) {
        metrics::counter!("tak_os_node_mount_release_deferred_total").increment(1);
        tracing::warn!(
            volume = %volume_id,
            event = "mount_release_deferred",
            error = %error_text::chain(error),
            "the mount lease could not be released; it expires on its own"
        );
    }

    /// Every mount point of the stage's FUSE connection other than `staging` itself: binds
    /// and subPaths, found in the whole mount table (so also when the stage is gone).
    pub(crate) fn references(
        &self,
        identity: &MountIdentity,
        staging: &Path,
    ) -> Result<Vec<PathBuf>, Error> {
        let volume_id = identity.source.to_string_lossy().into_owned();
        let mut found = self
            .mounter
            .publications(identity)
            .map_err(|source| Error::Mounter { volume_id, source })?;
        found.retain(|path| path != staging);
        found.sort();
        found.dedup();
        Ok(found)
    }

    pub(crate) fn resolve(&self, field: &'static str, path: &Path) -> Result<Target, Error> {
        self.kubelet
            .resolve(path)
            .map_err(|source| Error::Path { field, source })
    }
}

/// Refuses a record of this volume made with other endpoints or another access mode: a stage
/// of another request.
pub(crate) fn check_same_stage(
    record: &SessionRecord,
    context: &VolumeContext,
    staging: &Path,
) -> Result<(), Error> {
    if record.endpoints() == context.endpoint_urls.as_slice() && mode_of(record) == context.mode {
        return Ok(());
    }
    Err(Error::AlreadyExists {
        path: staging.to_owned(),
        found: format!(
            "a stage of volume {} with other endpoints or another access mode",
            record.identity().volume_id
        ),
    })
}

/// The access mode a session record was written for.
fn mode_of(record: &SessionRecord) -> VolumeMode {
    match record.epoch() {
        Some(_) => VolumeMode::Rwo,
        None => VolumeMode::Rwx,
    }
}

/// Whether a mount is a FUSE stage of `volume_id` (its whole filesystem, type and source).
pub(crate) fn is_stage_of(identity: &MountIdentity, volume_id: &str) -> bool {
    identity.fs_type == fusefs::FS_TYPE
        && identity.source == volume_id
        && identity.root == Path::new("/")
}

pub(crate) fn describe(identity: &MountIdentity) -> String {
    format!(
        "a {} mount of {:?}",
        identity.fs_type.to_string_lossy(),
        identity.source
    )
}

/// The owner's error for a failed worker call.
pub(crate) fn worker_error(
    volume_id: &str,
    generation: u64,
    op: &'static str,
    source: lease_client::Error,
) -> Error {
    match source.refusal() {
        Some(Refusal::UnknownVolume) => Error::VolumeNotFound {
            volume_id: volume_id.to_owned(),
            generation,
            why: "unknown volume",
        },
        Some(Refusal::IdentityMismatch) => Error::VolumeNotFound {
            volume_id: volume_id.to_owned(),
            generation,
            why: "another generation or access mode",
        },
        Some(Refusal::LeaseHeld { remaining }) => Error::LeaseHeld {
            volume_id: volume_id.to_owned(),
            remaining: *remaining,
        },
        Some(
            Refusal::Errno(_) | Refusal::StaleEpoch | Refusal::InvalidRequest | Refusal::TooLarge,
        ) => Error::Refused {
            volume_id: volume_id.to_owned(),
            op,
            source,
        },
        None => match source {
            lease_client::Error::Unauthorized { .. } => Error::Refused {
                volume_id: volume_id.to_owned(),
                op,
                source,
            },
            other => Error::Workers {
                volume_id: volume_id.to_owned(),
                op,
                source: other,
            },
        },
    }
}

/// Keeps a stage's credentials current: waits for the source to report a change, loads, and
/// swaps new material into the live client (calls in flight finish with the old).
pub(crate) async fn refresh_credentials(
    source: Arc<dyn crate::credentials::CredentialSource>,
    volume_id: String,
    fs: Arc<fusefs::Fs<WorkerClient>>,
    mut current: crate::credentials::Material,
) {
    loop {
        source.changed(&volume_id).await;
        let material = match source.load(&volume_id).await {
            Ok(material) => material,
            Err(e) => {
                tracing::warn!(
                    volume = %volume_id,
                    error = %error_text::chain(&e),
                    "the volume's credentials could not be refreshed; the current ones stay"
                );
                continue;
            }
        };
        if material == current {
            continue;
        }
        match material.credentials() {
            Ok(credentials) => {
                fs.service().transport().set_credentials(&credentials);
                metrics::counter!("tak_os_node_credential_refreshes_total").increment(1);
                tracing::info!(volume = %volume_id, "the volume's credentials were refreshed");
                current = material;
            }
            Err(e) => tracing::warn!(
                volume = %volume_id,
                error = %error_text::chain(&e),
                "the volume's new credentials are unusable; the current ones stay"
            ),
        }
    }
}
