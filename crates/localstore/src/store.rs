//! The store: open, lifecycle, claims, capacity.

use std::collections::{BTreeSet, HashSet};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use rustix::fs::{AtFlags, Mode};
use rustix::io::Errno;

use crate::crash::{CrashPoint, Hook};
use crate::fsio::{self, Entry, WritePoints};
use crate::layout::{self, METADATA_DIR};
use crate::reconcile::{Reconciliation, Unreadable, describe};
use crate::record::{self, ConsumerClaim, CreateRequest, FORMAT_VERSION, VolumeRecord};
use crate::{CapacityRange, Error, NameHash, NodeHash, VolumeId, VolumeState};

/// Default mode of a volume's data directory.
pub const DEFAULT_DATA_DIR_MODE: u32 = 0o750;

/// How to open a [`Store`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    node_name: String,
    reserve_bytes: u64,
    require_mount: bool,
    data_dir_mode: u32,
    hook: Hook,
}

impl StoreOptions {
    /// Options for the node called `node_name` (the Kubernetes node name; it is hashed into every
    /// volume ID and recorded in every record). No reserve, no mount requirement, data directories
    /// with mode [`DEFAULT_DATA_DIR_MODE`].
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            reserve_bytes: 0,
            require_mount: false,
            data_dir_mode: DEFAULT_DATA_DIR_MODE,
            hook: Hook::default(),
        }
    }

    /// Bytes of the store's filesystem that [`Store::capacity`] never offers.
    #[must_use]
    pub fn reserve_bytes(mut self, bytes: u64) -> Self {
        self.reserve_bytes = bytes;
        self
    }

    /// Refuse to open unless the store root is the root of its own filesystem (its mountinfo
    /// entry is mounted exactly at the store path and has root `/`). A production driver sets
    /// this, so that it cannot start against the empty mount point of a disk that is not mounted.
    #[must_use]
    pub fn require_mount(mut self, require: bool) -> Self {
        self.require_mount = require;
        self
    }

    /// Permission bits of new data directories (default [`DEFAULT_DATA_DIR_MODE`]); applied
    /// exactly, regardless of the umask. Only the low 12 bits are used.
    #[must_use]
    pub fn data_dir_mode(mut self, mode: u32) -> Self {
        self.data_dir_mode = mode & 0o7777;
        self
    }

    /// Installs a fault-injection hook, called at every [`CrashPoint`] the store reaches.
    #[cfg(feature = "testing")]
    #[must_use]
    pub fn crash_hook(mut self, hook: crate::CrashHook) -> Self {
        self.hook = Hook { hook: Some(hook) };
        self
    }
}

/// A snapshot of the space a store can offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Bytes available to unprivileged users on the store's filesystem (`f_bavail * f_frsize`).
    pub free_bytes: u64,
    /// The configured reserve.
    pub reserve_bytes: u64,
    /// `free_bytes - reserve_bytes`, never negative: what a create may ask for.
    pub available_bytes: u64,
    /// Inodes available to unprivileged users on the store's filesystem (`f_favail`).
    pub free_inodes: u64,
}

/// How full a filesystem is, as `statvfs(3)` reports it for unprivileged users, in bytes and
/// inodes: what NodeGetVolumeStats reports for a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// The filesystem's size in bytes.
    pub total_bytes: u64,
    /// Bytes in use (`f_blocks - f_bfree` blocks).
    pub used_bytes: u64,
    /// Bytes available to unprivileged users.
    pub available_bytes: u64,
    /// The filesystem's inodes.
    pub total_inodes: u64,
    /// Inodes in use.
    pub used_inodes: u64,
    /// Inodes available to unprivileged users.
    pub available_inodes: u64,
}

impl Usage {
    fn of(st: &rustix::fs::StatVfs) -> Self {
        let block = st.f_frsize;
        Usage {
            total_bytes: st.f_blocks.saturating_mul(block),
            used_bytes: st.f_blocks.saturating_sub(st.f_bfree).saturating_mul(block),
            available_bytes: st.f_bavail.saturating_mul(block),
            total_inodes: st.f_files,
            used_inodes: st.f_files.saturating_sub(st.f_ffree),
            available_inodes: st.f_favail,
        }
    }
}

