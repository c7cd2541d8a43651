//! [`MountTable`]: the parsed table and its queries.

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};
use std::sync::OnceLock;

use crate::error::Error;
use crate::mount::Mount;
use crate::parse;

/// A parsed mountinfo table that borrows the bytes it was parsed from.
///
/// Mounts keep the kernel's order. Where several mounts sit on the same mount point, the later
/// one is taken as the one on top (the kernel lists a mount after the one it covers), so
/// "topmost" below means "last in the table".
///
/// Path queries compare whole components, as [`Path`] does: `/mnt/` and `/mnt//.` name the same
/// point as `/mnt`, `/mnt/a` is never below `/mnt/ab`, and `..` is not resolved. A relative path
/// matches nothing. No query looks at the filesystem: no `stat`, no `realpath`, no symlinks
/// followed.
#[derive(Clone)]
pub struct MountTable<'a> {
    mounts: Vec<Mount<'a>>,
    canonical: bool,
    index: OnceLock<Index>,
}

/// Mount positions sorted by mount ID and by parent ID, built on the first lookup by ID.
#[derive(Debug, Clone)]
struct Index {
    by_id: Vec<(u64, usize)>,
    by_parent: Vec<(u64, usize)>,
}

impl<'a> MountTable<'a> {
    /// Parses a table as read from `/proc/<pid>/mountinfo`.
    ///
    /// An empty input is an empty table. The last line may lack its newline.
    ///
    /// # Errors
    /// The first line that is not a mountinfo line, with its 1-based number and what was wrong.
    pub fn parse(input: &'a [u8]) -> Result<Self, Error> {
        let (mounts, canonical) = parse::parse_table(input)?;
        Ok(Self {
            mounts,
            canonical,
            index: OnceLock::new(),
        })
    }

    /// The mounts in table order.
    pub fn iter(&self) -> std::slice::Iter<'_, Mount<'a>> {
        self.mounts.iter()
    }

    /// The mounts in table order, as a slice.
    pub fn as_slice(&self) -> &[Mount<'a>] {
        &self.mounts
    }

    /// The number of mounts.
    pub fn len(&self) -> usize {
        self.mounts.len()
    }

    /// Whether the table has no mount.
    pub fn is_empty(&self) -> bool {
        self.mounts.is_empty()
    }

