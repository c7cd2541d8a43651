//! One line of the table: [`Mount`], its [`Options`] and [`OptionalField`]s.

use std::borrow::Cow;
use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::escape::{self, Escaping};

/// One mount: one line of a mountinfo table.
///
/// Every field is decoded: `root()`, `mount_point()`, `source()` and `fs_type()` hold the real
/// bytes, not the kernel's octal escapes. Options are kept as the kernel wrote them.
#[derive(Clone, PartialEq, Eq)]
pub struct Mount<'a> {
    pub(crate) mount_id: u64,
    pub(crate) parent_id: u64,
    pub(crate) major: u32,
    pub(crate) minor: u32,
    pub(crate) root: Cow<'a, [u8]>,
    pub(crate) mount_point: Cow<'a, [u8]>,
    pub(crate) mount_options: &'a [u8],
    /// The optional fields as written, joined by single spaces; `None` when there are none
    /// (`Some(b"")` is one empty field).
    pub(crate) optional_fields: Option<&'a [u8]>,
    pub(crate) fs_type: Cow<'a, [u8]>,
    pub(crate) source: Cow<'a, [u8]>,
    pub(crate) super_options: &'a [u8],
}

impl<'a> Mount<'a> {
    /// The mount ID (field 1), unique among the mounts of a namespace at one time.
    pub fn mount_id(&self) -> u64 {
        self.mount_id
    }

    /// The parent mount's ID (field 2); the mount's own ID for the top of the tree.
    pub fn parent_id(&self) -> u64 {
        self.parent_id
    }

    /// The major number of the filesystem's device (`st_dev` of its files).
    pub fn major(&self) -> u32 {
        self.major
    }

    /// The minor number of the filesystem's device (`st_dev` of its files).
    pub fn minor(&self) -> u32 {
        self.minor
    }

    /// The directory of the filesystem that this mount shows (`/` unless it is a bind mount of
    /// a subdirectory).
    pub fn root(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.root))
    }

    /// Where the mount is, relative to the reading process's root directory.
    pub fn mount_point(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.mount_point))
    }

    /// The per-mount options (field 6), such as `rw,nosuid,relatime`.
    pub fn mount_options(&self) -> Options<'a> {
        Options(self.mount_options)
    }

    /// The optional fields (field 7) in the order written: peer groups and unknown tags.
    pub fn optional_fields(&self) -> impl Iterator<Item = OptionalField<'a>> + use<'a> {
        self.optional_fields
            .into_iter()
            .flat_map(|raw| raw.split(|&b| b == b' '))
            .map(OptionalField::parse)
    }

    /// The peer group this mount shares propagation with (`shared:N`), if any.
    pub fn shared(&self) -> Option<u64> {
        self.optional_fields().find_map(|f| match f {
            OptionalField::Shared(n) => Some(n),
            _ => None,
        })
    }

    /// The peer group this mount receives propagation from (`master:N`), if any.
    pub fn master(&self) -> Option<u64> {
        self.optional_fields().find_map(|f| match f {
            OptionalField::Master(n) => Some(n),
            _ => None,
        })
    }

    /// The filesystem type (field 9), `type` or `type.subtype` (e.g. `fuse.sshfs`).
    pub fn fs_type(&self) -> &OsStr {
        OsStr::from_bytes(&self.fs_type)
    }

    /// The mount source (field 10): a device, `none`, a server path or anything the filesystem
    /// chose. It may be empty.
    pub fn source(&self) -> &OsStr {
        OsStr::from_bytes(&self.source)
    }

    /// The per-superblock options (field 11), everything after the source up to the end of the
    /// line, spaces included.
    pub fn super_options(&self) -> Options<'a> {
        Options(self.super_options)
    }

    /// Whether the mount is read-only, by its per-mount options (`ro`).
    pub fn is_read_only(&self) -> bool {
        self.mount_options().has_flag("ro")
    }

    /// Appends the line the kernel would write for this mount, newline included.
    ///
    /// Root and mount point escape space, tab, newline and backslash as `\ooo`; source and
    /// filesystem type escape `#` as well. Nothing else is escaped, and options are written as
    /// they were read.
    pub fn render(&self, out: &mut Vec<u8>) {
        push_decimal(out, self.mount_id);
        out.push(b' ');
        push_decimal(out, self.parent_id);
        out.push(b' ');
        push_decimal(out, self.major.into());
        out.push(b':');
        push_decimal(out, self.minor.into());
        out.push(b' ');
        escape::encode(&self.root, Escaping::Path, out);
        out.push(b' ');
        escape::encode(&self.mount_point, Escaping::Path, out);
        out.push(b' ');
        out.extend_from_slice(self.mount_options);
        for field in self.optional_fields() {
            out.push(b' ');
            field.render(out);
        }
        out.extend_from_slice(b" - ");
        escape::encode(&self.fs_type, Escaping::Name, out);
        out.push(b' ');
        escape::encode(&self.source, Escaping::Name, out);
        out.push(b' ');
        out.extend_from_slice(self.super_options);
        out.push(b'\n');
    }
}

