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
    let mut out: Option<Vec<u8>> = None;
    let mut i = 0;
    while let Some(&b) = raw.get(i) {
        if b == b'\\' {
            if let Some(decoded) = escape_at(raw, i, escaping) {
                out.get_or_insert_with(|| {
                    let mut v = Vec::with_capacity(raw.len());
                    v.extend_from_slice(&raw[..i]);
                    v
                })
                .push(decoded);
                i += 4;
                continue;
            }
            *canonical = false;
        } else if escaping.escapes(b) {
            // A raw tab, or a raw `#` in a name.
            *canonical = false;
        }
        if let Some(v) = out.as_mut() {
            v.push(b);
        }
        i += 1;
    }
    match out {
        Some(v) => Cow::Owned(v),
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
