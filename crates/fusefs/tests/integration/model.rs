//! A model-based property test: random sequences of file operations, applied both to the
//! mount and to a reference directory on the machine's own filesystem, give the same result
//! (the same value or the same errno) one by one and leave the same tree.

use std::fs;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use rustix::fs::{CWD, RenameFlags};
use worker::AccessMode;

use crate::support::{Setup, tree};

/// Where operations happen: a few directories (the root most often), which a case starts
/// with, and few names, so that operations meet each other's files.
const DIRS: [&str; 5] = ["", "", "d/", "e/", "d/f/"];
const NAMES: [&str; 4] = ["a", "b", "c", "f"];
/// Symbolic link targets: relative and inside the case's directory (a `..` out of it would
/// name different places in the two trees), dangling ones included.
const TARGETS: [&str; 6] = ["a", "b", "d/a", "d", "nowhere", "e/b"];

#[derive(Clone, Debug)]
enum Op {
    Create {
        path: String,
        exclusive: bool,
    },
    Write {
        path: String,
        offset: u64,
        len: usize,
        byte: u8,
    },
    Truncate {
        path: String,
        len: u64,
    },
    Rename {
        from: String,
        to: String,
        flags: u8,
    },
    Unlink {
        path: String,
    },
    Mkdir {
        path: String,
    },
    Rmdir {
        path: String,
    },
    Link {
        from: String,
        to: String,
    },
    Symlink {
        target: &'static str,
        path: String,
    },
    Read {
        path: String,
    },
    Readdir {
        path: String,
    },
    Stat {
        path: String,
    },
    Readlink {
        path: String,
    },
}

fn path() -> impl Strategy<Value = String> {
    (
        prop::sample::select(&DIRS[..]),
        prop::sample::select(&NAMES[..]),
    )
        .prop_map(|(dir, name)| format!("{dir}{name}"))
}

fn dir_path() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        path(),
        Just("d".to_owned()),
        Just("e".to_owned())
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (path(), any::<bool>()).prop_map(|(path, exclusive)| Op::Create { path, exclusive }),
        4 => (path(), 0u64..5000, 0usize..3000, any::<u8>())
            .prop_map(|(path, offset, len, byte)| Op::Write { path, offset, len, byte }),
        2 => (path(), 0u64..6000).prop_map(|(path, len)| Op::Truncate { path, len }),
        3 => (path(), path(), 0u8..3).prop_map(|(from, to, flags)| Op::Rename { from, to, flags }),
        2 => path().prop_map(|path| Op::Unlink { path }),
        2 => path().prop_map(|path| Op::Mkdir { path }),
        1 => path().prop_map(|path| Op::Rmdir { path }),
        2 => (path(), path()).prop_map(|(from, to)| Op::Link { from, to }),
        2 => (prop::sample::select(&TARGETS[..]), path())
            .prop_map(|(target, path)| Op::Symlink { target, path }),
        2 => path().prop_map(|path| Op::Read { path }),
        1 => dir_path().prop_map(|path| Op::Readdir { path }),
        2 => path().prop_map(|path| Op::Stat { path }),
        1 => path().prop_map(|path| Op::Readlink { path }),
    ]
}

/// What an operation returned, in a form both trees must agree on.
#[derive(Debug, PartialEq, Eq)]
enum Value {
    Done,
    Data(Vec<u8>),
    Names(Vec<String>),
    /// Kind (`f`, `d`, `l` or `?`), size for files and links, link count for files.
    Meta(char, Option<u64>, Option<u64>),
    Target(PathBuf),
}