/// A directory store of local volumes, as laid out in DESIGN.md 3.2.
///
/// A writable store holds an exclusive `flock` on `.metadata/driver.lock` for as long as it
/// lives; dropping it releases the lock, even while a process forked meanwhile has not yet
/// exec'd. All methods take `&self` and the type is `Send + Sync`, so one store can be shared by
/// the threads of a driver (wrap it in an `Arc`). The methods do
/// blocking file I/O (including fsyncs): call them from a blocking context such as
/// `tokio::task::spawn_blocking`.
///
/// The "driver user" that must own `.metadata` is the effective uid of the process.
#[derive(Debug)]
pub struct Store {
    pub(crate) root: PathBuf,
    pub(crate) metadata_path: PathBuf,
    pub(crate) root_fd: OwnedFd,
    pub(crate) metadata_fd: OwnedFd,
    _lock: Option<layout::StoreLock>,
    pub(crate) read_only: bool,
    node_name: String,
    pub(crate) node_hash: NodeHash,
    reserve_bytes: u64,
    data_dir_mode: u32,
    pub(crate) mount_id: u64,
    busy: Mutex<HashSet<VolumeId>>,
    pub(crate) unpublishable: Mutex<BTreeSet<VolumeId>>,
    report: Reconciliation,
    pub(crate) hook: Hook,
}

