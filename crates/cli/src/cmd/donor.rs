//! `farmem donor`: lend this machine's spare memory to farmem clients.
//!
//! Once the listening socket is bound, prints exactly one line to stdout,
//! the [`DonorBanner`] (`farmem donor listening on ADDR`), and flushes it: `farmem run`, the
//! runtime and the tests start child donors with `farmem_donor::ChildDonorCommand`, which reads
//! that line to learn the port. Everything else (logs)
//! goes to stderr. SIGINT or SIGTERM stops the donor cleanly (exit status 0); SIGHUP makes it
//! re-read `--capacity-file` (the owner's way to lower or raise a running donor's capacity).
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use farmem_donor::{DonorBanner, DonorConfig, DonorServer, Tenant};
use farmem_transport::MAX_TOKEN_LEN;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::cmd::units::{parse_duration, parse_size};

const DONOR_LONG_HELP: &str = "\
Lends up to --capacity bytes of this machine's memory, in slabs of --slab-size, to farmem clients \
(`farmem run --donor ADDR`). Memory is committed only when a client writes a page and returned \
to the system when its slab is freed.

Once listening, prints exactly one line to stdout, `farmem donor listening on ADDR` (with the \
real port when --listen ends in :0); logs go to stderr (FARMEM_LOG=debug for more). SIGINT or \
SIGTERM stops it cleanly with exit status 0.

Security: without --token-file or --tenants any local process may connect, so only loopback \
addresses are accepted; to serve other hosts, give --token-file (the same file on the clients) \
or --tenants, or, on a trusted network only, --insecure. The token never crosses the wire: \
clients prove it with an HMAC of a per-connection nonce. A token file holds the token's bytes \
(1 to 256) with one trailing newline stripped, so `echo secret > tok` works; it must not be \
readable by group or others (`chmod 600 FILE`). A client's slabs belong to a secret key only it \
holds: another client with the same token cannot read, overwrite or free them.

--capacity may not exceed this machine's memory (MemTotal) or the donor's memory cgroup limit; \
while the host's available memory (MemAvailable) is below 5 % of MemTotal (at least 256 MiB), \
the donor lends no new slabs (clients are told the donor is under memory pressure).

Taking memory back: the donor never drops a client's pages; it asks the clients to move slabs \
away (they poll it a few times a second, move the slabs' pages to another donor, then free \
them, which returns the memory to the system at once). It asks for the least recently written \
slabs, from the clients holding the most first, in two cases:
  --keep-free SIZE: whenever MemAvailable (read every 200 ms) falls below SIZE, enough written \
slabs to cover the shortfall; no new slabs are lent meanwhile.
  --capacity-file FILE: the capacity is read from FILE (a size such as 512MiB) at start and \
again on SIGHUP (`kill -HUP PID`), so only the donor's owner (or root) can change it; FILE must \
not be writable by group or others. Lowered below what is lent, the donor asks for the \
difference back and lends nothing new until under it; raised, it lends again. Unreadable or \
bad content (not a size, less than one slab, more than the machine's memory) is logged and the \
old capacity kept; the donor keeps serving.
A client that does not give slabs back is asked again and again (logged after 30 s); the donor \
keeps refusing new slabs to everyone until the memory is back.

Tenants (--tenants FILE, TOML; unknown keys are an error): each tenant has its own token file \
and a quota bounding all its clients together:
  [[tenant]]
  name = \"alice\"
  token_file = \"/etc/farmem/alice.token\"   # relative paths are relative to FILE's folder
  quota = \"4GiB\"                           # optional
  max_connections = 100                      # optional, instead of --max-conns-per-tenant

