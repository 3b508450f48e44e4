//! Where each MPI rank's innet port is, and how collectives run. Without a file the
//! interposer finds the placement itself ([`crate::discover`]): which node each rank is on
//! (MPI's shared-memory split), the node's INC address and its TOR (a probe answered by the
//! switch). A TOML file named by `INNET_MPI_CONFIG` sets the rest, and with `[[node]]`
//! entries places the ranks by hand (block placement); `INNET_MPI_*` variables override
//! single keys. Every rank reads the same file.
//!
//! ```toml
//! mode = "auto"              # auto | inc-node | inc-socket | inc-nic | host-rd | host-ring
//! timeout_ms = 10000
//! cutover = "cutover.toml"   # optional: longer messages than it names go to MPI
//!                            # (without it the interposer learns where MPI is faster)
//! # Optional, all or nothing: the placement by hand.
//! ranks_per_node = 2         # world ranks 0-1 on node 0, 2-3 on node 1, … (block placement)
//! sockets_per_node = 1
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
    #[error(
        "{path}: sockets_per_node = {sockets} needs the placement by hand ([[node]] entries listing each socket's NIC); without them every node runs one leader"
    )]
    SocketsNeedNodes { path: String, sockets: usize },
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
    #[serde(default)]
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

/// How collectives run, whoever places the ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSettings {
    pub mode: Mode,
    pub timeout: Duration,
    /// The cutover table's rules against MPI (empty: the interposer learns them).
    pub cutover: Vec<Cutover>,
}

impl Default for JobSettings {
    fn default() -> Self {
        Self {
            mode: Mode::Auto,
            timeout: Duration::from_millis(default_timeout_ms()),
            cutover: vec![],
        }
    }
}

/// What the environment asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// The file places the ranks.
    Placed(Placement),
    /// The interposer finds the placement itself ([`crate::discover`]).
    Discover(JobSettings),
}

/// The job's placement: which node each world rank is on, and how collectives should run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub settings: JobSettings,
    pub sockets_per_node: usize,
    /// The nodes, TOR by TOR.
    pub nodes: Vec<NodeEntry>,
    /// The node (index into `nodes`) of each world rank.
    pub node_of_rank: Vec<usize>,
    /// Whether the interposer found it (else a file gave it).
    pub discovered: bool,
}

/// Whether the environment turns the interposer off.
#[must_use]
pub fn disabled_by(value: Option<&str>) -> bool {
    matches!(
        value.map(str::to_ascii_lowercase).as_deref(),
        Some("0" | "off" | "false" | "no")
    )
}

impl Start {
    /// Reads the configuration the environment names, for a world of `world` ranks.
    pub fn from_env(world: usize) -> Result<Self, ConfigError> {
        let mode = std::env::var(MODE_VAR).ok();
        let mut start = match std::env::var(CONFIG_VAR) {
            Ok(path) => {
                let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                Self::parse(Path::new(&path), &text, mode.as_deref(), world)?
            }
            Err(_) => Self::Discover(JobSettings {
                mode: parse_mode(mode.as_deref().unwrap_or("auto"))?,
                ..JobSettings::default()
            }),
        };
        if let Ok(table) = std::env::var(CUTOVER_VAR) {
            start.settings_mut().cutover = CutoverTable::load(Path::new(&table))?.mpi;
        }
        Ok(start)
    }

    fn settings_mut(&mut self) -> &mut JobSettings {
        match self {
            Self::Placed(p) => &mut p.settings,
            Self::Discover(s) => s,
        }
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
        let mode = parse_mode(mode.unwrap_or(&f.mode))?;
        if f.ranks_per_node == 0 || f.sockets_per_node == 0 {
            return Err(ConfigError::Zero);
        }
        let cutover = match &f.cutover {
            Some(t) => {
                let dir = path.parent().unwrap_or(Path::new("."));
                CutoverTable::load(&dir.join(t))?.mpi
            }
            None => vec![],
        };
        let settings = JobSettings {
            mode,
            timeout: Duration::from_millis(f.timeout_ms),
            cutover,
        };
        if f.node.is_empty() {
            if f.sockets_per_node > 1 {
                return Err(ConfigError::SocketsNeedNodes {
                    path: path.display().to_string(),
                    sockets: f.sockets_per_node,
                });
            }
            return Ok(Self::Discover(settings));
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
        Ok(Self::Placed(Placement {
            settings,
            sockets_per_node: f.sockets_per_node,
            node_of_rank: (0..world).map(|r| r / f.ranks_per_node).collect(),
            nodes: f.node,
            discovered: false,
        }))
    }
}

fn parse_mode(s: &str) -> Result<Mode, ConfigError> {
    Mode::from_str(s).map_err(ConfigError::Mode)
}

/// How a communicator's ranks map onto innet: its layout, its nodes in placement order, and
/// the communicator rank behind each innet rank (the ranks of a node contiguous).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommLayout {
    pub layout: Layout,
    pub nodes: Vec<usize>,
    pub order: Vec<usize>,
}

impl CommLayout {
    /// The innet rank of communicator rank `rank`.
    #[must_use]
    pub fn innet_rank(&self, rank: usize) -> Option<usize> {
        self.order.iter().position(|&r| r == rank)
    }
}

impl Placement {
    /// The node world rank `rank` runs on.
    #[must_use]
    pub fn node_of(&self, rank: usize) -> Option<usize> {
        self.node_of_rank.get(rank).copied()
    }

