//! What farmem does not manage: the process's resident memory outside the regions, measured
//! from /proc/self/smaps, for the stats file's [`UnmanagedReport`].
//!
//! Only region pages (the heap span's chunks and large private anonymous mappings) are paged
//! and bounded by `--local-mem`. Thread stacks, small mappings, file-backed memory (the
//! program's code and libraries, mapped files) and a managed runtime's own heap (a JVM's, Go's)
//! are ordinary memory the kernel keeps resident as it likes; a program whose memory is mostly
//! there gains nothing from farmem and may use far more than its budget. The report makes that
//! visible: the RSS of the process beside its managed resident memory, and the biggest
//! unmanaged mappings by name.
//!
//! # Design
//!
//! - [`parse_smaps`] is a pure parser of the text of /proc/PID/smaps: one [`Vma`] per mapping
//!   with its Rss and Anonymous bytes and its pathname column. [`account`] splits them between
//!   the regions, farmem's own memory (the write-back pool, memory slabs: not the program's,
//!   and accounted by the runtime) and the rest, the unmanaged memory. [`measure`] reads /proc/self/smaps and /proc/self/status and does both.
//! - smaps gives Rss per VMA only, so a VMA is either managed or not: it is managed iff it lies
//!   entirely inside one managed range, after adjacent managed ranges are joined (two heap
//!   chunks registered one after the other may be one VMA). A region is always a whole
//!   mapping or a whole heap chunk made read-write in one `mprotect`, so VMAs do not straddle
//!   region boundaries; one that did (a partial `mprotect` of a region and its neighbour
//!   merging) would be counted as unmanaged entirely, an overstatement the warning can afford.
//! - Reading smaps walks every page table of the process: milliseconds for a big one. It is
//!   done only by the stats writer thread (once a second) and at exit, never on a fault path.
//!
//! # Limitations
//!
//! - A measurement once a second misses a peak of unmanaged memory shorter than that;
//!   `peak_rss_bytes` (the kernel's VmHWM) does not.

use farmem_runtime::{UnmanagedMapping, UnmanagedReport};

/// How many of the biggest unmanaged mappings a report names.
pub const BIGGEST: usize = 5;

/// One mapping (VMA) of /proc/PID/smaps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vma {
    pub start: usize,
    pub end: usize,
    /// `Rss:` in bytes.
    pub rss_bytes: u64,
    /// `Anonymous:` in bytes (private anonymous pages, including copy-on-write copies of file
    /// pages).
    pub anon_bytes: u64,
    /// The pathname column; `[anon]` when it is empty.
    pub name: String,
}

/// A line of smaps that cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SmapsError {
    #[error("line {line_no} of smaps is not a mapping header (`start-end perms offset dev inode [path]`): {line:?}")]
    BadHeader { line_no: usize, line: String },
    #[error("line {line_no} of smaps has no size in kB: {line:?}")]
    BadSize { line_no: usize, line: String },
}

/// Parses the text of /proc/PID/smaps. Keys other than `Rss` and `Anonymous` are ignored (the
/// kernel adds new ones), so are blank lines; a field line before the first header is ignored
/// too (a truncated read). A header whose addresses are not hex, or an `Rss`/`Anonymous` line
/// without a number of kB, is an error naming the line.
pub fn parse_smaps(text: &str) -> Result<Vec<Vma>, SmapsError> {
    let mut vmas: Vec<Vma> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let first = line.split_whitespace().next().unwrap_or("");
        if first.is_empty() {
            continue;
        }
        if let Some(key) = first.strip_suffix(':') {
            // A field line, `Key:   value [kB]`.
            let Some(vma) = vmas.last_mut() else {
                continue;
            };
            let slot = match key {
                "Rss" => &mut vma.rss_bytes,
                "Anonymous" => &mut vma.anon_bytes,
                _ => continue,
            };
            *slot = parse_kb(line).ok_or_else(|| SmapsError::BadSize {
                line_no,
                line: line.into(),
            })?;
            continue;
        }
        let bad = || SmapsError::BadHeader {
            line_no,
            line: line.into(),
        };
        let (start, end) = first.split_once('-').ok_or_else(bad)?;
        let start = usize::from_str_radix(start, 16).map_err(|_| bad())?;
        let end = usize::from_str_radix(end, 16).map_err(|_| bad())?;
        if end < start {
            return Err(bad());
        }
        // The pathname is what follows the fifth column (it may hold spaces).
        let mut rest = line.trim_start();
        for _ in 0..5 {
            let t = rest.trim_start();
            let cut = t.find(char::is_whitespace).unwrap_or(t.len());
            if t.is_empty() {
                return Err(bad());
            }
            rest = &t[cut..];
        }
        let name = rest.trim();
        vmas.push(Vma {
            start,
            end,
            rss_bytes: 0,
            anon_bytes: 0,
            name: if name.is_empty() { "[anon]" } else { name }.into(),
        });
    }
    Ok(vmas)
}

