//! Login slots: the connections that have not completed the handshake yet, and which of them
//! makes room when a new one arrives.
//!
//! # Design
//! At most [`MAX_UNAUTHENTICATED`] connections may be logging in at once, and at most
//! [`MAX_UNAUTHENTICATED_PER_SOURCE`] from one *source*: an IPv4 /24 or an IPv6 /64 (an
//! attacker rarely holds addresses in many of them; a single host often holds a whole /64). A
//! new connection beyond either bound evicts one that is logging in:
//! - its source at its bound: that source's oldest connection;
//! - all slots taken: the oldest connection of the source holding the most slots.
//!
//! So a flood only ever evicts itself: a client logging in from a source of its own holds one
//! slot and is never the largest source while the flood holds more than one slot per source it
//! uses, however fast the flood connects and however slow the client's round trip. Addresses
//! that completed a handshake before (the last [`MAX_KNOWN_ADDRS`] of them) are *known*: the
//! choice above is first made among connections from unknown addresses, so a returning client
//! keeps its slot even when it shares a source with the flood or the flood spans many sources.
//!
//! # Limitations
//! A flood from more sources than there are slots, each holding one, competes with a first-time
//! client on equal terms (oldest first) once its source holds no more than theirs.
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::IpAddr;

/// Most connections that have not completed the handshake, from all sources together.
pub const MAX_UNAUTHENTICATED: usize = 256;
/// Most connections from one source (an IPv4 /24, an IPv6 /64) that have not completed the
/// handshake.
pub const MAX_UNAUTHENTICATED_PER_SOURCE: usize = 64;
/// How many addresses that completed a handshake are remembered as known.
pub const MAX_KNOWN_ADDRS: usize = 4096;

/// A source: the network an address belongs to (IPv4 /24, IPv6 /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Source(u128);

impl Source {
    pub(crate) fn of(ip: IpAddr) -> Source {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Source(u128::from(u32::from(v4) >> 8)),
            IpAddr::V6(v6) => Source((1 << 64) | (u128::from(v6) >> 64)),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    id: u64,
    source: Source,
    known: bool,
}

/// The connections logging in, oldest first, and the addresses known from earlier handshakes.
#[derive(Default)]
pub(crate) struct Logins {
    pending: VecDeque<Pending>,
    known: HashSet<IpAddr>,
    known_order: VecDeque<IpAddr>,
}

impl Logins {
    /// Records connection `id` from `ip` as logging in; returns the connection it evicts, if
    /// any (the caller closes it).
    pub(crate) fn admit(&mut self, id: u64, ip: IpAddr) -> Option<u64> {
        let source = Source::of(ip);
        let known = self.known.contains(&ip.to_canonical());
        let of_source = self.pending.iter().filter(|p| p.source == source).count();
        let victim = if of_source >= MAX_UNAUTHENTICATED_PER_SOURCE {
            self.oldest_of(source)
        } else if self.pending.len() >= MAX_UNAUTHENTICATED {
            self.oldest_of_largest_source()
        } else {
            None
        };
        let victim = victim.and_then(|i| self.pending.remove(i)).map(|p| p.id);
        self.pending.push_back(Pending { id, source, known });
        victim
    }

    /// Connection `id` completed its handshake from `ip`: it leaves its login slot, and `ip`
    /// is known from now on.
    pub(crate) fn authenticated(&mut self, id: u64, ip: Option<IpAddr>) {
        self.remove(id);
        let Some(ip) = ip.map(|ip| ip.to_canonical()) else {
            return;
        };
        if self.known.insert(ip) {
            self.known_order.push_back(ip);
            if self.known_order.len() > MAX_KNOWN_ADDRS {
                if let Some(old) = self.known_order.pop_front() {
                    self.known.remove(&old);
                }
            }
        }
    }

    /// Connection `id` closed (or was evicted): it leaves its login slot, if it held one.
    pub(crate) fn remove(&mut self, id: u64) {
        if let Some(i) = self.pending.iter().position(|p| p.id == id) {
            self.pending.remove(i);
        }
    }

