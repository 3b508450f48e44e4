//! Where each MPI rank's innet port is: a TOML file named by `INNET_MPI_CONFIG`, with
//! `INNET_MPI_*` variables overriding single keys. Every rank reads the same file.
//!
//! ```toml
//! mode = "auto"              # auto | inc-node | inc-socket | inc-nic | host-rd | host-ring
//! ranks_per_node = 2         # world ranks 0-1 on node 0, 2-3 on node 1, … (block placement)
//! sockets_per_node = 1
//! timeout_ms = 10000
//! cutover = "cutover.toml"   # optional: longer messages than it names go to MPI
//!
//! [[node]]
//! tor = 0
//! nics = ["10.0.0.1"]        # one per CPU socket for inc-socket
//! netns = "rack1-node0"      # optional: open this node's INC sockets in that namespace
//! ```

use std::{net::Ipv4Addr, path::Path, str::FromStr, time::Duration};

use innet_client::{Cutover, CutoverTable, Layout, Mode, NodePlacement, cutover::CutoverError};
use serde::Deserialize;

/// The variable that names the configuration file.
pub const CONFIG_VAR: &str = "INNET_MPI_CONFIG";
/// `0`, `off` or `false` turns the interposer off: every call goes to MPI.
pub const ENABLE_VAR: &str = "INNET_MPI";
/// Overrides `mode`.
pub const MODE_VAR: &str = "INNET_MPI_MODE";
/// Overrides `cutover` (the cutover table's path).
pub const CUTOVER_VAR: &str = "INNET_MPI_CUTOVER";

/// A configuration that cannot be used, and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "{CONFIG_VAR} is not set: point it at a file that places the ranks on innet ports (see docs/mpi.md), or set {ENABLE_VAR}=0"
    )]
    NotSet,
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{MODE_VAR}: {0}")]
    Mode(String),
    #[error(
        "the file places {placed} ranks ({nodes} nodes × {per_node}) but the job has {world}: list one [[node]] per {per_node} ranks, or change ranks_per_node"
    )]
    WorldSize {
        placed: usize,
        nodes: usize,
        per_node: usize,
        world: usize,
    },
    #[error("node {node} lists no NIC address: give it nics = [\"a.b.c.d\"]")]
    NoNic { node: usize },
    #[error("ranks_per_node and sockets_per_node must be at least 1")]
    Zero,
    #[error(transparent)]
    Cutover(#[from] CutoverError),
}

#[derive(Debug, Deserialize, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    pub tor: usize,
    pub nics: Vec<Ipv4Addr>,
    /// Network namespace (a name under /run/netns, or a path) the node's INC sockets live in.
    #[serde(default)]
    pub netns: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default = "default_mode")]
    mode: String,
    #[serde(default = "one")]
    ranks_per_node: usize,
    #[serde(default = "one")]
    sockets_per_node: usize,
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u64,
    /// The cutover table (relative to this file's directory).
    #[serde(default)]
    cutover: Option<String>,
    node: Vec<NodeEntry>,
}

fn default_mode() -> String {
    "auto".into()
}
const fn one() -> usize {
    1
}
const fn default_timeout_ms() -> u64 {
    10_000
}

/// The job's placement: which node each world rank is on, and how collectives should run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub mode: Mode,
    pub ranks_per_node: usize,
    pub sockets_per_node: usize,
    pub timeout: Duration,
    pub nodes: Vec<NodeEntry>,
    /// The cutover table's rules against MPI (empty: innet serves every size).
    pub cutover: Vec<Cutover>,
}

/// Whether the environment turns the interposer off.
#[must_use]
pub fn disabled_by(value: Option<&str>) -> bool {
    matches!(
        value.map(str::to_ascii_lowercase).as_deref(),
        Some("0" | "off" | "false" | "no")
    )
}

impl Placement {
    /// Reads the configuration the environment names, for a world of `world` ranks.
    pub fn from_env(world: usize) -> Result<Self, ConfigError> {
        let path = std::env::var(CONFIG_VAR).map_err(|_| ConfigError::NotSet)?;
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        let mode = std::env::var(MODE_VAR).ok();
        let mut p = Self::parse(Path::new(&path), &text, mode.as_deref(), world)?;
        if let Ok(table) = std::env::var(CUTOVER_VAR) {
            p.cutover = CutoverTable::load(Path::new(&table))?.mpi;
        }
        Ok(p)
    }

    /// Parses `text` (the file at `path`), `mode` overriding the file's.
    pub fn parse(
        path: &Path,
        text: &str,
        mode: Option<&str>,
        world: usize,
    ) -> Result<Self, ConfigError> {
        let f: File = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let mode = Mode::from_str(mode.unwrap_or(&f.mode)).map_err(ConfigError::Mode)?;
        if f.ranks_per_node == 0 || f.sockets_per_node == 0 {
            return Err(ConfigError::Zero);
        }
        if let Some(node) = f.node.iter().position(|n| n.nics.is_empty()) {
            return Err(ConfigError::NoNic { node });
        }
        let placed = f.node.len() * f.ranks_per_node;
        if placed != world {
            return Err(ConfigError::WorldSize {
                placed,
                nodes: f.node.len(),
                per_node: f.ranks_per_node,
                world,
            });
        }
        let cutover = match &f.cutover {
            Some(t) => {
                let dir = path.parent().unwrap_or(Path::new("."));
                CutoverTable::load(&dir.join(t))?.mpi
            }
            None => vec![],
        };
        Ok(Self {
            mode,
            ranks_per_node: f.ranks_per_node,
            sockets_per_node: f.sockets_per_node,
            timeout: Duration::from_millis(f.timeout_ms),
            nodes: f.node,
            cutover,
        })
    }

