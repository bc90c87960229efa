//! Page-access traces, trace generators and the simulator that replays them through farmem's
//! prefetchers and eviction policies (crates/policy), in the role of Kona's cache simulator.
//!
//! - [`trace`] (crate farmem-trace): the compact, versioned binary trace format; [`trace::TraceWriter`] (streaming,
//!   buffered, used by the runtime's `--record-trace`) and [`trace::TraceReader`], which rejects
//!   corrupt and truncated files.
//! - [`gen`]: synthetic traces (`seq`, `stride:K`, `interleave:T:K1,K2,…`, `random`, `zipf:S`,
//!   `phases`) over a working set of a given size.
//! - [`sim`]: replays a trace through prefetchers × eviction policies × cache sizes and reports,
//!   per combination, faults, hit ratio, Leap's prefetch measures and the average memory access
//!   time; [`report`] formats the rows as a table or an SVG plot.
#![forbid(unsafe_code)]

pub mod gen;
pub mod report;
pub mod sim;
/// The trace format, in crate farmem-trace (the runtime writes traces without linking the
/// simulator).
pub use farmem_trace as trace;

pub use trace::{AccessKind, Record, TraceError, TraceReader, TraceWriter};

/// Errors of the generators and the simulator (the trace format has its own, [`TraceError`]).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A generator spec could not be parsed.
    #[error("bad trace generator {spec:?}: {reason}")]
    BadGenSpec {
        /// The spec as given.
        spec: String,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// A cache size could not be parsed.
    #[error("bad cache size {spec:?}: {reason}")]
    BadCacheSize {
        /// The size as given.
        spec: String,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// A page count or byte size could not be parsed.
    #[error("bad size {spec:?}: {reason}")]
    BadSize {
        /// The size as given.
        spec: String,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// A policy name is unknown or its configuration is invalid.
    #[error("cannot build the policy for the simulation")]
    Policy(#[from] farmem_policy::PolicyError),
    /// The trace to simulate has no accesses.
    #[error("the trace is empty: nothing to simulate (generate one with a length > 0)")]
    EmptyTrace,
    /// A simulation parameter is out of range.
    #[error("invalid simulation parameter: {0}")]
    BadParam(String),
}

/// Parses a number of pages (`4096`) or a byte size (`64MiB`, `1GiB`, `512KiB`, `4096B`),
/// rounded up to whole 4 KiB pages.
pub fn parse_pages(spec: &str) -> Result<u64, SimError> {
    let bad = |reason: &str| SimError::BadSize {
        spec: spec.to_string(),
        reason: reason.to_string(),
    };
    let s = spec.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits_end == 0 {
        return Err(bad(
            "expected a page count such as 4096 or a size such as 64MiB",
        ));
    }
    let n: u64 = s[..digits_end]
        .parse()
        .map_err(|_| bad("the number is too large"))?;
    let unit = &s[digits_end..];
    let bytes_per_unit: u64 = match unit {
        "" => return Ok(n),
        "B" => 1,
        "KiB" | "K" | "KB" => 1 << 10,
        "MiB" | "M" | "MB" => 1 << 20,
        "GiB" | "G" | "GB" => 1 << 30,
        "TiB" | "T" | "TB" => 1 << 40,
        _ => {
            return Err(bad(
                "unknown unit: use B, KiB, MiB, GiB or TiB (or no unit for pages)",
            ))
        }
    };
    let bytes = n
        .checked_mul(bytes_per_unit)
        .ok_or_else(|| bad("the size is too large"))?;
    Ok(bytes.div_ceil(4096))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_and_sizes() {
        assert_eq!(parse_pages("4096").unwrap(), 4096);
        assert_eq!(parse_pages("64MiB").unwrap(), 16384);
        assert_eq!(parse_pages("1GiB").unwrap(), 262_144);
        assert_eq!(parse_pages("4097B").unwrap(), 2);
        for bad in [
            "",
            "MiB",
            "12 parsecs",
            "99999999999999999999",
            "18446744073709551615GiB",
        ] {
            assert!(parse_pages(bad).is_err(), "{bad:?} must be rejected");
        }
        assert_eq!(
            parse_pages("3XB").unwrap_err().to_string(),
            "bad size \"3XB\": unknown unit: use B, KiB, MiB, GiB or TiB (or no unit for pages)"
        );
    }
}
