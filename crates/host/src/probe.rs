//! What the donor's host can really lend: its memory (`MemTotal`), its memory cgroup's limit, and
//! whether it is under memory pressure now (`MemAvailable` below a watermark).
//!
//! A donor that promised more than its machine holds would be OOM-killed once filled, losing
//! every client's pages; so `--capacity` above the host's memory is refused at start, and a host
//! short of memory stops the donor from lending new slabs ([`Status::MemoryPressure`]). With
//! `--keep-free` the donor also takes slabs back when `MemAvailable` falls below it (see
//! `reclaim`), reading `MemAvailable` from [`MEMINFO`] or, for tests, another file in the same
//! format ([`mem_available_bytes_in`]).
//!
//! [`Status::MemoryPressure`]: farmem_proto::Status::MemoryPressure
use std::path::Path;

/// The default memory-pressure watermark: the donor lends no new slab while the host's
/// `MemAvailable` is below this fraction of `MemTotal` (5 %)…
pub const PRESSURE_WATERMARK_PERCENT: u64 = 5;
/// …or below this many bytes, whichever is larger (256 MiB).
pub const PRESSURE_WATERMARK_MIN_BYTES: u64 = 256 << 20;

/// One `/proc/meminfo` field in bytes (`None` if absent or unreadable).
fn meminfo_field(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        let kib: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
        kib.checked_mul(1024)
    })
}

/// Where the kernel reports the machine's memory.
pub const MEMINFO: &str = "/proc/meminfo";

fn meminfo(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(MEMINFO).ok()?;
    meminfo_field(&text, field)
}

/// `MemAvailable` read from `path`, a file in the format of `/proc/meminfo`, if readable.
pub fn mem_available_bytes_in(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    meminfo_field(&text, "MemAvailable")
}

/// The machine's memory (`MemTotal`), if readable.
pub fn mem_total_bytes() -> Option<u64> {
    meminfo("MemTotal")
}

/// Checks a `--keep-free` watermark against the machine: one at or above its memory
/// (`MemTotal`) could never be met, so the server would lend nothing and ask for everything
/// back. The error names the flag and the machine's memory.
pub fn check_keep_free(keep_free_bytes: u64) -> Result<(), String> {
    match mem_total_bytes() {
        Some(total) if keep_free_bytes >= total => Err(format!(
            "--keep-free {keep_free_bytes} bytes is not below this machine's memory ({total} \
             bytes): nothing could ever be lent; give a watermark such as a tenth of it"
        )),
        _ => Ok(()),
    }
}

/// The memory the host could still hand out (`MemAvailable`), if readable.
pub fn mem_available_bytes() -> Option<u64> {
    meminfo("MemAvailable")
}

/// The memory limit of this process's own cgroup (v2 `memory.max`, else v1
/// `memory.limit_in_bytes`), if it has one.
pub fn cgroup_limit_bytes() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_limit_in(&cgroups, Path::new("/sys/fs/cgroup"))
}

/// [`cgroup_limit_bytes`] for the `/proc/self/cgroup` text `cgroups` under the mount `root`.
fn cgroup_limit_in(cgroups: &str, root: &Path) -> Option<u64> {
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        let file = if controllers.is_empty() {
            root.join(rel).join("memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            root.join("memory").join(rel).join("memory.limit_in_bytes")
        } else {
            continue;
        };
        if let Ok(v) = std::fs::read_to_string(&file) {
            // "max" (v2) or a huge number (v1, no limit) mean unlimited.
            if let Ok(n) = v.trim().parse::<u64>() {
                if n < (1 << 60) {
                    return Some(n);
                }
            }
        }
    }
    None
}

/// The most memory this donor's host can lend: the smaller of `MemTotal` and the cgroup
/// limit, if either is known.
pub fn memory_limit_bytes() -> Option<(u64, &'static str)> {
    let total = mem_total_bytes().map(|b| (b, "the machine's memory (MemTotal)"));
    let cg = cgroup_limit_bytes().map(|b| (b, "the donor's memory cgroup limit"));
    match (total, cg) {
        (Some(t), Some(c)) => Some(if c.0 < t.0 { c } else { t }),
        (t, c) => t.or(c),
    }
}

/// The default watermark for a host with `total` bytes of memory.
pub fn default_watermark_bytes(total: u64) -> u64 {
    (total / 100 * PRESSURE_WATERMARK_PERCENT).max(PRESSURE_WATERMARK_MIN_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_are_read_in_bytes() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2000 kB\n";
        assert_eq!(meminfo_field(text, "MemTotal"), Some(24_000_000 * 1024));
        assert_eq!(meminfo_field(text, "MemAvailable"), Some(2000 * 1024));
        assert_eq!(meminfo_field(text, "Mem"), None);
        assert_eq!(meminfo_field(text, "SwapTotal"), None);
    }

    #[test]
    fn cgroup_limits_are_found_for_v1_and_v2() {
        let dir = std::env::temp_dir().join(format!("farmem-cg-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("a/b/memory.max"), "1073741824\n").unwrap();
        assert_eq!(cgroup_limit_in("0::/a/b\n", &dir), Some(1 << 30));
        std::fs::write(dir.join("a/b/memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_limit_in("0::/a/b\n", &dir), None);
        std::fs::create_dir_all(dir.join("memory/x")).unwrap();
        std::fs::write(dir.join("memory/x/memory.limit_in_bytes"), "2147483648\n").unwrap();
        assert_eq!(
            cgroup_limit_in("5:cpu:/y\n4:memory:/x\n", &dir),
            Some(2 << 30)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_watermark_has_a_floor() {
        assert_eq!(
            default_watermark_bytes(1 << 30),
            PRESSURE_WATERMARK_MIN_BYTES
        );
        assert_eq!(default_watermark_bytes(100 << 30), 5 << 30);
    }
}
