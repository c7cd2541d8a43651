//! NodePublishVolume + NodeUnpublishVolume latency over the driver's real socket as the mount
//! table grows, measured side by side with the floor no driver can beat.
//!
//! `cargo bench -p tak-os-local-csi --bench publish` runs the full benchmark: the namespace's own
//! mounts (about 20), then 1,000 and 10,000 mounts, made of unrelated tmpfs instances. Each level
//! has two phases, each one interleaved loop so that a noisy machine disturbs its columns alike:
//!
//! 1. The per-call paths and their floor: the publish + unpublish pair over the socket through a
//!    driver with the kernel probe (`LinuxMounter::new`); the same two handlers called directly,
//!    without gRPC; a bare bind + read-only remount + unmount; an empty gRPC round trip
//!    (Identity GetPluginInfo) on the same socket.
//! 2. The full-table costs: one read of `/proc/self/mountinfo`, and the pair through a second
//!    driver that always reads the mount table (`Probe::MountTable`, the fallback for kernels
//!    without `statmount`), on its own store.
//!
//! The phases are apart because at 10,000 mounts phase 2 spends about 130 ms per round reading
//! the table on this thread, which slows whatever runs next (even the empty gRPC call, which
//! touches no mount) by cache pollution that is the benchmark's, not the handler's.
//!
//! Without `--bench` (as `cargo test --benches` runs it) it does a short smoke run. Everything is
//! mounted inside a private mount namespace entered first thing, below one scratch tmpfs that is
//! detached at the end; without root the benchmark prints SKIPPED and exits 0.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark binary reports on stdout"
)]

use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use clap::Parser as _;
use csi_proto::v1::controller_client::ControllerClient;
use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_proto::v1::{
    CreateVolumeRequest, GetPluginInfoRequest, NodePublishVolumeRequest,
    NodeUnpublishVolumeRequest, VolumeCapability,
};
use localstore::VolumeId;
use mounter::{LinuxMounter, MountCalls, Mounter, Probe};
use rustix::mount::{MountFlags, UnmountFlags};
use tak_os_local_csi::{Cli, Driver, LocalCsi};
use tokio::sync::watch;
use tonic::transport::Channel;

/// One step of the mount-table size.
struct Level {
    /// Mounts the namespace should hold; 0 means whatever it holds at the start.
    mounts: usize,
    /// Rounds of phase 1 (pairs, direct pairs, syscalls, gRPC calls).
    iterations: usize,
    /// Rounds of phase 2 (table reads).
    table_iterations: usize,
    /// The mount-table driver's pair is timed on every this-many-th round of phase 2: at 10,000
    /// mounts each of its pairs reads the table several times.
    table_every: usize,
}

const FULL: &[Level] = &[
    Level {
        mounts: 0,
        iterations: 1_000,
        table_iterations: 200,
        table_every: 1,
    },
    Level {
        mounts: 1_000,
        iterations: 1_000,
        table_iterations: 200,
        table_every: 2,
    },
    Level {
        mounts: 10_000,
        iterations: 1_000,
        table_iterations: 100,
        table_every: 4,
    },
];

const SMOKE: &[Level] = &[
    Level {
        mounts: 0,
        iterations: 10,
        table_iterations: 10,
        table_every: 1,
    },
    Level {
        mounts: 100,
        iterations: 10,
        table_iterations: 10,
        table_every: 1,
    },
];

/// Untimed rounds of everything before each level's timed ones.
const WARMUP: usize = 5;
/// Target 1: the pair's p99 at the smallest table within this multiple of the floor.
const FLOOR_FACTOR: f64 = 5.0;
/// Target 2: the pair's p99 at the largest table within this multiple of the smallest's.
const GROWTH_FACTOR: f64 = 2.0;

