//! Named steps of every mutating operation, for fault injection.
//!
//! With the `testing` feature a hook installed through
//! [`StoreOptions::crash_hook`](crate::StoreOptions::crash_hook) is called at each step; a test
//! stops the operation there (by panicking in-process, or by pausing a child process and killing
//! it) and then reopens the store to check what reconciliation makes of it. Without the feature
//! the calls compile to nothing.

use std::fmt;
#[cfg(feature = "testing")]
use std::sync::Arc;

/// A step inside a mutating operation, reached just after the action it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrashPoint {
    /// Create: the `creating` record's temp file is written and fsynced, not yet renamed.
    CreateRecordTempWritten,
    /// Create: the `creating` record is renamed into place; the directory is not yet fsynced.
    CreateRecordRenamed,
    /// Create: the `creating` record is durable.
    CreateRecordDurable,
    /// Create: the data directory exists; the store root is not yet fsynced.
    CreateDataDirMade,
    /// Create: the data directory is durable.
    CreateDataDirDurable,
    /// Create: the `ready` record's temp file is written, not yet renamed.
    CreateReadyTempWritten,
    /// Create: the `ready` record is renamed into place, the directory not yet fsynced.
    CreateReadyRenamed,
    /// Create: the `ready` record is durable; the operation is about to return.
    CreateReadyDurable,
    /// Delete: the `deleting` record's temp file is written, not yet renamed.
    DeleteRecordTempWritten,
    /// Delete: the `deleting` record is renamed into place, the directory not yet fsynced.
    DeleteRecordRenamed,
    /// Delete: the `deleting` record is durable.
    DeleteRecordDurable,
    /// Delete: the first entry inside the data directory has been removed.
    DeleteDataPartlyRemoved,
    /// Delete: the data directory is gone; the store root is not yet fsynced.
    DeleteDataDirRemoved,
    /// Delete: the removal of the data directory is durable.
    DeleteDataDirDurable,
    /// Delete: the record is unlinked; its directory is not yet fsynced.
    DeleteRecordRemoved,
    /// Claim: the claim's temp file is written, not yet renamed.
    ClaimTempWritten,
    /// Claim: the claim is renamed into place, the directory not yet fsynced.
    ClaimRenamed,
    /// Claim: the claim is durable.
    ClaimDurable,
    /// Release: the claim is unlinked; its directory is not yet fsynced.
    ReleaseClaimRemoved,
    /// Release: the removal is durable.
    ReleaseDurable,
}

impl CrashPoint {
    /// Every step of a create, in order.
    pub const CREATE: &'static [Self] = &[
        Self::CreateRecordTempWritten,
        Self::CreateRecordRenamed,
        Self::CreateRecordDurable,
        Self::CreateDataDirMade,
        Self::CreateDataDirDurable,
        Self::CreateReadyTempWritten,
        Self::CreateReadyRenamed,
        Self::CreateReadyDurable,
    ];
    /// Every step of a delete, in order. `DeleteDataPartlyRemoved` is reached only when the data
    /// directory holds something.
    pub const DELETE: &'static [Self] = &[
        Self::DeleteRecordTempWritten,
        Self::DeleteRecordRenamed,
        Self::DeleteRecordDurable,
        Self::DeleteDataPartlyRemoved,
        Self::DeleteDataDirRemoved,
        Self::DeleteDataDirDurable,
        Self::DeleteRecordRemoved,
    ];
    /// Every step of a claim, in order.
    pub const CLAIM: &'static [Self] = &[
        Self::ClaimTempWritten,
        Self::ClaimRenamed,
        Self::ClaimDurable,
    ];
    /// Every step of a release, in order.
    pub const RELEASE: &'static [Self] = &[Self::ReleaseClaimRemoved, Self::ReleaseDurable];
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The function a test installs: called with each step as the store reaches it.
#[cfg(feature = "testing")]
pub type CrashHook = Arc<dyn Fn(CrashPoint) + Send + Sync>;

/// The installed hook, if any.
#[derive(Clone, Default)]
pub(crate) struct Hook {
    #[cfg(feature = "testing")]
    pub(crate) hook: Option<CrashHook>,
}

impl Hook {
    #[cfg_attr(not(feature = "testing"), allow(clippy::unused_self))]
    #[inline]
    pub(crate) fn reach(&self, point: CrashPoint) {
        #[cfg(feature = "testing")]
        if let Some(hook) = &self.hook {
            hook(point);
        }
        #[cfg(not(feature = "testing"))]
        let _ = point;
    }
}

impl fmt::Debug for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        #[cfg(feature = "testing")]
        let installed = self.hook.is_some();
        #[cfg(not(feature = "testing"))]
        let installed = false;
        f.debug_struct("Hook")
            .field("installed", &installed)
            .finish()
    }
}
