//! The line parser. It only splits and decodes; it never allocates for a field that holds no
//! escape, and every index it takes comes from a search within the same slice.

use crate::error::{Error, ErrorKind, Field};
use crate::escape::{self, Escaping};
use crate::mount::Mount;

/// Parses a whole table. The flag says whether the input is exactly what the kernel would write
/// for the parsed values (see [`crate::roundtrip_check`]).
///
/// One pass: each field ends at a space or at the end of the line, and the super options (the
/// tail of a line) end at the newline.
pub(crate) fn parse_table(input: &[u8]) -> Result<(Vec<Mount<'_>>, bool), Error> {
    let mut mounts = Vec::with_capacity(memchr::memchr_iter(b'\n', input).count() + 1);
    let mut canonical = true;
    let mut start = 0;
    let mut number = 0;
    while start < input.len() {
        number += 1;
        let (mount, next) =
            parse_line(input, start, &mut canonical).map_err(|kind| Error::new(number, kind))?;
        mounts.push(mount);
        start = next;
    }
    Ok((mounts, canonical))
}

/// Parses the line that starts at `start`; returns the mount and where the next line starts.
fn parse_line<'a>(
    input: &'a [u8],
    start: usize,
    canonical: &mut bool,
) -> Result<(Mount<'a>, usize), ErrorKind> {
    if input.get(start) == Some(&b'\n') {
        return Err(ErrorKind::EmptyLine);
    }
    let mut fields = Fields {
        input,
        pos: Some(start),
    };
    let mount_id = fields.number(Field::MountId)?;
    let parent_id = fields.number(Field::ParentId)?;
    let device = fields.plain(Field::Device)?;
    let (major, minor) = memchr::memchr(b':', device)
        .and_then(|colon| {
            let major = u32::try_from(canonical_decimal(&device[..colon])?).ok()?;
            let minor = u32::try_from(canonical_decimal(&device[colon + 1..])?).ok()?;
            Some((major, minor))
        })
        .ok_or(ErrorKind::InvalidNumber(Field::Device))?;
    let root = fields.name(Field::Root, Escaping::Path, canonical)?;
    let mount_point = fields.name(Field::MountPoint, Escaping::Path, canonical)?;
    let mount_options = fields.plain(Field::MountOptions)?;

    let first_optional = fields.pos;
    let optional_fields = loop {
        let field_start = fields.pos;
        if fields.plain(Field::Separator)? == b"-" {
            break match (first_optional, field_start) {
                (Some(first), Some(sep)) if sep > first => Some(&input[first..sep - 1]),
                _ => None,
            };
        }
    };

    let fs_type = fields.name(Field::FsType, Escaping::Name, canonical)?;
    let source = fields.name(Field::Source, Escaping::Name, canonical)?;
    // Everything after the source is the super options, spaces included.
    let rest = fields
        .pos
        .ok_or(ErrorKind::MissingField(Field::SuperOptions))?;
    let (super_options, next) = match memchr::memchr(b'\n', &input[rest..]) {
        Some(len) => (&input[rest..rest + len], rest + len + 1),
        None => {
            *canonical = false;
            (&input[rest..], input.len())
        }
    };

    let mount = Mount {
        mount_id,
        parent_id,
        major,
        minor,
        root,
        mount_point,
        mount_options,
        optional_fields,
        fs_type,
        source,
        super_options,
    };
    Ok((mount, next))
}

/// A cursor over the space-separated fields of one line. `pos` is `None` once the line's last
/// field (the one followed by a newline or the end of the input) has been taken.
struct Fields<'a> {
    input: &'a [u8],
    pos: Option<usize>,
}

impl<'a> Fields<'a> {
    /// Takes the next field. Plain fields are short, so a byte loop beats a vectorized search.
    fn plain(&mut self, field: Field) -> Result<&'a [u8], ErrorKind> {
        self.field(field, |rest| {
            rest.iter().position(|&b| b == b' ' || b == b'\n')
        })
    }

    /// Takes the next field, which `find_end` ends at the offset of its space or newline (or
    /// at the end of the input when it finds neither); only a space leaves more fields.
    fn field(
        &mut self,
        field: Field,
        find_end: impl FnOnce(&[u8]) -> Option<usize>,
    ) -> Result<&'a [u8], ErrorKind> {
        let start = self.pos.ok_or(ErrorKind::MissingField(field))?;
        let rest = &self.input[start..];
        Ok(match find_end(rest) {
            Some(len) => {
                self.pos = (rest[len] == b' ').then_some(start + len + 1);
                &rest[..len]
            }
            None => {
                self.pos = None;
                rest
            }
        })
    }

    fn number(&mut self, field: Field) -> Result<u64, ErrorKind> {
        canonical_decimal(self.plain(field)?).ok_or(ErrorKind::InvalidNumber(field))
    }

    /// A field with the kernel's escapes; only one holding a backslash, tab or `#` is decoded.
    /// Paths are long, so they are searched with `memchr` rather than byte by byte.
    fn name(
        &mut self,
        field: Field,
        escaping: Escaping,
        canonical: &mut bool,
    ) -> Result<std::borrow::Cow<'a, [u8]>, ErrorKind> {
        let raw = self.field(field, |rest| memchr::memchr2(b' ', b'\n', rest))?;
        let special = memchr::memchr3(b'\\', b'\t', b'#', raw).is_some();
        Ok(escape::decode(raw, special, escaping, canonical))
    }
}

/// A decimal number as the kernel prints it: digits only, no sign, no leading zero.
pub(crate) fn canonical_decimal(digits: &[u8]) -> Option<u64> {
    match digits {
        [] => None,
        [b'0'] => Some(0),
        [b'0', ..] => None,
        _ => digits.iter().try_fold(0u64, |n, &b| {
            let digit = b.checked_sub(b'0').filter(|d| *d < 10)?;
            n.checked_mul(10)?.checked_add(u64::from(digit))
        }),
    }
}
