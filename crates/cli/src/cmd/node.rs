//! `farmem node`: the host tier, lending this machine's idle memory to every farmem program on
//! it; and `farmem node --resize SIZE`, the control client that changes a running node's
//! capacity.
//!
//! Once the socket listens, prints exactly one line to stdout, the [`NodeBanner`]
//! (`farmem node listening on PATH`), and flushes it; logs go to stderr. SIGINT or SIGTERM stops
//! the node cleanly (exit status 0; the socket file is removed).
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use farmem_node::{
    MaxShare, NodeBanner, NodeClient, NodeClientConfig, NodeConfig, NodeServer, DEFAULT_SOCKET_PATH,
};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::cmd::units::human_bytes;
use crate::cmd::units::parse_size;

const NODE_LONG_HELP: &str = "\
What it is for: one node per machine holds the host tier, memory of this machine that no \
program is using, lent to every farmem program on the machine (`farmem run`). A program's pages \
that do not fit its local budget go to the node first (shared memory: one copy each way, no \
network), and only then to remote donors. The node allocates each slab's pages itself, so they \
are charged to the node's memory cgroup, never to a program's container.

Who may connect: the socket (default /run/farmem/node.sock) is created with mode 0660 \
(--socket-mode), so its owner and group may connect, nobody else; --socket-group GROUP gives it \
to a group whose members should use the host tier (a user outside it is told it may not use the \
node, not that none runs); every client is identified by its pid, uid and gid \
(logged). Clients check the socket before trusting it with their pages: it must be owned by root \
or by the client's own user, not writable by others, in a folder others cannot write (or with \
the sticky bit). Only root or the node's own user may change its capacity (--resize).

Limits: --capacity may not exceed this machine's memory (MemTotal) or the node's memory cgroup \
limit. The node never lends more than --capacity; a client asking for more is told the tier is \
full, and its pages go to remote donors.

Under pressure: with --keep-free SIZE the node checks the host's available memory (MemAvailable) \
four times a second; below SIZE it lends no new slabs and asks its clients, largest users first, \
to give back enough slabs to cover the shortfall (they move those pages to their donors, or back \
into their own memory: nothing is lost). A --resize below the memory in use does the same for \
the excess (--resize 0 drains the node: every client is asked for all it holds).

A client that disconnects or dies gets its slabs freed (their memory returned to the host at \
once). A client that sends garbage is disconnected; the others keep being served. One user \
(uid) may keep at most --max-clients-per-uid connections, and the users other than root and the \
node's own at most seven eighths of --max-clients in all (the rest is kept for root and the \
node's user); its processes at most 1024 holds (slabs a forked child may still \
read), so no user can lock the others out; a program that finds the host's node full (farmem \
run's default) runs without it. The node raises its open-files limit to the hard limit at \
start: it keeps a descriptor per slab and per hold, and two per connection.