/// Exclusive right to operate on one volume, released on drop.
///
/// Every mutating store method takes one internally, so a second concurrent operation on the same
/// volume fails at once with [`Error::Busy`]. A driver that must hold a volume across several
/// steps of its own (say, checking the mount table and then claiming) takes the guard with
/// [`Store::lock_volume`] and calls the guard's methods.
#[derive(Debug)]
pub struct VolumeGuard<'a> {
    store: &'a Store,
    volume_id: VolumeId,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded sets are updated by single inserts and removes, so they are consistent even
    // after a panic elsewhere.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Store {
    /// Opens a store for a driver: checks the layout, creates `.metadata` on a fresh store,
    /// takes the exclusive lock (failing at once with [`Error::StoreInUse`] when another opener,
    /// in this process or another, holds it) and reconciles interrupted operations.
    pub fn open(root: impl AsRef<Path>, options: StoreOptions) -> Result<Self, Error> {
        Self::open_mode(root.as_ref(), options, false)
    }

    /// Opens a store for an audit: the same layout checks, but no lock, no reconciliation and no
    /// writes. [`Store::reconciliation`] reports what a writable open would act on. Every
    /// mutating method fails with [`Error::ReadOnly`].
    pub fn open_read_only(root: impl AsRef<Path>, options: StoreOptions) -> Result<Self, Error> {
        Self::open_mode(root.as_ref(), options, true)
    }

    fn open_mode(root: &Path, options: StoreOptions, read_only: bool) -> Result<Self, Error> {
        let node_hash = NodeHash::of(&options.node_name)?;
        let root = layout::normalize(root)?;
        let root_fd = layout::open_root(&root)?;
        let mount_id = fsio::mount_id(root_fd.as_fd()).map_err(|e| Error::io("statx", &root, e))?;
        if options.require_mount {
            layout::require_own_mount(&root, mount_id)?;
        }
        let metadata_path = root.join(METADATA_DIR);
        let metadata_fd = layout::open_metadata(root_fd.as_fd(), &root, !read_only)?;
        let lock = if read_only {
            None
        } else {
            Some(layout::lock(metadata_fd.as_fd(), &metadata_path)?)
        };
        let mut store = Self {
            root,
            metadata_path,
            root_fd,
            metadata_fd,
            _lock: lock,
            read_only,
            node_name: options.node_name,
            node_hash,
            reserve_bytes: options.reserve_bytes,
            data_dir_mode: options.data_dir_mode,
            mount_id,
            busy: Mutex::new(HashSet::new()),
            unpublishable: Mutex::new(BTreeSet::new()),
            report: Reconciliation::default(),
            hook: options.hook,
        };
        store.report = store.reconcile()?;
        Ok(store)
    }

    /// The store root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The node name the store was opened with.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// This node's hash (its topology value).
    pub fn node_hash(&self) -> NodeHash {
        self.node_hash
    }

    /// Whether the store was opened with [`Store::open_read_only`].
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// What reconciliation found and did when the store opened.
    pub fn reconciliation(&self) -> &Reconciliation {
        &self.report
    }

    /// The ID a volume called `name` has on this node.
    pub fn volume_id(&self, name: &str) -> Result<VolumeId, Error> {
        VolumeId::new(self.node_hash, name)
    }

    /// Where a volume's data directory is (whether or not it exists).
    pub fn data_dir(&self, volume_id: &VolumeId) -> PathBuf {
        self.root.join(volume_id.to_string())
    }

    pub(crate) fn record_name(volume_id: &VolumeId) -> String {
        format!("{volume_id}.json")
    }

    pub(crate) fn claim_name(volume_id: &VolumeId) -> String {
        format!("{volume_id}.consumer.json")
    }

    pub(crate) fn record_path(&self, volume_id: &VolumeId) -> PathBuf {
        self.metadata_path.join(Self::record_name(volume_id))
    }

    fn claim_path(&self, volume_id: &VolumeId) -> PathBuf {
        self.metadata_path.join(Self::claim_name(volume_id))
    }

    fn writable(&self) -> Result<(), Error> {
        if self.read_only {
            return Err(Error::ReadOnly {
                path: self.root.clone(),
            });
        }
        Ok(())
    }

    fn local(&self, volume_id: &VolumeId) -> Result<(), Error> {
        if volume_id.node_hash() != self.node_hash {
            return Err(Error::ForeignNode {
                volume_id: *volume_id,
                local: self.node_hash,
            });
        }
        Ok(())
    }

    /// Takes the per-volume guard, or fails at once with [`Error::Busy`]. A volume ID of another
    /// node is refused with [`Error::ForeignNode`].
    pub fn lock_volume(&self, volume_id: &VolumeId) -> Result<VolumeGuard<'_>, Error> {
        self.local(volume_id)?;
        if !lock(&self.busy).insert(*volume_id) {
            return Err(Error::Busy {
                volume_id: *volume_id,
            });
        }
        Ok(VolumeGuard {
            store: self,
            volume_id: *volume_id,
        })
    }

    /// The free space of the store's filesystem minus the reserve.
    ///
    /// This is a snapshot, not a reservation and not a quota: concurrent creates may each see
    /// the same free space, and nothing stops a volume from growing past its requested size.
    pub fn capacity(&self) -> Result<Capacity, Error> {
        let st = rustix::fs::fstatvfs(&self.root_fd)
            .map_err(|e| Error::io("statvfs", &self.root, e.into()))?;
        let free_bytes = st.f_bavail.saturating_mul(st.f_frsize);
        Ok(Capacity {
            free_bytes,
            reserve_bytes: self.reserve_bytes,
            available_bytes: free_bytes.saturating_sub(self.reserve_bytes),
            free_inodes: st.f_favail,
        })
    }

    /// The usage of the store's filesystem.
    pub fn usage(&self) -> Result<Usage, Error> {
        let st = rustix::fs::fstatvfs(&self.root_fd)
            .map_err(|e| Error::io("statvfs", &self.root, e.into()))?;
        Ok(Usage::of(&st))
    }

    /// The usage of the filesystem a volume's data directory is on (its own disk, when the
    /// volume is a mount), reached from the store's root without following a symlink.
    pub fn volume_usage(&self, volume_id: &VolumeId) -> Result<Usage, Error> {
        self.local(volume_id)?;
        let path = self.data_dir(volume_id);
        let dir = fsio::open_dir(self.root_fd.as_fd(), &volume_id.to_string())
            .map_err(|e| Error::io("open", &path, e))?;
        let st = rustix::fs::fstatvfs(&dir).map_err(|e| Error::io("statvfs", &path, e.into()))?;
        Ok(Usage::of(&st))
    }

    /// Checks that the store is still where it was opened: the metadata directory it holds
    /// open still has its name under the root (asked of the kernel's cache, without a
    /// round trip to the filesystem), and the filesystem answers `statvfs`.
    pub fn check(&self) -> Result<(), Error> {
        let held = rustix::fs::fstat(&self.metadata_fd)
            .map_err(|e| Error::io("stat", &self.metadata_path, e.into()))?;
        let named = rustix::fs::statx(
            &self.root_fd,
            METADATA_DIR,
            AtFlags::SYMLINK_NOFOLLOW | AtFlags::STATX_DONT_SYNC,
            rustix::fs::StatxFlags::INO,
        )
        .map_err(|e| match e {
            Errno::NOENT => Error::unsafe_store(&self.metadata_path, "is gone"),
            e => Error::io("stat", &self.metadata_path, e.into()),
        })?;
        let same_dev = (named.stx_dev_major, named.stx_dev_minor)
            == (
                rustix::fs::major(held.st_dev),
                rustix::fs::minor(held.st_dev),
            );
        if named.stx_ino != held.st_ino || !same_dev {
            return Err(Error::unsafe_store(
                &self.metadata_path,
                "is not the metadata directory the store opened",
            ));
        }
        self.capacity().map(drop)
    }

    /// Reads a volume's record, checking that it is consistent with its file name.
    pub fn find(&self, volume_id: &VolumeId) -> Result<Option<VolumeRecord>, Error> {
        self.local(volume_id)?;
        self.read_record(volume_id)
    }

    /// Reads a volume's record; [`Error::NotFound`] when there is none.
    pub fn get(&self, volume_id: &VolumeId) -> Result<VolumeRecord, Error> {
        self.find(volume_id)?.ok_or(Error::NotFound {
            volume_id: *volume_id,
        })
    }

    /// Every readable record of this node's volumes, in volume ID order.
    ///
    /// A record that cannot be read (corrupt, from a newer format, or failing with an I/O error)
    /// is skipped, so one bad file does not hide every other volume from an audit, a volume
    /// listing or a metrics gauge. The records skipped at open are in
    /// [`Store::reconciliation`]'s `unreadable`; [`Store::list_with_problems`] reports the ones
    /// skipped by this scan. Fails only when `.metadata` itself cannot be read.
    pub fn list(&self) -> Result<Vec<VolumeRecord>, Error> {
        self.list_with_problems().map(|(records, _)| records)
    }

    /// Like [`Store::list`], and also returns, from this same scan, every record that was
    /// skipped because it could not be read, with the reason.
    pub fn list_with_problems(&self) -> Result<(Vec<VolumeRecord>, Vec<Unreadable>), Error> {
        let mut records = Vec::new();
        let mut problems = Vec::new();
        for id in self.metadata_ids(".json")? {
            if id.node_hash() != self.node_hash {
                continue;
            }
            match self.read_record(&id) {
                Ok(Some(record)) => records.push(record),
                // Removed between listing and reading.
                Ok(None) => {}
                Err(e) => problems.push(Unreadable {
                    path: self.record_path(&id),
                    reason: describe(&e),
                }),
            }
        }
        Ok((records, problems))
    }

    /// The volume IDs named by files in `.metadata` that end in `suffix` (exactly
    /// `<volume-id><suffix>`), sorted.
    pub(crate) fn metadata_ids(&self, suffix: &str) -> Result<Vec<VolumeId>, Error> {
        let mut ids: Vec<VolumeId> = fsio::list_dir(self.metadata_fd.as_fd(), &self.metadata_path)?
            .into_iter()
            .filter_map(|(name, _)| name.strip_suffix(suffix)?.parse().ok())
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    pub(crate) fn read_record(&self, volume_id: &VolumeId) -> Result<Option<VolumeRecord>, Error> {
        let path = self.record_path(volume_id);
        let Some(bytes) = fsio::read_record_file(
            self.metadata_fd.as_fd(),
            &path,
            &Self::record_name(volume_id),
        )?
        else {
            return Ok(None);
        };
        let record: VolumeRecord = record::parse(&path, &bytes)?;
        let consistent = record.volume_id == *volume_id
            && NameHash::of(&record.name).ok() == Some(volume_id.name_hash())
            && NodeHash::of(&record.node_name).ok() == Some(volume_id.node_hash());
        if !consistent {
            return Err(Error::corrupt(
                &path,
                "its volume id, name or node name does not match its file name",
            ));
        }
        Ok(Some(record))
    }

    pub(crate) fn read_claim(&self, volume_id: &VolumeId) -> Result<Option<ConsumerClaim>, Error> {
        let path = self.claim_path(volume_id);
        let Some(bytes) = fsio::read_record_file(
            self.metadata_fd.as_fd(),
            &path,
            &Self::claim_name(volume_id),
        )?
        else {
            return Ok(None);
        };
        let claim: ConsumerClaim = record::parse(&path, &bytes)?;
        if claim.volume_id != *volume_id || !claim.target.is_absolute() {
            return Err(Error::corrupt(
                &path,
                "its volume id does not match its file name or its target is not absolute",
            ));
        }
        Ok(Some(claim))
    }

    fn write_record(&self, record: &VolumeRecord, points: WritePoints) -> Result<(), Error> {
        let path = self.record_path(&record.volume_id);
        let bytes = record::render(&path, record)?;
        fsio::write_durable(
            self.metadata_fd.as_fd(),
            &self.metadata_path,
            &Self::record_name(&record.volume_id),
            &bytes,
            points,
            &self.hook,
        )
    }

    pub(crate) fn remove_record(
        &self,
        volume_id: &VolumeId,
        removed: CrashPoint,
    ) -> Result<(), Error> {
        fsio::unlink(
            self.metadata_fd.as_fd(),
            &self.record_path(volume_id),
            &Self::record_name(volume_id),
        )?;
        self.hook.reach(removed);
        fsio::fsync_dir(self.metadata_fd.as_fd(), &self.metadata_path)
    }

    /// Creates a volume, or returns the existing one when a volume of that name exists and the
    /// request is compatible with it (its capacity lies in the requested range, and the
    /// capabilities and parameters are equal).
    ///
    /// Steps: the record is written durably in state `creating`, then the data directory is
    /// made and made durable, then the record becomes `ready`. A request for more bytes than
    /// [`Store::capacity`] offers fails with [`Error::CapacityExhausted`]; nothing is written
    /// before every check has passed. A data directory that exists without a record is never
    /// adopted ([`Error::UnexpectedData`]).
    pub fn create(&self, request: &CreateRequest) -> Result<VolumeRecord, Error> {
        self.writable()?;
        request.validate()?;
        let volume_id = self.volume_id(&request.name)?;
        let guard = self.lock_volume(&volume_id)?;
        if let Some(existing) = self.read_record(&volume_id)? {
            check_compatible(&existing, request)?;
            return match existing.state {
                VolumeState::Ready => Ok(existing),
                // An earlier attempt failed in this process and could not roll back; finish it.
                VolumeState::Creating => self.finish_create(existing, false),
                VolumeState::Deleting => Err(Error::NotReady {
                    volume_id,
                    state: existing.state,
                }),
            };
        }
        let data_name = volume_id.to_string();
        if fsio::entry(self.root_fd.as_fd(), &self.data_dir(&volume_id), &data_name)?
            != Entry::Missing
        {
            return Err(Error::UnexpectedData {
                volume_id,
                path: self.data_dir(&volume_id),
                problem: "exists without a record; it is left for an operator",
            });
        }
        let required = request.capacity.map_or(0, |r| r.required_bytes);
        if required > 0 {
            let capacity = self.capacity()?;
            if required > capacity.available_bytes {
                return Err(Error::CapacityExhausted {
                    requested_bytes: required,
                    available_bytes: capacity.available_bytes,
                });
            }
        }
        let record = VolumeRecord {
            format_version: FORMAT_VERSION,
            volume_id,
            name: request.name.clone(),
            node_name: self.node_name.clone(),
            capacity_bytes: CapacityRange::recorded_capacity(request.capacity.as_ref()),
            capabilities: request.capabilities.clone(),
            parameters: request.parameters.clone(),
            state: VolumeState::Creating,
        };
        self.write_record(
            &record,
            WritePoints {
                temp_written: CrashPoint::CreateRecordTempWritten,
                renamed: CrashPoint::CreateRecordRenamed,
                durable: CrashPoint::CreateRecordDurable,
            },
        )?;
        let result = self.finish_create(record, true);
        if let Err(e) = &result {
            // A directory that appeared under us is not ours to remove.
            let made_dir = !matches!(e, Error::UnexpectedData { .. });
            self.roll_back_create(&volume_id, made_dir);
        }
        drop(guard);
        result
    }

    /// Best effort after a failed create in this process: remove the (empty) data directory if
    /// this attempt made it, then the record. Whatever fails here stays `creating`, which the
    /// next create of the same name or the next open finishes.
    fn roll_back_create(&self, volume_id: &VolumeId, made_dir: bool) {
        let name = volume_id.to_string();
        if made_dir {
            match rustix::fs::unlinkat(&self.root_fd, name.as_str(), AtFlags::REMOVEDIR) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(_) => return,
            }
        }
        if fsio::fsync_dir(self.root_fd.as_fd(), &self.root).is_ok() {
            let _ = fsio::unlink(
                self.metadata_fd.as_fd(),
                &self.record_path(volume_id),
                &Self::record_name(volume_id),
            );
            let _ = fsio::fsync_dir(self.metadata_fd.as_fd(), &self.metadata_path);
        }
    }

    fn finish_create(&self, mut record: VolumeRecord, fresh: bool) -> Result<VolumeRecord, Error> {
        let volume_id = record.volume_id;
        let name = volume_id.to_string();
        let path = self.data_dir(&volume_id);
        match rustix::fs::mkdirat(&self.root_fd, name.as_str(), Mode::from_raw_mode(0o700)) {
            Ok(()) => {}
            Err(Errno::EXIST) if !fresh => {}
            Err(Errno::EXIST) => {
                return Err(Error::UnexpectedData {
                    volume_id,
                    path,
                    problem: "appeared while the volume was being created",
                });
            }
            Err(e) => return Err(Error::io("create directory", path, e.into())),
        }
        let dir = fsio::open_dir(self.root_fd.as_fd(), &name).map_err(|e| {
            if e.raw_os_error() == Some(Errno::LOOP.raw_os_error())
                || e.raw_os_error() == Some(Errno::NOTDIR.raw_os_error())
            {
                Error::UnexpectedData {
                    volume_id,
                    path: path.clone(),
                    problem: "is not a directory",
                }
            } else {
                Error::io("open directory", &path, e)
            }
        })?;
        rustix::fs::fchmod(&dir, Mode::from_raw_mode(self.data_dir_mode))
            .map_err(|e| Error::io("chmod", &path, e.into()))?;
        drop(dir);
        self.hook.reach(CrashPoint::CreateDataDirMade);
        fsio::fsync_dir(self.root_fd.as_fd(), &self.root)?;
        self.hook.reach(CrashPoint::CreateDataDirDurable);
        record.state = VolumeState::Ready;
        self.write_record(
            &record,
            WritePoints {
                temp_written: CrashPoint::CreateReadyTempWritten,
                renamed: CrashPoint::CreateReadyRenamed,
                durable: CrashPoint::CreateReadyDurable,
            },
        )?;
        Ok(record)
    }

    /// Deletes a volume: the record becomes `deleting`, the data directory is removed without
    /// following symlinks or crossing into another mount, then the record is removed. A volume
    /// that does not exist is success; a volume ID of another node is refused with
    /// [`Error::ForeignNode`] and nothing is touched; a claimed volume is refused with
    /// [`Error::Claimed`].
    pub fn delete(&self, volume_id: &VolumeId) -> Result<(), Error> {
        self.writable()?;
        self.lock_volume(volume_id)?.delete()
    }

    /// Records that a trusted consumer owns the volume for `target`, durably, before the driver
    /// makes any mount. Claiming again for the same target returns the existing claim; a claim
    /// for another target fails with [`Error::ClaimConflict`] while the first exists.
    pub fn claim(&self, volume_id: &VolumeId, target: &Path) -> Result<ConsumerClaim, Error> {
        self.writable()?;
        self.lock_volume(volume_id)?.claim(target)
    }

    /// Removes the claim held by `target`, whether or not a mount exists. No claim is success; a
    /// claim held by another target fails with [`Error::ClaimConflict`].
    pub fn release(&self, volume_id: &VolumeId, target: &Path) -> Result<(), Error> {
        self.writable()?;
        self.lock_volume(volume_id)?.release(target)
    }

    /// The claim on one volume, if any.
    pub fn claim_of(&self, volume_id: &VolumeId) -> Result<Option<ConsumerClaim>, Error> {
        self.local(volume_id)?;
        self.read_claim(volume_id)
    }

    /// Every claim on this node's volumes, in volume ID order. Fails on the first unreadable
    /// claim.
    pub fn claims(&self) -> Result<Vec<ConsumerClaim>, Error> {
        let mut out = Vec::new();
        for id in self.metadata_ids(".consumer.json")? {
            if id.node_hash() != self.node_hash {
                continue;
            }
            if let Some(claim) = self.read_claim(&id)? {
                out.push(claim);
            }
        }
        Ok(out)
    }

    /// The data directory to publish, after checking that the volume is ready and that its data
    /// directory exists as a real directory. Never creates it: a missing directory may mean a
    /// missing disk. A volume found without its data directory when the store opened stays
    /// unpublishable until the store is reopened, even if a directory reappears meanwhile.
    pub fn publish_path(&self, volume_id: &VolumeId) -> Result<PathBuf, Error> {
        let record = self.get(volume_id)?;
        if record.state != VolumeState::Ready {
            return Err(Error::NotReady {
                volume_id: *volume_id,
                state: record.state,
            });
        }
        let path = self.data_dir(volume_id);
        if lock(&self.unpublishable).contains(volume_id) {
            return Err(Error::Unpublishable {
                volume_id: *volume_id,
                path,
                reason: "was missing when the store opened",
            });
        }
        match fsio::entry(self.root_fd.as_fd(), &path, &volume_id.to_string())? {
            Entry::Directory => Ok(path),
            Entry::Missing => Err(Error::Unpublishable {
                volume_id: *volume_id,
                path,
                reason: "is missing",
            }),
            Entry::Other => Err(Error::Unpublishable {
                volume_id: *volume_id,
                path,
                reason: "is not a directory",
            }),
        }
    }

    /// Volumes whose data directory was missing when the store opened.
    pub fn unpublishable(&self) -> Vec<VolumeId> {
        lock(&self.unpublishable).iter().copied().collect()
    }

    /// Removes a volume's data directory if it exists, and makes the removal durable.
    pub(crate) fn remove_data(&self, volume_id: &VolumeId) -> Result<(), Error> {
        let name = volume_id.to_string();
        let path = self.data_dir(volume_id);
        match fsio::entry(self.root_fd.as_fd(), &path, &name)? {
            Entry::Missing => return Ok(()),
            Entry::Other => {
                return Err(Error::UnexpectedData {
                    volume_id: *volume_id,
                    path,
                    problem: "is not a directory; refusing to remove it",
                });
            }
            Entry::Directory => {}
        }
        fsio::remove_tree(
            self.root_fd.as_fd(),
            &self.root,
            &name,
            self.mount_id,
            *volume_id,
            &self.hook,
            CrashPoint::DeleteDataPartlyRemoved,
        )?;
        self.hook.reach(CrashPoint::DeleteDataDirRemoved);
        fsio::fsync_dir(self.root_fd.as_fd(), &self.root)?;
        self.hook.reach(CrashPoint::DeleteDataDirDurable);
        Ok(())
    }
}

