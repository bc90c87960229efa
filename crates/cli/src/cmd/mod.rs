//! One module per `farmem` subcommand.
pub mod bench;
pub mod bench_compare;
pub mod bench_donor;
pub mod bench_fault;
pub mod bench_prefetch;
pub mod donor;
pub mod run;
pub mod sim;
pub mod stats;
pub mod tenants;
pub mod units;
