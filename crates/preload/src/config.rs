//! The library's configuration, read from the environment `farmem run` prepares.
//!
//! `farmem run` passes its options as `FARMEM_RUN_*` variables (sizes in plain bytes). The
//! library reads them once in its constructor and then removes them, and its own entry in
//! `LD_PRELOAD`, from the environment: a program the child execs is not under farmem unless it
//! is run through `farmem run` again.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;

/// Prefix of every variable `farmem run` sets for the library.
pub const PREFIX: &str = "FARMEM_RUN_";
/// Local memory budget in bytes (required).
pub const BUDGET_BYTES: &str = "FARMEM_RUN_BUDGET_BYTES";
/// Comma-separated donor addresses (`host:port`); empty means the runtime's embedded donor.
pub const DONORS: &str = "FARMEM_RUN_DONORS";
/// File holding the donors' token.
pub const TOKEN_FILE: &str = "FARMEM_RUN_TOKEN_FILE";
/// Eviction policy name.
pub const EVICT: &str = "FARMEM_RUN_EVICT";
/// Prefetcher name.
pub const PREFETCH: &str = "FARMEM_RUN_PREFETCH";
/// How prefetched pages are made local: `buffer` or `marker`.
pub const PREFETCH_INSTALL: &str = "FARMEM_RUN_PREFETCH_INSTALL";
/// JSON stats file, rewritten every second and at exit.
pub const STATS_FILE: &str = "FARMEM_RUN_STATS_FILE";
/// Trace file the runtime records accesses into.
pub const RECORD_TRACE: &str = "FARMEM_RUN_RECORD_TRACE";
/// Private anonymous mappings of at least this many bytes become regions.
pub const MMAP_THRESHOLD_BYTES: &str = "FARMEM_RUN_MMAP_THRESHOLD_BYTES";
/// Virtual size reserved for the heap span.
pub const HEAP_RESERVE_BYTES: &str = "FARMEM_RUN_HEAP_RESERVE_BYTES";
/// `1`: place the heap and mappings but start no runtime (diagnostics: isolates the
/// allocator from the paging).
pub const ALLOCATOR_ONLY: &str = "FARMEM_RUN_ALLOCATOR_ONLY";
/// The `farmem` binary (for the runtime, if it has to start anything).
pub const FARMEM_BIN: &str = "FARMEM_RUN_BIN";
/// `LD_PRELOAD` as it was before `farmem run` added the library ("" = it was unset).
pub const ORIG_LD_PRELOAD: &str = "FARMEM_RUN_ORIG_LD_PRELOAD";

/// Default mmap threshold: 1 MiB.
pub const DEFAULT_MMAP_THRESHOLD_BYTES: u64 = 1 << 20;
/// Default heap span: 256 GiB of address space (costs nothing until used).
pub const DEFAULT_HEAP_RESERVE_BYTES: u64 = 256 << 30;

/// What `farmem run` asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub budget_bytes: u64,
    pub donors: Vec<String>,
    pub token_file: Option<PathBuf>,
    pub evict: Option<String>,
    pub prefetch: Option<String>,
    pub prefetch_install: Option<String>,
    pub stats_file: Option<PathBuf>,
    pub record_trace: Option<PathBuf>,
    pub mmap_threshold_bytes: u64,
    pub heap_reserve_bytes: u64,
    pub allocator_only: bool,
    pub farmem_bin: Option<PathBuf>,
    pub orig_ld_preload: Option<String>,
}

/// A variable that is present but unusable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub var: &'static str,
    pub value: String,
    pub expected: &'static str,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={:?} is not {}; start programs through `farmem run` rather than setting it by hand",
            self.var, self.value, self.expected
        )
    }
}

