//! INIT: which features a fresh session agrees to, and why. The one place that decides.

use fuse_wire::{InitFlags, InitIn, InitOut, KERNEL_VERSION, OLDEST_SUPPORTED_MINOR};

use crate::{Error, MountOptions};

/// The INIT flags a session agrees to whenever the kernel offers them, on every mount.
/// [`negotiate`] explains each, and what is left out.
pub const AGREED: InitFlags = InitFlags::ASYNC_READ
    .union(InitFlags::BIG_WRITES)
    .union(InitFlags::PARALLEL_DIROPS)
    .union(InitFlags::MAX_PAGES)
    .union(InitFlags::DO_READDIRPLUS)
    .union(InitFlags::EXPORT_SUPPORT);

/// Answers the kernel's INIT: the reply to write, or a refusal (the caller then answers
/// `EPROTO`, which fails the connection).
///
/// Refused: a major version other than 7, and a minor older than
/// [`OLDEST_SUPPORTED_MINOR`] (7.12), whose request layouts `fuse_wire` does not decode.
///
/// The reply takes the smaller of the two minors, the kernel's `max_readahead`, `max_write`
/// from the options, `max_pages` = `max_write` in pages (rounded up), a 1 ns timestamp
/// granularity, and the background limits from the options (0 keeps the kernel's).
///
/// Flags agreed to when offered ([`AGREED`], plus one option):
///
/// - `ASYNC_READ`: the kernel may send several READs of one file at once (readahead among
///   them). Every request is handled on its own task, so they run concurrently.
/// - `BIG_WRITES`: WRITEs larger than one page, up to `max_write` (the kernel has assumed it
///   since 4.20; older kernels need it said).
/// - `PARALLEL_DIROPS`: lookups and readdirs in one directory are not serialised by the
///   kernel. A handler must be safe under concurrency anyway (the loop runs every request on
///   its own task).
/// - `MAX_PAGES`: makes `max_pages` count, so one request can carry `max_write` bytes instead
///   of the kernel's default of 32 pages.
/// - `DO_READDIRPLUS`: directory listings are READDIRPLUS (entries with their attributes), one
///   request instead of a READDIR and a LOOKUP per entry. Without `READDIRPLUS_AUTO`, which is
///   left out, the kernel uses it for every listing, so a handler answers one kind.
/// - `EXPORT_SUPPORT`: `name_to_handle_at`/`open_by_handle_at` and NFS export work; the kernel
///   may send LOOKUP of `.` and `..` in a node. A handler that does not know them answers
///   `ENOENT`, which the caller sees as `ESTALE`: nothing else changes.
/// - `ATOMIC_O_TRUNC`, only with [`MountOptions::atomic_o_trunc`]: the handler truncates in
///   OPEN. Without it the kernel sends a SETATTR of size 0 before the OPEN.
///
/// Left out, on purpose:
///
/// - `WRITEBACK_CACHE`: the kernel would keep written data and acknowledge writes before the
///   filesystem sees them, and own mtime and size: a crash of the owner could then lose
///   acknowledged writes.
/// - `SPLICE_READ`, `SPLICE_WRITE`, `SPLICE_MOVE`: the loop reads and writes with plain
///   `read` and `write`.
/// - `PASSTHROUGH`: needs backing files on this host; a replicated volume has none.
/// - `OVER_IO_URING`: a ring cannot be handed to a successor (no hand-off for it exists in
///   the kernel), and hand-off is this crate's purpose.
/// - `POSIX_LOCKS`, `FLOCK_LOCKS`: the kernel keeps locks local to this host.
/// - `AUTO_INVAL_DATA`, `EXPLICIT_INVAL_DATA`, `CACHE_SYMLINKS`, `READDIRPLUS_AUTO`,
///   `ASYNC_DIO`, `NO_OPEN_SUPPORT`, `NO_OPENDIR_SUPPORT`, `DONT_MASK`, `HANDLE_KILLPRIV`,
///   `HANDLE_KILLPRIV_V2`, `POSIX_ACL`, `SETXATTR_EXT`, `SECURITY_CTX`, `CREATE_SUPP_GROUP`,
///   `ALLOW_IDMAP`, `DIRECT_IO_ALLOW_MMAP`, `SUBMOUNTS`, DAX (`MAP_ALIGNMENT`,
///   `HAS_INODE_DAX`), `REQUEST_TIMEOUT`: each changes what the handler must do (caching,
///   privilege clearing, ACLs, request extensions) or what the kernel does on a slow answer
///   (a request timeout aborts the connection, which a hand-off pause must never do). Each
///   can be added here, named, when a handler needs it.
///
/// `HAS_RESEND` and `HAS_EXPIRE_ONLY` are the kernel's capabilities, not agreements: the
/// [`InitRecord`](fuse_wire::InitRecord) keeps what the kernel offered
/// ([`has_resend`](fuse_wire::InitRecord::has_resend)).
pub fn negotiate(init: &InitIn<'_>, options: &MountOptions) -> Result<InitOut, Error> {
    if init.major != KERNEL_VERSION || init.minor < OLDEST_SUPPORTED_MINOR {
        return Err(Error::UnsupportedProtocol {
            major: init.major,
            minor: init.minor,
        });
    }
    let mut wanted = AGREED;
    if options.atomic_o_trunc {
        wanted |= InitFlags::ATOMIC_O_TRUNC;
    }
    Ok(InitOut {
        major: KERNEL_VERSION,
        minor: init.reply_minor(),
        max_readahead: init.max_readahead,
        flags: init.capabilities() & wanted,
        max_background: options.max_background,
        congestion_threshold: options.congestion_threshold,
        max_write: options.max_write,
        time_gran: 1,
        max_pages: pages(options.max_write, rustix::param::page_size()),
        map_alignment: 0,
        max_stack_depth: 0,
        request_timeout: 0,
    })
}

