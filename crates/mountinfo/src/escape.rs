//! The kernel's octal escapes (`seq_escape`) for the four name fields.

use std::borrow::Cow;

/// Which bytes the kernel escapes in a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Escaping {
    /// Root and mount point: space, tab, newline, backslash.
    Path,
    /// Source and filesystem type: those and `#`.
    Name,
}

impl Escaping {
    fn escapes(self, b: u8) -> bool {
        matches!(b, b' ' | b'\t' | b'\n' | b'\\') || (self == Self::Name && b == b'#')
    }
}

/// Decodes a field. `special` says whether the field holds a backslash, tab or `#` (found while
/// splitting the line); without one the field is borrowed as is.
///
/// A backslash that does not start an escape the kernel writes for this field is kept as a
/// literal byte. Anything the kernel would have written differently (a raw tab, a raw `#` in a
/// name, such a literal backslash) clears `canonical`.
pub(crate) fn decode<'a>(
    raw: &'a [u8],
    special: bool,
    escaping: Escaping,
    canonical: &mut bool,
) -> Cow<'a, [u8]> {
    if !special {
        return Cow::Borrowed(raw);
    }
    let unescaped = match escaping {
        Escaping::Path => memchr::memchr(b'\t', raw),
        Escaping::Name => memchr::memchr2(b'\t', b'#', raw),
    };
    if unescaped.is_some() {
        *canonical = false;
    }
    let mut out: Option<Vec<u8>> = None;
    // `raw[..copied]` is in `out` already; the next backslash is searched from `from`.
    let mut copied = 0;
    let mut from = 0;
    while let Some(offset) = memchr::memchr(b'\\', &raw[from..]) {
        let at = from + offset;
        match escape_at(raw, at, escaping) {
            Some(decoded) => {
                let v = out.get_or_insert_with(|| Vec::with_capacity(raw.len()));
                v.extend_from_slice(&raw[copied..at]);
                v.push(decoded);
                copied = at + 4;
                from = at + 4;
            }
            None => {
                *canonical = false;
                from = at + 1;
            }
        }
    }
    match out {
        Some(mut v) => {
            v.extend_from_slice(&raw[copied..]);
            Cow::Owned(v)
        }
        None => Cow::Borrowed(raw),
    }
}

fn escape_at(raw: &[u8], i: usize, escaping: Escaping) -> Option<u8> {
    let b = match raw.get(i + 1..i + 4)? {
        b"040" => b' ',
        b"011" => b'\t',
        b"012" => b'\n',
        b"134" => b'\\',
        b"043" if escaping == Escaping::Name => b'#',
        _ => return None,
    };
    Some(b)
}

/// Appends `value` as the kernel writes it in a field of this kind.
pub(crate) fn encode(value: &[u8], escaping: Escaping, out: &mut Vec<u8>) {
    if !value.iter().any(|&b| escaping.escapes(b)) {
        out.extend_from_slice(value);
        return;
    }
    for &b in value {
        if escaping.escapes(b) {
            out.extend_from_slice(&[
                b'\\',
                b'0' + (b >> 6),
                b'0' + ((b >> 3) & 7),
                b'0' + (b & 7),
            ]);
        } else {
            out.push(b);
        }
    }
}
