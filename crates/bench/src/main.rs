//! The `farmem-bench` binary: farmem's benchmarks, one subcommand each, kept out of the `farmem`
//! binary because `compare` changes the machine (switches host swap off, creates zram devices
//! and memory cgroups, drops the page cache). This file only parses and dispatches; each
//! benchmark lives in its own module and owns its arguments.
//!
//! Benchmarks that run programs under farmem (`compare`) use the `farmem` binary beside this
//! one ([`farmem_bin`]).
#![deny(unsafe_code)]

mod compare;
mod donor;
mod fault;
mod measure;
#[allow(unsafe_code)]
mod mem;
mod netns;
mod prefetch;
mod replicas;
mod soak;
/// Sizes on the command line (`64MiB`, `1GiB`): the `farmem` binary's parser, compiled into this
/// binary too so both accept sizes alike (one source, not a copy).
#[path = "../../cli/src/cmd/units.rs"]
// Its duration parser is used by `farmem` only.
#[allow(dead_code)]
mod units;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// farmem-bench: farmem's benchmarks, every figure a ratio to a baseline measured in the same
/// run on the same machine.
///
/// `compare` needs root and changes the machine while it runs (host swap off, a swap file or a
/// zram device, memory cgroups, dropped page cache); it undoes every change on exit, including
/// on SIGINT/SIGTERM. The other benchmarks change nothing outside their own process.
/// Programs run under farmem with the `farmem` binary beside this one.
#[derive(Parser)]
#[command(name = "farmem-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The benchmarks. Each variant: one line here, one arm in `main`, one module.
// Parsed once per run: the size difference between the argument structs does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run one workload under local memory, farmem, Linux swap and zram, side by side.
    Compare(compare::CompareArgs),
    /// Compare farmem's donor with memcached: single-page read latency, batch read throughput.
    Donor(donor::BenchDonorArgs),
    /// Page-fault latency: userfaultfd floor, donor round trip, remote miss, pool hit.
    Fault(fault::BenchFaultArgs),
    /// Prefetching on seq and stride-10 scans: none vs buffer vs marker install, ratios to none.
    Prefetch(prefetch::BenchPrefetchArgs),
    /// Replicas: cost (replicas 2 vs 1 on compare workloads), failover latency after a donor
    /// crash or stall, time to re-replicate a lost donor's slabs.
    Replicas(replicas::BenchReplicasArgs),
    /// Soak: self-checking programs under farmem on a host tier and three donors in network
    /// namespaces for N minutes, failures injected from a printed seed; a verdict, not a figure.
    Soak(soak::SoakArgs),
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Compare(a) => compare::run(a),
        Command::Donor(a) => donor::run(a),
        Command::Fault(a) => fault::run(a),
        Command::Prefetch(a) => prefetch::run(a),
        Command::Replicas(a) => replicas::run(a),
        Command::Soak(a) => soak::run(a),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("farmem-bench: error: {err:#}");
            ExitCode::from(1)
        }
    }
}

/// The `farmem` binary beside this executable (the benchmarks run `farmem run` from it), or an
/// error naming the path where it was looked for.
pub fn farmem_bin() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find the farmem-bench executable's path")?;
    let farmem = exe.with_file_name("farmem");
    anyhow::ensure!(
        farmem.is_file(),
        "the farmem binary is missing at {}: farmem-bench runs the farmem beside it; install both \
         from the same build (cargo build --release builds both into target/release/)",
        farmem.display()
    );
    Ok(farmem)
}

/// Logs go to stderr; `FARMEM_LOG` (or `RUST_LOG`) sets the filter, default `info`.
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("FARMEM_LOG")
        .ok()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "info".to_string());
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}