    /// Index of the oldest connection from `source`, unknown addresses first.
    fn oldest_of(&self, source: Source) -> Option<usize> {
        let from = |known: bool| {
            self.pending
                .iter()
                .position(|p| p.source == source && p.known == known)
        };
        from(false).or_else(|| from(true))
    }

    /// Index of the oldest connection of the source holding the most slots, counting unknown
    /// addresses first (known ones only when every connection logging in is known).
    fn oldest_of_largest_source(&self) -> Option<usize> {
        let known = !self.pending.iter().any(|p| !p.known);
        let mut counts: HashMap<Source, usize> = HashMap::new();
        for p in self.pending.iter().filter(|p| p.known == known) {
            *counts.entry(p.source).or_insert(0) += 1;
        }
        // The largest source; among equals the one whose oldest connection is oldest.
        let mut best: Option<(usize, usize)> = None;
        for (i, p) in self.pending.iter().enumerate() {
            if p.known != known {
                continue;
            }
            let n = counts[&p.source];
            if best.is_none_or(|(bn, _)| n > bn) {
                best = Some((n, i));
            }
        }
        best.map(|(_, i)| i)
    }

    #[cfg(test)]
    fn ids(&self) -> Vec<u64> {
        self.pending.iter().map(|p| p.id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    }

    #[test]
    fn sources_are_slash_24_and_slash_64() {
        assert_eq!(Source::of(ip(10, 0, 0, 1)), Source::of(ip(10, 0, 0, 200)));
        assert_ne!(Source::of(ip(10, 0, 0, 1)), Source::of(ip(10, 0, 1, 1)));
        let v6 = |s: &str| Source::of(s.parse().unwrap());
        assert_eq!(v6("2001:db8::1"), v6("2001:db8::ffff:1"));
        assert_ne!(v6("2001:db8::1"), v6("2001:db8:0:1::1"));
        assert_eq!(v6("::ffff:10.0.0.1"), Source::of(ip(10, 0, 0, 9)));
    }

    #[test]
    fn a_flood_evicts_only_itself() {
        let mut l = Logins::default();
        let client = ip(127, 0, 1, 1);
        assert_eq!(l.admit(0, client), None);
        // A flood from 64 addresses of one /24: capped at its source's bound.
        let mut evicted = Vec::new();
        for id in 1..10_000u64 {
            evicted.extend(l.admit(id, ip(127, 0, 0, (id % 64) as u8 + 1)));
        }
        assert!(!evicted.contains(&0));
        assert!(l.ids().contains(&0));
        assert_eq!(l.ids().len(), 1 + MAX_UNAUTHENTICATED_PER_SOURCE);
        // A flood from many /24s fills every slot, and still evicts its own.
        for id in 10_000..20_000u64 {
            let n = (id % 64) as u8;
            evicted.extend(l.admit(id, ip(127, 1, n, 1)));
        }
        assert!(!evicted.contains(&0), "the slow client was evicted");
        assert_eq!(l.ids().len(), MAX_UNAUTHENTICATED);
        l.authenticated(0, Some(client));
        assert!(!l.ids().contains(&0));
    }

    #[test]
    fn a_known_address_keeps_its_slot_among_a_flood_of_its_own_source() {
        let mut l = Logins::default();
        let client = ip(127, 0, 0, 200);
        l.admit(0, client);
        l.authenticated(0, Some(client));
        l.admit(1, client);
        let mut evicted = Vec::new();
        for id in 2..5_000u64 {
            evicted.extend(l.admit(id, ip(127, 0, 0, (id % 64) as u8 + 1)));
        }
        assert!(!evicted.contains(&1));
        // An unknown address of the flood's source is not protected.
        let mut l = Logins::default();
        l.admit(1, client);
        let evicted: Vec<u64> = (2..5_000u64)
            .filter_map(|id| l.admit(id, ip(127, 0, 0, (id % 64) as u8 + 1)))
            .collect();
        assert!(evicted.contains(&1));
    }
}
