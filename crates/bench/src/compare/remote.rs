//! The `farmem-remote` system's donor: a `farmem donor` on another "machine" — its own network
//! namespace behind a veth link (the test kit's `HostDonor`), with a token, so `farmem run
//! --donor ADDR --token-file FILE` seals pages as `--seal auto` chooses for a donor on another
//! host, exactly as a user would run it.
//!
//! # Design
//!
//! - One donor per run, started before the workload and stopped after it, so each run starts
//!   from an empty store and the donor's CPU time belongs to that run alone.
//! - The donor's CPU (user + system, /proc/PID/stat) and the link's bytes both ways (the root
//!   end's counters in /sys/class/net, read only) are sampled before and after the workload.
//!   The link carries nothing else: the namespace is the donor's alone.
//! - A host that cannot be made is the run's error ([`crate::netns`]), so one failed setup does
//!   not end the whole comparison. The donor is also an entry on the [`Cleanup`] stack: an
//!   interrupted run kills it and deletes its namespace.
//!
//! # Limitations
//!
//! - The donor shares the machine's CPUs with the program (a real deployment does not): its
//!   CPU is reported apart (`donor_us_per_page`) and never counted in the program's.
//! - The kernel here has no netem qdisc: the link has a veth's latency, not a network's.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::cost::ticks_to_s;
use super::systems::{Cleanup, Token};

/// A donor in a namespace of its own, for one run.
pub struct RemoteDonor {
    addr: String,
    token_file: PathBuf,
    pid: u32,
    link: String,
    token: Token,
}

/// What the donor and its link did between two samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RemoteUse {
    /// The donor process's CPU, user + system, seconds.
    pub donor_cpu_s: f64,
    /// Bytes over the link, both ways (frames: TCP/IP and Ethernet headers included).
    pub wire_bytes: u64,
}

impl RemoteUse {
    /// `self - earlier`, never negative.
    pub fn since(self, earlier: RemoteUse) -> RemoteUse {
        RemoteUse {
            donor_cpu_s: (self.donor_cpu_s - earlier.donor_cpu_s).max(0.0),
            wire_bytes: self.wire_bytes.saturating_sub(earlier.wire_bytes),
        }
    }
}

impl RemoteDonor {
    /// Starts a donor of `capacity_bytes` in a new namespace; on the cleanup stack until
    /// [`RemoteDonor::stop`].
    pub fn start(capacity_bytes: u64, cleanup: &Cleanup) -> Result<RemoteDonor, String> {
        let capacity = capacity_bytes.to_string();
        let started =
            crate::netns::host_donor(&["--capacity", &capacity], crate::netns::bench_token()?)?;
        let pid = started
            .pid()
            .ok_or("the donor in its namespace exited at once")?;
        let (addr, token_file) = (started.addr().to_string(), started.token_file());
        let link = started.host().root_link().to_string();
        let name = started.host().name().to_string();
        let slot = Arc::new(Mutex::new(Some(started)));
        let token = cleanup.push(
            format!("stop the donor in namespace {name} and delete the namespace"),
            move || {
                // Dropping it kills the donor, then deletes its link and namespace.
                drop(slot.lock().unwrap_or_else(|p| p.into_inner()).take());
                Ok(())
            },
        );
        Ok(RemoteDonor {
            addr,
            token_file,
            pid,
            link,
            token,
        })
    }

    /// What `farmem run` is given to page to this donor.
    pub fn farmem_args(&self) -> Vec<String> {
        vec![
            "--donor".into(),
            self.addr.clone(),
            "--token-file".into(),
            self.token_file.display().to_string(),
        ]
    }

    /// The donor's CPU and the link's bytes so far.
    pub fn sample(&self) -> RemoteUse {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|s| farmem_runtime::parse_proc_stat(&s));
        let counter = |dir: &str| -> u64 {
            std::fs::read_to_string(format!("/sys/class/net/{}/statistics/{dir}", self.link))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0)
        };
        RemoteUse {
            donor_cpu_s: stat.map_or(0.0, |s| ticks_to_s(s.utime_ticks + s.stime_ticks)),
            wire_bytes: counter("rx_bytes") + counter("tx_bytes"),
        }
    }

    /// Stops the donor and deletes its namespace.
    pub fn stop(self, cleanup: &Cleanup) -> anyhow::Result<()> {
        cleanup.run(self.token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_since_never_goes_negative() {
        let a = RemoteUse {
            donor_cpu_s: 2.0,
            wire_bytes: 100,
        };
        let b = RemoteUse {
            donor_cpu_s: 3.5,
            wire_bytes: 4196,
        };
        assert_eq!(
            b.since(a),
            RemoteUse {
                donor_cpu_s: 1.5,
                wire_bytes: 4096
            }
        );
        // A restarted counter (a new link) reads as nothing, not as a huge figure.
        assert_eq!(a.since(b), RemoteUse::default());
    }
}
