//! What the interposer did, per rank: collectives innet served (by path), collectives it
//! handed to MPI (by reason). Written at `MPI_Finalize` as JSON into the directory
//! `INNET_MPI_REPORT` names (`rank-<world rank>.json`), and summed up on stderr with
//! `INNET_MPI_VERBOSE=1`.

use std::collections::BTreeMap;
use std::sync::{
    Mutex,
    atomic::{AtomicU64, Ordering::Relaxed},
};

use innet_client::{Fallback, Path, Report};
use serde::{Deserialize, Serialize};

use innet_client::policy::{Decision, REPORTED_DECISIONS};

use crate::{
    config::Placement,
    kind::{Kind, Pass},
};

/// The directory per-rank reports go to.
pub const REPORT_VAR: &str = "INNET_MPI_REPORT";
/// `1`: a one-line summary per rank on stderr at `MPI_Finalize`.
pub const VERBOSE_VAR: &str = "INNET_MPI_VERBOSE";

/// Where this rank sits, as the interposer placed it.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct Placed {
    /// `discovered` (no placement file) or `file`.
    pub by: String,
    pub nodes: usize,
    /// This rank's node (in TOR order), its INC address and its TOR's index.
    pub node: usize,
    pub address: String,
    pub tor: usize,
}

#[derive(Default)]
pub struct Counters {
    served: [AtomicU64; Kind::ALL.len()],
    passed: [[AtomicU64; Pass::ALL.len()]; Kind::ALL.len()],
    network: AtomicU64,
    nic_tree: AtomicU64,
    host: AtomicU64,
    local: AtomicU64,
    fallbacks: AtomicU64,
    /// Fallbacks by reason (rare: a lock is cheap enough).
    fell_back: Mutex<BTreeMap<String, u64>>,
    retransmissions: AtomicU64,
    opened: AtomicU64,
    refused: AtomicU64,
    closed: AtomicU64,
    decisions: Mutex<Vec<Decision>>,
    placed: Mutex<Option<Placed>>,
    /// Why innet does not serve the job or a communicator (the latest reason).
    why_not: Mutex<Option<String>>,
}

/// The snapshot written out (and read back by the tests).
#[derive(Serialize, Deserialize, Debug)]
pub struct Summary {
    pub rank: usize,
    pub served: BTreeMap<String, u64>,
    pub passed: BTreeMap<String, u64>,
    /// Served collectives by the way innet ran them.
    pub network: u64,
    pub nic_tree: u64,
    pub host: u64,
    pub local: u64,
    /// Served collectives that innet ran on the hosts after the network failed them.
    pub fallbacks: u64,
    /// The same by reason (`timeout`, `no_network/<fail_cause>`, `peer_fell_back`, …).
    #[serde(default)]
    pub fell_back: BTreeMap<String, u64>,
    pub retransmissions: u64,
    /// Communicators innet joined, refused (their collectives go to MPI) and left.
    pub groups_opened: u64,
    pub groups_refused: u64,
    pub groups_closed: u64,
    /// Where the interposer placed this rank (none: it does not serve the job).
    #[serde(default)]
    pub placement: Option<Placed>,
    /// Why innet did not serve the job or a communicator, if it did not.
    #[serde(default)]
    pub not_served: Option<String>,
    /// The learned cutover's decisions, each with the measurements behind it.
    #[serde(default)]
    pub cutover: Vec<Decision>,
}

impl Counters {
    pub fn served(&self, kind: Kind, r: &Report) {
        self.served[kind.index()].fetch_add(1, Relaxed);
        match r.path {
            Path::Network(_) => &self.network,
            Path::NicTree => &self.nic_tree,
            Path::Local => &self.local,
            // Host algorithms, and paths newer than these counters (the conservative guess).
            _ => &self.host,
        }
        .fetch_add(1, Relaxed);
        if let Some(f) = r.fallback.filter(|f| !matches!(f, Fallback::Unsupported)) {
            self.fallbacks.fetch_add(1, Relaxed);
            if let Ok(mut by) = self.fell_back.lock() {
                *by.entry(fallback_key(f)).or_default() += 1;
            }
        }
        self.retransmissions
            .fetch_add(u64::from(r.retransmissions), Relaxed);
    }

    pub fn passed(&self, kind: Kind, reason: Pass) {
        self.passed[kind.index()][reason as usize].fetch_add(1, Relaxed);
    }

