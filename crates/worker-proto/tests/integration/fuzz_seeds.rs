//! The fuzz targets' invariants hold on every checked-in seed.

use std::path::{Path, PathBuf};

fn seeds(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target);
    let seeds: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("seed folder")
        .map(|entry| entry.expect("seed entry").path())
        .collect();
    assert!(
        seeds.len() >= 10,
        "expected the seed corpus in {}",
        dir.display()
    );
    seeds
}

#[test]
fn fuzz_seeds_hold_the_request_roundtrip_invariant() {
    for path in seeds("worker_request_decode") {
        tak_os_worker_proto::request_roundtrip_check(&std::fs::read(&path).expect("seed"));
    }
}

#[test]
fn fuzz_seeds_hold_the_reply_roundtrip_invariant() {
    for path in seeds("worker_reply_decode") {
        tak_os_worker_proto::reply_roundtrip_check(&std::fs::read(&path).expect("seed"));
    }
}
