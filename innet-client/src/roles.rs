//! Who leads whom, who queries whom, and who sends to whom, for Node mode (one leader per
//! node) and Socket mode (one leader per CPU socket, each with its own NIC): the roles and
//! pairings of the RoCEv2 in-network allreduce design innet follows (leaders, MRRs, NMRRs:
//! see "Terms" in docs/architecture.md).
//!
//! Leaders (SRRs) are numbered in rank order: leader `i` is rank `i × P`, where `P` is the
//! ranks per node (Node mode) or per socket (Socket mode). The first `N` leaders are the MRRs
//! (`N` = 1 in Node mode, the sockets per node in Socket mode), the others NMRRs.

use std::ops::Range;

/// Why a rank layout cannot run as asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    #[error(
        "{size} ranks do not split into nodes of {per_node} ranks: every node must run the same number of ranks, with contiguous rank numbers"
    )]
    Uneven { size: usize, per_node: usize },
    #[error(
        "{per_node} ranks per node do not split over {sockets} sockets: Socket mode needs the same number of ranks on every socket"
    )]
    UnevenSockets { per_node: usize, sockets: usize },
    #[error("Socket mode needs two or more sockets per node (got {0}); use Node mode")]
    OneSocket(usize),
    #[error("rank {rank} is outside a communicator of {size} ranks")]
    RankOutOfRange { rank: usize, size: usize },
    #[error("ranks per node and sockets per node must be at least 1")]
    Zero,
    #[error("the placement lists {given} nodes, the layout has {nodes}: give one entry per node")]
    Placement { given: usize, nodes: usize },
    #[error("node {node} has {nics} NIC address(es), Socket mode needs one per socket ({sockets})")]
    TooFewNics {
        node: usize,
        nics: usize,
        sockets: usize,
    },
    #[error(
        "the nodes under TOR {tor} are not contiguous (node {node} breaks the run): number the nodes TOR by TOR"
    )]
    TorNotContiguous { tor: usize, node: usize },
}

/// How many ranks, and how they sit on nodes and sockets (contiguous rank numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Layout {
    pub size: usize,
    pub ranks_per_node: usize,
    pub sockets_per_node: usize,
}

impl Layout {
    /// # Errors
    /// Zero ranks or sockets per node, or a size that is not a whole number of nodes.
    pub fn new(
        size: usize,
        ranks_per_node: usize,
        sockets_per_node: usize,
    ) -> Result<Self, LayoutError> {
        if ranks_per_node == 0 || sockets_per_node == 0 {
            return Err(LayoutError::Zero);
        }
        if size == 0 || !size.is_multiple_of(ranks_per_node) {
            return Err(LayoutError::Uneven {
                size,
                per_node: ranks_per_node,
            });
        }
        Ok(Self {
            size,
            ranks_per_node,
            sockets_per_node,
        })
    }

    #[must_use]
    pub fn nodes(&self) -> usize {
        self.size / self.ranks_per_node
    }
}

/// Which ranks lead: one per node, or one per socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grouping {
    Node,
    Socket,
}

/// The roles of every rank under one grouping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RolePlan {
    pub layout: Layout,
    pub grouping: Grouping,
    /// `N`: MRRs (1 in Node mode, sockets per node in Socket mode).
    pub mrrs: usize,
    /// `P`: ranks per leader.
    pub per_leader: usize,
}

impl RolePlan {
    /// # Errors
    /// Socket mode with one socket, or ranks that do not split evenly over the sockets.
    pub fn new(layout: Layout, grouping: Grouping) -> Result<Self, LayoutError> {
        let (mrrs, per_leader) = match grouping {
            Grouping::Node => (1, layout.ranks_per_node),
            Grouping::Socket => {
                let n = layout.sockets_per_node;
                if n < 2 {
                    return Err(LayoutError::OneSocket(n));
                }
                if !layout.ranks_per_node.is_multiple_of(n) {
                    return Err(LayoutError::UnevenSockets {
                        per_node: layout.ranks_per_node,
                        sockets: n,
                    });
                }
                (n, layout.ranks_per_node / n)
            }
        };
        Ok(Self {
            layout,
            grouping,
            mrrs,
            per_leader,
        })
    }

    /// Number of leaders (SRRs): `S × N`.
    #[must_use]
    pub fn leaders(&self) -> usize {
        self.layout.size / self.per_leader
    }

    /// The leader (index) of `rank`.
    #[must_use]
    pub fn leader_of(&self, rank: usize) -> usize {
        rank / self.per_leader
    }

    /// The rank of leader `i`: `i × P`, formulas (1) and (2).
    #[must_use]
    pub fn leader_rank(&self, i: usize) -> usize {
        i * self.per_leader
    }