    /// The node world rank `rank` runs on.
    #[must_use]
    pub fn node_of(&self, rank: usize) -> usize {
        rank / self.ranks_per_node
    }

    /// The innet layout of a communicator whose rank `i` is world rank `members[i]`, and its
    /// nodes in order; `Err` names why innet cannot serve it (the ranks of a node must be
    /// contiguous and every node must hold as many).
    pub fn layout_of(&self, members: &[usize]) -> Result<(Layout, Vec<usize>), String> {
        let mut nodes: Vec<usize> = vec![];
        let mut counts: Vec<usize> = vec![];
        for &w in members {
            let node = self.node_of(w);
            if node >= self.nodes.len() {
                return Err(format!("world rank {w} is outside the placement"));
            }
            if nodes.last() == Some(&node) {
                *counts.last_mut().expect("a node") += 1;
            } else if nodes.contains(&node) {
                return Err(format!(
                    "the ranks on node {node} are not contiguous in the communicator"
                ));
            } else {
                nodes.push(node);
                counts.push(1);
            }
        }
        let per_node = counts[0];
        if counts.iter().any(|&c| c != per_node) {
            return Err(format!(
                "the nodes hold different numbers of the communicator's ranks ({counts:?})"
            ));
        }
        // Socket mode needs the full sockets of a node; a partial node runs as one socket.
        let sockets = if per_node == self.ranks_per_node {
            self.sockets_per_node
        } else {
            1
        };
        let layout = Layout::new(members.len(), per_node, sockets).map_err(|e| e.to_string())?;
        Ok((layout, nodes))
    }

    /// innet's view of `nodes` (indices into the placement).
    #[must_use]
    pub fn placements(&self, nodes: &[usize]) -> Vec<NodePlacement> {
        nodes
            .iter()
            .map(|&n| NodePlacement {
                tor: self.nodes[n].tor,
                nics: self.nodes[n].nics.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FOUR: &str = r#"
mode = "inc-node"
ranks_per_node = 2
[[node]]
tor = 0
nics = ["10.0.0.1"]
netns = "a"
[[node]]
tor = 1
nics = ["10.0.1.1"]
"#;

    fn four() -> Placement {
        Placement::parse(Path::new("t.toml"), FOUR, None, 4).expect("valid")
    }

    #[test]
    fn a_file_places_world_ranks_in_blocks() {
        let p = four();
        assert_eq!(p.mode, Mode::IncNode);
        assert_eq!((p.node_of(1), p.node_of(2)), (0, 1));
        assert_eq!(p.nodes[0].netns.as_deref(), Some("a"));
        assert_eq!(p.nodes[1].netns, None);
        assert_eq!(p.timeout, Duration::from_secs(10));
        let m = Placement::parse(Path::new("t"), FOUR, Some("host-ring"), 4).expect("valid");
        assert_eq!(m.mode, Mode::HostRing);
    }

    #[test]
    fn misconfigurations_name_the_fix() {
        let world = Placement::parse(Path::new("t"), FOUR, None, 6).unwrap_err();
        assert!(world.to_string().contains("places 4 ranks"), "{world}");
        let mode = Placement::parse(Path::new("t"), FOUR, Some("fast"), 4).unwrap_err();
        assert!(mode.to_string().contains("use one of"), "{mode}");
        let typo =
            Placement::parse(Path::new("t"), "rank_per_node = 2\nnode = []", None, 0).unwrap_err();
        assert!(typo.to_string().contains("rank_per_node"), "{typo}");
        let nic =
            Placement::parse(Path::new("t"), "[[node]]\ntor = 0\nnics = []", None, 1).unwrap_err();
        assert!(nic.to_string().contains("nics"), "{nic}");
        assert!(disabled_by(Some("OFF")) && disabled_by(Some("0")));
        assert!(!disabled_by(None) && !disabled_by(Some("1")));
    }

    #[test]
    fn sub_communicators_keep_or_lose_the_network() {
        let p = four();
        let (l, nodes) = p.layout_of(&[0, 1, 2, 3]).expect("world");
        assert_eq!((l.size, l.ranks_per_node, nodes), (4, 2, vec![0, 1]));
        let (l, nodes) = p.layout_of(&[0, 2]).expect("one per node");
        assert_eq!((l.ranks_per_node, nodes), (1, vec![0, 1]));
        assert!(
            p.layout_of(&[0, 2, 1, 3])
                .unwrap_err()
                .contains("not contiguous")
        );
        assert!(
            p.layout_of(&[0, 1, 2])
                .unwrap_err()
                .contains("different numbers")
        );
        assert!(p.layout_of(&[7]).unwrap_err().contains("outside"));
    }
}
