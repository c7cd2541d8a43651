//! The floor under fusefs, part by part: what one `lstat` of `d/fN` and one 4 KiB read cost
//! through each layer, each server in a process of its own so that the CPU time of each side
//! is measured apart (the client's: this process, the kernel's FUSE path included; the FUSE
//! server's; the worker's):
//!
//! 1. a minimal server on libfuse's low-level API answering from memory
//!    (`benches/floor/ll_floor.c`, multi-threaded, the mount options fusefs promises): the
//!    least any FUSE filesystem pays on this kernel;
//! 2. fusefs's FUSE layer alone: the fuse-session loop and the `Fs` core over a worker that
//!    answers from memory at once, with no transport;
//! 3. (a) one round trip of 64 bytes over loopback TCP between two processes, one blocking
//!    thread each: the least any networked worker pays on this machine; (b) one HTTP/2-over-TLS
//!    round trip through the real client (lease-client) and the real worker server with an
//!    empty handler: a call to a volume the worker does not serve, refused before any volume
//!    sees it; (c) 3a with a server that reads until `EAGAIN` and waits in a bare
//!    `epoll_wait`, and (d) one that waits parked in a single-threaded tokio runtime, as a
//!    serving thread's reader does: (d) - (c) is what tokio's reactor adds to each wait;
//! 4. single worker calls through the real client, the calls an `lstat` and a read make
//!    (lookup, getattr, read): (a) to a worker whose volume is answered from memory by a
//!    stand-in ([`worker::Faults::stand_in`]), so transport and decoding only, and (b) to the
//!    reference worker; (b) - (a) is the reference worker's service time;
//! 5. the whole node path to the stand-in worker: what a perfect worker would give;
//! 6. the whole node path to the reference worker.
//!
//! Then the sum of the parts: row 5 against row 2 plus its calls at row 4a's round trips, and
//! row 6 against row 2 plus its calls at row 4b's (the calls per operation as counted in the
//! FUSE server). A full path well above its parts is hidden waste: queueing, copies, hand-offs.
//!
//! ```text
//! cargo bench -p fusefs --bench floor
//! ```
//!
//! Needs root (it mounts in a private mount namespace of its own; without the privilege it
//! prints SKIPPED and exits 0) and `/dev/fuse`. `benches/setup-libfuse.sh` installs libfuse's
//! headers and a C compiler when missing; the server is built into the run's temporary
//! directory. Every server counts the FUSE requests it reads and fusefs counts its worker calls
//! by kind, so each figure comes with its requests and calls per operation. The rounds
//! alternate the rows and report medians. Every child is ended by its PID and every mount lives
//! in the namespace.
//!
//! The fusefs servers run as the node runs a stage: on one serving thread
//! ([`fusefs::ServingThreads`]) with its worker connection. The client rows call from a
//! single-threaded runtime that also runs the connection, as a request's task on a serving
//! thread does.
//!
//! Environment: `BENCH_ROUNDS` (3), `BENCH_OPS` (operations per phase, 20000), `BENCH_ROWS` (the
//! rows to run, by number: `1,2,5`; all by default), `BENCH_PIN` (`split`: every server process
//! on the CPUs but the first, the client on the first; unset: where the scheduler puts them).
//! A value that is not one of these ends the run with status 2 before anything is mounted.
//! `LL_FLOOR_LOOP`, `LL_FLOOR_BUSY_BEFORE_NS` and `LL_FLOOR_BUSY_AFTER_NS` reach row 1's server
//! and change its loop, for experiments on placement (`benches/floor/ll_floor.c`).
//!
//! On a virtual machine a wake-up across CPUs can cost tens of microseconds (an idle virtual
//! CPU sleeps in the host) where one on the same CPU costs a few, so an unpinned run is
//! bimodal: a phase runs fast or slow depending on where the scheduler placed its threads.
//! `BENCH_PIN=split` fixes the placement: each FUSE request, and each call from the client
//! rows, crosses CPUs once each way; the hops inside the servers stay on their CPUs. Whether
//! an idle virtual CPU halts at once or polls first (the guest's cpuidle `haltpoll` setting)
//! decides what such a wake-up costs; the report's header names the setting.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)]

use std::cell::RefCell;
use std::fs::{self, File};
use std::future::Future;
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fusefs::{FileService, Fs, FsConfig, ServingThreads};
use lease_client::protocol::{ROOT_INO, ROOT_INODE_GENERATION, RequestId};
use lease_client::v1::reply::Result as ReplyResult;
use lease_client::v1::request::Op;
use lease_client::{Budgets, Client, HttpsTransport, Refusal, v1};
use worker::AccessMode;
use worker::testing::Pki;

#[path = "common/mod.rs"]
mod common;

use common::{bad_setting, env_or, idle_policy, loadavg, median, memory, runtime};

/// The files in `d`, as in `ll_floor.c`.
const FILES: u64 = 1000;
const DIR_INO: u64 = 2;
const FIRST_FILE: u64 = 1000;
const FILE_SIZE: usize = 4096;
static ZEROS: [u8; FILE_SIZE] = [0; FILE_SIZE];
const VOLUME: &str = "floor";
const TOKEN: &str = "floor-bench-token";
const SERVE_FUSEFS: &str = "--serve-fusefs";
const SERVE_WORKER: &str = "--serve-worker";
const SERVE_ECHO: &str = "--serve-echo";
const ECHO_BYTES: usize = 64;

/// The tree of `ll_floor.c`: one entry.
fn memory_entry(ino: u64) -> Option<v1::Entry> {
    let directory = ino == ROOT_INO || ino == DIR_INO;
    if !directory && !(FIRST_FILE..FIRST_FILE + FILES).contains(&ino) {
        return None;
    }
    Some(memory::entry(ino, directory, FILE_SIZE as u64))
}

