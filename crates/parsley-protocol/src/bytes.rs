//! Big-endian reading and writing helpers shared by every decoder.
//!
//! Every read is bounds-checked and returns `None` on truncation, so decoders
//! built on this never index out of range and never panic.

/// A forward-only reader over a byte slice.
#[derive(Debug, Clone)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes not yet consumed.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let out = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(out)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Some(a)
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|a| a[0])
    }

    pub(crate) fn i32(&mut self) -> Option<i32> {
        self.array::<4>().map(i32::from_be_bytes)
    }

    pub(crate) fn i64(&mut self) -> Option<i64> {
        self.array::<8>().map(i64::from_be_bytes)
    }
}

/// Reads a big-endian `i64` from exactly eight bytes at `at` of `b`.
/// The caller has checked the length.
#[inline(always)]
pub(crate) fn be_i64(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
}

/// Reads a big-endian `i32` from exactly four bytes at `at` of `b`.
/// The caller has checked the length.
#[inline(always)]
pub(crate) fn be_i32(b: &[u8], at: usize) -> i32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    i32::from_be_bytes(a)
}
