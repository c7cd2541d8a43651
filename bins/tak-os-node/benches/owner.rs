//! What the mount owner costs: a stage's lifecycle beside its parts, publish latency as the
//! number of stages grows, memory per stage, and the worker calls its lease renewals make.
//!
//! `cargo bench -p tak-os-node --bench owner` runs the full benchmark (about a minute as root):
//!
//! 1. Stage + publish + unpublish + unstage of an RWX volume, p50 and p99 of each over 50
//!    rounds, beside their parts measured in the same loop: the fusefs mount and unmount alone,
//!    the bind and unmount alone, and an RWO claim + release alone.
//! 2. Publish + unpublish p50/p99 with 10 and with 1,000 RWX volumes staged (the per-call path
//!    must stay flat: it looks at its own target and stage only).
//! 3. The owner's resident memory per staged RWX volume at 1, 100 and 500 stages.
//! 4. Worker calls per second spent on lease renewals with 500 RWO volumes staged, at the
//!    default 20 s renewal interval (measured at a tenth of every timing and scaled back).
//! 5. The write-ahead's cost: through an RWX stage of an owner with a keeper (in this process)
//!    and one of an owner without, interleaved, p50 and p99 of creating and closing a new file
//!    (CREATE writes a node and a handle ahead), of the first `stat` of a file the kernel does
//!    not know yet (LOOKUP writes a node ahead) and of a repeated `stat` (nothing to write).
//! 6. The hand-over with 1, 10 and 100 RWX stages: the old owner's `hand_over_all` (pause,
//!    deposit with tables) and the next owner's `adopt_handed_over` (fetch, renew, adopt), and
//!    their sum, the time from the old owner's last answer to the new owner's first.
//!
//! One worker serves every volume over loopback TLS, its state on a tmpfs. Without `--bench`
//! (as `cargo test --benches` runs it) it does a short smoke run with small counts. Everything
//! is mounted inside a private mount namespace entered first thing; without root the benchmark
//! prints SKIPPED and exits 0.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark binary reports on stdout and stops at the first failure"
)]

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_proto::v1::*;
use fusefs::testing::WorkerVolume;
use lease_client::protocol::MountEpoch;
use mounter::{BindOptions, Mounter};
use tak_os_node::context;
use tak_os_node::credentials::DirectorySource;
use tak_os_node::owner::{Owner, OwnerConfig};

/// How much of everything: the full run, or the smoke run.
struct Sizes {
    handover_levels: [usize; 3],
    rounds: usize,
    publish_levels: [usize; 2],
    memory_levels: [usize; 3],
    rwo_stages: usize,
    renewal_window: Duration,
}

const FULL: Sizes = Sizes {
    handover_levels: [1, 10, 100],
    rounds: 50,
    publish_levels: [10, 1000],
    memory_levels: [1, 100, 500],
    rwo_stages: 500,
    renewal_window: Duration::from_secs(10),
};

const SMOKE: Sizes = Sizes {
    handover_levels: [1, 2, 3],
    rounds: 3,
    publish_levels: [2, 5],
    memory_levels: [1, 2, 4],
    rwo_stages: 4,
    renewal_window: Duration::from_secs(3),
};

/// The timings are a tenth of the defaults, so that renewals come ten times as often.
const SCALE: f64 = 0.1;

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    if !test_support::private_mount_namespace_with_fuse("tak-os-node owner benchmark") {
        return;
    }
    let sizes = if full { FULL } else { SMOKE };
    let max = sizes.publish_levels[1].max(sizes.rwo_stages) + sizes.memory_levels[2];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(max + 64)
        .enable_all()
        .build()
        .unwrap();
    raise_open_file_limit();
    runtime.block_on(run(&sizes));
}

fn raise_open_file_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    );
}

/// The worker, the credentials of every volume it serves, and an owner.
struct Bench {
    dir: PathBuf,
    worker: WorkerVolume,
    rwo: WorkerVolume,
    credentials: PathBuf,
    kubelet: PathBuf,
    owner: Owner,
    next: usize,
}

