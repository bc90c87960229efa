//! `farmem bench …`: the benchmark commands, one subcommand each. This file only dispatches;
//! each benchmark lives in its own module (`bench_compare`, …) and owns its arguments.

use std::process::ExitCode;

use clap::{Args, Subcommand};

/// Arguments of `farmem bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

/// The benchmarks. Each variant: one line here, one arm in [`run`], one module in `cmd/`.
// Parsed once per run: the size difference between the argument structs does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Run one workload under local memory, farmem, Linux swap and zram, side by side.
    Compare(crate::cmd::bench_compare::CompareArgs),
    /// Compare farmem's donor with memcached: single-page read latency, batch read throughput.
    Donor(crate::cmd::bench_donor::BenchDonorArgs),
    /// Page-fault latency: userfaultfd floor, donor round trip, remote miss, pool hit.
    Fault(crate::cmd::bench_fault::BenchFaultArgs),
    /// Prefetching on seq and stride-10 scans: none vs buffer vs marker install, ratios to none.
    Prefetch(crate::cmd::bench_prefetch::BenchPrefetchArgs),
}

/// Runs the chosen benchmark.
pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        BenchCommand::Compare(a) => crate::cmd::bench_compare::run(a),
        BenchCommand::Donor(a) => crate::cmd::bench_donor::run(a),
        BenchCommand::Fault(a) => crate::cmd::bench_fault::run(a),
        BenchCommand::Prefetch(a) => crate::cmd::bench_prefetch::run(a),
    }
}
