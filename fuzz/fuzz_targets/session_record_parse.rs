//! Parse, render, parse again: same record, stable bytes; anything else is refused as corrupt.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| session::roundtrip_check(data));
