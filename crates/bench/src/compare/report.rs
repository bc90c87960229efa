//! Output of `farmem-bench compare`: the text table, the `--json` rows, the `--plot` SVG and
//! the machine description kept with saved results.

use std::fmt::Write as _;

use serde::Serialize;

use super::cost::{self, CpuParts};
use super::remote::RemoteUse;
use super::systems::SystemKind;
use super::workloads::{Metric, Workload};

/// One row of `--json`: exactly these keys, `null` where a figure does not apply.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct JsonRow {
    pub system: String,
    pub workload: String,
    pub local_fraction: f64,
    pub wall_s: Option<f64>,
    pub throughput_ops: Option<f64>,
    pub avg_access_us: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// Pages moved into the program's memory (swap-ins, or pages from the tier and donors).
    pub in_pages: Option<u64>,
    /// Pages moved out of it (swap-outs, or pages into the tier and to donors).
    pub out_pages: Option<u64>,
    /// CPU seconds spent on paging (see [`super::cost`] for what each system's counts).
    pub cpu_s: Option<f64>,
    /// `cpu_s` per page moved (in + out), µs; null when nothing moved.
    pub us_per_page: Option<f64>,
    /// The program's machine's CPU per page moved, µs: `us_per_page` under the name that says
    /// whose it is beside `donor_us_per_page`.
    pub client_us_per_page: Option<f64>,
    /// The donor's CPU (another machine's) per page moved, µs (farmem-remote; null elsewhere).
    pub donor_us_per_page: Option<f64>,
    /// Bytes over the donor's link, both ways, per page moved (farmem-remote; null elsewhere).
    pub wire_bytes_per_page: Option<f64>,
    /// Pages moved (in + out) ÷ swap's at the same fraction; null without a swap run.
    pub moved_vs_swap: Option<f64>,
}

/// Everything known about one run (a row of the table).
#[derive(Clone, Debug)]
pub struct RunRow {
    pub system: SystemKind,
    pub workload: Workload,
    /// 1.0 for `local`.
    pub local_fraction: f64,
    /// The memory limit or budget, bytes (None for `local`).
    pub limit_bytes: Option<u64>,
    pub wall_s: Option<f64>,
    pub throughput_ops: Option<f64>,
    pub avg_access_us: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// Bytes written to swap (swap, zram), or to donors and into the host tier (farmem,
    /// farmem-tcp) during the run.
    pub moved_bytes: Option<u64>,
    /// Pages moved in during the run: swap-ins (swap, zram), pages read from the host tier
    /// and donors (farmem, farmem-tcp), 0 (local).
    pub in_pages: Option<u64>,
    /// Pages moved out: swap-outs, pages written into the host tier and to donors, 0.
    pub out_pages: Option<u64>,
    /// The CPU time spent on paging, by part (see [`super::cost`]).
    pub cpu: Option<CpuParts>,
    /// The donor's CPU and its link's bytes over the run (farmem-remote).
    pub remote: Option<RemoteUse>,
    /// Why the row has no figures (skipped or failed), or details of the run.
    pub note: Option<String>,
    /// True when the run failed (as opposed to being skipped or succeeding).
    pub failed: bool,
}

impl RunRow {
    /// The figure the workload is judged by.
    pub fn metric_value(&self) -> Option<f64> {
        match self.workload.metric() {
            Metric::AccessTime => self.avg_access_us,
            Metric::Throughput => self.throughput_ops,
            Metric::Completion => self.wall_s,
        }
    }

    /// This row's metric divided by `base`'s (both present and non-zero), e.g. 3.0 means three
    /// times the base's access time, or three times its throughput.
    pub fn ratio_to(&self, base: &RunRow) -> Option<f64> {
        let (a, b) = (self.metric_value()?, base.metric_value()?);
        (b > 0.0 && a.is_finite()).then_some(a / b)
    }

    /// How much worse than `base` (>1 is worse whatever the metric's direction).
    pub fn slowdown_vs(&self, base: &RunRow) -> Option<f64> {
        let r = self.ratio_to(base)?;
        match self.workload.metric() {
            Metric::Throughput => (r > 0.0).then(|| 1.0 / r),
            _ => Some(r),
        }
    }

    /// CPU seconds spent on paging.
    pub fn cpu_s(&self) -> Option<f64> {
        self.cpu.map(|c| c.total_s())
    }

    /// `cpu_s` per page moved, µs (None when nothing moved or a figure is missing).
    pub fn us_per_page(&self) -> Option<f64> {
        cost::us_per_page(self.cpu_s()?, self.in_pages?, self.out_pages?)
    }

