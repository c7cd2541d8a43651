//! The `localstore_record_parse` fuzz target's invariant holds on every checked-in seed. Needs
//! no root: it parses bytes only.

use std::path::Path;

#[test]
fn fuzz_seeds_hold_the_record_roundtrip_invariant() {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/localstore_record_parse");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("seed folder") {
        let path = entry.expect("seed entry").path();
        localstore::record_roundtrip_check(&std::fs::read(&path).expect("seed"));
        seen += 1;
    }
    assert!(seen >= 10, "expected the seed corpus in {}", dir.display());
}