fn main() -> ExitCode {
    // First, while this is the only thread: every thread made later inherits the namespace.
    if let Err(why) = test_support::try_private_mount_namespace() {
        println!("SKIPPED: the publish benchmark needs root in a private mount namespace: {why}");
        return ExitCode::SUCCESS;
    }
    let full = std::env::args().any(|a| a == "--bench");
    match run(if full { FULL } else { SMOKE }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("the publish benchmark failed: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(levels: &[Level]) -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("cannot make a temporary directory")?;
    // Declared after `dir`, so dropped before it: the scratch tmpfs (and every mount below it)
    // is detached before the directory is removed.
    let scratch = Scratch::mount(dir.path())?;
    let root = scratch.path();

    let server = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (stop, stopped) = watch::channel(false);
    let kernel = Instance::start(&server, root, "kernel", LinuxMounter::new(), &stopped)?;
    let table = Instance::start(
        &server,
        root,
        "table",
        LinuxMounter::with_methods(Probe::MountTable, MountCalls::New),
        &stopped,
    )?;

    // The client is another runtime on this thread, as kubelet is another process.
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let rows = client.block_on(measure(levels, root, &kernel, &table));
    drop(client);

    stop.send_replace(true);
    for instance in [kernel, table] {
        instance.stop(&server)?;
    }
    drop(server);
    let rows = rows?;
    print!("{}", report(&rows));
    drop(scratch);
    Ok(())
}

/// A tmpfs over the temporary directory that holds everything the run makes, detached with all
/// mounts below it on drop.
struct Scratch {
    path: PathBuf,
}

impl Scratch {
    fn mount(path: &Path) -> anyhow::Result<Self> {
        mount_tmpfs(path)?;
        Ok(Scratch {
            path: path.to_owned(),
        })
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = rustix::mount::unmount(&self.path, UnmountFlags::DETACH) {
            eprintln!("cannot detach the scratch tmpfs {:?}: {e}", self.path);
        }
    }
}

fn mount_tmpfs(path: &Path) -> anyhow::Result<()> {
    rustix::mount::mount(
        "tmpfs",
        path,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        c"size=64m,mode=0755",
    )
    .with_context(|| format!("cannot mount a tmpfs on {path:?}"))
}

/// One driver serving on its own socket over its own store (the store takes an exclusive lock).
struct Instance {
    label: &'static str,
    driver: Arc<Driver>,
    socket: PathBuf,
    kubelet: PathBuf,
    server: tokio::task::JoinHandle<Result<(), csi_proto::Error>>,
}

impl Instance {
    fn start(
        runtime: &tokio::runtime::Runtime,
        root: &Path,
        label: &'static str,
        mounter: LinuxMounter,
        stopped: &watch::Receiver<bool>,
    ) -> anyhow::Result<Self> {
        // The recommended layout: the store is the root of its own filesystem.
        let store = root.join(format!("store-{label}"));
        std::fs::create_dir(&store)?;
        mount_tmpfs(&store)?;
        std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o755))?;
        let kubelet = root.join(format!("kubelet-{label}"));
        std::fs::create_dir_all(target_parent(&kubelet))?;
        let socket = root.join(format!("{label}.sock"));
        let path = |p: &Path| p.to_str().map(str::to_owned).context("a non-UTF-8 path");
        let endpoint = format!("unix://{}", path(&socket)?);
        let (store, kubelet_root) = (path(&store)?, path(&kubelet)?);
        let config = Cli::try_parse_from([
            "tak-os-local-csi",
            "--node-id",
            "bench-node",
            "--endpoint",
            endpoint.as_str(),
            "--volume-path",
            store.as_str(),
            "--kubelet-root",
            kubelet_root.as_str(),
            "--metrics-address",
            "",
            "--require-mounted-store",
        ])?
        .config()?;
        let driver = tak_os_local_csi::open(&config, Arc::new(mounter))?;
        let listener = {
            let _entered = runtime.enter();
            csi_proto::bind_unix(&socket)?
        };
        let mut stopped = stopped.clone();
        let server = runtime.spawn(csi_proto::serve_on(
            listener,
            LocalCsi::new(Arc::clone(&driver)).router(),
            async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            },
        ));
        Ok(Instance {
            label,
            driver,
            socket,
            kubelet,
            server,
        })
    }

    fn stop(self, runtime: &tokio::runtime::Runtime) -> anyhow::Result<()> {
        let label = self.label;
        runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(10), self.server).await })
            .with_context(|| format!("the {label} server did not stop"))?
            .with_context(|| format!("the {label} server panicked"))?
            .with_context(|| format!("the {label} server failed"))
    }

    fn target(&self) -> PathBuf {
        target_parent(&self.kubelet).join("mount")
    }
}