/// What a worker answering from memory answers: `None` for `ENOENT`.
fn memory_answer(op: &Op) -> Option<ReplyResult> {
    let ino_of = |file: Option<v1::FileId>| file.map_or(0, |f| f.ino);
    match op {
        Op::Lookup(r) => match (ino_of(r.parent), r.name.as_slice()) {
            (ROOT_INO, b"d") => memory_entry(DIR_INO),
            (DIR_INO, name) => std::str::from_utf8(name)
                .ok()
                .and_then(|n| n.strip_prefix('f')?.parse::<u64>().ok())
                .and_then(|n| memory_entry(FIRST_FILE + n)),
            _ => None,
        }
        .map(ReplyResult::Lookup),
        Op::Getattr(r) => memory_entry(ino_of(r.file)).map(ReplyResult::Getattr),
        Op::Open(_) => Some(ReplyResult::Open(v1::OpenReply {
            handle: 7,
            handle_lease_ms: 0,
        })),
        Op::Read(r) => {
            let start = usize::try_from(r.offset)
                .unwrap_or(FILE_SIZE)
                .min(FILE_SIZE);
            let end = start.saturating_add(r.size as usize).min(FILE_SIZE);
            Some(ReplyResult::Read(v1::ReadReply {
                data: Bytes::from_static(&ZEROS[start..end]),
            }))
        }
        Op::RenewHandles(_) => Some(ReplyResult::RenewHandles(v1::RenewHandlesReply::default())),
        Op::Release(_) => Some(ReplyResult::Release(v1::Empty {})),
        Op::Flush(_) => Some(ReplyResult::Flush(v1::Empty {})),
        _ => None,
    }
}

/// The worker of row 2: [`memory_answer`], at once, in the FUSE server's process.
struct Memory;

impl FileService for Memory {
    fn call(
        &self,
        _request_id: Option<RequestId>,
        _until: Option<Instant>,
        op: Op,
    ) -> impl Future<Output = Result<ReplyResult, lease_client::Error>> + Send {
        std::future::ready(memory_answer(&op).ok_or(lease_client::Error::Refused {
            volume_id: VOLUME.into(),
            op: "memory",
            refusal: Refusal::Errno(libc::ENOENT),
        }))
    }
}

/// Worker calls by kind: lookups, getattrs, reads, the rest.
#[derive(Debug, Default)]
struct Calls([AtomicU64; 4]);

const CALL_KINDS: [&str; 4] = ["lookup", "getattr", "read", "other"];

/// A [`FileService`] that counts its calls by kind.
struct Counted<S> {
    inner: S,
    calls: Arc<Calls>,
}

impl<S: FileService> FileService for Counted<S> {
    fn call(
        &self,
        request_id: Option<RequestId>,
        until: Option<Instant>,
        op: Op,
    ) -> impl Future<Output = Result<ReplyResult, lease_client::Error>> + Send {
        let kind = match op {
            Op::Lookup(_) => 0,
            Op::Getattr(_) => 1,
            Op::Read(_) => 2,
            _ => 3,
        };
        self.calls.0[kind].fetch_add(1, Ordering::Relaxed);
        self.inner.call(request_id, until, op)
    }
}

/// What a worker process leaves in its directory for its clients: its PKI and its endpoint
/// (written last).
struct WorkerFiles {
    endpoint: String,
    pki: Pki,
}

impl WorkerFiles {
    const PEMS: [&str; 5] = [
        "ca.pem",
        "server.pem",
        "server.key",
        "client.pem",
        "client.key",
    ];

    fn write(&self, dir: &Path) {
        let pki = &self.pki;
        let pems = [
            &pki.ca_pem,
            &pki.server_pem,
            &pki.server_key,
            &pki.client_pem,
            &pki.client_key,
        ];
        for (name, pem) in WorkerFiles::PEMS.iter().zip(pems) {
            fs::write(dir.join(name), pem).unwrap();
        }
        fs::write(dir.join("endpoint.new"), &self.endpoint).unwrap();
        fs::rename(dir.join("endpoint.new"), dir.join("endpoint")).unwrap();
    }

    fn read(dir: &Path) -> WorkerFiles {
        let [ca_pem, server_pem, server_key, client_pem, client_key] =
            WorkerFiles::PEMS.map(|name| fs::read_to_string(dir.join(name)).unwrap());
        WorkerFiles {
            endpoint: fs::read_to_string(dir.join("endpoint")).unwrap(),
            pki: Pki {
                ca_pem,
                server_pem,
                server_key,
                client_pem,
                client_key,
            },
        }
    }

    /// A client of `volume` on this worker whose connections run on `runtime`.
    fn client_on(&self, volume: &str, runtime: tokio::runtime::Handle) -> Client<HttpsTransport> {
        let spec = worker::testing::volume(volume, AccessMode::Rwx);
        let budgets = Budgets::default();
        worker::testing::client_on(&self.pki, &spec, &self.endpoint, TOKEN, budgets, runtime)
            .unwrap()
    }
}

/// Answers each line on stdin with `counts()` as one line on stdout, until stdin closes.
fn answer_counts(counts: impl Fn() -> [u64; 5]) {
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
        let counts = counts().map(|c| c.to_string()).join(" ");
        writeln!(out, "{counts}").unwrap();
        out.flush().unwrap();
    }
}

