//! The line `farmem node` prints once it listens, and starting a node as a child process.
//!
//! `farmem node` prints exactly one line to stdout once its socket listens: the
//! [`NodeBanner`], `farmem node listening on PATH`. Whoever starts a private node (the runtime,
//! the tests) reads it back with `FromStr`.
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

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

/// A line that is not a [`NodeBanner`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line:?} is not a node banner (`{BANNER_PREFIX}PATH`)")]
pub struct NotANodeBanner {
    /// The line as read.
    pub line: String,
}

impl FromStr for NodeBanner {
    type Err = NotANodeBanner;

    fn from_str(line: &str) -> Result<NodeBanner, NotANodeBanner> {
        let bare = line.trim_end_matches(['\n', '\r']);
        match bare.strip_prefix(BANNER_PREFIX) {
            Some(p) if p.starts_with('/') => Ok(NodeBanner { path: p.into() }),
            _ => Err(NotANodeBanner {
                line: line.to_string(),
            }),
        }
    }
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