    /// The topmost mount whose mount point is exactly `path`.
    pub fn by_mount_point(&self, path: impl AsRef<Path>) -> Option<&Mount<'a>> {
        if !path.as_ref().is_absolute() {
            return None;
        }
        let wanted = PathKey::new(path.as_ref());
        self.mounts
            .iter()
            .rev()
            .find(|m| wanted.matches(&m.mount_point))
    }

    /// Whether some mount sits exactly at `path`, decided from the table alone.
    pub fn is_mount_point(&self, path: impl AsRef<Path>) -> bool {
        self.by_mount_point(path).is_some()
    }

    /// The mounts at `path` or anywhere below it, in table order. `/a` covers `/a` and `/a/b`,
    /// never `/ab`. A relative path, the empty path included, matches nothing.
    pub fn mounts_at_or_below(&self, path: impl AsRef<Path>) -> impl Iterator<Item = &Mount<'a>> {
        let base = path.as_ref().to_path_buf();
        // Every path starts with the empty path: without this, "" would name every mount.
        let absolute = base.is_absolute();
        self.mounts
            .iter()
            .filter(move |m| absolute && m.mount_point().starts_with(&base))
    }

    /// The mount that `path` is on: the topmost mount whose mount point is the longest
    /// component-wise prefix of `path`. `None` only for a relative path (the empty path
    /// included) or a table without `/`.
    pub fn containing(&self, path: impl AsRef<Path>) -> Option<&Mount<'a>> {
        let path = path.as_ref();
        if !path.is_absolute() {
            return None;
        }
        let mut best: Option<(usize, &Mount<'a>)> = None;
        for m in &self.mounts {
            if path.starts_with(m.mount_point()) {
                let depth = m.mount_point().components().count();
                if best.is_none_or(|(d, _)| depth >= d) {
                    best = Some((depth, m));
                }
            }
        }
        best.map(|(_, m)| m)
    }

    /// The mounts whose source is exactly `source`, in table order.
    pub fn by_source(&self, source: impl AsRef<OsStr>) -> impl Iterator<Item = &Mount<'a>> {
        let wanted = source.as_ref().as_bytes().to_vec();
        self.mounts.iter().filter(move |m| *m.source == *wanted)
    }

    /// The mounts whose filesystem type is exactly `fs_type` (`fuse.sshfs` is not `fuse`), in
    /// table order.
    pub fn by_fs_type(&self, fs_type: impl AsRef<OsStr>) -> impl Iterator<Item = &Mount<'a>> {
        let wanted = fs_type.as_ref().as_bytes().to_vec();
        self.mounts.iter().filter(move |m| *m.fs_type == *wanted)
    }

    /// The mounts that show directory `root` of the filesystem on device `major:minor`, in table
    /// order: a bind mount and the mount it was made from share all three.
    pub fn by_device_and_root(
        &self,
        major: u32,
        minor: u32,
        root: impl AsRef<Path>,
    ) -> impl Iterator<Item = &Mount<'a>> {
        let wanted = PathKey::new(root.as_ref());
        self.mounts
            .iter()
            .filter(move |m| m.major == major && m.minor == minor && wanted.matches(&m.root))
    }

    /// The mount with this ID (the first, should a malformed table repeat an ID).
    pub fn by_mount_id(&self, id: u64) -> Option<&Mount<'a>> {
        let by_id = &self.index().by_id;
        let at = by_id.partition_point(|&(k, _)| k < id);
        by_id
            .get(at)
            .filter(|&&(k, _)| k == id)
            .and_then(|&(_, i)| self.mounts.get(i))
    }

    /// The mount's parent, when it is in the table. The top of the tree (its own parent) and a
    /// mount whose parent is outside the reader's view (a chroot, a container) have none.
    pub fn parent(&self, mount: &Mount<'_>) -> Option<&Mount<'a>> {
        if mount.parent_id == mount.mount_id {
            return None;
        }
        self.by_mount_id(mount.parent_id)
    }

    /// The mounts whose parent is the mount with ID `id`, in table order (a mount is never its
    /// own child).
    pub fn children(&self, id: u64) -> impl Iterator<Item = &Mount<'a>> {
        let by_parent = &self.index().by_parent;
        let start = by_parent.partition_point(|&(k, _)| k < id);
        by_parent[start..]
            .iter()
            .take_while(move |&&(k, _)| k == id)
            .filter_map(|&(_, i)| self.mounts.get(i))
            .filter(move |m| m.mount_id != id)
    }

    /// The table as the kernel would write it. See [`Mount::render`].
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.mounts.len() * 128);
        for m in &self.mounts {
            m.render(&mut out);
        }
        out
    }

    /// Whether the parsed input was exactly what [`MountTable::render`] gives back.
    pub(crate) fn was_canonical(&self) -> bool {
        self.canonical
    }

    fn index(&self) -> &Index {
        self.index.get_or_init(|| {
            let mut by_id: Vec<_> = self
                .mounts
                .iter()
                .enumerate()
                .map(|(i, m)| (m.mount_id, i))
                .collect();
            let mut by_parent: Vec<_> = self
                .mounts
                .iter()
                .enumerate()
                .map(|(i, m)| (m.parent_id, i))
                .collect();
            by_id.sort_unstable();
            by_parent.sort_unstable();
            Index { by_id, by_parent }
        })
    }
}

impl PartialEq for MountTable<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.mounts == other.mounts
    }
}

impl Eq for MountTable<'_> {}

impl fmt::Debug for MountTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.mounts).finish()
    }
}

impl<'t, 'a> IntoIterator for &'t MountTable<'a> {
    type Item = &'t Mount<'a>;
    type IntoIter = std::slice::Iter<'t, Mount<'a>>;

    fn into_iter(self) -> Self::IntoIter {
        self.mounts.iter()
    }
}

/// A path prepared for comparison with many mount points: its components joined by single
/// slashes. That is the shortest spelling of the path, and the kernel writes mount points that
/// way, so most comparisons are plain bytes.
struct PathKey {
    normal: Vec<u8>,
}

impl PathKey {
    fn new(path: &Path) -> Self {
        Self {
            normal: normal_form(path),
        }
    }

    fn matches(&self, candidate: &[u8]) -> bool {
        let normal = self.normal.as_slice();
        // Not longer than the shortest spelling: equal paths are equal bytes.
        if candidate.len() <= normal.len() {
            return candidate == normal;
        }
        match (normal.first(), candidate.first()) {
            // Compared from the last component, where mount points usually differ first.
            (Some(b'/'), Some(b'/')) => components_rev(candidate).eq(components_rev(normal)),
            (Some(b'/'), _) | (_, Some(b'/')) => false,
            _ => Path::new(OsStr::from_bytes(candidate)) == Path::new(OsStr::from_bytes(normal)),
        }
    }
}

/// The components of an absolute path, last first, as [`Path::components`] sees them.
fn components_rev(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.rsplit(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
}

fn normal_form(path: &Path) -> Vec<u8> {
    let mut normal = Vec::with_capacity(path.as_os_str().len());
    for c in path.components() {
        if !matches!(normal.last(), None | Some(b'/')) {
            normal.push(b'/');
        }
        match c {
            Component::RootDir => normal.push(b'/'),
            other => normal.extend_from_slice(other.as_os_str().as_bytes()),
        }
    }
    normal
}