fn target_parent(kubelet: &Path) -> PathBuf {
    kubelet.join("pods/p/volumes/kubernetes.io~csi/pv")
}

/// A connected client of one instance, with its volume.
struct Client {
    node: NodeClient<Channel>,
    identity: IdentityClient<Channel>,
    volume_id: String,
    kubelet: PathBuf,
    target: String,
    data_dir: PathBuf,
}

impl Client {
    async fn connect(instance: &Instance) -> anyhow::Result<Self> {
        let channel = csi_proto::connect_unix(&instance.socket).await?;
        let created = ControllerClient::new(channel.clone())
            .create_volume(CreateVolumeRequest {
                name: format!("pvc-bench-{}", instance.label),
                volume_capabilities: vec![capability()],
                ..Default::default()
            })
            .await?
            .into_inner();
        let volume_id = created
            .volume
            .context("CreateVolume returned no volume")?
            .volume_id;
        let data_dir = instance
            .driver
            .store()
            .data_dir(&VolumeId::from_str(&volume_id)?);
        let target = instance
            .target()
            .to_str()
            .context("a non-UTF-8 target")?
            .to_owned();
        Ok(Client {
            node: NodeClient::new(channel.clone()),
            identity: IdentityClient::new(channel),
            volume_id,
            kubelet: instance.kubelet.clone(),
            target,
            data_dir,
        })
    }

    fn publish_request(&self) -> NodePublishVolumeRequest {
        NodePublishVolumeRequest {
            volume_id: self.volume_id.clone(),
            target_path: self.target.clone(),
            volume_capability: Some(capability()),
            readonly: false,
            ..Default::default()
        }
    }

    fn unpublish_request(&self) -> NodeUnpublishVolumeRequest {
        NodeUnpublishVolumeRequest {
            volume_id: self.volume_id.clone(),
            target_path: self.target.clone(),
        }
    }

    async fn publish(&mut self) -> anyhow::Result<()> {
        let request = self.publish_request();
        self.node.node_publish_volume(request).await?;
        Ok(())
    }

    async fn unpublish(&mut self) -> anyhow::Result<()> {
        let request = self.unpublish_request();
        self.node.node_unpublish_volume(request).await?;
        Ok(())
    }

    async fn pair(&mut self) -> anyhow::Result<Duration> {
        let start = Instant::now();
        self.publish().await?;
        self.unpublish().await?;
        Ok(start.elapsed())
    }

    /// The same pair through the handlers themselves, on this thread: no gRPC, no blocking-pool
    /// handoff.
    fn direct_pair(&self, driver: &Driver) -> anyhow::Result<Duration> {
        let (publish, unpublish) = (self.publish_request(), self.unpublish_request());
        let start = Instant::now();
        driver.node_publish_volume(publish)?;
        driver.node_unpublish_volume(unpublish)?;
        Ok(start.elapsed())
    }

    async fn empty_call(&mut self) -> anyhow::Result<Duration> {
        let start = Instant::now();
        self.identity
            .get_plugin_info(GetPluginInfoRequest {})
            .await?;
        Ok(start.elapsed())
    }

