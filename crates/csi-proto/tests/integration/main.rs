//! Integration tests for csi-proto, in one binary: the checked-in generated code, the wire
//! format against hand-derived bytes, and a round trip of each service over a Unix socket.

mod codegen;
mod roundtrip;
mod wire;
