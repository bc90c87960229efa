//! Several "machines" in one test: donors in network namespaces of their own, reached over veth
//! links, and failures injected as they happen (a crash, a stall, a cut link, a restart).
//!
//! - [`Host`]: a namespace `fmt-PID-N` with loopback up, joined to the root namespace by a veth
//!   pair (`fmtPIDhN` / `fmtPIDnN`) on a /30 of 10.128.0.0/9; [`Host::partition`] /
//!   [`Host::heal_link`] take the host's end down and up.
//! - [`HostDonor`]: a `farmem donor` (with a token) in a host: [`HostDonor::crash`] (SIGKILL),
//!   [`HostDonor::stall`] / [`HostDonor::resume`] (SIGSTOP / SIGCONT),
//!   [`HostDonor::restart`] (a fresh donor on the same address and port).
//!
//! # Design
//!
//! - Everything is done with iproute2's `ip` (a test fails naming the package if it is
//!   missing), as root.
//! - Subnets are chosen under a file lock all test processes share, skipping any that overlaps
//!   an address or route of the root namespace, so parallel test processes never collide.
//! - Names carry the creating pid: a new host first removes the namespaces and links of the
//!   scheme whose process is gone (a test process killed before its drops ran). Donors die with
//!   the test thread that started them (`--exit-with-parent`).
//! - A cut link drops packets silently (the host's end is down, the root end keeps a permanent
//!   neighbour entry), so peers see timeouts, not resets: what a pulled cable or a dead switch
//!   does.
//!
//! # Limitations
//!
//! - No latency or loss emulation: the kernel here has no netem qdisc. The transport's
//!   `link_delay_us` (the runtime configuration's) emulates latency on the client side.
//! - A leftover whose pid was reused by an unrelated process is kept until that process ends.

mod donor;
mod host;
mod ip;
mod names;
mod stale;
mod subnet;

pub use donor::HostDonor;
pub use host::Host;
pub use names::ns_owner;
