//! Conversions between the protocol's attributes and the core's.

use lease_client::v1;

use crate::reply::{Attributes, FileKind, Timestamp};

/// The file type bits of a mode.
fn kind_of(mode: u32) -> FileKind {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileKind::Directory,
        libc::S_IFLNK => FileKind::Symlink,
        libc::S_IFBLK => FileKind::BlockDevice,
        libc::S_IFCHR => FileKind::CharDevice,
        libc::S_IFIFO => FileKind::Fifo,
        libc::S_IFSOCK => FileKind::Socket,
        _ => FileKind::Regular,
    }
}

/// The file type of a `DirEntry.file_type` (the `S_IFMT` bits, or a `DT_*` value).
pub(crate) fn kind_of_entry(file_type: u32) -> FileKind {
    if file_type & libc::S_IFMT != 0 {
        return kind_of(file_type);
    }
    match u8::try_from(file_type).unwrap_or(0) {
        libc::DT_DIR => FileKind::Directory,
        libc::DT_LNK => FileKind::Symlink,
        libc::DT_BLK => FileKind::BlockDevice,
        libc::DT_CHR => FileKind::CharDevice,
        libc::DT_FIFO => FileKind::Fifo,
        libc::DT_SOCK => FileKind::Socket,
        _ => FileKind::Regular,
    }
}

/// A protocol time for the kernel: nanoseconds past a second's end are clamped to it, and no
/// time is the epoch.
fn time(t: Option<&v1::Timestamp>) -> Timestamp {
    match t {
        Some(t) => Timestamp {
            sec: t.sec,
            nsec: t.nsec.min(999_999_999),
        },
        None => Timestamp::default(),
    }
}

/// The attributes of the file with node ID `ino`.
pub(crate) fn file_attr(ino: u64, attr: &v1::Attr) -> Attributes {
    Attributes {
        ino,
        size: attr.size,
        blocks: attr.blocks,
        atime: time(attr.atime.as_ref()),
        mtime: time(attr.mtime.as_ref()),
        ctime: time(attr.ctime.as_ref()),
        kind: kind_of(attr.mode),
        perm: (attr.mode & 0o7777) as u16,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: u32::try_from(attr.rdev).unwrap_or(0),
        blksize: attr.blksize,
    }
}

/// A protocol timestamp for one of the kernel's, unchanged.
pub(crate) fn timestamp(t: Timestamp) -> v1::Timestamp {
    v1::Timestamp {
        sec: t.sec,
        nsec: t.nsec,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_split_into_kind_and_permissions() {
        let attr = v1::Attr {
            mode: libc::S_IFDIR | 0o1755,
            nlink: 2,
            ..Default::default()
        };
        let converted = file_attr(7, &attr);
        assert_eq!(converted.kind, FileKind::Directory);
        assert_eq!(converted.perm, 0o1755);
        assert_eq!(converted.ino, 7);
        assert_eq!(kind_of_entry(u32::from(libc::DT_LNK)), FileKind::Symlink);
        assert_eq!(kind_of_entry(libc::S_IFIFO), FileKind::Fifo);
    }

    #[test]
    fn nanoseconds_past_the_second_are_clamped_and_no_time_is_the_epoch() {
        let attr = v1::Attr {
            mtime: Some(v1::Timestamp {
                sec: -3,
                nsec: 1_500_000_000,
            }),
            ctime: Some(v1::Timestamp { sec: 9, nsec: 42 }),
            ..Default::default()
        };
        let converted = file_attr(1, &attr);
        assert_eq!(converted.atime, Timestamp { sec: 0, nsec: 0 });
        assert_eq!(
            converted.mtime,
            Timestamp {
                sec: -3,
                nsec: 999_999_999
            }
        );
        assert_eq!(converted.ctime, Timestamp { sec: 9, nsec: 42 });
    }
}
