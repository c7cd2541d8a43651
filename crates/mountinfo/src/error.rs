//! The parse error: which line, and what was wrong with it.

use std::fmt;

/// A line of a mountinfo table could not be parsed.
///
/// The error is opaque on purpose: match on [`Error::kind`] and read [`Error::line`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    line: usize,
    kind: ErrorKind,
}

impl Error {
    pub(crate) fn new(line: usize, kind: ErrorKind) -> Self {
        Self { line, kind }
    }

    /// The 1-based number of the offending line.
    pub fn line(&self) -> usize {
        self.line
    }

    /// What was wrong with the line.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mountinfo line {}: {}", self.line, self.kind)
    }
}

impl std::error::Error for Error {}

/// The kind of a parse [`Error`].
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The line was empty (the kernel never writes an empty line).
    EmptyLine,
    /// The line ended before this field.
    MissingField(Field),
    /// This field is not a plain decimal number that fits its type (`major:minor` for
    /// [`Field::Device`]). Signs, leading zeros and empty numbers are refused.
    InvalidNumber(Field),
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EmptyLine => f.write_str("empty line"),
            Self::MissingField(field) => write!(f, "missing {field}"),
            Self::InvalidNumber(field) => write!(f, "invalid {field}"),
        }
    }
}

/// A field of a mountinfo line, in the order the kernel writes them.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// (1) the mount ID.
    MountId,
    /// (2) the parent mount's ID.
    ParentId,
    /// (3) `major:minor` of the filesystem's device.
    Device,
    /// (4) the root of the mount within its filesystem.
    Root,
    /// (5) the mount point.
    MountPoint,
    /// (6) the per-mount options.
    MountOptions,
    /// (8) the `-` that ends the optional fields.
    Separator,
    /// (9) the filesystem type.
    FsType,
    /// (10) the mount source.
    Source,
    /// (11) the per-superblock options.
    SuperOptions,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::MountId => "mount ID",
            Self::ParentId => "parent mount ID",
            Self::Device => "major:minor device number",
            Self::Root => "root",
            Self::MountPoint => "mount point",
            Self::MountOptions => "mount options",
            Self::Separator => "`-` separator after the optional fields",
            Self::FsType => "filesystem type",
            Self::Source => "mount source",
            Self::SuperOptions => "super options",
        })
    }
}
