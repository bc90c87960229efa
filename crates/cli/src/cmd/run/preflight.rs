//! Checks `farmem run` makes before it starts the program, each with a message saying what to
//! do.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

use super::*;
use crate::cmd::units::human_bytes;

/// The fastest heal pace taken: no link farmem runs over carries more, so a larger rate
/// is a typo (and would leave healing unpaced without saying so).
pub(super) const MAX_HEAL_RATE_BYTES: u64 = 100 << 30;

/// Sizes that parse but cannot be meant: a mapping threshold or private-node capacity
/// beyond this machine's memory, a heal rate beyond any link.
pub fn check_sizes(args: &RunArgs) -> anyhow::Result<()> {
    if let Some(rate) = args.heal_rate.filter(|&r| r > MAX_HEAL_RATE_BYTES) {
        bail!(
            "--heal-rate {}/s is faster than any link farmem runs over: give at most {}/s \
             (the default, 256MiB, keeps the program's bandwidth)",
            human_bytes(rate),
            human_bytes(MAX_HEAL_RATE_BYTES)
        );
    }
    let Some(total) = farmem_donor::host::mem_total_bytes() else {
        return Ok(());
    };
    if args.mmap_threshold > total {
        bail!(
            "--mmap-threshold {} is more than this machine's memory ({}): no mapping that \
             large could be paged, so farmem would manage nothing; give a size such as \
             256KiB (the default)",
            human_bytes(args.mmap_threshold),
            human_bytes(total)
        );
    }
    if let Some(c) = args.local_donor_capacity.filter(|&c| c > total) {
        bail!(
            "--local-donor-capacity {} is more than this machine's memory ({}): give at \
             most {}",
            human_bytes(c),
            human_bytes(total),
            human_bytes(total)
        );
    }
    Ok(())
}

pub fn check_budget(budget_bytes: u64) -> anyhow::Result<()> {
    // Each process of the tree asks for a least share (`farmem_tree::LEAST_SHARE_BYTES`
    // of budget and a pool of a fifth); below that the coordinator grants the least share
    // anyway, over the limit (128 KiB ran with 1 MiB): the limit must hold at least one
    // process's, pool included.
    let min = farmem_contract::local::MIN_LOCAL_BYTES.max(2 * farmem_tree::LEAST_SHARE_BYTES);
    if budget_bytes < min {
        bail!(
            "--local-mem {} is below the minimum the runtime needs ({}): give at least {}",
            human_bytes(budget_bytes),
            human_bytes(min),
            human_bytes(min)
        );
    }
    if let Some(total) = farmem_donor::host::mem_total_bytes() {
        if budget_bytes > total {
            bail!(
                "--local-mem {} is more than this machine's memory ({}): give at most {}",
                human_bytes(budget_bytes),
                human_bytes(total),
                human_bytes(total)
            );
        }
    }
    Ok(())
}

/// Checks, before the program starts, that the output file `path` of `flag` can be
/// written the way farmem writes it ([`farmem_fds::files`]): an existing path must be this
/// user's regular file (not a link, a FIFO, a device or another user's file), and a file of
/// one byte must be creatable next to it (removed again). An existing file is left as it is.
pub fn check_writable(flag: &str, path: &Path) -> anyhow::Result<()> {
    farmem_fds::files::check_writable(path)
        .map_err(|e| anyhow::anyhow!("{flag} {}: cannot write there: {e}", path.display()))
}

