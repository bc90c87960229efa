//! One module per `farmem` subcommand.
pub mod bench;
pub mod bench_compare;
pub mod sim;
