//! Creating and deleting volumes on a running leader: the manager's side of the worker.
//!
//! Creates and deletes hold one mutex (`Shared::admin`) from their first look at the registry
//! to their last file operation, so two of them never interleave: a create never sees a
//! volume half deleted, and two creates of the same new volume never both create it. Calls on
//! the wire never take that mutex.
//!
//! A delete, in order: the volume leaves the registry (new calls get UNKNOWN_VOLUME at once);
//! its apply loop gets [`Command::Stop`], drops the volume (its open descriptors) and refuses
//! what was queued behind the stop; the volume's directory moves into `<state-dir>/trash/` by
//! one rename; the trash entry is removed. A crash before the rename leaves the volume whole; a
//! crash after it leaves a trash entry, which the next start of a leader removes.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::VolumeSpec;
use crate::config::Role;
use crate::error::Error;
use crate::meta;
use crate::server::{Shared, register};
use crate::volume::Command;

/// A cloneable handle for managing the volumes of a running leader (what a manager or the
/// reference CSI controller uses in-process).
///
/// Get one with [`Server::admin`](crate::Server::admin). It may outlive its server: once the
/// server has stopped, creating and deleting return [`Error::Stopped`] and
/// [`Admin::volume`] finds nothing.
#[derive(Clone)]
pub struct Admin {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("role", &self.shared.config.role)
            .finish_non_exhaustive()
    }
}

/// What a delete found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    /// It existed and is gone.
    Removed,
    /// There was no such volume.
    Absent,
}

impl Admin {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Creates a volume, or checks that an existing one has this identity (leader only).
    /// Blocking file I/O: call from a blocking context (spawn_blocking) in async code.
    ///
    /// # Errors
    /// [`Error::InvalidVolumeId`]; [`Error::UnknownVolume`] on a follower (it holds no
    /// volumes); [`Error::IdentityMismatch`] when the volume exists with another generation
    /// or access mode; [`Error::Stopped`] once the server has stopped; [`Error::Io`] or
    /// [`Error::Corrupt`] from the state directory.
    pub fn create_volume(&self, spec: &VolumeSpec) -> Result<(), Error> {
        create_volume(&self.shared, spec)
    }

    /// The identity of a volume this leader serves, if any.
    pub fn volume(&self, volume_id: &str) -> Option<VolumeSpec> {
        self.shared
            .volumes
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(volume_id)
            .map(|r| r.spec.clone())
    }

    /// Deletes a volume: its apply loop is stopped, its state and data removed. Idempotent.
    ///
    /// Calls that reach the volume after the delete began get UNKNOWN_VOLUME, those queued
    /// before it are answered, and none hangs. A directory left by a create that never
    /// finished (no identity yet) is removed too, and counts as [`Deleted::Removed`]. The
    /// work runs on tokio's blocking pool and finishes even when this future is dropped.
    ///
    /// # Errors
    /// [`Error::InvalidVolumeId`]; [`Error::UnknownVolume`] on a follower (as a create
    /// there); [`Error::Stopped`] once the server has stopped; [`Error::Io`] when the
    /// directory cannot be moved or removed. After a failed removal the volume is already
    /// unreachable; the next start of the leader removes what is left.
    pub async fn delete_volume(&self, volume_id: &str) -> Result<Deleted, Error> {
        check_request(&self.shared, volume_id)?;
        let shared = Arc::clone(&self.shared);
        let id = volume_id.to_owned();
        match tokio::task::spawn_blocking(move || delete_volume(&shared, &id)).await {
            Ok(deleted) => deleted,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            // Only a runtime that is shutting down cancels a blocking task.
            Err(_) => Err(Error::Stopped {
                volume_id: volume_id.to_owned(),
            }),
        }
    }
}

/// What a create and a delete check before anything else: the ID, and that this is a leader.
fn check_request(shared: &Shared, volume_id: &str) -> Result<(), Error> {
    meta::validate_volume_id(volume_id)?;
    if let Role::Follower { .. } = shared.config.role {
        return Err(Error::UnknownVolume {
            volume_id: volume_id.to_owned(),
        });
    }
    Ok(())
}

pub(crate) fn create_volume(shared: &Arc<Shared>, spec: &VolumeSpec) -> Result<(), Error> {
    check_request(shared, &spec.volume_id)?;
    let _admin = shared
        .admin
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let existing = shared
        .volumes
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&spec.volume_id)
        .map(|r| r.spec.clone());
    if let Some(existing) = existing {
        if &existing != spec {
            return Err(Error::IdentityMismatch {
                existing,
                requested: spec.clone(),
            });
        }
        return Ok(());
    }
    if shared.is_stopped() {
        return Err(Error::Stopped {
            volume_id: spec.volume_id.clone(),
        });
    }
    meta::create(
        &meta::volume_dir(&shared.config.state_dir, &spec.volume_id),
        spec,
    )?;
    register(shared, spec)
}

/// The blocking part of a delete, under the admin mutex.
fn delete_volume(shared: &Shared, volume_id: &str) -> Result<Deleted, Error> {
    let _admin = shared
        .admin
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if shared.is_stopped() {
        return Err(Error::Stopped {
            volume_id: volume_id.to_owned(),
        });
    }
    let registered = shared
        .volumes
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .remove(volume_id);
    let was_registered = registered.is_some();
    if let Some(registered) = registered {
        stop_apply_loop(registered.tx);
    }
    let state_dir = &shared.config.state_dir;
    let moved = meta::move_to_trash(state_dir, volume_id)?;
    if let Some(name) = &moved {
        meta::remove_from_trash(state_dir, name)?;
    }
    let deleted = if was_registered || moved.is_some() {
        Deleted::Removed
    } else {
        Deleted::Absent
    };
    tracing::info!(
        volume = %volume_id,
        existed = deleted == Deleted::Removed,
        "volume deleted"
    );
    Ok(deleted)
}

/// Stops a volume's apply loop and waits until it has dropped the volume. A loop that has
/// already ended (its thread panicked) has dropped it as well.
fn stop_apply_loop(tx: mpsc::Sender<Command>) {
    let (done, stopped) = oneshot::channel();
    if tx.blocking_send(Command::Stop { done }).is_ok() {
        let _ = stopped.blocking_recv();
    }
}