Connections: at most 1024 at once. Connections logging in are limited (256 in all, 64 per \
source network, an IPv4 /24 or IPv6 /64; 3 s to authenticate); a new one beyond these evicts \
one of the source holding the most, preferring addresses that never authenticated, so a flood \
evicts only itself. Authenticated connections share the other 768 slots: at most \
--max-conns-per-client per client id and --max-conns-per-tenant (or the tenant's \
max_connections) per tenant, and each tenant is guaranteed an even part of half of them (384 \
divided by the number of tenants); beyond its part a tenant takes only slots no other tenant's \
unused part needs. A connection beyond a bound is told which (\"tenant T has N connections, its \
bound ...\"), one beyond every slot \"donor full\". Log lines are rate-limited per peer address \
and per tenant (16 per 10 s each, then a count of those suppressed).

A client that disconnects keeps its slabs for --orphan-grace, so a reconnect finds its pages.

Examples:
  farmem donor --capacity 8GiB
  farmem donor --capacity-file /etc/farmem/capacity --keep-free 2GiB   # then: kill -HUP PID
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
    #[arg(
        long,
        value_parser = parse_size,
        value_name = "SIZE",
        required_unless_present = "capacity_file"
    )]
    pub capacity: Option<u64>,
    /// Read the capacity from FILE (a size, e.g. 512MiB) at start and again on SIGHUP, to
    /// lower or raise it while running (see below). Instead of --capacity.
    #[arg(long, value_name = "FILE", conflicts_with = "capacity")]
    pub capacity_file: Option<PathBuf>,
    /// Keep at least SIZE of the host's memory available: below it, lend nothing new and ask
    /// clients to move slabs away until the shortfall is covered.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub keep_free: Option<u64>,
    /// Read MemAvailable from FILE instead of /proc/meminfo (for tests).
    #[arg(long, value_name = "FILE", hide = true)]
    pub meminfo_file: Option<PathBuf>,
    /// Size of one slab (a multiple of 4 KiB). The default, 4 MiB, is the host tier's: a
    /// client packs its far slabs into a donor's slabs, and leaves at most one slab partly
    /// filled on each donor, so smaller slabs strand less capacity; an allocation is one round
    /// trip per slab.
    #[arg(long, default_value = "4MiB", value_parser = parse_size, value_name = "SIZE")]
    pub slab_size: u64,
    /// File holding the auth token clients must prove (1 to 256 bytes; one trailing newline
    /// is stripped; mode 600).
    #[arg(long, value_name = "FILE", conflicts_with = "tenants")]
    pub token_file: Option<PathBuf>,
    /// TOML file of tenants, each with its own token file and quota (see below).
    #[arg(long, value_name = "FILE")]
    pub tenants: Option<PathBuf>,
    /// Most memory one client id may hold.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub quota: Option<u64>,
    /// How long the slabs of a disconnected client are kept for it to reconnect.
    #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub orphan_grace: Duration,
    /// Most authenticated connections of one client id (default: no bound of its own beyond
    /// the pool; a runtime opens two per donor, plus one per forked child of its process tree
    /// reading the pages it lent that child).
    #[arg(long, default_value_t = farmem_donor::MAX_CONNS_PER_CLIENT, value_parser = parse_conn_bound, value_name = "N")]
    pub max_conns_per_client: usize,
    /// Most authenticated connections of one tenant, for tenants whose entry in --tenants sets
    /// no max_connections (default: only the fair-share rule, see below).
    #[arg(long, value_parser = parse_conn_bound, value_name = "N")]
    pub max_conns_per_tenant: Option<usize>,
    /// Serve Prometheus metrics over HTTP on this address (e.g. 127.0.0.1:9177).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Allow listening on a non-loopback address without a token.
    #[arg(long)]
    pub insecure: bool,
    /// Die with process PID (for embedded donors: the runtime names its own pid, and the
    /// donor dies when the thread that started it does). An embedded donor's --capacity is a
    /// computed default, so it is lowered to the host's memory instead of refused.
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

/// A connection bound: a positive whole number.
fn parse_conn_bound(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("0 would let no client connect; give at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a number of connections (e.g. 64)")),
    }
}

/// Reads an auth token file: the token is the file's bytes with one trailing newline stripped
/// (1 to 256 bytes). A file readable by group or others is refused.
pub fn read_token_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)
        .with_context(|| format!("reading the token file {}", path.display()))?;
    // A device, FIFO or directory holds no secret (and `chmod 600 /dev/full` is advice that
    // would break the machine): only a regular file is a token file.
    if !meta.is_file() {
        bail!(
            "the token file {} is not a regular file ({}); give a file holding the token \
             (e.g. `head -c 32 /dev/urandom | base64 > FILE && chmod 600 FILE`)",
            path.display(),
            file_kind(&meta)
        );
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!(
            "the token file {} is readable by others (mode {mode:04o}); run `chmod 600 {}`",
            path.display(),
            path.display()
        );
    }
    let bytes = std::fs::read(path)
        .with_context(|| format!("reading the token file {}", path.display()))?;
    let token = farmem_transport::token_from_file_bytes(&bytes);
    if token.is_empty() {
        bail!(
            "the token file {} is empty; put a secret of 1 to {MAX_TOKEN_LEN} bytes in it",
            path.display()
        );
    }
    if token.len() > MAX_TOKEN_LEN {
        bail!(
            "the token file {} holds a {}-byte token; a token is at most {MAX_TOKEN_LEN} bytes",
            path.display(),
            token.len()
        );
    }
    Ok(token.to_vec())
}

/// What a non-regular file is, for errors.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Reads a capacity file: one size (`512MiB`, `1GiB`, bytes), surrounding whitespace ignored.
/// A file writable by group or others is refused (only the donor's owner may change it), as is
/// a capacity of zero.
pub fn read_capacity_file(path: &Path) -> anyhow::Result<u64> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)
        .with_context(|| format!("reading the capacity file {}", path.display()))?;
    if !meta.is_file() {
        bail!(
            "the capacity file {} is not a regular file ({}); give a file holding one size \
             such as 4GiB",
            path.display(),
            file_kind(&meta)
        );
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        bail!(
            "the capacity file {} is writable by others (mode {mode:04o}); run `chmod go-w {}`",
            path.display(),
            path.display()
        );
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the capacity file {}", path.display()))?;
    let bytes = parse_size(text.trim()).map_err(|e| {
        anyhow::anyhow!(
            "the capacity file {} does not hold a size: {e}",
            path.display()
        )
    })?;
    if bytes == 0 {
        bail!(
            "the capacity file {} says 0: a donor needs at least one slab; to stop lending, stop the donor",
            path.display()
        );
    }
    Ok(bytes)
}