    pub fn opened(&self, ok: bool) {
        if ok { &self.opened } else { &self.refused }.fetch_add(1, Relaxed);
    }

    pub fn closed(&self) {
        self.closed.fetch_add(1, Relaxed);
    }

    pub fn decided(&self, d: Decision) {
        if let Ok(mut all) = self.decisions.lock() {
            if all.len() >= REPORTED_DECISIONS {
                all.remove(0);
            }
            all.push(d);
        }
    }

    /// Records where `placement` puts world rank `rank`.
    pub fn placed(&self, placement: &Placement, rank: usize) {
        let Some(node) = placement.node_of(rank) else {
            return;
        };
        let entry = &placement.nodes[node];
        if let Ok(mut p) = self.placed.lock() {
            *p = Some(Placed {
                by: if placement.discovered {
                    "discovered"
                } else {
                    "file"
                }
                .into(),
                nodes: placement.nodes.len(),
                node,
                address: entry
                    .nics
                    .first()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                tor: entry.tor,
            });
        }
    }

    /// Why innet does not serve the job or a communicator (the report keeps the latest).
    pub fn not_served(&self, why: &str) {
        if let Ok(mut w) = self.why_not.lock() {
            *w = Some(why.to_owned());
        }
    }

    #[must_use]
    pub fn summary(&self, rank: usize) -> Summary {
        let mut passed = BTreeMap::new();
        for kind in Kind::ALL {
            for reason in Pass::ALL {
                let n = self.passed[kind.index()][reason as usize].load(Relaxed);
                if n > 0 {
                    passed.insert(format!("{}/{}", kind.name(), reason.name()), n);
                }
            }
        }
        Summary {
            rank,
            served: Kind::ALL
                .iter()
                .zip(&self.served)
                .map(|(k, n)| (k.name().to_owned(), n.load(Relaxed)))
                .collect(),
            passed,
            network: self.network.load(Relaxed),
            nic_tree: self.nic_tree.load(Relaxed),
            host: self.host.load(Relaxed),
            local: self.local.load(Relaxed),
            fallbacks: self.fallbacks.load(Relaxed),
            fell_back: self.fell_back.lock().map(|b| b.clone()).unwrap_or_default(),
            retransmissions: self.retransmissions.load(Relaxed),
            groups_opened: self.opened.load(Relaxed),
            groups_refused: self.refused.load(Relaxed),
            groups_closed: self.closed.load(Relaxed),
            placement: self.placed.lock().ok().and_then(|p| p.clone()),
            not_served: self.why_not.lock().ok().and_then(|w| w.clone()),
            cutover: self.decisions.lock().map(|d| d.clone()).unwrap_or_default(),
        }
    }
}

/// A fallback's reason as the report names it: its name, with the `fail_cause` of a
/// group the network cannot serve.
fn fallback_key(f: Fallback) -> String {
    match f {
        Fallback::NoNetwork { fail_cause } => format!("{}/{fail_cause}", f.name()),
        _ => f.name().into(),
    }
}

impl Summary {
    /// Collectives of `kind` innet served.
    #[must_use]
    pub fn served(&self, kind: &str) -> u64 {
        self.served.get(kind).copied().unwrap_or(0)
    }

    /// Collectives handed to MPI, by `kind/reason` (`allreduce/op` …).
    #[must_use]
    pub fn passed(&self, key: &str) -> u64 {
        self.passed.get(key).copied().unwrap_or(0)
    }

    /// Writes the report where the environment asks (nothing if it does not).
    pub fn publish(&self) {
        if let Some(dir) = std::env::var_os(REPORT_VAR) {
            let path = std::path::Path::new(&dir).join(format!("rank-{}.json", self.rank));
            let written = serde_json::to_vec_pretty(self)
                .map_err(std::io::Error::other)
                .and_then(|b| std::fs::write(&path, b));
            if let Err(e) = written {
                eprintln!("innet-mpi: writing {}: {e}", path.display());
            }
        }
        if crate::env_flag(VERBOSE_VAR) {
            let served: u64 = self.served.values().sum();
            let passed: u64 = self.passed.values().sum();
            eprintln!(
                "innet-mpi: rank {}: {served} collectives through innet (network {}, nic tree {}, hosts {}, local {}; {} fell back), {passed} to MPI {:?}",
                self.rank,
                self.network,
                self.nic_tree,
                self.host,
                self.local,
                self.fallbacks,
                self.passed
            );
        }
    }
}
