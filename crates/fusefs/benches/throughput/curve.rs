//! How the metadata rate and listings scale with a directory's size: one directory grown to
//! each size of `BENCH_CURVE` through the target itself (the create rate of each band), listed
//! whole at each size (names only, as `ls -f`), a sample of its files `lstat`ed at each size,
//! then emptied (the unlink rate at the largest size); and a walk (`find`-like: list every
//! directory, `lstat` every entry) of a tree of `BENCH_TREE_FILES` files in directories of a
//! thousand, made beside the target (in the worker's backing directory, the sshfs export) and
//! walked twice through it: the first walk also shows what it costs the worker to learn files
//! it did not make.

use std::fs::{self, OpenOptions};
use std::path::Path;
use std::time::Instant;

/// How many files of a directory are `lstat`ed at each size.
const SAMPLE: usize = 1000;

/// One target's figures at one directory size.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Point {
    /// The directory's size.
    pub(crate) size: usize,
    /// Files created per second while the directory grew to this size from the last.
    pub(crate) create: f64,
    /// Seconds to list the directory whole.
    pub(crate) list: f64,
    /// `lstat`s per second over a sample of the directory's files.
    pub(crate) stat: f64,
}

/// One target's figures.
#[derive(Clone, Debug, Default)]
pub(crate) struct Curve {
    pub(crate) points: Vec<Point>,
    /// Unlinks per second, emptying the directory at the largest size.
    pub(crate) unlink: f64,
    /// Seconds of the first and the second walk of the tree; zero when not run.
    pub(crate) walks: [f64; 2],
}

fn name(i: usize) -> String {
    format!("f{i:07}")
}

/// Grows a directory under `dir` through each size, as the module says, then removes it.
pub(crate) fn grow(dir: &Path, sizes: &[usize]) -> Curve {
    let root = dir.join("curve");
    fs::create_dir(&root).unwrap();
    let mut curve = Curve::default();
    let mut made = 0;
    for &size in sizes {
        let started = Instant::now();
        for i in made..size {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(root.join(name(i)))
                .unwrap();
        }
        let create = (size - made) as f64 / started.elapsed().as_secs_f64();
        made = size;

        let started = Instant::now();
        let listed = fs::read_dir(&root).unwrap().count();
        let list = started.elapsed().as_secs_f64();
        assert_eq!(listed, size, "a listing of {} lost names", root.display());

        let step = (size / SAMPLE).max(1);
        let sample: Vec<usize> = (0..size).step_by(step).take(SAMPLE).collect();
        let started = Instant::now();
        for &i in &sample {
            fs::symlink_metadata(root.join(name(i))).unwrap();
        }
        let stat = sample.len() as f64 / started.elapsed().as_secs_f64();
        curve.points.push(Point {
            size,
            create,
            list,
            stat,
        });
    }
    let started = Instant::now();
    for i in 0..made {
        fs::remove_file(root.join(name(i))).unwrap();
    }
    curve.unlink = made as f64 / started.elapsed().as_secs_f64();
    fs::remove_dir(&root).unwrap();
    curve
}

/// Makes a tree of `files` empty files in directories of a thousand under `beside`.
pub(crate) fn plant(beside: &Path, files: usize) {
    let tree = beside.join("tree");
    fs::create_dir(&tree).unwrap();
    for i in 0..files {
        let dir = tree.join(format!("d{:04}", i / 1000));
        if i % 1000 == 0 {
            fs::create_dir(&dir).unwrap();
        }
        fs::File::create(dir.join(name(i))).unwrap();
    }
}

/// Walks the tree under `dir` (lists every directory, `lstat`s every entry); the seconds it
/// took and the files found.
pub(crate) fn walk(dir: &Path) -> (f64, usize) {
    let started = Instant::now();
    let mut files = 0;
    let mut pending = vec![dir.join("tree")];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                pending.push(path);
            } else {
                files += 1;
            }
        }
    }
    (started.elapsed().as_secs_f64(), files)
}

/// Removes the tree under `beside`.
pub(crate) fn uproot(beside: &Path) {
    fs::remove_dir_all(beside.join("tree")).unwrap();
}

/// Prints the curve table: per size and target, the create rate, the listing time (and its
/// time per thousand names, which stays flat when listing is linear), the `lstat` rate; then
/// the unlink rate and the walks.
pub(crate) fn report(targets: &[&str], curves: &[Curve], tree_files: usize) {
    println!();
    println!(
        "| size | target | create (files/s) | list (s) | list per 1000 (ms) | lstat (files/s) |"
    );
    println!("|---:|---|---:|---:|---:|---:|");
    let sizes: Vec<usize> = curves
        .first()
        .map(|c| c.points.iter().map(|p| p.size).collect())
        .unwrap_or_default();
    for (at, size) in sizes.iter().enumerate() {
        for (target, curve) in targets.iter().zip(curves) {
            let p = curve.points[at];
            println!(
                "| {size} | {target} | {:.0} | {:.3} | {:.2} | {:.0} |",
                p.create,
                p.list,
                p.list * 1e6 / *size as f64,
                p.stat
            );
        }
    }
    println!();
    println!(
        "| target | unlink at the largest size (files/s) | walk of {tree_files} files, first (s) | second (s) |"
    );
    println!("|---|---:|---:|---:|");
    for (target, curve) in targets.iter().zip(curves) {
        println!(
            "| {target} | {:.0} | {:.2} | {:.2} |",
            curve.unlink, curve.walks[0], curve.walks[1]
        );
    }
}
