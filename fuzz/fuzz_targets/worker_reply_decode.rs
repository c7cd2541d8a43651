//! Decode a worker reply, encode it, decode again: the same reply and stable bytes; classifying
//! it fails exactly for an empty reply, an unknown error kind or another operation's result.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worker_proto::reply_roundtrip_check(data));
