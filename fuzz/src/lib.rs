//! The bodies of the cargo-fuzz targets (`fuzz_targets/`), one module per target. Each module is
//! also included by path into a stable test of the crate it exercises, which replays that
//! target's corpus (`corpus/<target>/`) through the same function.
pub mod config;
pub mod decode;
pub mod node_wire;
pub mod session;
pub mod trace;
