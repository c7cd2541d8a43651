//! Parallel clients: 1, 2, 4 and 8 threads (`BENCH_THREADS`), each working in a directory of its
//! own (create with a 100-byte write, `lstat`, unlink of `BENCH_PARALLEL_FILES` files each,
//! the threads of a phase started and ended together), then cold random 4 KiB `pread`s, each
//! thread in one of 8 files of `PARALLEL_FILE_MIB` MiB (`sync` and `drop_caches` first). Each
//! figure is the rate of all the threads together. One multiplexed HTTP/2 connection (fusefs)
//! against SFTP's single channel (sshfs) is what this shows.

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use super::{Rng, SMALL_FILE, drop_caches, median};

/// The files the random reads spread over, and the size of each.
const READ_FILES: usize = 8;
const PARALLEL_FILE_MIB: usize = 32;
const PAGE: u64 = 4096;

/// One target's rates with one number of threads.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Rates {
    pub(crate) create: f64,
    pub(crate) stat: f64,
    pub(crate) unlink: f64,
    pub(crate) random_read: f64,
}

/// Writes the files the random reads use under `dir`, in a directory named for `target` (the
/// fusefs mount and the backing directory show the same files).
pub(crate) fn prepare(dir: &Path, target: usize) -> Vec<PathBuf> {
    let root = dir.join(format!("parallel-reads-{target}"));
    fs::create_dir_all(&root).unwrap();
    let mut rng = Rng(0x05ee_d0ff_11e5);
    let mut block = vec![0u8; 1 << 20];
    (0..READ_FILES)
        .map(|n| {
            let path = root.join(format!("r{n}"));
            let mut file = File::create(&path).unwrap();
            for _ in 0..PARALLEL_FILE_MIB {
                for word in block.chunks_exact_mut(8) {
                    word.copy_from_slice(&rng.next().to_le_bytes());
                }
                file.write_all(&block).unwrap();
            }
            file.sync_all().unwrap();
            path
        })
        .collect()
}

/// Runs `work(thread)` on `threads` threads started together; the rate of `ops` each, over
/// the time from the first thread's start to the last one's end (each thread takes its own
/// times: a fast phase can end before this thread is scheduled again after the start).
fn together(threads: usize, ops: usize, work: impl Fn(usize) + Sync) -> f64 {
    let start = Barrier::new(threads);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|scope| {
        let running: Vec<_> = (0..threads)
            .map(|t| {
                let (start, work) = (&start, &work);
                scope.spawn(move || {
                    start.wait();
                    let began = Instant::now();
                    work(t);
                    (began, Instant::now())
                })
            })
            .collect();
        running.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let began = spans.iter().map(|s| s.0).min().unwrap();
    let ended = spans.iter().map(|s| s.1).max().unwrap();
    rate(threads * ops, ended - began)
}

fn rate(ops: usize, elapsed: Duration) -> f64 {
    ops as f64 / elapsed.as_secs_f64()
}

/// One target with `threads` threads, as the module says.
pub(crate) fn run(
    dir: &Path,
    threads: usize,
    files: usize,
    reads: usize,
    read_files: &[PathBuf],
) -> Rates {
    let root = dir.join(format!("parallel-{threads}"));
    let dirs: Vec<PathBuf> = (0..threads).map(|t| root.join(format!("t{t}"))).collect();
    for d in &dirs {
        fs::create_dir_all(d).unwrap();
    }
    let name = |t: usize, i: usize| dirs[t].join(format!("f{i:06}"));
    let create = together(threads, files, |t| {
        for i in 0..files {
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(name(t, i))
                .unwrap();
            file.write_all(SMALL_FILE).unwrap();
        }
    });
    let stat = together(threads, files, |t| {
        for i in 0..files {
            let meta = fs::symlink_metadata(name(t, i)).unwrap();
            assert_eq!(meta.len(), SMALL_FILE.len() as u64);
        }
    });
    let unlink = together(threads, files, |t| {
        for i in 0..files {
            fs::remove_file(name(t, i)).unwrap();
        }
    });
    for d in &dirs {
        fs::remove_dir(d).unwrap();
    }
    fs::remove_dir(&root).unwrap();
    drop_caches();
    let pages = (PARALLEL_FILE_MIB << 20) as u64 / PAGE;
    let random_read = together(threads, reads, |t| {
        let file = File::open(&read_files[t % read_files.len()]).unwrap();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1));
        let mut page = vec![0u8; PAGE as usize];
        for _ in 0..reads {
            let at = rng.next() % pages * PAGE;
            assert_eq!(file.read_at(&mut page, at).unwrap(), PAGE as usize);
        }
    });
    Rates {
        create,
        stat,
        unlink,
        random_read,
    }
}

/// The medians over the rounds, per thread count and target, and fusefs against sshfs.
pub(crate) fn report(targets: &[&str], rounds: &[Vec<Vec<Rates>>], threads: &[usize]) {
    // rounds[round][target][at]
    println!();
    println!(
        "| threads | target | create (files/s) | lstat (files/s) | unlink (files/s) | cold random 4 KiB reads (ops/s) |"
    );
    println!("|---:|---|---:|---:|---:|---:|");
    let of = |target: usize, at: usize, pick: fn(&Rates) -> f64| {
        median(rounds.iter().map(|r| pick(&r[target][at])).collect())
    };
    let picks: [fn(&Rates) -> f64; 4] = [|r| r.create, |r| r.stat, |r| r.unlink, |r| r.random_read];
    for (at, count) in threads.iter().enumerate() {
        for (target, name) in targets.iter().enumerate() {
            let [c, s, u, r] = picks.map(|pick| of(target, at, pick));
            println!("| {count} | {name} | {c:.0} | {s:.0} | {u:.0} | {r:.0} |");
        }
    }
    println!();
    println!("| threads | fusefs / sshfs: create | lstat | unlink | random reads |");
    println!("|---:|---:|---:|---:|---:|");
    for (at, count) in threads.iter().enumerate() {
        let [c, s, u, r] = picks.map(|pick| of(0, at, pick) / of(2, at, pick));
        println!("| {count} | {c:.2} | {s:.2} | {u:.2} | {r:.2} |");
    }
}
