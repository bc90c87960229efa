//! Connecting the far side ([`Far::connect`]): the host tier, the donors (or the embedded
//! one), how many copies each slab keeps, the far slab size, sealing, the backup file and what
//! a forked child borrows from its parent — one step each.

use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicU64, AtomicU8};
use std::time::Duration;

use farmem_transport::{ClientConfig, DonorClient};

use crate::config::RuntimeConfig;
use crate::embedded::EmbeddedDonor;
use crate::error::RuntimeError;
use crate::far::backup::Backup;
use crate::far::health::Cause;
use crate::far::health::Health;
use crate::far::tier::Tier;
use crate::far::{Donor, Far, Home, Parts, GEOMETRY_KNOWN, GEOMETRY_UNKNOWN};
use crate::lentdonors::Borrowed;
use crate::readtimes::FAULT_PATH_SPIN;
use crate::slabs::pack::Pack;
use crate::slabs::replicas::MAX_REPLICAS;
use crate::slabs::seal::Sealer;
use crate::sync::Mutex;
use farmem_contract::SealMode;
use farmem_proto::PAGE_SIZE;

/// What this client tells its donors it is (IDENT), for their operators: the program's name,
/// its pid and this host's name.
fn client_label() -> String {
    let program = std::fs::read_to_string("/proc/self/comm")
        .map(|c| c.trim_end().to_string())
        .unwrap_or_else(|_| "?".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim_end().to_string())
        .unwrap_or_else(|_| "?".into());
    format!("{program} pid {} on {host}", std::process::id())
}

/// Whether `addr` (HOST:PORT) names this host: a loopback address, or one a socket can bind
/// here.
fn on_this_host(addr: &str) -> bool {
    let Ok(resolved) = addr.to_socket_addrs() else {
        return false;
    };
    let mut any = false;
    for a in resolved {
        any = true;
        let ip = a.ip();
        if !ip.is_loopback() && UdpSocket::bind(SocketAddr::new(ip, 0)).is_err() {
            return false;
        }
    }
    any
}

/// Whether a connect error means the donor cannot be reached (down, no route, not
/// listening), rather than a configuration error (refused HELLO, bad token).
fn is_unreachable(e: &RuntimeError) -> bool {
    match e {
        RuntimeError::Donor { source, .. } => matches!(
            source,
            farmem_transport::TransportError::Connect { .. }
                | farmem_transport::TransportError::Timeout { .. }
                | farmem_transport::TransportError::Disconnected { .. }
        ),
        _ => false,
    }
}

impl Far {
    /// Opens the host tier and connects to the configured donors; with neither, starts the
    /// embedded TCP donor. A donor that cannot be reached is reported and left out as long as
    /// another one answers (fewer than `--replicas` left: the slabs run degraded, said once).
    pub(crate) fn connect(cfg: &RuntimeConfig) -> Result<Far, RuntimeError> {
        let tier = Tier::open(cfg)?;
        let ccfg = client_config(cfg);
        let (addrs, embedded) = if cfg.donors.is_empty() && tier.is_none() {
            let e = EmbeddedDonor::start(cfg)?;
            (vec![e.addr.clone()], Some(e))
        } else {
            (cfg.donors.clone(), None)
        };
        let donors = connect_donors(&addrs, &ccfg)?;
        let answered = donors.iter().filter(|d| d.health.is_live()).count();
        let replicas = replicas_for(cfg, &addrs, answered)?;
        let slab_pages = far_slab_pages(&donors, tier.as_ref(), &addrs)?;
        let sealer = sealer_for(cfg, &addrs, embedded.is_some())?;
        let backup = match &cfg.backup_file {
            Some(path) => Some(Backup::create(path)?),
            None => None,
        };
        let (borrowed, lent) = borrowed_donors(cfg, &ccfg, donors.len());
        let far = Far::from_parts(Parts {
            donors,
            borrowed,
            borrowed_index: lent.index,
            far_floor: cfg.far_floor,
            lent: cfg.lent_donors.clone(),
            client_base: ccfg,
            slab_pages,
            replicas,
            tier,
            sealer,
            backup,
            embedded,
        });
        if let Some(l) = cfg
            .lent_donors
            .as_ref()
            .filter(|l| l.slab_pages() != far.slab_pages)
        {
            return Err(RuntimeError::Config(format!(
                "borrowing pages lent on donors: the parent's slabs are {} pages, this \
                 runtime's {}",
                l.slab_pages(),
                far.slab_pages
            )));
        }
        for (idx, r) in lent.homes {
            far.set_home(idx, Some(Home::Borrowed(r)));
        }
        Ok(far)
    }
}

