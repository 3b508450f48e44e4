//! Learned decisions kept per machine: with `INNET_MPI_LEARNED=FILE`, world rank 0 writes
//! its communicators' decisions into FILE at `MPI_Finalize` (merged with what FILE held,
//! the latest decision per shape, collective and size class winning), and every later
//! run that names FILE starts each communicator's classes from the decisions for its
//! shape (nodes × ranks per node) instead of a trial, re-checking them as usual
//! ([`innet_client::policy::RECHECK_FIRST`] calls later), so a file from another machine or an
//! older innet corrects itself.
//!
//! Every rank of a communicator must take the same way on every call: the ranks agree on
//! the seeds over innet itself (one allreduce at the communicator's set-up), and a class
//! whose seed any rank read differently (a node that cannot read FILE, a file rewritten
//! meanwhile) starts with a trial.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::warn;

use innet_client::policy::{CLASSES, Decision, Way, class_of};

/// The variable naming the file.
pub const SAVED_VAR: &str = "INNET_MPI_LEARNED";

/// A seed byte: no saved decision.
pub const NONE: u8 = 0;
const NETWORK: u8 = 1;
const MPI: u8 = 2;

/// The file named by [`SAVED_VAR`], if any.
#[must_use]
pub fn path() -> Option<PathBuf> {
    std::env::var_os(SAVED_VAR)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The file: its decisions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SavedFile {
    #[serde(default, rename = "decision")]
    pub decisions: Vec<Saved>,
}

/// One decision as kept: its communicator's shape, collective and size class, the way,
/// and the ranks' mean times that decided it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Saved {
    pub nodes: usize,
    pub ppn: usize,
    pub collective: String,
    pub max_bytes: u64,
    pub way: Way,
    pub network_us: f64,
    pub mpi_us: f64,
}

impl Saved {
    fn key(&self) -> (usize, usize, &str, u64) {
        (self.nodes, self.ppn, &self.collective, self.max_bytes)
    }
}

