//! The placement every rank's gathered record describes: pure, so every rank finds the
//! same one (or the same error).

use std::{collections::BTreeMap, error::Error as StdError, net::Ipv4Addr};

use crate::NodePlacement;

/// What a rank tells the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Member {
    /// Its node's key ([`node_key`](super::node_key)).
    pub node: u64,
    /// Its node's INC address (0: none found).
    pub ip: u32,
    /// Its node's TOR, as the TOR answered the node's probe (0: none answered).
    pub tor: u32,
}

impl Member {
    /// The first allgather's bytes: the node and its address.
    pub fn first_round(&self) -> [u8; 12] {
        let mut b = [0u8; 12];
        b[..8].copy_from_slice(&self.node.to_le_bytes());
        b[8..].copy_from_slice(&self.ip.to_le_bytes());
        b
    }

    pub fn from_first(b: &[u8]) -> Option<Self> {
        let b: &[u8; 12] = b.try_into().ok()?;
        Some(Self {
            node: u64::from_le_bytes(b[..8].try_into().ok()?),
            ip: u32::from_le_bytes(b[8..].try_into().ok()?),
            tor: 0,
        })
    }
}

/// Why the launcher's ranks cannot make a communicator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    #[error("the launcher's allgather failed: {0}")]
    Gather(#[source] Box<dyn StdError + Send + Sync>),
    #[error("the launcher's allgather returned {got} buffers for {size} ranks")]
    Count { got: usize, size: usize },
    #[error("rank {rank}'s record is malformed: do all ranks run the same innet?")]
    Malformed { rank: usize },
    #[error(
        "the node of rank {rank} found no INC address (see its log; `Discovery::iface` or `address` names it)"
    )]
    NoAddress { rank: usize },
    #[error("the nodes of ranks {0} and {1} report the same INC address {2}")]
    SameAddress(usize, usize, Ipv4Addr),
    #[error(
        "the nodes of ranks {with_tor:?} hang off innet TORs, but no innet TOR answered the probe of the node of rank {without} (is `innet daemon` running on its TOR?)"
    )]
    SomeTorsSilent {
        with_tor: Vec<usize>,
        without: usize,
    },
    #[error(
        "the ranks sit unevenly on the nodes ({counts:?} per node): innet needs as many on each"
    )]
    Uneven { counts: Vec<usize> },
}

/// The nodes the launcher's ranks sit on, TOR by TOR, and each rank's node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nodes {
    pub nodes: Vec<NodePlacement>,
    /// Launcher rank → its node's index in `nodes`.
    pub node_of: Vec<usize>,
}

/// Nodes are ordered by their TOR's address, then their first rank, TORs numbered in that
/// order. Nodes no TOR answered for sit under one TOR when none answered (the handshake
/// then finds no innet switch and the collectives run on the hosts); some answering and
/// some not cannot be served. One node needs no address: its ranks never use the network.
pub(super) fn nodes_of(members: &[Member]) -> Result<Nodes, BootstrapError> {
    // Each node's first rank speaks for it.
    let mut first: BTreeMap<u64, usize> = BTreeMap::new();
    for (rank, m) in members.iter().enumerate() {
        first.entry(m.node).or_insert(rank);
    }
    let mut leaders: Vec<usize> = first.values().copied().collect();
    leaders.sort_unstable();
    let speaker = |rank: usize| &members[rank];
    if leaders.len() > 1 {
        if let Some(&r) = leaders.iter().find(|&&r| speaker(r).ip == 0) {
            return Err(BootstrapError::NoAddress { rank: r });
        }
        let mut by_ip: BTreeMap<u32, usize> = BTreeMap::new();
        for &r in &leaders {
            if let Some(other) = by_ip.insert(speaker(r).ip, r) {
                let ip = Ipv4Addr::from(speaker(r).ip);
                return Err(BootstrapError::SameAddress(other, r, ip));
            }
        }
        let (silent, heard): (Vec<usize>, Vec<usize>) =
            leaders.iter().partition(|&&r| speaker(r).tor == 0);
        if !silent.is_empty() && !heard.is_empty() {
            return Err(BootstrapError::SomeTorsSilent {
                with_tor: heard,
                without: silent[0],
            });
        }
    }
    leaders.sort_by_key(|&r| (speaker(r).tor, r));
    let mut tors: Vec<u32> = leaders.iter().map(|&r| speaker(r).tor).collect();
    tors.dedup();
    let nodes = leaders
        .iter()
        .map(|&r| {
            let m = speaker(r);
            let ip = if m.ip == 0 {
                Ipv4Addr::LOCALHOST
            } else {
                Ipv4Addr::from(m.ip)
            };
            let tor = tors.iter().position(|t| *t == m.tor).unwrap_or(0);
            NodePlacement::new(tor, vec![ip])
        })
        .collect();
    // Each rank's node by a map, not a search per rank: a job has thousands of ranks.
    let node_index: BTreeMap<u64, usize> = leaders
        .iter()
        .enumerate()
        .map(|(i, &r)| (speaker(r).node, i))
        .collect();
    let node_of = members.iter().map(|m| node_index[&m.node]).collect();
    Ok(Nodes { nodes, node_of })
}

