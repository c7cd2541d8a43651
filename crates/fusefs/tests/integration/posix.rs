//! POSIX behaviour through a real mount: what SEMANTICS.md says is supported, checked with the
//! system calls applications make.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, CWD, Mode, OFlags, RenameFlags, Timespec, Timestamps, UTIME_OMIT};
use worker::AccessMode;

use crate::support::{NOBODY, Setup, as_user, errno_of, on_fresh_and_adopted_mounts};

const LIMIT: Duration = Duration::from_secs(60);

// Every test here runs on a fresh mount and on an adopted one.
on_fresh_and_adopted_mounts! {
    files_directories_and_links_behave,
    create_write_read_and_truncate,
    large_writes_and_reads_cross_the_request_size,
    a_write_is_seen_by_another_open_at_once,
    rename_replaces_and_honours_its_flags,
    hard_links_and_symbolic_links,
    modes_owners_times_and_umask,
    directories_are_made_listed_and_removed,
    readdir_lists_ten_thousand_entries_once_each,
    an_unlinked_open_file_keeps_its_data,
    default_permissions_deny_another_user,
    statfs_reports_the_workers_filesystem,
    unsupported_operations_fail_as_documented,
    a_full_readdirplus_reply_leaks_no_node,
    unlinking_while_listing_skips_no_remaining_entry,
}

fn files_directories_and_links_behave() {
    let Some(setup) = Setup::new("files_directories_and_links_behave", AccessMode::Rwx, LIMIT)
    else {
        return;
    };
    let root = setup.root();

    // create, write, read
    let file = root.join("hello.txt");
    fs::write(&file, b"hello world").unwrap();
    assert_eq!(fs::read(&file).unwrap(), b"hello world");
    assert_eq!(
        fs::read(setup.volume.backing_dir().join("hello.txt")).unwrap(),
        b"hello world",
        "the worker holds the bytes"
    );

    // truncate and append
    let f = fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(5).unwrap();
    drop(f);
    assert_eq!(fs::read(&file).unwrap(), b"hello");
    let mut f = fs::OpenOptions::new().append(true).open(&file).unwrap();
    f.write_all(b", again").unwrap();
    drop(f);
    assert_eq!(fs::read_to_string(&file).unwrap(), "hello, again");

    // seek and partial read
    let mut f = fs::File::open(&file).unwrap();
    f.seek(SeekFrom::Start(7)).unwrap();
    let mut rest = String::new();
    f.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "again");
    drop(f);

    // mkdir, rename (over an existing file too), link, symlink, readlink
    fs::create_dir(root.join("dir")).unwrap();
    fs::rename(&file, root.join("dir/moved.txt")).unwrap();
    fs::write(root.join("dir/other.txt"), b"other").unwrap();
    fs::rename(root.join("dir/other.txt"), root.join("dir/moved.txt")).unwrap();
    assert_eq!(fs::read(root.join("dir/moved.txt")).unwrap(), b"other");
    fs::hard_link(root.join("dir/moved.txt"), root.join("hard")).unwrap();
    assert_eq!(fs::metadata(root.join("hard")).unwrap().nlink(), 2);
    std::os::unix::fs::symlink("dir/moved.txt", root.join("soft")).unwrap();
    assert_eq!(
        fs::read_link(root.join("soft")).unwrap().to_str(),
        Some("dir/moved.txt")
    );
    assert_eq!(fs::read(root.join("soft")).unwrap(), b"other");

    // chmod, readdir
    fs::set_permissions(root.join("hard"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        fs::metadata(root.join("hard")).unwrap().mode() & 0o7777,
        0o600
    );
    let mut names: Vec<String> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["dir", "hard", "soft"]);

    // unlink, rmdir
    fs::remove_file(root.join("soft")).unwrap();
    fs::remove_file(root.join("hard")).unwrap();
    assert_eq!(
        fs::remove_dir(root.join("dir")).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    fs::remove_file(root.join("dir/moved.txt")).unwrap();
    fs::remove_dir(root.join("dir")).unwrap();
    assert_eq!(fs::read_dir(&root).unwrap().count(), 0);

    setup.finish();
}

