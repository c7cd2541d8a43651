//! Sequential and random I/O and small-file metadata through (a) fusefs and the reference
//! worker over loopback TLS, (b) the worker's backing directory directly (the floor) and
//! (c) sshfs over loopback with its caches off (the peer users compare with), in one run,
//! interleaved a, b, c, a, b, c, ... and reported as medians with the issue's targets.
//!
//! ```text
//! cargo bench -p fusefs --bench throughput
//! ```
//!
//! Needs root (it mounts in a private mount namespace of its own; without the privilege it
//! prints SKIPPED and exits 0) and `/dev/fuse`. `benches/setup-sshfs.sh` installs sshfs and
//! openssh-server when missing. The peer is a private `sshd -D -e -f <own config>` on
//! 127.0.0.1 with a generated host key and authorized key in the run's temporary directory; the
//! system's sshd and keys are never touched. Every mount lives in the private namespace and
//! every child (sshd, sshfs) is ended by its PID before the run returns.
//!
//! Each round measures, per target: a 1 MiB-block sequential write with `fsync` before close;
//! a cold (`sync`, `drop_caches`) 1 MiB-block sequential read of that file; cold random 4 KiB
//! `pread`s in it; then create (with a 100-byte write), `lstat` and unlink of many small files.
//!
//! Environment (defaults are the issue's figures): `BENCH_SIZE_MIB` (1024), `BENCH_ROUNDS` (3),
//! `BENCH_FILES` (10000), `BENCH_RANDOM_READS` (2000), `BENCH_RUNTIME_THREADS` (the tokio
//! worker threads that serve the worker; 4; the FUSE sessions run as the node runs a stage, on
//! a serving thread of their own with their worker connections: [`fusefs::ServingThreads`]),
//! `BENCH_CALL_KIB` (fusefs's `call_data_bytes` in KiB; its default), `TMPDIR` (where the
//! worker's state, the sshfs export and the mount points go), `BENCH_CURVE` (the directory
//! sizes of the curve, `1000,10000,100000`; empty for none), `BENCH_TREE_FILES` (the files of
//! the tree walked, 100000; 0 for none), `BENCH_THREADS` (the thread counts of the parallel
//! run, `1,2,4,8`; empty for none), `BENCH_PARALLEL_FILES` (files per thread, 500),
//! `BENCH_PARALLEL_READS` (random reads per thread, 500), `BENCH_SETTLE_S` (seconds to wait
//! before each sequential write and cold read so that they start from the same memory; 15
//! where a virtio balloon reports free pages to the host, else 0: see `settle_memory`),
//! `BENCH_ONLY=curve` or `BENCH_ONLY=parallel` (that part alone). A number left empty takes
//! its default; a value that does not parse ends the run with status 2 before anything is
//! mounted.
//!
//! After the rounds, parallel clients (`throughput/parallel.rs`): 1 to 8 threads, each in a
//! directory of its own, and cold random reads over 8 files, per target, over the same number
//! of rounds; then the curves (`throughput/curve.rs`): how create, listing and `lstat` rates
//! scale with a directory's size, and a walk of a tree, per target.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)]

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::future::Future;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fusefs::testing::WorkerVolume;
use fusefs::{FileService, Fs, FsConfig, Mounted, ServingThreads};
use lease_client::protocol::{ROOT_INO, RequestId};
use lease_client::v1;
use lease_client::v1::reply::Result as ReplyResult;
use lease_client::v1::request::Op;
use lease_client::{Budgets, Client, HttpsTransport};
use tokio::runtime::Handle;
use worker::{AccessMode, Timings};

use common::{bad_setting, env_or, idle_policy, loadavg, median, memory, runtime};

#[path = "common/mod.rs"]
mod common;
#[path = "throughput/curve.rs"]
mod curve;
#[path = "throughput/parallel.rs"]
mod parallel;

const VOLUME: &str = "v1.fusefs-bench";
const MIB: usize = 1 << 20;
const PAGE: usize = 4 << 10;
const SMALL_FILE: &[u8] = &[b'x'; 100];
const SEQ_FILE: &str = "sequential.bin";

#[derive(Clone, Debug)]
struct Settings {
    size_mib: usize,
    rounds: usize,
    files: usize,
    random_reads: usize,
    runtime_threads: usize,
    call_kib: usize,
    curve: Vec<usize>,
    tree_files: usize,
    threads: Vec<usize>,
    parallel_files: usize,
    parallel_reads: usize,
    /// Whether a virtio balloon reports free pages to the host: [`free_page_reporting`].
    free_page_reporting: bool,
    /// How long to let free memory settle before each sequential write and cold read
    /// (`BENCH_SETTLE_S`; 15 s by default where free pages are reported, else 0): see
    /// [`settle_memory`].
    settle: Duration,
    /// `BENCH_ONLY`: `curve` or `parallel`, that part alone.
    only: Option<String>,
}

impl Settings {
    fn from_env() -> Settings {
        let free_page_reporting = free_page_reporting();
        Settings {
            size_mib: env_or("BENCH_SIZE_MIB", 1024),
            rounds: env_or("BENCH_ROUNDS", 3),
            files: env_or("BENCH_FILES", 10_000),
            random_reads: env_or("BENCH_RANDOM_READS", 2_000),
            runtime_threads: env_or("BENCH_RUNTIME_THREADS", 4),
            call_kib: env_or("BENCH_CALL_KIB", FsConfig::default().call_data_bytes >> 10),
            curve: env_list("BENCH_CURVE", "1000,10000,100000"),
            tree_files: env_or("BENCH_TREE_FILES", 100_000),
            threads: env_list("BENCH_THREADS", "1,2,4,8"),
            parallel_files: env_or("BENCH_PARALLEL_FILES", 500),
            parallel_reads: env_or("BENCH_PARALLEL_READS", 500),
            free_page_reporting,
            settle: Duration::from_secs(env_or(
                "BENCH_SETTLE_S",
                if free_page_reporting { 15 } else { 0 },
            )),
            only: match std::env::var("BENCH_ONLY").unwrap_or_default().as_str() {
                "" => None,
                part @ ("curve" | "parallel") => Some(part.to_owned()),
                other => bad_setting("BENCH_ONLY", other, "curve or parallel"),
            },
        }
    }
}