/// Launcher rank → communicator rank: node by node, in launcher order within a node; the
/// nodes must hold as many ranks each.
pub(super) fn rank_order(nodes: &Nodes) -> Result<Vec<usize>, BootstrapError> {
    let mut counts = vec![0; nodes.nodes.len()];
    for &n in &nodes.node_of {
        counts[n] += 1;
    }
    if counts.iter().any(|&c| c != counts[0]) {
        return Err(BootstrapError::Uneven { counts });
    }
    let mut order: Vec<usize> = (0..nodes.node_of.len()).collect();
    order.sort_by_key(|&r| (nodes.node_of[r], r));
    let mut rank_of = vec![0; order.len()];
    for (comm_rank, &r) in order.iter().enumerate() {
        rank_of[r] = comm_rank;
    }
    Ok(rank_of)
}

/// [`nodes_of`] and [`rank_order`] together.
#[cfg(test)]
fn place(members: &[Member]) -> Result<(Nodes, Vec<usize>), BootstrapError> {
    let nodes = nodes_of(members)?;
    let rank_of = rank_order(&nodes)?;
    Ok((nodes, rank_of))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> u32 {
        u32::from(s.parse::<Ipv4Addr>().unwrap())
    }

    fn m(node: u64, addr: &str, tor: &str) -> Member {
        Member {
            node,
            ip: ip(addr),
            tor: ip(tor),
        }
    }

    /// Round-robin launcher ranks over three nodes under two TORs, the first rank's TOR
    /// the higher address: nodes come out TOR by TOR, ranks node by node.
    #[test]
    fn members_become_nodes_tor_by_tor() {
        let (a, b, c) = ("10.77.0.1", "10.77.1.1", "10.77.0.2");
        let (t0, t1) = ("10.77.255.1", "10.77.255.2");
        let members = [
            m(7, b, t1),
            m(5, a, t0),
            m(9, c, t0),
            m(7, b, t1),
            m(5, a, t0),
            m(9, c, t0),
        ];
        let (p, rank_of) = place(&members).expect("served");
        let ips: Vec<Ipv4Addr> = p.nodes.iter().map(|n| n.nics[0]).collect();
        assert_eq!(ips, [a, c, b].map(|s| s.parse::<Ipv4Addr>().unwrap()));
        assert_eq!(p.nodes.iter().map(|n| n.tor).collect::<Vec<_>>(), [0, 0, 1]);
        assert_eq!(rank_of, [4, 0, 2, 5, 1, 3]);
        assert_eq!(p.node_of, [2, 0, 1, 2, 0, 1]);
        assert_eq!(
            Member::from_first(&members[0].first_round()),
            Some(Member {
                tor: 0,
                ..members[0]
            })
        );
    }

    #[test]
    fn what_cannot_be_served_says_why() {
        let silent_one = [m(1, "10.0.0.1", "10.9.0.1"), m(2, "10.0.0.2", "0.0.0.0")];
        let e = place(&silent_one).unwrap_err();
        assert!(
            matches!(e, BootstrapError::SomeTorsSilent { without: 1, .. }),
            "{e}"
        );
        let none = [m(1, "10.0.0.1", "0.0.0.0"), m(2, "10.0.0.2", "0.0.0.0")];
        assert!(
            place(&none)
                .expect("one pseudo-TOR")
                .0
                .nodes
                .iter()
                .all(|n| n.tor == 0)
        );
        let no_ip = [m(1, "10.0.0.1", "0.0.0.0"), m(2, "0.0.0.0", "0.0.0.0")];
        assert!(matches!(
            place(&no_ip),
            Err(BootstrapError::NoAddress { rank: 1 })
        ));
        let same = [m(1, "10.0.0.1", "0.0.0.0"), m(2, "10.0.0.1", "0.0.0.0")];
        assert!(matches!(
            place(&same),
            Err(BootstrapError::SameAddress(0, 1, _))
        ));
        let uneven = [
            m(1, "10.0.0.1", "0.0.0.0"),
            m(2, "10.0.0.2", "0.0.0.0"),
            m(1, "10.0.0.1", "0.0.0.0"),
        ];
        let e = place(&uneven).unwrap_err();
        assert!(
            matches!(&e, BootstrapError::Uneven { counts } if counts == &[2, 1]),
            "{e}"
        );
    }

    #[test]
    fn one_node_needs_no_address() {
        let (p, rank_of) = place(&[m(3, "0.0.0.0", "0.0.0.0"); 4]).expect("one node");
        assert_eq!(p.nodes, [NodePlacement::new(0, vec![Ipv4Addr::LOCALHOST])]);
        assert_eq!(rank_of, [0, 1, 2, 3]);
    }
}