pub fn check_userfaultfd() -> anyhow::Result<()> {
    farmem_uffd::Uffd::probe()
        .map(|_| ())
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// The runtime's own check of the name (the one place it is validated).
pub fn check_prefetch(name: &str) -> anyhow::Result<()> {
    farmem_runtime::check_prefetch(name).map_err(|e| anyhow::anyhow!("--prefetch {name}: {e}"))
}

pub fn check_evict(name: &str) -> anyhow::Result<()> {
    farmem_policy::evict::by_name(name)
        .map(|_| ())
        .map_err(|e| anyhow::anyhow!("--evict {name}: {e}"))
}

/// The node at `path` answers and can be trusted (its socket's owner and mode).
pub fn check_node(path: &Path) -> anyhow::Result<()> {
    farmem_node::NodeClient::connect(path, farmem_node::NodeClientConfig::default())
        .map(|_| ())
        .map_err(|e| anyhow::anyhow!("--node {}: {e}", path.display()))
}

/// Whether the host's node answers on the default socket. A socket nobody answers on (a
/// node that died) or this user may not use, a node that refuses the connection because it serves as many as it
/// may, and one that does not answer in time count as none; one that cannot be trusted is
/// an error.
pub fn host_node_answers() -> anyhow::Result<bool> {
    let path = farmem_node::default_socket_path();
    if !path.exists() {
        return Ok(false);
    }
    match farmem_node::NodeClient::connect(&path, farmem_node::NodeClientConfig::default()) {
        Ok(_) => Ok(true),
        Err(e @ farmem_node::NodeError::Connect { .. }) => {
            tracing::warn!("not using the host's node: {e}");
            Ok(false)
        }
        // A node that serves as many connections as it may, or is stuck, must not stop
        // the program: it runs on a private node instead.
        Err(e) if e.is_busy() => {
            tracing::warn!("not using the host's node at {}: {e}", path.display());
            Ok(false)
        }
        Err(e) => Err(anyhow::anyhow!(
            "the host's node at {}: {e} (or pass --local-donor tcp / --node PATH)",
            path.display()
        )),
    }
}

/// Checks the donors answer: one that cannot be reached is reported and left to the
/// runtime (which starts with the others); fails if none can be, or on any other error
/// (a refused token is a configuration error, never skipped).
pub fn check_donors(donors: &[String], token: Option<Vec<u8>>) -> anyhow::Result<()> {
    let mut unreachable = Vec::new();
    for d in donors {
        match check_donor(d, token.clone()) {
            Ok(()) => {}
            Err(DonorCheck::Unreachable(e)) => unreachable.push(e),
            Err(DonorCheck::Refused(e)) => return Err(e),
        }
    }
    if unreachable.len() == donors.len() && !donors.is_empty() {
        let first = unreachable.remove(0);
        return Err(first.context(format!(
            "none of the {} donor(s) can be reached",
            donors.len()
        )));
    }
    let answering = donors.len() - unreachable.len();
    for e in unreachable {
        eprintln!(
            "farmem: warning: {e:#}; starting with the {answering} donor(s) that answered (it \
             is used once it answers; its copies are made elsewhere meanwhile)"
        );
    }
    Ok(())
}

/// Why a donor check failed.
pub enum DonorCheck {
    /// Nothing answered (down, no route, not listening).
    Unreachable(anyhow::Error),
    /// It answered and refused (token, protocol): a configuration error.
    Refused(anyhow::Error),
}

/// The backup file as an absolute path, refused if it exists or its directory does not.
pub fn check_backup_file(p: &Path) -> anyhow::Result<PathBuf> {
    let abs = std::path::absolute(p).with_context(|| format!("--backup-file {}", p.display()))?;
    if abs.exists() {
        anyhow::bail!(
            "--backup-file {}: the file exists (it may be another program's backup); \
             remove it or choose another path",
            abs.display()
        );
    }
    match abs.parent() {
        Some(dir) if dir.is_dir() => Ok(abs),
        _ => anyhow::bail!(
            "--backup-file {}: its directory does not exist",
            abs.display()
        ),
    }
}

pub(super) fn check_donor(addr: &str, token: Option<Vec<u8>>) -> Result<(), DonorCheck> {
    let cfg = farmem_transport::ClientConfig {
        token,
        connect_timeout: Duration::from_secs(3),
        ..Default::default()
    };
    farmem_transport::DonorClient::connect(addr, cfg)
        .map(|_| ())
        .map_err(|e| {
            let unreachable = e.is_connection_failure();
            let e = anyhow::anyhow!("donor {addr}: {e}");
            if unreachable {
                DonorCheck::Unreachable(e)
            } else {
                DonorCheck::Refused(e)
            }
        })
}
