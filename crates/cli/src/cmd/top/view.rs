//! The text `farmem top` draws: the node, the programs (sorted as asked), the donors.
use super::host::{HostView, ProgramRow};
use crate::cmd::units::human_bytes;

/// How the programs are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortBy {
    Resident,
    Faults,
    Remote,
    Pid,
}

impl SortBy {
    /// The next order (the `s` key).
    pub fn next(self) -> SortBy {
        match self {
            SortBy::Resident => SortBy::Faults,
            SortBy::Faults => SortBy::Remote,
            SortBy::Remote => SortBy::Pid,
            SortBy::Pid => SortBy::Resident,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SortBy::Resident => "resident",
            SortBy::Faults => "faults/s",
            SortBy::Remote => "remote faults/s",
            SortBy::Pid => "pid",
        }
    }

    /// Orders `programs` this way (largest first, pids ascending).
    pub fn sort(self, programs: &mut [ProgramRow]) {
        let by = |f: fn(&ProgramRow) -> f64| {
            move |a: &ProgramRow, b: &ProgramRow| f(b).total_cmp(&f(a)).then(a.pid.cmp(&b.pid))
        };
        match self {
            SortBy::Resident => programs.sort_by(by(|p| p.resident_bytes as f64)),
            SortBy::Faults => programs.sort_by(by(|p| p.faults_per_s.total())),
            SortBy::Remote => programs.sort_by(by(|p| p.faults_per_s.remote)),
            SortBy::Pid => programs.sort_by_key(|p| p.pid),
        }
    }
}

/// The whole screen as lines (the caller cuts them to the terminal's size).
pub fn render(v: &HostView, sort: SortBy, interactive: bool) -> Vec<String> {
    let mut out = Vec::new();
    let keys = if interactive {
        " — s: sort, q: quit"
    } else {
        ""
    };
    out.push(format!(
        "farmem top — {} programs, {} donors — sorted by {}{keys}",
        v.programs.len(),
        v.donors.len(),
        sort.name()
    ));
    out.push(String::new());
    match (&v.node, &v.node_error) {
        (Some(n), _) => {
            out.push(format!(
                "NODE {}  capacity {}  used {}  free {}{}",
                n.socket,
                human_bytes(n.capacity_bytes),
                human_bytes(n.used_bytes),
                human_bytes(n.free_bytes),
                if n.under_pressure {
                    "  UNDER PRESSURE"
                } else {
                    ""
                }
            ));
            let mut rows = vec![cells(["CLIENT", "UID", "SLABS", "HELD", "PROGRAM"])];
            for c in &n.clients {
                rows.push(vec![
                    c.pid.to_string(),
                    c.uid.to_string(),
                    c.slabs.to_string(),
                    human_bytes(c.bytes),
                    c.program.map_or("-".into(), |p| p.to_string()),
                ]);
            }
            out.extend(table(&rows));
        }
        (None, Some(e)) => out.push(format!("NODE none: {e}")),
        (None, None) => out.push("NODE none".into()),
    }
    out.push(String::new());
    out.push("PROGRAMS (faults a second between their last two stats writes)".into());
    let mut rows = vec![cells([
        "PID",
        "PROCS",
        "LOCAL-MEM",
        "RESIDENT",
        "POOLED",
        "FAULTS/S",
        "ZERO",
        "POOL",
        "TIER",
        "REMOTE",
        "PREFETCH",
        "DEGRADED",
        "COMMAND",
    ])];
    let mut programs = v.programs.clone();
    sort.sort(&mut programs);
    for p in &programs {
        let f = p.faults_per_s;
        rows.push(vec![
            p.pid.to_string(),
            p.processes.to_string(),
            human_bytes(p.local_mem_bytes),
            human_bytes(p.resident_bytes),
            human_bytes(p.pooled_bytes),
            format!("{:.0}", f.total()),
            format!("{:.0}", f.zero),
            format!("{:.0}", f.pool),
            format!("{:.0}", f.host_tier),
            format!("{:.0}", f.remote),
            p.prefetch_accuracy
                .map_or("-".into(), |a| format!("{:.0}%", a * 100.0)),
            p.slabs_degraded.to_string(),
            p.command.clone(),
        ]);
    }
    out.extend(table(&rows));
    out.push(String::new());
    out.push("DONORS (used: what this host's programs hold there)".into());
    let mut rows = vec![cells([
        "ADDR", "HEALTH", "CAPACITY", "USED", "PROGRAMS", "RTT",
    ])];
    for d in &v.donors {
        rows.push(vec![
            d.addr.clone(),
            d.health.clone(),
            human_bytes(d.capacity_bytes),
            human_bytes(d.used_bytes),
            d.programs.to_string(),
            d.round_trip_ms
                .map_or("no answer".into(), |ms| format!("{ms:.2} ms")),
        ]);
    }
    out.extend(table(&rows));
    out
}

fn cells<const N: usize>(names: [&str; N]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// Rows in left-aligned columns, two spaces apart, indented by two.
fn table(rows: &[Vec<String>]) -> Vec<String> {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|r| {
            let mut line = String::from(" ");
            for (c, cell) in r.iter().enumerate() {
                let pad = width[c] - cell.chars().count();
                line.push(' ');
                line.push_str(cell);
                if c + 1 < r.len() {
                    line.push_str(&" ".repeat(pad + 1));
                }
            }
            line
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::host::{DonorRow, FaultRates};
    use super::*;

    fn program(pid: u32, resident: u64, remote: f64) -> ProgramRow {
        ProgramRow {
            pid,
            command: format!("prog{pid}"),
            processes: 1,
            local_mem_bytes: 64 << 20,
            resident_bytes: resident,
            pooled_bytes: 0,
            faults_per_s: FaultRates {
                remote,
                ..FaultRates::default()
            },
            prefetch_accuracy: None,
            slabs_degraded: 0,
        }
    }

    #[test]
    fn programs_are_sorted_as_asked_and_every_section_is_drawn() {
        let v = HostView {
            node: None,
            node_error: Some("no node on /x: refused".into()),
            programs: vec![program(10, 1 << 20, 50.0), program(20, 8 << 20, 5.0)],
            donors: vec![DonorRow {
                addr: "10.0.0.2:7070".into(),
                health: "live".into(),
                capacity_bytes: 1 << 30,
                used_bytes: 4 << 20,
                programs: 2,
                round_trip_ms: Some(0.25),
            }],
            interval_s: 1.0,
        };
        let order = |sort: SortBy| {
            let lines = render(&v, sort, true);
            let first = lines.iter().position(|l| l.contains("prog10")).unwrap();
            let second = lines.iter().position(|l| l.contains("prog20")).unwrap();
            first < second
        };
        assert!(!order(SortBy::Resident), "20 has more resident");
        assert!(order(SortBy::Remote), "10 faults more");
        assert!(order(SortBy::Pid));
        let text = render(&v, SortBy::Resident, true).join("\n");
        assert!(text.contains("NODE none: no node on /x: refused"), "{text}");
        assert!(text.contains("10.0.0.2:7070  live"), "{text}");
        assert!(text.contains("0.25 ms"), "{text}");
        assert!(text.contains("s: sort, q: quit"), "{text}");
        assert_eq!(SortBy::Pid.next(), SortBy::Resident);
    }
}
