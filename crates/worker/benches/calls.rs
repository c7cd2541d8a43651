//! Calls per second and p99 latency of getattr, 4 KiB reads and 1 MiB writes through the
//! reference worker over loopback TLS (the lease-client `Client`, HTTP/2), with 1, 8 and 64
//! concurrent callers, beside the same operations made directly on the backing directory in
//! the same run.
//!
//! `cargo bench -p worker --bench calls` (add `-- --seconds 3` for longer cells).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use lease_client::{Budgets, Client, ClientConfig, Credentials, EndpointSet, HttpsTransport};
use worker::{AccessMode, Config, Server, SystemClock, TlsMaterial, Tokens, VolumeSpec};
use worker_proto::VolumeGeneration;
use worker_proto::v1;
use worker_proto::v1::request::Op;

const TOKEN: &str = "bench-token";
const FILE_BYTES: u64 = 64 << 20;
const READ: usize = 4 << 10;
const WRITE: usize = 1 << 20;
const CALLERS: [usize; 3] = [1, 8, 64];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Getattr,
    Read4k,
    Write1m,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Getattr => "getattr",
            Kind::Read4k => "read 4 KiB",
            Kind::Write1m => "write 1 MiB",
        }
    }
}

struct Cell {
    calls: usize,
    elapsed: Duration,
    p99: Duration,
}

fn summarize(mut latencies: Vec<Duration>, elapsed: Duration) -> Cell {
    latencies.sort();
    let p99 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];
    Cell {
        calls: latencies.len(),
        elapsed,
        p99,
    }
}

fn certificates() -> (TlsMaterial, Credentials) {
    let pki = worker::testing::Pki::generate("bench").unwrap();
    (pki.tls(), pki.credentials(TOKEN).unwrap())
}

struct Target {
    file: v1::FileId,
    handle: u64,
}

fn op(kind: Kind, target: &Target, n: u64, payload: &Bytes) -> Op {
    match kind {
        Kind::Getattr => Op::Getattr(v1::GetattrRequest {
            file: Some(target.file),
            handle: None,
        }),
        Kind::Read4k => Op::Read(v1::ReadRequest {
            file: Some(target.file),
            handle: target.handle,
            offset: (n * 7919 % (FILE_BYTES / READ as u64)) * READ as u64,
            size: READ as u32,
        }),
        Kind::Write1m => Op::Write(v1::WriteRequest {
            file: Some(target.file),
            handle: target.handle,
            offset: (n % (FILE_BYTES / WRITE as u64)) * WRITE as u64,
            data: payload.clone(),
            flags: 0,
        }),
    }
}

async fn over_tls(
    client: Arc<Client<HttpsTransport>>,
    target: Arc<Target>,
    kind: Kind,
    callers: usize,
    seconds: Duration,
) -> Cell {
    let payload = Bytes::from(vec![0x5a; WRITE]);
    let started = Instant::now();
    let deadline = started + seconds;
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..callers {
        let client = Arc::clone(&client);
        let target = Arc::clone(&target);
        let payload = payload.clone();
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let mut n = caller as u64 * 1_000_003;
            while Instant::now() < deadline {
                let began = Instant::now();
                client.call(op(kind, &target, n, &payload)).await.unwrap();
                latencies.push(began.elapsed());
                n += 1;
            }
            latencies
        });
    }
    let mut all = Vec::new();
    while let Some(latencies) = tasks.join_next().await {
        all.extend(latencies.unwrap());
    }
    summarize(all, started.elapsed())
}

