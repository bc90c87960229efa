//! One module per `farmem` subcommand.
pub mod donor;
pub mod run;
pub mod sim;
pub mod stats;
pub mod units;