    /// The ranks leader `i` reduces for and broadcasts to (itself first).
    #[must_use]
    pub fn members(&self, i: usize) -> Range<usize> {
        self.leader_rank(i)..self.leader_rank(i + 1)
    }

    /// The node of leader `i`, and its socket there.
    #[must_use]
    pub fn node_of(&self, i: usize) -> (usize, usize) {
        (i / self.mrrs, i % self.mrrs)
    }

    #[must_use]
    pub fn is_mrr(&self, i: usize) -> bool {
        i < self.mrrs
    }

    /// Formula (3): the MRR an NMRR sends its query to. NMRR `k` (1-based) belongs to group
    /// `(k − 1) mod N + 1`, served by the MRR of that number.
    #[must_use]
    pub fn query_target(&self, nmrr: usize) -> usize {
        debug_assert!(!self.is_mrr(nmrr));
        let k = nmrr - self.mrrs + 1;
        (k - 1) % self.mrrs
    }

    /// Formula (4): the NMRRs MRR `i` (0-based) answers: NMRR `k × N + i + 1` for
    /// `k = 0 … S − 2`.
    #[must_use]
    pub fn notify_targets(&self, mrr: usize) -> Vec<usize> {
        let nodes = self.layout.nodes();
        (0..nodes.saturating_sub(1))
            .map(|k| self.mrrs + k * self.mrrs + mrr)
            .collect()
    }

    /// Every leader MRR `mrr` answers: its NMRRs (formula (4)) and, for the first MRR in
    /// Socket mode, the other MRRs it synchronises with. The same leaders get its kill.
    #[must_use]
    pub fn told_by(&self, mrr: usize) -> Vec<usize> {
        let mut told = self.notify_targets(mrr);
        if mrr == 0 {
            told.extend(1..self.mrrs);
        }
        told
    }

    /// Formulas (5) and (6): the leader that leader `i` sends its data packets to. `tor_of`
    /// gives each node's TOR; the nodes of one TOR are contiguous. Under a TOR the leaders
    /// form `N` closed rings (one per socket number; Node mode: one ring): `i → i + N`, and
    /// the last node's leaders close their rings back to the first node's.
    #[must_use]
    pub fn ring_successor(&self, i: usize, tor_of: &[usize]) -> usize {
        let (node, _) = self.node_of(i);
        let tor = tor_of[node];
        let first_node = (0..=node).rev().take_while(|&n| tor_of[n] == tor).last();
        let first = first_node.unwrap_or(node) * self.mrrs;
        let nodes_here = tor_of.iter().filter(|&&t| t == tor).count();
        // 1-based position among the TOR's leaders, as in the paper.
        let pos = i - first + 1;
        let last_block = (nodes_here - 1) * self.mrrs;
        let next = if pos <= last_block {
            pos + self.mrrs
        } else {
            (pos - 1) % self.mrrs + 1
        };
        first + next - 1
    }
}