fn create_write_read_and_truncate() {
    let Some(setup) = Setup::new("create_write_read_and_truncate", AccessMode::Rwx, LIMIT) else {
        return;
    };
    let root = setup.root();
    let file = root.join("f");

    // O_CREAT|O_EXCL creates once, then refuses.
    let f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&file)
        .unwrap();
    assert_eq!(
        errno_of(
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&file)
        ),
        Some(libc::EEXIST)
    );
    assert_eq!(f.metadata().unwrap().len(), 0);

    // Writes at offsets; a write past the end leaves a hole that reads as zeros.
    f.write_all_at(b"abc", 0).unwrap();
    f.write_all_at(b"xyz", 10).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 13);
    assert_eq!(fs::read(&file).unwrap(), b"abc\0\0\0\0\0\0\0xyz");
    f.write_all_at(b"B", 1).unwrap();
    let mut buf = [0u8; 4];
    assert_eq!(
        f.read_at(&mut buf, 0).unwrap_err().raw_os_error(),
        Some(libc::EBADF),
        "write-only"
    );
    drop(f);
    let f = fs::File::open(&file).unwrap();
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), 4);
    assert_eq!(&buf, b"aBc\0");
    assert_eq!(
        f.read_at(&mut buf, 12).unwrap(),
        1,
        "a short read at the end"
    );
    assert_eq!(f.read_at(&mut buf, 13).unwrap(), 0, "end of file");
    assert_eq!(f.read_at(&mut buf, 1 << 40).unwrap(), 0, "far past the end");
    drop(f);

    // ftruncate longer (zeros) and shorter; truncate by path.
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&file)
        .unwrap();
    f.set_len(20).unwrap();
    assert_eq!(fs::metadata(&file).unwrap().len(), 20);
    assert_eq!(&fs::read(&file).unwrap()[13..], [0u8; 7]);
    f.set_len(2).unwrap();
    assert_eq!(fs::read(&file).unwrap(), b"aB");
    drop(f);
    rustix::fs::open(&file, OFlags::WRONLY | OFlags::TRUNC, Mode::empty()).unwrap();
    assert_eq!(fs::metadata(&file).unwrap().len(), 0, "O_TRUNC truncates");

    // O_APPEND always writes at the end, whatever the offset.
    fs::write(&file, b"one").unwrap();
    let mut f = fs::OpenOptions::new().append(true).open(&file).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(b"two").unwrap();
    drop(f);
    assert_eq!(fs::read(&file).unwrap(), b"onetwo");

    // Opening a missing file, or a directory for writing, fails as POSIX says.
    assert_eq!(
        errno_of(fs::File::open(root.join("missing"))),
        Some(libc::ENOENT)
    );
    fs::create_dir(root.join("d")).unwrap();
    assert_eq!(
        errno_of(fs::OpenOptions::new().write(true).open(root.join("d"))),
        Some(libc::EISDIR)
    );
    assert_eq!(
        errno_of(fs::File::open(root.join("f/below"))),
        Some(libc::ENOTDIR)
    );
    // A name longer than NAME_MAX.
    assert_eq!(
        errno_of(fs::write(root.join("n".repeat(256)), b"")),
        Some(libc::ENAMETOOLONG)
    );
    fs::write(root.join("n".repeat(255)), b"longest").unwrap();

    setup.finish();
}

/// A pattern that differs at every offset within a 1 MiB request, so a misplaced chunk shows.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(2_654_435_761).to_le_bytes()[1])
        .collect()
}

fn large_writes_and_reads_cross_the_request_size() {
    let Some(setup) = Setup::new(
        "large_writes_and_reads_cross_the_request_size",
        AccessMode::Rwx,
        LIMIT,
    ) else {
        return;
    };
    let root = setup.root();
    let data = pattern(5 * 1024 * 1024 + 4321);
    let file = root.join("big");

    // One write(2) and one read(2), each over five 1 MiB requests.
    let before = setup.volume.arrivals();
    let mut f = fs::File::create(&file).unwrap();
    assert_eq!(
        f.write(&data).unwrap(),
        data.len(),
        "one write(2), not short"
    );
    drop(f);
    let writes = setup.volume.arrivals() - before;
    assert!(writes >= 6, "the write took {writes} calls");
    let mut f = fs::File::open(&file).unwrap();
    let mut back = vec![0u8; data.len() + 4096];
    let mut got = 0;
    while got < back.len() {
        let n = f.read(&mut back[got..]).unwrap();
        if n == 0 {
            break;
        }
        got += n;
    }
    back.truncate(got);
    assert!(back == data, "the bytes read back differ");
    assert!(
        fs::read(setup.volume.backing_dir().join("big")).unwrap() == data,
        "the worker holds other bytes"
    );

    // Unaligned reads across a request boundary.
    let mut piece = vec![0u8; 3 * 1024 * 1024];
    f.read_exact_at(&mut piece, 1024 * 1024 - 7).unwrap();
    assert!(piece[..] == data[1024 * 1024 - 7..4 * 1024 * 1024 - 7]);
    drop(f);

    // Appending: the worker's descriptor appends whatever the offset, so the parts of one
    // request must land in order.
    let mut f = fs::OpenOptions::new().append(true).open(&file).unwrap();
    assert_eq!(f.write(&data).unwrap(), data.len());
    drop(f);
    let whole = fs::read(setup.volume.backing_dir().join("big")).unwrap();
    assert_eq!(whole.len(), 2 * data.len());
    assert!(
        whole[..data.len()] == data[..] && whole[data.len()..] == data[..],
        "an appended write's parts landed out of order"
    );

    setup.finish();
}

