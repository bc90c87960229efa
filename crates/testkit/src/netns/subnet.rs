//! Choosing a host's /30: one no address or route of the root namespace overlaps, chosen under
//! a lock every test process takes, so hosts created at once by several processes never share
//! one.

use std::fs::{File, OpenOptions};
use std::net::Ipv4Addr;

use super::ip::ip;

/// Where the /30s come from: 10.128.0.0/9, 2^21 of them.
const POOL_BASE: u32 = u32::from_be_bytes([10, 128, 0, 0]);
const POOL_SUBNETS: u32 = 1 << 21;

/// The lock every test process takes while it looks for a free subnet, creates a host, and
/// removes leftovers (in /run/lock: root's, and not a private /tmp).
const LOCK_PATH: &str = "/run/lock/farmem-testkit-netns.lock";

/// A /30: the root namespace's end is `.1`, the host's `.2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subnet {
    base: u32,
}

impl Subnet {
    pub fn root_ip(self) -> Ipv4Addr {
        Ipv4Addr::from(self.base + 1)
    }
    pub fn host_ip(self) -> Ipv4Addr {
        Ipv4Addr::from(self.base + 2)
    }
    pub const PREFIX: u8 = 30;
}

/// Held while a host is being created (the lock is released when it is dropped).
pub struct CreationLock {
    _file: File,
}

/// Takes the creation lock, waiting for other test processes.
pub fn lock() -> CreationLock {
    let _ = std::fs::create_dir_all("/run/lock");
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK_PATH)
        .unwrap_or_else(|e| panic!("opening {LOCK_PATH}: {e} (network namespaces need root)"));
    f.lock()
        .unwrap_or_else(|e| panic!("locking {LOCK_PATH}: {e}"));
    CreationLock { _file: f }
}

/// A /30 of the pool that overlaps nothing in the root namespace, starting from one derived
/// from `pid` and `n` (so parallel processes rarely probe the same ones). Call it holding the
/// creation lock and add the root end's address before releasing it.
pub fn choose(_lock: &CreationLock, pid: u32, n: u32) -> Subnet {
    let taken = root_prefixes();
    let start = (pid.wrapping_mul(64).wrapping_add(n)) % POOL_SUBNETS;
    (0..POOL_SUBNETS)
        .map(|i| Subnet {
            base: POOL_BASE + ((start + i) % POOL_SUBNETS) * 4,
        })
        .find(|s| {
            !taken
                .iter()
                .any(|&(net, len)| overlaps((s.base, Subnet::PREFIX), (net, len)))
        })
        .unwrap_or_else(|| {
            panic!(
                "every /30 of 10.128.0.0/9 overlaps an address or route of the root namespace \
                 (ip -4 addr; ip -4 route show table all): remove the route covering it"
            )
        })
}

/// The IPv4 prefixes of the root namespace's addresses and routes (but the default route).
fn root_prefixes() -> Vec<(u32, u8)> {
    let addrs = ip(&["-4", "-o", "addr", "show"]);
    let routes = ip(&["-4", "route", "show", "table", "all"]);
    let mut out: Vec<(u32, u8)> = addrs
        .lines()
        .filter_map(|l| {
            let mut t = l.split_whitespace();
            t.find(|w| *w == "inet")?;
            parse_prefix(t.next()?)
        })
        .collect();
    out.extend(routes.lines().filter_map(route_prefix));
    out
}

/// The destination of a line of `ip route show`, unless it is the default route.
fn route_prefix(line: &str) -> Option<(u32, u8)> {
    const TYPES: &[&str] = &[
        "unicast",
        "local",
        "broadcast",
        "multicast",
        "anycast",
        "blackhole",
        "unreachable",
        "prohibit",
        "throw",
        "nat",
    ];
    let mut t = line.split_whitespace();
    let mut dst = t.next()?;
    if TYPES.contains(&dst) {
        dst = t.next()?;
    }
    if dst == "default" {
        return None;
    }
    parse_prefix(dst)
}

/// `A.B.C.D/LEN` or `A.B.C.D` (a /32).
fn parse_prefix(s: &str) -> Option<(u32, u8)> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, l.parse().ok().filter(|l| *l <= 32)?),
        None => (s, 32),
    };
    Some((u32::from(addr.parse::<Ipv4Addr>().ok()?), len))
}

/// Whether two prefixes share an address: they agree under the shorter one's mask.
fn overlaps((a, alen): (u32, u8), (b, blen): (u32, u8)) -> bool {
    let len = alen.min(blen);
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    a & mask == b & mask
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> (u32, u8) {
        parse_prefix(s).unwrap()
    }

    #[test]
    fn prefixes_overlap_when_one_contains_the_other() {
        assert!(overlaps(p("10.128.0.4/30"), p("10.0.0.0/8")));
        assert!(overlaps(p("10.128.0.4/30"), p("10.128.0.6")));
        assert!(!overlaps(p("10.128.0.4/30"), p("10.128.0.8/30")));
        assert!(!overlaps(p("10.128.0.4/30"), p("192.0.2.0/24")));
    }

    #[test]
    fn route_lines_give_their_destination() {
        assert_eq!(route_prefix("default via 192.0.2.1 dev eth0"), None);
        assert_eq!(
            route_prefix("192.0.2.0/24 dev eth0 proto kernel scope link src 192.0.2.2"),
            Some(p("192.0.2.0/24"))
        );
        assert_eq!(
            route_prefix("local 10.128.0.1 dev fmt1h0 table local proto kernel"),
            Some(p("10.128.0.1"))
        );
        assert_eq!(route_prefix("fe80::/64 dev eth0"), None);
    }

    #[test]
    fn a_subnet_has_two_usable_ends() {
        let s = Subnet { base: POOL_BASE };
        assert_eq!(s.root_ip(), Ipv4Addr::new(10, 128, 0, 1));
        assert_eq!(s.host_ip(), Ipv4Addr::new(10, 128, 0, 2));
    }
}