    /// Pages moved in and out.
    fn pages_moved(&self) -> Option<u64> {
        Some(self.in_pages? + self.out_pages?).filter(|&n| n > 0)
    }

    /// The donor's CPU per page moved, µs (farmem-remote).
    pub fn donor_us_per_page(&self) -> Option<f64> {
        Some(self.remote?.donor_cpu_s * 1e6 / self.pages_moved()? as f64)
    }

    /// Bytes over the donor's link per page moved (farmem-remote).
    pub fn wire_bytes_per_page(&self) -> Option<f64> {
        Some(self.remote?.wire_bytes as f64 / self.pages_moved()? as f64)
    }

    /// The swap run of the same workload and fraction among `rows`.
    fn swap_row<'a>(&self, rows: &'a [RunRow]) -> Option<&'a RunRow> {
        rows.iter().find(|s| {
            s.workload == self.workload
                && s.system == SystemKind::Swap
                && s.local_fraction == self.local_fraction
        })
    }

    /// Pages moved ÷ the swap run's (same workload and fraction, found in `rows`).
    pub fn moved_vs_swap(&self, rows: &[RunRow]) -> Option<f64> {
        let swap = self.swap_row(rows)?;
        cost::moved_vs_swap(
            self.in_pages?,
            self.out_pages?,
            swap.in_pages?,
            swap.out_pages?,
        )
    }

    /// The row as `--json` prints it; `rows` (all of them) give the swap run to compare with.
    pub fn json(&self, rows: &[RunRow]) -> JsonRow {
        JsonRow {
            system: self.system.name().to_string(),
            workload: self.workload.to_string(),
            local_fraction: self.local_fraction,
            wall_s: self.wall_s,
            throughput_ops: self.throughput_ops,
            avg_access_us: self.avg_access_us,
            p50_us: self.p50_us,
            p99_us: self.p99_us,
            in_pages: self.in_pages,
            out_pages: self.out_pages,
            cpu_s: self.cpu_s(),
            us_per_page: self.us_per_page(),
            client_us_per_page: self.us_per_page(),
            donor_us_per_page: self.donor_us_per_page(),
            wire_bytes_per_page: self.wire_bytes_per_page(),
            moved_vs_swap: self.moved_vs_swap(rows),
        }
    }
}