/// `Key:   N kB` → N × 1024.
fn parse_kb(line: &str) -> Option<u64> {
    let mut it = line.split_whitespace().skip(1);
    let n: u64 = it.next()?.parse().ok()?;
    match it.next() {
        Some("kB") => n.checked_mul(1024),
        _ => None,
    }
}

/// One measurement: the process's resident memory split into managed and unmanaged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unmanaged {
    /// Sum of every mapping's Rss.
    pub rss_bytes: u64,
    /// Rss of the mappings inside regions.
    pub managed_rss_bytes: u64,
    /// Rss of farmem's own memory: the write-back pool, memory slabs.
    pub farmem_rss_bytes: u64,
    /// Rss of the others.
    pub unmanaged_bytes: u64,
    /// Their anonymous part.
    pub anon_unmanaged_bytes: u64,
    /// The unmanaged mappings with the most Rss, largest first (at most [`BIGGEST`]).
    pub biggest: Vec<UnmanagedMapping>,
}

/// Sorts `ranges` ((start, length)) and joins those that overlap or touch: (start, end).
fn join(ranges: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut v: Vec<(usize, usize)> = ranges
        .iter()
        .filter(|r| r.1 > 0)
        .map(|&(s, l)| (s, s.saturating_add(l)))
        .collect();
    v.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Whether `v` lies entirely inside one of the `joined` ranges ((start, end), sorted).
fn inside(joined: &[(usize, usize)], v: &Vma) -> bool {
    // The last range starting at or before the VMA.
    let i = joined.partition_point(|r| r.0 <= v.start);
    i > 0 && v.end <= joined[i - 1].1
}

/// Splits `vmas` between the `regions`, farmem's `own` memory (the write-back pool, memory
/// slabs) and the rest, each range given as (start, length). A VMA is managed iff it lies
/// entirely inside one range once adjacent ranges are joined (see the module's design).
pub fn account(vmas: &[Vma], regions: &[(usize, usize)], own: &[(usize, usize)]) -> Unmanaged {
    let (regions, own) = (join(regions), join(own));
    let mut u = Unmanaged::default();
    let mut outside: Vec<&Vma> = Vec::new();
    for v in vmas {
        u.rss_bytes += v.rss_bytes;
        if inside(&regions, v) {
            u.managed_rss_bytes += v.rss_bytes;
        } else if inside(&own, v) {
            u.farmem_rss_bytes += v.rss_bytes;
        } else {
            u.unmanaged_bytes += v.rss_bytes;
            u.anon_unmanaged_bytes += v.anon_bytes;
            if v.rss_bytes > 0 {
                outside.push(v);
            }
        }
    }
    outside.sort_by(|a, b| b.rss_bytes.cmp(&a.rss_bytes).then(a.start.cmp(&b.start)));
    u.biggest = outside
        .into_iter()
        .take(BIGGEST)
        .map(|v| UnmanagedMapping {
            start: v.start as u64,
            len: (v.end - v.start) as u64,
            rss_bytes: v.rss_bytes,
            name: v.name.clone(),
        })
        .collect();
    u
}

/// `VmHWM:` of /proc/PID/status text, in bytes.
pub fn peak_rss_of_status(status: &str) -> Option<u64> {
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(parse_kb)
}

/// Measures this process now, given its regions and farmem's own memory ((start, length)).
/// Errors when /proc/self/smaps cannot be read or parsed.
pub fn measure(
    regions: &[(usize, usize)],
    own: &[(usize, usize)],
) -> Result<(Unmanaged, Option<u64>), String> {
    let text = std::fs::read_to_string("/proc/self/smaps")
        .map_err(|e| format!("reading /proc/self/smaps: {e}"))?;
    let vmas = parse_smaps(&text).map_err(|e| e.to_string())?;
    let peak = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| peak_rss_of_status(&s));
    Ok((account(&vmas, regions, own), peak))
}

/// The report across measurements: the latest figures, and the peaks.
#[derive(Default)]
pub struct Tracker {
    report: Option<UnmanagedReport>,
}

impl Tracker {
    /// No measurement yet.
    pub const fn new() -> Tracker {
        Tracker { report: None }
    }