    /// Checks once that a publication really is this volume's bind and that an unpublication
    /// removes it and its directory, so that the timings are of the real work.
    async fn check(&mut self, mounter: &dyn Mounter) -> anyhow::Result<()> {
        let target = PathBuf::from(&self.target);
        let root = mounter::TargetRoot::new(&self.kubelet)?;
        self.publish().await?;
        let found = mounter.mounted_at(&root.resolve(&target)?)?;
        let expected = mounter.source_identity(&self.data_dir)?;
        ensure!(
            found.is_some_and(|f| f.identity == expected),
            "after NodePublishVolume, {target:?} does not hold the volume's bind"
        );
        self.unpublish().await?;
        ensure!(
            !target.exists(),
            "after NodeUnpublishVolume, {target:?} is still there"
        );
        Ok(())
    }
}

fn capability() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// The bare syscalls of a read-only publication and its removal.
fn syscalls(source: &Path, target: &Path) -> anyhow::Result<Duration> {
    let start = Instant::now();
    rustix::mount::mount_bind(source, target)?;
    rustix::mount::mount_remount(target, MountFlags::BIND | MountFlags::RDONLY, "")?;
    rustix::mount::unmount(target, UnmountFlags::NOFOLLOW)?;
    Ok(start.elapsed())
}

fn table_read() -> anyhow::Result<Duration> {
    let start = Instant::now();
    let bytes = mountinfo::read_self()?;
    let elapsed = start.elapsed();
    std::hint::black_box(bytes);
    Ok(elapsed)
}

fn mount_count() -> anyhow::Result<usize> {
    Ok(mountinfo::read_self()?
        .iter()
        .filter(|&&b| b == b'\n')
        .count())
}

/// Adds unrelated tmpfs mounts below `noise` until the namespace holds `wanted` mounts.
fn add_noise(noise: &Path, next: &mut usize, wanted: usize) -> anyhow::Result<usize> {
    let mut count = mount_count()?;
    while count < wanted {
        let path = noise.join(next.to_string());
        std::fs::create_dir(&path)?;
        rustix::mount::mount(
            "noise",
            &path,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            c"size=1m",
        )
        .with_context(|| format!("cannot mount noise tmpfs {path:?}"))?;
        *next += 1;
        count += 1;
    }
    mount_count()
}

/// Percentiles of one column.
#[derive(Clone, Copy)]
struct Summary {
    n: usize,
    p50: Duration,
    p99: Duration,
}

impl Summary {
    fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        let at = |p: f64| {
            let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
            samples
                .get(rank.clamp(1, samples.len().max(1)) - 1)
                .copied()
                .unwrap_or_default()
        };
        Summary {
            n: samples.len(),
            p50: at(50.0),
            p99: at(99.0),
        }
    }
}

/// One level's results.
struct Row {
    mounts: usize,
    pair_kernel: Summary,
    direct: Summary,
    pair_table: Summary,
    syscalls: Summary,
    table_read: Summary,
    grpc: Summary,
}

async fn measure(
    levels: &[Level],
    root: &Path,
    kernel: &Instance,
    table: &Instance,
) -> anyhow::Result<Vec<Row>> {
    let mut fast = Client::connect(kernel).await?;
    let mut slow = Client::connect(table).await?;
    let real = LinuxMounter::new();
    fast.check(&real).await?;
    slow.check(&real).await?;
    println!(
        "kernel probe (statx mount ID + statmount) available: {}",
        LinuxMounter::kernel_probe_available()
    );

    let floor_target = root.join("floor");
    std::fs::create_dir(&floor_target)?;
    let noise = root.join("noise");
    std::fs::create_dir(&noise)?;
    let mut next_noise = 0;
    let mut rows = Vec::new();
    for level in levels {
        let started = Instant::now();
        let mounts = add_noise(&noise, &mut next_noise, level.mounts)?;
        println!(
            "{mounts} mounts (noise mounted in {:.1} s); timing {} rounds, then {} table rounds...",
            started.elapsed().as_secs_f64(),
            level.iterations,
            level.table_iterations,
        );
        for _ in 0..WARMUP {
            fast.pair().await?;
            fast.direct_pair(&kernel.driver)?;
            syscalls(&fast.data_dir, &floor_target)?;
            fast.empty_call().await?;
            table_read()?;
            slow.pair().await?;
        }
        let n = level.iterations;
        let (mut pair_kernel, mut direct) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut sys, mut grpc) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            pair_kernel.push(fast.pair().await?);
            direct.push(fast.direct_pair(&kernel.driver)?);
            sys.push(syscalls(&fast.data_dir, &floor_target)?);
            grpc.push(fast.empty_call().await?);
        }
        let (mut read, mut pair_table) = (Vec::new(), Vec::new());
        for i in 0..level.table_iterations {
            read.push(table_read()?);
            if i % level.table_every == 0 {
                pair_table.push(slow.pair().await?);
            }
        }
        if mount_count()? != mounts {
            bail!("the mount count changed while timing: something was left mounted");
        }
        rows.push(Row {
            mounts,
            pair_kernel: Summary::of(pair_kernel),
            direct: Summary::of(direct),
            pair_table: Summary::of(pair_table),
            syscalls: Summary::of(sys),
            table_read: Summary::of(read),
            grpc: Summary::of(grpc),
        });
    }
    Ok(rows)
}

