//! One module per `farmem` subcommand.
pub mod doctor;
pub mod donor;
pub mod node;
pub mod preload;
pub mod run;
pub mod run_tree;
pub mod sim;
pub mod stale_dirs;
pub mod stats;
pub mod tenants;
pub mod top;
pub mod treemem;
pub mod units;
