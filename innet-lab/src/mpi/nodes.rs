//! The multi-node launch's placement: which emulated nodes a job uses, how many slots
//! each has and how ranks are mapped onto them, and the files the launchers read (a
//! hostfile, and the `/etc/hosts` that makes the node names resolve).
//!
//! A node's hostname is its namespace's name (`innet-test-<id>-h<tor>-<n>`): unique, a
//! valid hostname, and the agent (`innet-node-agent`) finds the namespace from it.

use std::{fmt::Write as _, net::Ipv4Addr, path::PathBuf};

use crate::topology::Topology;

/// How ranks are mapped onto the nodes' slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapBy {
    /// Fill a node's slots before the next (block: ranks 0..k-1 on node 0), OpenMPI's
    /// default.
    Slot,
    /// One rank per node in turn (round-robin: rank r on node r mod n).
    Node,
}

impl MapBy {
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Slot => "slot",
            Self::Node => "node",
        }
    }
}

/// The nodes of a multi-node job.
pub struct Nodes {
    /// Each node's hostname (its namespace's name) and fabric address, in node order.
    hosts: Vec<(String, Ipv4Addr)>,
    /// Ranks each node can take.
    slots: Vec<usize>,
    pub map_by: MapBy,
    /// The hostfiles, removed on drop.
    dir: PathBuf,
}

impl Nodes {
    /// Every node of `topo` with `ppn` slots, ranks by slot.
    #[must_use]
    pub fn even(topo: &Topology, ppn: usize) -> Self {
        let n = topo.hosts.iter().filter(|h| h.socket == 0).count();
        Self::uneven(topo, &vec![ppn; n])
    }

    /// The first `slots.len()` nodes of `topo`, node k with `slots[k]` slots (for
    /// example 3 + 4 + 4), ranks by slot.
    ///
    /// # Panics
    /// More nodes than `topo` has, or a node without slots.
    #[must_use]
    pub fn uneven(topo: &Topology, slots: &[usize]) -> Self {
        let hosts: Vec<(String, Ipv4Addr)> = topo
            .hosts
            .iter()
            .filter(|h| h.socket == 0)
            .map(|h| (h.ns.name.clone(), h.ip))
            .take(slots.len())
            .collect();
        assert_eq!(
            hosts.len(),
            slots.len(),
            "the fabric has fewer nodes than {slots:?}"
        );
        assert!(
            slots.iter().all(|&s| s > 0),
            "a node without slots: {slots:?}"
        );
        let dir = std::env::temp_dir().join(format!("innet-mpi-nodes-{}", crate::unique_id()));
        std::fs::create_dir_all(&dir).expect("the hostfiles' directory");
        let nodes = Self {
            hosts,
            slots: slots.to_vec(),
            map_by: MapBy::Slot,
            dir,
        };
        nodes.write_files();
        nodes
    }

    /// Ranks round-robin over the nodes (`--map-by node`).
    #[must_use]
    pub fn by_node(mut self) -> Self {
        self.map_by = MapBy::Node;
        self.write_files();
        self
    }

    /// Slots of all nodes: the largest job.
    #[must_use]
    pub fn slots(&self) -> usize {
        self.slots.iter().sum()
    }

    /// The hostname of `node`.
    #[must_use]
    pub fn hostname(&self, node: usize) -> &str {
        &self.hosts[node].0
    }

    /// The node rank `rank` runs on, as the launchers map it.
    ///
    /// # Panics
    /// `rank` beyond the slots.
    #[must_use]
    pub fn node_of(&self, rank: usize) -> usize {
        assert!(rank < self.slots(), "rank {rank} of {} slots", self.slots());
        order(&self.slots, self.map_by)[rank]
    }

    /// OpenMPI's hostfile: `HOST slots=N` per node.
    #[must_use]
    pub fn hostfile(&self) -> PathBuf {
        self.dir.join("hostfile")
    }

    /// MPICH's machinefile: `HOST:N` per node; mapped by node, every node with one slot
    /// (hydra wraps around the list, which is round-robin).
    #[must_use]
    pub fn machinefile(&self) -> PathBuf {
        self.dir.join("machinefile")
    }

    /// The nodes' names and addresses, for the launcher's `/etc/hosts`.
    #[must_use]
    pub fn hosts_file(&self) -> PathBuf {
        self.dir.join("hosts")
    }

    fn write_files(&self) {
        let (mut hostfile, mut machinefile) = (String::new(), String::new());
        let mut hosts = String::from("127.0.0.1 localhost\n");
        for ((name, ip), slots) in self.hosts.iter().zip(&self.slots) {
            let _ = writeln!(hostfile, "{name} slots={slots}");
            let per_turn = if self.map_by == MapBy::Node {
                1
            } else {
                *slots
            };
            let _ = writeln!(machinefile, "{name}:{per_turn}");
            let _ = writeln!(hosts, "{ip} {name}");
        }
        for (file, text) in [
            (self.hostfile(), hostfile),
            (self.machinefile(), machinefile),
            (self.hosts_file(), hosts),
        ] {
            std::fs::write(&file, text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        }
    }
}

/// The node of each rank, in rank order, when every slot of `slots` is taken.
fn order(slots: &[usize], map_by: MapBy) -> Vec<usize> {
    match map_by {
        MapBy::Slot => (0..slots.len())
            .flat_map(|k| std::iter::repeat_n(k, slots[k]))
            .collect(),
        // Passes over the nodes, each giving one rank to every node with a slot left.
        MapBy::Node => (0..slots.iter().copied().max().unwrap_or(0))
            .flat_map(|pass| (0..slots.len()).filter(move |&k| pass < slots[k]))
            .collect(),
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::{MapBy, order};

    #[test]
    fn maps_ranks_by_slot_and_by_node() {
        assert_eq!(
            order(&[3, 4, 4], MapBy::Slot),
            [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
        );
        assert_eq!(order(&[2, 2], MapBy::Node), [0, 1, 0, 1]);
        // A full node drops out of the later passes.
        assert_eq!(order(&[1, 3, 2], MapBy::Node), [0, 1, 2, 1, 2, 1]);
    }
}
