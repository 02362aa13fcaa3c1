//! The `ipkeep` CNI IPAM plugin binary.
fn main() {}
