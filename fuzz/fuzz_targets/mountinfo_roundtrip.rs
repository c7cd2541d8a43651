//! Parse, render, parse again: same values, stable bytes, and kernel-form input unchanged.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mountinfo::roundtrip_check(data));