fn a_write_is_seen_by_another_open_at_once() {
    let Some(setup) = Setup::new(
        "a_write_is_seen_by_another_open_at_once",
        AccessMode::Rwx,
        LIMIT,
    ) else {
        return;
    };
    let root = setup.root();
    let file = root.join("shared");
    let writer = fs::File::create(&file).unwrap();
    writer.write_all_at(b"first", 0).unwrap();
    let reader = fs::File::open(&file).unwrap();
    let mut buf = [0u8; 16];
    let n = reader.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"first");
    // Neither closes nor syncs: the next write is visible to the open reader at once.
    writer.write_all_at(b"-second", 5).unwrap();
    let n = reader.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"first-second");
    assert_eq!(
        reader.metadata().unwrap().len(),
        12,
        "fstat sees the new size"
    );
    writer.set_len(3).unwrap();
    let n = reader.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"fir");
    drop((writer, reader));
    setup.finish();
}

fn rename_replaces_and_honours_its_flags() {
    let Some(setup) = Setup::new(
        "rename_replaces_and_honours_its_flags",
        AccessMode::Rwx,
        LIMIT,
    ) else {
        return;
    };
    let root = setup.root();
    fs::write(root.join("a"), b"A").unwrap();
    fs::write(root.join("b"), b"B").unwrap();
    fs::create_dir_all(root.join("d/sub")).unwrap();
    fs::create_dir(root.join("empty")).unwrap();

    // Plain rename over an existing file replaces it; an open descriptor of the replaced
    // file still reads it.
    let replaced = fs::File::open(root.join("b")).unwrap();
    fs::rename(root.join("a"), root.join("b")).unwrap();
    assert_eq!(fs::read(root.join("b")).unwrap(), b"A");
    assert_eq!(errno_of(fs::metadata(root.join("a"))), Some(libc::ENOENT));
    let mut buf = [0u8; 1];
    replaced.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"B");
    drop(replaced);

    // RENAME_NOREPLACE refuses an existing target and works onto a free name.
    fs::write(root.join("c"), b"C").unwrap();
    let renameat2 = |from: &str, to: &str, flags| {
        rustix::fs::renameat_with(CWD, root.join(from), CWD, root.join(to), flags)
            .map_err(|e| e.raw_os_error())
    };
    assert_eq!(
        renameat2("c", "b", RenameFlags::NOREPLACE),
        Err(libc::EEXIST)
    );
    assert_eq!(
        fs::read(root.join("b")).unwrap(),
        b"A",
        "nothing was replaced"
    );
    assert_eq!(renameat2("c", "free", RenameFlags::NOREPLACE), Ok(()));

    // RENAME_EXCHANGE swaps two names (a file and a directory, even); both must exist.
    assert_eq!(renameat2("free", "b", RenameFlags::EXCHANGE), Ok(()));
    assert_eq!(fs::read(root.join("b")).unwrap(), b"C");
    assert_eq!(fs::read(root.join("free")).unwrap(), b"A");
    assert_eq!(renameat2("b", "d", RenameFlags::EXCHANGE), Ok(()));
    assert!(fs::metadata(root.join("b/sub")).unwrap().is_dir());
    assert_eq!(fs::read(root.join("d")).unwrap(), b"C");
    assert_eq!(renameat2("b", "d", RenameFlags::EXCHANGE), Ok(()));
    assert_eq!(
        renameat2("b", "nothing", RenameFlags::EXCHANGE),
        Err(libc::ENOENT)
    );
    assert_eq!(
        renameat2("b", "free", RenameFlags::EXCHANGE | RenameFlags::NOREPLACE),
        Err(libc::EINVAL)
    );

    // Directories: onto an empty one replaces it; onto a non-empty one, a file, or into
    // itself fails.
    fs::create_dir(root.join("e2")).unwrap();
    fs::rename(root.join("e2"), root.join("empty")).unwrap();
    assert_eq!(errno_of(fs::metadata(root.join("e2"))), Some(libc::ENOENT));
    let rename = |from: &str, to: &str| errno_of(fs::rename(root.join(from), root.join(to)));
    assert!(matches!(
        rename("empty", "d"),
        Some(libc::ENOTEMPTY | libc::EEXIST)
    ));
    assert_eq!(rename("empty", "b"), Some(libc::ENOTDIR));
    assert_eq!(rename("b", "empty"), Some(libc::EISDIR));
    assert_eq!(rename("d", "d/sub/inside"), Some(libc::EINVAL));
    assert_eq!(rename("missing", "x"), Some(libc::ENOENT));
    // Across directories, and a rename onto itself (a no-op).
    fs::rename(root.join("b"), root.join("d/sub/b")).unwrap();
    assert_eq!(fs::read(root.join("d/sub/b")).unwrap(), b"C");
    fs::rename(root.join("d/sub/b"), root.join("d/sub/b")).unwrap();
    fs::rename(root.join("d/sub"), root.join("moved")).unwrap();
    assert_eq!(fs::read(root.join("moved/b")).unwrap(), b"C");

    setup.finish();
}

