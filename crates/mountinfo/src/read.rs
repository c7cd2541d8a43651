//! Reading a table from procfs, and waiting for it to change.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};

/// The calling thread's table: `/proc/thread-self/mountinfo`, or `/proc/self/mountinfo` on
/// kernels before 3.17. A thread that called `unshare(CLONE_NEWNS)` sees its own namespace.
fn self_path() -> PathBuf {
    let thread_self = Path::new("/proc/thread-self/mountinfo");
    if thread_self.exists() {
        thread_self.to_path_buf()
    } else {
        PathBuf::from("/proc/self/mountinfo")
    }
}

fn pid_path(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/mountinfo"))
}

/// Reads the calling thread's mountinfo table into one growable buffer.
///
/// Reads `/proc/thread-self/mountinfo` (so a thread in its own mount namespace reads that
/// namespace), falling back to `/proc/self/mountinfo` where `thread-self` does not exist. There
/// is no line-length limit.
///
/// # Errors
/// Opening or reading the procfs file failed.
pub fn read_self() -> io::Result<Vec<u8>> {
    read_all(&self_path())
}

/// Reads the mountinfo table of process `pid` (`/proc/<pid>/mountinfo`) into one growable
/// buffer. Paths in it are relative to that process's root directory.
///
/// # Errors
/// Opening or reading the procfs file failed (`NotFound` when the process does not exist).
pub fn read_pid(pid: u32) -> io::Result<Vec<u8>> {
    read_all(&pid_path(pid))
}

fn read_all(path: &Path) -> io::Result<Vec<u8>> {
    let mut file = File::open(path)?;
    // procfs reports a size of 0; large reads let the kernel fill many lines per call.
    let mut buf = Vec::with_capacity(64 * 1024);
    file.read_to_end(&mut buf)?;
    Ok(buf)
}

/// Blocks until a mount namespace's table changes.
///
/// Holds `/proc/…/mountinfo` open and polls it for `POLLPRI`, which the kernel raises once for
/// every open file after a mount, unmount or propagation change in the namespace. The watcher
/// only tells that something changed: read the table again to see what.
#[derive(Debug)]
pub struct MountWatcher {
    file: File,
}

impl MountWatcher {
    /// Watches the calling thread's mount namespace (see [`read_self`] for the file used).
    ///
    /// # Errors
    /// Opening the procfs file failed.
    pub fn open_self() -> io::Result<Self> {
        Ok(Self {
            file: File::open(self_path())?,
        })
    }

    /// Watches the mount namespace of process `pid`.
    ///
    /// # Errors
    /// Opening the procfs file failed.
    pub fn open_pid(pid: u32) -> io::Result<Self> {
        Ok(Self {
            file: File::open(pid_path(pid))?,
        })
    }

    /// Waits until the table has changed since the watcher was opened or since the last `wait`
    /// that returned `true`. Returns `false` when `timeout` passed first; `None` waits for ever.
    ///
    /// # Errors
    /// `poll(2)` failed (an interrupted call is retried).
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            // A timeout too large for an `Instant` or a timespec is as good as none.
            let timespec = deadline
                .map(|d| d.saturating_duration_since(Instant::now()))
                .and_then(|r| Timespec::try_from(r).ok());
            let mut fds = [PollFd::new(&self.file, PollFlags::PRI)];
            match rustix::event::poll(&mut fds, timespec.as_ref()) {
                Ok(0) => return Ok(false),
                Ok(_) => {
                    let events = fds[0].revents();
                    if events.intersects(PollFlags::PRI | PollFlags::ERR) {
                        return Ok(true);
                    }
                    if events.intersects(PollFlags::NVAL | PollFlags::HUP) {
                        return Err(io::Error::other("mountinfo file can no longer be polled"));
                    }
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}