fn direct(path: &PathBuf, kind: Kind, callers: usize, seconds: Duration) -> Cell {
    let started = Instant::now();
    let deadline = started + seconds;
    let file = Arc::new(
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap(),
    );
    let threads: Vec<_> = (0..callers)
        .map(|caller| {
            let file = Arc::clone(&file);
            let path = path.clone();
            std::thread::spawn(move || {
                let mut latencies = Vec::new();
                let mut n = caller as u64 * 1_000_003;
                let mut buffer = vec![0x5a; WRITE];
                while Instant::now() < deadline {
                    let began = Instant::now();
                    match kind {
                        Kind::Getattr => {
                            std::fs::symlink_metadata(&path).unwrap();
                        }
                        Kind::Read4k => {
                            let offset = (n * 7919 % (FILE_BYTES / READ as u64)) * READ as u64;
                            file.read_exact_at(&mut buffer[..READ], offset).unwrap();
                        }
                        Kind::Write1m => {
                            let offset = (n % (FILE_BYTES / WRITE as u64)) * WRITE as u64;
                            file.write_all_at(&buffer, offset).unwrap();
                        }
                    }
                    latencies.push(began.elapsed());
                    n += 1;
                }
                latencies
            })
        })
        .collect();
    let all = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    summarize(all, started.elapsed())
}

fn main() {
    let mut seconds = Duration::from_secs(1);
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--seconds") {
        seconds = Duration::from_secs_f64(args[at + 1].parse().unwrap());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let state =
            tempfile::tempdir_in(std::env::var_os("TMPDIR").unwrap_or("/tmp".into())).unwrap();
        let (tls, credentials) = certificates();
        let spec = VolumeSpec {
            volume_id: "bench".into(),
            volume_generation: 1,
            access_mode: AccessMode::Rwx,
        };
        let mut config = Config::new("127.0.0.1:0".parse().unwrap(), state.path(), tls);
        config.volumes = vec![spec.clone()];
        let server = Server::start(config, Tokens::new([TOKEN]), Arc::new(SystemClock))
            .await
            .unwrap();
        let budgets = Budgets::default();
        let client = Arc::new(Client::new(
            ClientConfig {
                volume_id: spec.volume_id.clone(),
                volume_generation: VolumeGeneration(1),
                access_mode: v1::AccessMode::Rwx,
                endpoints: EndpointSet::new([server.endpoint()]).unwrap(),
                budgets,
            },
            HttpsTransport::with_credentials(&budgets, &credentials),
        ));
        let created = client
            .call(Op::Create(v1::CreateRequest {
                parent: Some(v1::FileId {
                    ino: worker::ROOT_INO,
                    inode_generation: worker::ROOT_GENERATION,
                }),
                name: b"data".to_vec(),
                mode: 0o644,
                umask: 0,
                flags: libc::O_RDWR as u32,
                caller: None,
            }))
            .await
            .unwrap();
        let v1::reply::Result::Create(created) = created else {
            panic!("create answered {created:?}");
        };
        let target = Arc::new(Target {
            file: created.entry.unwrap().file.unwrap(),
            handle: created.handle,
        });
        let backing = state.path().join("volumes/bench/data/data");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&backing)
            .unwrap()
            .set_len(FILE_BYTES)
            .unwrap();

        println!(
            "| operation | callers | worker calls/s | worker p99 | direct ops/s | direct p99 |"
        );
        println!("|---|---:|---:|---:|---:|---:|");
        for kind in [Kind::Getattr, Kind::Read4k, Kind::Write1m] {
            for callers in CALLERS {
                let tls = over_tls(
                    Arc::clone(&client),
                    Arc::clone(&target),
                    kind,
                    callers,
                    seconds,
                )
                .await;
                let path = backing.clone();
                let raw =
                    tokio::task::spawn_blocking(move || direct(&path, kind, callers, seconds))
                        .await
                        .unwrap();
                println!(
                    "| {} | {} | {:.0} | {:.2} ms | {:.0} | {:.3} ms |",
                    kind.name(),
                    callers,
                    tls.calls as f64 / tls.elapsed.as_secs_f64(),
                    tls.p99.as_secs_f64() * 1e3,
                    raw.calls as f64 / raw.elapsed.as_secs_f64(),
                    raw.p99.as_secs_f64() * 1e3,
                );
            }
        }
        server.stop().await;
    });
}
