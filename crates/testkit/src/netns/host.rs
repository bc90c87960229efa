//! A host: a network namespace joined to the root namespace by a veth pair on a private /30,
//! and the link failures tests inject into it.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use super::ip::{ip, ip_bin, try_ip};
use super::names::Names;
use super::stale::remove_stale;
use super::subnet::{self, Subnet};

/// Hosts created by this process so far (the `N` in the names).
static NEXT: AtomicU32 = AtomicU32::new(0);

/// A network namespace `fmt-PID-N` with loopback up, reached from the root namespace at
/// [`Host::ip`] over a veth pair. Dropping it deletes the link and the namespace (stop what
/// runs inside first: [`super::HostDonor`] does).
#[derive(Debug)]
pub struct Host {
    names: Names,
    subnet: Subnet,
}

impl Host {
    /// Creates a host on a /30 of 10.128.0.0/9 nothing else uses, after removing what dead
    /// test processes left behind.
    pub fn new() -> Host {
        let pid = std::process::id();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let names = Names::new(pid, n);
        let lock = subnet::lock();
        remove_stale(&[&names.ns, &names.root_link, &names.ns_link]);
        let subnet = subnet::choose(&lock, pid, n);
        // From here on, Drop cleans up whatever step fails.
        let host = Host { names, subnet };
        host.build();
        drop(lock);
        host
    }

    fn build(&self) {
        let Names {
            ns,
            root_link,
            ns_link,
        } = &self.names;
        let (root_ip, host_ip) = (self.subnet.root_ip(), self.subnet.host_ip());
        let (root_mac, host_mac) = (mac_of(root_ip), mac_of(host_ip));
        let cidr = |a: Ipv4Addr| format!("{a}/{}", Subnet::PREFIX);
        ip(&["netns", "add", ns]);
        ip(&[
            "link", "add", root_link, "address", &root_mac, "type", "veth", "peer", "name",
            ns_link, "address", &host_mac, "netns", ns,
        ]);
        ip(&["addr", "add", &cidr(root_ip), "dev", root_link]);
        ip(&["link", "set", root_link, "up"]);
        ip(&["-n", ns, "addr", "add", &cidr(host_ip), "dev", ns_link]);
        ip(&["-n", ns, "link", "set", ns_link, "up"]);
        ip(&["-n", ns, "link", "set", "lo", "up"]);
        // A permanent neighbour entry: with the host's end down, packets to it are dropped at
        // the link instead of failing ARP, which would answer connects with EHOSTUNREACH after
        // 3 s. It survives the carrier loss (only an admin-down of this end flushes it).
        ip(&[
            "neigh",
            "replace",
            &host_ip.to_string(),
            "lladdr",
            &host_mac,
            "dev",
            root_link,
            "nud",
            "permanent",
        ]);
    }

    /// The namespace's name (`ip netns exec NAME …`).
    pub fn name(&self) -> &str {
        &self.names.ns
    }

    /// The veth end in the root namespace.
    pub fn root_link(&self) -> &str {
        &self.names.root_link
    }

    /// The veth end inside the host.
    pub fn host_link(&self) -> &str {
        &self.names.ns_link
    }

    /// The host's address, reachable from the root namespace.
    pub fn ip(&self) -> Ipv4Addr {
        self.subnet.host_ip()
    }

    /// The root namespace's address on the link (what the host sees connections come from).
    pub fn root_ip(&self) -> Ipv4Addr {
        self.subnet.root_ip()
    }

    /// `ip netns exec NAME PROGRAM`: a command run inside the host (`ip` execs it in place, so
    /// the child's pid is the program's).
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(ip_bin());
        cmd.args(["netns", "exec", self.name(), program]);
        cmd
    }

    /// Cuts the link: the host's end goes down, so packets both ways are dropped without an
    /// answer (no RST, no ICMP): connects and requests time out. Existing connections survive
    /// if the link is healed before their timeouts.
    pub fn partition(&self) {
        // Taking down the root end instead would remove the route to the host, and packets to it
        // would take the default route (a sandbox's proxy may even accept them).
        for conf in ["all", self.root_link()] {
            let path = format!("/proc/sys/net/ipv4/conf/{conf}/ignore_routes_with_linkdown");
            let v = std::fs::read_to_string(&path).unwrap_or_default();
            assert_eq!(
                v.trim(),
                "0",
                "{path} is set: the route to a partitioned host would be ignored and its \
                 packets would take the default route; run `sysctl -w \
                 net.ipv4.conf.all.ignore_routes_with_linkdown=0`"
            );
        }
        ip(&["-n", self.name(), "link", "set", self.host_link(), "down"]);
    }

    /// Restores the link cut by [`Host::partition`].
    pub fn heal_link(&self) {
        ip(&["-n", self.name(), "link", "set", self.host_link(), "up"]);
    }
}

impl Default for Host {
    fn default() -> Host {
        Host::new()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // Deleting the root end takes the pair down even if a process still holds the namespace.
        for r in [
            try_ip(&["link", "delete", self.root_link()]),
            try_ip(&["netns", "delete", self.name()]),
        ] {
            if let Err(e) = r {
                if !e.contains("Cannot find device") && !e.contains("No such file") {
                    eprintln!("removing test host {}: {e}", self.name());
                }
            }
        }
    }
}

/// A locally administered MAC address naming `ip` (unique as the address is).
fn mac_of(ip: Ipv4Addr) -> String {
    let [a, b, c, d] = ip.octets();
    format!("02:00:{a:02x}:{b:02x}:{c:02x}:{d:02x}")
}
