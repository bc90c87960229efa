//! One module per `farmem` subcommand.
pub mod doctor;
pub mod donor;
pub mod node;
pub mod run;
pub mod run_tree;
pub mod sim;
pub mod stats;
pub mod tenants;
// Not used by `farmem run` yet: its process-tree accounting (being written) will start it.
#[cfg_attr(not(test), allow(dead_code))]
pub mod treemem;
pub mod units;
