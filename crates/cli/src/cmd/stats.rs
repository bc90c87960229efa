//! `farmem stats --donor ADDR`: a donor's capacity, use and load, as a table or JSON (with
//! `--donor` more than once, one row per donor, asked at once; one that does not answer is a
//! row saying why, and the exit status 1); and
//! `farmem stats --node [PATH]`: the host tier's capacity, use, holds, clients and reclaims.
//!
//! Asks the donor for its counters (STATS) over an ordinary client connection. Requests per
//! second come from two samples `--interval-ms` apart (default 1000): the difference in requests
//! served divided by the difference in the donor's uptime. `--interval-ms 0` takes one sample
//! and divides the lifetime total by the uptime instead. Service-time percentiles are the
//! donor's own, over its lifetime.
//!
//! For a node, one STATS request over an ordinary client connection (the socket is checked
//! before use like any client does); this command's own connection is left out of the clients.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use farmem_node::{NodeClient, NodeClientConfig, NodeStats};
use farmem_transport::{ClientConfig, DonorClient, DonorStats};
use serde::Serialize;

use crate::cmd::units::human_bytes;

/// Show a donor's capacity, use and load (--donor), or the host tier's (--node).
///
/// Requests per second are measured from two STATS samples --interval-ms apart (default 1000 ms):
/// (requests served between them) / (donor uptime between them). With --interval-ms 0 they are
/// the donor's lifetime total divided by its uptime. The p50/p99 service times are the donor's
/// own, over its lifetime. "clients" counts the other connected client ids (this command's own
/// connection is left out).
///
/// With --node: the node's capacity and use, its live holds and the slabs they name, the slabs
/// kept for holds after their client freed them or went away, its clients (pid, uid, slabs), the
/// slabs they were asked to give back and gave back, and the requests it refused.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("server").required(true).args(["donor", "node"])))]
pub struct StatsArgs {
    /// The donor to ask, HOST:PORT (e.g. 127.0.0.1:7070); more than once for a table of
    /// several (JSON: an array).
    #[arg(long, value_name = "ADDR")]
    pub donor: Vec<String>,
    /// Ask the host tier's node instead, on its Unix socket (default /run/farmem/node.sock).
    #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = farmem_node::DEFAULT_SOCKET_PATH, conflicts_with_all = ["donor", "token_file"])]
    pub node: Option<PathBuf>,
    /// File holding the donor's auth token (the same file as `farmem donor --token-file`; one
    /// trailing newline stripped; mode 600).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Requests per second = requests served between two STATS samples taken this many ms
    /// apart, divided by the donor's uptime between them; 0 = lifetime total / uptime. The
    /// p50/p99 service times are the donor's own, over its lifetime.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub interval_ms: u64,
    /// Give up on a donor that does not answer within this many milliseconds.
    #[arg(long, default_value_t = 3000, value_name = "MS")]
    pub timeout_ms: u64,
}

/// What `farmem stats --json` prints.
#[derive(Debug, Serialize)]
pub struct StatsReport {
    /// The donor asked.
    pub donor: String,
    /// Lendable capacity, bytes.
    pub capacity_bytes: u64,
    /// Bytes in allocated slabs.
    pub used_bytes: u64,
    /// capacity − used, bytes.
    pub free_bytes: u64,
    /// Bytes committed (slab pages written at least once).
    pub committed_bytes: u64,
    /// Slab size, bytes.
    pub slab_size_bytes: u64,
    /// Allocated slabs.
    pub slabs: u64,
    /// Connected client ids other than this command.
    pub clients: u64,
    /// Requests per second (see `rate_method`).
    pub requests_per_s: f64,
    /// "sampled" (two samples `rate_interval_ms` apart) or "lifetime" (total / uptime).
    pub rate_method: &'static str,
    /// Time between the two samples, ms (0 for "lifetime").
    pub rate_interval_ms: u64,
    /// Median service time, µs.
    pub service_p50_us: f64,
    /// 99th percentile service time, µs.
    pub service_p99_us: f64,
    /// Requests served since start.
    pub requests_total: u64,
    /// Requests answered with an error since start.
    pub errors_total: u64,
    /// Pages read since start.
    pub pages_read_total: u64,
    /// Pages written since start.
    pub pages_written_total: u64,
    /// Seconds since the donor started.
    pub uptime_s: f64,
    /// Bytes the donor wants back from its clients now (its capacity was lowered, or its host
    /// is below `--keep-free`): they are moving slabs away.
    pub reclaim_wanted_bytes: u64,
    /// Slabs clients gave back when asked.
    pub slabs_given_back_total: u64,
    /// The tenant this command authenticated as: its use, quota and other clients (`null`
    /// from a donor that does not answer CLIENTS).
    pub tenant: Option<TenantReport>,
}