    /// The innet layout of a communicator whose rank `i` is world rank `members[i]`. Any
    /// order of ranks works (innet numbers them node by node; every op it serves is
    /// commutative); `Err` names why innet cannot serve it (every node must hold as many
    /// of the communicator's ranks).
    pub fn layout_of(&self, members: &[usize]) -> Result<CommLayout, String> {
        let mut node_of = Vec::with_capacity(members.len());
        for &w in members {
            match self.node_of(w) {
                Some(n) if n < self.nodes.len() => node_of.push(n),
                _ => return Err(format!("world rank {w} is outside the placement")),
            }
        }
        let mut nodes = node_of.clone();
        nodes.sort_unstable();
        nodes.dedup();
        let counts: Vec<usize> = nodes
            .iter()
            .map(|n| node_of.iter().filter(|&m| m == n).count())
            .collect();
        let per_node = counts[0];
        if counts.iter().any(|&c| c != per_node) {
            return Err(format!(
                "its ranks sit unevenly on its nodes ({counts:?} ranks per node): innet needs as many on every node"
            ));
        }
        let mut order: Vec<usize> = (0..members.len()).collect();
        order.sort_by_key(|&i| (node_of[i], i));
        // Socket mode needs the full sockets of a node; a partial node runs as one socket.
        let on_node = self.node_of_rank.iter().filter(|&&n| n == nodes[0]).count();
        let sockets = if per_node == on_node {
            self.sockets_per_node
        } else {
            1
        };
        let layout = Layout::new(members.len(), per_node, sockets).map_err(|e| e.to_string())?;
        Ok(CommLayout {
            layout,
            nodes,
            order,
        })
    }

    /// innet's view of `nodes` (indices into the placement).
    #[must_use]
    pub fn placements(&self, nodes: &[usize]) -> Vec<NodePlacement> {
        nodes
            .iter()
            .map(|&n| NodePlacement::new(self.nodes[n].tor, self.nodes[n].nics.clone()))
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

    fn placed(text: &str, mode: Option<&str>, world: usize) -> Result<Placement, ConfigError> {
        match Start::parse(Path::new("t.toml"), text, mode, world)? {
            Start::Placed(p) => Ok(p),
            Start::Discover(_) => panic!("the file places the ranks"),
        }
    }

    fn four() -> Placement {
        placed(FOUR, None, 4).expect("valid")
    }

    #[test]
    fn a_file_places_world_ranks_in_blocks() {
        let p = four();
        assert_eq!(p.settings.mode, Mode::IncNode);
        assert_eq!((p.node_of(1), p.node_of(2)), (Some(0), Some(1)));
        assert_eq!(p.nodes[0].netns.as_deref(), Some("a"));
        assert_eq!(p.nodes[1].netns, None);
        assert_eq!(p.settings.timeout, Duration::from_secs(10));
        assert!(!p.discovered);
        let m = placed(FOUR, Some("host-ring"), 4).expect("valid");
        assert_eq!(m.settings.mode, Mode::HostRing);
    }

    #[test]
    fn a_file_without_nodes_only_sets_how_collectives_run() {
        let Start::Discover(s) = Start::parse(
            Path::new("t"),
            "mode = \"inc-node\"\ntimeout_ms = 500",
            None,
            7,
        )
        .expect("valid") else {
            panic!("no [[node]]: the interposer places the ranks");
        };
        assert_eq!(
            (s.mode, s.timeout),
            (Mode::IncNode, Duration::from_millis(500))
        );
        let sockets = Start::parse(Path::new("t"), "sockets_per_node = 2", None, 4).unwrap_err();
        assert!(sockets.to_string().contains("[[node]]"), "{sockets}");
    }

    #[test]
    fn misconfigurations_name_the_fix() {
        let world = placed(FOUR, None, 6).unwrap_err();
        assert!(world.to_string().contains("places 4 ranks"), "{world}");
        let mode = placed(FOUR, Some("fast"), 4).unwrap_err();
        assert!(mode.to_string().contains("use one of"), "{mode}");
        let typo =
            Start::parse(Path::new("t"), "rank_per_node = 2\nnode = []", None, 0).unwrap_err();
        assert!(typo.to_string().contains("rank_per_node"), "{typo}");
        let nic = placed("[[node]]\ntor = 0\nnics = []", None, 1).unwrap_err();
        assert!(nic.to_string().contains("nics"), "{nic}");
        assert!(disabled_by(Some("OFF")) && disabled_by(Some("0")));
        assert!(!disabled_by(None) && !disabled_by(Some("1")));
    }

    #[test]
    fn any_rank_order_keeps_the_network_uneven_nodes_do_not() {
        let p = four();
        let c = p.layout_of(&[0, 1, 2, 3]).expect("world");
        assert_eq!((c.layout.size, c.layout.ranks_per_node), (4, 2));
        assert_eq!((c.nodes, c.order), (vec![0, 1], vec![0, 1, 2, 3]));
        let c = p.layout_of(&[0, 2]).expect("one per node");
        assert_eq!((c.layout.ranks_per_node, c.nodes), (1, vec![0, 1]));
        // Round-robin (mpirun --map-by node): innet numbers the ranks node by node.
        let c = p.layout_of(&[0, 2, 1, 3]).expect("round-robin");
        assert_eq!(c.order, [0, 2, 1, 3]);
        assert_eq!(
            (0..4).map(|r| c.innet_rank(r).unwrap()).collect::<Vec<_>>(),
            [0, 2, 1, 3]
        );
        let c = p
            .layout_of(&[2, 0, 3, 1])
            .expect("nodes listed out of order");
        assert_eq!((c.nodes, c.order), (vec![0, 1], vec![1, 3, 0, 2]));
        assert!(p.layout_of(&[0, 1, 2]).unwrap_err().contains("unevenly"));
        assert!(p.layout_of(&[7]).unwrap_err().contains("outside"));
    }
}