    /// Adds a measurement (with the process's VmHWM, if read) and returns the report.
    pub fn update(&mut self, m: Unmanaged, peak_rss_bytes: Option<u64>) -> UnmanagedReport {
        let r = self.report.get_or_insert_with(UnmanagedReport::default);
        if m.unmanaged_bytes > r.peak_unmanaged_bytes || r.biggest_at_peak.is_empty() {
            r.peak_unmanaged_bytes = r.peak_unmanaged_bytes.max(m.unmanaged_bytes);
            r.biggest_at_peak = m.biggest.clone();
        }
        r.peak_anon_unmanaged_bytes = r.peak_anon_unmanaged_bytes.max(m.anon_unmanaged_bytes);
        r.rss_bytes = m.rss_bytes;
        r.peak_rss_bytes = peak_rss_bytes
            .unwrap_or(0)
            .max(r.peak_rss_bytes)
            .max(m.rss_bytes);
        r.managed_rss_bytes = m.managed_rss_bytes;
        r.farmem_rss_bytes = m.farmem_rss_bytes;
        r.unmanaged_bytes = m.unmanaged_bytes;
        r.anon_unmanaged_bytes = m.anon_unmanaged_bytes;
        r.biggest = m.biggest;
        r.clone()
    }

    /// The last report, if any measurement was made.
    pub fn last(&self) -> Option<UnmanagedReport> {
        self.report.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0c0a00000-55d0c0a02000 r--p 00000000 08:01 1234                       /usr/bin/python3.11
Size:                  8 kB
KernelPageSize:        4 kB
Rss:                   8 kB
Pss:                   8 kB
Anonymous:             0 kB
VmFlags: rd mr mw me sd
7f0000000000-7f0004000000 rw-p 00000000 00:00 0
Size:              65536 kB
Rss:               65536 kB
Anonymous:         65536 kB
THPeligible:    0
VmFlags: rd wr mr mw me ac sd
7f1000000000-7f1002000000 rw-p 00000000 00:00 0
Rss:               32768 kB
Anonymous:         32768 kB
7f1002000000-7f1004000000 rw-p 00000000 00:00 0
Rss:               16384 kB
Anonymous:         16384 kB
7f2000000000-7f2000100000 rw-s 00000000 00:01 99                         /memfd:my data (deleted)
Rss:                1024 kB
Anonymous:             0 kB
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]
Rss:                 132 kB
Anonymous:           132 kB
7ffd00000000-7ffd00001000 ---p 00000000 00:00 0
Rss:                   0 kB
";

    #[test]
    fn smaps_parses_ranges_names_and_kb() {
        let v = parse_smaps(SMAPS).unwrap();
        assert_eq!(v.len(), 7);
        assert_eq!(
            v[0],
            Vma {
                start: 0x55d0c0a00000,
                end: 0x55d0c0a02000,
                rss_bytes: 8 << 10,
                anon_bytes: 0,
                name: "/usr/bin/python3.11".into(),
            }
        );
        assert_eq!(v[1].name, "[anon]");
        assert_eq!((v[1].rss_bytes, v[1].anon_bytes), (64 << 20, 64 << 20));
        assert_eq!(v[4].name, "/memfd:my data (deleted)", "spaces kept");
        assert_eq!(v[5].name, "[stack]");
        assert_eq!(v[6].rss_bytes, 0);
    }

