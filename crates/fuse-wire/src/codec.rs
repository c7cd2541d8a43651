//! Byte-level reading and writing in the host's byte order, the order the kernel uses on
//! `/dev/fuse`. Every read is bounds-checked and returns `None` past the end: no slice
//! indexing that can panic.

/// A cursor over a borrowed buffer.
#[derive(Debug, Clone)]
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    /// The bytes not read yet.
    pub(crate) fn rest(&self) -> &'a [u8] {
        self.rest
    }

    /// The next `n` bytes, or `None` (and nothing consumed) when fewer remain.
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = self.rest.split_at_checked(n)?;
        self.rest = tail;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_ne_bytes)
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_ne_bytes)
    }

    pub(crate) fn i32(&mut self) -> Option<i32> {
        self.array().map(i32::from_ne_bytes)
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_ne_bytes)
    }

    pub(crate) fn i64(&mut self) -> Option<i64> {
        self.array().map(i64::from_ne_bytes)
    }

    /// Skips `n` bytes of padding or unused fields.
    pub(crate) fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(drop)
    }
}

/// Appending fields to an output buffer.
pub(crate) trait Put {
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    fn put_i32(&mut self, v: i32);
    fn put_u64(&mut self, v: u64);
    fn put_i64(&mut self, v: i64);
    fn put_zeros(&mut self, n: usize);
}

impl Put for Vec<u8> {
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_ne_bytes());
    }

    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_ne_bytes());
    }

    fn put_i32(&mut self, v: i32) {
        self.extend_from_slice(&v.to_ne_bytes());
    }

    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_ne_bytes());
    }

    fn put_i64(&mut self, v: i64) {
        self.extend_from_slice(&v.to_ne_bytes());
    }

    fn put_zeros(&mut self, n: usize) {
        self.resize(self.len() + n, 0);
    }
}

/// Overwrites the `u32` at `at` in `out` (a length field written before its value was known).
/// Does nothing when `at` is out of range, which the callers rule out by construction.
pub(crate) fn patch_u32(out: &mut [u8], at: usize, v: u32) {
    if let Some(field) = out.get_mut(at..at + 4) {
        field.copy_from_slice(&v.to_ne_bytes());
    }
}

/// Overwrites the `u16` at `at` in `out`.
pub(crate) fn patch_u16(out: &mut [u8], at: usize, v: u16) {
    if let Some(field) = out.get_mut(at..at + 2) {
        field.copy_from_slice(&v.to_ne_bytes());
    }
}

/// `n` rounded up to a multiple of 8, the alignment of directory records
/// (`FUSE_REC_ALIGN`). Saturates instead of overflowing.
pub(crate) const fn align8(n: usize) -> usize {
    match n.checked_add(7) {
        Some(v) => v & !7,
        None => usize::MAX & !7,
    }
}
