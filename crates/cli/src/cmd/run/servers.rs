//! The servers `farmem run` starts for a program: the embedded donor and a private node.

use anyhow::Context;
use farmem_donor::{ChildDonor, ChildDonorCommand, ChildDonorError};

/// Starts a private `farmem node` for the program (the host tier of the embedded default).
pub(super) fn start_private_node(
    capacity_bytes: u64,
) -> anyhow::Result<farmem_runtime::PrivateNode> {
    let exe = std::env::current_exe().context("locating the farmem binary")?;
    farmem_runtime::PrivateNode::start(exe.clone(), capacity_bytes, 64 << 20, None).with_context(
        || {
            format!(
                "the private node did not start; run `{} node --socket /tmp/n.sock --capacity \
                 1GiB` to see why, or use --local-donor tcp",
                exe.display()
            )
        },
    )
}

/// Starts the embedded donor: a `farmem donor` child on 127.0.0.1, killed when dropped, and by
/// the kernel when `farmem run` dies (`--exit-with-parent`; spawned from the main thread, which
/// lives as long as the run). Its stderr is the user's: its warnings and errors show as they
/// happen.
pub(super) fn start_local_donor(capacity_bytes: u64) -> anyhow::Result<ChildDonor> {
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