/// How every donor connection of this runtime is made: a random client id and reconnect key
/// (ClientConfig::default), shared by every connection, so they attach to one client on each
/// donor.
fn client_config(cfg: &RuntimeConfig) -> ClientConfig {
    ClientConfig {
        token: cfg.token.clone(),
        request_timeout: cfg.request_timeout,
        link_delay_us: cfg.link_delay_us,
        thread_hook: cfg.thread_hook.clone(),
        label: Some(client_label()),
        ..ClientConfig::default()
    }
}

/// Two connections to each donor in `addrs` (fault-path reads; write-back). A donor that
/// cannot be reached is left out with a warning while another answers; a refused token or
/// HELLO is a configuration error, never skipped.
fn connect_donors(addrs: &[String], ccfg: &ClientConfig) -> Result<Vec<Donor>, RuntimeError> {
    let mut donors = Vec::new();
    let mut unreachable = Vec::new();
    for a in addrs {
        let connect = |purpose: &'static str, spin: Duration| {
            DonorClient::connect(
                a,
                ClientConfig {
                    spin,
                    ..ccfg.clone()
                },
            )
            .map_err(|source| RuntimeError::Donor {
                addr: a.clone(),
                step: purpose,
                source,
            })
        };
        // Only the fault path's reads spin while waiting (see ClientConfig::spin): spinning
        // on write-back and prefetch batches slowed a sequential scan by 20-40% on this
        // 2-core machine, where it takes CPU from the pipeline.
        let clients = connect("connecting (fault path)", FAULT_PATH_SPIN)
            .and_then(|read| Ok((read, connect("connecting (write-back)", Duration::ZERO)?)));
        match clients {
            Ok((read, write)) => {
                let info = read.info();
                donors.push(Donor {
                    read,
                    write,
                    capacity_bytes: AtomicU64::new(info.capacity_bytes),
                    geometry: AtomicU8::new(GEOMETRY_KNOWN),
                    slabs_placed: Mutex::new(0),
                    // Cut once the far slab size is known (far_slab_pages).
                    pack: Mutex::new(Pack::new(1, 1)),
                    health: Health::default(),
                });
            }
            Err(e @ RuntimeError::Donor { .. }) if is_unreachable(&e) => {
                donors.push(down_at_start(a, ccfg, &e)?);
                unreachable.push(e);
            }
            Err(e) => return Err(e),
        }
    }
    let answered = donors.len() - unreachable.len();
    if let Some(first) = unreachable.first() {
        if answered == 0 {
            return Err(RuntimeError::NoDonorReachable {
                tried: addrs.len(),
                first: first.to_string(),
            });
        }
        for e in &unreachable {
            tracing::warn!(
                "{e}: going on with the {answered} donor(s) that answered; it is used once it \
                 answers"
            );
        }
    }
    Ok(donors)
}

/// A donor that did not answer at start (`why`): dead (refused: a crash; accepted: a stall;
/// neither: a partition), its connections made at their first request. The heal thread probes it with the other dead donors and takes it in
/// when it answers ([`Far::take_in`]).
fn down_at_start(
    addr: &str,
    ccfg: &ClientConfig,
    why: &RuntimeError,
) -> Result<Donor, RuntimeError> {
    let later = |spin: Duration| {
        DonorClient::register_later(
            addr,
            ClientConfig {
                spin,
                ..ccfg.clone()
            },
        )
        .map_err(|source| RuntimeError::Donor {
            addr: addr.to_string(),
            step: "connecting",
            source,
        })
    };
    let health = Health::default();
    health.declare_dead(Cause::of(addr));
    tracing::debug!("donor {addr} is down at start ({why})");
    Ok(Donor {
        read: later(FAULT_PATH_SPIN)?,
        write: later(Duration::ZERO)?,
        capacity_bytes: AtomicU64::new(0),
        geometry: AtomicU8::new(GEOMETRY_UNKNOWN),
        slabs_placed: Mutex::new(0),
        pack: Mutex::new(Pack::new(1, 1)),
        health,
    })
}