fn errno(e: io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

fn apply(root: &Path, op: &Op) -> Result<Value, i32> {
    let at = |p: &str| root.join(p);
    let done = |r: io::Result<()>| r.map(|()| Value::Done).map_err(errno);
    match op {
        Op::Create { path, exclusive } => {
            let mut options = fs::OpenOptions::new();
            options.write(true);
            if *exclusive {
                options.create_new(true);
            } else {
                options.create(true);
            }
            done(options.open(at(path)).map(drop))
        }
        Op::Write {
            path,
            offset,
            len,
            byte,
        } => done(
            fs::OpenOptions::new()
                .write(true)
                .open(at(path))
                .and_then(|f| f.write_all_at(&vec![*byte; *len], *offset)),
        ),
        Op::Truncate { path, len } => done(
            fs::OpenOptions::new()
                .write(true)
                .open(at(path))
                .and_then(|f| f.set_len(*len)),
        ),
        Op::Rename { from, to, flags } => {
            let flags = match flags {
                0 => RenameFlags::empty(),
                1 => RenameFlags::NOREPLACE,
                _ => RenameFlags::EXCHANGE,
            };
            done(rustix::fs::renameat_with(CWD, at(from), CWD, at(to), flags).map_err(Into::into))
        }
        Op::Unlink { path } => done(fs::remove_file(at(path))),
        Op::Mkdir { path } => done(fs::create_dir(at(path))),
        Op::Rmdir { path } => done(fs::remove_dir(at(path))),
        Op::Link { from, to } => done(fs::hard_link(at(from), at(to))),
        Op::Symlink { target, path } => done(std::os::unix::fs::symlink(target, at(path))),
        Op::Read { path } => fs::read(at(path)).map(Value::Data).map_err(errno),
        Op::Readdir { path } => fs::read_dir(at(path))
            .and_then(|entries| {
                let mut names = entries
                    .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                    .collect::<io::Result<Vec<_>>>()?;
                names.sort();
                Ok(Value::Names(names))
            })
            .map_err(errno),
        Op::Stat { path } => fs::symlink_metadata(at(path))
            .map(|m| {
                let kind = m.file_type();
                if kind.is_dir() {
                    Value::Meta('d', None, None)
                } else if kind.is_symlink() {
                    Value::Meta('l', Some(m.len()), None)
                } else if kind.is_file() {
                    Value::Meta('f', Some(m.len()), Some(m.nlink()))
                } else {
                    Value::Meta('?', None, None)
                }
            })
            .map_err(errno),
        Op::Readlink { path } => fs::read_link(at(path)).map(Value::Target).map_err(errno),
    }
}

/// The starting state of every case, made the same way in both trees.
fn prepare(root: &Path) {
    fs::create_dir(root).unwrap();
    for dir in ["d", "e", "d/f"] {
        fs::create_dir(root.join(dir)).unwrap();
    }
    for file in ["a", "d/a", "e/b"] {
        fs::write(root.join(file), format!("{file}'s first bytes")).unwrap();
    }
    std::os::unix::fs::symlink("a", root.join("c")).unwrap();
}

#[test]
fn random_operations_match_a_local_directory() {
    let Some(setup) = Setup::new(
        "random_operations_match_a_local_directory",
        AccessMode::Rwx,
        Duration::from_secs(100),
    ) else {
        return;
    };
    let mount = setup.root();
    let reference = tempfile::tempdir().unwrap();
    let case = AtomicUsize::new(0);
    let (succeeded, failed) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let mut runner = TestRunner::new(Config {
        cases: 24,
        max_shrink_iters: 200,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&prop::collection::vec(op(), 20..40), |ops| {
        let name = format!("case-{}", case.fetch_add(1, Ordering::SeqCst));
        let (ours, theirs) = (mount.join(&name), reference.path().join(&name));
        prepare(&ours);
        prepare(&theirs);
        for (i, op) in ops.iter().enumerate() {
            let (got, want) = (apply(&ours, op), apply(&theirs, op));
            let count = if got.is_ok() { &succeeded } else { &failed };
            count.fetch_add(1, Ordering::Relaxed);
            prop_assert_eq!(got, want, "operation {} {:?}", i, op);
        }
        let (got, want) = (tree(&ours), tree(&theirs));
        if got != want {
            return Err(TestCaseError::fail(format!(
                "final trees differ:\n mount: {got:?}\n local: {want:?}"
            )));
        }
        Ok(())
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, ops)) => panic!("{why}\nminimal sequence: {ops:#?}"),
        Err(error) => panic!("{error}"),
    }
    let (succeeded, failed) = (succeeded.into_inner(), failed.into_inner());
    eprintln!(
        "{} cases, {succeeded} operations succeeded and {failed} failed alike",
        case.load(Ordering::SeqCst)
    );
    // The sequences must exercise the filesystem, not only its error paths.
    assert!(succeeded * 2 > failed, "too few operations succeeded");
    setup.finish();
}
