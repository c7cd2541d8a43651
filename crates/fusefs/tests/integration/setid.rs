//! Set-user-ID and set-group-ID bits through a real mount: a write, truncation or chown drops
//! them as SEMANTICS.md says (the rule Linux applies on a local filesystem, and the documented
//! divergences), and what the mount shows is what the worker's disk holds.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{FileExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use worker::AccessMode;

use crate::support::{NOBODY, Setup, as_user, on_fresh_and_adopted_mounts};

const LIMIT: Duration = Duration::from_secs(120);

// Every test here runs on a fresh mount and on an adopted one.
on_fresh_and_adopted_mounts! {
    writes_drop_set_id_bits_as_on_a_local_filesystem,
    truncate_and_chown_drop_set_id_bits_through_the_kernel,
}

/// The modes every case starts from.
const MODES: [u32; 4] = [0o4777, 0o2777, 0o6777, 0o2767];

/// What a writer without CAP_FSETID leaves, by the rule: set-user-ID cleared; set-group-ID
/// cleared when group-execute is set or the writer is not in the file's group.
fn after_unprivileged_write(mode: u32, writer_in_group: bool) -> u32 {
    let mut mode = mode & !0o4000;
    if mode & 0o010 != 0 || !writer_in_group {
        mode &= !0o2000;
    }
    mode
}

/// What the kernel's own SETATTR leaves after a truncation by a writer without CAP_FSETID,
/// or a chown by anyone: set-user-ID cleared; set-group-ID cleared only with group-execute.
fn after_kernel_kill(mode: u32) -> u32 {
    let mut mode = mode & !0o4000;
    if mode & 0o010 != 0 {
        mode &= !0o2000;
    }
    mode
}

/// One way of writing into a file.
#[derive(Clone, Copy, Debug)]
enum Writing {
    /// write(2) at the start.
    Write,
    /// pwrite(2) into the middle.
    PwriteMiddle,
    /// One write(2) of 1.5 MiB: two kernel requests, each sent as several calls.
    SplitWrite,
    /// copy_file_range(2) from another file of the mount.
    CopyFileRange,
    /// open(2) with O_TRUNC.
    OpenTrunc,
}

const WRITINGS: [Writing; 5] = [
    Writing::Write,
    Writing::PwriteMiddle,
    Writing::SplitWrite,
    Writing::CopyFileRange,
    Writing::OpenTrunc,
];

const PREFILL: usize = 64 << 10;

impl Writing {
    /// Writes into `path` (copying from `source` where it copies); returns what the file
    /// should then hold, or the error.
    fn apply(self, path: &Path, source: &Path) -> std::io::Result<Vec<u8>> {
        let mut expected = vec![b'.'; PREFILL];
        let open = || fs::OpenOptions::new().write(true).open(path);
        match self {
            Writing::Write => {
                open()?.write_all(b"written")?;
                expected[..7].copy_from_slice(b"written");
            }
            Writing::PwriteMiddle => {
                open()?.write_all_at(b"middle", PREFILL as u64 / 2)?;
                expected[PREFILL / 2..PREFILL / 2 + 6].copy_from_slice(b"middle");
            }
            Writing::SplitWrite => {
                let data: Vec<u8> = (0..(3 << 19)).map(|i| (i % 251) as u8).collect();
                open()?.write_all(&data)?;
                expected = data;
            }
            Writing::CopyFileRange => {
                let from = fs::File::open(source)?;
                let to = open()?;
                let mut off_in = 0u64;
                let mut off_out = 100u64;
                let n = rustix::fs::copy_file_range(
                    &from,
                    Some(&mut off_in),
                    &to,
                    Some(&mut off_out),
                    4,
                )?;
                assert_eq!(n, 4, "copy_file_range copied all");
                expected[100..104].copy_from_slice(b"copy");
            }
            Writing::OpenTrunc => {
                fs::OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(path)?;
                expected.clear();
            }
        }
        Ok(expected)
    }
}

/// Makes `path` as root: `PREFILL` bytes, the group `gid`, the mode `mode`.
fn prepare(path: &Path, gid: u32, mode: u32) {
    fs::write(path, vec![b'.'; PREFILL]).unwrap();
    std::os::unix::fs::chown(path, Some(0), Some(gid)).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    assert_eq!(fs::metadata(path).unwrap().mode() & 0o7777, mode);
}

/// The permission bits of `name` through the mount and on the worker's disk, which must agree.
fn mode_of(setup: &Setup, name: &str) -> u32 {
    let seen = fs::metadata(setup.root().join(name)).unwrap().mode() & 0o7777;
    let stored = fs::metadata(setup.volume.backing_dir().join(name))
        .unwrap()
        .mode()
        & 0o7777;
    assert_eq!(
        seen, stored,
        "{name}: the mount shows what the worker holds"
    );
    seen
}

