//! The settings `farmem run` hands to the preload library: one typed struct both sides use.
//!
//! `farmem run` (crates/cli/src/cmd/run.rs) fills a [`RunSettings`] from its options and puts
//! it, as JSON, in the one environment variable [`RUN_SETTINGS_VAR`] of the program it starts;
//! the library's constructor (crates/preload/src/config.rs) reads it back with
//! [`RunSettings::decode`] and removes the variable.
//!
//! # Design
//!
//! - It lives in this small crate, beside the stats file and the modes it names, so both sides
//!   share the contract without the reader linking the writer.
//! - An environment variable, not a file or an inherited descriptor: it reaches the
//!   constructor with nothing to open, leaves nothing to clean up, and the program cannot have
//!   closed it before the library reads it.
//! - The JSON carries [`RUN_SETTINGS_VERSION`]; a library and a binary from different builds
//!   fail with an error saying so rather than misreading each other. Unknown fields are an
//!   error too.
//!
//! # Limitations
//!
//! Paths must be valid UTF-8 (JSON strings); `farmem run` refuses others with a clear error.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The environment variable holding the settings, as JSON.
pub const RUN_SETTINGS_VAR: &str = "FARMEM_RUN_SETTINGS";

/// Version of the settings' layout; bumped on every change of [`RunSettings`].
pub const RUN_SETTINGS_VERSION: u32 = 6;

/// In a tree directory ([`RunSettings::tree_dir`]): the folder of the processes' stats files
/// (`PID.json`, each a [`crate::StatsFile`]) and the budget coordinator's socket.
pub const TREE_STATS_DIR: &str = "stats";
pub const TREE_BUDGET_SOCKET: &str = "budget.sock";

/// The smallest heap reservation the library accepts.
pub const MIN_HEAP_RESERVE_BYTES: u64 = 64 << 20;

/// What `farmem run` asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSettings {
    /// [`RUN_SETTINGS_VERSION`] of the `farmem` binary that wrote them.
    pub version: u32,
    /// `--local-mem`: resident region pages and the write-back pool together
    /// ([`crate::LocalMemory`] splits it).
    pub local_mem_bytes: u64,
    /// Donor addresses (`host:port`); empty: the runtime's embedded donor.
    pub donors: Vec<String>,
    /// File holding the donors' token.
    pub token_file: Option<PathBuf>,
    /// Eviction policy name (the runtime's default when absent).
    pub evict: Option<String>,
    /// Prefetcher name (the runtime's default when absent).
    pub prefetch: Option<String>,
    /// How prefetched pages are made local: `buffer` or `marker`.
    pub prefetch_install: Option<String>,
    /// Whether pages leaving the process are sealed.
    pub seal: crate::SealMode,
    /// The host tier: the node `farmem run` found or started, or none.
    pub tier: crate::TierMode,
    /// Copies of each donor slab (the runtime's default when absent).
    pub replicas: Option<usize>,
    /// Local backup file of every page sent.
    pub backup_file: Option<PathBuf>,
    /// Most bytes a second re-replication copies (the runtime's default when absent).
    pub heal_rate_bytes: Option<u64>,
    /// When far memory runs out: wait, then end the program; or run over the budget.
    pub over_budget: crate::OverBudget,
    /// JSON stats file, rewritten every second and at exit (without `tree_dir`).
    pub stats_file: Option<PathBuf>,
    /// The process tree's directory (`farmem run` makes it, private): every process of the
    /// tree writes its stats to `stats/PID.json` there and takes its share of the budget from
    /// the coordinator on `budget.sock`. With it, the library leaves itself and these settings
    /// in the environment, so programs the process execs are under farmem too.
    pub tree_dir: Option<PathBuf>,
    /// Trace file the runtime records accesses into.
    pub record_trace: Option<PathBuf>,
    /// Private anonymous mappings of at least this many bytes become regions.
    pub mmap_threshold_bytes: u64,
    /// Virtual size reserved for the heap span (at least [`MIN_HEAP_RESERVE_BYTES`]).
    pub heap_reserve_bytes: u64,
    /// Place the heap and mappings but start no runtime (diagnostics: isolates the allocator
    /// from the paging).
    pub allocator_only: bool,
    /// The `farmem` binary (for the runtime, if it has to start anything).
    pub farmem_bin: Option<PathBuf>,
    /// `LD_PRELOAD` as it was before `farmem run` added the library (`None`: it was unset).
    pub orig_ld_preload: Option<String>,
}

