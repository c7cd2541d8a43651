//! Decode a FUSE request, encode it, decode again: the same request, stable bytes, and
//! well-formed replies; the same bytes read as an init record survive their format.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuse_wire::roundtrip_check(data));
