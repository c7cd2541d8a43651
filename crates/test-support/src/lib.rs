//! Test harness shared by the workspace's crates.
//!
//! Privileged tests (real mounts, `/dev/fuse`) must never leak a mount onto the host. They call
//! [`private_mount_namespace`] first, which moves the calling thread into a new mount namespace
//! whose mounts are all private, so everything the test mounts disappears with the thread.
//!
//! When the privilege is missing the test is skipped loudly on a developer machine and fails when
//! `CI=true`: in CI a silent skip would hide a whole class of tests.
//!
//! This crate is for tests only; it does not clean up anything a test leaves behind inside its
//! own namespace, because the namespace itself is the cleanup.

use std::fmt;

/// Why a privileged test could not run.
#[derive(Debug)]
pub struct Unprivileged(String);

impl fmt::Display for Unprivileged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Moves the calling thread into a new, fully private mount namespace.
///
/// Threads the caller spawns afterwards (a tokio runtime's workers, say) inherit the namespace.
/// Returns `true` when the test may go on. Returns `false` after printing a `SKIPPED` line when
/// the process is not root or the kernel refuses, and panics instead when `CI=true`.
#[must_use = "a privileged test must return early when this is false"]
pub fn private_mount_namespace(test: &str) -> bool {
    match try_private_mount_namespace() {
        Ok(()) => true,
        Err(why) => skip_or_fail(test, &why.to_string()),
    }
}

/// Like [`private_mount_namespace`] and additionally requires `/dev/fuse`.
#[must_use = "a privileged test must return early when this is false"]
pub fn private_mount_namespace_with_fuse(test: &str) -> bool {
    if !std::path::Path::new("/dev/fuse").exists() {
        return skip_or_fail(test, "/dev/fuse does not exist");
    }
    private_mount_namespace(test)
}

/// For tests that need root but no mount namespace (files of another owner, opening files by
/// handle): `true` when the process is root; otherwise `false` after printing a `SKIPPED` line
/// that names the test and `why` it needs root, or a panic when `CI=true`.
#[must_use = "a privileged test must return early when this is false"]
pub fn requires_root(test: &str, why: &str) -> bool {
    rustix::process::geteuid().is_root()
        || skip_or_fail(
            test,
            &format!("needs root ({why}), and is not running as root"),
        )
}

/// An error and all its sources as one line, `outer: cause: cause`, for assertions and test
/// output (the workspace's one formatter, `error_text::chain`).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    error_text::chain(error)
}

/// Whether the tests run in CI, where a skipped privileged test is a failure.
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| v == "true")
}

#[allow(
    clippy::print_stderr,
    reason = "a skipped privileged test must be seen in the output"
)]
fn skip_or_fail(test: &str, why: &str) -> bool {
    assert!(!in_ci(), "privileged test {test} cannot run in CI: {why}");
    eprintln!("SKIPPED (needs root in a private mount namespace): {test}: {why}");
    false
}

/// The mount namespace setup without the skip policy, for harnesses that report on their own.
pub fn try_private_mount_namespace() -> Result<(), Unprivileged> {
    use rustix::mount::{MountPropagationFlags, mount_change};
    use rustix::thread::UnshareFlags;

    if !rustix::process::geteuid().is_root() {
        return Err(Unprivileged("not running as root".to_owned()));
    }
    unshare_mount_namespace(UnshareFlags::NEWNS)
        .map_err(|e| Unprivileged(format!("unshare(CLONE_NEWNS) failed: {e}")))?;
    mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .map_err(|e| Unprivileged(format!("making / recursively private failed: {e}")))?;
    Ok(())
}

/// Detaches every mount at or below `dir` in this thread's mount namespace, deepest first, so
/// that a temporary directory a test mounted into can be removed when the test ends (a private
/// namespace drops its mounts only when its last thread exits, after the directory's cleanup has
/// already failed). Returns how many mounts it detached.
pub fn detach_mounts_below(dir: &std::path::Path) -> usize {
    use std::os::unix::ffi::OsStrExt;
    let Ok(table) = std::fs::read("/proc/thread-self/mountinfo") else {
        return 0;
    };
    let mut points: Vec<std::path::PathBuf> = table
        .split(|&b| b == b'\n')
        .filter_map(|line| line.split(|&b| b == b' ').nth(4))
        .map(|field| std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&unescape(field))))
        .filter(|point| point.starts_with(dir))
        .collect();
    // Deepest (and, at one point, latest) first.
    points.reverse();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points
        .iter()
        .filter(|p| {
            rustix::mount::unmount(p.as_path(), rustix::mount::UnmountFlags::DETACH).is_ok()
        })
        .count()
}

/// Decodes mountinfo's octal escapes (`\040` and the like).
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

#[allow(unsafe_code)]
fn unshare_mount_namespace(flags: rustix::thread::UnshareFlags) -> rustix::io::Result<()> {
    // SAFETY: the flags only ever hold NEWNS (which implies FS); the file descriptor table stays
    // shared, so no thread can observe a descriptor from another table.
    unsafe { rustix::thread::unshare_unsafe(flags) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_below_a_directory_are_detached_so_it_can_be_removed() {
        if !private_mount_namespace("mounts_below_a_directory_are_detached_so_it_can_be_removed") {
            return;
        }
        let dir = std::env::temp_dir().join(format!("test-support-{}", std::process::id()));
        let odd = dir.join("a b");
        std::fs::create_dir_all(odd.join("inner")).unwrap();
        let tmpfs = |at: &std::path::Path| {
            rustix::mount::mount(
                "tmpfs",
                at,
                "tmpfs",
                rustix::mount::MountFlags::empty(),
                None,
            )
            .unwrap();
        };
        tmpfs(&odd);
        std::fs::create_dir(odd.join("inner")).unwrap();
        tmpfs(&odd.join("inner"));
        assert_eq!(detach_mounts_below(&dir), 2);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(unescape(b"a\\040b\\134"), b"a b\\");
    }

    #[test]
    fn private_namespace_differs_from_the_initial_one() {
        let before = std::fs::read_link("/proc/thread-self/ns/mnt").unwrap();
        if !private_mount_namespace("private_namespace_differs_from_the_initial_one") {
            return;
        }
        let after = std::fs::read_link("/proc/thread-self/ns/mnt").unwrap();
        assert_ne!(before, after, "the thread must be in a new mount namespace");
    }
}
