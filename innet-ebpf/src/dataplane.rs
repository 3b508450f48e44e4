//! The data path of a valid INC data packet: find the group, check membership, fill the hand-off
//! and jump to the aggregation program of the packet's op × type. The switch role knows its
//! members by address and port; the NIC role by address, plus the host's own posts.

use aya_ebpf::{
    bindings::{BPF_F_BROADCAST, BPF_F_EXCLUDE_INGRESS, xdp_action},
    programs::XdpContext,
};
use innet_common::{
    group::{
        Child, GroupConfig, JUMP_AGG, JUMP_LOST, LOCAL_CHILD, MAX_CHILDREN, NOT_A_CHILD, ROLE_NIC,
        slot_of,
    },
    proto::{BTH_FLAG_LOST, BTH_FLAG_RESULT, Dtype, Op, element_bytes},
    stats::PortStats,
    wire::{ETH_LEN, IncHeader, PAYLOAD_OFFSET},
};

use crate::{
    lost,
    maps::{GROUPS, HANDOFF, JUMP, PORTS, bound_elsewhere, group_count},
    parse::ptr_at,
};

const INC_OFFSET: usize = PAYLOAD_OFFSET - core::mem::size_of::<IncHeader>();
const IP_SRC_OFFSET: usize = ETH_LEN + 12;
const IP_DST_OFFSET: usize = ETH_LEN + 16;

/// Who sent a packet, as far as its group is concerned.
enum Sender {
    Child(u32),
    Parent,
    Stranger,
}

/// The packet's INC header and its group, when the group is installed here for this
/// program's role (`nic`: a NIC group; otherwise a TOR or SPINE group); else `Err` with the
/// verdict (`None`: pass it on). The classifier let only the layout aggregation reads at
/// fixed offsets through as INC data.
#[inline(always)]
fn group_of<'a>(
    ctx: &XdpContext,
    port: &mut PortStats,
    nic: bool,
) -> Result<(&'a IncHeader, &'a GroupConfig), Option<u32>> {
    let hdr = ptr_at::<IncHeader>(ctx, INC_OFFSET).ok_or(None)?;
    // SAFETY: bounds checked by ptr_at; the packet outlives this program run.
    let hdr = unsafe { &*hdr };
    // SAFETY: userspace-written config; read only.
    let Some(cfg) = (unsafe { GROUPS.get(hdr.group()) }) else {
        port.inc_unknown_group += 1;
        if !nic
            && let Some(src) = source_ip(ctx)
            && bound_elsewhere(src, ctx.ingress_ifindex() as u32)
        {
            // No group here checks it: the address binding does (host-to-host frames).
            port.spoofed_source += 1;
            return Err(Some(xdp_action::XDP_DROP));
        }
        if !nic && lost::addressed_here(ctx) {
            // A child's partial for a group this switch lost: answer with a notice.
            if let Some(handoff) = HANDOFF.get_ptr_mut(0) {
                // SAFETY: this CPU's scratch.
                unsafe { (*handoff).group = hdr.group() };
                // SAFETY: tail call with this program's own context.
                unsafe { JUMP.tail_call(ctx, JUMP_LOST) };
            }
        }
        return Err(None);
    };
    if (cfg.role == ROLE_NIC) != nic {
        port.inc_unknown_group += 1;
        return Err(None);
    }
    group_count(cfg.index, |g| g.rx += 1);
    Ok((hdr, cfg))
}

#[inline(always)]
fn source_ip(ctx: &XdpContext) -> Option<[u8; 4]> {
    let src = ptr_at::<[u8; 4]>(ctx, IP_SRC_OFFSET)?;
    // SAFETY: bounds checked by ptr_at.
    Some(unsafe { *src })
}

/// The child behind `ingress` that `is` picks out, if any.
#[inline(always)]
fn child_where(cfg: &GroupConfig, ingress: u32, is: impl Fn(&Child) -> bool) -> Option<u32> {
    let mut i = 0;
    while i < MAX_CHILDREN {
        if i < usize::from(cfg.n_children)
            && cfg.children[i].ifindex == ingress
            && is(&cfg.children[i])
        {
            return Some(i as u32);
        }
        i += 1;
    }
    None
}

/// The child `src` behind `ingress`, if any.
#[inline(always)]
fn child_index(cfg: &GroupConfig, src: [u8; 4], ingress: u32) -> Option<u32> {
    child_where(cfg, ingress, |c| c.ip == src)
}

/// Switch role. `None`: not for this switch, pass it on. `Some(verdict)`: handled here (the
/// tail call does not return when it succeeds).
#[inline(always)]
pub fn handle(ctx: &XdpContext, port: &mut PortStats) -> Option<u32> {
    let (hdr, cfg) = match group_of(ctx, port, false) {
        Ok(found) => found,
        Err(verdict) => return verdict,
    };
    let src = source_ip(ctx)?;
    let ingress = ctx.ingress_ifindex() as u32;
    let sender = if cfg.is_root == 0 && ingress == cfg.parent_ifindex {
        if src == cfg.parent_ip {
            if is_lost_notice(ctx) {
                // The parent lost the group: every child, hence every leader, must know.
                group_count(cfg.index, |g| g.lost_down += 1);
                return Some(
                    PORTS
                        .redirect(0, u64::from(BPF_F_BROADCAST | BPF_F_EXCLUDE_INGRESS))
                        .unwrap_or(xdp_action::XDP_DROP),
                );
            }
            Sender::Parent
        } else {
            Sender::Stranger
        }
    } else {
        child_index(cfg, src, ingress).map_or(Sender::Stranger, Sender::Child)
    };
    Some(dispatch(ctx, hdr, cfg, sender, u32::from(cfg.n_children)))
}

