//! The one module of the tests allowed `unsafe`: memory mappings, to check what SEMANTICS.md
//! says about mmap.

#![allow(unsafe_code)]

use std::os::fd::AsFd;

use rustix::mm::{MapFlags, ProtFlags};

/// Maps `len` bytes of `file` shared and read-write; the errno when the kernel refuses.
pub(crate) fn map_shared(file: &impl AsFd, len: usize) -> Result<(), i32> {
    // SAFETY: a null hint lets the kernel pick unused addresses, so the mapping aliases no
    // Rust memory; it is never dereferenced and is unmapped before returning.
    unsafe {
        let at = rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            file,
            0,
        )
        .map_err(|e| e.raw_os_error())?;
        rustix::mm::munmap(at, len).map_err(|e| e.raw_os_error())
    }
}

/// Maps `len` bytes of `file` privately (copy on write) and returns its first byte; the errno
/// when the kernel refuses.
pub(crate) fn map_private_first_byte(file: &impl AsFd, len: usize) -> Result<u8, i32> {
    // SAFETY: as in `map_shared`; the first byte is read while the mapping exists, and the
    // caller passes a `len` within the file, so the page is backed by data.
    unsafe {
        let at = rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ,
            MapFlags::PRIVATE,
            file,
            0,
        )
        .map_err(|e| e.raw_os_error())?;
        let first = at.cast::<u8>().read_volatile();
        rustix::mm::munmap(at, len).map_err(|e| e.raw_os_error())?;
        Ok(first)
    }
}