/// Settings that cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum RunSettingsError {
    #[error(
        "the run settings cannot be written as JSON ({source}): give paths that are valid UTF-8"
    )]
    Encode {
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{RUN_SETTINGS_VAR} is not valid farmem run settings ({source}); start programs through \
         `farmem run` rather than setting it by hand"
    )]
    Malformed {
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{RUN_SETTINGS_VAR} holds settings of version {found}, but this libfarmem_preload.so \
         reads version {expected}: the library and the `farmem` binary come from different \
         builds; use the library built with this farmem (or point FARMEM_PRELOAD at it)"
    )]
    VersionMismatch { found: u32, expected: u32 },
    #[error("{RUN_SETTINGS_VAR}: {field} is {value}, but it must be {expected}")]
    Invalid {
        field: &'static str,
        value: String,
        expected: &'static str,
    },
}

/// Just the version, read first so a layout change is reported as such.
#[derive(Deserialize)]
struct VersionOnly {
    version: u32,
}

impl RunSettings {
    /// The settings as the value of [`RUN_SETTINGS_VAR`].
    pub fn encode(&self) -> Result<String, RunSettingsError> {
        serde_json::to_string(self).map_err(|source| RunSettingsError::Encode { source })
    }

    /// Reads the value of [`RUN_SETTINGS_VAR`]: checks the version, then the fields.
    pub fn decode(text: &str) -> Result<RunSettings, RunSettingsError> {
        let v: VersionOnly =
            serde_json::from_str(text).map_err(|source| RunSettingsError::Malformed { source })?;
        if v.version != RUN_SETTINGS_VERSION {
            return Err(RunSettingsError::VersionMismatch {
                found: v.version,
                expected: RUN_SETTINGS_VERSION,
            });
        }
        let s: RunSettings =
            serde_json::from_str(text).map_err(|source| RunSettingsError::Malformed { source })?;
        if s.heap_reserve_bytes < MIN_HEAP_RESERVE_BYTES {
            return Err(RunSettingsError::Invalid {
                field: "heap_reserve_bytes",
                value: s.heap_reserve_bytes.to_string(),
                expected: "at least 64 MiB",
            });
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> RunSettings {
        RunSettings {
            version: RUN_SETTINGS_VERSION,
            local_mem_bytes: 256 << 20,
            donors: vec!["127.0.0.1:7000".into(), "127.0.0.1:7001".into()],
            token_file: Some("/etc/farmem/token".into()),
            evict: Some("clock".into()),
            prefetch: None,
            prefetch_install: Some("marker".into()),
            seal: crate::SealMode::On,
            tier: crate::TierMode::Node("/run/farmem/node.sock".into()),
            replicas: Some(2),
            backup_file: Some("/var/tmp/backup".into()),
            heal_rate_bytes: None,
            over_budget: crate::OverBudget::Fail {
                wait: std::time::Duration::from_secs(30),
            },
            stats_file: Some("/tmp/stats.json".into()),
            tree_dir: None,
            record_trace: None,
            mmap_threshold_bytes: 4096,
            heap_reserve_bytes: 256 << 30,
            allocator_only: true,
            farmem_bin: Some("/usr/bin/farmem".into()),
            orig_ld_preload: Some(String::new()),
        }
    }

    #[test]
    fn settings_round_trip() {
        let s = settings();
        assert_eq!(RunSettings::decode(&s.encode().unwrap()).unwrap(), s);
    }

    #[test]
    fn another_version_is_refused_naming_both() {
        let mut v: serde_json::Value = serde_json::from_str(&settings().encode().unwrap()).unwrap();
        v["version"] = (RUN_SETTINGS_VERSION + 1).into();
        // a later layout may have fields this one does not know: the version is what is reported
        v["new_field"] = 1.into();
        let e = RunSettings::decode(&v.to_string()).unwrap_err();
        assert!(
            matches!(
                e,
                RunSettingsError::VersionMismatch {
                    found,
                    expected: RUN_SETTINGS_VERSION
                } if found == RUN_SETTINGS_VERSION + 1
            ),
            "{e}"
        );
        assert!(e.to_string().contains("different builds"), "{e}");
    }

    #[test]
    fn malformed_settings_say_to_use_farmem_run() {
        for text in ["", "1GiB", "{\"local_mem_bytes\": 1}"] {
            let e = RunSettings::decode(text).unwrap_err();
            assert!(matches!(e, RunSettingsError::Malformed { .. }), "{e}");
            assert!(e.to_string().contains("farmem run"), "{e}");
        }
        let mut v: serde_json::Value = serde_json::from_str(&settings().encode().unwrap()).unwrap();
        v["unknown"] = true.into();
        let e = RunSettings::decode(&v.to_string()).unwrap_err();
        assert!(matches!(e, RunSettingsError::Malformed { .. }), "{e}");
    }

    #[test]
    fn a_small_heap_reserve_is_refused() {
        let mut s = settings();
        s.heap_reserve_bytes = 4096;
        let e = RunSettings::decode(&s.encode().unwrap()).unwrap_err();
        assert!(
            matches!(
                e,
                RunSettingsError::Invalid {
                    field: "heap_reserve_bytes",
                    ..
                }
            ),
            "{e}"
        );
    }
}