/// Copies each far slab keeps: `--replicas`, or 2 with two donors or more; at most one a
/// donor. Fewer donors answering than that runs degraded, said once.
fn replicas_for(
    cfg: &RuntimeConfig,
    addrs: &[String],
    answered: usize,
) -> Result<usize, RuntimeError> {
    let replicas = cfg.replicas.unwrap_or(if addrs.len() >= 2 { 2 } else { 1 });
    if replicas == 0 || replicas > MAX_REPLICAS || (replicas > addrs.len() && !addrs.is_empty()) {
        return Err(RuntimeError::Config(format!(
            "--replicas {replicas}: give 1 to {} (at most one copy of a slab per donor; {} \
             donor(s) configured)",
            MAX_REPLICAS.min(addrs.len().max(1)),
            addrs.len()
        )));
    }
    if replicas > answered && answered > 0 {
        tracing::warn!(
            "only {answered} of {} donors answered: slabs keep {answered} copies instead of \
             {replicas} (degraded) until more donors can be used",
            addrs.len(),
        );
    }
    Ok(replicas)
}

/// Pages per far slab: one size for every home, the smallest slab any of them hands out;
/// each donor packs far slabs into its own slabs ([`Pack`]).
fn far_slab_pages(
    donors: &[Donor],
    tier: Option<&Tier>,
    addrs: &[String],
) -> Result<u64, RuntimeError> {
    let slab_bytes = donors
        .iter()
        .map(|d| d.read.info().slab_size_bytes)
        // A donor down at start does not know it yet (Far::take_in checks it later).
        .filter(|&b| b > 0)
        .chain(tier.map(Tier::slab_bytes))
        .min()
        .unwrap_or(64 << 20);
    if slab_bytes < PAGE_SIZE as u64 || !slab_bytes.is_multiple_of(PAGE_SIZE as u64) {
        return Err(RuntimeError::BadDonor {
            addr: addrs
                .first()
                .cloned()
                .unwrap_or_else(|| "the host tier".into()),
            reason: format!("slab size {slab_bytes} is not a positive multiple of 4096"),
        });
    }
    let slab_pages = slab_bytes / PAGE_SIZE as u64;
    for d in donors.iter().filter(|d| d.read.info().slab_size_bytes > 0) {
        *d.pack.lock() = Pack::new(d.read.info().slab_size_bytes / PAGE_SIZE as u64, slab_pages);
    }
    Ok(slab_pages)
}

/// The sealer, when pages leaving this process are sealed: `--seal on` with donors named;
/// `auto` when a donor is not on this host. The host tier is this machine's memory: never
/// sealed (see [`crate::far`]'s module doc).
fn sealer_for(
    cfg: &RuntimeConfig,
    addrs: &[String],
    embedded: bool,
) -> Result<Option<Sealer>, RuntimeError> {
    let seal = match cfg.seal {
        SealMode::On => !addrs.is_empty(),
        SealMode::Off => false,
        SealMode::Auto => !embedded && !addrs.iter().all(|a| on_this_host(a)),
    };
    if seal {
        Sealer::new().map(Some).map_err(RuntimeError::Seal)
    } else {
        Ok(None)
    }
}

/// In a forked child: read-only connections to what its parent lent on donors (numbered after
/// the `own` donors), and the rest of what [`LentDonors::connect`] found (the borrowed slabs'
/// homes, each lender's donors' connections).
fn borrowed_donors(cfg: &RuntimeConfig, ccfg: &ClientConfig, own: usize) -> (Vec<Donor>, Borrowed) {
    let mut b = match &cfg.lent_donors {
        Some(l) => l.connect(ccfg, own),
        None => Borrowed::default(),
    };
    // Read only: the same connection serves as the write side, which is never used.
    let donors = std::mem::take(&mut b.clients)
        .into_iter()
        .map(|c| Donor {
            capacity_bytes: AtomicU64::new(c.info().capacity_bytes),
            geometry: AtomicU8::new(GEOMETRY_KNOWN),
            read: c.clone(),
            write: c,
            slabs_placed: Mutex::new(0),
            // Read only: nothing is placed on a borrowed connection.
            pack: Mutex::new(Pack::new(1, 1)),
            health: Health::default(),
        })
        .collect();
    (donors, b)
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_and_local_addresses_are_on_this_host() {
        assert!(super::on_this_host("127.0.0.1:7070"));
        assert!(super::on_this_host("localhost:7070"));
        assert!(super::on_this_host("0.0.0.0:7070"));
        // TEST-NET-3 (RFC 5737): never assigned to a host, so never this one.
        assert!(!super::on_this_host("203.0.113.9:7070"));
        assert!(!super::on_this_host("no-such-host.invalid:7070"));
    }
}