/// Checks that the nodes of each TOR are contiguous (the switch paper's constraint (4)).
///
/// # Errors
/// A TOR whose nodes are interrupted by another TOR's.
pub fn check_tors(tor_of: &[usize]) -> Result<(), LayoutError> {
    let mut seen = std::collections::HashSet::new();
    for (node, &tor) in tor_of.iter().enumerate() {
        if node > 0 && tor_of[node - 1] != tor && !seen.insert(tor) {
            return Err(LayoutError::TorNotContiguous { tor, node });
        }
        if node == 0 {
            seen.insert(tor);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paper's Fig. 8: N = 2 sockets, S = 9 nodes, P = 4 ranks per socket, three nodes
    /// per TOR.
    fn fig8() -> (RolePlan, Vec<usize>) {
        let layout = Layout::new(72, 8, 2).unwrap();
        let plan = RolePlan::new(layout, Grouping::Socket).unwrap();
        (plan, vec![0, 0, 0, 1, 1, 1, 2, 2, 2])
    }

    #[test]
    fn fig8_roles_match_the_paper() {
        let (p, _) = fig8();
        let rank = |i: usize| p.leader_rank(i);
        let mrrs: Vec<usize> = (0..p.leaders())
            .filter(|&i| p.is_mrr(i))
            .map(rank)
            .collect();
        assert_eq!(mrrs, [0, 4], "formula (1)");
        let nmrrs: Vec<usize> = (0..p.leaders())
            .filter(|&i| !p.is_mrr(i))
            .map(rank)
            .collect();
        assert_eq!(
            nmrrs,
            (8..=68).step_by(4).collect::<Vec<_>>(),
            "formula (2)"
        );
        assert_eq!(p.leaders(), 18);
    }

    #[test]
    fn fig8_query_and_notify_groups_match_the_paper() {
        let (p, _) = fig8();
        let group = |mrr: usize| -> Vec<usize> {
            (p.mrrs..p.leaders())
                .filter(|&i| p.query_target(i) == mrr)
                .map(|i| p.leader_rank(i))
                .collect()
        };
        assert_eq!(group(0), [8, 16, 24, 32, 40, 48, 56, 64], "formula (3)");
        assert_eq!(group(1), [12, 20, 28, 36, 44, 52, 60, 68], "formula (3)");
        for mrr in 0..p.mrrs {
            let told: Vec<usize> = p
                .notify_targets(mrr)
                .into_iter()
                .map(|i| p.leader_rank(i))
                .collect();
            assert_eq!(
                told,
                group(mrr),
                "formula (4) answers exactly (3)'s queriers"
            );
        }
        assert_eq!(
            p.told_by(0)[8..],
            [1],
            "the first MRR also answers the other MRR"
        );
        assert_eq!(p.told_by(1), p.notify_targets(1));
    }

    #[test]
    fn fig8_rings_under_tor1_match_the_paper() {
        let (p, tors) = fig8();
        let succ = |rank: usize| p.leader_rank(p.ring_successor(p.leader_of(rank), &tors));
        // {0, 8, 16} and {4, 12, 20}, each closed.
        assert_eq!([succ(0), succ(8), succ(16)], [8, 16, 0]);
        assert_eq!([succ(4), succ(12), succ(20)], [12, 20, 4]);
        // The same under the third TOR: {48, 56, 64} and {52, 60, 68}.
        assert_eq!([succ(48), succ(56), succ(64)], [56, 64, 48]);
        assert_eq!([succ(52), succ(60), succ(68)], [60, 68, 52]);
    }

    #[test]
    fn every_ring_is_a_permutation_within_its_tor() {
        for (size, per_node, sockets, tors) in [
            (16, 4, 1, vec![0, 0, 1, 1]),
            (36, 4, 2, vec![0, 0, 0, 1, 1, 1, 2, 2, 2]),
            (64, 4, 2, vec![0; 16]),
            (8, 2, 2, vec![0, 1, 1, 1]),
        ] {
            let layout = Layout::new(size, per_node, sockets).unwrap();
            for g in [Grouping::Node, Grouping::Socket] {
                let Ok(p) = RolePlan::new(layout, g) else {
                    continue;
                };
                let succ: Vec<usize> = (0..p.leaders())
                    .map(|i| p.ring_successor(i, &tors))
                    .collect();
                let mut sorted = succ.clone();
                sorted.sort_unstable();
                assert_eq!(
                    sorted,
                    (0..p.leaders()).collect::<Vec<_>>(),
                    "{g:?} {tors:?}"
                );
                for (i, &s) in succ.iter().enumerate() {
                    assert_eq!(
                        tors[p.node_of(i).0],
                        tors[p.node_of(s).0],
                        "stays under its TOR"
                    );
                    assert_eq!(p.node_of(i).1, p.node_of(s).1, "stays on its socket number");
                }
            }
        }
    }

    #[test]
    fn node_mode_is_one_leader_per_node() {
        let p = RolePlan::new(Layout::new(16, 4, 2).unwrap(), Grouping::Node).unwrap();
        assert_eq!(p.leaders(), 4);
        assert_eq!((p.leader_of(13), p.leader_rank(3)), (3, 12));
        assert_eq!(p.members(1), 4..8);
        assert!(p.is_mrr(0) && !p.is_mrr(1));
        assert!((1..4).all(|i| p.query_target(i) == 0));
        assert_eq!(p.notify_targets(0), [1, 2, 3]);
        assert_eq!(p.told_by(0), [1, 2, 3]);
        assert_eq!(p.ring_successor(3, &[0, 0, 0, 0]), 0);
    }

    #[test]
    fn bad_layouts_are_named() {
        assert_eq!(
            Layout::new(10, 4, 1),
            Err(LayoutError::Uneven {
                size: 10,
                per_node: 4
            })
        );
        assert_eq!(Layout::new(8, 0, 1), Err(LayoutError::Zero));
        let l = Layout::new(12, 3, 2).unwrap();
        assert_eq!(
            RolePlan::new(l, Grouping::Socket),
            Err(LayoutError::UnevenSockets {
                per_node: 3,
                sockets: 2
            })
        );
        assert_eq!(
            RolePlan::new(Layout::new(8, 4, 1).unwrap(), Grouping::Socket),
            Err(LayoutError::OneSocket(1))
        );
        assert_eq!(
            check_tors(&[0, 1, 0]),
            Err(LayoutError::TorNotContiguous { tor: 0, node: 2 })
        );
        assert_eq!(check_tors(&[0, 0, 1, 1, 2]), Ok(()));
        assert!(
            LayoutError::TooFewNics {
                node: 1,
                nics: 1,
                sockets: 2
            }
            .to_string()
            .contains("one per socket")
        );
    }
}