/// Human-readable byte count (MiB/GiB, one decimal).
pub fn bytes(n: u64) -> String {
    if n >= 1 << 30 {
        format!("{:.2} GiB", n as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "-".to_string(),
    }
}

/// The table: one block per workload, one row per (fraction, system), with ratios to `local`
/// and to `swap` (at the same fraction) of the workload's metric.
pub fn table(rows: &[RunRow], peaks: &[(Workload, u64)]) -> String {
    let mut out = String::new();
    let mut workloads: Vec<Workload> = Vec::new();
    for r in rows {
        if !workloads.contains(&r.workload) {
            workloads.push(r.workload);
        }
    }
    for w in workloads {
        let peak = peaks
            .iter()
            .find(|(pw, _)| *pw == w)
            .map(|(_, p)| bytes(*p));
        let _ = writeln!(
            out,
            "\n== {w} — peak memory {} (local run); ratios compare {}; vs_local/vs_swap = this ÷ that",
            peak.unwrap_or_else(|| "unknown".into()),
            w.metric().describe()
        );
        let _ = writeln!(
            out,
            "{:<13} {:>5} {:>10} {:>9} {:>10} {:>9} {:>9} {:>9} {:>11} {:>8} {:>8}  note",
            "system",
            "local",
            "limit",
            "wall_s",
            "ops/s",
            "avg_us",
            "p50_us",
            "p99_us",
            "out_bytes",
            "vs_local",
            "vs_swap"
        );
        let local = rows
            .iter()
            .find(|r| r.workload == w && r.system == SystemKind::Local);
        for r in rows.iter().filter(|r| r.workload == w) {
            let swap = r.swap_row(rows);
            let vs_local = local.and_then(|l| r.ratio_to(l));
            let vs_swap = swap.and_then(|s| r.ratio_to(s));
            let _ = writeln!(
                out,
                "{:<13} {:>5.2} {:>10} {:>9} {:>10} {:>9} {:>9} {:>9} {:>11} {:>8} {:>8}  {}",
                r.system.name(),
                r.local_fraction,
                r.limit_bytes.map(bytes).unwrap_or_else(|| "none".into()),
                opt(r.wall_s, 2),
                opt(r.throughput_ops, 0),
                opt(r.avg_access_us, 2),
                opt(r.p50_us, 2),
                opt(r.p99_us, 2),
                r.moved_bytes.map(bytes).unwrap_or_else(|| "-".into()),
                opt(vs_local, 2),
                opt(vs_swap, 2),
                r.note.as_deref().unwrap_or("")
            );
        }
        cost_table(&mut out, rows, w);
    }
    out
}

/// The cost block under a workload's table: pages moved, CPU seconds spent on paging on the
/// program's machine, µs per page, pages moved ÷ swap's, the donor's µs per page and the bytes
/// on its link per page (farmem-remote), and what `cpu_s` adds up.
fn cost_table(out: &mut String, rows: &[RunRow], w: Workload) {
    let _ = writeln!(
        out,
        "-- cost of paging: pages moved in/out, CPU seconds spent on paging on the program's machine (cpu_s), cpu_s per page moved, pages moved ÷ swap's, a remote donor's CPU µs and link bytes per page moved"
    );
    let _ = writeln!(
        out,
        "{:<13} {:>5} {:>10} {:>10} {:>8} {:>8} {:>14} {:>9} {:>9}  cpu_s =",
        "system",
        "local",
        "in_pages",
        "out_pages",
        "cpu_s",
        "us/page",
        "moved_vs_swap",
        "donor_us",
        "wire_B"
    );
    let count = |v: Option<u64>| v.map(|n| n.to_string()).unwrap_or_else(|| "-".into());
    for r in rows.iter().filter(|r| r.workload == w) {
        let _ = writeln!(
            out,
            "{:<13} {:>5.2} {:>10} {:>10} {:>8} {:>8} {:>14} {:>9} {:>9}  {}",
            r.system.name(),
            r.local_fraction,
            count(r.in_pages),
            count(r.out_pages),
            opt(r.cpu_s(), 2),
            opt(r.us_per_page(), 1),
            opt(r.moved_vs_swap(rows), 2),
            opt(r.donor_us_per_page(), 1),
            opt(r.wire_bytes_per_page(), 0),
            r.cpu.map(|c| c.describe(r.system)).unwrap_or_default()
        );
    }
}

/// `--json`: the rows as a JSON list.
pub fn json(rows: &[RunRow]) -> String {
    let list: Vec<JsonRow> = rows.iter().map(|r| r.json(rows)).collect();
    serde_json::to_string_pretty(&list).unwrap_or_else(|_| "[]".into())
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `--plot`: grouped bars, one group per (workload, fraction), one bar per system, height =
/// slowdown versus `local` (the metric's ratio, inverted for throughput) on a log scale.
pub fn svg(rows: &[RunRow]) -> String {
    let systems = SystemKind::ALL;
    // farmem-tcp: a lighter shade of farmem's blue; farmem-remote: a darker one.
    let colors = [
        "#888888", "#1f77b4", "#9ecae1", "#08306b", "#d62728", "#2ca02c",
    ];
    let mut groups: Vec<(Workload, f64)> = Vec::new();
    for r in rows.iter().filter(|r| r.system != SystemKind::Local) {
        if !groups.contains(&(r.workload, r.local_fraction)) {
            groups.push((r.workload, r.local_fraction));
        }
    }
    let bar_w = 16.0;
    let group_w = bar_w * systems.len() as f64 + 24.0;
    let (left, top, plot_h) = (70.0, 40.0, 300.0);
    let width = (left + group_w * groups.len().max(1) as f64 + 20.0).max(640.0);
    let height = top + plot_h + 90.0;
    let bars: Vec<(usize, usize, f64)> = groups
        .iter()
        .enumerate()
        .flat_map(|(gi, (w, f))| {
            let local = rows
                .iter()
                .find(|r| r.workload == *w && r.system == SystemKind::Local);
            systems.iter().enumerate().filter_map(move |(si, s)| {
                let row = if *s == SystemKind::Local {
                    local?
                } else {
                    rows.iter()
                        .find(|r| r.workload == *w && r.system == *s && r.local_fraction == *f)?
                };
                Some((gi, si, row.slowdown_vs(local?)?))
            })
        })
        .collect();
    let max = bars.iter().map(|b| b.2).fold(1.0f64, f64::max);
    let decades = max.log10().ceil().max(1.0);
    let y = |v: f64| top + plot_h - (v.max(1e-3).log10().max(0.0) / decades) * plot_h;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r##"<text x="10" y="18" font-size="13">Slowdown vs local, log scale (lower is better)</text><text x="10" y="32" fill="#555">ratio of average access time, of 1/throughput or of completion time to the local run's</text>"##
    );
    for d in 0..=(decades as i32) {
        let v = 10f64.powi(d);
        let yy = y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{:.0}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.0}" y="{:.1}" text-anchor="end">{v}×</text>"##,
            width - 20.0,
            left - 6.0,
            yy + 4.0
        );
    }
    for (gi, si, v) in &bars {
        let x = left + *gi as f64 * group_w + 12.0 + *si as f64 * bar_w;
        let yy = y(*v);
        let _ = writeln!(
            s,
            r#"<rect x="{x:.1}" y="{yy:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {v:.2}×</title></rect>"#,
            bar_w - 2.0,
            (top + plot_h - yy).max(1.0),
            colors[*si],
            systems[*si].name()
        );
    }
    for (gi, (w, f)) in groups.iter().enumerate() {
        let x = left + gi as f64 * group_w + group_w / 2.0;
        let _ = writeln!(
            s,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text><text x="{x:.1}" y="{:.1}" text-anchor="middle">@{f}</text>"#,
            top + plot_h + 16.0,
            escape(&w.to_string()),
            top + plot_h + 30.0
        );
    }
    for (si, sys) in systems.iter().enumerate() {
        let x = left + si as f64 * 90.0;
        let yy = top + plot_h + 60.0;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.0}" y="{yy:.1}">{}</text>"#,
            yy - 10.0,
            colors[si],
            x + 16.0,
            sys.name()
        );
    }
    s.push_str("</svg>\n");
    s
}