    #[test]
    fn a_vma_inside_joined_managed_ranges_is_managed() {
        let v = parse_smaps(SMAPS).unwrap();
        // Two regions back to back cover the VMAs at 0x7f1000000000 and 0x7f1002000000 (the
        // second VMA could as well be one VMA over both); the pool is elsewhere.
        let managed = [(0x7f1002000000, 32 << 20), (0x7f1000000000, 32 << 20)];
        let pool = [(0x7e0000000000, 1 << 20), (0x7f2000000000, 1 << 20)];
        let u = account(&v, &managed, &[]);
        let rss = (8 << 10) + (64 << 20) + (32 << 20) + (16 << 20) + (1 << 20) + (132 << 10);
        assert_eq!(u.rss_bytes, rss);
        assert_eq!(u.managed_rss_bytes, 48 << 20);
        assert_eq!(u.unmanaged_bytes, rss - (48 << 20));
        assert_eq!(u.anon_unmanaged_bytes, (64 << 20) + (132 << 10));
        let names: Vec<&str> = u.biggest.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "[anon]",
                "/memfd:my data (deleted)",
                "[stack]",
                "/usr/bin/python3.11"
            ],
            "largest first, nothing without Rss"
        );
        assert_eq!(u.biggest[0].len, 64 << 20);
        // One merged VMA over both regions is still managed.
        let merged = [Vma {
            start: 0x7f1000000000,
            end: 0x7f1004000000,
            rss_bytes: 4096,
            anon_bytes: 4096,
            name: "[anon]".into(),
        }];
        assert_eq!(account(&merged, &managed, &[]).managed_rss_bytes, 4096);
        // farmem's own memory (a memory slab here) is neither managed nor unmanaged.
        let u = account(&v, &managed, &pool);
        assert_eq!(u.farmem_rss_bytes, 1 << 20);
        assert_eq!(u.unmanaged_bytes, rss - (49 << 20));
        assert!(u
            .biggest
            .iter()
            .all(|m| m.name != "/memfd:my data (deleted)"));
    }

    #[test]
    fn a_vma_only_partly_inside_a_managed_range_is_unmanaged() {
        let v = parse_smaps(SMAPS).unwrap();
        // Half of the 64 MiB anonymous VMA, either half.
        for managed in [
            [(0x7f0000000000, 32 << 20)],
            [(0x7f0002000000, 32 << 20)],
            [(0x7effff000000, 48 << 20)],
        ] {
            let u = account(&v[1..2], &managed, &[]);
            assert_eq!((u.managed_rss_bytes, u.unmanaged_bytes), (0, 64 << 20));
        }
        let u = account(&v[1..2], &[(0x7effff000000, 128 << 20)], &[]);
        assert_eq!((u.managed_rss_bytes, u.unmanaged_bytes), (64 << 20, 0));
    }

    #[test]
    fn at_most_five_biggest() {
        let text: String = (0..8)
            .map(|i| {
                format!(
                    "{:x}-{:x} rw-p 0 00:00 0\nRss: {} kB\n",
                    i << 20,
                    (i + 1) << 20,
                    i + 1
                )
            })
            .collect();
        let u = account(&parse_smaps(&text).unwrap(), &[], &[]);
        assert_eq!(u.biggest.len(), BIGGEST);
        assert_eq!(u.biggest[0].rss_bytes, 8 << 10);
        assert_eq!(u.biggest[4].rss_bytes, 4 << 10);
    }

    #[test]
    fn malformed_smaps_is_an_error_naming_the_line_never_a_panic() {
        let e = parse_smaps("zz-10 rw-p 0 00:00 0\n").unwrap_err();
        assert_eq!(
            e,
            SmapsError::BadHeader {
                line_no: 1,
                line: "zz-10 rw-p 0 00:00 0".into()
            }
        );
        assert!(e.to_string().contains("line 1"), "{e}");
        for text in [
            "10-20 rw-p\n",
            "20-10 rw-p 0 00:00 0\n",
            "garbage\n",
            "10-20 rw-p 0 00:00 0\nRss: many kB\n",
            "10-20 rw-p 0 00:00 0\nRss: 4 MB\n",
            "10-20 rw-p 0 00:00 0\nRss:\n",
            "10-20 rw-p 0 00:00 0\nRss: 99999999999999999999 kB\n",
        ] {
            assert!(parse_smaps(text).is_err(), "{text:?}");
        }
        // Unknown keys, other values, blank lines and fields before any header are ignored.
        let v = parse_smaps(
            "Rss: 4 kB\n\n10-2000 rw-p 0 00:00 0\nVmFlags: rd wr\nProtectionKey: 0\nRss: 4 kB\n",
        )
        .unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].rss_bytes, 4096);
    }

    #[test]
    fn status_gives_the_peak_rss() {
        let s = "Name:\tpython3\nVmPeak:\t  100 kB\nVmHWM:\t    2048 kB\nVmRSS:\t 1024 kB\n";
        assert_eq!(peak_rss_of_status(s), Some(2 << 20));
        assert_eq!(peak_rss_of_status("Name: x\n"), None);
    }

    #[test]
    fn the_tracker_keeps_the_peak_and_its_mappings() {
        let mut t = Tracker::default();
        // n unmanaged bytes, `anon` of them anonymous.
        let big = |n: u64, anon: u64| Unmanaged {
            rss_bytes: n + 10,
            managed_rss_bytes: 10,
            farmem_rss_bytes: 0,
            unmanaged_bytes: n,
            anon_unmanaged_bytes: anon,
            biggest: vec![UnmanagedMapping {
                rss_bytes: n,
                name: format!("m{n}"),
                ..UnmanagedMapping::default()
            }],
        };
        t.update(big(5, 5), Some(20));
        t.update(big(50, 2), None);
        let r = t.update(big(7, 6), Some(30));
        assert_eq!((r.unmanaged_bytes, r.peak_unmanaged_bytes), (7, 50));
        assert_eq!(
            (r.anon_unmanaged_bytes, r.peak_anon_unmanaged_bytes),
            (6, 6),
            "the anonymous part's own peak, not its share at the peak of all"
        );
        assert_eq!(r.biggest[0].name, "m7");
        assert_eq!(r.biggest_at_peak[0].name, "m50");
        assert_eq!(r.peak_rss_bytes, 60, "at least the largest RSS measured");
    }

    #[test]
    fn this_process_measures() {
        let (u, peak) = measure(&[], &[]).unwrap();
        assert!(u.rss_bytes > 0 && u.unmanaged_bytes == u.rss_bytes, "{u:?}");
        assert!(peak.unwrap() >= u.rss_bytes / 2);
    }
}