/// One tenant of a donor, as its own clients see it.
#[derive(Debug, Serialize)]
pub struct TenantReport {
    /// Its name ("default" for a donor with one token, or none).
    pub name: String,
    /// Bytes its clients hold.
    pub used_bytes: u64,
    /// Its quota, if it has one.
    pub quota_bytes: Option<u64>,
    /// Its clients other than this command.
    pub clients: Vec<ClientReport>,
}

/// One client of a donor.
#[derive(Debug, Serialize)]
pub struct ClientReport {
    /// Its id, hex.
    pub id: String,
    /// The address its last connection came from ("" if in-process).
    pub address: String,
    /// What it said it is: program, pid and host ("" if it did not say).
    pub program: String,
    /// Its open connections (0: gone, its slabs wait out the orphan grace).
    pub connections: u16,
    /// Slabs it holds.
    pub slabs: u32,
    /// Bytes of those slabs.
    pub used_bytes: u64,
}

fn tenant_report(c: farmem_transport::ClientsReply, me: u64) -> TenantReport {
    TenantReport {
        name: c.tenant,
        used_bytes: c.tenant_used_bytes,
        quota_bytes: c.tenant_quota_bytes,
        clients: c
            .clients
            .into_iter()
            .filter(|e| e.client_id != me)
            .map(|e| ClientReport {
                id: format!("{:016x}", e.client_id),
                address: if e.address.is_unspecified() {
                    String::new()
                } else {
                    e.address.to_string()
                },
                program: e.label,
                connections: e.connections,
                slabs: e.slabs,
                used_bytes: e.used_bytes,
            })
            .collect(),
    }
}