/// A FUSE server process of rows 2, 5 and 6: fusefs over [`Memory`] (`worker` is `None`) or
/// over a client of the worker whose files are in `worker`, mounted at `mount`, until stdin
/// closes. Over a worker it first plants `ll_floor.c`'s tree through its own mount.
fn serve_fusefs(mount: &Path, worker: Option<&Path>) {
    let serving = ServingThreads::new("fuse", 1).unwrap();
    let runtime = serving.next();
    let calls = Arc::new(Calls::default());
    match worker {
        None => serve_mount(&runtime, Memory, &calls, mount),
        Some(dir) => {
            let client = WorkerFiles::read(dir).client_on(VOLUME, runtime.clone());
            serve_mount(&runtime, client, &calls, mount);
        }
    }
}

/// Serves `service` at `mount` on the serving thread whose runtime is `runtime`, and answers
/// the counts until stdin closes.
fn serve_mount<S: FileService>(
    runtime: &tokio::runtime::Handle,
    service: S,
    calls: &Arc<Calls>,
    mount: &Path,
) {
    let service = Counted {
        inner: service,
        calls: Arc::clone(calls),
    };
    let fs = Arc::new(Fs::new(service, FsConfig::default()).unwrap());
    // The serving thread drives the runtime; this thread only waits.
    let mut mounted = runtime
        .block_on(fusefs::mount_on(runtime, fs, VOLUME, mount))
        .unwrap();
    let dir = mount.join("d");
    if fs::symlink_metadata(&dir).is_err() {
        fs::create_dir(&dir).unwrap();
        for n in 0..FILES {
            fs::write(dir.join(format!("f{n}")), ZEROS).unwrap();
        }
    }
    answer_counts(|| {
        let [lookups, getattrs, reads, others] =
            calls.0.each_ref().map(|c| c.load(Ordering::Relaxed));
        [
            mounted.counters().requests,
            lookups,
            getattrs,
            reads,
            others,
        ]
    });
    runtime
        .block_on(mounted.unmount(Duration::from_secs(10)))
        .unwrap();
}

/// A worker process of rows 3 to 6: a leader serving the volume from `dir/state`, its volume
/// answered by a stand-in from memory when `stand_in`, until stdin closes.
fn serve_worker(dir: &Path, stand_in: bool) {
    let runtime = runtime(2);
    let pki = Pki::generate(VOLUME).unwrap();
    let server = runtime
        .block_on(worker::testing::leader(
            &pki,
            &dir.join("state"),
            &[worker::testing::volume(VOLUME, AccessMode::Rwx)],
            TOKEN,
            worker::Timings::default(),
        ))
        .unwrap();
    if stand_in {
        server.faults().stand_in(Some(Arc::new(|op: &Op| {
            Some(memory_answer(op).unwrap_or_else(|| {
                ReplyResult::Error(v1::Error {
                    kind: v1::ErrorKind::Errno.into(),
                    errno: libc::ENOENT,
                    ..v1::Error::default()
                })
            }))
        })));
    }
    WorkerFiles {
        endpoint: server.local_addr().to_string(),
        pki,
    }
    .write(dir);
    answer_counts(|| [0; 5]);
    runtime.block_on(server.stop());
}

/// How an echo server (rows 3a, 3c, 3d) waits for the next message.
#[derive(Clone, Copy)]
enum EchoWait {
    /// In a blocking `read` (3a).
    Blocking,
    /// Reading until `EAGAIN`, then in a bare `epoll_wait` (3c): how libfuse's one-thread
    /// `epoll` loop in `ll_floor.c` and fuse-session's reader read.
    Epoll,
    /// Reading until `EAGAIN`, then parked in a single-threaded tokio runtime until the
    /// reactor reports the socket readable (3d): how fuse-session's reader waits on a serving
    /// thread.
    Reactor,
}

impl EchoWait {
    const ALL: [EchoWait; 3] = [EchoWait::Blocking, EchoWait::Epoll, EchoWait::Reactor];

    fn arg(self) -> &'static str {
        match self {
            EchoWait::Blocking => "blocking",
            EchoWait::Epoll => "epoll",
            EchoWait::Reactor => "reactor",
        }
    }
}

/// The server process of rows 3a, 3c and 3d: echoes `ECHO_BYTES` at a time on one loopback TCP
/// connection, on one thread that waits as `wait` says, after writing its port to
/// `dir/endpoint`; ends when stdin closes.
fn serve_echo(dir: &Path, wait: &str) {
    let wait = EchoWait::ALL
        .into_iter()
        .find(|w| w.arg() == wait)
        .unwrap_or_else(|| panic!("no echo server waits {wait:?}"));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    fs::write(dir.join("endpoint.new"), &endpoint).unwrap();
    fs::rename(dir.join("endpoint.new"), dir.join("endpoint")).unwrap();
    std::thread::spawn(move || {
        let Ok((stream, _)) = listener.accept() else {
            return;
        };
        stream.set_nodelay(true).unwrap();
        match wait {
            EchoWait::Blocking => echo_blocking(stream),
            EchoWait::Epoll => echo_epoll(stream),
            EchoWait::Reactor => echo_on_reactor(stream),
        }
    });
    answer_counts(|| [0; 5]);
}

fn echo_blocking(mut stream: std::net::TcpStream) {
    use std::io::Read as _;
    let mut message = [0u8; ECHO_BYTES];
    while stream.read_exact(&mut message).is_ok() && stream.write_all(&message).is_ok() {}
}