/// Whether the packet is a group-lost notice (lost bit set, result bit clear).
#[inline(always)]
pub fn is_lost_notice(ctx: &XdpContext) -> bool {
    ptr_at::<u8>(ctx, lost::BTH_FLAGS).is_some_and(|f| {
        // SAFETY: bounds checked by ptr_at.
        unsafe { *f & (BTH_FLAG_LOST | BTH_FLAG_RESULT) == BTH_FLAG_LOST }
    })
}

/// The child at tree position `rank` behind `ingress`, if any (a DPU knows its children by
/// position: its host's request names no other member's address).
#[inline(always)]
fn child_by_rank(cfg: &GroupConfig, rank: u32, ingress: u32) -> Option<u32> {
    child_where(cfg, ingress, |c| c.rank == rank)
}

/// NIC role, for a frame from the wire (`posted` false) or the host's own contribution
/// posted through `innet_nic_post` (`posted` true). On a DPU, `from_host`: the frame came
/// in on the host's port, so it is the host's own contribution; nothing from any other
/// port can be. `None`: not a group of this NIC.
#[inline(always)]
pub fn handle_nic(
    ctx: &XdpContext,
    port: &mut PortStats,
    posted: bool,
    from_host: bool,
) -> Option<u32> {
    let (hdr, cfg) = match group_of(ctx, port, true) {
        Ok(found) => found,
        Err(verdict) => return verdict,
    };
    let ingress = ctx.ingress_ifindex() as u32;
    let sender = if posted || (from_host && cfg.is_dpu() && ingress == cfg.host_ifindex) {
        group_count(cfg.index, |g| g.posted += 1);
        Sender::Child(LOCAL_CHILD)
    } else if from_host {
        // The host's port carries only its own part of its own groups.
        Sender::Stranger
    } else {
        let src = source_ip(ctx)?;
        if cfg.is_root == 0 && (src == cfg.parent_ip || src == cfg.root_ip) {
            // The root's multicast result, or the parent's answer to a repeated post.
            Sender::Parent
        } else if cfg.is_dpu() {
            child_by_rank(cfg, hdr.src_rank(), ingress).map_or(Sender::Stranger, Sender::Child)
        } else {
            child_index(cfg, src, ingress).map_or(Sender::Stranger, Sender::Child)
        }
    };
    Some(dispatch(
        ctx,
        hdr,
        cfg,
        sender,
        u32::from(cfg.n_children) + 1,
    ))
}

/// Fills this CPU's hand-off and tail-calls the aggregation program; returns only when it
/// cannot (the packet is then dropped and counted).
#[inline(always)]
fn dispatch(
    ctx: &XdpContext,
    hdr: &IncHeader,
    cfg: &GroupConfig,
    sender: Sender,
    expected: u32,
) -> u32 {
    let (child, from_parent) = match sender {
        Sender::Child(c) => (c, false),
        Sender::Parent => (MAX_CHILDREN as u32, true),
        Sender::Stranger => {
            group_count(cfg.index, |g| g.not_member += 1);
            return xdp_action::XDP_DROP;
        }
    };
    let (Some(op), Some(dtype)) = (Op::from_u8(hdr.op_code), Dtype::from_u8(hdr.oper_and_type))
    else {
        return xdp_action::XDP_DROP;
    };
    if !op.defined_on(dtype) {
        // No fold program exists for this op × type (bitwise ops on floats, LOC pairs of
        // halves): counted, dropped before it takes a slot (no switch announces such a
        // pair, so no group sends it).
        group_count(cfg.index, |g| g.unsupported += 1);
        return xdp_action::XDP_DROP;
    }
    let Some(handoff) = HANDOFF.get_ptr_mut(0) else {
        return xdp_action::XDP_ABORTED;
    };
    // SAFETY: this CPU's scratch.
    let handoff = unsafe { &mut *handoff };
    handoff.group = hdr.group();
    handoff.index = cfg.index;
    handoff.is_root = u32::from(cfg.is_root);
    handoff.dst_child = if child < MAX_CHILDREN as u32 {
        u32::from(dst_child(ctx, cfg))
    } else {
        u32::from(NOT_A_CHILD)
    };
    handoff.slot = slot_of(cfg.index, cfg.window_shift, hdr.req_id);
    handoff.child = child;
    handoff.from_parent = u32::from(from_parent);
    handoff.action = 0;
    handoff.exclude_ingress = 0;
    handoff.expected = expected;
    handoff.payload_len = u32::from(hdr.pkt_para_num()) * element_bytes(op, dtype) as u32;
    handoff.op = u32::from(op as u8);
    // SAFETY: tail call with this program's own context.
    unsafe { JUMP.tail_call(ctx, JUMP_AGG) };
    // Returns only when the loader did not fill the table (a broken load): counted.
    group_count(cfg.index, |g| g.unsupported += 1);
    xdp_action::XDP_ABORTED
}

/// Index of the child the packet is addressed to (by destination IPv4), or NOT_A_CHILD.
#[inline(always)]
fn dst_child(ctx: &XdpContext, cfg: &GroupConfig) -> u8 {
    let Some(dst) = ptr_at::<[u8; 4]>(ctx, IP_DST_OFFSET) else {
        return NOT_A_CHILD;
    };
    // SAFETY: bounds checked by ptr_at.
    let dst = unsafe { *dst };
    let mut i = 0;
    while i < MAX_CHILDREN {
        if i < usize::from(cfg.n_children) && cfg.children[i].ip == dst {
            return i as u8;
        }
        i += 1;
    }
    NOT_A_CHILD
}
