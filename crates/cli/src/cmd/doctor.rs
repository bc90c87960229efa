//! `farmem doctor`: a read-only self-check for users. It changes nothing on the machine: it
//! reads the kernel version, probes userfaultfd and the kernel features farmem needs (the
//! runtime's own error when userfaultfd is unavailable), and takes two quick figures: the
//! userfaultfd fault floor (faults answered from memory by a handler thread in this process)
//! and a donor round trip (one 4 KiB page read from a donor started in this process on
//! 127.0.0.1:0, or from `--donor ADDR`).
//!
//! One line per check, `ok`, `note` (farmem runs, with less) or `FAILED` with what to do; the
//! exit status is 1 if any check failed. `--json` prints the same as one object.

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
    /// Measure the round trip to this donor (HOST:PORT) instead of one started in this process.
    /// One slab is taken for the check and freed after it.
    #[arg(long, value_name = "ADDR")]
    pub donor: Option<String>,
    /// File holding the token to present to --donor.
    #[arg(long, value_name = "FILE", requires = "donor")]
    pub token_file: Option<std::path::PathBuf>,
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
    match &probed {
        Ok(available) => checks.extend(NEEDED.iter().map(|n| check_feature(n, *available))),
        Err(_) => checks.push(Check::new(
            "userfaultfd features",
            Status::Failed,
            "not checked: userfaultfd is not available (see above)",
        )),
    }
    checks.push(check_fault_floor());
    checks.push(check_donor(&args));
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

fn check_donor(args: &DoctorArgs) -> Check {
    let name = "donor round trip";
    let measured = (|| -> anyhow::Result<(String, f64)> {
        let mut cfg = ClientConfig {
            connect_timeout: Duration::from_secs(3),
            ..ClientConfig::default()
        };
        if let Some(f) = &args.token_file {
            cfg.token = Some(
                std::fs::read(f)
                    .with_context(|| format!("reading the token file {}", f.display()))?,
            );
        }
        let (_local, addr, whose) = match &args.donor {
            Some(addr) => (None, addr.clone(), "donor"),
            None => {
                let donor = DonorServer::bind(DonorConfig {
                    listen: "127.0.0.1:0".into(),
                    capacity_bytes: 16 << 20,
                    slab_size_bytes: 1 << 20,
                    ..DonorConfig::default()
                })
                .context("starting a donor in this process on 127.0.0.1")?
                .spawn();
                let addr = donor.local_addr().to_string();
                (Some(donor), addr, "in-process donor")
            }
        };
        let p50 = donor_p50_us(&addr, cfg).with_context(|| match &args.donor {
            Some(_) => format!(
                "{whose} {addr}: start a donor there (farmem donor --listen {addr}) or give \
                 the address of a running one"
            ),
            None => format!("{whose} {addr}: loopback TCP to this process failed"),
        })?;
        Ok((format!("{whose} {addr}"), p50))
    })();
    match measured {
        Ok((whose, p50)) => Check::new(
            name,
            Status::Ok,
            format!("p50 {p50:.1} µs (one 4 KiB page from the {whose}, {SAMPLES} reads)"),
        ),
        Err(e) => Check::new(name, Status::Failed, format!("{e:#}")),
    }
}

/// Writes one page to a slab of the donor at `addr`, reads it back [`SAMPLES`] times, frees
/// the slab; the median read, microseconds.
fn donor_p50_us(addr: &str, cfg: ClientConfig) -> anyhow::Result<f64> {
    let client = DonorClient::connect(addr, cfg).context("connecting")?;
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
