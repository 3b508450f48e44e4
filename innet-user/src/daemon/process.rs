//! What a switch does to a control packet on its way through: a query collects this
//! switch's capabilities, address and free capacity; notify and kill pass on (group
//! installation from notify comes with the next step of the control plane).

use innet_common::{
    codec::Parsed,
    proto::{Dtype, MAX_PAYLOAD_BYTES, Op, PacketKind, QNH_HOPS_MASK, QNH_RESPONSE},
    validate::Verdict,
    wire::ControlPayload,
};

use super::DaemonOptions;
use crate::group::{GroupMaps, Role};

/// What this switch can aggregate, announced in queries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Bit `1 << op`.
    pub ops: u16,
    /// Bit `1 << dtype`.
    pub dtypes: u16,
    /// Largest payload per packet.
    pub max_data_size: u16,
}

impl Default for Capabilities {
    /// Every op on every integer type, full-MTU packets.
    fn default() -> Self {
        let ops = Op::ALL.iter().fold(0u16, |m, op| m | 1 << *op as u8);
        let dtypes = Dtype::ALL
            .iter()
            .filter(|d| !d.is_float())
            .fold(0u16, |m, d| m | 1 << *d as u8);
        Self {
            ops,
            dtypes,
            max_data_size: MAX_PAYLOAD_BYTES as u16,
        }
    }
}

/// The control payload to forward, or `None` to consume the packet here.
pub fn process(
    opts: &DaemonOptions,
    groups: &GroupMaps,
    p: &Parsed<'_>,
    from_uplink: bool,
) -> Option<ControlPayload> {
    let Verdict::Control(kind) = p.verdict else {
        return None;
    };
    let mut c = p.control()?;
    let hops = (c.query_notify_hop & QNH_HOPS_MASK)
        .saturating_add(1)
        .min(QNH_HOPS_MASK);
    c.query_notify_hop = (c.query_notify_hop & QNH_RESPONSE) | hops;
    if kind == PacketKind::Query && c.query_notify_hop & QNH_RESPONSE == 0 {
        let caps = opts.capabilities;
        c.set_sup_allreduce_op(c.sup_allreduce_op() & caps.ops);
        c.set_sup_data_type(c.sup_data_type() & caps.dtypes);
        c.set_sup_max_data_size(c.sup_max_data_size().min(caps.max_data_size));
        let own = u32::from(opts.ip);
        match opts.role {
            Role::Tor if from_uplink => c.set_tor2_ip(own),
            Role::Tor => c.set_tor1_ip(own),
            Role::Spine => {
                c.set_spine_ip(own);
                let used = groups.list().map_or(0, |g| g.len() as u32);
                c.set_ava_grp_num(groups.capacity().saturating_sub(used));
            }
        }
    }
    Some(c)
}
