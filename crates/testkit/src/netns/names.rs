//! The names of what the tests create: `fmt-PID-N` namespaces and `fmtPIDhN` / `fmtPIDnN` veth
//! ends (`h` in the root namespace, `n` in the host's). The creating process's pid in every name
//! lets a later run tell leftovers of a dead process from those of a live one.

/// Longest interface name Linux accepts (IFNAMSIZ - 1).
const IFNAME_MAX: usize = 15;

/// The names of host `n` of process `pid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub ns: String,
    pub root_link: String,
    pub ns_link: String,
}

impl Names {
    pub fn new(pid: u32, n: u32) -> Names {
        let names = Names {
            ns: format!("fmt-{pid}-{n}"),
            root_link: format!("fmt{pid}h{n}"),
            ns_link: format!("fmt{pid}n{n}"),
        };
        assert!(
            names.root_link.len() <= IFNAME_MAX,
            "interface name {} is longer than {IFNAME_MAX} bytes: too many hosts in one test \
             process",
            names.root_link
        );
        names
    }
}

/// The creating pid, if `name` is a namespace of our scheme.
pub fn ns_owner(name: &str) -> Option<u32> {
    let (pid, n) = name.strip_prefix("fmt-")?.split_once('-')?;
    n.parse::<u32>().ok()?;
    pid.parse().ok()
}

/// The creating pid, if `name` is a veth end of our scheme.
pub fn link_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("fmt")?;
    let (pid, n) = rest.split_once(['h', 'n'])?;
    n.parse::<u32>().ok()?;
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_to_their_pid() {
        let n = Names::new(4_194_303, 9999);
        assert_eq!(n.root_link.len(), 15);
        assert_eq!(ns_owner(&n.ns), Some(4_194_303));
        assert_eq!(link_owner(&n.root_link), Some(4_194_303));
        assert_eq!(link_owner(&n.ns_link), Some(4_194_303));
    }

    #[test]
    fn other_names_are_not_ours() {
        for name in [
            "fmt", "fmt-", "fmt-12", "fmt-12-x", "fmtx-1-2", "red", "fmt-a-1",
        ] {
            assert_eq!(ns_owner(name), None, "{name}");
        }
        for name in ["fmt12", "fmt12h", "fmt12hx", "fmtah1", "eth0", "fmt12x3"] {
            assert_eq!(link_owner(name), None, "{name}");
        }
    }
}
