//! `name_to_handle_at(2)` and `open_by_handle_at(2)`, which rustix does not wrap.
//!
//! This is the only module of the crate allowed to use `unsafe`. A file handle is the
//! filesystem's own persistent name for an inode (on ext4, xfs, btrfs and tmpfs it includes the
//! inode's generation, so a handle of a deleted file never opens its successor). Opening by
//! handle needs `CAP_DAC_READ_SEARCH`.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `MAX_HANDLE_SZ` from `<linux/exportfs.h>`.
const MAX_HANDLE_SZ: usize = 128;

/// `struct file_handle` with room for the largest handle.
#[repr(C)]
struct HandleBuf {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_SZ],
}

/// A filesystem's persistent handle for one inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FileHandle {
    pub(crate) handle_type: i32,
    pub(crate) bytes: Vec<u8>,
}

/// The handle of the file `fd` refers to (an `O_PATH` descriptor is enough).
pub(crate) fn name_to_handle(fd: BorrowedFd<'_>) -> io::Result<FileHandle> {
    let mut buf = HandleBuf {
        handle_bytes: MAX_HANDLE_SZ as u32,
        handle_type: 0,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: the path is a valid NUL-terminated empty string, `buf` is a `struct file_handle`
    // whose `handle_bytes` says how much room follows it, and `mount_id` is a writable int;
    // all three outlive the call, and the kernel writes nothing beyond them.
    let rc = unsafe {
        libc::name_to_handle_at(
            fd.as_raw_fd(),
            c"".as_ptr(),
            (&raw mut buf).cast::<libc::file_handle>(),
            &raw mut mount_id,
            libc::AT_EMPTY_PATH,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let len = (buf.handle_bytes as usize).min(MAX_HANDLE_SZ);
    Ok(FileHandle {
        handle_type: buf.handle_type,
        bytes: buf.f_handle[..len].to_vec(),
    })
}

/// Opens the inode named by `handle` on the filesystem of `mount` with `flags`
/// (`O_CLOEXEC` is added).
pub(crate) fn open_by_handle(
    mount: BorrowedFd<'_>,
    handle: &FileHandle,
    flags: libc::c_int,
) -> io::Result<OwnedFd> {
    if handle.bytes.len() > MAX_HANDLE_SZ {
        return Err(io::Error::from_raw_os_error(libc::ESTALE));
    }
    let mut buf = HandleBuf {
        handle_bytes: handle.bytes.len() as u32,
        handle_type: handle.handle_type,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    buf.f_handle[..handle.bytes.len()].copy_from_slice(&handle.bytes);
    // SAFETY: `buf` is a valid `struct file_handle` of the size it declares and outlives the
    // call; the kernel only reads it.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            (&raw mut buf).cast::<libc::file_handle>(),
            flags | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned `fd` as a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