/// SIGHUP: re-reads `path` and applies the capacity; on any error logs it and keeps the old one.
fn reload_capacity(path: &Path, control: &farmem_donor::DonorControl) {
    let old = control.capacity_bytes();
    let applied = read_capacity_file(path).and_then(|bytes| {
        control
            .set_capacity_bytes(bytes)
            .map_err(anyhow::Error::from)
    });
    match applied {
        Ok(new) => tracing::info!(
            old_capacity_bytes = old,
            capacity_bytes = new,
            "SIGHUP: capacity read from {}",
            path.display()
        ),
        Err(e) => tracing::error!(
            capacity_bytes = old,
            "SIGHUP: keeping the capacity of {old} bytes: {e:#}"
        ),
    }
}

/// Reads a tenants file and every token file it names (relative to the file's folder).
pub fn read_tenants(path: &Path) -> anyhow::Result<Vec<Tenant>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the tenants file {}", path.display()))?;
    let specs = crate::cmd::tenants::parse_tenants(&text)
        .with_context(|| format!("the tenants file {} is invalid", path.display()))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    specs
        .into_iter()
        .map(|s| {
            let token = read_token_file(&dir.join(&s.token_file))
                .with_context(|| format!("tenant {:?}", s.name))?;
            Ok(Tenant {
                name: s.name,
                token,
                quota_bytes: s.quota_bytes,
                max_connections: s.max_connections,
            })
        })
        .collect()
}

/// Runs the donor until SIGINT/SIGTERM.
pub fn run(args: DonorArgs) -> anyhow::Result<ExitCode> {
    if let Some(pid) = args.exit_with_parent {
        exit_with_parent(pid)?;
    }
    let server = DonorServer::bind(config(&args)?).context("starting the donor")?;
    let (signals_handle, watcher) = watch_signals(&server, args.capacity_file.clone())?;
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

/// The donor's configuration from the flags and the files they name.
fn config(args: &DonorArgs) -> anyhow::Result<DonorConfig> {
    let token = args
        .token_file
        .as_deref()
        .map(read_token_file)
        .transpose()?;
    let tenants = match &args.tenants {
        Some(f) => read_tenants(f)?,
        None => Vec::new(),
    };
    let capacity = match (args.capacity, &args.capacity_file) {
        (Some(c), _) => c,
        (None, Some(f)) => read_capacity_file(f)?,
        (None, None) => bail!("give --capacity SIZE or --capacity-file FILE"),
    };
    let capacity_bytes = match (
        args.exit_with_parent,
        farmem_donor::host::memory_limit_bytes(),
    ) {
        (Some(_), Some((limit, _))) => capacity.min(limit),
        _ => capacity,
    };
    // Against the machine's memory; a --meminfo-file (tests) describes another machine.
    if let (Some(k), None) = (args.keep_free, &args.meminfo_file) {
        farmem_donor::host::check_keep_free(k).map_err(anyhow::Error::msg)?;
    }
    Ok(DonorConfig {
        listen: args.listen.clone(),
        capacity_bytes,
        slab_size_bytes: args.slab_size,
        token,
        tenants,
        quota_bytes: args.quota,
        max_conns_per_client: args.max_conns_per_client,
        max_conns_per_tenant: args.max_conns_per_tenant,
        orphan_grace: args.orphan_grace,
        insecure: args.insecure,
        metrics_listen: args.metrics.clone(),
        keep_free_bytes: args.keep_free.filter(|&b| b > 0),
        meminfo_path: args
            .meminfo_file
            .clone()
            .unwrap_or_else(|| PathBuf::from(farmem_donor::host::MEMINFO)),
        ..DonorConfig::default()
    })
}

/// A thread that stops the donor on SIGINT/SIGTERM and reloads `capacity_file` on SIGHUP.
fn watch_signals(
    server: &DonorServer,
    capacity_file: Option<PathBuf>,
) -> anyhow::Result<(signal_hook::iterator::Handle, std::thread::JoinHandle<()>)> {
    let handle = server.shutdown_handle();
    let control = server.control();
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP])
        .context("installing the SIGINT/SIGTERM/SIGHUP handlers")?;
    let signals_handle = signals.handle();
    let watcher = std::thread::Builder::new()
        .name("farmem-donor-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if sig == SIGHUP {
                    match &capacity_file {
                        Some(f) => reload_capacity(f, &control),
                        None => tracing::warn!(
                            "SIGHUP ignored: the donor was started without --capacity-file"
                        ),
                    }
                    continue;
                }
                tracing::info!(signal = sig, "signal received; stopping the donor");
                handle.shutdown();
                break;
            }
        })
        .context("starting the signal thread")?;
    Ok((signals_handle, watcher))
}
