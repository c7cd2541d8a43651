//! Parse a volume record or consumer claim, render, parse again: same record, stable bytes,
//! within the size limit; anything else is refused as corrupt.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| localstore::record_roundtrip_check(data));
