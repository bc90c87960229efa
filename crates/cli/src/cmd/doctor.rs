//! `farmem doctor`: a read-only self-check for users. It changes nothing on the machine: it
//! reads the kernel version, probes userfaultfd and the kernel features farmem needs (the
//! runtime's own error when userfaultfd is unavailable, then each grant it needs on a line of
//! its own: /dev/userfaultfd open to this user, a seccomp filter that lets it through,
//! vm.unprivileged_userfaultfd; see doctor/grants.rs), and takes two quick figures: the
//! userfaultfd fault floor (faults answered from memory by a handler thread in this process)
//! and a donor round trip (one 4 KiB page read from a donor started in this process on
//! 127.0.0.1:0, or from each `--donor ADDR`, with what it lends). It also checks what users
//! met: the token file (`--token-file`: mode, kind, size), each donor telling "nothing listens
//! there" from "it refused the token", and the host's node (`--node`, default the host's
//! socket) telling "not running" from "this user may not use it".
//!
//! One line per check, `ok`, `note` (farmem runs, with less) or `FAILED` with what to do; the
//! exit status is 1 if any check failed. `--json` prints the same as one object.

mod capacity;
mod grants;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use farmem_donor::{DonorConfig, DonorServer};
use farmem_transport::{ClientConfig, DonorClient, PageAddr, PageWrite, PAGE_SIZE};
use farmem_uffd::floor::FaultFloor;
use farmem_uffd::{Features, Uffd};
use serde::Serialize;

/// Arguments of `farmem doctor` (its help text is on `Command::Doctor` in main.rs).
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Print the checks as one JSON object: {"ok", "checks": [{"name", "status", "detail"}]}.
    #[arg(long)]
    pub json: bool,
    /// Check this donor (HOST:PORT; more than once for several) and measure its round trip
    /// instead of one started in this process. One slab is taken for the check and freed
    /// after it.
    #[arg(long, value_name = "ADDR")]
    pub donor: Vec<String>,
    /// File holding the token to present to --donor (checked as `farmem run` reads it).
    #[arg(long, value_name = "FILE", requires = "donor")]
    pub token_file: Option<std::path::PathBuf>,
    /// The host tier's node socket to check (default: the host's, /run/farmem/node.sock).
    #[arg(long, value_name = "PATH")]
    pub node: Option<std::path::PathBuf>,
    /// Copies of each far page, as `farmem run --replicas` (default as there: 2 with two
    /// donors or more), for the far-capacity check.
    #[arg(long, value_name = "N", requires = "donor", value_parser = clap::value_parser!(u8).range(1..=4))]
    pub replicas: Option<u8>,
    /// The far memory the program is expected to need (what does not fit --local-mem): the
    /// donors' free room, counted with --replicas copies, must hold it.
    #[arg(long, value_name = "SIZE", requires = "donor", value_parser = crate::cmd::units::parse_size)]
    pub far_mem: Option<u64>,
}

/// The oldest kernel farmem runs on (userfaultfd MOVE).
const MIN_KERNEL: (u32, u32) = (6, 8);

/// Faults (and page reads) timed for the two figures.
const SAMPLES: usize = 200;

/// What a check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    /// As farmem needs it.
    Ok,
    /// Farmem runs, without what this check names.
    Note,
    /// Farmem cannot run (the detail says what to do).
    Failed,
}

/// One line of the report.
#[derive(Debug, Serialize)]
struct Check {
    name: String,
    status: Status,
    detail: String,
}

impl Check {
    fn new(name: impl Into<String>, status: Status, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status,
            detail: detail.into(),
        }
    }
}

/// The report: every check, and whether all passed.
#[derive(Debug, Serialize)]
struct Report {
    ok: bool,
    checks: Vec<Check>,
}

/// A userfaultfd feature farmem uses, and what for.
struct Needed {
    feature: Features,
    what_for: &'static str,
    /// Without it the runtime does not start (else it runs without what `what_for` names).
    required: bool,
}

/// The features the runtime asks for: what its region userfaultfd requires and takes when
/// offered (crates/runtime, `Runtime::start`), and what its write-back pool's requires.
const NEEDED: &[Needed] = &[
    Needed {
        feature: Features::PAGEFAULT_FLAG_WP,
        what_for: "write-protect faults: dirty tracking, so clean pages are not sent again",
        required: true,
    },
    Needed {
        feature: Features::MOVE,
        what_for: "UFFDIO_MOVE: eviction and write-back pool hits without copying pages",
        required: true,
    },
    Needed {
        feature: Features::EVENT_REMOVE,
        what_for: "follows the program's MADV_DONTNEED",
        required: true,
    },
    Needed {
        feature: Features::EVENT_UNMAP,
        what_for: "follows the program's munmap",
        required: true,
    },
    Needed {
        feature: Features::EVENT_REMAP,
        what_for: "follows the program's mremap",
        required: true,
    },
    Needed {
        feature: Features::SIGBUS,
        what_for: "the write-back pool's userfaultfd",
        required: true,
    },
    Needed {
        feature: Features::POISON,
        what_for: "a page no donor can return raises SIGBUS in the faulting thread",
        required: false,
    },
    Needed {
        feature: Features::THREAD_ID,
        what_for: "one prefetch stream per faulting thread",
        required: false,
    },
];