/// The comma-separated numbers in the environment variable `name`, `default` when unset; empty
/// when set to nothing. A part that does not parse ends the run as [`env_or`] does.
fn env_list(name: &str, default: &str) -> Vec<usize> {
    let value = std::env::var(name).unwrap_or_else(|_| default.to_owned());
    value
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| {
            part.parse()
                .unwrap_or_else(|_| bad_setting(name, &value, "numbers separated by commas"))
        })
        .collect()
}

/// A small deterministic generator for offsets and incompressible data (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Count and total latency of the worker calls fusefs made, by operation.
#[derive(Debug, Default)]
struct CallStats(Mutex<BTreeMap<&'static str, (u64, Duration)>>);

impl CallStats {
    fn add(&self, op: &'static str, took: Duration) {
        let mut map = self.0.lock().unwrap();
        let entry = map.entry(op).or_default();
        entry.0 += 1;
        entry.1 += took;
    }

    fn take(&self) -> BTreeMap<&'static str, (u64, Duration)> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// The lease-client `Client` with each call timed, to tell the time spent in worker calls (TLS,
/// the worker, the disk) from the time spent in the kernel and the FUSE session.
#[derive(Debug)]
struct Timed<S> {
    inner: S,
    stats: Arc<CallStats>,
}

impl<S: FileService> FileService for Timed<S> {
    fn call(
        &self,
        request_id: Option<RequestId>,
        until: Option<Instant>,
        op: Op,
    ) -> impl Future<Output = Result<ReplyResult, lease_client::Error>> + Send {
        let name = op.name();
        let call = self.inner.call(request_id, until, op);
        async move {
            let began = Instant::now();
            let result = call.await;
            self.stats.add(name, began.elapsed());
            result
        }
    }
}

/// One phase of a workload as fusefs ran it: user-level operations, wall time, worker calls.
#[derive(Debug)]
struct Phase {
    name: &'static str,
    ops: usize,
    wall: Duration,
    calls: BTreeMap<&'static str, (u64, Duration)>,
}

/// Collects phases for target (a); does nothing for the others.
struct Probe<'a> {
    stats: Option<&'a CallStats>,
    phases: Vec<Phase>,
}

impl Probe<'_> {
    fn start(&self) {
        if let Some(stats) = self.stats {
            stats.take();
        }
    }

    fn end(&mut self, name: &'static str, ops: usize, wall: Duration) {
        if let Some(stats) = self.stats {
            self.phases.push(Phase {
                name,
                ops,
                wall,
                calls: stats.take(),
            });
        }
    }
}

/// Writes dirty pages back and empties the page cache, so that the next read comes from disk.
/// Returns false when the kernel refuses (the read is then warm, and the report says so).
fn drop_caches() -> bool {
    rustix::fs::sync();
    fs::write("/proc/sys/vm/drop_caches", b"3").is_ok()
}

/// Whether a virtio balloon reports this guest's free pages to its host
/// (`VIRTIO_BALLOON_F_REPORTING`, feature bit 5, in the device's `features` bit string).
///
/// When it does, the host takes back the memory behind free pages a few seconds after they
/// are freed, and the first touch of each such page afterwards costs a host page fault. A
/// sequential write or cold read fills a gibibyte of new page cache, so its speed depends on
/// how long ago that memory was freed: on the machine these figures come from, `dd` wrote 1
/// GiB with `fsync` at 1.7-1.8 GB/s into memory freed just before, 528-530 MB/s 8 s after and
/// 502-505 MB/s 15 s after (BENCHMARKS.md, 2026-12-03 04:31).
fn free_page_reporting() -> bool {
    let Ok(devices) = fs::read_dir("/sys/bus/virtio/drivers/virtio_balloon") else {
        return false;
    };
    devices.flatten().any(|device| {
        fs::read_to_string(device.path().join("features"))
            .is_ok_and(|bits| bits.as_bytes().get(5) == Some(&b'1'))
    })
}

/// Waits `settle`, so that every target's sequential write and cold read starts from the same
/// memory: free pages the host has taken back, whatever ran before. Without it the target
/// that runs right after another's large file was deleted or dropped from the page cache
/// writes into memory still backed by the host, up to 3.6× faster on this VM (see
/// [`free_page_reporting`]), and the order of the targets decides the ratios.
fn settle_memory(settle: Duration) {
    std::thread::sleep(settle);
}

fn mib_per_s(bytes: usize, elapsed: Duration) -> f64 {
    bytes as f64 / MIB as f64 / elapsed.as_secs_f64()
}

/// Writes `size_mib` blocks of 1 MiB to a new file, then fsyncs and closes it: MiB/s.
fn sequential_write(dir: &Path, size_mib: usize, block: &mut [u8], probe: &mut Probe<'_>) -> f64 {
    let path = dir.join(SEQ_FILE);
    rustix::fs::sync();
    probe.start();
    let started = Instant::now();
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    for i in 0..size_mib {
        block[..8].copy_from_slice(&(i as u64).to_le_bytes());
        file.write_all(block).unwrap();
    }
    file.sync_all().unwrap();
    drop(file);
    let elapsed = started.elapsed();
    probe.end("sequential write + fsync", size_mib, elapsed);
    mib_per_s(size_mib * MIB, elapsed)
}