Sharing between users: while only one user (uid) wants memory it may hold the whole capacity. \
When another user is refused a slab it is entitled to, each user's fair share is the capacity \
divided among the users holding or wanting slabs: a user at its share is refused more (its \
programs put their pages elsewhere, or on a private node of their own), and the users above it \
are asked to give the excess back (nothing is lost). --max-share-per-uid bounds every user \
always, root included. A user other than root and the node's own sees only its own clients in \
`farmem stats --node` (and the node's totals).

Once listening, prints exactly one line to stdout, `farmem node listening on PATH`; logs go to \
stderr (FARMEM_LOG=debug for more). SIGINT or SIGTERM stops it cleanly with exit status 0.

Examples:
  farmem node --capacity 8GiB --keep-free 1GiB
  farmem node --capacity 2GiB --socket /tmp/farmem/node.sock --metrics 127.0.0.1:9178
  farmem node --resize 4GiB        (ask the running node to change its capacity)";

/// Arguments of `farmem node`.
#[derive(Args, Debug)]
#[command(after_long_help = NODE_LONG_HELP)]
pub struct NodeArgs {
    /// Most memory to lend, in whole slabs: e.g. 8GiB, 512MiB, or bytes.
    #[arg(long, value_parser = parse_size, value_name = "SIZE", required_unless_present = "resize")]
    pub capacity: Option<u64>,
    /// Lend no new slabs, and ask clients for slabs back, while the host's available memory
    /// (MemAvailable) is below SIZE.
    #[arg(long, value_parser = parse_size, value_name = "SIZE", conflicts_with = "resize")]
    pub keep_free: Option<u64>,
    /// The Unix socket to listen on (its folder is created if missing).
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET_PATH)]
    pub socket: PathBuf,
    /// Serve Prometheus metrics over HTTP on this address (e.g. 127.0.0.1:9178).
    #[arg(long, value_name = "ADDR", conflicts_with = "resize")]
    pub metrics: Option<String>,
    /// Give the socket to this group (a name or a gid): its members may connect (with the
    /// default --socket-mode 0660). Default: the node's own group.
    #[arg(long, value_parser = parse_group, value_name = "GROUP", conflicts_with = "resize")]
    pub socket_group: Option<u32>,
    /// The socket's permissions: 0660 (its owner and group may connect) or 0600 (its owner
    /// only). Never open to others: clients refuse a socket anyone may write.
    #[arg(long, value_parser = parse_socket_mode, value_name = "MODE", default_value = "0660", conflicts_with = "resize")]
    pub socket_mode: u32,
    /// Most client connections served at once (the next are refused, and those programs run
    /// without the host tier).
    #[arg(long, default_value_t = farmem_node::MAX_CLIENTS as u32, value_parser = clap::value_parser!(u32).range(1..=65536), value_name = "N", conflicts_with = "resize")]
    pub max_clients: u32,
    /// Most connections of one user (uid) served at once; root and the node's own user are
    /// bound by --max-clients only.
    #[arg(long, default_value_t = farmem_node::MAX_CLIENTS_PER_UID as u32, value_parser = clap::value_parser!(u32).range(1..=65536), value_name = "N", conflicts_with = "resize")]
    pub max_clients_per_uid: u32,
    /// Most one user (uid) may hold, always: a size (e.g. 2GiB) or a percentage of the
    /// capacity (e.g. 50%). Root and the node's own user too. Without it, each user may hold
    /// everything while no other user wants memory, and its fair share (the capacity divided
    /// among the users that hold or want slabs) when others do.
    #[arg(long, value_parser = parse_max_share, value_name = "SIZE|PERCENT", conflicts_with = "resize")]
    pub max_share_per_uid: Option<MaxShare>,
    /// Size of one slab (a multiple of 4 KiB).
    #[arg(long, default_value = "4MiB", value_parser = parse_size, value_name = "SIZE", conflicts_with = "resize")]
    pub slab_size: u64,
    /// Do not start a node: ask the node on --socket to change its capacity to SIZE, print the
    /// outcome and exit (root or the node's own user only).
    #[arg(long, value_parser = parse_size, value_name = "SIZE", conflicts_with = "capacity")]
    pub resize: Option<u64>,
    /// Die with process PID (for a private node started by the runtime). A private node's
    /// --capacity is a computed default, so it is lowered to the host's memory instead of
    /// refused.
    #[arg(long, value_name = "PID", hide = true, conflicts_with = "resize")]
    pub exit_with_parent: Option<u32>,
}

