//! Removing what an earlier test process left behind (it was killed before its hosts were
//! dropped): namespaces and veth links of our naming scheme whose creating process is gone.
//! Nothing of a live process and nothing outside the scheme is touched.

use std::path::Path;

use super::ip::{ip, try_ip};
use super::names::{link_owner, ns_owner};

/// Deletes the leftovers of dead processes, and any of this process's names that exist
/// already (an earlier process with the same pid left them: this one has not created them yet,
/// its counter only grows).
pub fn remove_stale(own_names: &[&str]) {
    let dead = |pid: u32| !Path::new(&format!("/proc/{pid}")).exists();
    let namespaces = ip(&["netns", "list"]);
    for ns in namespaces
        .lines()
        .filter_map(|l| l.split_whitespace().next())
    {
        if ns_owner(ns).is_some_and(dead) || own_names.contains(&ns) {
            report(try_ip(&["netns", "delete", ns]));
        }
    }
    let links = ip(&["-o", "link", "show"]);
    for link in links.lines().filter_map(link_name) {
        if link_owner(link).is_some_and(dead) || own_names.contains(&link) {
            report(try_ip(&["link", "delete", link]));
        }
    }
}

/// The interface name of a line of `ip -o link show` (`6: fmt12h0@if5: <…> …`).
fn link_name(line: &str) -> Option<&str> {
    let name = line.split(": ").nth(1)?;
    Some(name.split('@').next().unwrap_or(name))
}

fn report(r: Result<String, String>) {
    // The other end of a veth pair goes with the first: deleting it then fails, harmlessly.
    if let Err(e) = r {
        if !e.contains("Cannot find device") {
            eprintln!("removing a leftover test host: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_names_are_read_without_their_peer() {
        assert_eq!(
            link_name("6: fmt12h0@if5: <NO-CARRIER,BROADCAST> mtu 1500"),
            Some("fmt12h0")
        );
        assert_eq!(link_name("1: lo: <LOOPBACK,UP> mtu 65536"), Some("lo"));
    }
}