fn check_compatible(existing: &VolumeRecord, request: &CreateRequest) -> Result<(), Error> {
    let what = if !request
        .capacity
        .unwrap_or_default()
        .contains(existing.capacity_bytes)
    {
        "capacity"
    } else if existing.capabilities != request.capabilities {
        "capabilities"
    } else if existing.parameters != request.parameters {
        "parameters"
    } else {
        return Ok(());
    };
    Err(Error::Incompatible {
        volume_id: existing.volume_id,
        what,
    })
}

fn validate_target(target: &Path) -> Result<(), Error> {
    let shown = || target.to_string_lossy().into_owned();
    let invalid = |reason| Error::InvalidArgument {
        field: "consumer target",
        value: crate::id::truncated(&shown()),
        reason,
    };
    let Some(s) = target.to_str() else {
        return Err(invalid("must be UTF-8"));
    };
    if s.contains('\0') {
        return Err(invalid("must not contain NUL"));
    }
    if !target.is_absolute() {
        return Err(invalid("must be an absolute path"));
    }
    Ok(())
}

impl VolumeGuard<'_> {
    /// The guarded volume.
    pub fn volume_id(&self) -> VolumeId {
        self.volume_id
    }

    /// The volume's record, if any.
    pub fn record(&self) -> Result<Option<VolumeRecord>, Error> {
        self.store.read_record(&self.volume_id)
    }

    /// [`Store::delete`] under this guard.
    pub fn delete(&self) -> Result<(), Error> {
        let store = self.store;
        store.writable()?;
        let volume_id = self.volume_id;
        let Some(mut record) = store.read_record(&volume_id)? else {
            return Ok(());
        };
        if let Some(claim) = store.read_claim(&volume_id)? {
            return Err(Error::Claimed {
                volume_id,
                target: claim.target,
            });
        }
        if record.state != VolumeState::Deleting {
            record.state = VolumeState::Deleting;
            store.write_record(
                &record,
                WritePoints {
                    temp_written: CrashPoint::DeleteRecordTempWritten,
                    renamed: CrashPoint::DeleteRecordRenamed,
                    durable: CrashPoint::DeleteRecordDurable,
                },
            )?;
        }
        store.remove_data(&volume_id)?;
        store.remove_record(&volume_id, CrashPoint::DeleteRecordRemoved)?;
        lock(&store.unpublishable).remove(&volume_id);
        Ok(())
    }

    /// [`Store::claim`] under this guard.
    pub fn claim(&self, target: &Path) -> Result<ConsumerClaim, Error> {
        let store = self.store;
        store.writable()?;
        validate_target(target)?;
        let volume_id = self.volume_id;
        let record = store
            .read_record(&volume_id)?
            .ok_or(Error::NotFound { volume_id })?;
        if record.state != VolumeState::Ready {
            return Err(Error::NotReady {
                volume_id,
                state: record.state,
            });
        }
        if let Some(existing) = store.read_claim(&volume_id)? {
            if existing.target == target {
                return Ok(existing);
            }
            return Err(Error::ClaimConflict {
                volume_id,
                existing: existing.target,
                requested: target.to_owned(),
            });
        }
        let claim = ConsumerClaim {
            format_version: FORMAT_VERSION,
            volume_id,
            target: target.to_owned(),
        };
        let path = store.claim_path(&volume_id);
        let bytes = record::render(&path, &claim)?;
        fsio::write_durable(
            store.metadata_fd.as_fd(),
            &store.metadata_path,
            &Store::claim_name(&volume_id),
            &bytes,
            WritePoints {
                temp_written: CrashPoint::ClaimTempWritten,
                renamed: CrashPoint::ClaimRenamed,
                durable: CrashPoint::ClaimDurable,
            },
            &store.hook,
        )?;
        Ok(claim)
    }

    /// [`Store::release`] under this guard.
    pub fn release(&self, target: &Path) -> Result<(), Error> {
        let store = self.store;
        store.writable()?;
        validate_target(target)?;
        let volume_id = self.volume_id;
        let Some(existing) = store.read_claim(&volume_id)? else {
            return Ok(());
        };
        if existing.target != target {
            return Err(Error::ClaimConflict {
                volume_id,
                existing: existing.target,
                requested: target.to_owned(),
            });
        }
        fsio::unlink(
            store.metadata_fd.as_fd(),
            &store.claim_path(&volume_id),
            &Store::claim_name(&volume_id),
        )?;
        store.hook.reach(CrashPoint::ReleaseClaimRemoved);
        fsio::fsync_dir(store.metadata_fd.as_fd(), &store.metadata_path)?;
        store.hook.reach(CrashPoint::ReleaseDurable);
        Ok(())
    }
}

impl Drop for VolumeGuard<'_> {
    fn drop(&mut self) {
        lock(&self.store.busy).remove(&self.volume_id);
    }
}