/// Lets user `nobody` reach the mount's root and create files in it.
fn open_to_everyone(setup: &Setup) -> PathBuf {
    setup.let_everyone_reach_the_root();
    let root = setup.root();
    fs::set_permissions(&root, fs::Permissions::from_mode(0o777)).unwrap();
    root
}

fn writes_drop_set_id_bits_as_on_a_local_filesystem() {
    let Some(setup) = Setup::new(
        "writes_drop_set_id_bits_as_on_a_local_filesystem",
        AccessMode::Rwx,
        LIMIT,
    ) else {
        return;
    };
    let root = open_to_everyone(&setup);
    let source = root.join("source");
    fs::write(&source, b"copy").unwrap();

    // (writer's uid and gid, file's group, whether the writer is in the file's group)
    let writers = [
        ("nobody", NOBODY, 0, false),
        ("nobody-in-group", NOBODY, NOBODY, true),
        ("root", 0, 0, true),
    ];
    let mut failures = Vec::new();
    for (who, uid, file_gid, in_group) in writers {
        for mode in MODES {
            for writing in WRITINGS {
                let name = format!("{who}-{writing:?}-{mode:o}");
                let path = root.join(&name);
                prepare(&path, file_gid, mode);
                let (p, s) = (path.clone(), source.clone());
                let written = match uid {
                    0 => writing.apply(&p, &s),
                    _ => as_user(uid, uid, move || writing.apply(&p, &s)),
                };
                let expected_data = written.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert!(
                    fs::read(&path).unwrap() == expected_data,
                    "{name}: the data arrived"
                );
                let expected = match uid {
                    0 => mode,
                    _ => after_unprivileged_write(mode, in_group),
                };
                let got = mode_of(&setup, &name);
                if got != expected {
                    failures.push(format!("{name}: {got:o}, expected {expected:o}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    setup.finish();
}

fn truncate_and_chown_drop_set_id_bits_through_the_kernel() {
    let Some(setup) = Setup::new(
        "truncate_and_chown_drop_set_id_bits_through_the_kernel",
        AccessMode::Rwx,
        LIMIT,
    ) else {
        return;
    };
    let root = open_to_everyone(&setup);
    let mut failures = Vec::new();
    let mut check = |name: &str, expected: u32| {
        let got = mode_of(&setup, name);
        if got != expected {
            failures.push(format!("{name}: {got:o}, expected {expected:o}"));
        }
    };
    for mode in MODES {
        // A truncation by the owner (without CAP_FSETID) and by another user: the kernel's
        // SETATTR carries the new mode. A non-member keeps set-group-ID without group-execute
        // (the documented divergence; ext4 clears it).
        let owned = format!("owner-truncate-{mode:o}");
        let path = root.join(&owned);
        prepare(&path, NOBODY, mode);
        std::os::unix::fs::chown(&path, Some(NOBODY), None).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        let p = path.clone();
        as_user(NOBODY, NOBODY, move || {
            fs::OpenOptions::new().write(true).open(&p)?.set_len(10)
        })
        .unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), 10);
        check(&owned, after_kernel_kill(mode));

        let other = format!("other-truncate-{mode:o}");
        let path = root.join(&other);
        prepare(&path, 0, mode);
        let p = path.clone();
        as_user(NOBODY, NOBODY, move || {
            let f = fs::OpenOptions::new().write(true).open(&p)?;
            f.set_len(10)
        })
        .unwrap();
        check(&other, after_kernel_kill(mode));

        // Root holds CAP_FSETID: its truncation keeps both bits.
        let by_root = format!("root-truncate-{mode:o}");
        let path = root.join(&by_root);
        prepare(&path, 0, mode);
        fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(10)
            .unwrap();
        check(&by_root, mode);

        // A chown clears set-user-ID even when root does it, set-group-ID only with
        // group-execute.
        let chowned = format!("chown-{mode:o}");
        let path = root.join(&chowned);
        prepare(&path, 0, mode);
        std::os::unix::fs::chown(&path, Some(1000), Some(1000)).unwrap();
        check(&chowned, after_kernel_kill(mode));
    }
    assert!(failures.is_empty(), "{failures:#?}");
    // The open file mode bits stayed what they were for a file without the bits.
    let plain = root.join("plain");
    prepare(&plain, 0, 0o777);
    let p = plain.clone();
    as_user(NOBODY, NOBODY, move || {
        fs::OpenOptions::new()
            .write(true)
            .mode(0o600)
            .open(&p)?
            .write_all(b"x")
    })
    .unwrap();
    assert_eq!(
        mode_of(&setup, "plain"),
        0o777,
        "nothing to drop, nothing changed"
    );
    setup.finish();
}