/// A description of this machine for saved results: cores, memory, kernel, CPU, date.
pub fn machine_description() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem_kib: u64 = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("unknown")
        .trim()
        .to_string();
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    format!(
        "- cores (nproc): {cpus}\n- memory: {}\n- kernel: {}\n- CPU: {cpu}\n- date: {date}\n",
        bytes(mem_kib * 1024),
        read("/proc/sys/kernel/osrelease").trim()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        system: SystemKind,
        workload: Workload,
        f: f64,
        avg: Option<f64>,
        ops: Option<f64>,
    ) -> RunRow {
        RunRow {
            system,
            workload,
            local_fraction: f,
            limit_bytes: None,
            wall_s: Some(2.0),
            throughput_ops: ops,
            avg_access_us: avg,
            p50_us: None,
            p99_us: None,
            moved_bytes: None,
            in_pages: None,
            out_pages: None,
            cpu: None,
            remote: None,
            note: None,
            failed: false,
        }
    }

    #[test]
    fn json_rows_have_exactly_the_documented_keys() {
        let rows = vec![row(
            SystemKind::Swap,
            Workload::Stride(10),
            0.5,
            Some(33.0),
            None,
        )];
        let v: serde_json::Value = serde_json::from_str(&json(&rows)).unwrap();
        let obj = v.as_array().unwrap()[0].as_object().unwrap();
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "avg_access_us",
                "client_us_per_page",
                "cpu_s",
                "donor_us_per_page",
                "in_pages",
                "local_fraction",
                "moved_vs_swap",
                "out_pages",
                "p50_us",
                "p99_us",
                "system",
                "throughput_ops",
                "us_per_page",
                "wall_s",
                "wire_bytes_per_page",
                "workload"
            ]
        );
        assert_eq!(obj["workload"], "stride:10");
        assert_eq!(obj["system"], "swap");
        assert!(obj["throughput_ops"].is_null());
        assert_eq!(obj["avg_access_us"], 33.0);
    }

    #[test]
    fn cost_columns_in_json_and_table() {
        let cpu = |tree_system_s: f64, kswapd_s: f64, runtime_user_s: f64| {
            Some(CpuParts {
                tree_system_s,
                kswapd_s,
                runtime_user_s,
                farmem_procs_user_s: 0.5,
            })
        };
        let rows = vec![
            RunRow {
                in_pages: Some(0),
                out_pages: Some(0),
                cpu: Some(CpuParts {
                    tree_system_s: 0.25,
                    ..CpuParts::default()
                }),
                ..row(SystemKind::Local, Workload::Seq, 1.0, Some(0.1), None)
            },
            RunRow {
                in_pages: Some(11_000),
                out_pages: Some(11_000),
                cpu: cpu(1.0, 0.0, 0.7),
                ..row(SystemKind::Farmem, Workload::Seq, 0.5, Some(2.0), None)
            },
            RunRow {
                in_pages: Some(10_000),
                out_pages: Some(10_000),
                cpu: Some(CpuParts {
                    tree_system_s: 1.5,
                    kswapd_s: 0.5,
                    ..CpuParts::default()
                }),
                ..row(SystemKind::Swap, Workload::Seq, 0.5, Some(3.0), None)
            },
            row(SystemKind::Zram, Workload::Seq, 0.5, None, None),
        ];
        let v: serde_json::Value = serde_json::from_str(&json(&rows)).unwrap();
        let list = v.as_array().unwrap();
        let (local, farmem, swap, zram) = (&list[0], &list[1], &list[2], &list[3]);
        assert_eq!(local["in_pages"], 0);
        assert_eq!(local["cpu_s"], 0.25);
        assert!(local["us_per_page"].is_null(), "nothing moved: {local}");
        assert!(local["moved_vs_swap"].is_null(), "no swap run at 1.0");
        assert_eq!(farmem["out_pages"], 11_000);
        assert_eq!(farmem["cpu_s"], 2.2);
        assert!((farmem["us_per_page"].as_f64().unwrap() - 100.0).abs() < 1e-9);
        assert!((farmem["moved_vs_swap"].as_f64().unwrap() - 1.1).abs() < 1e-9);
        assert_eq!(swap["us_per_page"], 100.0);
        assert_eq!(swap["moved_vs_swap"], 1.0);
        for key in ["in_pages", "cpu_s", "us_per_page", "moved_vs_swap"] {
            assert!(zram[key].is_null(), "skipped row: {zram}");
        }
        let t = table(&rows, &[(Workload::Seq, 1 << 30)]);
        assert!(t.contains("-- cost of paging"), "{t}");
        let cost_header = t
            .lines()
            .find(|l| l.starts_with("system") && l.contains("us/page"))
            .unwrap();
        assert!(cost_header.ends_with("cpu_s ="), "{cost_header}");
        let farmem_cost = t
            .lines()
            .filter(|l| l.starts_with("farmem "))
            .nth(1)
            .expect("a cost row after the figures row");
        assert!(
            farmem_cost.contains("11000")
                && farmem_cost.contains("2.20")
                && farmem_cost.contains("100.0")
                && farmem_cost.contains("1.10")
                && farmem_cost
                    .contains("tree sys 1.00 + runtime user 0.70 + farmem procs user 0.50"),
            "{farmem_cost}"
        );
        let swap_cost = t.lines().filter(|l| l.starts_with("swap ")).nth(1).unwrap();
        assert!(
            swap_cost.ends_with("tree sys 1.50 + kswapd 0.50"),
            "{swap_cost}"
        );
        // The cost block's columns line up with its header.
        let col = cost_header.find("in_pages").unwrap() + "in_pages".len();
        assert_eq!(
            &swap_cost[col - 5..col],
            "10000",
            "{swap_cost}\n{cost_header}"
        );
    }

    #[test]
    fn ratios_follow_the_workload_metric() {
        let local = row(SystemKind::Local, Workload::Seq, 1.0, Some(0.1), None);
        let swap = row(SystemKind::Swap, Workload::Seq, 0.5, Some(30.0), None);
        assert!((swap.ratio_to(&local).unwrap() - 300.0).abs() < 1e-9);
        let l = row(
            SystemKind::Local,
            Workload::Redis,
            1.0,
            None,
            Some(100_000.0),
        );
        let f = row(
            SystemKind::Farmem,
            Workload::Redis,
            0.5,
            None,
            Some(25_000.0),
        );
        assert!((f.ratio_to(&l).unwrap() - 0.25).abs() < 1e-9);
        assert!((f.slowdown_vs(&l).unwrap() - 4.0).abs() < 1e-9);
        let skipped = row(SystemKind::Zram, Workload::Redis, 0.5, None, None);
        assert_eq!(skipped.ratio_to(&l), None);
    }

    #[test]
    fn farmem_tcp_is_named_in_json_table_and_plot() {
        let rows = vec![
            row(SystemKind::Local, Workload::Seq, 1.0, Some(0.1), None),
            row(SystemKind::Farmem, Workload::Seq, 0.5, Some(2.0), None),
            RunRow {
                moved_bytes: Some(3 << 20),
                ..row(SystemKind::FarmemTcp, Workload::Seq, 0.5, Some(4.0), None)
            },
        ];
        let v: serde_json::Value = serde_json::from_str(&json(&rows)).unwrap();
        let names: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["system"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["local", "farmem", "farmem-tcp"]);
        let t = table(&rows, &[(Workload::Seq, 1 << 30)]);
        let tcp = t.lines().find(|l| l.starts_with("farmem-tcp ")).unwrap();
        assert!(tcp.contains("3.0 MiB") && tcp.contains("40.00"), "{tcp}");
        // The columns line up: every row's fraction starts where the header's does.
        let header = t.lines().find(|l| l.starts_with("system")).unwrap();
        let col = header.find(" local").unwrap();
        for l in t.lines().filter(|l| l.starts_with("farmem")) {
            assert_eq!(&l[col..col + 6], "  0.50", "{l}\n{header}");
        }
        let svg = svg(&rows);
        assert!(svg.contains("<title>farmem-tcp: 40.00×</title>"), "{svg}");
        assert!(
            svg.contains(">farmem-tcp</text>"),
            "the legend names it: {svg}"
        );
        assert_eq!(svg.matches("<title>").count(), 3, "{svg}");
    }

    #[test]
    fn table_and_svg_show_every_system() {
        let rows = vec![
            row(SystemKind::Local, Workload::Seq, 1.0, Some(0.1), None),
            row(SystemKind::Swap, Workload::Seq, 0.5, Some(30.0), None),
            RunRow {
                note: Some("skipped: no zram".into()),
                ..row(SystemKind::Zram, Workload::Seq, 0.5, None, None)
            },
        ];
        let t = table(&rows, &[(Workload::Seq, 1 << 30)]);
        assert!(t.contains("peak memory 1.00 GiB"), "{t}");
        assert!(t.contains("skipped: no zram"));
        let swap_line = t.lines().find(|l| l.starts_with("swap")).unwrap();
        assert!(
            swap_line.contains("300.00") && swap_line.contains("1.00"),
            "{swap_line}"
        );
        let svg = svg(&rows);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(
            svg.matches("<title>").count(),
            2,
            "local and swap bars: {svg}"
        );
        assert!(svg.contains("seq"));
    }

    #[test]
    fn a_remote_rows_donor_cpu_and_wire_bytes_are_per_page_and_apart_from_cpu_s() {
        let rows = vec![
            RunRow {
                in_pages: Some(6_000),
                out_pages: Some(4_000),
                cpu: Some(CpuParts {
                    tree_system_s: 0.2,
                    runtime_user_s: 0.1,
                    ..CpuParts::default()
                }),
                remote: Some(RemoteUse {
                    donor_cpu_s: 0.05,
                    wire_bytes: 43_000_000,
                }),
                ..row(
                    SystemKind::FarmemRemote,
                    Workload::Seq,
                    0.5,
                    Some(2.0),
                    None,
                )
            },
            RunRow {
                in_pages: Some(6_000),
                out_pages: Some(4_000),
                ..row(SystemKind::Farmem, Workload::Seq, 0.5, Some(2.0), None)
            },
        ];
        let v: serde_json::Value = serde_json::from_str(&json(&rows)).unwrap();
        let (remote, farmem) = (&v[0], &v[1]);
        let near = |v: &serde_json::Value, want: f64| (v.as_f64().unwrap() - want).abs() < 1e-6;
        // The program's machine: 0.3 s over 10,000 pages; the donor's 0.05 s is not in it.
        assert!(near(&remote["client_us_per_page"], 30.0), "{remote}");
        assert_eq!(remote["client_us_per_page"], remote["us_per_page"]);
        assert!(near(&remote["donor_us_per_page"], 5.0), "{remote}");
        assert!(near(&remote["wire_bytes_per_page"], 4300.0), "{remote}");
        assert!(farmem["donor_us_per_page"].is_null());
        assert!(farmem["wire_bytes_per_page"].is_null());
        let t = table(&rows, &[(Workload::Seq, 1 << 30)]);
        let cost = t
            .lines()
            .filter(|l| l.starts_with("farmem-remote "))
            .nth(1)
            .expect("a cost row");
        assert!(cost.contains(" 5.0 ") && cost.contains(" 4300 "), "{cost}");
        // Nothing moved: no figure per page rather than a division by zero.
        let idle = RunRow {
            in_pages: Some(0),
            out_pages: Some(0),
            ..rows[0].clone()
        };
        assert_eq!(idle.donor_us_per_page(), None);
        assert_eq!(idle.wire_bytes_per_page(), None);
    }
}
