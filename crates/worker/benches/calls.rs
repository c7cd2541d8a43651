//! Placeholder replaced by the real benchmark below.
fn main() {}
