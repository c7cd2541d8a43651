//! POSIX behaviour through a real mount.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use worker::AccessMode;

use crate::support::{Mount, Volume, runtime};

#[test]
fn files_directories_and_links_behave() {
    if !test_support::private_mount_namespace_with_fuse("files_directories_and_links_behave") {
        return;
    }
    let rt = runtime();
    let volume = rt.block_on(Volume::start(AccessMode::Rwx));
    let path = volume.mount_point("a");
    let mount = rt.block_on(Mount::new(&volume, &path, "node-a"));
    let root = mount.path().to_owned();

    // create, write, read
    let file = root.join("hello.txt");
    fs::write(&file, b"hello world").unwrap();
    assert_eq!(fs::read(&file).unwrap(), b"hello world");
    assert_eq!(
        fs::read(volume.backing_dir().join("hello.txt")).unwrap(),
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

    rt.block_on(mount.unmount());
}
