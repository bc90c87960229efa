//! `farmem donor`: lend this machine's spare memory to farmem clients.
//!
//! Once the listening socket is bound, prints exactly one line to stdout,
//! the [`DonorBanner`] (`farmem donor listening on ADDR`), and flushes it: `farmem run`, the
//! runtime and the tests start child donors with `farmem_donor::ChildDonorCommand`, which reads
//! that line to learn the port. Everything else (logs)
//! goes to stderr. SIGINT or SIGTERM stops the donor cleanly (exit status 0).
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use farmem_donor::{DonorBanner, DonorConfig, DonorServer};
use farmem_transport::MAX_TOKEN_LEN;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::cmd::units::{parse_duration, parse_size};

const DONOR_LONG_HELP: &str = "\
Lends up to --capacity bytes of this machine's memory, in slabs of --slab-size, to farmem clients \
(`farmem run --donor ADDR`). Memory is committed only when a client writes a page and returned \
to the system when its slab is freed.

Once listening, prints exactly one line to stdout, `farmem donor listening on ADDR` (with the \
real port when --listen ends in :0); logs go to stderr (FARMEM_LOG=debug for more). SIGINT or \
SIGTERM stops it cleanly with exit status 0.

Security: without --token-file any local process may connect, so only loopback addresses are \
accepted; to serve other hosts, give --token-file (the same file on the clients) or, on a \
trusted network only, --insecure. Client ids are names, not credentials.

A client that disconnects keeps its slabs for --orphan-grace, so a reconnect finds its pages.

Examples:
  farmem donor --capacity 8GiB
  farmem donor --listen 0.0.0.0:7070 --capacity 8GiB --token-file /etc/farmem/token --metrics 127.0.0.1:9177";

/// Arguments of `farmem donor`.
#[derive(Args, Debug)]
#[command(after_long_help = DONOR_LONG_HELP)]
pub struct DonorArgs {
    /// Address to listen on, HOST:PORT (port 0 picks a free port). Without a token only
    /// loopback addresses are allowed (see --insecure).
    #[arg(long, default_value = "127.0.0.1:7070", value_name = "ADDR")]
    pub listen: String,
    /// Most memory to lend, in whole slabs: e.g. 1GiB, 512MiB, or bytes.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub capacity: u64,
    /// Size of one slab (a multiple of 4 KiB).
    #[arg(long, default_value = "64MiB", value_parser = parse_size, value_name = "SIZE")]
    pub slab_size: u64,
    /// File holding the auth token clients must present (its bytes, exactly, at most 256).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Most memory one client id may hold.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub quota: Option<u64>,
    /// How long the slabs of a disconnected client are kept for it to reconnect.
    #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub orphan_grace: Duration,
    /// Serve Prometheus metrics over HTTP on this address (e.g. 127.0.0.1:9177).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Allow listening on a non-loopback address without a token.
    #[arg(long)]
    pub insecure: bool,
    /// Die with process PID (for embedded donors: the runtime names its own pid, and the
    /// donor dies when the thread that started it does).
    #[arg(long, value_name = "PID", hide = true)]
    pub exit_with_parent: Option<i32>,
}

/// Arranges to be killed when the parent goes away. Done here rather than between fork and
/// exec in the parent: a `pre_exec` hook makes std fork the whole process instead of
/// `posix_spawn`, and a fork marks every page of the parent's far-memory regions shared
/// copy-on-write, which UFFDIO_MOVE then refuses to evict.
fn exit_with_parent(pid: i32) -> anyhow::Result<()> {
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .context("asking to die with the parent (PR_SET_PDEATHSIG)")?;
    // The parent may have died before the request above: then we were re-parented already.
    if nix::unistd::getppid().as_raw() != pid {
        bail!(
            "--exit-with-parent {pid}: that process is not our parent (gone already?); not starting"
        );
    }
    Ok(())
}

/// Reads an auth token file: the token is the file's bytes, exactly (1 to 256 bytes).
pub fn read_token_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    let token = std::fs::read(path)
        .with_context(|| format!("reading the token file {}", path.display()))?;
    if token.is_empty() {
        bail!(
            "the token file {} is empty; put a secret of 1 to {} bytes in it",
            path.display(),
            MAX_TOKEN_LEN
        );
    }
    if token.len() > MAX_TOKEN_LEN {
        bail!(
            "the token file {} holds {} bytes; a token is at most {} bytes",
            path.display(),
            token.len(),
            MAX_TOKEN_LEN
        );
    }
    Ok(token)
}

/// Runs the donor until SIGINT/SIGTERM.
pub fn run(args: DonorArgs) -> anyhow::Result<ExitCode> {
    if let Some(pid) = args.exit_with_parent {
        exit_with_parent(pid)?;
    }
    let token = args
        .token_file
        .as_deref()
        .map(read_token_file)
        .transpose()?;
    let cfg = DonorConfig {
        listen: args.listen.clone(),
        capacity_bytes: args.capacity,
        slab_size_bytes: args.slab_size,
        token,
        quota_bytes: args.quota,
        orphan_grace: args.orphan_grace,
        insecure: args.insecure,
        metrics_listen: args.metrics.clone(),
        ..DonorConfig::default()
    };
    let server = DonorServer::bind(cfg).context("starting the donor")?;
    let handle = server.shutdown_handle();
    let mut signals =
        Signals::new([SIGINT, SIGTERM]).context("installing the SIGINT/SIGTERM handlers")?;
    let signals_handle = signals.handle();
    let watcher = std::thread::Builder::new()
        .name("farmem-donor-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                tracing::info!(signal = sig, "signal received; stopping the donor");
                handle.shutdown();
            }
        })
        .context("starting the signal thread")?;
    if let Some(m) = server.metrics_addr() {
        tracing::info!("metrics at http://{m}/metrics");
    }
    {
        let mut out = std::io::stdout().lock();
        // A closed stdout (the parent stopped reading) must not stop the donor.
        let banner = DonorBanner {
            addr: server.local_addr(),
        };
        let _ = writeln!(out, "{banner}");
        let _ = out.flush();
    }
    let result = server.run();
    signals_handle.close();
    let _ = watcher.join();
    result.context("the donor failed")?;
    Ok(ExitCode::SUCCESS)
}
