//! The cutover table: for each communicator shape (nodes × ranks per node), the longest
//! message the network path is faster for. `auto` and the MPI interposer hand longer
//! messages to the host path (the library's host algorithms, or MPI's own allreduce), so
//! innet is never slower than what it replaces.
//!
//! `cargo xtask bench` measures it on the fabric, next to the numbers it is derived from,
//! and writes `cutover.toml`:
//!
//! ```toml
//! # against the library's host algorithms (auto mode)
//! [[library]]
//! nodes = 4
//! ppn = 1
//! network_max_bytes = 256
//!
//! # against MPI's own allreduce over the fabric (the interposer)
//! [[mpi]]
//! nodes = 16
//! ppn = 1
//! network_max_bytes = 1024
//! ```
//!
//! Every rank of a job must read the same table: the choice is made per call on each rank
//! from (shape, message size), and the ranks of a collective must all take the same path.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// One measured shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cutover {
    pub nodes: usize,
    pub ppn: usize,
    /// Messages up to this many bytes go through the network; longer ones to the hosts
    /// (0: every message to the hosts).
    pub network_max_bytes: usize,
}

/// The whole file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CutoverTable {
    /// Against the library's host algorithms (`auto` mode).
    #[serde(default)]
    pub library: Vec<Cutover>,
    /// Against MPI's own allreduce over the fabric (the interposer).
    #[serde(default)]
    pub mpi: Vec<Cutover>,
}

/// A table that cannot be read, and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum CutoverError {
    #[error("reading the cutover table {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "the cutover table {path}: {message} (see innet_client::cutover, or re-measure it with `cargo xtask bench`)"
    )]
    Parse { path: String, message: String },
}

impl CutoverTable {
    /// Reads the table at `path`.
    ///
    /// # Errors
    /// The file cannot be read or is not a cutover table.
    pub fn load(path: &Path) -> Result<Self, CutoverError> {
        let text = std::fs::read_to_string(path).map_err(|source| CutoverError::Read {
            path: path.display().to_string(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| CutoverError::Parse {
            path: path.display().to_string(),
            message: e.message().to_owned(),
        })
    }

    /// The table as TOML, under a comment that says where it came from.
    #[must_use]
    pub fn to_toml(&self, comment: &str) -> String {
        let mut s = String::new();
        for l in comment.lines() {
            s += "# ";
            s += l;
            s += "\n";
        }
        s + &toml::to_string(self).expect("a cutover table serialises")
    }
}

/// The longest message the network serves for a communicator of `nodes` × `ppn`, from
/// `rules`: the rule of the nearest ppn, and among those the one with the most nodes not
/// above `nodes` (the network's lead grows with the node count), else the fewest. `None`
/// when there is no rule: the network serves every size.
#[must_use]
pub fn network_max_bytes(rules: &[Cutover], nodes: usize, ppn: usize) -> Option<usize> {
    let ppn_gap = |r: &Cutover| r.ppn.abs_diff(ppn);
    let best_ppn = rules.iter().map(ppn_gap).min()?;
    let same: Vec<&Cutover> = rules.iter().filter(|r| ppn_gap(r) == best_ppn).collect();
    same.iter()
        .filter(|r| r.nodes <= nodes)
        .max_by_key(|r| r.nodes)
        .or_else(|| same.iter().min_by_key(|r| r.nodes))
        .map(|r| r.network_max_bytes)
}

/// One measured point: the mean latency of the network path and of the host path.
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    pub nodes: usize,
    pub ppn: usize,
    pub bytes: usize,
    pub network_us: f64,
    pub host_us: f64,
}

/// The rules measurements call for: per shape, the largest measured size up to which the
/// network was faster at every measured size (a size between two measured ones goes to the
/// hosts once the larger one does not win: the conservative side).
#[must_use]
pub fn derive(points: &[Measured]) -> Vec<Cutover> {
    let mut shapes: Vec<(usize, usize)> = points.iter().map(|p| (p.nodes, p.ppn)).collect();
    shapes.sort_unstable();
    shapes.dedup();
    shapes
        .into_iter()
        .map(|(nodes, ppn)| {
            let mut at: Vec<&Measured> = points
                .iter()
                .filter(|p| p.nodes == nodes && p.ppn == ppn)
                .collect();
            at.sort_by_key(|p| p.bytes);
            let network_max_bytes = at
                .iter()
                .take_while(|p| p.network_us < p.host_us)
                .last()
                .map_or(0, |p| p.bytes);
            Cutover {
                nodes,
                ppn,
                network_max_bytes,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(nodes: usize, ppn: usize, max: usize) -> Cutover {
        Cutover {
            nodes,
            ppn,
            network_max_bytes: max,
        }
    }

    #[test]
    fn lookup_takes_the_nearest_ppn_then_the_largest_shape_not_above() {
        let rules = [rule(4, 1, 256), rule(16, 1, 4096), rule(4, 4, 64)];
        assert_eq!(network_max_bytes(&rules, 4, 1), Some(256));
        assert_eq!(network_max_bytes(&rules, 8, 1), Some(256));
        assert_eq!(network_max_bytes(&rules, 64, 1), Some(4096));
        assert_eq!(
            network_max_bytes(&rules, 2, 1),
            Some(256),
            "below every shape"
        );
        assert_eq!(network_max_bytes(&rules, 16, 4), Some(64));
        assert_eq!(
            network_max_bytes(&rules, 16, 2),
            Some(4096),
            "ppn 1 is nearer"
        );
        assert_eq!(network_max_bytes(&[], 16, 1), None);
    }

    #[test]
    fn derive_stops_at_the_first_size_the_network_loses() {
        let m = |nodes, bytes, network_us, host_us| Measured {
            nodes,
            ppn: 1,
            bytes,
            network_us,
            host_us,
        };
        let points = [
            m(4, 4, 26.0, 80.0),
            m(4, 256, 31.0, 96.0),
            m(4, 4096, 183.0, 121.0),
            // A win past a loss does not extend the range.
            m(4, 65536, 900.0, 1000.0),
            m(16, 4, 900.0, 800.0),
            m(16, 256, 300.0, 800.0),
        ];
        assert_eq!(derive(&points), vec![rule(4, 1, 256), rule(16, 1, 0)]);
    }

    #[test]
    fn the_file_round_trips_and_bad_files_are_named() {
        let t = CutoverTable {
            library: vec![rule(4, 1, 256)],
            mpi: vec![rule(16, 1, 1024), rule(4, 4, 0)],
        };
        let dir = std::env::temp_dir().join(format!("innet-cutover-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("cutover.toml");
        std::fs::write(&f, t.to_toml("measured\non a test")).unwrap();
        assert_eq!(CutoverTable::load(&f).unwrap(), t);
        std::fs::write(&f, "[[mpi]]\nnodes = 4\n").unwrap();
        let e = CutoverTable::load(&f).unwrap_err().to_string();
        assert!(e.contains("cutover.toml") && e.contains("ppn"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