/// Runs the node until SIGINT/SIGTERM, or sends one RESIZE.
pub fn run(args: NodeArgs) -> anyhow::Result<ExitCode> {
    if let Some(size) = args.resize {
        return resize(&args.socket, size);
    }
    if let Some(pid) = args.exit_with_parent {
        farmem_node::exit_with_parent(pid)?;
    }
    let Some(mut capacity_bytes) = args.capacity else {
        bail!("--capacity SIZE is required to start a node");
    };
    if args.exit_with_parent.is_some() {
        if let Some((limit, _)) = farmem_donor::host::memory_limit_bytes() {
            capacity_bytes = capacity_bytes.min(limit);
        }
    }
    if let Some(k) = args.keep_free {
        farmem_donor::host::check_keep_free(k).map_err(anyhow::Error::msg)?;
    }
    let cfg = NodeConfig {
        socket_path: args.socket.clone(),
        capacity_bytes,
        slab_bytes: args.slab_size,
        keep_free_bytes: args.keep_free,
        metrics_listen: args.metrics.clone(),
        socket_group: args.socket_group,
        socket_mode: args.socket_mode,
        max_clients: args.max_clients as usize,
        max_clients_per_uid: args.max_clients_per_uid as usize,
        max_share_per_uid: args.max_share_per_uid,
        ..NodeConfig::default()
    };
    // A descriptor per client, slab and hold: take all the kernel allows this process.
    farmem_node::raise_open_files_limit();
    let server = NodeServer::bind(cfg).context("starting the node")?;
    let handle = server.shutdown_handle();
    let mut signals =
        Signals::new([SIGINT, SIGTERM]).context("installing the SIGINT/SIGTERM handlers")?;
    let signals_handle = signals.handle();
    let watcher = std::thread::Builder::new()
        .name("farmem-node-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                tracing::info!(signal = sig, "signal received; stopping the node");
                handle.shutdown();
            }
        })
        .context("starting the signal thread")?;
    if let Some(m) = server.metrics_addr() {
        tracing::info!("metrics at http://{m}/metrics");
    }
    tracing::info!(
        capacity = %human_bytes(capacity_bytes),
        slab = %human_bytes(args.slab_size),
        keep_free = %args.keep_free.map_or_else(|| "off".to_string(), human_bytes),
        "node ready"
    );
    {
        let banner = NodeBanner {
            path: server.socket_path().to_path_buf(),
        };
        let mut out = std::io::stdout().lock();
        // A closed stdout (the parent stopped reading) must not stop the node.
        let _ = writeln!(out, "{banner}");
        let _ = out.flush();
    }
    let result = server.run();
    signals_handle.close();
    let _ = watcher.join();
    result.context("the node failed")?;
    Ok(ExitCode::SUCCESS)
}

/// `--max-share-per-uid SIZE|PERCENT`.
fn parse_max_share(text: &str) -> Result<MaxShare, String> {
    MaxShare::parse(text, parse_size).map_err(|e| e.to_string())
}

/// `--socket-group`: a group name, or a numeric gid.
fn parse_group(s: &str) -> Result<u32, String> {
    if let Ok(gid) = s.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(s) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => Err(format!(
            "no group named {s:?} on this machine (see /etc/group; create it with `groupadd {s}`, or give a numeric gid)"
        )),
        Err(e) => Err(format!("cannot look up group {s:?}: {e}")),
    }
}

/// `--socket-mode`: octal, 0660 or 0600.
fn parse_socket_mode(s: &str) -> Result<u32, String> {
    let mode = u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|_| format!("{s:?} is not an octal mode: give 0660 or 0600"))?;
    if !farmem_node::socket_mode_allowed(mode) {
        return Err(format!(
            "mode {mode:04o} is not allowed: give 0660 (owner and group may connect) or 0600 (owner only); clients refuse a socket others may write"
        ));
    }
    Ok(mode)
}

/// `farmem node --resize SIZE`: one RESIZE to the node on `socket`.
fn resize(socket: &std::path::Path, capacity_bytes: u64) -> anyhow::Result<ExitCode> {
    let client = NodeClient::connect(socket, NodeClientConfig::default())
        .with_context(|| format!("reaching the node on {}", socket.display()))?;
    let before = client.info().capacity_bytes;
    client
        .resize(capacity_bytes)
        .context("the node did not change its capacity")?;
    let stats = client.stats().context("asking the node for its figures")?;
    println!(
        "node on {}: capacity {} -> {} ({} in use{})",
        socket.display(),
        human_bytes(before),
        human_bytes(stats.capacity_bytes),
        human_bytes(stats.used_bytes),
        if stats.used_bytes > stats.capacity_bytes {
            "; clients were asked to give back the excess"
        } else {
            ""
        }
    );
    Ok(ExitCode::SUCCESS)
}
