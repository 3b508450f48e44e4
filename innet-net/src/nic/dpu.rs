//! A host's setup request to its DPU and the DPU's answer, as INC control payloads marked
//! [`MASTER_DPU_SETUP`]. The host has no channel into the DPU but its own network port: it
//! sends the request as an ordinary RoCEv2 control frame (to another member of the tree, so
//! that without a DPU daemon it simply goes unanswered), the DPU's program on the host's
//! port hands it to the DPU daemon, and the daemon answers with a frame from the DPU's own
//! address.
//!
//! The request carries what the DPU needs of the tree: the member's position, the tree's
//! size and branch degree, the parent's and the root's addresses (whose results the member
//! accepts). Children are known by position: their partials carry it in `src_rank`.

use std::net::Ipv4Addr;

use innet_common::{
    capabilities::Capabilities,
    proto::{COMM_TYPE_ALLREDUCE, MASTER_DPU_SETUP, QNH_RESPONSE},
    wire::ControlPayload,
};

use super::tree::{Tree, TreeError};

/// What a leader asks its DPU to install.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DpuRequest {
    /// The group's `true_comm_id` (its wire id is the low 24 bits).
    pub comm: u32,
    /// The leader's position in the tree.
    pub me: u32,
    pub tree: Tree,
    /// The parent's address (`None` at the root).
    pub parent: Option<Ipv4Addr>,
    /// The root's address: its multicast results are accepted like the parent's.
    pub root: Ipv4Addr,
}

impl DpuRequest {
    /// The request's control payload (a query), sent by rank `rank`.
    #[must_use]
    pub fn to_payload(&self, rank: u32) -> ControlPayload {
        let mut c = setup_payload(self.comm);
        c.set_world_rank(rank);
        c.set_dst_rank(self.me);
        c.set_global_group_size(self.tree.n as u16);
        c.set_local_group_size(self.tree.degree as u16);
        c.set_tor1_ip(self.parent.map_or(0, u32::from));
        c.set_spine_ip(u32::from(self.root));
        c
    }

    /// Reads a request.
    ///
    /// # Errors
    /// A tree that cannot be, or a member outside it.
    pub fn from_payload(c: &ControlPayload) -> Result<Self, TreeError> {
        let tree = Tree::new(
            usize::from(c.global_group_size()),
            usize::from(c.local_group_size()),
        )?;
        let me = c.dst_rank();
        tree.check_member(me as usize)?;
        let parent = (me > 0).then(|| Ipv4Addr::from(c.tor1_ip()));
        Ok(Self {
            comm: c.true_comm_id(),
            me,
            tree,
            parent,
            root: Ipv4Addr::from(c.spine_ip()),
        })
    }
}

/// A leader's release of its DPU member (a kill's payload).
#[must_use]
pub fn release(comm: u32) -> ControlPayload {
    setup_payload(comm)
}

/// The DPU's answer: what it offers the group, or why it cannot serve it.
#[must_use]
pub fn answer(comm: u32, offer: Result<Capabilities, u8>) -> ControlPayload {
    let mut c = setup_payload(comm);
    c.query_notify_hop = QNH_RESPONSE;
    match offer {
        Ok(caps) => {
            c.set_sup_allreduce_op(caps.ops);
            c.set_sup_data_type(caps.dtypes);
            c.set_sup_max_data_size(caps.max_data_size);
            c.set_sup_window(caps.window);
        }
        Err(fail_cause) => c.fail_cause = fail_cause,
    }
    c
}

/// Reads an answer to group `comm`: the DPU's offer, or its `fail_cause`. `None`: not an
/// answer of a DPU to this group.
#[must_use]
pub fn read_answer(c: &ControlPayload, comm: u32) -> Option<Result<Capabilities, u8>> {
    if c.master_num != MASTER_DPU_SETUP
        || c.query_notify_hop & QNH_RESPONSE == 0
        || c.true_comm_id() != comm
    {
        return None;
    }
    Some(if c.fail_cause == 0 {
        Ok(Capabilities {
            ops: c.sup_allreduce_op(),
            dtypes: c.sup_data_type(),
            max_data_size: c.sup_max_data_size(),
            window: c.sup_window(),
        })
    } else {
        Err(c.fail_cause)
    })
}

fn setup_payload(comm: u32) -> ControlPayload {
    let mut c = ControlPayload {
        master_num: MASTER_DPU_SETUP,
        sup_comm_type: COMM_TYPE_ALLREDUCE,
        ..ControlPayload::default()
    };
    c.set_true_comm_id(comm);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reads_back_as_sent() {
        let req = DpuRequest {
            comm: 0x1234_5601,
            me: 5,
            tree: Tree::new(16, 4).expect("tree"),
            parent: Some(Ipv4Addr::new(10, 77, 0, 2)),
            root: Ipv4Addr::new(10, 77, 0, 1),
        };
        let c = req.to_payload(20);
        assert_eq!(c.master_num, MASTER_DPU_SETUP);
        assert_eq!(c.world_rank(), 20);
        assert_eq!(DpuRequest::from_payload(&c), Ok(req));
        let root = DpuRequest {
            me: 0,
            parent: None,
            ..req
        };
        assert_eq!(DpuRequest::from_payload(&root.to_payload(0)), Ok(root));
    }

    #[test]
    fn a_request_outside_its_tree_is_refused() {
        let mut c = DpuRequest {
            comm: 7,
            me: 0,
            tree: Tree::new(4, 2).expect("tree"),
            parent: None,
            root: Ipv4Addr::new(10, 77, 0, 1),
        }
        .to_payload(0);
        c.set_dst_rank(4);
        assert_eq!(
            DpuRequest::from_payload(&c),
            Err(TreeError::NotAMember { me: 4, n: 4 })
        );
        c.set_dst_rank(1);
        c.set_local_group_size(0);
        assert_eq!(DpuRequest::from_payload(&c), Err(TreeError::Degree(0)));
    }

    #[test]
    fn answers_carry_an_offer_or_a_cause_and_only_for_their_group() {
        let caps = Capabilities {
            ops: 0x0fff,
            dtypes: 0x00ff,
            max_data_size: 1408,
            window: 32,
        };
        let ok = answer(9, Ok(caps));
        assert_eq!(read_answer(&ok, 9), Some(Ok(caps)));
        assert_eq!(read_answer(&ok, 10), None, "another group's answer");
        let full = answer(9, Err(1));
        assert_eq!(read_answer(&full, 9), Some(Err(1)));
        // A request (no response bit) or a NIC-mode notify is no answer.
        assert_eq!(read_answer(&release(9), 9), None);
        let mut nic = ok;
        nic.master_num = innet_common::proto::MASTER_NIC_MODE;
        assert_eq!(read_answer(&nic, 9), None);
    }
}