fn us(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e6)
}

fn cell(s: Summary) -> String {
    format!("{} / {}", us(s.p50), us(s.p99))
}

fn verdict(ratio: f64, limit: f64) -> &'static str {
    if ratio <= limit { "PASS" } else { "MISS" }
}

fn report(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\np50 / p99 in microseconds. A pair is NodePublishVolume + NodeUnpublishVolume over the socket;\n\
         \"direct\" calls the same two handlers without gRPC. Phase 1 columns left of ||, phase 2 right.\n"
    );
    let line = |out: &mut String, [a, b, c, d, e, f, g, h, i]: [&dyn std::fmt::Display; 9]| {
        let _ = writeln!(
            out,
            "{a:>6} | {b:>4} {c:>11} | {d:>11} | {e:>9} | {f:>9} || {g:>3} {h:>15} | {i:>13}"
        );
    };
    line(
        &mut out,
        [
            &"mounts",
            &"n",
            &"pair",
            &"direct",
            &"syscalls",
            &"gRPC",
            &"n",
            &"pair (table)",
            &"table read",
        ],
    );
    let _ = writeln!(out, "{}", "-".repeat(100));
    for row in rows {
        line(
            &mut out,
            [
                &row.mounts,
                &row.pair_kernel.n,
                &cell(row.pair_kernel),
                &cell(row.direct),
                &cell(row.syscalls),
                &cell(row.grpc),
                &row.pair_table.n,
                &cell(row.pair_table),
                &cell(row.table_read),
            ],
        );
    }
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return out;
    };
    let _ = writeln!(out);
    let floor = first.syscalls.p99 + first.grpc.p99;
    for (label, pair) in [("kernel", first.pair_kernel), ("table", first.pair_table)] {
        let ratio = pair.p99.as_secs_f64() / floor.as_secs_f64();
        let _ = writeln!(
            out,
            "target 1 ({label:>6}): pair p99 at {} mounts / (syscalls p99 + gRPC p99) = {} / {} = {ratio:.2}  (limit {FLOOR_FACTOR}) {}",
            first.mounts,
            us(pair.p99),
            us(floor),
            verdict(ratio, FLOOR_FACTOR),
        );
    }
    for (label, small, large) in [
        ("kernel", first.pair_kernel, last.pair_kernel),
        ("table", first.pair_table, last.pair_table),
    ] {
        let ratio = large.p99.as_secs_f64() / small.p99.as_secs_f64();
        let _ = writeln!(
            out,
            "target 2 ({label:>6}): pair p99 at {} mounts / at {} mounts = {} / {} = {ratio:.2}  (limit {GROWTH_FACTOR}) {}",
            last.mounts,
            first.mounts,
            us(large.p99),
            us(small.p99),
            verdict(ratio, GROWTH_FACTOR),
        );
    }
    let _ = writeln!(
        out,
        "(the targets apply to the kernel probe; the table rows show the fallback for kernels without statmount)"
    );
    out
}
