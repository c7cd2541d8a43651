//! The floor under fusefs, part by part: what one `lstat` of `d/fN` and one 4 KiB read cost
//! through (1) a minimal server on libfuse's low-level API answering from memory
//! (`benches/floor/ll_floor.c`, multi-threaded, the mount options fusefs promises: the least
//! any FUSE filesystem pays on this kernel) and (2) fusefs's FUSE layer alone: the
//! fuse-session loop and the `Fs` core over a worker that answers from memory at once, with no
//! transport. Each server runs in a process of its own, so the CPU time of each side is
//! measured apart: the client's (the measuring thread's, in the kernel's syscall path) and
//! the server's (every thread of its process).
//!
//! ```text
//! cargo bench -p fusefs --bench floor
//! ```
//!
//! Needs root (it mounts in a private mount namespace of its own; without the privilege it
//! prints SKIPPED and exits 0) and `/dev/fuse`. `benches/setup-libfuse.sh` installs libfuse's
//! headers and a C compiler when missing; the server is built into the run's temporary
//! directory. Both servers count the FUSE requests they read into a shared 8-byte file, so
//! each figure comes with its requests per operation. The rounds alternate the servers and
//! report medians. Every child is ended by its PID and every mount lives in the namespace.
//!
//! Environment: `BENCH_ROUNDS` (3), `BENCH_OPS` (operations per phase, 20000),
//! `BENCH_RUNTIME_THREADS` (the fusefs server's tokio worker threads, 4).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)]

use std::fs::{self, File};
use std::future::Future;
use std::io::Read as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fusefs::{FileService, Fs, FsConfig};
use lease_client::protocol::{ROOT_INO, ROOT_INODE_GENERATION, RequestId};
use lease_client::v1;
use lease_client::v1::reply::Result as ReplyResult;
use lease_client::v1::request::Op;

/// The files in `d`, as in `ll_floor.c`.
const FILES: u64 = 1000;
const DIR_INO: u64 = 2;
const FIRST_FILE: u64 = 1000;
const FILE_SIZE: usize = 4096;
const SERVE_FUSEFS: &str = "--serve-fusefs";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The tree of `ll_floor.c`, answered at once from memory: the worker of row (2).
struct Memory;

impl Memory {
    fn entry(ino: u64) -> Option<v1::Entry> {
        let directory = ino == ROOT_INO || ino == DIR_INO;
        if !directory && !(FIRST_FILE..FIRST_FILE + FILES).contains(&ino) {
            return None;
        }
        Some(v1::Entry {
            file: Some(v1::FileId {
                ino,
                inode_generation: if ino == ROOT_INO {
                    ROOT_INODE_GENERATION
                } else {
                    1
                },
            }),
            attr: Some(v1::Attr {
                mode: if directory {
                    libc::S_IFDIR | 0o755
                } else {
                    libc::S_IFREG | 0o644
                },
                nlink: if directory { 2 } else { 1 },
                size: if directory { 0 } else { FILE_SIZE as u64 },
                blksize: 4096,
                ..v1::Attr::default()
            }),
        })
    }

    fn lookup(parent: u64, name: &[u8]) -> Option<v1::Entry> {
        match (parent, name) {
            (ROOT_INO, b"d") => Memory::entry(DIR_INO),
            (DIR_INO, name) => std::str::from_utf8(name)
                .ok()
                .and_then(|n| n.strip_prefix('f')?.parse::<u64>().ok())
                .and_then(|n| Memory::entry(FIRST_FILE + n)),
            _ => None,
        }
    }
}

impl FileService for Memory {
    fn call(
        &self,
        _request_id: Option<RequestId>,
        _until: Option<Instant>,
        op: Op,
    ) -> impl Future<Output = Result<ReplyResult, lease_client::Error>> + Send {
        let ino_of = |file: Option<v1::FileId>| file.map_or(0, |f| f.ino);
        let enoent = lease_client::Error::Refused {
            volume_id: "floor".into(),
            op: "memory",
            refusal: lease_client::Refusal::Errno(libc::ENOENT),
        };
        let result = match op {
            Op::Lookup(r) => Memory::lookup(ino_of(r.parent), &r.name)
                .map(ReplyResult::Lookup)
                .ok_or(enoent),
            Op::Getattr(r) => Memory::entry(ino_of(r.file))
                .map(ReplyResult::Getattr)
                .ok_or(enoent),
            Op::Open(_) => Ok(ReplyResult::Open(v1::OpenReply {
                handle: 7,
                handle_lease_ms: 0,
            })),
            Op::Read(r) => {
                let left = (FILE_SIZE as u64).saturating_sub(r.offset);
                let len = left.min(u64::from(r.size)) as usize;
                Ok(ReplyResult::Read(v1::ReadReply {
                    data: Bytes::from(vec![0u8; len]),
                }))
            }
            Op::RenewHandles(_) => Ok(ReplyResult::RenewHandles(v1::RenewHandlesReply::default())),
            Op::Release(_) => Ok(ReplyResult::Release(v1::Empty {})),
            Op::Flush(_) => Ok(ReplyResult::Flush(v1::Empty {})),
            _ => Err(enoent),
        };
        std::future::ready(result)
    }
}