fn hard_links_and_symbolic_links() {
    let Some(setup) = Setup::new("hard_links_and_symbolic_links", AccessMode::Rwx, LIMIT) else {
        return;
    };
    let root = setup.root();
    fs::create_dir(root.join("d")).unwrap();
    fs::write(root.join("f"), b"data").unwrap();
    let ino = fs::metadata(root.join("f")).unwrap().ino();

    // Hard links share the inode, count up and down, and keep the data to the last one.
    fs::hard_link(root.join("f"), root.join("d/g")).unwrap();
    let g = fs::metadata(root.join("d/g")).unwrap();
    assert_eq!((g.ino(), g.nlink()), (ino, 2));
    fs::write(root.join("d/g"), b"changed").unwrap();
    assert_eq!(fs::read(root.join("f")).unwrap(), b"changed");
    assert_eq!(
        errno_of(fs::hard_link(root.join("f"), root.join("d/g"))),
        Some(libc::EEXIST)
    );
    assert_eq!(
        errno_of(fs::hard_link(root.join("d"), root.join("dlink"))),
        Some(libc::EPERM),
        "no hard links to directories"
    );
    fs::remove_file(root.join("f")).unwrap();
    let g = fs::metadata(root.join("d/g")).unwrap();
    assert_eq!((g.ino(), g.nlink()), (ino, 1));
    assert_eq!(fs::read(root.join("d/g")).unwrap(), b"changed");

    // Symbolic links: stored as given (relative, absolute, dangling), followed by the kernel.
    std::os::unix::fs::symlink("d/g", root.join("rel")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", root.join("abs")).unwrap();
    std::os::unix::fs::symlink("missing", root.join("dangling")).unwrap();
    let long_target = "x/".repeat(1000) + "end";
    std::os::unix::fs::symlink(&long_target, root.join("long")).unwrap();
    assert_eq!(fs::read_link(root.join("rel")).unwrap(), Path::new("d/g"));
    assert_eq!(
        fs::read_link(root.join("abs")).unwrap(),
        Path::new("/nonexistent/target")
    );
    assert_eq!(
        fs::read_link(root.join("long")).unwrap(),
        Path::new(&long_target)
    );
    assert_eq!(fs::read(root.join("rel")).unwrap(), b"changed");
    assert_eq!(
        errno_of(fs::read(root.join("dangling"))),
        Some(libc::ENOENT)
    );
    let link = fs::symlink_metadata(root.join("rel")).unwrap();
    assert!(link.file_type().is_symlink());
    assert_eq!(link.len(), 3, "a link's size is its target's length");
    assert_eq!(link.mode() & 0o777, 0o777);
    assert_eq!(
        errno_of(fs::read_link(root.join("d/g"))),
        Some(libc::EINVAL),
        "readlink of a file"
    );
    assert_eq!(
        errno_of(std::os::unix::fs::symlink("x", root.join("rel"))),
        Some(libc::EEXIST)
    );
    // O_NOFOLLOW on a link, a link to a directory, a link in a path.
    assert_eq!(
        rustix::fs::open(
            root.join("rel"),
            OFlags::RDONLY | OFlags::NOFOLLOW,
            Mode::empty()
        )
        .map(drop)
        .map_err(|e| e.raw_os_error()),
        Err(libc::ELOOP)
    );
    std::os::unix::fs::symlink("d", root.join("dirlink")).unwrap();
    assert_eq!(fs::read(root.join("dirlink/g")).unwrap(), b"changed");
    // Hard-linking a symbolic link links the link itself.
    rustix::fs::linkat(
        CWD,
        root.join("rel"),
        CWD,
        root.join("rel2"),
        AtFlags::empty(),
    )
    .unwrap();
    assert_eq!(fs::read_link(root.join("rel2")).unwrap(), Path::new("d/g"));
    fs::remove_file(root.join("rel")).unwrap();
    assert_eq!(
        fs::read(root.join("d/g")).unwrap(),
        b"changed",
        "the target stays"
    );

    setup.finish();
}

fn modes_owners_times_and_umask() {
    let Some(setup) = Setup::new("modes_owners_times_and_umask", AccessMode::Rwx, LIMIT) else {
        return;
    };
    let root = setup.root();
    let backing = setup.volume.backing_dir();
    let file = root.join("f");
    fs::write(&file, b"x").unwrap();

    // chmod, special bits included.
    for mode in [0o4755, 0o2710, 0o1777, 0o0, 0o644] {
        fs::set_permissions(&file, fs::Permissions::from_mode(mode)).unwrap();
        assert_eq!(
            fs::metadata(&file).unwrap().mode() & 0o7777,
            mode,
            "{mode:o}"
        );
        assert_eq!(
            fs::metadata(backing.join("f")).unwrap().mode() & 0o7777,
            mode
        );
    }

    // chown and chgrp, by root; seen through the mount and on the worker's disk.
    std::os::unix::fs::chown(&file, Some(1000), Some(2000)).unwrap();
    let meta = fs::metadata(&file).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1000, 2000));
    let meta = fs::metadata(backing.join("f")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1000, 2000));
    std::os::unix::fs::chown(&file, None, Some(3000)).unwrap();
    let meta = fs::metadata(&file).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1000, 3000));
    std::os::unix::fs::lchown(&file, Some(0), Some(0)).unwrap();

    // utimens: exact atime and mtime with nanoseconds, one left alone with UTIME_OMIT, and
    // "now".
    let at = |sec, nsec| Timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    };
    let times = Timestamps {
        last_access: at(1_000_000_000, 123_456_789),
        last_modification: at(1_500_000_000, 987_654_321),
    };
    rustix::fs::utimensat(CWD, &file, &times, AtFlags::empty()).unwrap();
    let meta = fs::metadata(&file).unwrap();
    assert_eq!(
        (meta.atime(), meta.atime_nsec()),
        (1_000_000_000, 123_456_789)
    );
    assert_eq!(
        (meta.mtime(), meta.mtime_nsec()),
        (1_500_000_000, 987_654_321)
    );
    let omit = Timestamps {
        last_access: at(0, UTIME_OMIT),
        last_modification: at(1_600_000_000, 5),
    };
    rustix::fs::utimensat(CWD, &file, &omit, AtFlags::empty()).unwrap();
    let meta = fs::metadata(&file).unwrap();
    assert_eq!(
        (meta.atime(), meta.atime_nsec()),
        (1_000_000_000, 123_456_789)
    );
    assert_eq!((meta.mtime(), meta.mtime_nsec()), (1_600_000_000, 5));
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(std::time::SystemTime::now())
        .unwrap();
    assert!(fs::metadata(&file).unwrap().mtime() >= before);
    // A write moves mtime forward.
    rustix::fs::utimensat(CWD, &file, &times, AtFlags::empty()).unwrap();
    fs::write(&file, b"y").unwrap();
    assert!(fs::metadata(&file).unwrap().mtime() >= before);
    // utimens on a symbolic link itself.
    std::os::unix::fs::symlink("f", root.join("l")).unwrap();
    rustix::fs::utimensat(CWD, root.join("l"), &times, AtFlags::SYMLINK_NOFOLLOW).unwrap();
    let meta = fs::symlink_metadata(root.join("l")).unwrap();
    assert_eq!(
        (meta.mtime(), meta.mtime_nsec()),
        (1_500_000_000, 987_654_321)
    );

    // The umask applies to files, directories and special files created through the mount.
    let old = rustix::process::umask(Mode::from_raw_mode(0o027));
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .open(root.join("masked"))
        .unwrap();
    std::os::unix::fs::DirBuilderExt::mode(&mut fs::DirBuilder::new(), 0o777)
        .create(root.join("masked-dir"))
        .unwrap();
    rustix::fs::mknodat(
        CWD,
        root.join("fifo"),
        rustix::fs::FileType::Fifo,
        Mode::from_raw_mode(0o666),
        0,
    )
    .unwrap();
    rustix::process::umask(old);
    assert_eq!(
        fs::metadata(root.join("masked")).unwrap().mode() & 0o7777,
        0o640
    );
    assert_eq!(
        fs::metadata(root.join("masked-dir")).unwrap().mode() & 0o7777,
        0o750
    );
    // Device nodes and sockets are made by root and stored as made; the mount is `nodev`, so
    // the kernel refuses to open a device node on it.
    rustix::fs::mknodat(
        CWD,
        root.join("null"),
        rustix::fs::FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        rustix::fs::makedev(1, 3),
    )
    .unwrap();
    assert_eq!(
        fs::write(root.join("null"), b"into /dev/null")
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EACCES),
        "a device node on a nodev mount"
    );
    assert_eq!(
        fs::metadata(root.join("null")).unwrap().rdev(),
        rustix::fs::makedev(1, 3)
    );
    rustix::fs::mknodat(
        CWD,
        root.join("sock"),
        rustix::fs::FileType::Socket,
        Mode::from_raw_mode(0o666),
        0,
    )
    .unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_socket(
        &fs::symlink_metadata(root.join("sock")).unwrap().file_type()
    ));
    let fifo = fs::metadata(root.join("fifo")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&fifo.file_type()));
    assert_eq!(fifo.mode() & 0o7777, 0o640);

    setup.finish();
}