/// Runs `farmem stats`.
pub fn run(args: StatsArgs) -> anyhow::Result<ExitCode> {
    if let Some(path) = &args.node {
        return node_stats(path, &args);
    }
    if let [donor] = args.donor.as_slice() {
        let report = collect(donor, &args)?;
        let mut out = std::io::stdout().lock();
        if args.json {
            serde_json::to_writer(&mut out, &report)?;
            writeln!(out)?;
        } else {
            write!(out, "{}", render(&report))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    several(&args)
}

/// `--donor` more than once: every donor asked at once (one interval for all), one row each.
fn several(args: &StatsArgs) -> anyhow::Result<ExitCode> {
    let results: Vec<(String, anyhow::Result<StatsReport>)> = std::thread::scope(|s| {
        let asked: Vec<_> = args
            .donor
            .iter()
            .map(|d| (d.clone(), s.spawn(move || collect(d, args))))
            .collect();
        asked
            .into_iter()
            .map(|(d, h)| {
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("asking {d} panicked")));
                (d, r)
            })
            .collect()
    });
    let failed = results.iter().filter(|(_, r)| r.is_err()).count();
    let mut out = std::io::stdout().lock();
    if args.json {
        let rows: Vec<serde_json::Value> = results
            .iter()
            .map(|(d, r)| match r {
                Ok(rep) => serde_json::to_value(rep).unwrap_or(serde_json::Value::Null),
                Err(e) => serde_json::json!({ "donor": d, "error": format!("{e:#}") }),
            })
            .collect();
        serde_json::to_writer(&mut out, &rows)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", render_table(&results))?;
    }
    drop(out);
    if failed > 0 {
        eprintln!(
            "farmem stats: {failed} of {} donors did not answer (see their rows)",
            results.len()
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// One row per donor: what each lends, holds and serves.
fn render_table(results: &[(String, anyhow::Result<StatsReport>)]) -> String {
    let mut rows = vec![[
        "donor".to_string(),
        "capacity".into(),
        "used".into(),
        "committed".into(),
        "slabs".into(),
        "clients".into(),
        "requests/s".into(),
        "p99".into(),
        "wanted back".into(),
        "tenant use".into(),
    ]];
    let mut errors = Vec::new();
    let (mut cap, mut used, mut committed) = (0, 0, 0);
    for (d, r) in results {
        match r {
            Ok(r) => {
                cap += r.capacity_bytes;
                used += r.used_bytes;
                committed += r.committed_bytes;
                rows.push([
                    d.clone(),
                    human_bytes(r.capacity_bytes),
                    format!(
                        "{} ({:.0}%)",
                        human_bytes(r.used_bytes),
                        percent(r.used_bytes, r.capacity_bytes)
                    ),
                    human_bytes(r.committed_bytes),
                    format!("{} of {}", r.slabs, human_bytes(r.slab_size_bytes)),
                    r.clients.to_string(),
                    format!("{:.1}", r.requests_per_s),
                    format!("{:.1} µs", r.service_p99_us),
                    human_bytes(r.reclaim_wanted_bytes),
                    r.tenant.as_ref().map_or_else(
                        || "-".to_string(),
                        |t| format!("{} {}", t.name, human_bytes(t.used_bytes)),
                    ),
                ]);
            }
            Err(e) => errors.push(format!("{d}: {e:#}")),
        }
    }
    let mut out = aligned(&rows, "");
    out += &format!(
        "all {} answering: capacity {}, used {} ({:.0}%), committed {}\n",
        rows.len() - 1,
        human_bytes(cap),
        human_bytes(used),
        percent(used, cap),
        human_bytes(committed)
    );
    for e in errors {
        out += &format!("NOT ANSWERING {e}\n");
    }
    out
}

/// Connects to `donor`, samples and builds the report.
pub fn collect(donor: &str, args: &StatsArgs) -> anyhow::Result<StatsReport> {
    let token = args
        .token_file
        .as_deref()
        .map(crate::cmd::donor::read_token_file)
        .transpose()?;
    let timeout = Duration::from_millis(args.timeout_ms.max(1));
    let cfg = ClientConfig {
        token,
        connect_timeout: timeout,
        request_timeout: timeout,
        ..ClientConfig::default()
    };
    let me = cfg.client_id;
    let client = DonorClient::connect(donor, cfg)
        .with_context(|| format!("farmem stats could not reach donor {donor}"))?;
    let first = client
        .stats()
        .context("asking the donor for its counters")?;
    let (last, rate, method, interval_ms) = if args.interval_ms == 0 {
        let rate = per_second(first.requests_total, first.uptime_ms);
        (first, rate, "lifetime", 0)
    } else {
        std::thread::sleep(Duration::from_millis(args.interval_ms));
        let second = client
            .stats()
            .context("asking the donor for its counters")?;
        let rate = per_second(
            second.requests_total.saturating_sub(first.requests_total),
            second.uptime_ms.saturating_sub(first.uptime_ms),
        );
        let interval = second.uptime_ms.saturating_sub(first.uptime_ms);
        (second, rate, "sampled", interval)
    };
    let mut r = report(donor, &last, rate, method, interval_ms);
    r.tenant = match client.clients() {
        Ok(c) => Some(tenant_report(c, me)),
        // A donor from before CLIENTS: its figures without the clients.
        Err(farmem_transport::TransportError::Refused {
            status: farmem_transport::Status::UnknownRequest,
            ..
        }) => None,
        Err(e) => return Err(e).context("asking the donor for its clients"),
    };
    Ok(r)
}

fn per_second(count: u64, ms: u64) -> f64 {
    if ms == 0 {
        0.0
    } else {
        count as f64 * 1000.0 / ms as f64
    }
}

fn report(
    donor: &str,
    s: &DonorStats,
    requests_per_s: f64,
    rate_method: &'static str,
    rate_interval_ms: u64,
) -> StatsReport {
    StatsReport {
        donor: donor.to_string(),
        capacity_bytes: s.capacity_bytes,
        used_bytes: s.used_bytes,
        free_bytes: s.capacity_bytes.saturating_sub(s.used_bytes),
        committed_bytes: s.committed_bytes,
        slab_size_bytes: s.slab_size_bytes,
        slabs: s.slabs,
        clients: s.clients.saturating_sub(1),
        requests_per_s,
        rate_method,
        rate_interval_ms,
        service_p50_us: s.service_p50_ns as f64 / 1000.0,
        service_p99_us: s.service_p99_ns as f64 / 1000.0,
        requests_total: s.requests_total,
        errors_total: s.errors_total,
        pages_read_total: s.pages_read_total,
        pages_written_total: s.pages_written_total,
        uptime_s: s.uptime_ms as f64 / 1000.0,
        reclaim_wanted_bytes: s.reclaim_wanted_bytes,
        slabs_given_back_total: s.slabs_given_back_total,
        tenant: None,
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// The readable table.
pub fn render(r: &StatsReport) -> String {
    let rate_note = if r.rate_method == "sampled" {
        format!("(over {:.2} s)", r.rate_interval_ms as f64 / 1000.0)
    } else {
        "(lifetime average)".to_string()
    };
    let rows = [
        ("capacity", human_bytes(r.capacity_bytes)),
        (
            "used",
            format!(
                "{} ({:.1}%), committed {}",
                human_bytes(r.used_bytes),
                percent(r.used_bytes, r.capacity_bytes),
                human_bytes(r.committed_bytes)
            ),
        ),
        ("free", human_bytes(r.free_bytes)),
        (
            "slabs",
            format!("{} of {}", r.slabs, human_bytes(r.slab_size_bytes)),
        ),
        ("clients", r.clients.to_string()),
        ("requests/s", format!("{:.1} {rate_note}", r.requests_per_s)),
        ("service p50", format!("{:.1} µs", r.service_p50_us)),
        ("service p99", format!("{:.1} µs", r.service_p99_us)),
        (
            "requests",
            format!("{} ({} errors)", r.requests_total, r.errors_total),
        ),
        (
            "pages",
            format!(
                "{} read, {} written",
                r.pages_read_total, r.pages_written_total
            ),
        ),
        (
            "given back",
            format!(
                "{} slabs; wanted back now {}",
                r.slabs_given_back_total,
                human_bytes(r.reclaim_wanted_bytes)
            ),
        ),
    ];
    let mut out = format!("donor {} (up {:.0} s)\n", r.donor, r.uptime_s);
    for (name, value) in rows {
        out.push_str(&format!("  {name:<12} {value}\n"));
    }
    if let Some(t) = &r.tenant {
        out += &render_tenant(t);
    }
    out
}

/// A tenant's use and its clients, each with where it connects from and what it is.
fn render_tenant(t: &TenantReport) -> String {
    let quota = t.quota_bytes.map_or_else(
        || "no quota".to_string(),
        |q| format!("quota {}", human_bytes(q)),
    );
    let mut out = format!(
        "  {:<12} {}: {} used, {quota}; its other clients: {}\n",
        "tenant",
        t.name,
        human_bytes(t.used_bytes),
        t.clients.len()
    );
    if t.clients.is_empty() {
        return out;
    }
    let mut rows = vec![[
        "client".to_string(),
        "address".into(),
        "conns".into(),
        "slabs".into(),
        "used".into(),
        "program".into(),
    ]];
    for c in &t.clients {
        rows.push([
            c.id.clone(),
            if c.address.is_empty() {
                "-".into()
            } else {
                c.address.clone()
            },
            if c.connections == 0 {
                "gone".into()
            } else {
                c.connections.to_string()
            },
            c.slabs.to_string(),
            human_bytes(c.used_bytes),
            if c.program.is_empty() {
                "-".into()
            } else {
                c.program.clone()
            },
        ]);
    }
    out += &aligned(&rows, "    ");
    out
}

/// `rows` as lines of left-aligned columns two spaces apart, each line after `indent`.
fn aligned<const N: usize>(rows: &[[String; N]], indent: &str) -> String {
    let widths: Vec<usize> = (0..N)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out += indent;
        out += cells.join("  ").trim_end();
        out.push('\n');
    }
    out
}

/// `farmem stats --node PATH`: one STATS request, printed as JSON or a table.
fn node_stats(path: &std::path::Path, args: &StatsArgs) -> anyhow::Result<ExitCode> {
    let cfg = NodeClientConfig {
        timeout: Duration::from_millis(args.timeout_ms.max(1)),
        ..NodeClientConfig::default()
    };
    let client = NodeClient::connect(path, cfg).with_context(|| {
        format!(
            "farmem stats could not reach the node on {}",
            path.display()
        )
    })?;
    let mut stats = client.stats().context("asking the node for its figures")?;
    // This command's own connection is not one of the node's clients.
    let me = std::process::id();
    stats.clients.retain(|c| c.pid != me || c.slabs > 0);
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut out, &stats)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", render_node(&path.display().to_string(), &stats))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The readable table of a node's figures.
pub fn render_node(path: &str, s: &NodeStats) -> String {
    let mut out = format!(
        "node {path} (pid {}, up {:.0} s)\n",
        s.node_pid,
        s.uptime_ms as f64 / 1000.0
    );
    for (name, value) in node_rows(s) {
        out.push_str(&format!("  {name:<12} {value}\n"));
    }
    for c in &s.clients {
        out.push_str(&client_line(c));
    }
    out
}

/// The node's rows, one table: what each row says is clearest side by side.
fn node_rows(s: &NodeStats) -> [(&'static str, String); 9] {
    [
        ("capacity", human_bytes(s.capacity_bytes)),
        (
            "used",
            format!(
                "{} ({:.1}%) in {} slabs of {}",
                human_bytes(s.used_bytes),
                percent(s.used_bytes, s.capacity_bytes),
                s.slabs,
                human_bytes(s.slab_bytes)
            ),
        ),
        (
            "free",
            human_bytes(s.capacity_bytes.saturating_sub(s.used_bytes)),
        ),
        ("keep-free", keep_free(s)),
        (
            "holds",
            format!("{} live, naming {} slabs", s.holds, s.held_slabs),
        ),
        (
            "kept",
            format!(
                "{} slabs no client holds, kept for live holds",
                s.kept_slabs
            ),
        ),
        (
            "reclaims",
            format!(
                "{} asked, {} slabs given back",
                s.reclaim_requests_total, s.reclaimed_slabs_total
            ),
        ),
        ("refusals", refusals(s)),
        ("clients", s.clients.len().to_string()),
    ]
}

/// The keep-free watermark and the host's memory against it.
fn keep_free(s: &NodeStats) -> String {
    match (s.keep_free_bytes, s.mem_available_bytes) {
        (None, _) => "off".to_string(),
        (Some(k), avail) => format!(
            "{} (host has {} available{})",
            human_bytes(k),
            avail.map_or_else(|| "?".to_string(), human_bytes),
            if s.under_pressure {
                "; under pressure: no new slabs"
            } else {
                ""
            }
        ),
    }
}

/// The refusals that happened, by reason, or "none".
fn refusals(s: &NodeStats) -> String {
    let refusals: Vec<String> = s
        .refusals
        .by_reason()
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(why, n)| format!("{} {n}", why.replace('_', " ")))
        .collect();
    if refusals.is_empty() {
        "none".to_string()
    } else {
        refusals.join(", ")
    }
}

/// One client's line under the table.
fn client_line(c: &farmem_node::ClientStats) -> String {
    let asked = if c.reclaim_outstanding > 0 {
        format!(", asked to give back {}", c.reclaim_outstanding)
    } else {
        String::new()
    };
    format!(
        "    pid {:<8} uid {:<6} gid {:<6} {} slabs ({}){asked}\n",
        c.pid,
        c.uid,
        c.gid,
        c.slabs,
        human_bytes(c.bytes)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_rates_are_readable() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(64 << 20), "64.0 MiB");
        assert_eq!(per_second(500, 250), 2000.0);
        assert_eq!(per_second(5, 0), 0.0);
    }

    #[test]
    fn the_table_names_every_figure() {
        let s = DonorStats {
            capacity_bytes: 1 << 30,
            used_bytes: 128 << 20,
            slab_size_bytes: 64 << 20,
            slabs: 2,
            clients: 3,
            service_p50_ns: 12_300,
            service_p99_ns: 45_600,
            uptime_ms: 61_000,
            ..DonorStats::default()
        };
        let r = report("127.0.0.1:7070", &s, 1234.5, "sampled", 1000);
        assert_eq!(r.free_bytes, (1 << 30) - (128 << 20));
        assert_eq!(r.clients, 2, "this command's own connection is not counted");
        let t = render(&r);
        for needle in [
            "1.0 GiB",
            "128.0 MiB (12.5%)",
            "896.0 MiB",
            "2 of 64.0 MiB",
            "1234.5 (over 1.00 s)",
            "12.3 µs",
            "45.6 µs",
        ] {
            assert!(t.contains(needle), "{needle:?} missing from\n{t}");
        }
    }

    #[test]
    fn the_node_table_names_every_figure() {
        let s = NodeStats {
            node_pid: 7,
            capacity_bytes: 1 << 30,
            used_bytes: 8 << 20,
            slab_bytes: 4 << 20,
            slabs: 2,
            holds: 3,
            held_slabs: 2,
            kept_slabs: 1,
            keep_free_bytes: Some(1 << 30),
            mem_available_bytes: Some(20 << 30),
            clients: vec![farmem_node::ClientStats {
                pid: 42,
                uid: 1000,
                gid: 100,
                slabs: 2,
                bytes: 8 << 20,
                reclaim_outstanding: 1,
            }],
            reclaim_requests_total: 3,
            reclaimed_slabs_total: 2,
            refusals: farmem_node::metrics::Refusals {
                full: 4,
                ..Default::default()
            },
            uptime_ms: 5000,
            ..NodeStats::default()
        };
        let t = render_node("/run/farmem/node.sock", &s);
        for needle in [
            "node /run/farmem/node.sock (pid 7, up 5 s)",
            "1.0 GiB",
            "8.0 MiB (0.8%) in 2 slabs of 4.0 MiB",
            "1.0 GiB (host has 20.0 GiB available)",
            "holds        3 live, naming 2 slabs",
            "kept         1 slabs no client holds, kept for live holds",
            "3 asked, 2 slabs given back",
            "full 4",
            "pid 42",
            "2 slabs (8.0 MiB), asked to give back 1",
        ] {
            assert!(t.contains(needle), "{needle:?} missing from\n{t}");
        }
    }
}