/// Runs the checks and prints the report.
pub fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let mut checks = vec![check_kernel()];
    let probed = Uffd::probe();
    match &probed {
        Ok(_) => checks.push(Check::new(
            "userfaultfd",
            Status::Ok,
            "available to this user",
        )),
        Err(e) => checks.push(Check::new("userfaultfd", Status::Failed, e.to_string())),
    }
    // Each grant userfaultfd needs (device, seccomp, sysctl) on its own line, with its fix.
    checks.extend(grants::checks(&grants::Facts::read(grants::Outcome::of(
        &probed,
    ))));
    match &probed {
        Ok(available) => checks.extend(NEEDED.iter().map(|n| check_feature(n, *available))),
        Err(_) => checks.push(Check::new(
            "userfaultfd features",
            Status::Failed,
            "not checked: userfaultfd is not available (see above)",
        )),
    }
    checks.push(check_fault_floor());
    let token = match &args.token_file {
        Some(f) => {
            let (check, token) = check_token_file(f);
            checks.push(check);
            token
        }
        None => None,
    };
    if args.donor.is_empty() {
        checks.push(check_donor(None, None).0);
    } else if args.token_file.is_none() || token.is_some() {
        let mut answered = Vec::new();
        for d in &args.donor {
            let (check, figures) = check_donor(Some(d), token.clone());
            checks.push(check);
            answered.extend(figures);
        }
        checks.extend(capacity::check(
            &answered,
            args.donor.len(),
            args.replicas,
            args.far_mem,
        ));
    }
    checks.push(check_node(args.node.as_deref()));
    let report = Report {
        ok: checks.iter().all(|c| c.status != Status::Failed),
        checks,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for c in &report.checks {
            let status = match c.status {
                Status::Ok => "ok",
                Status::Note => "note",
                Status::Failed => "FAILED",
            };
            println!("{status:<7} {:<32} {}", c.name, c.detail);
        }
    }
    Ok(if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The running kernel's release (`/proc/sys/kernel/osrelease`) against [`MIN_KERNEL`].
fn check_kernel() -> Check {
    let name = "kernel";
    let release = match std::fs::read_to_string("/proc/sys/kernel/osrelease") {
        Ok(r) => r.trim().to_string(),
        Err(e) => {
            return Check::new(
                name,
                Status::Failed,
                format!("reading /proc/sys/kernel/osrelease failed ({e}): is /proc mounted?"),
            )
        }
    };
    let (maj, min) = MIN_KERNEL;
    match kernel_version(&release) {
        Some(v) if v >= MIN_KERNEL => Check::new(
            name,
            Status::Ok,
            format!("Linux {release} (farmem needs >= {maj}.{min})"),
        ),
        Some(_) => Check::new(
            name,
            Status::Failed,
            format!(
                "Linux {release} is too old: farmem needs Linux >= {maj}.{min} (userfaultfd \
                 MOVE); run it on a newer kernel"
            ),
        ),
        None => Check::new(
            name,
            Status::Failed,
            format!("cannot read a version from the kernel release `{release}`"),
        ),
    }
}

/// `(major, minor)` from a kernel release such as `6.18.0-1-amd64`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

fn check_feature(n: &Needed, available: Features) -> Check {
    let (name, kernel) = Features::KNOWN
        .iter()
        .find(|(f, _, _)| *f == n.feature)
        .map(|(_, name, kernel)| (*name, *kernel))
        .unwrap_or(("an unnamed UFFD_FEATURE bit", "6.8"));
    if available.contains(n.feature) {
        Check::new(name, Status::Ok, n.what_for)
    } else if n.required {
        Check::new(
            name,
            Status::Failed,
            format!(
                "missing ({}); farmem needs it: run farmem on Linux >= {kernel}",
                n.what_for
            ),
        )
    } else {
        Check::new(
            name,
            Status::Note,
            format!(
                "missing: farmem runs without it, but without this: {} (Linux >= {kernel} has it)",
                n.what_for
            ),
        )
    }
}

/// The median of `samples`, microseconds.
fn p50_us(mut samples: Vec<Duration>) -> f64 {
    samples.sort_unstable();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

fn check_fault_floor() -> Check {
    let name = "userfaultfd fault floor";
    let measured = (|| -> anyhow::Result<f64> {
        let mut floor = FaultFloor::new(SAMPLES)?;
        let mut samples = Vec::with_capacity(SAMPLES);
        while let Some(t) = floor.fault_next() {
            samples.push(t);
        }
        Ok(p50_us(samples))
    })();
    match measured {
        Ok(p50) => Check::new(
            name,
            Status::Ok,
            format!("p50 {p50:.1} µs ({SAMPLES} faults answered from memory)"),
        ),
        Err(e) => Check::new(name, Status::Failed, format!("{e:#}")),
    }
}

/// The token file as `farmem run` and `farmem donor` read it (regular file, mode 600, 1 to 256
/// bytes); the token, when it can be used.
fn check_token_file(f: &std::path::Path) -> (Check, Option<Vec<u8>>) {
    match crate::cmd::donor::read_token_file(f) {
        Ok(t) => (
            Check::new(
                "token file",
                Status::Ok,
                format!(
                    "{}: a {}-byte token, private to its owner",
                    f.display(),
                    t.len()
                ),
            ),
            Some(t),
        ),
        Err(e) => (
            Check::new(
                "token file",
                Status::Failed,
                format!("{e:#} (the donors were not asked)"),
            ),
            None,
        ),
    }
}

/// One donor (`addr`), or one started in this process: reachable, accepting the token, what it
/// lends, and a page's round trip. The failure says its real cause first: nothing listening
/// there, the token refused, or another refusal in the donor's words.
fn check_donor(
    addr: Option<&str>,
    token: Option<Vec<u8>>,
) -> (Check, Option<capacity::DonorFigures>) {
    let cfg = ClientConfig {
        connect_timeout: Duration::from_secs(3),
        token,
        ..ClientConfig::default()
    };
    let (name, _local, addr, whose) = match addr {
        Some(a) => (format!("donor {a}"), None, a.to_string(), "donor"),
        None => match in_process_donor() {
            Ok(d) => {
                let a = d.local_addr().to_string();
                (
                    "donor round trip".to_string(),
                    Some(d),
                    a,
                    "in-process donor",
                )
            }
            Err(c) => return (c, None),
        },
    };
    let client = match DonorClient::connect(&addr, cfg) {
        Ok(c) => c,
        Err(e) => {
            let why = match &e {
                farmem_transport::TransportError::Connect { source, .. } => format!(
                    "nothing answers at {addr} ({source}): start a donor there (farmem donor \
                     --listen {addr}) or give the address of a running one"
                ),
                // The transport's words name the cause and the fix (a refused token: check
                // --token-file on both sides).
                _ => e.to_string(),
            };
            return (Check::new(name, Status::Failed, why), None);
        }
    };
    let info = client.info();
    let check = round_trip(&client, &info, name, &addr, whose);
    // What it holds now (the round trip's slab freed): for the far-capacity check.
    let figures = client.stats().ok().map(|s| capacity::DonorFigures {
        addr: addr.clone(),
        capacity_bytes: s.capacity_bytes,
        used_bytes: s.used_bytes,
        slab_bytes: info.slab_size_bytes,
    });
    (check, figures)
}

/// A donor started in this process on 127.0.0.1 (when no donor is named), or the failed check.
fn in_process_donor() -> Result<farmem_donor::RunningDonor, Check> {
    let started = DonorServer::bind(DonorConfig {
        listen: "127.0.0.1:0".into(),
        capacity_bytes: 16 << 20,
        slab_size_bytes: 1 << 20,
        ..DonorConfig::default()
    });
    match started {
        Ok(d) => Ok(d.spawn()),
        Err(e) => Err(Check::new(
            "donor round trip",
            Status::Failed,
            format!("starting a donor in this process on 127.0.0.1: {e}"),
        )),
    }
}

/// The round-trip check of a connected donor: a page's p50, and what it lends.
fn round_trip(
    client: &DonorClient,
    info: &farmem_transport::DonorInfo,
    name: String,
    addr: &str,
    whose: &str,
) -> Check {
    let lends = format!(
        "lends {} in slabs of {}",
        crate::cmd::units::human_bytes(info.capacity_bytes),
        crate::cmd::units::human_bytes(info.slab_size_bytes)
    );
    match donor_p50_us(client) {
        Ok(p50) => Check::new(
            name,
            Status::Ok,
            format!(
                "p50 {p50:.1} µs (one 4 KiB page from the {whose} {addr}, {SAMPLES} reads); \
                 {lends}"
            ),
        ),
        // A donor with no room is working as told: the far-capacity check says what it means.
        Err(e) if no_room(&e) => Check::new(
            name,
            Status::Note,
            format!("{addr} answers but has no room for a slab now ({lends}): {e:#}"),
        ),
        Err(e) => Check::new(name, Status::Failed, format!("{addr} ({lends}): {e:#}")),
    }
}

/// The host tier's node: running and usable by this user, not running (a note: `farmem run`
/// starts a private node), or there but not for this user (its socket's mode or group).
fn check_node(path: Option<&std::path::Path>) -> Check {
    use std::os::unix::fs::MetadataExt;
    let name = "host tier node";
    let path = path
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(farmem_node::default_socket_path);
    let shown = path.display();
    match farmem_node::NodeClient::connect(&path, farmem_node::NodeClientConfig::default()) {
        Ok(c) => match c.stats() {
            Ok(s) => Check::new(
                name,
                Status::Ok,
                format!(
                    "{shown}: lends {} ({} in use), {} clients",
                    crate::cmd::units::human_bytes(s.capacity_bytes),
                    crate::cmd::units::human_bytes(s.used_bytes),
                    s.clients.len().saturating_sub(1)
                ),
            ),
            Err(e) => Check::new(name, Status::Failed, format!("{shown}: {e}")),
        },
        Err(farmem_node::NodeError::Connect { source, .. })
            if source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            let owner = std::fs::metadata(&path)
                .map(|m| {
                    format!(
                        " (mode {:04o}, uid {} gid {})",
                        m.mode() & 0o7777,
                        m.uid(),
                        m.gid()
                    )
                })
                .unwrap_or_default();
            Check::new(
                name,
                Status::Failed,
                format!(
                    "a node runs at {shown} but this user may not use it{owner}: ask for \
                     membership of the socket's group, or run without it (farmem run \
                     --local-donor tcp, or --node PATH of a node of your own)"
                ),
            )
        }
        Err(farmem_node::NodeError::Connect { source, .. })
            if matches!(
                source.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            Check::new(
                name,
                Status::Note,
                format!(
                    "no node runs at {shown}: farmem run starts a private node for each \
                     program (one host tier for all: farmem node --capacity SIZE)"
                ),
            )
        }
        Err(e) => Check::new(name, Status::Failed, e.to_string()),
    }
}

/// Whether the round trip failed only because the donor had no slab to lend.
fn no_room(e: &anyhow::Error) -> bool {
    use farmem_transport::{Status, TransportError};
    matches!(
        e.downcast_ref::<TransportError>()
            .and_then(TransportError::status),
        Some(
            Status::CapacityExhausted
                | Status::DonorFull
                | Status::QuotaExceeded
                | Status::MemoryPressure
        )
    )
}

/// Writes one page to a slab of the donor, reads it back [`SAMPLES`] times, frees the slab;
/// the median read, microseconds.
fn donor_p50_us(client: &DonorClient) -> anyhow::Result<f64> {
    let slab = client.alloc_slab().context("allocating a slab")?;
    let page = PageAddr { slab, page: 0 };
    let data = vec![0x5au8; PAGE_SIZE];
    let mut out = vec![0u8; PAGE_SIZE];
    let measured = (|| -> anyhow::Result<f64> {
        client
            .write_pages(&[PageWrite {
                addr: page,
                data: &data,
            }])
            .context("writing a page")?;
        let mut samples = Vec::with_capacity(SAMPLES);
        for _ in 0..SAMPLES {
            let t0 = std::time::Instant::now();
            client
                .read_pages(&[page], &mut out)
                .context("reading a page")?;
            samples.push(t0.elapsed());
        }
        anyhow::ensure!(
            out == data,
            "the page read back differs from the page written"
        );
        Ok(p50_us(samples))
    })();
    let freed = client.free_slab(slab).context("freeing the slab");
    let p50 = measured?;
    freed?;
    Ok(p50)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_are_read_from_releases() {
        assert_eq!(kernel_version("6.18.0-1-amd64"), Some((6, 18)));
        assert_eq!(kernel_version("6.8"), Some((6, 8)));
        assert_eq!(kernel_version("5.15.0+"), Some((5, 15)));
        assert_eq!(kernel_version("garbage"), None);
        assert!(kernel_version("6.7.12").unwrap() < MIN_KERNEL);
        assert!(kernel_version("6.10.1").unwrap() >= MIN_KERNEL);
    }

    #[test]
    fn missing_features_fail_or_note_by_need() {
        let wp = &NEEDED[0];
        assert!(wp.required);
        assert_eq!(check_feature(wp, Features::empty()).status, Status::Failed);
        assert!(check_feature(wp, Features::empty())
            .detail
            .contains("Linux >= 5.7"));
        assert_eq!(check_feature(wp, wp.feature).status, Status::Ok);
        let poison = NEEDED
            .iter()
            .find(|n| n.feature == Features::POISON)
            .unwrap();
        assert_eq!(
            check_feature(poison, Features::empty()).status,
            Status::Note
        );
    }
}
