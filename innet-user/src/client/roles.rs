//! Node-mode roles of seed 000 (Table 3): the lowest rank of each node is its SRR (the
//! node's leader, the only rank that talks to the network); the other ranks are SRs; the
//! lowest SRR is the MRR (it creates and kills the group); the other SRRs are NMRRs.

/// Why a rank layout cannot run in Node mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error(
        "{size} ranks do not split into nodes of {per_node} ranks: Node mode needs the same number of ranks on every node"
    )]
    Uneven { size: usize, per_node: usize },
    #[error("rank {rank} is outside a communicator of {size} ranks")]
    RankOutOfRange { rank: usize, size: usize },
    #[error("ranks per node must be at least 1")]
    NoRanksPerNode,
}

/// One rank's roles in Node mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeRoles {
    pub node: usize,
    /// The rank that leads this rank's node.
    pub srr: usize,
    pub is_srr: bool,
    pub is_mrr: bool,
    /// Number of nodes (SRRs), the group's size on the network.
    pub nodes: usize,
}

/// Roles of `rank` in a communicator of `size` ranks, `per_node` contiguous ranks per node.
///
/// # Errors
/// Uneven nodes, a rank out of range, or zero ranks per node.
pub fn node_roles(rank: usize, size: usize, per_node: usize) -> Result<NodeRoles, LayoutError> {
    if per_node == 0 {
        return Err(LayoutError::NoRanksPerNode);
    }
    if !size.is_multiple_of(per_node) {
        return Err(LayoutError::Uneven { size, per_node });
    }
    if rank >= size {
        return Err(LayoutError::RankOutOfRange { rank, size });
    }
    let node = rank / per_node;
    let srr = node * per_node;
    Ok(NodeRoles {
        node,
        srr,
        is_srr: rank == srr,
        is_mrr: rank == 0,
        nodes: size / per_node,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaders_are_the_lowest_rank_of_each_node() {
        let r = node_roles(13, 16, 4).unwrap();
        assert_eq!(
            (r.node, r.srr, r.is_srr, r.is_mrr, r.nodes),
            (3, 12, false, false, 4)
        );
        let r = node_roles(12, 16, 4).unwrap();
        assert!(r.is_srr && !r.is_mrr);
        let r = node_roles(0, 16, 4).unwrap();
        assert!(r.is_srr && r.is_mrr);
    }

    #[test]
    fn bad_layouts_are_named() {
        assert_eq!(
            node_roles(0, 10, 4),
            Err(LayoutError::Uneven {
                size: 10,
                per_node: 4
            })
        );
        assert_eq!(
            node_roles(8, 8, 4),
            Err(LayoutError::RankOutOfRange { rank: 8, size: 8 })
        );
        assert_eq!(node_roles(0, 8, 0), Err(LayoutError::NoRanksPerNode));
    }
}
