//! Create and delete of 1,000 volumes with real fsyncs; prints per-operation percentiles.
//!
//! `cargo bench -p localstore --bench lifecycle` runs the full benchmark in a temporary directory
//! (set `LOCALSTORE_BENCH_DIR` to a directory on the disk to measure). Without `--bench` (as
//! `cargo test --benches` runs it) it does a 10-volume smoke run. Needs root: store roots must
//! be root-owned.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark binary reports on stdout and fails loudly"
)]

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use localstore::{Capability, CapacityRange, CreateRequest, Store, StoreOptions};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn report(what: &str, mut samples: Vec<Duration>) {
    samples.sort_unstable();
    let total: Duration = samples.iter().sum();
    println!(
        "{what:<7} n={:<5} p50={:>8.3} ms  p99={:>8.3} ms  max={:>8.3} ms  mean={:>8.3} ms",
        samples.len(),
        percentile(&samples, 50.0).as_secs_f64() * 1e3,
        percentile(&samples, 99.0).as_secs_f64() * 1e3,
        samples.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
        total.as_secs_f64() * 1e3 / samples.len() as f64,
    );
}

fn main() {
    if !rustix::process::geteuid().is_root() {
        assert!(
            !test_support::in_ci(),
            "the lifecycle benchmark needs root and cannot be skipped in CI"
        );
        eprintln!("SKIPPED: the lifecycle benchmark needs root (store roots must be root-owned)");
        return;
    }
    let full = std::env::args().any(|a| a == "--bench");
    let volumes = if full { 1000 } else { 10 };
    let dir = match std::env::var_os("LOCALSTORE_BENCH_DIR") {
        Some(parent) => tempfile::tempdir_in(parent),
        None => tempfile::tempdir(),
    }
    .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let store = Store::open(dir.path(), StoreOptions::new("bench-node")).unwrap();

    let requests: Vec<CreateRequest> = (0..volumes)
        .map(|i| {
            CreateRequest::new(
                format!("pvc-{i:08}-0000-0000-0000-000000000000"),
                Capability::mount("SINGLE_NODE_WRITER"),
            )
            .with_capacity(CapacityRange::at_least(1 << 20))
            .with_parameter("tier", "local")
        })
        .collect();
    let mut creates = Vec::with_capacity(volumes);
    let mut ids = Vec::with_capacity(volumes);
    for request in &requests {
        let start = Instant::now();
        let record = store.create(request).unwrap();
        creates.push(start.elapsed());
        ids.push(record.volume_id);
    }
    let mut deletes = Vec::with_capacity(volumes);
    for id in &ids {
        let start = Instant::now();
        store.delete(id).unwrap();
        deletes.push(start.elapsed());
    }
    println!("filesystem of {}:", dir.path().display());
    report("create", creates);
    report("delete", deletes);
}
