//! Conversions between the protocol's attributes and the kernel's.

use fuse3::FileType;
use fuse3::raw::reply::FileAttr;
use lease_client::v1;

/// The file type bits of a mode.
fn kind_of(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

/// The kernel's file type from a `DirEntry.file_type` (the `S_IFMT` bits, or a `DT_*` value).
pub(crate) fn kind_of_entry(file_type: u32) -> FileType {
    if file_type & libc::S_IFMT != 0 {
        return kind_of(file_type);
    }
    match u8::try_from(file_type).unwrap_or(0) {
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_BLK => FileType::BlockDevice,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_FIFO => FileType::NamedPipe,
        libc::DT_SOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn time(t: Option<&v1::Timestamp>) -> fuse3::Timestamp {
    match t {
        Some(t) => fuse3::Timestamp::new(t.sec, t.nsec.min(999_999_999)),
        None => fuse3::Timestamp::new(0, 0),
    }
}

/// The kernel's attributes for the file with node ID `ino`.
pub(crate) fn file_attr(ino: u64, attr: &v1::Attr) -> FileAttr {
    FileAttr {
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

/// A protocol timestamp for a kernel one.
pub(crate) fn timestamp(t: fuse3::Timestamp) -> v1::Timestamp {
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
        assert_eq!(converted.kind, FileType::Directory);
        assert_eq!(converted.perm, 0o1755);
        assert_eq!(converted.ino, 7);
        assert_eq!(kind_of_entry(u32::from(libc::DT_LNK)), FileType::Symlink);
        assert_eq!(kind_of_entry(libc::S_IFIFO), FileType::NamedPipe);
    }
}