/// `max_write` in pages of `page_size` bytes, rounded up, at least 1.
fn pages(max_write: u32, page_size: usize) -> u16 {
    let pages = (max_write as usize).div_ceil(page_size.max(1)).max(1);
    u16::try_from(pages).unwrap_or(u16::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fuse_wire::InitInLayout;

    fn offer(major: u32, minor: u32, flags: InitFlags) -> InitIn<'static> {
        InitIn {
            major,
            minor,
            max_readahead: 131_072,
            flags: flags.low(),
            flags2: flags.high(),
            unused: [0; 11],
            layout: InitInLayout::Extended,
            extra: &[],
        }
    }

    /// What Linux 6.18 offers, roughly: everything up to bit 42.
    fn everything() -> InitFlags {
        InitFlags((1 << 43) - 1).union(InitFlags::INIT_EXT)
    }

    #[test]
    fn agrees_to_exactly_the_named_flags() {
        let options = MountOptions::new("t");
        let out = negotiate(&offer(7, 45, everything()), &options).unwrap();
        assert_eq!(out.flags, AGREED);
        for left_out in [
            InitFlags::WRITEBACK_CACHE,
            InitFlags::SPLICE_READ,
            InitFlags::SPLICE_WRITE,
            InitFlags::SPLICE_MOVE,
            InitFlags::PASSTHROUGH,
            InitFlags::OVER_IO_URING,
            InitFlags::ATOMIC_O_TRUNC,
            InitFlags::POSIX_LOCKS,
            InitFlags::REQUEST_TIMEOUT,
        ] {
            assert!(!out.flags.intersects(left_out), "{left_out:?}");
        }
        let trunc = MountOptions {
            atomic_o_trunc: true,
            ..options
        };
        let out = negotiate(&offer(7, 45, everything()), &trunc).unwrap();
        assert_eq!(out.flags, AGREED | InitFlags::ATOMIC_O_TRUNC);
    }

    #[test]
    fn never_agrees_to_what_was_not_offered() {
        let offered = InitFlags::ASYNC_READ | InitFlags::BIG_WRITES;
        let out = negotiate(&offer(7, 31, offered), &MountOptions::new("t")).unwrap();
        assert_eq!(out.flags, offered);
        assert_eq!(out.minor, 31, "the kernel's older minor");
    }

    #[test]
    fn limits_come_from_the_options_and_the_kernel() {
        let options = MountOptions {
            max_write: 1 << 20,
            max_background: 64,
            congestion_threshold: 48,
            ..MountOptions::new("t")
        };
        let out = negotiate(&offer(7, 50, everything()), &options).unwrap();
        assert_eq!(out.major, 7);
        assert_eq!(
            out.minor,
            fuse_wire::KERNEL_MINOR_VERSION,
            "ours, the older"
        );
        assert_eq!(out.max_readahead, 131_072);
        assert_eq!(out.max_write, 1 << 20);
        assert_eq!(
            u32::from(out.max_pages) * rustix::param::page_size() as u32,
            1 << 20
        );
        assert_eq!((out.max_background, out.congestion_threshold), (64, 48));
        assert_eq!(out.time_gran, 1);
    }

    #[test]
    fn pages_round_up_and_saturate() {
        assert_eq!(pages(4096, 4096), 1);
        assert_eq!(pages(4097, 4096), 2);
        assert_eq!(pages(1 << 20, 4096), 256);
        assert_eq!(pages(1 << 20, 65_536), 16);
        assert_eq!(pages(u32::MAX, 1), u16::MAX);
        assert_eq!(pages(4096, 1), 4096);
    }

    #[test]
    fn old_or_foreign_protocols_are_refused() {
        let options = MountOptions::new("t");
        for (major, minor) in [(6, 45), (8, 0), (7, 11), (7, 0)] {
            assert!(
                matches!(
                    negotiate(&offer(major, minor, everything()), &options),
                    Err(Error::UnsupportedProtocol { major: a, minor: b })
                        if (a, b) == (major, minor)
                ),
                "{major}.{minor}"
            );
        }
        assert!(negotiate(&offer(7, 12, everything()), &options).is_ok());
    }
}