/// An owner of node `bench-node` with its kubelet root below `kubelet`, depositing with the
/// keeper at `keeper` when given.
fn owner_of(kubelet: &Path, credentials: &Path, keeper: Option<&Path>) -> Owner {
    let mut config = OwnerConfig::new("bench-node");
    config.kubelet_root = kubelet.to_owned();
    config.budgets = lease_client::Budgets::default().scaled(SCALE);
    config.lease = lease_client::LeaseConfig::default().scaled(SCALE);
    config.keeper_socket = keeper.map(Path::to_owned);
    let owner = Owner::new(
        config,
        Arc::new(mounter::LinuxMounter::new()),
        Arc::new(DirectorySource::new(credentials)),
    )
    .unwrap();
    owner.recover().unwrap();
    owner
}

impl Bench {
    async fn start(dir: &Path) -> Bench {
        rustix::mount::mount(
            "tmpfs",
            dir,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            c"",
        )
        .unwrap();
        let timings = worker::Timings::default().scaled(SCALE);
        let worker = WorkerVolume::start(
            &dir.join("rwx"),
            "bench-0",
            worker::AccessMode::Rwx,
            timings,
        )
        .await
        .unwrap();
        let rwo = WorkerVolume::start(
            &dir.join("rwo"),
            "bench-rwo",
            worker::AccessMode::Rwo,
            timings,
        )
        .await
        .unwrap();
        let credentials = dir.join("credentials");
        let kubelet = dir.join("kubelet");
        fs::create_dir_all(kubelet.join("plugins")).unwrap();
        fs::create_dir_all(kubelet.join("pods")).unwrap();
        let owner = owner_of(&kubelet, &credentials, None);
        let bench = Bench {
            dir: dir.to_owned(),
            worker,
            rwo,
            credentials,
            kubelet,
            owner,
            next: 0,
        };
        bench.write_credentials("bench-0", &bench.worker);
        bench.write_credentials("bench-rwo", &bench.rwo);
        bench
    }

    fn write_credentials(&self, volume_id: &str, worker: &WorkerVolume) {
        let dir = self.credentials.join(volume_id);
        fs::create_dir_all(&dir).unwrap();
        let pki = worker.pki();
        for (key, value) in [
            ("token", fusefs::testing::TOKEN),
            ("ca.crt", pki.ca_pem.as_str()),
            ("tls.crt", pki.client_pem.as_str()),
            ("tls.key", pki.client_key.as_str()),
        ] {
            fs::write(dir.join(key), value).unwrap();
        }
    }

    /// A new volume on the worker of `mode`, and the stage request for it.
    fn volume(&mut self, mode: worker::AccessMode) -> NodeStageVolumeRequest {
        self.next += 1;
        let worker = match mode {
            worker::AccessMode::Rwx => &self.worker,
            worker::AccessMode::Rwo => &self.rwo,
        };
        let id = format!("bench-{}-{}", mode_name(mode), self.next);
        worker
            .server()
            .create_volume(&worker::testing::volume(&id, mode))
            .unwrap();
        self.write_credentials(&id, worker);
        let staging = self.kubelet.join("plugins").join(&id).join("globalmount");
        fs::create_dir_all(&staging).unwrap();
        let (csi_mode, context_mode) = match mode {
            worker::AccessMode::Rwx => (Mode::MultiNodeMultiWriter, "rwx"),
            worker::AccessMode::Rwo => (Mode::SingleNodeWriter, "rwo"),
        };
        NodeStageVolumeRequest {
            volume_id: id,
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(VolumeCapability {
                access_mode: Some(AccessMode {
                    mode: csi_mode as i32,
                }),
                access_type: Some(AccessType::Mount(MountVolume::default())),
            }),
            volume_context: HashMap::from([
                (context::GENERATION.to_owned(), "1".to_owned()),
                (
                    context::ENDPOINTS.to_owned(),
                    format!("https://{}", worker.endpoint()),
                ),
                (context::ACCESS_MODE.to_owned(), context_mode.to_owned()),
            ]),
            ..Default::default()
        }
    }

    fn target(&self, name: &str) -> PathBuf {
        let parent = self.kubelet.join("pods").join(name);
        fs::create_dir_all(&parent).unwrap();
        parent.join("mount")
    }
}