impl fmt::Debug for Mount<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mount")
            .field("mount_id", &self.mount_id)
            .field("parent_id", &self.parent_id)
            .field("device", &format_args!("{}:{}", self.major, self.minor))
            .field("root", &self.root())
            .field("mount_point", &self.mount_point())
            .field("mount_options", &self.mount_options())
            .field(
                "optional_fields",
                &self.optional_fields().collect::<Vec<_>>(),
            )
            .field("fs_type", &self.fs_type())
            .field("source", &self.source())
            .field("super_options", &self.super_options())
            .finish()
    }
}

fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        // `n % 10` is below 10, so the cast cannot truncate.
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// One optional field (field 7 of a line): the mount's propagation state, or a tag this crate
/// does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OptionalField<'a> {
    /// `shared:N`: the mount is in peer group `N`.
    Shared(u64),
    /// `master:N`: the mount is a slave of peer group `N`.
    Master(u64),
    /// `propagate_from:N`: the mount receives propagation from peer group `N` (the closest
    /// dominant group, when the master is not visible to the reader).
    PropagateFrom(u64),
    /// `unbindable`: the mount cannot be bind mounted.
    Unbindable,
    /// Any other field, as written. A known tag with a number in a form the kernel never writes
    /// (`shared:007`) lands here too, so that it renders unchanged.
    Unknown(&'a [u8]),
}

impl<'a> OptionalField<'a> {
    fn parse(raw: &'a [u8]) -> Self {
        let tagged = |tag: &[u8]| {
            raw.strip_prefix(tag)
                .and_then(crate::parse::canonical_decimal)
        };
        if raw == b"unbindable" {
            Self::Unbindable
        } else if let Some(n) = tagged(b"shared:") {
            Self::Shared(n)
        } else if let Some(n) = tagged(b"master:") {
            Self::Master(n)
        } else if let Some(n) = tagged(b"propagate_from:") {
            Self::PropagateFrom(n)
        } else {
            Self::Unknown(raw)
        }
    }

    fn render(&self, out: &mut Vec<u8>) {
        let (tag, n): (&[u8], u64) = match *self {
            Self::Shared(n) => (b"shared:", n),
            Self::Master(n) => (b"master:", n),
            Self::PropagateFrom(n) => (b"propagate_from:", n),
            Self::Unbindable => return out.extend_from_slice(b"unbindable"),
            Self::Unknown(raw) => return out.extend_from_slice(raw),
        };
        out.extend_from_slice(tag);
        push_decimal(out, n);
    }
}

/// A comma-separated option list (mount options or super options), kept as raw bytes.
///
/// Lookups are exact: `has_flag("ro")` does not match `rootcontext=…`, and `value("mode")` does
/// not match `modes=…`. Values are returned as written; escapes a filesystem put into its own
/// super options (such as `\054` for a comma) are not decoded.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Options<'a>(&'a [u8]);

impl<'a> Options<'a> {
    /// The whole list as written.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.0
    }

    /// Every option as `(name, value)`: `rw` is `(b"rw", None)`, `mode=755` is
    /// `(b"mode", Some(b"755"))`. Empty items (`a,,b`) are skipped.
    pub fn iter(&self) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + use<'a> {
        self.0
            .split(|&b| b == b',')
            .filter(|item| !item.is_empty())
            .map(|item| match item.iter().position(|&b| b == b'=') {
                Some(eq) => (&item[..eq], Some(&item[eq + 1..])),
                None => (item, None),
            })
    }

    /// The options that carry no value (`rw`, `nosuid`, `relatime`).
    pub fn flags(&self) -> impl Iterator<Item = &'a [u8]> + use<'a> {
        self.iter()
            .filter_map(|(name, value)| value.is_none().then_some(name))
    }

    /// Whether the list holds exactly this flag (an option without `=`).
    pub fn has_flag(&self, flag: impl AsRef<[u8]>) -> bool {
        let flag = flag.as_ref();
        self.flags().any(|f| f == flag)
    }

    /// The value of the option whose name is exactly `name`; the last one when it repeats, as
    /// later options override earlier ones. `name=` gives `Some(b"")`.
    pub fn value(&self, name: impl AsRef<[u8]>) -> Option<&'a [u8]> {
        let name = name.as_ref();
        self.iter()
            .filter(|(n, _)| *n == name)
            .filter_map(|(_, v)| v)
            .last()
    }
}

impl fmt::Debug for Options<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0.escape_ascii())
    }
}