/// Reads the file back in 1 MiB blocks, checking each block's number: MiB/s.
fn sequential_read(dir: &Path, size_mib: usize, block: &mut [u8], probe: &mut Probe<'_>) -> f64 {
    let path = dir.join(SEQ_FILE);
    probe.start();
    let started = Instant::now();
    let mut file = File::open(&path).unwrap();
    let mut total = 0usize;
    let mut blocks = 0u64;
    loop {
        // Fill one 1 MiB block; a read may return less than asked.
        let mut filled = 0;
        while filled < block.len() {
            match file.read(&mut block[filled..]).unwrap() {
                0 => break,
                n => filled += n,
            }
        }
        if filled == 0 {
            break;
        }
        assert_eq!(
            block[..8],
            blocks.to_le_bytes(),
            "block {blocks} of {path:?} is not what was written"
        );
        total += filled;
        blocks += 1;
    }
    drop(file);
    let elapsed = started.elapsed();
    probe.end("sequential read", size_mib, elapsed);
    assert_eq!(total, size_mib * MIB, "short read of {path:?}");
    mib_per_s(total, elapsed)
}

struct Latencies {
    ops_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// `reads` 4 KiB `pread`s at random page-aligned offsets of the file, one at a time.
fn random_reads(
    dir: &Path,
    size_mib: usize,
    reads: usize,
    seed: u64,
    probe: &mut Probe<'_>,
) -> Latencies {
    let path = dir.join(SEQ_FILE);
    let pages = (size_mib * MIB / PAGE) as u64;
    let mut rng = Rng(seed | 1);
    let mut raw = vec![0u8; 2 * PAGE];
    let at = raw.as_ptr().align_offset(PAGE);
    let buffer = &mut raw[at..at + PAGE];
    let mut latencies = Vec::with_capacity(reads);
    let file = File::open(&path).unwrap();
    probe.start();
    let started = Instant::now();
    for _ in 0..reads {
        let offset = rng.next() % pages * PAGE as u64;
        let began = Instant::now();
        file.read_exact_at(buffer, offset).unwrap();
        latencies.push(began.elapsed());
    }
    let elapsed = started.elapsed();
    probe.end("random 4 KiB read", reads, elapsed);
    drop(file);
    latencies.sort();
    let at = |q: usize| latencies[(latencies.len() * q / 100).min(latencies.len() - 1)];
    Latencies {
        ops_per_s: reads as f64 / elapsed.as_secs_f64(),
        p50_ms: at(50).as_secs_f64() * 1e3,
        p99_ms: at(99).as_secs_f64() * 1e3,
    }
}

/// Create (and write 100 bytes), lstat and unlink of `files` files: files per second of each
/// phase and of the three together.
fn metadata(dir: &Path, files: usize, probe: &mut Probe<'_>) -> [f64; 4] {
    let root = dir.join("small");
    fs::create_dir(&root).unwrap();
    let paths: Vec<PathBuf> = (0..files).map(|i| root.join(format!("f{i:05}"))).collect();
    let mut phase = |name: &'static str, op: &dyn Fn(&Path)| {
        probe.start();
        let started = Instant::now();
        for path in &paths {
            op(path);
        }
        let elapsed = started.elapsed();
        probe.end(name, files, elapsed);
        elapsed
    };
    let create = phase("create + 100 B write", &|path| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .unwrap();
        file.write_all(SMALL_FILE).unwrap();
    });
    let stat = phase("stat", &|path| {
        let meta = fs::symlink_metadata(path).unwrap();
        assert_eq!(meta.len(), SMALL_FILE.len() as u64);
    });
    let unlink = phase("unlink", &|path| fs::remove_file(path).unwrap());
    fs::remove_dir(&root).unwrap();
    let rate = |d: Duration| files as f64 / d.as_secs_f64();
    [
        rate(create),
        rate(stat),
        rate(unlink),
        rate(create + stat + unlink),
    ]
}

/// One round's figures for one target.
#[derive(Clone, Copy, Debug, Default)]
struct Figures {
    write: f64,
    read: f64,
    random: f64,
    random_p50: f64,
    random_p99: f64,
    create: f64,
    stat: f64,
    unlink: f64,
    triple: f64,
}

/// A 1 MiB block of incompressible bytes, page-aligned as dd's buffers are: an unaligned
/// 1 MiB buffer spans 257 pages, and the kernel (at most 256 pages per FUSE request) would
/// send each block as two requests.
struct Block(Vec<u8>);

impl Block {
    fn new() -> Block {
        let mut raw = vec![0u8; MIB + PAGE];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for chunk in raw.chunks_mut(8) {
            chunk.copy_from_slice(&rng.next().to_le_bytes()[..chunk.len()]);
        }
        Block(raw)
    }

    fn get(&mut self) -> &mut [u8] {
        let at = self.0.as_ptr().align_offset(PAGE);
        &mut self.0[at..at + MIB]
    }
}

fn run_workloads(
    dir: &Path,
    settings: &Settings,
    round: usize,
    cold: &mut bool,
    probe: &mut Probe<'_>,
) -> Figures {
    let mut block = Block::new();
    let block = block.get();
    settle_memory(settings.settle);
    let write = sequential_write(dir, settings.size_mib, block, probe);
    *cold &= drop_caches();
    settle_memory(settings.settle);
    let read = sequential_read(dir, settings.size_mib, block, probe);
    *cold &= drop_caches();
    let random = random_reads(
        dir,
        settings.size_mib,
        settings.random_reads,
        round as u64 + 1,
        probe,
    );
    fs::remove_file(dir.join(SEQ_FILE)).unwrap();
    let [create, stat, unlink, triple] = metadata(dir, settings.files, probe);
    Figures {
        write,
        read,
        random: random.ops_per_s,
        random_p50: random.p50_ms,
        random_p99: random.p99_ms,
        create,
        stat,
        unlink,
        triple,
    }
}

/// The reference worker serving one RWX volume, and a fusefs mount of it.
struct Replicated {
    _state: tempfile::TempDir,
    volume: Option<WorkerVolume>,
    mounted: Option<Mounted<Timed<Client<HttpsTransport>>>>,
    backing: PathBuf,
    stats: Arc<CallStats>,
}