fn mode_name(mode: worker::AccessMode) -> &'static str {
    match mode {
        worker::AccessMode::Rwx => "rwx",
        worker::AccessMode::Rwo => "rwo",
    }
}

fn publish(stage: &NodeStageVolumeRequest, target: &Path) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: stage.volume_id.clone(),
        staging_target_path: stage.staging_target_path.clone(),
        target_path: target.display().to_string(),
        volume_capability: stage.volume_capability.clone(),
        volume_context: stage.volume_context.clone(),
        ..Default::default()
    }
}

fn unpublish(stage: &NodeStageVolumeRequest, target: &Path) -> NodeUnpublishVolumeRequest {
    NodeUnpublishVolumeRequest {
        volume_id: stage.volume_id.clone(),
        target_path: target.display().to_string(),
    }
}

fn unstage(stage: &NodeStageVolumeRequest) -> NodeUnstageVolumeRequest {
    NodeUnstageVolumeRequest {
        volume_id: stage.volume_id.clone(),
        staging_target_path: stage.staging_target_path.clone(),
    }
}

/// Durations of one kind of step.
#[derive(Default)]
struct Samples(Vec<Duration>);

impl Samples {
    async fn time<T>(&mut self, f: impl AsyncFnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f().await;
        self.0.push(start.elapsed());
        out
    }

    fn quantile(&self, q: f64) -> Duration {
        let mut sorted = self.0.clone();
        sorted.sort();
        let at = ((sorted.len() as f64 - 1.0) * q).round() as usize;
        sorted.get(at).copied().unwrap_or_default()
    }