fn directories_are_made_listed_and_removed() {
    let Some(setup) = Setup::new(
        "directories_are_made_listed_and_removed",
        AccessMode::Rwx,
        LIMIT,
    ) else {
        return;
    };
    let root = setup.root();
    fs::create_dir(root.join("d")).unwrap();
    assert_eq!(errno_of(fs::create_dir(root.join("d"))), Some(libc::EEXIST));
    assert_eq!(
        errno_of(fs::create_dir(root.join("missing/d"))),
        Some(libc::ENOENT)
    );
    fs::create_dir_all(root.join("d/a/b/c")).unwrap();
    fs::create_dir(root.join("d/e")).unwrap();
    fs::write(root.join("d/file"), b"").unwrap();
    assert_eq!(
        fs::metadata(root.join("d")).unwrap().nlink(),
        4,
        "2 + one per subdirectory"
    );
    assert_eq!(
        errno_of(fs::remove_dir(root.join("d"))),
        Some(libc::ENOTEMPTY)
    );
    assert_eq!(
        errno_of(fs::remove_dir(root.join("d/file"))),
        Some(libc::ENOTDIR)
    );
    assert_eq!(
        errno_of(fs::remove_file(root.join("d/e"))),
        Some(libc::EISDIR)
    );
    assert_eq!(
        errno_of(fs::remove_file(root.join("d/x"))),
        Some(libc::ENOENT)
    );

    let mut names: Vec<_> = fs::read_dir(root.join("d"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                e.file_type().unwrap().is_dir(),
            )
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            ("a".to_owned(), true),
            ("e".to_owned(), true),
            ("file".to_owned(), false)
        ]
    );
    // `.` and `..` are listed by the raw interface.
    let mut dir = rustix::fs::Dir::read_from(
        rustix::fs::open(
            root.join("d"),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .unwrap(),
    )
    .unwrap();
    let mut raw = Vec::new();
    while let Some(entry) = dir.read() {
        raw.push(entry.unwrap().file_name().to_bytes().to_vec());
    }
    drop(dir);
    raw.sort();
    assert_eq!(raw, [&b"."[..], b"..", b"a", b"e", b"file"]);

    fs::remove_dir_all(root.join("d")).unwrap();
    assert_eq!(errno_of(fs::metadata(root.join("d"))), Some(libc::ENOENT));
    assert_eq!(fs::read_dir(&root).unwrap().count(), 0);
    setup.finish();
}

