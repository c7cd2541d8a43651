//! The two syscalls rustix does not wrap yet: `statmount(2)` and `mount_setattr(2)`.
//!
//! This is the only module of the crate allowed to use `unsafe`. Each function hands the kernel
//! a buffer or struct it owns for the duration of the call and decodes nothing itself: decoding
//! is done in safe code over the returned bytes.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

// Syscall numbers from the kernel's unified table (the same on x86_64 and aarch64).
const SYS_STATMOUNT: libc::c_long = 457;
const SYS_MOUNT_SETATTR: libc::c_long = 442;

/// Size of `struct mnt_id_req` version 0 (`MNT_ID_REQ_SIZE_VER0`).
const MNT_ID_REQ_SIZE_VER0: u32 = 24;

#[repr(C)]
struct MntIdReq {
    size: u32,
    spare: u32,
    mnt_id: u64,
    param: u64,
}

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Calls `statmount(2)` for the mount with the unique ID `mnt_id`, asking for the fields in
/// `mask`, and returns the raw `struct statmount` the kernel filled (its `size` bytes).
pub(crate) fn statmount(mnt_id: u64, mask: u64) -> io::Result<Vec<u8>> {
    let request = MntIdReq {
        size: MNT_ID_REQ_SIZE_VER0,
        spare: 0,
        mnt_id,
        param: mask,
    };
    let mut buf = vec![0u64; 512];
    loop {
        let len = buf.len() * size_of::<u64>();
        // SAFETY: `request` is a valid `mnt_id_req` of the size it declares, and `buf` is a
        // writable allocation of `len` bytes that outlives the call. The kernel writes at most
        // `len` bytes and reads nothing else from our memory.
        let rc = unsafe {
            libc::syscall(
                SYS_STATMOUNT,
                &raw const request,
                buf.as_mut_ptr(),
                len,
                0u32,
            )
        };
        if rc == 0 {
            let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
            return Ok(bytes);
        }
        let err = io::Error::last_os_error();
        // EOVERFLOW: the strings did not fit; retry with a larger buffer, within reason.
        if err.raw_os_error() == Some(libc::EOVERFLOW) && buf.len() < (1 << 20) {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        return Err(err);
    }
}

/// Calls `mount_setattr(2)` on the detached or attached mount `fd` itself (`AT_EMPTY_PATH`, not
/// recursive).
pub(crate) fn mount_setattr(fd: BorrowedFd<'_>, attr_set: u64, attr_clr: u64) -> io::Result<()> {
    let attr = MountAttr {
        attr_set,
        attr_clr,
        propagation: 0,
        userns_fd: 0,
    };
    let empty = c"";
    // SAFETY: `empty` is a valid NUL-terminated string and `attr` a valid `struct mount_attr`
    // whose size we pass; both outlive the call, and the kernel only reads them.
    let rc = unsafe {
        libc::syscall(
            SYS_MOUNT_SETATTR,
            fd.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &raw const attr,
            size_of::<MountAttr>(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
