//! Decode a worker request, encode it, decode again: the same request and stable bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worker_proto::request_roundtrip_check(data));