fn readdir_lists_ten_thousand_entries_once_each() {
    let Some(setup) = Setup::on_tmpfs(
        "readdir_lists_ten_thousand_entries_once_each",
        AccessMode::Rwx,
        LIMIT,
    ) else {
        return;
    };
    const COUNT: usize = 10_000;
    let root = setup.root();
    // Made on the worker's disk directly: this test is about listing them.
    let backing = setup.volume.backing_dir().join("many");
    fs::create_dir(&backing).unwrap();
    for i in 0..COUNT {
        fs::File::create(backing.join(format!("entry-{i:05}"))).unwrap();
    }
    for pass in ["first (the worker names 10,000 new inodes)", "second"] {
        let started = Instant::now();
        let mut seen = std::collections::HashMap::new();
        for entry in fs::read_dir(root.join("many")).unwrap() {
            *seen
                .entry(entry.unwrap().file_name().into_string().unwrap())
                .or_insert(0u32) += 1;
        }
        let took = started.elapsed();
        eprintln!("readdir of {COUNT} entries, {pass} pass: {took:?}");
        assert_eq!(seen.len(), COUNT);
        assert!(seen.values().all(|n| *n == 1), "an entry was listed twice");
        assert!((0..COUNT).all(|i| seen.contains_key(&format!("entry-{i:05}"))));
        assert!(took < Duration::from_secs(30), "listing took {took:?}");
    }
    // `ls -l` style, on every tenth entry (a stat is two calls, a few milliseconds each in a
    // debug build): the entries readdirplus handed the kernel are looked up by name.
    let started = Instant::now();
    let files = fs::read_dir(root.join("many"))
        .unwrap()
        .step_by(10)
        .filter(|e| e.as_ref().unwrap().metadata().unwrap().is_file())
        .count();
    assert_eq!(files, COUNT / 10);
    eprintln!(
        "readdir + stat of {} entries: {:?}",
        COUNT / 10,
        started.elapsed()
    );
    setup.finish();
}

fn an_unlinked_open_file_keeps_its_data() {
    let Some(setup) = Setup::new(
        "an_unlinked_open_file_keeps_its_data",
        AccessMode::Rwx,
        LIMIT,
    ) else {
        return;
    };
    let root = setup.root();
    let file = root.join("doomed");
    fs::write(&file, b"still here").unwrap();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&file)
        .unwrap();
    fs::remove_file(&file).unwrap();

    // The name is gone, for stat, open and readdir, and a new file may take it.
    assert_eq!(errno_of(fs::metadata(&file)), Some(libc::ENOENT));
    assert_eq!(errno_of(fs::File::open(&file)), Some(libc::ENOENT));
    assert_eq!(fs::read_dir(&root).unwrap().count(), 0);
    fs::write(&file, b"new").unwrap();

    // The open descriptor still reads and writes the old file.
    let mut buf = [0u8; 32];
    let n = f.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"still here");
    f.write_all_at(b"STILL", 0).unwrap();
    let n = f.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"STILL here");
    assert_eq!(
        fs::read(&file).unwrap(),
        b"new",
        "the new file is another file"
    );
    // fstat and ftruncate reach it through its open handle; it has no links left.
    let meta = f.metadata().unwrap();
    assert_eq!((meta.len(), meta.nlink()), (10, 0));
    f.set_len(5).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 5);
    drop(f);
    setup.finish();
}

