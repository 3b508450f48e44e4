//! The switch's data path for a valid INC data packet: find the group, check membership,
//! fill the job and jump to the aggregation program of the packet's op × type.

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use innet_common::{
    group::{MAX_CHILDREN, WINDOW, jump_agg},
    proto::{Dtype, Op, element_bytes},
    stats::PortStats,
    wire::{ETH_LEN, IncHeader, PAYLOAD_OFFSET},
};

use crate::{
    maps::{GROUPS, JOB, JUMP, group_count},
    parse::ptr_at,
};

const INC_OFFSET: usize = PAYLOAD_OFFSET - core::mem::size_of::<IncHeader>();
const IP_SRC_OFFSET: usize = ETH_LEN + 12;

/// `None`: not for this switch, pass it on. `Some(verdict)`: the packet was handled here
/// (the tail call does not return when it succeeds).
#[inline(always)]
pub fn handle(ctx: &XdpContext, port: &mut PortStats) -> Option<u32> {
    // Aggregation reads headers at fixed offsets: IPv4 options are passed on untouched.
    let vihl = ptr_at::<u8>(ctx, ETH_LEN)?;
    // SAFETY: bounds checked by ptr_at.
    if unsafe { *vihl } != 0x45 {
        return None;
    }
    let hdr = ptr_at::<IncHeader>(ctx, INC_OFFSET)?;
    // SAFETY: bounds checked by ptr_at.
    let hdr = unsafe { &*hdr };
    // SAFETY: userspace-written config; read only.
    let Some(cfg) = (unsafe { GROUPS.get(hdr.group()) }) else {
        port.inc_unknown_group += 1;
        return None;
    };
    group_count(cfg.index, |g| g.rx += 1);
    let src = ptr_at::<[u8; 4]>(ctx, IP_SRC_OFFSET)?;
    // SAFETY: bounds checked by ptr_at.
    let src = unsafe { *src };
    let ingress = ctx.ingress_ifindex() as u32;
    let from_parent = cfg.is_root == 0 && ingress == cfg.parent_ifindex;
    let mut child = MAX_CHILDREN as u32;
    if from_parent {
        if src != cfg.parent_ip {
            child = u32::MAX;
        }
    } else {
        let mut i = 0;
        while i < MAX_CHILDREN {
            if i < usize::from(cfg.n_children)
                && cfg.children[i].ip == src
                && cfg.children[i].ifindex == ingress
            {
                child = i as u32;
                break;
            }
            i += 1;
        }
    }
    if child == u32::MAX || (!from_parent && child == MAX_CHILDREN as u32) {
        group_count(cfg.index, |g| g.not_member += 1);
        return Some(xdp_action::XDP_DROP);
    }
    let (Some(op), Some(dtype)) = (Op::from_u8(hdr.op_code), Dtype::from_u8(hdr.oper_and_type))
    else {
        return Some(xdp_action::XDP_DROP);
    };
    let job = JOB.get_ptr_mut(0)?;
    // SAFETY: this CPU's scratch.
    let job = unsafe { &mut *job };
    job.group = hdr.group();
    job.slot = cfg.index * WINDOW + u32::from(hdr.req_id) % WINDOW;
    job.child = child;
    job.from_parent = u32::from(from_parent);
    job.action = 0;
    job.exclude_ingress = 0;
    job.payload_len = u32::from(hdr.pkt_para_num()) * element_bytes(op, dtype) as u32;
    // SAFETY: tail call with this program's own context.
    unsafe { JUMP.tail_call(ctx, jump_agg(op as u8, dtype as u8)) };
    // No aggregation program for this op × type (floats until issue 9).
    group_count(cfg.index, |g| g.unsupported += 1);
    Some(xdp_action::XDP_DROP)
}