impl Replicated {
    async fn start(work: &Path, call_data_bytes: usize, serving: Handle) -> Replicated {
        let state = tempfile::tempdir_in(work).unwrap();
        let volume = WorkerVolume::start(state.path(), VOLUME, AccessMode::Rwx, Timings::default())
            .await
            .unwrap();
        let client = volume.client_on(Budgets::default(), serving.clone());
        let stats = Arc::new(CallStats::default());
        let client = Timed {
            inner: client,
            stats: Arc::clone(&stats),
        };
        let config = FsConfig {
            call_data_bytes,
            ..FsConfig::default()
        };
        let fs = Arc::new(Fs::new(client, config).unwrap());
        let mount_point = state.path().join("mnt");
        fs::create_dir(&mount_point).unwrap();
        let mounted = fusefs::mount_on(&serving, fs, VOLUME, &mount_point)
            .await
            .unwrap();
        let backing = volume.backing_dir();
        Replicated {
            _state: state,
            volume: Some(volume),
            mounted: Some(mounted),
            backing,
            stats,
        }
    }

    fn mount_point(&self) -> &Path {
        self.mounted.as_ref().unwrap().path()
    }

    async fn stop(mut self) {
        if let Some(mut mounted) = self.mounted.take() {
            mounted.unmount(Duration::from_secs(15)).await.unwrap();
        }
        if let Some(volume) = self.volume.take() {
            volume.stop().await;
        }
    }
}

/// A worker that answers at once from memory: the root holds the directory `small`, which
/// holds a 100-byte file of every name, and can hold `sequential.bin`, whose writes only
/// grow its size and whose reads return zeros with each mebibyte's number. Mounted through the same
/// `Fs`, session adapter and mount options as (a), it shows what the kernel, the FUSE session
/// and `Fs` alone cost: the part of (a)'s time that no worker, however fast, could remove.
#[derive(Default)]
struct InstantWorker {
    calls: AtomicU64,
    /// The size of `sequential.bin` plus one; zero while it does not exist.
    sequential: AtomicU64,
}

const SMALL_INO: u64 = 2;
const SEQ_INO: u64 = 3;

impl InstantWorker {
    fn entry(&self, ino: u64) -> v1::Entry {
        let directory = ino == ROOT_INO || ino == SMALL_INO;
        let size = match ino {
            SEQ_INO => self.sequential.load(Relaxed).saturating_sub(1),
            _ if directory => 0,
            _ => SMALL_FILE.len() as u64,
        };
        memory::entry(ino, directory, size)
    }

    fn write(&self, r: &v1::WriteRequest) -> v1::WriteReply {
        let end = r.offset + r.data.len() as u64;
        self.sequential.fetch_max(end + 1, Relaxed);
        v1::WriteReply {
            written: r.data.len() as u32,
        }
    }

    fn read(&self, offset: u64, size: u32) -> Bytes {
        let end = self.sequential.load(Relaxed).saturating_sub(1);
        let len = end.saturating_sub(offset).min(u64::from(size)) as usize;
        let mut data = vec![0u8; len];
        // Each mebibyte starts with its number, as `sequential_read` checks.
        let first = offset.div_ceil(MIB as u64);
        for block in first.. {
            let at = (block * MIB as u64 - offset) as usize;
            if at + 8 > len {
                break;
            }
            data[at..at + 8].copy_from_slice(&block.to_le_bytes());
        }
        Bytes::from(data)
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> Option<v1::Entry> {
        match (parent, name) {
            (ROOT_INO, b"small") => Some(self.entry(SMALL_INO)),
            (ROOT_INO, name) if name == SEQ_FILE.as_bytes() => {
                (self.sequential.load(Relaxed) > 0).then(|| self.entry(SEQ_INO))
            }
            (SMALL_INO, name) => std::str::from_utf8(name)
                .ok()
                .and_then(|n| n.strip_prefix('f')?.parse::<u64>().ok())
                .map(|i| self.entry(1000 + i)),
            _ => None,
        }
    }
}

impl FileService for InstantWorker {
    fn call(
        &self,
        _request_id: Option<RequestId>,
        _until: Option<Instant>,
        op: Op,
    ) -> impl Future<Output = Result<ReplyResult, lease_client::Error>> + Send {
        let refused = |errno| lease_client::Error::Refused {
            volume_id: VOLUME.into(),
            op: "instant",
            refusal: lease_client::Refusal::Errno(errno),
        };
        self.calls.fetch_add(1, Relaxed);
        let ino_of = |file: Option<v1::FileId>| file.map_or(0, |f| f.ino);
        let result = match op {
            Op::Lookup(r) => self
                .lookup(ino_of(r.parent), &r.name)
                .map(ReplyResult::Lookup)
                .ok_or(refused(libc::ENOENT)),
            Op::Getattr(r) => Ok(ReplyResult::Getattr(self.entry(ino_of(r.file)))),
            Op::Create(r) if r.name == SEQ_FILE.as_bytes() => {
                self.sequential.store(1, Relaxed);
                Ok(ReplyResult::Create(v1::CreateReply {
                    entry: Some(self.entry(SEQ_INO)),
                    handle: 1,
                    handle_lease_ms: 0,
                }))
            }
            Op::Open(_) => Ok(ReplyResult::Open(v1::OpenReply {
                handle: 1,
                handle_lease_ms: 0,
            })),
            Op::OpenKillSuidgid(_) => Ok(ReplyResult::OpenKillSuidgid(v1::OpenReply {
                handle: 1,
                handle_lease_ms: 0,
            })),
            Op::Write(ref r) => {
                let written = self.write(r);
                Ok(ReplyResult::Write(written))
            }
            Op::WriteKillSuidgid(ref r) => {
                let written = self.write(r.write.as_ref().unwrap_or(&v1::WriteRequest::default()));
                Ok(ReplyResult::WriteKillSuidgid(written))
            }
            Op::Read(r) => Ok(ReplyResult::Read(v1::ReadReply {
                data: self.read(r.offset, r.size),
            })),
            Op::Flush(_) => Ok(ReplyResult::Flush(v1::Empty {})),
            Op::Fsync(_) => Ok(ReplyResult::Fsync(v1::Empty {})),
            Op::Release(_) => Ok(ReplyResult::Release(v1::Empty {})),
            _ => Err(refused(libc::ENOSYS)),
        };
        std::future::ready(result)
    }
}

/// A mount of [`InstantWorker`] beside the others.
struct InstantMount {
    mounted: Mounted<InstantWorker>,
    fs: Arc<Fs<InstantWorker>>,
}

/// One round through [`InstantMount`]: MiB/s written and read, `stat`s per second and the
/// FUSE requests each `stat` took.
#[derive(Clone, Copy, Debug, Default)]
struct InstantFigures {
    write: f64,
    read: f64,
    stat: f64,
    requests_per_stat: f64,
}

impl InstantMount {
    async fn start(work: &Path, call_data_bytes: usize, serving: Handle) -> InstantMount {
        let config = FsConfig {
            call_data_bytes,
            ..FsConfig::default()
        };
        let fs = Arc::new(Fs::new(InstantWorker::default(), config).unwrap());
        let mount_point = work.join("instant");
        fs::create_dir(&mount_point).unwrap();
        let mounted = fusefs::mount_on(&serving, Arc::clone(&fs), VOLUME, &mount_point)
            .await
            .unwrap();
        InstantMount { mounted, fs }
    }

