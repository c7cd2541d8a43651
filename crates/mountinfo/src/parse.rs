//! The line parser. It only splits and decodes; it never allocates for a field that holds no
//! escape, and every index it takes comes from a search within the same slice.

use crate::error::{Error, ErrorKind, Field};
use crate::escape::{self, Escaping};
use crate::mount::Mount;

/// Parses a whole table. The flag says whether the input is exactly what the kernel would write
/// for the parsed values (see [`crate::roundtrip_check`]).
pub(crate) fn parse_table(input: &[u8]) -> Result<(Vec<Mount<'_>>, bool), Error> {
    let lines = input.iter().filter(|&&b| b == b'\n').count() + 1;
    let mut mounts = Vec::with_capacity(lines);
    let mut canonical = true;
    let mut rest = input;
    let mut number = 0;
    while !rest.is_empty() {
        number += 1;
        let line = match rest.iter().position(|&b| b == b'\n') {
            Some(end) => {
                let line = &rest[..end];
                rest = &rest[end + 1..];
                line
            }
            None => {
                canonical = false;
                std::mem::take(&mut rest)
            }
        };
        let mount = parse_line(line, &mut canonical).map_err(|kind| Error::new(number, kind))?;
        mounts.push(mount);
    }
    Ok((mounts, canonical))
}

fn parse_line<'a>(line: &'a [u8], canonical: &mut bool) -> Result<Mount<'a>, ErrorKind> {
    if line.is_empty() {
        return Err(ErrorKind::EmptyLine);
    }
    let mut fields = Fields { line, pos: Some(0) };
    let mount_id = fields.number(Field::MountId)?;
    let parent_id = fields.number(Field::ParentId)?;
    let device = fields.plain(Field::Device)?;
    let (major, minor) = device
        .iter()
        .position(|&b| b == b':')
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
        let start = fields.pos;
        if fields.plain(Field::Separator)? == b"-" {
            break match (first_optional, start) {
                (Some(first), Some(sep)) if sep > first => Some(&line[first..sep - 1]),
                _ => None,
            };
        }
    };

    let fs_type = fields.name(Field::FsType, Escaping::Name, canonical)?;
    let source = fields.name(Field::Source, Escaping::Name, canonical)?;
    // Everything after the source is the super options, spaces included.
    let super_options = fields
        .pos
        .map(|pos| &line[pos..])
        .ok_or(ErrorKind::MissingField(Field::SuperOptions))?;

    Ok(Mount {
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
    })
}

/// A cursor over the space-separated fields of one line. `pos` is `None` once the last field
/// (the one not followed by a space) has been taken.
struct Fields<'a> {
    line: &'a [u8],
    pos: Option<usize>,
}

impl<'a> Fields<'a> {
    fn plain(&mut self, field: Field) -> Result<&'a [u8], ErrorKind> {
        let start = self.pos.ok_or(ErrorKind::MissingField(field))?;
        let rest = &self.line[start..];
        Ok(match rest.iter().position(|&b| b == b' ') {
            Some(len) => {
                self.pos = Some(start + len + 1);
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

    /// A field with the kernel's escapes, split and checked for escape candidates in one pass.
    fn name(
        &mut self,
        field: Field,
        escaping: Escaping,
        canonical: &mut bool,
    ) -> Result<std::borrow::Cow<'a, [u8]>, ErrorKind> {
        let start = self.pos.ok_or(ErrorKind::MissingField(field))?;
        let rest = &self.line[start..];
        let mut special = false;
        let mut len = rest.len();
        self.pos = None;
        for (i, &b) in rest.iter().enumerate() {
            match CLASS[usize::from(b)] {
                PLAIN => {}
                SPACE => {
                    len = i;
                    self.pos = Some(start + i + 1);
                    break;
                }
                _ => special = true,
            }
        }
        Ok(escape::decode(&rest[..len], special, escaping, canonical))
    }
}

const PLAIN: u8 = 0;
const SPACE: u8 = 1;
const SPECIAL: u8 = 2;

/// Byte classes for splitting a name field: the separator, and the bytes that may need decoding
/// or make the line non-canonical.
static CLASS: [u8; 256] = {
    let mut class = [PLAIN; 256];
    class[b' ' as usize] = SPACE;
    class[b'\\' as usize] = SPECIAL;
    class[b'\t' as usize] = SPECIAL;
    class[b'#' as usize] = SPECIAL;
    class
};

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