/// Reads what a non-blocking socket has with `read` and echoes each whole message with
/// `write`: `Ok(true)` to read again, `Ok(false)` once a read would block, an error when the
/// connection ends.
fn echo_available(
    read: impl FnOnce(&mut [u8]) -> std::io::Result<usize>,
    write: impl FnOnce(&[u8]) -> std::io::Result<usize>,
    message: &mut [u8; ECHO_BYTES],
    have: &mut usize,
) -> std::io::Result<bool> {
    match read(&mut message[*have..]) {
        Ok(0) => Err(std::io::ErrorKind::UnexpectedEof.into()),
        Ok(n) => {
            *have += n;
            if *have == ECHO_BYTES {
                // 64 bytes fit an empty loopback socket's buffer: never `EAGAIN` or short.
                if write(message)? != ECHO_BYTES {
                    return Err(std::io::ErrorKind::WriteZero.into());
                }
                *have = 0;
            }
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
        Err(e) => Err(e),
    }
}

fn echo_epoll(stream: std::net::TcpStream) {
    use rustix::event::epoll;
    use std::io::Read as _;
    stream.set_nonblocking(true).unwrap();
    let poller = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
    epoll::add(
        &poller,
        &stream,
        epoll::EventData::new_u64(0),
        epoll::EventFlags::IN,
    )
    .unwrap();
    let mut events = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 1];
    let (mut message, mut have) = ([0u8; ECHO_BYTES], 0);
    loop {
        let read = |buf: &mut [u8]| (&stream).read(buf);
        let write = |buf: &[u8]| (&stream).write(buf);
        match echo_available(read, write, &mut message, &mut have) {
            Ok(true) => {}
            Ok(false) if epoll::wait(&poller, &mut events, None).is_ok() => {}
            Ok(false) | Err(_) => return,
        }
    }
}

/// As fuse-session's reader waits: a read that would block clears the socket's readiness, and
/// the task parks until the runtime's reactor reports it again.
fn echo_on_reactor(stream: std::net::TcpStream) {
    stream.set_nonblocking(true).unwrap();
    // Built as a serving thread's runtime is (`fusefs::ServingThreads`).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let stream = tokio::net::TcpStream::from_std(stream).unwrap();
        let (mut message, mut have) = ([0u8; ECHO_BYTES], 0);
        loop {
            let read = |buf: &mut [u8]| stream.try_read(buf);
            let write = |buf: &[u8]| stream.try_write(buf);
            match echo_available(read, write, &mut message, &mut have) {
                Ok(true) => {}
                Ok(false) if stream.readable().await.is_ok() => {}
                Ok(false) | Err(_) => return,
            }
        }
    });
}

/// The phase of rows 3a, 3c and 3d: `ECHO_BYTES` out and back.
fn echo_round(stream: &mut std::net::TcpStream, sides: Sides<'_>, ops: usize) -> Vec<Phase> {
    use std::io::Read as _;
    let mut message = [7u8; ECHO_BYTES];
    let phase = measure(sides, ops, |_| {
        stream.write_all(&message).unwrap();
        stream.read_exact(&mut message).unwrap();
    });
    vec![phase]
}

/// One process under test.
struct Server {
    name: &'static str,
    child: Child,
    /// Where libfuse's server counts its requests; `None` for the servers of this binary,
    /// which answer on their stdin and stdout.
    counter: Option<PathBuf>,
    stdin: RefCell<Option<ChildStdin>>,
    stdout: RefCell<Option<BufReader<ChildStdout>>>,
}

/// What a server has counted: FUSE requests read and worker calls by kind.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    requests: u64,
    calls: [u64; 4],
}

