//! A zero-copy parser and query library for `/proc/<pid>/mountinfo`.
//!
//! The kernel describes every mount of a mount namespace in one line of `mountinfo` (the format
//! is in the kernel's `Documentation/filesystems/proc.rst`, section 3.5):
//!
//! ```text
//! 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//! (1)(2)(3)   (4)   (5)      (6)      (7)   (8) (9)   (10)         (11)
//! ```
//!
//! [`MountTable::parse`] splits such a table into [`Mount`]s that borrow the input: a field is
//! only copied when it holds one of the kernel's octal escapes. The table answers the questions
//! a storage driver asks — what is mounted here, what is this path on, where else is this
//! filesystem bind mounted — from the table alone.
//!
//! ```
//! use tak_os_mountinfo::MountTable;
//!
//! let text = b"22 1 0:21 / /proc rw,nosuid shared:12 - proc proc rw
//! 25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
//! 40 25 8:1 /data/vol\\0401 /var/lib/my\\040volume rw - ext4 /dev/sda1 rw
//! ";
//! let table = MountTable::parse(text)?;
//! assert_eq!(table.len(), 3);
//!
//! // Escapes are decoded.
//! let vol = table.by_mount_point("/var/lib/my volume").unwrap();
//! assert_eq!(vol.root(), std::path::Path::new("/data/vol 1"));
//!
//! // Whole components only: /var/lib/my volume/x is on the bind mount, /var/lib/my is not.
//! assert_eq!(table.containing("/var/lib/my volume/x").unwrap().mount_id(), 40);
//! assert_eq!(table.containing("/var/lib/my").unwrap().mount_id(), 25);
//! assert!(!table.is_mount_point("/var/lib"));
//!
//! // A bind mount shares device and root with its origin.
//! assert_eq!(table.by_device_and_root(8, 1, "/").count(), 1);
//! assert_eq!(table.parent(vol).unwrap().mount_point(), std::path::Path::new("/"));
//!
//! // Options are raw bytes with exact lookups.
//! assert!(table.by_mount_id(22).unwrap().mount_options().has_flag("nosuid"));
//! # Ok::<(), tak_os_mountinfo::Error>(())
//! ```
//!
//! Reading the live table and waiting for it to change:
//!
//! ```no_run
//! use std::time::Duration;
//! use tak_os_mountinfo::{MountTable, MountWatcher};
//!
//! let watcher = MountWatcher::open_self()?;
//! loop {
//!     let bytes = tak_os_mountinfo::read_self()?;
//!     let table = MountTable::parse(&bytes)?;
//!     println!("{} mounts", table.len());
//!     watcher.wait(Some(Duration::from_secs(60)))?;
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Round trip
//!
//! [`MountTable::render`] writes the bytes the kernel would write for the parsed values: space,
//! tab, newline and backslash are escaped as `\040`, `\011`, `\012`, `\134` in root, mount point,
//! source and filesystem type, and `#` as `\043` in source and filesystem type only (so a raw `#`
//! in a mount point stays raw). Options and unknown optional fields are written as read. So:
//!
//! - for a table in the kernel's form, `render(parse(t)) == t`, byte for byte;
//! - for any input that parses, `parse(render(parse(t))) == parse(t)`, and rendering again gives
//!   the same bytes. An input the kernel would have written differently (a raw tab, a raw `#` in a
//!   source, a backslash that starts no escape, a missing final newline) is accepted and comes
//!   back in the kernel's form.
//!
//! [`roundtrip_check`] asserts all of this for one input; the fuzz target calls it.
//!
//! # What this crate does not do
//!
//! - It never looks at the filesystem to answer a query: no `stat`, no `realpath`, no symlink
//!   resolution, no `..` handling. That is on purpose, since a path under a dead FUSE mount hangs
//!   whoever touches it; callers that need canonical paths canonicalize them first.
//! - It does not mount, unmount or change anything, and reads only procfs.
//! - It does not decode escapes inside mount or super options, nor interpret them beyond
//!   splitting on `,` and `=`.
//! - It does not use `statmount`/`listmount`, and does not give a consistent snapshot of a table
//!   that changes while it is being read (the kernel does not either).
//! - It does not parse `/proc/mounts` (the older, fstab-like format).

#![deny(missing_docs)]

mod error;
mod escape;
mod mount;
mod parse;
mod read;
mod table;
#[cfg(test)]
mod tests;

pub use error::{Error, ErrorKind, Field};
pub use mount::{Mount, OptionalField, Options};
pub use read::{MountWatcher, read_pid, read_self};
pub use table::MountTable;

/// Asserts the round-trip invariant for one input; for fuzz targets and property tests.
///
/// When `input` parses to a table `t`:
/// - `render(t)` parses to a table equal to `t`, and rendering that gives the same bytes;
/// - when `input` was in the kernel's own form, `render(t) == input`;
/// - the path queries match nothing for the empty path, and find each mount (of the first 64)
///   at or below its own mount point exactly when that point is absolute.
///
/// When `input` does not parse, the error names a line that exists.
///
/// # Panics
/// When the invariant does not hold, which is a bug in this crate. It never panics otherwise.
pub fn roundtrip_check(input: &[u8]) {
    let table = match MountTable::parse(input) {
        Ok(table) => table,
        Err(e) => {
            let lines = input.split(|&b| b == b'\n').count();
            assert!(
                e.line() >= 1 && e.line() <= lines,
                "error on line {} of {lines}",
                e.line()
            );
            return;
        }
    };
    let rendered = table.render();
    if table.was_canonical() {
        assert!(
            rendered == input,
            "canonical input did not render unchanged:\n input: {}\noutput: {}",
            input.escape_ascii(),
            rendered.escape_ascii()
        );
    }
    let again = match MountTable::parse(&rendered) {
        Ok(again) => again,
        Err(e) => panic!(
            "rendered table does not parse: {e}: {}",
            rendered.escape_ascii()
        ),
    };
    assert_eq!(again, table, "rendered table parses to different values");
    assert!(
        again.was_canonical(),
        "rendered table is not in the kernel's form"
    );
    assert!(again.render() == rendered, "rendering is not stable");
    assert_eq!(
        table.mounts_at_or_below("").count(),
        0,
        "the empty path matches nothing"
    );
    assert!(
        table.containing("").is_none(),
        "nothing contains the empty path"
    );
    assert!(
        table.by_mount_point("").is_none(),
        "no mount sits at the empty path"
    );
    for mount in table.iter().take(64) {
        let at = mount.mount_point();
        let found = table
            .mounts_at_or_below(&at)
            .any(|other| std::ptr::eq(other, mount));
        assert_eq!(
            found,
            at.is_absolute(),
            "a mount is at or below its own point"
        );
    }
}
