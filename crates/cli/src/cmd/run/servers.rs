//! The servers `farmem run` starts for a program: what pages it (the host tier and the donors:
//! the host's node, a private node, the embedded donor) and the budget coordinator.

use anyhow::Context;
use farmem_donor::{ChildDonor, ChildDonorCommand, ChildDonorError};
use farmem_runtime::{PrivateNode, TierMode};
use farmem_tree::{Admission, Coordinator};

use super::{preflight, RunArgs};
use crate::cmd::run_tree::TreeDir;

/// What pages the program: the host tier, the donors, and the servers started for them (stopped
/// when this is dropped: the embedded donor first).
pub(super) struct Far {
    pub(super) tier: TierMode,
    pub(super) donors: Vec<String>,
    // Held only to keep them running.
    _local_donor: Option<ChildDonor>,
    _private_node: Option<PrivateNode>,
}

/// Picks the host tier and the donors, starting a private node or the embedded donor when none
/// is named, and checks that the donors answer and accept `token`.
pub(super) fn start_far(args: &RunArgs, token: Option<Vec<u8>>) -> anyhow::Result<Far> {
    let capacity = args
        .local_donor_capacity
        .unwrap_or((4u64 << 30).saturating_add(args.local_mem.saturating_mul(2)));
    // The host tier: the node named, the host's node, or a private one (see `--local-donor`).
    let mut private_node = None;
    let tier = if args.allocator_only {
        TierMode::Off
    } else if let Some(p) = &args.node {
        preflight::check_node(p)?;
        TierMode::Node(p.clone())
    } else if args.local_donor == "tcp" {
        TierMode::Off
    } else if preflight::host_node_answers()? {
        TierMode::Node(farmem_node::default_socket_path())
    } else if args.donors.is_empty() {
        let n = start_private_node(capacity)?;
        let path = n.socket().to_path_buf();
        private_node = Some(n);
        TierMode::Node(path)
    } else {
        TierMode::Off
    };
    let mut local_donor = None;
    let donors = if args.donors.is_empty() && tier == TierMode::Off && !args.allocator_only {
        let d = start_local_donor(capacity)?;
        let addr = d.addr().to_string();
        local_donor = Some(d);
        vec![addr]
    } else {
        args.donors.clone()
    };
    if !args.allocator_only {
        preflight::check_donors(&donors, token)?;
    }
    Ok(Far {
        tier,
        donors,
        _local_donor: local_donor,
        _private_node: private_node,
    })
}

/// The process tree's directory (every process's stats file) and the coordinator of the
/// shared budget.
pub(super) fn start_coordinator(args: &RunArgs) -> anyhow::Result<(TreeDir, Coordinator)> {
    let tree = TreeDir::create()?;
    // Only this run's descendants may take a share (orphans are reparented to us: we are the
    // tree's subreaper), so no other process of the user can claim the budget.
    let coordinator = Coordinator::start(
        &tree.socket(),
        args.local_mem / farmem_runtime::PAGE_SIZE as u64,
        Admission::Descendants {
            root: std::process::id(),
        },
    )
    .with_context(|| {
        format!(
            "starting the budget coordinator on {}",
            tree.socket().display()
        )
    })?;
    Ok((tree, coordinator))
}

/// Starts a private `farmem node` for the program (the host tier of the embedded default).
fn start_private_node(capacity_bytes: u64) -> anyhow::Result<PrivateNode> {
    let exe = std::env::current_exe().context("locating the farmem binary")?;
    PrivateNode::start(exe.clone(), capacity_bytes, 64 << 20, None).with_context(|| {
        format!(
            "the private node did not start; run `{} node --socket /tmp/n.sock --capacity \
                 1GiB` to see why, or use --local-donor tcp",
            exe.display()
        )
    })
}

/// Starts the embedded donor: a `farmem donor` child on 127.0.0.1, killed when dropped, and by
/// the kernel when `farmem run` dies (`--exit-with-parent`; spawned from the main thread, which
/// lives as long as the run). Its stderr is the user's: its warnings and errors show as they
/// happen.
fn start_local_donor(capacity_bytes: u64) -> anyhow::Result<ChildDonor> {
    let exe = std::env::current_exe().context("locating the farmem binary")?;
    ChildDonorCommand::new(&exe)
        .arg("--capacity")
        .arg(capacity_bytes.to_string())
        // the donor's per-connection logs are not the user's business here
        .env(
            "FARMEM_LOG",
            std::env::var("FARMEM_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .spawn()
        .map_err(|e| match e {
            ChildDonorError::Spawn { .. } => anyhow::Error::new(e).context(format!(
                "starting the embedded donor ({} donor)",
                exe.display()
            )),
            _ => anyhow::Error::new(e).context(format!(
                "the embedded donor did not start; run `{} donor --listen 127.0.0.1:0` to see why",
                exe.display()
            )),
        })
}