impl Config {
    /// Reads the configuration from `vars`. `Ok(None)`: the library was preloaded without
    /// `farmem run` (no budget given).
    pub fn from_vars(vars: &HashMap<String, String>) -> Result<Option<Config>, ConfigError> {
        let Some(budget) = vars.get(BUDGET_BYTES) else {
            return Ok(None);
        };
        let non_empty = |k: &str| vars.get(k).filter(|v| !v.is_empty()).cloned();
        let bytes = |k: &'static str, default: u64| -> Result<u64, ConfigError> {
            match vars.get(k) {
                None => Ok(default),
                Some(v) => v.parse::<u64>().map_err(|_| ConfigError {
                    var: k,
                    value: v.clone(),
                    expected: "a number of bytes",
                }),
            }
        };
        let budget_bytes = budget.parse::<u64>().map_err(|_| ConfigError {
            var: BUDGET_BYTES,
            value: budget.clone(),
            expected: "a number of bytes",
        })?;
        let heap_reserve_bytes = bytes(HEAP_RESERVE_BYTES, DEFAULT_HEAP_RESERVE_BYTES)?;
        if heap_reserve_bytes < (64 << 20) {
            return Err(ConfigError {
                var: HEAP_RESERVE_BYTES,
                value: heap_reserve_bytes.to_string(),
                expected: "at least 64 MiB",
            });
        }
        let allocator_only = match vars.get(ALLOCATOR_ONLY).map(String::as_str) {
            None | Some("") | Some("0") => false,
            Some("1") => true,
            Some(v) => {
                return Err(ConfigError {
                    var: ALLOCATOR_ONLY,
                    value: v.to_string(),
                    expected: "0 or 1",
                })
            }
        };
        Ok(Some(Config {
            budget_bytes,
            donors: vars
                .get(DONORS)
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default(),
            token_file: non_empty(TOKEN_FILE).map(PathBuf::from),
            evict: non_empty(EVICT),
            prefetch: non_empty(PREFETCH),
            prefetch_install: non_empty(PREFETCH_INSTALL),
            stats_file: non_empty(STATS_FILE).map(PathBuf::from),
            record_trace: non_empty(RECORD_TRACE).map(PathBuf::from),
            mmap_threshold_bytes: bytes(MMAP_THRESHOLD_BYTES, DEFAULT_MMAP_THRESHOLD_BYTES)?,
            heap_reserve_bytes,
            allocator_only,
            farmem_bin: non_empty(FARMEM_BIN).map(PathBuf::from),
            orig_ld_preload: vars.get(ORIG_LD_PRELOAD).cloned(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn absent_budget_means_not_started_by_farmem_run() {
        assert_eq!(Config::from_vars(&vars(&[])).unwrap(), None);
    }

    #[test]
    fn full_config_parses() {
        let c = Config::from_vars(&vars(&[
            (BUDGET_BYTES, "268435456"),
            (DONORS, "127.0.0.1:7000, 127.0.0.1:7001"),
            (EVICT, "clock"),
            (PREFETCH, ""),
            (PREFETCH_INSTALL, "marker"),
            (MMAP_THRESHOLD_BYTES, "4096"),
            (ALLOCATOR_ONLY, "1"),
            (ORIG_LD_PRELOAD, ""),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(c.budget_bytes, 256 << 20);
        assert_eq!(c.donors, vec!["127.0.0.1:7000", "127.0.0.1:7001"]);
        assert_eq!(c.evict.as_deref(), Some("clock"));
        assert_eq!(c.prefetch, None);
        assert_eq!(c.prefetch_install.as_deref(), Some("marker"));
        assert_eq!(c.mmap_threshold_bytes, 4096);
        assert_eq!(c.heap_reserve_bytes, DEFAULT_HEAP_RESERVE_BYTES);
        assert!(c.allocator_only);
        assert_eq!(c.orig_ld_preload.as_deref(), Some(""));
    }

    #[test]
    fn bad_numbers_are_errors_naming_the_variable() {
        let e = Config::from_vars(&vars(&[(BUDGET_BYTES, "1GiB")])).unwrap_err();
        assert_eq!(e.var, BUDGET_BYTES);
        assert!(e.to_string().contains("farmem run"));
        let e = Config::from_vars(&vars(&[(BUDGET_BYTES, "1"), (HEAP_RESERVE_BYTES, "4096")]))
            .unwrap_err();
        assert_eq!(e.var, HEAP_RESERVE_BYTES);
        let e =
            Config::from_vars(&vars(&[(BUDGET_BYTES, "1"), (ALLOCATOR_ONLY, "yes")])).unwrap_err();
        assert_eq!(e.var, ALLOCATOR_ONLY);
    }
}
