//! The line `farmem node` prints once it listens, and starting a node as a child process.
//!
//! `farmem node` prints exactly one line to stdout once its socket listens: the
//! [`NodeBanner`], `farmem node listening on PATH`. Whoever starts a private node (the runtime,
//! the tests) uses [`ChildNodeCommand`] (see [`child_node_command`]): the launcher shared with
//! the donor (`farmem_host::child`) spawns `BIN node --exit-with-parent PID --socket PATH
//! ARGS…`, reads the banner within a deadline, and returns a [`ChildNode`] that kills and reaps
//! the child when dropped. Read that module's docs: no `pre_exec` hook, the banner read on the
//! calling thread, and the child dies with the *thread* that spawned it.
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use farmem_host::{ChildServer, ChildServerCommand, NotABanner, ServerBanner};

/// What `farmem node` prints before the socket path.
const BANNER_PREFIX: &str = "farmem node listening on ";

/// The line `farmem node` prints to stdout once it listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBanner {
    /// The socket the node listens on.
    pub path: PathBuf,
}

impl fmt::Display for NodeBanner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{BANNER_PREFIX}{}", self.path.display())
    }
}

impl FromStr for NodeBanner {
    type Err = NotABanner;

    fn from_str(line: &str) -> Result<NodeBanner, NotABanner> {
        let bare = line.trim_end_matches(['\n', '\r']);
        match bare.strip_prefix(BANNER_PREFIX) {
            Some(p) if p.starts_with('/') => Ok(NodeBanner { path: p.into() }),
            _ => Err(NotABanner {
                line: line.to_string(),
                subcommand: "node",
                form: "farmem node listening on /PATH",
            }),
        }
    }
}

impl ServerBanner for NodeBanner {
    const SUBCOMMAND: &'static str = "node";
    const DEFAULT_ARGS: &'static [&'static str] = &[];
    fn parse_line(line: &str) -> Result<NodeBanner, NotABanner> {
        line.parse()
    }
}

/// How to start a private node as a child process.
pub type ChildNodeCommand = ChildServerCommand<NodeBanner>;

/// A running child node; dropping it kills and reaps the child (its clients' mappings stay
/// valid). Its socket path is `banner().path`.
pub type ChildNode = ChildServer<NodeBanner>;

/// `BIN node --exit-with-parent PID --socket SOCKET`; add `--capacity SIZE` and any other
/// argument with [`ChildServerCommand::arg`], then `spawn()`.
pub fn child_node_command(bin: impl Into<PathBuf>, socket: &Path) -> ChildNodeCommand {
    ChildNodeCommand::new(bin).arg("--socket").arg(socket)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_banner_prints_and_parses_back() {
        let b = NodeBanner {
            path: "/run/farmem/node.sock".into(),
        };
        assert_eq!(
            b.to_string(),
            "farmem node listening on /run/farmem/node.sock"
        );
        assert_eq!(format!("{b}\n").parse::<NodeBanner>().unwrap(), b);
        for bad in [
            "farmem node listening on ",
            "farmem donor listening on /x",
            "x",
        ] {
            assert!(bad.parse::<NodeBanner>().is_err(), "{bad}");
        }
    }
}