impl Server {
    /// Starts `command` and waits until `ready` holds.
    fn start(
        name: &'static str,
        mut command: Command,
        counter: Option<PathBuf>,
        ready: impl Fn() -> bool,
    ) -> Server {
        if let Some(counter) = &counter {
            File::create(counter).unwrap().set_len(8).unwrap();
            command.arg(counter);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut server = Server {
            name,
            stdin: RefCell::new(child.stdin.take()),
            stdout: RefCell::new(child.stdout.take().map(BufReader::new)),
            child,
            counter,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready() {
            assert!(Instant::now() < deadline, "{name} did not start");
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("{name} exited: {status}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// What the server has counted so far.
    fn counts(&self) -> Counts {
        if let Some(counter) = &self.counter {
            let mut bytes = [0u8; 8];
            File::open(counter)
                .unwrap()
                .read_exact_at(&mut bytes, 0)
                .unwrap();
            return Counts {
                requests: u64::from_le_bytes(bytes),
                calls: [0; 4],
            };
        }
        let mut stdin = self.stdin.borrow_mut();
        let stdin = stdin.as_mut().unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout
            .borrow_mut()
            .as_mut()
            .unwrap()
            .read_line(&mut line)
            .unwrap();
        let numbers: Vec<u64> = line
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        Counts {
            requests: numbers[0],
            calls: [numbers[1], numbers[2], numbers[3], numbers[4]],
        }
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

    /// Ends the server: its stdin closes (a server of this binary unmounts or stops its worker
    /// and exits), libfuse's gets SIGTERM (it unmounts and exits); killed by PID if it has not
    /// exited in 10 s.
    fn stop(mut self) {
        drop(self.stdin.take());
        if self.counter.is_some() {
            let pid = rustix::process::Pid::from_child(&self.child);
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
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

/// Pins the calling thread (and the threads and processes it starts later) to `cpus`.
fn pin(cpus: impl IntoIterator<Item = usize>) {
    let mut set = rustix::thread::CpuSet::new();
    for cpu in cpus {
        set.set(cpu);
    }
    rustix::thread::sched_setaffinity(None, &set).unwrap();
}

/// CPU time of this process (every thread: the client's runtime, and the kernel's FUSE path
/// in the measuring thread's system calls).
fn process_cpu() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// One phase's figures for one row.
#[derive(Clone, Copy, Debug, Default)]
struct Phase {
    p50_us: f64,
    p99_us: f64,
    ops_per_s: f64,
    requests_per_op: f64,
    calls_per_op: [f64; 4],
    client_cpu_us: f64,
    fuse_cpu_us: f64,
    worker_cpu_us: f64,
}

/// The processes of a row besides this one: its FUSE server and its worker.
#[derive(Clone, Copy)]
struct Sides<'a> {
    fuse: Option<&'a Server>,
    worker: Option<&'a Server>,
}

fn measure(sides: Sides<'_>, ops: usize, mut op: impl FnMut(usize)) -> Phase {
    // Warm up, then measure.
    for i in 0..ops / 20 {
        op(i);
    }
    let cpu = |server: Option<&Server>| server.map_or(Duration::ZERO, Server::cpu);
    let counts = || sides.fuse.map(Server::counts).unwrap_or_default();
    let before = counts();
    let (fuse_cpu, worker_cpu) = (cpu(sides.fuse), cpu(sides.worker));
    let client_cpu = process_cpu();
    let mut latencies = Vec::with_capacity(ops);
    let started = Instant::now();
    for i in 0..ops {
        let t = Instant::now();
        op(i);
        latencies.push(t.elapsed());
    }
    let elapsed = started.elapsed();
    let client_cpu = process_cpu() - client_cpu;
    let (fuse_cpu, worker_cpu) = (cpu(sides.fuse) - fuse_cpu, cpu(sides.worker) - worker_cpu);
    let after = counts();
    latencies.sort_unstable();
    let at = |q: f64| latencies[((ops as f64 * q) as usize).min(ops - 1)].as_secs_f64() * 1e6;
    let per_op = |d: Duration| d.as_secs_f64() * 1e6 / ops as f64;
    let per_op_count = |after: u64, before: u64| (after - before) as f64 / ops as f64;
    Phase {
        p50_us: at(0.5),
        p99_us: at(0.99),
        ops_per_s: ops as f64 / elapsed.as_secs_f64(),
        requests_per_op: per_op_count(after.requests, before.requests),
        calls_per_op: std::array::from_fn(|k| per_op_count(after.calls[k], before.calls[k])),
        client_cpu_us: per_op(client_cpu),
        fuse_cpu_us: per_op(fuse_cpu),
        worker_cpu_us: per_op(worker_cpu),
    }
}

/// The phases of a FUSE row: an `lstat` of `d/fN` and a 4 KiB `pread` of `d/f0`.
const FUSE_PHASES: [&str; 2] = ["lstat d/fN", "4 KiB pread"];

fn fuse_round(mount: &Path, sides: Sides<'_>, ops: usize) -> Vec<Phase> {
    let names: Vec<PathBuf> = (0..FILES).map(|n| mount.join(format!("d/f{n}"))).collect();
    let stat = measure(sides, ops, |i| {
        let meta = fs::symlink_metadata(&names[i % names.len()]).unwrap();
        assert_eq!(meta.len(), FILE_SIZE as u64);
    });
    let file = File::open(&names[0]).unwrap();
    let mut buf = vec![0u8; FILE_SIZE];
    let read = measure(sides, ops, |_| {
        assert_eq!(file.read_at(&mut buf, 0).unwrap(), FILE_SIZE);
    });
    vec![stat, read]
}

/// The phases of a worker-call row.
const CALL_PHASES: [&str; 3] = ["lookup fN", "getattr fN", "read 4 KiB"];

/// A client of the worker, through the very path fusefs calls ([`FileService`]).
struct Caller<'a> {
    runtime: &'a tokio::runtime::Runtime,
    client: Client<HttpsTransport>,
    next_id: u128,
}

impl Caller<'_> {
    fn call(&mut self, op: Op) -> Result<ReplyResult, lease_client::Error> {
        self.next_id += 1;
        let id = RequestId(self.next_id.to_le_bytes());
        self.runtime
            .block_on(FileService::call(&self.client, Some(id), None, op))
    }

    fn entry(&mut self, parent: v1::FileId, name: &str) -> v1::FileId {
        let op = Op::Lookup(v1::LookupRequest {
            parent: Some(parent),
            name: name.as_bytes().to_vec(),
        });
        match self.call(op) {
            Ok(ReplyResult::Lookup(v1::Entry {
                file: Some(file), ..
            })) => file,
            other => panic!("lookup {name}: {other:?}"),
        }
    }
}

fn call_round(caller: &mut Caller<'_>, sides: Sides<'_>, ops: usize) -> Vec<Phase> {
    let root = v1::FileId {
        ino: ROOT_INO,
        inode_generation: ROOT_INODE_GENERATION,
    };
    let dir = caller.entry(root, "d");
    let names: Vec<Vec<u8>> = (0..FILES).map(|n| format!("f{n}").into_bytes()).collect();
    let files: Vec<v1::FileId> = (0..FILES)
        .map(|n| caller.entry(dir, &format!("f{n}")))
        .collect();
    let lookup = measure(sides, ops, |i| {
        let op = Op::Lookup(v1::LookupRequest {
            parent: Some(dir),
            name: names[i % names.len()].clone(),
        });
        assert!(matches!(caller.call(op), Ok(ReplyResult::Lookup(_))));
    });
    let getattr = measure(sides, ops, |i| {
        let op = Op::Getattr(v1::GetattrRequest {
            file: Some(files[i % files.len()]),
            handle: None,
        });
        assert!(matches!(caller.call(op), Ok(ReplyResult::Getattr(_))));
    });
    let handle = match caller.call(Op::Open(v1::OpenRequest {
        file: Some(files[0]),
        flags: libc::O_RDONLY as u32,
    })) {
        Ok(ReplyResult::Open(open)) => open.handle,
        other => panic!("open f0: {other:?}"),
    };
    let read = measure(sides, ops, |_| {
        let op = Op::Read(v1::ReadRequest {
            file: Some(files[0]),
            handle,
            offset: 0,
            size: FILE_SIZE as u32,
        });
        match caller.call(op) {
            Ok(ReplyResult::Read(read)) => assert_eq!(read.data.len(), FILE_SIZE),
            other => panic!("read f0: {other:?}"),
        }
    });
    let _ = caller.call(Op::Release(v1::ReleaseRequest {
        file: Some(files[0]),
        handle,
        ..v1::ReleaseRequest::default()
    }));
    vec![lookup, getattr, read]
}

/// Row 3's phase: a call to a volume the worker does not serve.
fn refused_round(caller: &mut Caller<'_>, sides: Sides<'_>, ops: usize) -> Vec<Phase> {
    let phase = measure(sides, ops, |_| {
        let op = Op::Getattr(v1::GetattrRequest {
            file: Some(v1::FileId {
                ino: ROOT_INO,
                inode_generation: ROOT_INODE_GENERATION,
            }),
            handle: None,
        });
        match caller.call(op) {
            Err(lease_client::Error::Refused {
                refusal: Refusal::UnknownVolume,
                ..
            }) => {}
            other => panic!("a call to no volume: {other:?}"),
        }
    });
    vec![phase]
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

/// The rows of the table, in the order they run in each round.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Row {
    Libfuse,
    FuseLayer,
    Echo,
    Refused,
    EchoEpoll,
    EchoReactor,
    CallsStandIn,
    CallsReference,
    NodeStandIn,
    NodeReference,
}

impl Row {
    const ALL: [Row; 10] = [
        Row::Libfuse,
        Row::FuseLayer,
        Row::Echo,
        Row::Refused,
        Row::EchoEpoll,
        Row::EchoReactor,
        Row::CallsStandIn,
        Row::CallsReference,
        Row::NodeStandIn,
        Row::NodeReference,
    ];

    fn name(self) -> &'static str {
        match self {
            Row::Libfuse => "(1) libfuse low-level, from memory",
            Row::FuseLayer => "(2) fusefs FUSE layer alone (session + Fs, memory worker)",
            Row::Echo => "(3a) loopback TCP, 64 B each way, blocking, two processes",
            Row::Refused => "(3b) lease-client → worker, empty handler (no such volume)",
            Row::EchoEpoll => "(3c) as 3a, the server reads to EAGAIN and waits in epoll_wait",
            Row::EchoReactor => "(3d) as 3c, the server parks in a current-thread tokio runtime",
            Row::CallsStandIn => "(4a) lease-client → worker, stand-in from memory",
            Row::CallsReference => "(4b) lease-client → reference worker",
            Row::NodeStandIn => "(5) fusefs → lease-client → worker, stand-in from memory",
            Row::NodeReference => "(6) fusefs → lease-client → reference worker",
        }
    }

    fn number(self) -> &'static str {
        let name = self.name();
        &name[1..name.find(')').unwrap_or(1)]
    }

    fn phases(self) -> &'static [&'static str] {
        match self {
            Row::Libfuse | Row::FuseLayer | Row::NodeStandIn | Row::NodeReference => &FUSE_PHASES,
            Row::Echo | Row::EchoEpoll | Row::EchoReactor => &["round trip"],
            Row::Refused => &["call refused"],
            Row::CallsStandIn | Row::CallsReference => &CALL_PHASES,
        }
    }

    /// Whether the row goes through a FUSE server (else the client calls the network itself).
    fn has_fuse(self) -> bool {
        !matches!(
            self,
            Row::Echo
                | Row::EchoEpoll
                | Row::EchoReactor
                | Row::Refused
                | Row::CallsStandIn
                | Row::CallsReference
        )
    }

    /// Whether the row reaches a process over the network.
    fn has_worker(self) -> bool {
        !matches!(self, Row::Libfuse | Row::FuseLayer)
    }

    /// This row's rounds in `results` (which follows [`Row::ALL`]).
    fn of(self, results: &[Vec<Vec<Phase>>]) -> &[Vec<Phase>] {
        &results[self as usize]
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match &args[1..] {
        [mode, mount] if mode == SERVE_FUSEFS => return serve_fusefs(Path::new(mount), None),
        [mode, mount, worker] if mode == SERVE_FUSEFS => {
            return serve_fusefs(Path::new(mount), Some(Path::new(worker)));
        }
        [mode, dir, kind] if mode == SERVE_WORKER => {
            return serve_worker(Path::new(dir), kind == "stand-in");
        }
        [mode, dir, wait] if mode == SERVE_ECHO => return serve_echo(Path::new(dir), wait),
        _ => {}
    }
    if !common::private_namespace("fusefs floor benchmark") {
        return;
    }
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    let ops: usize = env_or("BENCH_OPS", 20_000);
    let chosen = std::env::var("BENCH_ROWS").unwrap_or_default();
    let chosen: Vec<&str> = chosen
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    let numbers: Vec<&str> = Row::ALL.iter().map(|row| row.number()).collect();
    if let Some(unknown) = chosen.iter().find(|n| !numbers.contains(n)) {
        let expected = format!("row numbers among {}", numbers.join(", "));
        bad_setting("BENCH_ROWS", unknown, &expected);
    }
    let pinned = match std::env::var("BENCH_PIN").unwrap_or_default().as_str() {
        "" => false,
        "split" => true,
        other => bad_setting("BENCH_PIN", other, "split, or unset"),
    };
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
    let this = std::env::current_exe().unwrap();
    let mount_point = |name: &str| {
        let mount = work.path().join(name);
        fs::create_dir_all(&mount).unwrap();
        mount
    };
    let mounted = |mount: &Path| {
        let last = mount.join(format!("d/f{}", FILES - 1));
        move || fs::symlink_metadata(&last).is_ok()
    };
    let start_worker = |name: &'static str, kind: &str| {
        let dir = work.path().join(kind);
        fs::create_dir_all(&dir).unwrap();
        let mut command = Command::new(&this);
        command.arg(SERVE_WORKER).arg(&dir).arg(kind);
        let endpoint = dir.join("endpoint");
        (
            Server::start(name, command, None, move || endpoint.exists()),
            dir,
        )
    };
    let start_fusefs = |name: &'static str, mount: &Path, worker: Option<&Path>| {
        let mut command = Command::new(&this);
        command.arg(SERVE_FUSEFS).arg(mount).args(worker);
        Server::start(name, command, None, mounted(mount))
    };

    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let split = pinned && cpus > 1;
    if split {
        pin(1..cpus);
    }
    let libfuse_mount = mount_point("libfuse");
    let mut libfuse_command = Command::new(&floor);
    libfuse_command.arg(&libfuse_mount);
    let libfuse = Server::start(
        "libfuse",
        libfuse_command,
        Some(work.path().join("libfuse.count")),
        mounted(&libfuse_mount),
    );
    let alone_mount = mount_point("alone");
    let alone = start_fusefs("fusefs alone", &alone_mount, None);
    let (stand_in, stand_in_dir) = start_worker("stand-in worker", "stand-in");
    let (reference, reference_dir) = start_worker("reference worker", "reference");
    let start_echo = |name: &'static str, wait: EchoWait| {
        let dir = work.path().join(format!("echo-{}", wait.arg()));
        fs::create_dir_all(&dir).unwrap();
        let endpoint = dir.join("endpoint");
        let mut command = Command::new(&this);
        command.arg(SERVE_ECHO).arg(&dir).arg(wait.arg());
        let server = Server::start(name, command, None, || endpoint.exists());
        (server, endpoint)
    };
    let echo = start_echo("echo, blocking", EchoWait::Blocking);
    let echo_epoll = start_echo("echo, epoll_wait", EchoWait::Epoll);
    let echo_reactor = start_echo("echo, tokio's reactor", EchoWait::Reactor);
    let node_stand_in_mount = mount_point("node-stand-in");
    let node_stand_in = start_fusefs(
        "fusefs over the stand-in",
        &node_stand_in_mount,
        Some(&stand_in_dir),
    );
    let node_reference_mount = mount_point("node-reference");
    let node_reference = start_fusefs(
        "fusefs over the reference worker",
        &node_reference_mount,
        Some(&reference_dir),
    );

    if split {
        pin([0]);
    }
    // Calls and their connections take turns on this thread, as on a serving thread.
    let client_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let caller = |dir: &Path, volume: &str| Caller {
        runtime: &client_runtime,
        client: WorkerFiles::read(dir).client_on(volume, client_runtime.handle().clone()),
        next_id: u128::from(std::process::id()) << 64,
    };
    let connect_echo = |endpoint: &Path| {
        let stream = std::net::TcpStream::connect(fs::read_to_string(endpoint).unwrap()).unwrap();
        stream.set_nodelay(true).unwrap();
        stream
    };
    let mut echo_streams = [&echo, &echo_epoll, &echo_reactor].map(|(_, e)| connect_echo(e));
    let mut to_no_volume = caller(&stand_in_dir, "no-such-volume");
    let mut to_stand_in = caller(&stand_in_dir, VOLUME);
    let mut to_reference = caller(&reference_dir, VOLUME);

    let sides = |fuse, worker| Sides { fuse, worker };
    let mut results: Vec<Vec<Vec<Phase>>> = vec![Vec::new(); Row::ALL.len()];
    for r in 0..rounds {
        for (at, row) in Row::ALL.into_iter().enumerate() {
            if !chosen.is_empty() && !chosen.contains(&row.number()) {
                continue;
            }
            let phases = match row {
                Row::Libfuse => fuse_round(&libfuse_mount, sides(Some(&libfuse), None), ops),
                Row::FuseLayer => fuse_round(&alone_mount, sides(Some(&alone), None), ops),
                Row::Echo => echo_round(&mut echo_streams[0], sides(None, Some(&echo.0)), ops),
                Row::EchoEpoll => {
                    echo_round(&mut echo_streams[1], sides(None, Some(&echo_epoll.0)), ops)
                }
                Row::EchoReactor => echo_round(
                    &mut echo_streams[2],
                    sides(None, Some(&echo_reactor.0)),
                    ops,
                ),
                Row::Refused => refused_round(&mut to_no_volume, sides(None, Some(&stand_in)), ops),
                Row::CallsStandIn => {
                    call_round(&mut to_stand_in, sides(None, Some(&stand_in)), ops)
                }
                Row::CallsReference => {
                    call_round(&mut to_reference, sides(None, Some(&reference)), ops)
                }
                Row::NodeStandIn => fuse_round(
                    &node_stand_in_mount,
                    sides(Some(&node_stand_in), Some(&stand_in)),
                    ops,
                ),
                Row::NodeReference => fuse_round(
                    &node_reference_mount,
                    sides(Some(&node_reference), Some(&reference)),
                    ops,
                ),
            };
            eprintln!("round {} {}: {phases:.1?}", r + 1, row.name());
            results[at].push(phases);
        }
    }
    drop((to_no_volume, to_stand_in, to_reference, echo_streams));
    for server in [
        echo.0,
        echo_epoll.0,
        echo_reactor.0,
        node_reference,
        node_stand_in,
        alone,
        libfuse,
        reference,
        stand_in,
    ] {
        server.stop();
    }
    let placement = if split {
        format!("client on CPU 0, servers on CPUs 1-{}", cpus - 1)
    } else {
        format!("unpinned, CPUs allowed: {cpus}")
    };
    report(&results, ops, &libfuse_version, &placement);
}

/// The median over the rounds of one figure of one phase of one row.
fn figure(
    results: &[Vec<Vec<Phase>>],
    row: Row,
    phase: usize,
    pick: impl Fn(&Phase) -> f64,
) -> f64 {
    median(row.of(results).iter().map(|r| pick(&r[phase])).collect())
}

fn report(results: &[Vec<Vec<Phase>>], ops: usize, libfuse: &str, placement: &str) {
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!();
    println!(
        "Linux {}, libfuse {libfuse}, {ops} operations per phase, medians of {} rounds, {placement}, {}, load {}",
        kernel.trim(),
        results.iter().map(Vec::len).max().unwrap_or(0),
        idle_policy(),
        loadavg(),
    );
    println!();
    println!(
        "| operation | path | p50 (µs) | p99 (µs) | ops/s | FUSE requests/op | worker calls/op | client CPU/op (µs) | FUSE server CPU/op (µs) | worker CPU/op (µs) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let ran = |row: Row| !row.of(results).is_empty();
    for row in Row::ALL.into_iter().filter(|&row| ran(row)) {
        for (phase, operation) in row.phases().iter().enumerate() {
            let of = |pick: fn(&Phase) -> f64| figure(results, row, phase, pick);
            let calls = match row {
                Row::NodeStandIn | Row::NodeReference => {
                    format!("{:.2}", of(|p| p.calls_per_op.iter().sum()))
                }
                Row::Libfuse | Row::FuseLayer => "–".to_owned(),
                Row::Echo | Row::EchoEpoll | Row::EchoReactor => "0".to_owned(),
                _ => "1".to_owned(),
            };
            let shown = |value: f64, digits: usize, present: bool| {
                if present {
                    format!("{value:.digits$}")
                } else {
                    "–".to_owned()
                }
            };
            let fuse = shown(of(|p| p.requests_per_op), 2, row.has_fuse());
            println!(
                "| {operation} | {} | {:.1} | {:.1} | {:.0} | {fuse} | {calls} | {:.1} | {} | {} |",
                row.name(),
                of(|p| p.p50_us),
                of(|p| p.p99_us),
                of(|p| p.ops_per_s),
                of(|p| p.client_cpu_us),
                shown(of(|p| p.fuse_cpu_us), 1, row.has_fuse()),
                shown(of(|p| p.worker_cpu_us), 1, row.has_worker()),
            );
        }
    }
    if Row::ALL[2..8].iter().any(|&row| ran(row)) {
        println!();
        println!(
            "Worker calls/op of rows 3 and 4 are by construction (one call, or none, per operation), not counted; rows 5 and 6 count theirs in the FUSE server."
        );
    }
    println!();
    let p50 = |row: Row, phase: usize| figure(results, row, phase, |p| p.p50_us);
    // Each figure below needs the rows it names; a line with a row not run is left out.
    for (phase, operation) in FUSE_PHASES
        .iter()
        .enumerate()
        .filter(|_| ran(Row::Libfuse) && ran(Row::FuseLayer))
    {
        println!(
            "{operation}: fusefs's FUSE layer at {:.2}x the libfuse floor (p50; target ≤ 1.5x)",
            p50(Row::FuseLayer, phase) / p50(Row::Libfuse, phase)
        );
    }
    if ran(Row::EchoEpoll) && ran(Row::EchoReactor) {
        let cpu = |row: Row| figure(results, row, 0, |p| p.worker_cpu_us);
        println!(
            "a wait in tokio's reactor against a bare epoll_wait (3d - 3c): {:+.1} µs of the server's CPU and {:+.1} µs of round trip (p50) per message",
            cpu(Row::EchoReactor) - cpu(Row::EchoEpoll),
            p50(Row::EchoReactor, 0) - p50(Row::EchoEpoll, 0),
        );
    }
    for (phase, name) in CALL_PHASES
        .iter()
        .enumerate()
        .filter(|_| ran(Row::CallsStandIn) && ran(Row::CallsReference))
    {
        println!(
            "{name}: the reference worker's service time {:.1} µs (4b - 4a, p50), the transport's round trip {:.1} µs (4a)",
            p50(Row::CallsReference, phase) - p50(Row::CallsStandIn, phase),
            p50(Row::CallsStandIn, phase),
        );
    }
    // The sum of the parts: the FUSE layer alone, and each worker call the full path made at
    // the round trip of its kind (calls of other kinds at a getattr's).
    for (node, calls) in [
        (Row::NodeStandIn, Row::CallsStandIn),
        (Row::NodeReference, Row::CallsReference),
    ] {
        if !(ran(node) && ran(calls) && ran(Row::FuseLayer)) {
            continue;
        }
        for (phase, operation) in FUSE_PHASES.iter().enumerate() {
            let calls_of =
                |kind: usize| figure(results, node, phase, move |p| p.calls_per_op[kind]);
            let round_trip = [p50(calls, 0), p50(calls, 1), p50(calls, 2), p50(calls, 1)];
            let worker: f64 = (0..4).map(|kind| calls_of(kind) * round_trip[kind]).sum();
            let fuse = p50(Row::FuseLayer, phase);
            let full = p50(node, phase);
            let counted = (0..4)
                .filter(|&kind| calls_of(kind) > 0.0)
                .map(|kind| format!("{:.2} {}", calls_of(kind), CALL_KINDS[kind]))
                .collect::<Vec<_>>()
                .join(" + ");
            println!(
                "{operation} through {}: {full:.1} µs against its parts {:.1} µs (FUSE layer {fuse:.1} + {counted} calls {worker:.1}): {:+.0}% (target within 10%)",
                node.name(),
                fuse + worker,
                (full / (fuse + worker) - 1.0) * 100.0,
            );
        }
    }
}