fn default_permissions_deny_another_user() {
    let Some(setup) = Setup::new(
        "default_permissions_deny_another_user",
        AccessMode::Rwx,
        LIMIT,
    ) else {
        return;
    };
    let root = setup.root();
    setup.let_everyone_reach_the_root();
    fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(root.join("secret"), b"root only").unwrap();
    fs::set_permissions(root.join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(root.join("public"), b"everyone").unwrap();
    fs::set_permissions(root.join("public"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::create_dir(root.join("open")).unwrap();
    fs::set_permissions(root.join("open"), fs::Permissions::from_mode(0o777)).unwrap();

    let r = root.clone();
    let (secret, public, write_public, create_in_root, create_open, chmod, chown) =
        as_user(NOBODY, NOBODY, move || {
            let mine = r.join("open/mine");
            let created = fs::write(&mine, b"nobody's");
            let chmod = fs::set_permissions(r.join("public"), fs::Permissions::from_mode(0o666));
            let chown = std::os::unix::fs::chown(&mine, Some(0), None);
            (
                errno_of(fs::read(r.join("secret"))),
                fs::read(r.join("public")).ok(),
                errno_of(fs::OpenOptions::new().write(true).open(r.join("public"))),
                errno_of(fs::write(r.join("new"), b"")),
                errno_of(created),
                errno_of(chmod),
                errno_of(chown),
            )
        });
    assert_eq!(
        secret,
        Some(libc::EACCES),
        "a 0600 root file is not nobody's"
    );
    assert_eq!(public.as_deref(), Some(&b"everyone"[..]));
    assert_eq!(write_public, Some(libc::EACCES));
    assert_eq!(create_in_root, Some(libc::EACCES), "the root is 0755 root");
    assert_eq!(create_open, None, "a 0777 directory takes anyone's files");
    assert_eq!(chmod, Some(libc::EPERM), "only the owner changes the mode");
    assert_eq!(chown, Some(libc::EPERM), "only root gives files away");
    let mine = fs::metadata(root.join("open/mine")).unwrap();
    assert_eq!(
        (mine.uid(), mine.gid()),
        (NOBODY, NOBODY),
        "owned by its creator"
    );
    assert_eq!(
        fs::metadata(setup.volume.backing_dir().join("open/mine"))
            .unwrap()
            .uid(),
        NOBODY
    );
    // Root still reads the 0600 file (the mount is allow_other; root bypasses modes).
    assert_eq!(fs::read(root.join("secret")).unwrap(), b"root only");
    setup.finish();
}

fn statfs_reports_the_workers_filesystem() {
    let Some(setup) = Setup::new(
        "statfs_reports_the_workers_filesystem",
        AccessMode::Rwx,
        LIMIT,
    ) else {
        return;
    };
    let ours = rustix::fs::statvfs(setup.root()).unwrap();
    let theirs = rustix::fs::statvfs(setup.volume.backing_dir()).unwrap();
    assert_eq!(ours.f_blocks, theirs.f_blocks);
    assert_eq!(ours.f_bsize, theirs.f_bsize);
    assert_eq!(ours.f_frsize, theirs.f_frsize);
    assert_eq!(ours.f_files, theirs.f_files);
    assert_eq!(ours.f_namemax, 255);
    let info = rustix::fs::statfs(setup.root()).unwrap();
    assert_eq!(info.f_type as u32, 0x6573_5546, "FUSE_SUPER_MAGIC");
    setup.finish();
}

/// What SEMANTICS.md lists as unsupported or node-local, checked as the kernel reports it.
fn unsupported_operations_fail_as_documented() {
    let Some(setup) = Setup::new(
        "unsupported_operations_fail_as_documented",
        AccessMode::Rwx,
        LIMIT,
    ) else {
        return;
    };
    let root = setup.root();
    let file = root.join("f");
    fs::write(&file, vec![7u8; 8192]).unwrap();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&file)
        .unwrap();

    // Extended attributes: not implemented, which the kernel reports as EOPNOTSUPP.
    let mut value = [0u8; 64];
    assert_eq!(
        rustix::fs::getxattr(&file, "user.test", &mut value[..]).map_err(|e| e.raw_os_error()),
        Err(libc::EOPNOTSUPP)
    );
    assert_eq!(
        rustix::fs::setxattr(&file, "user.test", b"v", rustix::fs::XattrFlags::empty())
            .map_err(|e| e.raw_os_error()),
        Err(libc::EOPNOTSUPP)
    );
    let mut list = [0u8; 256];
    assert_eq!(
        rustix::fs::listxattr(&file, &mut list[..]).map_err(|e| e.raw_os_error()),
        Err(libc::EOPNOTSUPP)
    );

    // POSIX ACLs: the kernel checks permissions from the mode bits (default_permissions);
    // there is no ACL to read, and none can be set.
    assert_eq!(
        rustix::fs::getxattr(&file, "system.posix_acl_access", &mut value[..])
            .map_err(|e| e.raw_os_error()),
        Err(libc::ENODATA)
    );
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 6u16, u32::MAX),
        (0x02, 4, 65534),
        (0x04, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 4, u32::MAX),
    ] {
        acl.extend(tag.to_le_bytes());
        acl.extend(perm.to_le_bytes());
        acl.extend(id.to_le_bytes());
    }
    assert_eq!(
        rustix::fs::setxattr(
            &file,
            "system.posix_acl_access",
            &acl,
            rustix::fs::XattrFlags::empty()
        )
        .map_err(|e| e.raw_os_error()),
        Err(libc::EOPNOTSUPP)
    );

    // fallocate: not implemented, EOPNOTSUPP.
    assert_eq!(
        rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, 1 << 20)
            .map_err(|e| e.raw_os_error()),
        Err(libc::EOPNOTSUPP)
    );

    // mmap: shared mappings are refused (direct I/O without FUSE_DIRECT_IO_ALLOW_MMAP);
    // private ones work and see the file's bytes.
    assert_eq!(crate::sys::map_shared(&f, 4096), Err(libc::ENODEV));
    assert_eq!(crate::sys::map_private_first_byte(&f, 4096), Ok(7));

    // O_DIRECT opens work, and need no alignment (every I/O is direct anyway).
    let direct = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&file)
        .unwrap();
    direct.write_all_at(b"odd", 3).unwrap();
    let mut buf = [0u8; 5];
    direct.read_exact_at(&mut buf, 1).unwrap();
    assert_eq!(&buf, &[7, 7, b'o', b'd', b'd']);

    // Locks are the kernel's, per mount: they work, and a second descriptor of the same
    // mount conflicts, as on a local filesystem.
    use rustix::fs::FlockOperation;
    rustix::fs::flock(&f, FlockOperation::NonBlockingLockExclusive).unwrap();
    let other = fs::File::open(&file).unwrap();
    assert_eq!(
        rustix::fs::flock(&other, FlockOperation::NonBlockingLockExclusive)
            .map_err(|e| e.raw_os_error()),
        Err(libc::EWOULDBLOCK)
    );
    rustix::fs::flock(&f, FlockOperation::Unlock).unwrap();

    // What the kernel answers without a filesystem operation of its own: SEEK_DATA,
    // copy_file_range (the kernel copies with reads and writes), fsync of a directory.
    assert_eq!(
        rustix::fs::seek(&f, rustix::fs::SeekFrom::Data(5)).unwrap(),
        5
    );
    let copy = fs::File::create(root.join("copy")).unwrap();
    assert_eq!(
        rustix::fs::copy_file_range(&f, Some(&mut 0), &copy, Some(&mut 0), 8192).unwrap(),
        8192
    );
    drop(copy);
    assert_eq!(
        fs::read(root.join("copy")).unwrap(),
        fs::read(&file).unwrap()
    );
    fs::File::open(&root).unwrap().sync_all().unwrap();
    drop((f, other, direct));
    setup.finish();
}