    fn round(&self, settings: &Settings, block: &mut [u8]) -> InstantFigures {
        let dir = self.mounted.path();
        let mut probe = Probe {
            stats: None,
            phases: Vec::new(),
        };
        let write = sequential_write(dir, settings.size_mib, block, &mut probe);
        let read = sequential_read(dir, settings.size_mib, block, &mut probe);
        self.fs.service().sequential.store(0, Relaxed);

        let root = dir.join("small");
        let paths: Vec<PathBuf> = (0..settings.files)
            .map(|i| root.join(format!("f{i:05}")))
            .collect();
        let before = self.fs.service().calls.load(Relaxed);
        let started = Instant::now();
        for path in &paths {
            let meta = fs::symlink_metadata(path).unwrap();
            assert_eq!(meta.len(), SMALL_FILE.len() as u64);
        }
        let elapsed = started.elapsed();
        let requests = self.fs.service().calls.load(Relaxed) - before;
        InstantFigures {
            write,
            read,
            stat: settings.files as f64 / elapsed.as_secs_f64(),
            requests_per_stat: requests as f64 / settings.files as f64,
        }
    }
}

/// A private sshd on 127.0.0.1 and an sshfs mount of a directory through it, both children of
/// this process. Dropping it (on a panic, say) unmounts and ends both by PID.
struct Sshfs {
    dir: PathBuf,
    mount_point: PathBuf,
    sshd: Option<Child>,
    sshfs: Option<Child>,
    version: String,
}

fn run(command: &mut Command) -> Result<String, String> {
    let out = command
        .output()
        .map_err(|e| format!("{command:?} did not start: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{command:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn mounted_type(path: &Path) -> Option<String> {
    let bytes = mountinfo::read_self().ok()?;
    let table = mountinfo::MountTable::parse(&bytes).ok()?;
    table
        .by_mount_point(path)
        .map(|m| m.fs_type().to_string_lossy().into_owned())
}

/// The options that turn every sshfs cache off: no directory (name, attribute, symlink) cache,
/// direct I/O (no page cache, no readahead), and zero kernel entry, attribute and negative-entry
/// lifetimes: the same caching as fusefs, which is what "caches off" compares.
const SSHFS_NO_CACHE: &str =
    "dir_cache=no,direct_io,entry_timeout=0,attr_timeout=0,negative_timeout=0";

impl Sshfs {
    fn start(work: &Path) -> Result<Sshfs, String> {
        let setup = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/setup-sshfs.sh");
        run(Command::new("bash").arg(&setup))?;
        let dir = tempfile::tempdir_in(work)
            .map_err(|e| e.to_string())?
            .keep();
        let mut sshfs = Sshfs {
            mount_point: dir.join("mnt"),
            dir,
            sshd: None,
            sshfs: None,
            version: String::new(),
        };
        sshfs.start_children()?;
        Ok(sshfs)
    }

    fn start_children(&mut self) -> Result<(), String> {
        let dir = self.dir.clone();
        let export = dir.join("export");
        fs::create_dir(&export).map_err(|e| e.to_string())?;
        fs::create_dir(&self.mount_point).map_err(|e| e.to_string())?;
        for key in ["host_key", "id"] {
            run(Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", "fusefs-bench", "-f"])
                .arg(dir.join(key)))?;
        }
        fs::copy(dir.join("id.pub"), dir.join("authorized_keys")).map_err(|e| e.to_string())?;
        let port = free_port();
        let config = dir.join("sshd_config");
        fs::write(
            &config,
            format!(
                "Port {port}\n\
                 ListenAddress 127.0.0.1\n\
                 HostKey {host_key}\n\
                 AuthorizedKeysFile {authorized}\n\
                 PidFile none\n\
                 PermitRootLogin prohibit-password\n\
                 PubkeyAuthentication yes\n\
                 PasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\n\
                 UsePAM no\n\
                 StrictModes no\n\
                 Subsystem sftp /usr/lib/openssh/sftp-server\n",
                host_key = dir.join("host_key").display(),
                authorized = dir.join("authorized_keys").display(),
            ),
        )
        .map_err(|e| e.to_string())?;
        let log = File::create(dir.join("sshd.log")).map_err(|e| e.to_string())?;
        self.sshd = Some(
            Command::new("/usr/sbin/sshd")
                .arg("-f")
                .arg(&config)
                .args(["-D", "-e"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .map_err(|e| format!("sshd did not start: {e}"))?,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
            if Instant::now() > deadline {
                return Err(format!(
                    "sshd does not listen on port {port}: {}",
                    fs::read_to_string(dir.join("sshd.log")).unwrap_or_default()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.version = run(Command::new("sshfs").arg("--version"))?
            .lines()
            .find(|l| l.starts_with("SSHFS version"))
            .unwrap_or("sshfs")
            .to_owned();
        let log = File::create(dir.join("sshfs.log")).map_err(|e| e.to_string())?;
        self.sshfs = Some(
            Command::new("sshfs")
                .arg(format!("root@127.0.0.1:{}", export.display()))
                .arg(&self.mount_point)
                .args(["-f", "-F", "/dev/null", "-o", SSHFS_NO_CACHE, "-o"])
                .arg(format!(
                    "Port={port},IdentityFile={},IdentitiesOnly=yes,BatchMode=yes,\
                     StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,LogLevel=ERROR",
                    dir.join("id").display()
                ))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .map_err(|e| format!("sshfs did not start: {e}"))?,
        );
        let deadline = Instant::now() + Duration::from_secs(15);
        while mounted_type(&self.mount_point).as_deref() != Some("fuse.sshfs") {
            let exited = self
                .sshfs
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || Instant::now() > deadline {
                return Err(format!(
                    "sshfs did not mount ({exited:?}): {}",
                    fs::read_to_string(dir.join("sshfs.log")).unwrap_or_default()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn mount_point(&self) -> &Path {
        &self.mount_point
    }

    /// The directory sshfs exports.
    fn export(&self) -> PathBuf {
        self.dir.join("export")
    }

    /// Unmounts, waits for sshfs to exit (killing it by PID if it does not), then ends sshd by
    /// PID, and removes the directory.
    fn stop(&mut self) {
        if mounted_type(&self.mount_point).as_deref() == Some("fuse.sshfs")
            && let Err(e) =
                rustix::mount::unmount(&self.mount_point, rustix::mount::UnmountFlags::NOFOLLOW)
        {
            eprintln!("unmounting sshfs: {e}; detaching it");
            let _ = rustix::mount::unmount(
                &self.mount_point,
                rustix::mount::UnmountFlags::DETACH | rustix::mount::UnmountFlags::NOFOLLOW,
            );
        }
        if let Some(mut child) = self.sshfs.take() {
            end_child(&mut child, Duration::from_secs(10));
        }
        if let Some(mut child) = self.sshd.take() {
            // sshd -D only listens; its per-connection children end with the sshfs connection.
            end_child(&mut child, Duration::ZERO);
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Waits up to `wait` for `child` to exit, then kills it (by its PID) and reaps it.
fn end_child(child: &mut Child, wait: Duration) {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Sshfs {
    fn drop(&mut self) {
        self.stop();
    }
}

fn one_line(command: &str, args: &[&str]) -> String {
    Command::new(command)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

const TARGETS: [&str; 3] = ["(a) fusefs", "(b) backing dir", "(c) sshfs"];

struct Row {
    name: String,
    pick: fn(&Figures) -> f64,
    digits: usize,
    /// Lower is better (latencies): ratios are inverted so that above 1 means fusefs is better.
    lower_is_better: bool,
    /// Targets: minimum a/b and minimum a/c.
    target: (Option<f64>, Option<f64>),
}

fn report(settings: &Settings, results: &[Vec<Figures>; 3], cold: bool, loads: &[String]) {
    let size = if settings.size_mib.is_multiple_of(1024) {
        format!("{} GiB", settings.size_mib / 1024)
    } else {
        format!("{} MiB", settings.size_mib)
    };
    let files = settings.files;
    let rows = [
        Row {
            name: format!("sequential write {size}, 1 MiB blocks, + fsync (MiB/s)"),
            pick: |f| f.write,
            digits: 0,
            lower_is_better: false,
            target: (Some(1.0 / 3.0), Some(2.0)),
        },
        Row {
            name: format!("sequential read {size} cold, 1 MiB blocks (MiB/s)"),
            pick: |f| f.read,
            digits: 0,
            lower_is_better: false,
            target: (Some(1.0 / 3.0), Some(2.0)),
        },
        Row {
            name: format!("random 4 KiB reads cold, {} (ops/s)", settings.random_reads),
            pick: |f| f.random,
            digits: 0,
            lower_is_better: false,
            target: (None, None),
        },
        Row {
            name: "random 4 KiB read p50 (ms)".into(),
            pick: |f| f.random_p50,
            digits: 3,
            lower_is_better: true,
            target: (None, None),
        },
        Row {
            name: "random 4 KiB read p99 (ms)".into(),
            pick: |f| f.random_p99,
            digits: 3,
            lower_is_better: true,
            target: (None, None),
        },
        Row {
            name: format!("create + 100 B write, {files} files (files/s)"),
            pick: |f| f.create,
            digits: 0,
            lower_is_better: false,
            target: (None, Some(2.0)),
        },
        Row {
            name: format!("stat, {files} files (files/s)"),
            pick: |f| f.stat,
            digits: 0,
            lower_is_better: false,
            target: (None, Some(2.0)),
        },
        Row {
            name: format!("unlink, {files} files (files/s)"),
            pick: |f| f.unlink,
            digits: 0,
            lower_is_better: false,
            target: (None, Some(2.0)),
        },
        Row {
            name: "create+stat+unlink together (files/s)".into(),
            pick: |f| f.triple,
            digits: 0,
            lower_is_better: false,
            target: (None, Some(2.0)),
        },
    ];

    println!();
    println!(
        "{} rounds interleaved a, b, c; medians. {}; kernel {}; {} cores; {}; {}; load average {}.{}",
        settings.rounds,
        one_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        one_line("uname", &["-r"]),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        idle_policy(),
        match (settings.free_page_reporting, settings.settle.as_secs()) {
            (true, 0) => "free page reporting, memory NOT settled before sequential I/O".to_owned(),
            (true, s) => format!("free page reporting, memory settled {s} s before sequential I/O"),
            (false, 0) => "no free page reporting".to_owned(),
            (false, s) => format!("no free page reporting, {s} s pause before sequential I/O"),
        },
        loads.join(" → "),
        if cold {
            ""
        } else {
            " WARNING: drop_caches was refused, reads were warm."
        }
    );
    println!();
    println!(
        "| workload | (a) fusefs | (b) backing dir | (c) sshfs | a/b | a/c | target | result |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|---|");
    let mut verdicts = Vec::new();
    for row in &rows {
        let medians: Vec<f64> = results
            .iter()
            .map(|rounds| median(rounds.iter().map(row.pick).collect()))
            .collect();
        let ratio = |other: f64| {
            if row.lower_is_better {
                other / medians[0]
            } else {
                medians[0] / other
            }
        };
        let (ab, ac) = (ratio(medians[1]), ratio(medians[2]));
        let mut target = Vec::new();
        let mut result = Vec::new();
        if let Some(min) = row.target.0 {
            target.push("a/b ≥ 1/3".to_owned());
            result.push(if ab >= min { "PASS" } else { "MISS" });
            verdicts.push((format!("{} vs floor", row.name), ab >= min));
        }
        if let Some(min) = row.target.1 {
            target.push(format!("a/c ≥ {min}"));
            result.push(if ac >= min { "PASS" } else { "MISS" });
            verdicts.push((format!("{} vs sshfs", row.name), ac >= min));
        }
        let d = row.digits;
        println!(
            "| {} | {:.d$} | {:.d$} | {:.d$} | {:.2} | {:.2} | {} | {} |",
            row.name,
            medians[0],
            medians[1],
            medians[2],
            ab,
            ac,
            if target.is_empty() {
                "–".to_owned()
            } else {
                target.join(", ")
            },
            if result.is_empty() {
                "–".to_owned()
            } else {
                result.join(", ")
            },
        );
    }
    println!();
    println!("Each round (a / b / c):");
    for row in &rows {
        let d = row.digits;
        let rounds: Vec<String> = (0..settings.rounds)
            .map(|r| {
                results
                    .iter()
                    .map(|t| format!("{:.d$}", (row.pick)(&t[r])))
                    .collect::<Vec<_>>()
                    .join(" / ")
            })
            .collect();
        println!("- {}: {}", row.name, rounds.join("; "));
    }
    let missed: Vec<&str> = verdicts
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(n, _)| n.as_str())
        .collect();
    println!();
    if missed.is_empty() {
        println!("every target met");
    } else {
        println!("targets missed: {}", missed.join("; "));
    }
}

/// Where fusefs's time went in the last round: worker calls per user-level operation, their
/// mean latency, and the share of the wall time spent waiting for them.
fn breakdown(round: usize, phases: &[Phase]) {
    println!();
    println!(
        "Where (a)'s time goes (round {round}; calls timed around the lease-client `Client`; \
         the parts of one read or write overlap, so their call time can exceed the wall time):"
    );
    println!();
    println!("| phase | wall per op | worker calls per op (mean latency) | call time / wall |");
    println!("|---|---:|---|---:|");
    for phase in phases {
        let ops = phase.ops.max(1) as f64;
        let in_calls: Duration = phase.calls.values().map(|(_, d)| *d).sum();
        let calls: Vec<String> = phase
            .calls
            .iter()
            .map(|(op, (n, d))| {
                format!(
                    "{op} {:.2} ({:.3} ms)",
                    *n as f64 / ops,
                    d.as_secs_f64() * 1e3 / (*n).max(1) as f64
                )
            })
            .collect();
        println!(
            "| {} | {:.3} ms | {} | {:.0} % |",
            phase.name,
            phase.wall.as_secs_f64() * 1e3 / ops,
            calls.join(", "),
            100.0 * in_calls.as_secs_f64() / phase.wall.as_secs_f64()
        );
    }
}

fn main() {
    if !common::private_namespace("fusefs throughput benchmark") {
        return;
    }
    let settings = Settings::from_env();
    let work_root = std::env::temp_dir();
    let work = tempfile::Builder::new()
        .prefix("fusefs-bench-")
        .tempdir_in(&work_root)
        .unwrap();
    eprintln!(
        "fusefs throughput: {settings:?} in {:?} (df: {})",
        work.path(),
        one_line("df", &["-h", "--output=avail", work_root.to_str().unwrap()]).replace('\n', " ")
    );
    let runtime = runtime(settings.runtime_threads);
    let serving = ServingThreads::new("fuse", 1).unwrap();
    let replicated = runtime.block_on(Replicated::start(
        work.path(),
        settings.call_kib << 10,
        serving.next(),
    ));
    let mut sshfs = match Sshfs::start(work.path()) {
        Ok(sshfs) => sshfs,
        Err(e) => {
            runtime.block_on(replicated.stop());
            panic!("the sshfs peer could not start: {e}");
        }
    };
    eprintln!("peer: {} with -o {SSHFS_NO_CACHE}", sshfs.version);
    let dirs = [
        replicated.mount_point().to_owned(),
        replicated.backing.clone(),
        sshfs.mount_point().to_owned(),
    ];
    let mut instant = runtime.block_on(InstantMount::start(
        work.path(),
        settings.call_kib << 10,
        serving.next(),
    ));
    let mut instant_rounds = Vec::new();
    let mut block = Block::new();
    let mut loads = vec![loadavg()];
    let mut cold = true;
    let mut results: [Vec<Figures>; 3] = Default::default();
    let mut phases = Vec::new();
    let part = |name: &str| settings.only.as_deref().is_none_or(|only| only == name);
    let rounds = if settings.only.is_some() {
        0
    } else {
        settings.rounds
    };
    for round in 0..rounds {
        for (target, dir) in dirs.iter().enumerate() {
            let mut probe = Probe {
                stats: (target == 0).then_some(&*replicated.stats),
                phases: Vec::new(),
            };
            let figures = run_workloads(dir, &settings, round, &mut cold, &mut probe);
            if target == 0 {
                phases = probe.phases;
            }
            eprintln!(
                "round {} {}: {figures:.2?} (load {})",
                round + 1,
                TARGETS[target],
                loadavg()
            );
            results[target].push(figures);
        }
        let figures = instant.round(&settings, block.get());
        eprintln!("round {} the FUSE layer alone: {figures:.2?}", round + 1);
        instant_rounds.push(figures);
    }
    let parallel = if part("parallel") {
        parallel(&settings, &dirs)
    } else {
        Vec::new()
    };
    let curves = if part("curve") {
        curves(&settings, &dirs, &replicated.backing, &sshfs.export())
    } else {
        Vec::new()
    };
    loads.push(loadavg());
    sshfs.stop();
    runtime
        .block_on(instant.mounted.unmount(Duration::from_secs(15)))
        .unwrap();
    runtime.block_on(replicated.stop());
    if rounds > 0 {
        report(&settings, &results, cold, &loads);
        breakdown(settings.rounds, &phases);
        instant_report(&results, &instant_rounds);
    }
    println!("\nloads: {}", loads.join(" → "));
    if !parallel.is_empty() {
        parallel::report(&TARGETS, &parallel, &settings.threads);
    }
    if !curves.is_empty() && (!settings.curve.is_empty() || settings.tree_files > 0) {
        curve::report(&TARGETS, &curves, settings.tree_files);
    }
}

/// The parallel runs of every target (`throughput/parallel.rs`), interleaved a, b, c for each
/// thread count, over the rounds: `[round][target][thread count]`.
fn parallel(settings: &Settings, dirs: &[PathBuf; 3]) -> Vec<Vec<Vec<parallel::Rates>>> {
    if settings.threads.is_empty() {
        return Vec::new();
    }
    let read_files: Vec<Vec<PathBuf>> = dirs
        .iter()
        .enumerate()
        .map(|(target, dir)| parallel::prepare(dir, target))
        .collect();
    let mut rounds = Vec::new();
    for round in 0..settings.rounds {
        let mut targets = vec![Vec::new(); dirs.len()];
        for &threads in &settings.threads {
            for (target, dir) in dirs.iter().enumerate() {
                let rates = parallel::run(
                    dir,
                    threads,
                    settings.parallel_files,
                    settings.parallel_reads,
                    &read_files[target],
                );
                eprintln!(
                    "round {} parallel {}: {rates:.0?} (load {})",
                    round + 1,
                    TARGETS[target],
                    loadavg()
                );
                targets[target].push(rates);
            }
        }
        rounds.push(targets);
    }
    for files in &read_files {
        for file in files {
            fs::remove_file(file).unwrap();
        }
        if let Some(dir) = files.first().and_then(|f| f.parent()) {
            fs::remove_dir(dir).unwrap();
        }
    }
    rounds
}

/// The curves of every target (`throughput/curve.rs`): the directory grown through each,
/// then the tree planted beside (a) and (b) (the worker's backing directory) and beside (c)
/// (the sshfs export) and walked twice.
fn curves(
    settings: &Settings,
    dirs: &[PathBuf; 3],
    backing: &Path,
    export: &Path,
) -> Vec<curve::Curve> {
    let mut curves: Vec<curve::Curve> = dirs
        .iter()
        .enumerate()
        .map(|(target, dir)| {
            if settings.curve.is_empty() {
                return curve::Curve::default();
            }
            let grown = curve::grow(dir, &settings.curve);
            eprintln!(
                "curve {}: {grown:.3?} (load {})",
                TARGETS[target],
                loadavg()
            );
            grown
        })
        .collect();
    if settings.tree_files > 0 {
        for (beside, targets) in [(backing, &[0, 1][..]), (export, &[2][..])] {
            curve::plant(beside, settings.tree_files);
            for &target in targets {
                for walk in 0..2 {
                    let (seconds, files) = curve::walk(&dirs[target]);
                    assert_eq!(files, settings.tree_files, "{}", TARGETS[target]);
                    curves[target].walks[walk] = seconds;
                }
                eprintln!("walk {}: {:.2?} s", TARGETS[target], curves[target].walks);
            }
            curve::uproot(beside);
        }
    }
    curves
}

fn instant_report(results: &[Vec<Figures>; 3], rounds: &[InstantFigures]) {
    let of = |pick: fn(&InstantFigures) -> f64| median(rounds.iter().map(pick).collect());
    let sshfs = |pick: fn(&Figures) -> f64| median(results[2].iter().map(pick).collect());
    let (write, read, stat) = (of(|f| f.write), of(|f| f.read), of(|f| f.stat));
    println!();
    println!(
        "The FUSE layer alone (`Fs`, the FUSE session and the kernel with the same mount options, over a \
         worker that answers from memory at once; medians of {} rounds):",
        rounds.len()
    );
    println!();
    println!("| workload | FUSE layer alone | (c) sshfs | ratio |");
    println!("|---|---:|---:|---:|");
    println!(
        "| sequential write + fsync (MiB/s) | {write:.0} | {:.0} | {:.2} |",
        sshfs(|f| f.write),
        write / sshfs(|f| f.write)
    );
    println!(
        "| sequential read (MiB/s) | {read:.0} | {:.0} | {:.2} |",
        sshfs(|f| f.read),
        read / sshfs(|f| f.read)
    );
    println!(
        "| stat (files/s; {:.2} requests each) | {stat:.0} | {:.0} | {:.2} |",
        of(|f| f.requests_per_stat),
        sshfs(|f| f.stat),
        stat / sshfs(|f| f.stat)
    );
}