    fn row(&self, what: &str) {
        println!(
            "| {what} | {:.2} | {:.2} |",
            ms(self.quantile(0.5)),
            ms(self.quantile(0.99))
        );
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn rss_bytes() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

async fn run(sizes: &Sizes) {
    let scratch = tempfile::tempdir().unwrap();
    let mut bench = Bench::start(scratch.path()).await;
    let metrics = observe::install_metrics().unwrap();

    // 1. The lifecycle beside its parts, interleaved.
    println!(
        "## Lifecycle of an RWX stage, {} rounds (ms)\n",
        sizes.rounds
    );
    println!("| step | p50 | p99 |\n|---|---|---|");
    let (mut stage, mut publish_s, mut unpublish_s, mut unstage_s): (
        Samples,
        Samples,
        Samples,
        Samples,
    ) = Default::default();
    let (mut mount, mut bind, mut claim) =
        (Samples::default(), Samples::default(), Samples::default());
    let mounter = mounter::LinuxMounter::new();
    let root = mounter::TargetRoot::new(&bench.kubelet).unwrap();
    for round in 0..sizes.rounds {
        let req = bench.volume(worker::AccessMode::Rwx);
        let target = bench.target(&format!("life-{round}"));
        let owner = &bench.owner;
        Samples::time(&mut stage, async || owner.stage(&req).await.unwrap()).await;
        Samples::time(&mut publish_s, async || {
            owner.publish(&publish(&req, &target)).await.unwrap()
        })
        .await;
        Samples::time(&mut unpublish_s, async || {
            owner.unpublish(&unpublish(&req, &target)).await.unwrap()
        })
        .await;
        // The bind alone, of the same stage.
        let bound = root.resolve(&target).unwrap();
        bound.create_dir(0o750).unwrap();
        let staging = PathBuf::from(&req.staging_target_path);
        let identity = mounter.source_identity(&staging).unwrap();
        bind.time(async || {
            mounter
                .bind(&staging, &bound, BindOptions::default())
                .unwrap();
            mounter.unmount(&bound, &identity).unwrap();
        })
        .await;
        mounter.remove_target(&bound).unwrap();
        Samples::time(&mut unstage_s, async || {
            owner.unstage(&unstage(&req)).await.unwrap()
        })
        .await;

        // The fusefs mount alone, with a client of its own.
        let path = bench.dir.join("alone");
        fs::create_dir_all(&path).unwrap();
        let budgets = lease_client::Budgets::default().scaled(SCALE);
        mount
            .time(async || {
                let mut mounted = bench
                    .worker
                    .mount(&path, budgets, fusefs::FsConfig::default())
                    .await
                    .unwrap();
                mounted.unmount(Duration::from_secs(5)).await.unwrap();
            })
            .await;

        // The claim alone (and its release).
        let client = bench.rwo.client(budgets);
        let lease = lease_client::MountLease::new(
            &client,
            MountEpoch::random().unwrap(),
            "bench-node",
            lease_client::LeaseConfig::default().scaled(SCALE),
        );
        claim
            .time(async || {
                let call = lease.prepare_claim().unwrap();
                lease.claim(&call).await.unwrap();
            })
            .await;
        let _ = lease.release().await;
    }
    stage.row("NodeStageVolume");
    publish_s.row("NodePublishVolume");
    unpublish_s.row("NodeUnpublishVolume");
    unstage_s.row("NodeUnstageVolume");
    mount.row("part: fusefs mount + unmount alone");
    bind.row("part: bind + unmount alone");
    claim.row("part: RWO claim alone");

    // 2 and 3. Publish latency and memory as stages pile up.
    println!("\n## With many RWX stages\n");
    println!("| stages | publish + unpublish p50 (ms) | p99 (ms) | RSS per stage (KiB) |");
    println!("|---|---|---|---|");
    let mut staged = Vec::new();
    let base_rss = rss_bytes();
    let mut levels: Vec<usize> = sizes
        .memory_levels
        .iter()
        .chain(sizes.publish_levels.iter())
        .copied()
        .collect();
    levels.sort_unstable();
    levels.dedup();
    for level in levels {
        while staged.len() < level {
            let req = bench.volume(worker::AccessMode::Rwx);
            bench.owner.stage(&req).await.unwrap();
            staged.push(req);
        }
        let per_stage = (rss_bytes().saturating_sub(base_rss)) / level as u64 / 1024;
        let mut pair = Samples::default();
        let probe = &staged[level / 2];
        let target = bench.target(&format!("level-{level}"));
        for _ in 0..sizes.rounds {
            let owner = &bench.owner;
            pair.time(async || {
                owner.publish(&publish(probe, &target)).await.unwrap();
                owner.unpublish(&unpublish(probe, &target)).await.unwrap();
            })
            .await;
        }
        println!(
            "| {level} | {:.2} | {:.2} | {per_stage} |",
            ms(pair.quantile(0.5)),
            ms(pair.quantile(0.99))
        );
    }
    for req in staged.drain(..) {
        bench.owner.unstage(&unstage(&req)).await.unwrap();
    }

    // 4. Renewal calls with many RWO stages.
    for _ in 0..sizes.rwo_stages {
        let req = bench.volume(worker::AccessMode::Rwo);
        bench.owner.stage(&req).await.unwrap();
        staged.push(req);
    }
    let renewals = || {
        metrics
            .render()
            .lines()
            .filter(|l| l.starts_with("lease_client_renewals_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let before = renewals();
    tokio::time::sleep(sizes.renewal_window).await;
    let per_second = (renewals() - before) / sizes.renewal_window.as_secs_f64();
    println!(
        "\n## Lease renewals with {} RWO stages\n\n{:.1} worker calls/s at a tenth of the timings: \
         {:.1} calls/s at the default 20 s interval ({:.3} per stage per second)",
        sizes.rwo_stages,
        per_second,
        per_second * SCALE,
        per_second * SCALE / sizes.rwo_stages as f64
    );
    for req in staged.drain(..) {
        bench.owner.unstage(&unstage(&req)).await.unwrap();
    }

    // 5 and 6. The keeper: the write-ahead's cost, and the hand-over.
    let socket = bench.dir.join("keeper.sock");
    let (stop_keeper, stopped) = tokio::sync::oneshot::channel::<()>();
    let keeper = tokio::spawn({
        let socket = socket.clone();
        async move {
            tak_os_node::keeper::run_keeper(&socket, Default::default(), async {
                let _ = stopped.await;
            })
            .await
        }
    });
    while !socket.exists() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    write_ahead(&mut bench, &socket, sizes.rounds).await;
    hand_over(&mut bench, &socket, sizes.handover_levels).await;
    let _ = stop_keeper.send(());
    keeper.await.unwrap().unwrap();
    let _ = rustix::mount::unmount(scratch.path(), rustix::mount::UnmountFlags::DETACH);
}

/// Section 5: the same operations through a stage written ahead to the keeper and through one
/// that is not, interleaved.
async fn write_ahead(bench: &mut Bench, socket: &Path, rounds: usize) {
    let kept = owner_of(&bench.kubelet, &bench.credentials, Some(socket));
    let (kept_req, plain_req) = (
        bench.volume(worker::AccessMode::Rwx),
        bench.volume(worker::AccessMode::Rwx),
    );
    let plain = &bench.owner;
    kept.stage(&kept_req).await.unwrap();
    plain.stage(&plain_req).await.unwrap();
    let roots = [
        PathBuf::from(&kept_req.staging_target_path),
        PathBuf::from(&plain_req.staging_target_path),
    ];
    let backing = |req: &NodeStageVolumeRequest| {
        bench
            .worker
            .backing_dir()
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .join(&req.volume_id)
            .join("data")
    };
    let backings = [backing(&kept_req), backing(&plain_req)];
    let mut samples: [[Samples; 3]; 2] = Default::default();
    for round in 0..rounds * 4 {
        for (side, root) in roots.iter().enumerate() {
            let [create, first, again] = &mut samples[side];
            let new = root.join(format!("new-{round}"));
            create
                .time(async || drop(fs::File::create(&new).unwrap()))
                .await;
            // Made behind the mount's back: the kernel does not know it yet.
            fs::write(backings[side].join(format!("behind-{round}")), b"x").unwrap();
            let behind = root.join(format!("behind-{round}"));
            first.time(async || fs::metadata(&behind).unwrap()).await;
            again.time(async || fs::metadata(&behind).unwrap()).await;
        }
    }
    println!("\n## The write-ahead's cost (ms), {} rounds\n", rounds * 4);
    println!(
        "| operation | with the keeper p50 | p99 | without p50 | p99 |\n|---|---|---|---|---|"
    );
    for (at, what) in [
        "create + close a new file (CREATE: a node and a handle written ahead)",
        "first stat of a file made behind the mount (LOOKUP: a node written ahead)",
        "repeated stat (LOOKUP of a node the kernel holds: nothing written)",
    ]
    .iter()
    .enumerate()
    {
        let (with, without) = (&samples[0][at], &samples[1][at]);
        println!(
            "| {what} | {:.3} | {:.3} | {:.3} | {:.3} |",
            ms(with.quantile(0.5)),
            ms(with.quantile(0.99)),
            ms(without.quantile(0.5)),
            ms(without.quantile(0.99))
        );
    }
    kept.unstage(&unstage(&kept_req)).await.unwrap();
    plain.unstage(&unstage(&plain_req)).await.unwrap();
}

/// Section 6: an owner with `level` stages hands them over; the next owner takes them back.
async fn hand_over(bench: &mut Bench, socket: &Path, levels: [usize; 3]) {
    println!("\n## The hand-over (ms)\n");
    println!(
        "| stages | hand_over_all (old owner) | adopt_handed_over (new owner) | last answer to first answer |"
    );
    println!("|---|---|---|---|");
    for level in levels {
        let old = owner_of(&bench.kubelet, &bench.credentials, Some(socket));
        let mut staged = Vec::new();
        for _ in 0..level {
            let req = bench.volume(worker::AccessMode::Rwx);
            old.stage(&req).await.unwrap();
            staged.push(req);
        }
        let started = Instant::now();
        let report = old.hand_over_all().await;
        let handed = started.elapsed();
        assert_eq!((report.handed_over, report.failed), (level, 0));
        drop(old);
        let new = owner_of(&bench.kubelet, &bench.credentials, Some(socket));
        let started = Instant::now();
        let adopted = new.adopt_handed_over().await;
        let taken = started.elapsed();
        assert_eq!(adopted, level);
        println!(
            "| {level} | {:.1} | {:.1} | {:.1} |",
            ms(handed),
            ms(taken),
            ms(handed + taken)
        );
        for req in &staged {
            let _ = fs::metadata(&req.staging_target_path).unwrap();
            new.unstage(&unstage(req)).await.unwrap();
        }
    }
}
