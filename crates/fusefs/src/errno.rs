//! The one mapping from protocol failures to the errno an application sees.

use lease_client::{Error, Refusal};

/// The largest errno the kernel accepts in a FUSE reply: it refuses a reply whose error is
/// `-512` (`ERESTARTSYS`) or below with `EINVAL` and leaves the request unanswered, so
/// anything outside `1..=MAX_ERRNO` becomes `EIO`.
pub const MAX_ERRNO: i32 = 511;

/// A positive Linux errno, already clamped to the range the kernel accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(i32);

impl Errno {
    /// `errno` if it is one the kernel accepts, else `EIO`.
    pub fn clamped(errno: i32) -> Errno {
        if (1..=MAX_ERRNO).contains(&errno) {
            Errno(errno)
        } else {
            Errno(libc::EIO)
        }
    }

    /// The raw value.
    pub fn raw(self) -> i32 {
        self.0
    }
}

/// The errno for a failed call. Exhaustive by design: a new failure must be given one.
///
/// | failure | errno | why |
/// | --- | --- | --- |
/// | the worker's own errno | that errno, clamped | the filesystem said so |
/// | stale mount epoch | `EIO` | another node holds the volume; this mount is fenced |
/// | wrong volume generation or access mode | `ESTALE` | the mount names a volume that is gone |
/// | unknown volume | `ENODEV` | the volume does not exist on the workers |
/// | no worker answered within the budget | `ETIMEDOUT` | nothing is known to have happened |
/// | uncertain outcome | `EIO` | the operation may or may not have been applied |
/// | too many calls in flight for the budget | `EAGAIN` | nothing was sent |
/// | credentials refused | `EACCES` | the mount's credentials are not accepted |
/// | anything else (a protocol or local failure) | `EIO` | |
#[deny(clippy::wildcard_enum_match_arm)]
pub fn errno_of(error: &Error) -> Errno {
    match error {
        Error::Refused { refusal, .. } => match refusal {
            Refusal::Errno(errno) => Errno::clamped(*errno),
            Refusal::StaleEpoch => Errno(libc::EIO),
            Refusal::IdentityMismatch => Errno(libc::ESTALE),
            Refusal::UnknownVolume => Errno(libc::ENODEV),
            // A file operation never claims; a lease refusal here is a protocol surprise.
            Refusal::LeaseHeld { .. } => Errno(libc::EIO),
            Refusal::InvalidRequest => Errno(libc::EINVAL),
            Refusal::TooLarge => Errno(libc::EFBIG),
        },
        Error::Unavailable { .. } => Errno(libc::ETIMEDOUT),
        Error::Uncertain { .. } => Errno(libc::EIO),
        Error::Busy { .. } => Errno(libc::EAGAIN),
        Error::Unauthorized { .. } => Errno(libc::EACCES),
        Error::InvalidRequest { .. } => Errno(libc::EINVAL),
        Error::Rejected { .. } | Error::UnexpectedReply { .. } | Error::Random(_) => {
            Errno(libc::EIO)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_outside_the_kernel_range_become_eio() {
        for bad in [0, -1, -5, 512, 4095, i32::MAX, i32::MIN] {
            assert_eq!(Errno::clamped(bad).raw(), libc::EIO, "{bad}");
        }
        assert_eq!(Errno::clamped(libc::ENOENT).raw(), libc::ENOENT);
        assert_eq!(Errno::clamped(511).raw(), 511);
    }

    #[test]
    fn worker_errnos_pass_through_clamped() {
        let refused = |refusal| Error::Refused {
            volume_id: "v".into(),
            op: "lookup",
            refusal,
        };
        assert_eq!(
            errno_of(&refused(Refusal::Errno(libc::ENOTEMPTY))).raw(),
            libc::ENOTEMPTY
        );
        assert_eq!(errno_of(&refused(Refusal::Errno(70_000))).raw(), libc::EIO);
        assert_eq!(errno_of(&refused(Refusal::StaleEpoch)).raw(), libc::EIO);
        assert_eq!(
            errno_of(&refused(Refusal::IdentityMismatch)).raw(),
            libc::ESTALE
        );
    }
}
