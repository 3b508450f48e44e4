//! The placement the interposer finds by itself, with no file, at `MPI_Init`:
//! 1. the node of each rank: the ranks whose MPI processor name (`MPI_Get_processor_name`,
//!    the host name) is the same share a node ([`node_key`], gathered by the shim); the
//!    node's lowest rank speaks for it ([`leader_of`]). This needs no communicator of its
//!    own (`MPI_Comm_split_type` would make and free one at `MPI_Init`), and the host name
//!    is what matters: a node's ranks meet in its shared memory;
//! 2. the node's INC address ([`node_address`]): the interface `INNET_MPI_IFACE` names;
//!    else the only non-loopback interface that is up with an IPv4 address; else the one
//!    the default route leaves by;
//! 3. the node's TOR: the switch itself says, answering a probe the node sends towards
//!    another node ([`innet_client::bootstrap::tor_of`]).
//!
//! The shim gathers one [`Record`] per world rank (`MPI_Allgather`) and [`placement`]
//! turns them into the nodes, TOR by TOR: the way `innet_client::Communicator::bootstrap`
//! goes over a launcher's allgather, here driven from C.

use std::{collections::BTreeMap, net::Ipv4Addr};

use innet_client::bootstrap::address::{self, AddressError};
pub use innet_client::bootstrap::{
    address::{Candidate, candidates, default_route_source},
    node_key,
};

use crate::config::{NodeEntry, Placement, Settings};

/// Names the interface whose IPv4 address is the node's INC address.
pub const IFACE_VAR: &str = "INNET_MPI_IFACE";

/// What each rank tells the others (the shim's `struct innet_mpi_record`; addresses as
/// `u32::from(Ipv4Addr)`, 0 for none).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// The world rank that speaks for the rank's node (its first rank there).
    pub node: u32,
    /// The node's INC address.
    pub ip: u32,
    /// The node's TOR, as the TOR answered its probe.
    pub tor: u32,
}

/// The lowest rank whose key is `keys[rank]`: the rank that speaks for `rank`'s node.
#[must_use]
pub fn leader_of(rank: usize, keys: &[u64]) -> usize {
    keys.iter()
        .position(|k| Some(k) == keys.get(rank))
        .unwrap_or(rank)
}

/// The node's INC address by the rule of this module's head; `Err` says what to set.
pub fn node_address() -> Result<Ipv4Addr, String> {
    choose_address(
        std::env::var(IFACE_VAR).ok().as_deref(),
        &candidates(),
        default_route_source(),
    )
}

/// [`node_address`]'s rule over what the host has (innet-client's, its advice naming
/// [`IFACE_VAR`]).
pub fn choose_address(
    iface: Option<&str>,
    candidates: &[Candidate],
    default_source: Option<Ipv4Addr>,
) -> Result<Ipv4Addr, String> {
    address::choose_address(iface, candidates, default_source).map_err(|e| match e {
        AddressError::NoSuchInterface(name) => {
            format!("{IFACE_VAR}={name}: that interface is not up with an IPv4 address here")
        }
        AddressError::NoInterface => {
            format!("{e}: bring the fabric's up, or name it with {IFACE_VAR}")
        }
        e => format!("{e}: name the fabric's with {IFACE_VAR}"),
    })
}

/// Another node's address to probe towards (any will do: the TOR answers first).
#[must_use]
pub fn probe_peer(records: &[Record], own: Ipv4Addr) -> Option<Ipv4Addr> {
    records
        .iter()
        .map(|r| Ipv4Addr::from(r.ip))
        .find(|ip| *ip != own && !ip.is_unspecified())
}

/// Why the discovered placement cannot serve the job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscoverError {
    #[error("node of world rank {node} found no INC address (see the log of that rank)")]
    NoAddress { node: u32 },
    #[error(
        "nodes of world ranks {with_tor:?} hang off innet TORs, but no innet TOR answered the probe of node {without} (is `innet daemon` running on its TOR?)"
    )]
    SomeTorsSilent { with_tor: Vec<u32>, without: u32 },
    #[error("nodes of world ranks {0} and {1} report the same INC address {2}")]
    SameAddress(u32, u32, Ipv4Addr),
}

