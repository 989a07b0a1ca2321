//! `umd-dump`: decode a refgpu command stream (being written).
fn main() {}