/// Reads `path`; a missing file is an empty one.
///
/// # Errors
/// The file cannot be read or parsed.
pub fn read(path: &Path) -> Result<SavedFile, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(SavedFile::default()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// The seeds of a communicator of `nodes` × `ppn` whose collectives are `kinds`: one byte
/// per (kind, size class), in the learner's order ([`NONE`], network or MPI).
#[must_use]
pub fn seeds(file: &SavedFile, (nodes, ppn): (usize, usize), kinds: &[&str]) -> Vec<u8> {
    let mut seeds = vec![NONE; kinds.len() * CLASSES];
    for d in file
        .decisions
        .iter()
        .filter(|d| (d.nodes, d.ppn) == (nodes, ppn))
    {
        let Some(k) = kinds.iter().position(|k| *k == d.collective) else {
            continue;
        };
        let class = class_of(usize::try_from(d.max_bytes).unwrap_or(usize::MAX));
        seeds[k * CLASSES + class.min(CLASSES - 1)] = match d.way {
            Way::Network => NETWORK,
            Way::Mpi => MPI,
        };
    }
    seeds
}

/// What the ranks' allreduce (MAX, bytewise) runs on: the seeds, then their complements
/// (the MAX of a complement is the complement of the MIN).
#[must_use]
pub fn agreement_input(seeds: &[u8]) -> Vec<u8> {
    seeds
        .iter()
        .copied()
        .chain(seeds.iter().map(|s| u8::MAX - s))
        .collect()
}

/// The seeds every rank read alike, from the MAX over the ranks of [`agreement_input`];
/// [`NONE`] where they differ.
#[must_use]
pub fn agreed(max: &[u8]) -> Vec<u8> {
    let (high, low) = max.split_at(max.len() / 2);
    high.iter()
        .zip(low)
        .map(|(&h, &l)| if h == u8::MAX - l { h } else { NONE })
        .collect()
}

/// The way a seed byte names.
#[must_use]
pub fn way_of(seed: u8) -> Option<Way> {
    match seed {
        NETWORK => Some(Way::Network),
        MPI => Some(Way::Mpi),
        _ => None,
    }
}

/// Merges `decisions` (those with a shape) into `path`'s, the latest per shape,
/// collective and class winning, and writes it (through a temporary file beside it).
///
/// # Errors
/// The file cannot be read, parsed or written.
pub fn save(path: &Path, decisions: &[Decision]) -> Result<usize, String> {
    let mut file = read(path)?;
    let mut added = 0;
    for d in decisions.iter().filter(|d| d.nodes > 0) {
        let s = Saved {
            nodes: d.nodes,
            ppn: d.ppn,
            collective: d.collective.clone(),
            max_bytes: d.max_bytes,
            way: d.way,
            network_us: d.ranks_us.map_or(d.network_us, |m| m[0]),
            mpi_us: d.ranks_us.map_or(d.mpi_us, |m| m[1]),
        };
        file.decisions.retain(|old| old.key() != s.key());
        file.decisions.push(s);
        added += 1;
    }
    let text = format!(
        "# innet's learned cutover on this machine (INNET_MPI_LEARNED): per communicator\n\
         # shape, collective and size class, the faster way and the ranks' mean µs that\n\
         # decided it. Written by world rank 0 at MPI_Finalize; delete it to learn afresh.\n\n{}",
        toml::to_string(&file).map_err(|e| e.to_string())?
    );
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(added)
}

/// World rank 0's part at `MPI_Finalize`: saves `decisions` when [`SAVED_VAR`] names a
/// file (a failure is logged: the run's results stand).
pub fn save_at_finalize(decisions: &[Decision]) {
    let Some(path) = path() else {
        return;
    };
    if let Err(e) = save(&path, decisions) {
        warn!(error = %e, "the learned cutover could not be saved ({SAVED_VAR})");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [&str; 2] = ["allreduce", "bcast"];

    fn decision(nodes: usize, collective: &str, max_bytes: u64, way: Way) -> Decision {
        Decision {
            communicator: 0,
            collective: collective.into(),
            max_bytes,
            way,
            network_us: 1.0,
            mpi_us: 2.0,
            proposed: way,
            after_calls: 0,
            ranks_us: Some([10.0, 20.0]),
            samples: 6,
            nodes,
            ppn: 1,
        }
    }

    #[test]
    fn saved_decisions_merge_and_seed_their_shape_only() {
        let dir = std::env::temp_dir().join(format!("innet-saved-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("learned.toml");
        let _ = std::fs::remove_file(&path);
        save(
            &path,
            &[
                decision(4, "allreduce", 8, Way::Mpi),
                decision(4, "bcast", 256, Way::Network),
                decision(16, "allreduce", 8, Way::Network),
            ],
        )
        .unwrap();
        // A later run decides 4 × 1's 8 B allreduce the other way: it replaces the first.
        save(&path, &[decision(4, "allreduce", 8, Way::Network)]).unwrap();
        let file = read(&path).unwrap();
        assert_eq!(file.decisions.len(), 3, "{file:?}");
        let s = seeds(&file, (4, 1), &KINDS);
        assert_eq!(way_of(s[class_of(8)]), Some(Way::Network));
        assert_eq!(way_of(s[CLASSES + class_of(256)]), Some(Way::Network));
        assert_eq!(s.iter().filter(|&&b| b != NONE).count(), 2, "4 × 1's only");
        assert!(seeds(&file, (8, 1), &KINDS).iter().all(|&b| b == NONE));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_seeds_every_rank_read_alike_are_taken() {
        let a = [NONE, NETWORK, MPI, MPI];
        let b = [NONE, NETWORK, NONE, NETWORK];
        let max: Vec<u8> = agreement_input(&a)
            .iter()
            .zip(agreement_input(&b))
            .map(|(x, y)| (*x).max(y))
            .collect();
        assert_eq!(agreed(&max), vec![NONE, NETWORK, NONE, NONE]);
    }

    #[test]
    fn a_missing_file_is_empty_and_a_broken_one_an_error() {
        assert_eq!(
            read(Path::new("/nonexistent/innet-learned.toml")).unwrap(),
            SavedFile::default()
        );
        let path = std::env::temp_dir().join(format!("innet-broken-{}.toml", std::process::id()));
        std::fs::write(&path, "decision = 3").unwrap();
        assert!(read(&path).is_err());
        std::fs::remove_file(&path).unwrap();
    }
}