/// The placement the records describe: nodes ordered TOR by TOR (by the TOR's address,
/// then the node's first rank), TORs numbered in that order. Nodes no TOR answered for sit
/// under one TOR when none answered (the handshake then finds no innet switch and innet
/// runs the collectives on the hosts); some answering and some not cannot be served.
pub fn placement(settings: Settings, records: &[Record]) -> Result<Placement, DiscoverError> {
    let mut nodes: BTreeMap<u32, Record> = BTreeMap::new();
    for r in records {
        nodes.entry(r.node).or_insert(*r);
    }
    if let Some(r) = nodes.values().find(|r| r.ip == 0) {
        return Err(DiscoverError::NoAddress { node: r.node });
    }
    let mut by_ip: BTreeMap<u32, u32> = BTreeMap::new();
    for r in nodes.values() {
        if let Some(other) = by_ip.insert(r.ip, r.node) {
            return Err(DiscoverError::SameAddress(
                other,
                r.node,
                Ipv4Addr::from(r.ip),
            ));
        }
    }
    let silent: Vec<u32> = nodes
        .values()
        .filter(|r| r.tor == 0)
        .map(|r| r.node)
        .collect();
    if !silent.is_empty() && silent.len() < nodes.len() {
        return Err(DiscoverError::SomeTorsSilent {
            with_tor: nodes
                .values()
                .filter(|r| r.tor != 0)
                .map(|r| r.node)
                .collect(),
            without: silent[0],
        });
    }
    let mut ordered: Vec<Record> = nodes.into_values().collect();
    ordered.sort_by_key(|r| (r.tor, r.node));
    let mut tors: Vec<u32> = ordered.iter().map(|r| r.tor).collect();
    tors.dedup();
    let entries = ordered
        .iter()
        .map(|r| NodeEntry {
            tor: tors.iter().position(|t| *t == r.tor).unwrap_or(0),
            nics: vec![Ipv4Addr::from(r.ip)],
            netns: None,
        })
        .collect();
    // Each rank's node by a map, not a search per rank: a job has thousands of ranks.
    let position: BTreeMap<u32, usize> = ordered
        .iter()
        .enumerate()
        .map(|(i, n)| (n.node, i))
        .collect();
    let node_of_rank = records
        .iter()
        .map(|r| position.get(&r.node).copied().unwrap_or(0))
        .collect();
    Ok(Placement {
        settings,
        sockets_per_node: 1,
        nodes: entries,
        node_of_rank,
        discovered: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> u32 {
        u32::from(s.parse::<Ipv4Addr>().unwrap())
    }

    fn cand(ifname: &str, a: &str) -> Candidate {
        Candidate {
            ifname: ifname.into(),
            ip: a.parse().unwrap(),
        }
    }

    #[test]
    fn ranks_with_one_processor_name_share_a_node() {
        let keys: Vec<u64> = ["n1", "n0", "n1", "n2", "n0"]
            .iter()
            .map(|n| node_key(n.as_bytes()))
            .collect();
        assert_ne!(keys[0], keys[1]);
        assert_eq!(
            (0..5).map(|r| leader_of(r, &keys)).collect::<Vec<_>>(),
            [0, 1, 0, 3, 1]
        );
        assert_eq!(leader_of(9, &keys), 9, "outside: its own");
    }

    #[test]
    fn the_address_rule() {
        let one = [cand("eth0", "10.77.0.1")];
        assert_eq!(
            choose_address(None, &one, None),
            Ok("10.77.0.1".parse().unwrap())
        );
        let two = [cand("mgmt0", "192.168.1.5"), cand("fab0", "10.77.0.1")];
        assert_eq!(
            choose_address(Some("fab0"), &two, None),
            Ok("10.77.0.1".parse().unwrap())
        );
        assert_eq!(
            choose_address(None, &two, Some("192.168.1.5".parse().unwrap())),
            Ok("192.168.1.5".parse().unwrap())
        );
        let e = choose_address(None, &two, None).unwrap_err();
        assert!(e.contains(IFACE_VAR) && e.contains("fab0 10.77.0.1"), "{e}");
        assert!(
            choose_address(Some("ib0"), &two, None)
                .unwrap_err()
                .contains("ib0")
        );
        assert!(
            choose_address(None, &[], None)
                .unwrap_err()
                .contains(IFACE_VAR)
        );
    }

    /// Round-robin over three nodes under two TORs, the TOR of the first rank's node the
    /// higher address: nodes come out TOR by TOR.
    #[test]
    fn records_become_nodes_tor_by_tor() {
        let (a, b, c) = (ip("10.77.0.1"), ip("10.77.1.1"), ip("10.77.0.2"));
        let (t0, t1) = (ip("10.77.255.1"), ip("10.77.255.2"));
        let node = |n: u32, i: u32, t: u32| Record {
            node: n,
            ip: i,
            tor: t,
        };
        let records = [
            node(0, b, t1),
            node(1, a, t0),
            node(2, c, t0),
            node(0, b, t1),
            node(1, a, t0),
            node(2, c, t0),
        ];
        let p = placement(Settings::default(), &records).expect("served");
        let ips: Vec<u32> = p.nodes.iter().map(|n| u32::from(n.nics[0])).collect();
        assert_eq!(ips, [a, c, b]);
        assert_eq!(p.nodes.iter().map(|n| n.tor).collect::<Vec<_>>(), [0, 0, 1]);
        assert_eq!(p.node_of_rank, [2, 0, 1, 2, 0, 1]);
        assert!(p.discovered);
        let c = p.layout_of(&[0, 1, 2, 3, 4, 5]).expect("even");
        assert_eq!(c.layout.ranks_per_node, 2);
        assert_eq!(c.order, [1, 4, 2, 5, 0, 3]);
    }

    #[test]
    fn what_cannot_be_served_says_why() {
        let r = |n: u32, i: &str, t: u32| Record {
            node: n,
            ip: ip(i),
            tor: t,
        };
        let silent_one = [r(0, "10.0.0.1", 7), r(1, "10.0.0.2", 0)];
        let e = placement(Settings::default(), &silent_one).unwrap_err();
        assert!(e.to_string().contains("innet daemon"), "{e}");
        let none = [r(0, "10.0.0.1", 0), r(1, "10.0.0.2", 0)];
        let p = placement(Settings::default(), &none).expect("one pseudo-TOR");
        assert!(p.nodes.iter().all(|n| n.tor == 0));
        let no_ip = [r(0, "0.0.0.0", 1)];
        assert!(matches!(
            placement(Settings::default(), &no_ip),
            Err(DiscoverError::NoAddress { node: 0 })
        ));
        let same = [r(0, "10.0.0.1", 1), r(1, "10.0.0.1", 1)];
        assert!(placement(Settings::default(), &same).is_err());
        assert_eq!(
            probe_peer(&none, "10.0.0.1".parse().unwrap()),
            Some("10.0.0.2".parse().unwrap())
        );
    }
}
