//! The `farmem` binary: a thin shell over the library crates. Each subcommand lives in its own
//! file under `cmd/` and owns its argument struct; this file only parses and dispatches.
#![forbid(unsafe_code)]

mod cmd;

use clap::{Parser, Subcommand};

/// farmem: transparent remote memory for Linux programs.
///
/// A program runs with a local memory budget; the pages that do not fit live on donors
/// (processes lending idle memory, usually on other machines) and come back on access.
#[derive(Parser)]
#[command(name = "farmem", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    // Each subcommand: one variant here, one arm in `main`, one file in cmd/.
    /// Check this machine for farmem (read-only): kernel, userfaultfd, fault floor, a donor.
    ///
    /// Read-only: changes nothing on the machine. Checks the kernel version, userfaultfd
    /// access, each userfaultfd feature farmem needs, and takes two quick figures: the
    /// userfaultfd fault floor (a fault answered from memory) and a donor round trip (one 4 KiB
    /// page, from a donor started in this process on 127.0.0.1:0, or from --donor). With
    /// --donor: the token file, each donor (nothing there, token refused, or full), and the
    /// donors' room for far memory with --replicas copies against --far-mem. The host tier's
    /// node: usable, not running, or not for this user. Each grant userfaultfd needs that is
    /// missing (the device's permission, a seccomp filter, vm.unprivileged_userfaultfd) is named
    /// on a line of its own with how to give it, for a container or a host. One line per check: ok, note
    /// (farmem runs, without what it names) or FAILED with what to do. Exits with status 1 if
    /// any check failed.
    Doctor(cmd::doctor::DoctorArgs),
    /// Lend this machine's spare memory to farmem clients (a memory donor).
    Donor(cmd::donor::DonorArgs),
    /// Lend this machine's idle memory to every farmem program on it (the host tier).
    Node(cmd::node::NodeArgs),
    /// Run an unmodified program with a local memory budget, its heap paged to donors.
    #[command(
        after_help = "Signals: like a shell, `farmem run` lets a terminal's Ctrl-C \
        (SIGINT) and Ctrl-\\ (SIGQUIT) reach the program (its process group) and ignores them \
        itself, to report when the program ends; send them to the program or its process group, \
        not to `farmem run` alone. SIGTERM and SIGHUP sent to `farmem run` are passed on to \
        the program. `farmem run` killed with SIGKILL leaves the program running without its \
        node (pages it can no longer write back stay in it, over the budget); the next \
        `farmem run` removes the directories it left."
    )]
    Run(cmd::run::RunArgs),
    /// Simulate prefetchers and eviction policies on a page-access trace (recorded or generated).
    Sim(cmd::sim::SimArgs),
    /// Show a donor's capacity, use, clients, requests per second and service times.
    Stats(cmd::stats::StatsArgs),
    /// Watch this host live: its node, every farmem program on it, the donors they use.
    ///
    /// Redraws each second: the node (capacity, used, free, each client with its slabs and
    /// the program it belongs to), every program under `farmem run` on this host (local
    /// memory, resident and pooled, faults a second by source, prefetch accuracy, far slabs
    /// short of copies) and each donor they use (capacity, what this host holds there, the
    /// worst health a program sees, the round trip of a TCP connect). Keys: s cycles the
    /// order, r/f/p sort by resident, faults or pid, q (or Esc) quits. Root sees every
    /// program; another user only its own. --once prints one view (--json: as JSON) and exits.
    Top(cmd::top::TopArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The doctor's report is its output: the in-process donor's info lines would clutter it.
    let default_level = match cli.command {
        Command::Doctor(_) | Command::Top(_) => "warn",
        _ => "info",
    };
    init_logging(default_level);
    let result: anyhow::Result<std::process::ExitCode> = match cli.command {
        Command::Doctor(args) => cmd::doctor::run(args),
        Command::Donor(args) => cmd::donor::run(args),
        Command::Node(args) => cmd::node::run(args),
        Command::Run(args) => cmd::run::run(args),
        Command::Sim(args) => cmd::sim::run(args),
        Command::Stats(args) => cmd::stats::run(args),
        Command::Top(args) => cmd::top::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("farmem: error: {err:#}");
            let code = err
                .downcast_ref::<cmd::run::CommandError>()
                .map_or(1, |c| c.exit_code);
            std::process::ExitCode::from(code)
        }
    }
}

/// Logs go to stderr; `FARMEM_LOG` (or `RUST_LOG`) sets the filter, default `default_level`.
fn init_logging(default_level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("FARMEM_LOG")
        .ok()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| default_level.to_string());
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}