/// Regression: the session adapter pulls a READDIRPLUS entry before it finds the kernel's
/// buffer full and drops it unsent; an adapter that counted that entry as a lookup the kernel
/// held left, with every full reply, one node in the table that no FORGET would ever remove.
fn a_full_readdirplus_reply_leaks_no_node() {
    let Some(setup) = Setup::new(
        "a_full_readdirplus_reply_leaks_no_node",
        AccessMode::Rwx,
        LIMIT,
    ) else {
        return;
    };
    let root = setup.root();
    let fs_ = &setup.mount.as_ref().unwrap().fs;
    for d in 0..3 {
        let backing = setup.volume.backing_dir().join(format!("dir{d}"));
        fs::create_dir(&backing).unwrap();
        for i in 0..500 {
            fs::File::create(backing.join(format!("entry-{i:05}"))).unwrap();
        }
    }
    for d in 0..3 {
        let listed = fs::read_dir(root.join(format!("dir{d}"))).unwrap().count();
        assert_eq!(listed, 500);
    }
    assert!(
        fs_.node_count() > 3,
        "readdirplus handed the kernel entries"
    );
    // The kernel forgets every unused dentry and inode it can (this is machine-wide, and only
    // costs other processes some cache), each with a FORGET for its node.
    fs::write("/proc/sys/vm/drop_caches", b"2").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while fs_.node_count() > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(fs_.node_count(), 1, "only the root is left");
    setup.finish();
}

/// POSIX: an entry neither removed nor added since the directory was opened is returned
/// exactly once, also to a loop that unlinks as it reads. Regression: the reference worker's
/// readdir cookie was an entry's index in a fresh scan, so every entry removed behind the
/// reader shifted the rest back and such a loop missed about half of 1,000 entries; cookies
/// now come from the entry's name alone.
fn unlinking_while_listing_skips_no_remaining_entry() {
    let Some(setup) = Setup::new(
        "unlinking_while_listing_skips_no_remaining_entry",
        AccessMode::Rwx,
        LIMIT,
    ) else {
        return;
    };
    let root = setup.root();
    let backing = setup.volume.backing_dir().join("many");
    fs::create_dir(&backing).unwrap();
    for i in 0..1000 {
        fs::File::create(backing.join(format!("entry-{i:05}"))).unwrap();
    }
    let mut seen = 0;
    for entry in fs::read_dir(root.join("many")).unwrap() {
        fs::remove_file(entry.unwrap().path()).unwrap();
        seen += 1;
    }
    let left = fs::read_dir(root.join("many")).unwrap().count();
    assert_eq!((seen, left), (1000, 0));
    setup.finish();
}
