//! Parse plus one lookup, side by side with the `procfs` crate on the same bytes, over generated
//! tables of 100, 1,000 and 10,000 mounts; then the cost of reading a real 10,000-mount table
//! (made in a private mount namespace, so it needs root) as the floor.
//!
//! `cargo bench -p tak-os-mountinfo --bench parse` prints medians and ratios. Without `--bench` (as
//! under `cargo test --benches`) it runs once on a small table as a smoke test.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly"
)]

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use procfs::FromRead;
use procfs::process::MountInfos;
use tak_os_mountinfo::MountTable;

/// A table shaped like a busy Kubernetes node: CSI volume mounts under kubelet's pod directory,
/// every tenth with a space (an escape) in its path.
fn generated_table(mounts: usize) -> (Vec<u8>, PathBuf) {
    let mut text = String::new();
    text.push_str("20 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n");
    let mut wanted = PathBuf::from("/");
    for i in 1..mounts {
        let id = 20 + i;
        let space = if i % 10 == 0 { "\\040x" } else { "" };
        let point = format!(
            "/var/lib/kubelet/pods/{i:08x}-3c1e-4d0b-9d6f-5a7e2b1c{i:04x}/volumes/\
             kubernetes.io~csi/pvc-{i:08x}{space}/mount"
        );
        text.push_str(&format!(
            "{id} 20 0:{minor} / {point} rw,nosuid,nodev,relatime shared:{id} - tmpfs tmpfs \
             rw,size=1048576k,mode=755,inode64\n",
            minor = 100 + i
        ));
        // procfs does not decode escapes, so look up a path without one.
        if i == mounts / 2 + 1 {
            wanted = PathBuf::from(point.replace("\\040", " "));
        }
    }
    (text.into_bytes(), wanted)
}

fn ours(text: &[u8], wanted: &Path) -> u64 {
    let table = MountTable::parse(text).unwrap();
    table.by_mount_point(wanted).unwrap().mount_id()
}

fn theirs(text: &[u8], wanted: &Path) -> u64 {
    let infos = MountInfos::from_read(text).unwrap();
    infos
        .iter()
        .rev()
        .find(|m| m.mount_point == wanted)
        .unwrap()
        .mnt_id as u64
}

/// How many calls make one sample long enough to time well.
fn batch_for(f: &mut dyn FnMut()) -> u32 {
    let start = Instant::now();
    f();
    let once = start.elapsed().max(Duration::from_nanos(1));
    (Duration::from_millis(5).as_nanos() / once.as_nanos()).clamp(1, 10_000) as u32
}

/// Medians per call of each function, sampled in turn so that both see the same machine state.
fn medians(samples: usize, fs: &mut [&mut dyn FnMut()]) -> Vec<Duration> {
    let batches: Vec<u32> = fs.iter_mut().map(|f| batch_for(*f)).collect();
    let mut times = vec![Vec::with_capacity(samples); fs.len()];
    for _ in 0..samples {
        for ((f, &batch), t) in fs.iter_mut().zip(&batches).zip(&mut times) {
            let start = Instant::now();
            for _ in 0..batch {
                f();
            }
            t.push(start.elapsed() / batch);
        }
    }
    times
        .into_iter()
        .map(|mut t| {
            t.sort();
            t[t.len() / 2]
        })
        .collect()
}

fn fmt(d: Duration) -> String {
    if d >= Duration::from_millis(1) {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let sizes: &[usize] = if full { &[100, 1_000, 10_000] } else { &[100] };
    let samples = if full { 31 } else { 3 };

    println!("parse + one by_mount_point lookup, median per call ({samples} samples)");
    println!(
        "{:>8} {:>10} {:>12} {:>12} {:>8}",
        "mounts", "bytes", "mountinfo", "procfs", "ratio"
    );
    for &n in sizes {
        let (text, wanted) = generated_table(n);
        assert_eq!(ours(&text, &wanted), theirs(&text, &wanted));
        let m = medians(
            samples,
            &mut [
                &mut || {
                    black_box(ours(black_box(&text), &wanted));
                },
                &mut || {
                    black_box(theirs(black_box(&text), &wanted));
                },
            ],
        );
        let ratio = m[1].as_secs_f64() / m[0].as_secs_f64();
        println!(
            "{n:>8} {:>10} {:>12} {:>12} {ratio:>7.1}x",
            text.len(),
            fmt(m[0]),
            fmt(m[1])
        );
    }

    if !full {
        return;
    }
    match test_support::try_private_mount_namespace() {
        Ok(()) => real_table(samples),
        Err(why) => println!("\nreal 10,000-mount table: skipped (needs root): {why}"),
    }
}

/// Reads and parses a real table of 10,000 tmpfs mounts, made in this process's private mount
/// namespace (they vanish with the process).
fn real_table(samples: usize) {
    let base = tempfile::tempdir().unwrap();
    rustix::mount::mount(
        "bench",
        base.path(),
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        None,
    )
    .unwrap();
    let before = MountTable::parse(&tak_os_mountinfo::read_self().unwrap())
        .unwrap()
        .len();
    let made = Instant::now();
    for i in before..10_000 {
        let dir = base.path().join(format!("volume-{i:05}"));
        std::fs::create_dir(&dir).unwrap();
        rustix::mount::mount(
            "bench",
            &dir,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            None,
        )
        .unwrap();
    }
    let text = tak_os_mountinfo::read_self().unwrap();
    let wanted = base.path().join("volume-05000");
    let table = MountTable::parse(&text).unwrap();
    assert!(table.is_mount_point(&wanted));
    println!(
        "\nreal /proc/thread-self/mountinfo: {} mounts, {} bytes (made in {:.1} s)",
        table.len(),
        text.len(),
        made.elapsed().as_secs_f64()
    );
    drop(table);
    let m = medians(
        samples,
        &mut [
            &mut || {
                black_box(tak_os_mountinfo::read_self().unwrap());
            },
            &mut || {
                black_box(ours(black_box(&text), &wanted));
            },
            &mut || {
                black_box(theirs(black_box(&text), &wanted));
            },
        ],
    );
    println!("  kernel read (read_self)        {:>10}", fmt(m[0]));
    println!(
        "  mountinfo parse + lookup       {:>10}  ({:.1}% of the read)",
        fmt(m[1]),
        100.0 * m[1].as_secs_f64() / m[0].as_secs_f64()
    );
    println!(
        "  procfs parse + lookup          {:>10}  ({:.1}x mountinfo)",
        fmt(m[2]),
        m[2].as_secs_f64() / m[1].as_secs_f64()
    );
}
