//! The modes `farmem run` hands the runtime by name: what happens over budget, where the host
//! tier comes from, whether pages are sealed, how prefetched pages are installed.

use std::path::PathBuf;
use std::time::Duration;

/// A mode name that is not one of the choices (the message lists them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnknownMode(pub String);

/// What the runtime does when its far memory runs out: write-back fails (every donor full or
/// gone, the node out of room) while resident pages are at the budget, so nothing can be
/// evicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OverBudget {
    /// The budget holds as a memory cgroup's limit holds: faulting threads wait for
    /// write-back (backpressure); if it still fails after `wait`, the process is killed
    /// (SIGKILL, as an OOM kill) with a message saying what ran out.
    Fail {
        /// How long write-back may fail before the process is ended.
        wait: Duration,
    },
    /// Faults are served beyond the budget while write-back fails; the stats and `farmem
    /// run`'s summary say so. In a container with a hard memory limit that can be an OOM
    /// kill later.
    Allow,
}

impl OverBudget {
    /// `farmem run`'s default wait before a run whose far memory ran out is ended.
    pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);
}

/// Where the host tier comes from (the runtime's host tier).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TierMode {
    /// The host's node if one listens on the default socket; else, with no donor named, a
    /// private node started for this runtime (the embedded default); else no tier.
    #[default]
    Auto,
    /// The node listening on this socket; failing to use it is an error.
    Node(PathBuf),
    /// No host tier: pages go to the donors, or (none named) to the embedded TCP donor.
    Off,
}

/// Whether pages leaving the process are sealed (the runtime's sealing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SealMode {
    /// Sealed when any donor's address is not one of this host's (the embedded donor and
    /// loopback donors are on this host: their memory is this machine's anyway).
    #[default]
    Auto,
    /// Always sealed.
    On,
    /// Never sealed.
    Off,
}

impl std::str::FromStr for SealMode {
    type Err = UnknownMode;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(SealMode::Auto),
            "on" => Ok(SealMode::On),
            "off" => Ok(SealMode::Off),
            other => Err(UnknownMode(format!(
                "unknown seal mode {other:?}: choose auto, on or off"
            ))),
        }
    }
}

/// How prefetched pages are made local (the runtime's prefetch module says why).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefetchInstall {
    /// Keep them in the write-back pool; the first touch is a cheap local fault, seen as a hit.
    #[default]
    Buffer,
    /// Install them into the region at once, except each window's first page (the marker).
    Marker,
}

impl std::str::FromStr for PrefetchInstall {
    type Err = UnknownMode;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "buffer" => Ok(PrefetchInstall::Buffer),
            "marker" => Ok(PrefetchInstall::Marker),
            other => Err(UnknownMode(format!(
                "unknown prefetch install mode {other:?}: choose buffer or marker"
            ))),
        }
    }
}