/// Row (2)'s server process: mounts fusefs over [`Memory`] at `mount`, copies the session's
/// request count into `counter` every millisecond, and unmounts when its stdin closes.
fn serve_fusefs(mount: &Path, counter: &Path) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(env_or("BENCH_RUNTIME_THREADS", 4))
        .enable_all()
        .build()
        .unwrap();
    let fs = Arc::new(Fs::new(Memory, FsConfig::default()).unwrap());
    let mut mounted = runtime.block_on(fusefs::mount(fs, "floor", mount)).unwrap();
    let counter = File::options().write(true).open(counter).unwrap();
    let (done_tx, done) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        let _ = done_tx.send(());
    });
    loop {
        let requests = mounted.counters().requests;
        counter.write_all_at(&requests.to_le_bytes(), 0).unwrap();
        match done.recv_timeout(Duration::from_millis(1)) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            _ => break,
        }
    }
    runtime
        .block_on(mounted.unmount(Duration::from_secs(10)))
        .unwrap();
}

/// One server under test: its process, its mount point and its request counter.
struct Server {
    name: &'static str,
    child: Child,
    mount: PathBuf,
    counter: PathBuf,
}

impl Server {
    fn start(name: &'static str, mut command: Command, mount: PathBuf, counter: PathBuf) -> Server {
        fs::create_dir_all(&mount).unwrap();
        File::create(&counter).unwrap().set_len(8).unwrap();
        let child = command
            .arg(&mount)
            .arg(&counter)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let server = Server {
            name,
            child,
            mount,
            counter,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while fs::symlink_metadata(server.mount.join("d/f0")).is_err() {
            assert!(Instant::now() < deadline, "{name} did not mount");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// Requests the server has read so far.
    fn requests(&self) -> u64 {
        // The fusefs server copies its count every millisecond.
        std::thread::sleep(Duration::from_millis(20));
        let mut bytes = [0u8; 8];
        File::open(&self.counter)
            .unwrap()
            .read_exact_at(&mut bytes, 0)
            .unwrap();
        u64::from_le_bytes(bytes)
    }

    /// CPU time of every thread of the server's process so far.
    fn cpu(&self) -> Duration {
        let tasks = PathBuf::from(format!("/proc/{}/task", self.child.id()));
        let mut total = 0u64;
        for task in fs::read_dir(tasks).unwrap().flatten() {
            // The first field of schedstat: nanoseconds on a CPU.
            if let Ok(text) = fs::read_to_string(task.path().join("schedstat")) {
                total += text
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        Duration::from_nanos(total)
    }

    /// Ends the server: its stdin closes (the fusefs server unmounts and exits) and it gets
    /// SIGTERM (libfuse unmounts and exits); killed by PID if it has not exited in 10 s.
    fn stop(mut self) {
        drop(self.child.stdin.take());
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("{} did not exit: killing it", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// One phase's figures for one server.
#[derive(Clone, Copy, Debug, Default)]
struct Phase {
    p50_us: f64,
    p99_us: f64,
    ops_per_s: f64,
    requests_per_op: f64,
    client_cpu_us: f64,
    server_cpu_us: f64,
}

fn measure(server: &Server, ops: usize, mut op: impl FnMut(usize)) -> Phase {
    // Warm up, then measure.
    for i in 0..ops / 20 {
        op(i);
    }
    let (requests, server_cpu) = (server.requests(), server.cpu());
    let client_cpu = thread_cpu();
    let mut latencies = Vec::with_capacity(ops);
    let started = Instant::now();
    for i in 0..ops {
        let t = Instant::now();
        op(i);
        latencies.push(t.elapsed());
    }
    let elapsed = started.elapsed();
    let client_cpu = thread_cpu() - client_cpu;
    let server_cpu = server.cpu() - server_cpu;
    let requests = server.requests() - requests;
    latencies.sort_unstable();
    let at = |q: f64| latencies[((ops as f64 * q) as usize).min(ops - 1)].as_secs_f64() * 1e6;
    let per_op = |d: Duration| d.as_secs_f64() * 1e6 / ops as f64;
    Phase {
        p50_us: at(0.5),
        p99_us: at(0.99),
        ops_per_s: ops as f64 / elapsed.as_secs_f64(),
        requests_per_op: requests as f64 / ops as f64,
        client_cpu_us: per_op(client_cpu),
        server_cpu_us: per_op(server_cpu),
    }
}

/// An `lstat` of `d/fN` and a 4 KiB `pread` of `d/f0` through `server`, `ops` each.
fn round(server: &Server, ops: usize) -> [Phase; 2] {
    let names: Vec<PathBuf> = (0..FILES)
        .map(|n| server.mount.join(format!("d/f{n}")))
        .collect();
    let stat = measure(server, ops, |i| {
        let meta = fs::symlink_metadata(&names[i % names.len()]).unwrap();
        assert_eq!(meta.len(), FILE_SIZE as u64);
    });
    let file = File::open(&names[0]).unwrap();
    let mut buf = vec![0u8; FILE_SIZE];
    let read = measure(server, ops, |_| {
        assert_eq!(file.read_at(&mut buf, 0).unwrap(), FILE_SIZE);
    });
    [stat, read]
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Builds `ll_floor.c` into `dir`; the binary.
fn build_floor(dir: &Path) -> PathBuf {
    let benches = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches");
    let setup = Command::new("bash")
        .arg(benches.join("setup-libfuse.sh"))
        .status()
        .unwrap();
    assert!(setup.success(), "setup-libfuse.sh failed");
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "fuse3"])
        .output()
        .unwrap();
    let flags = String::from_utf8(flags.stdout).unwrap();
    let binary = dir.join("ll_floor");
    let built = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-o"])
        .arg(&binary)
        .arg(benches.join("floor/ll_floor.c"))
        .args(flags.split_whitespace())
        .status()
        .unwrap();
    assert!(built.success(), "ll_floor.c did not build");
    binary
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let [_, mode, mount, counter, ..] = &args[..]
        && mode == SERVE_FUSEFS
    {
        serve_fusefs(Path::new(mount), Path::new(counter));
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        println!("SKIPPED (needs /dev/fuse): fusefs floor benchmark");
        return;
    }
    // The namespace first: every child inherits it, so no mount of this run outlives it.
    if let Err(why) = test_support::try_private_mount_namespace() {
        println!("SKIPPED (needs root in a private mount namespace): fusefs floor: {why}");
        return;
    }
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    let ops: usize = env_or("BENCH_OPS", 20_000);
    let work = tempfile::Builder::new()
        .prefix("fusefs-floor-")
        .tempdir()
        .unwrap();
    let floor = build_floor(work.path());
    let libfuse_version = Command::new("pkg-config")
        .args(["--modversion", "fuse3"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let mut fusefs = Command::new(std::env::current_exe().unwrap());
    fusefs.arg(SERVE_FUSEFS);
    let servers = [
        Server::start(
            "(1) libfuse low-level, from memory",
            Command::new(&floor),
            work.path().join("libfuse"),
            work.path().join("libfuse.count"),
        ),
        Server::start(
            "(2) fusefs FUSE layer alone (session + Fs, memory worker)",
            fusefs,
            work.path().join("fusefs"),
            work.path().join("fusefs.count"),
        ),
    ];
    let mut results: Vec<Vec<[Phase; 2]>> = vec![Vec::new(); servers.len()];
    for r in 0..rounds {
        for (at, server) in servers.iter().enumerate() {
            let phases = round(server, ops);
            eprintln!("round {} {}: {phases:.1?}", r + 1, server.name);
            results[at].push(phases);
        }
    }
    let names: Vec<&str> = servers.iter().map(|s| s.name).collect();
    for server in servers {
        server.stop();
    }
    report(&names, &results, ops, &libfuse_version);
}

fn report(names: &[&str], results: &[Vec<[Phase; 2]>], ops: usize, libfuse: &str) {
    let load = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!();
    println!(
        "Linux {}, libfuse {libfuse}, {ops} operations per phase, medians of {} rounds, load {}",
        kernel.trim(),
        results[0].len(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!();
    println!(
        "| operation | server | p50 (µs) | p99 (µs) | ops/s | FUSE requests/op | client CPU/op (µs) | server CPU/op (µs) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for (phase, operation) in ["lstat d/fN", "4 KiB pread"].iter().enumerate() {
        for (name, rounds) in names.iter().zip(results) {
            let of =
                |pick: fn(&Phase) -> f64| median(rounds.iter().map(|r| pick(&r[phase])).collect());
            println!(
                "| {operation} | {name} | {:.1} | {:.1} | {:.0} | {:.2} | {:.1} | {:.1} |",
                of(|p| p.p50_us),
                of(|p| p.p99_us),
                of(|p| p.ops_per_s),
                of(|p| p.requests_per_op),
                of(|p| p.client_cpu_us),
                of(|p| p.server_cpu_us),
            );
        }
    }
    println!();
    for (phase, operation) in ["lstat d/fN", "4 KiB pread"].iter().enumerate() {
        let p50 = |at: usize| median(results[at].iter().map(|r| r[phase].p50_us).collect());
        println!(
            "{operation}: fusefs's FUSE layer at {:.2}x the libfuse floor (p50; target ≤ 1.5x)",
            p50(1) / p50(0)
        );
    }
}
