//! Test fixtures shared by farmem's crates (`publish = false`): used from `crates/*/tests`.
//!
//! - [`bins`]: the `farmem` binary and the preload library under test, found next to the test
//!   executable (`CARGO_BIN_EXE_*` exists only in the binary's own package).
//! - [`donor`]: a `farmem donor` child process (through `farmem_donor::ChildDonorCommand`) and
//!   an in-process donor.
//! - [`runtime`]: the runtime configuration tests start from, and polling its counters.
//! - [`pages`]: reading, writing and stamping pages with values that name page and round.
//! - [`run`]: `farmem run` in the foreground or background, programs the tests need, scratch
//!   directories, the stats file.
//! - [`netns`]: hosts (network namespaces on veth links) with donors in them, and failures
//!   injected into them: crash, stall, cut link, restart.
//! - [`clients`]: free ports, connecting with retries, a RESP (redis) client, deterministic
//!   values.
//! - [`scenario`]: a scenario run in a process of its own (one that may end with a signal),
//!   stopped at `READY` until the test says `GO`.
//! - [`flood`]: a bounded flood of unauthenticated connections from many loopback sources, and
//!   a login over an emulated slow link that must get through it.
//! - [`sigpipe`]: running a scenario in a child process whose SIGPIPE action is the default.
//!
//! Every helper fails the test with a message saying what is missing or what went wrong; none
//! skips.

pub mod bins;
pub mod clients;
pub mod donor;
pub mod flood;
pub mod netns;
pub mod pages;
pub mod run;
pub mod runtime;
pub mod scenario;
pub mod sigpipe;
pub mod tree_rss;
