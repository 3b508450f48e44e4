//! Emitting results: the payload comes from the slot, the headers from the saved templates
//! (to a child) or from the group config (to the parent), then the ICRC is recomputed.

use aya_ebpf::{
    bindings::{BPF_F_BROADCAST, BPF_F_EXCLUDE_INGRESS, xdp_action},
    helpers::{bpf_redirect, bpf_xdp_load_bytes, bpf_xdp_store_bytes},
    programs::XdpContext,
};
use innet_common::{
    group::{
        ACT_BROADCAST, ACT_COMPLETE, ACT_REPLY, ACT_UP, GroupConfig, Handoff, MAX_CHILDREN,
        ROLE_NIC, Slot, TEMPLATE_LEN, completion_stamp, slot_of,
    },
    proto::{BTH_FLAG_LOST, BTH_FLAG_RESULT, MAX_PAYLOAD_BYTES, ROCEV2_UDP_PORT},
    wire::{ETH_LEN, IPV4_LEN, IncHeader, PAYLOAD_OFFSET, UDP_LEN},
};

use crate::{
    crc::write_icrc,
    fanout, finish,
    maps::{
        GROUPS, HANDOFF, NIC_COMPLETIONS, PORTS, SLOTS, any_tx_blocked, count_if_tx_blocked,
        group_count,
    },
    parse::{frame_len, helper_len, ptr_at},
    template::{child_header, mark_delivery},
};

const IP: usize = ETH_LEN;
const UDP: usize = ETH_LEN + IPV4_LEN;
const INC_OFFSET: usize = PAYLOAD_OFFSET - core::mem::size_of::<IncHeader>();

/// The emit program body (tail call target `JUMP_EMIT`).
#[inline(always)]
pub fn run(ctx: &XdpContext) -> u32 {
    let Some(handoff) = HANDOFF.get_ptr(0) else {
        return finish(ctx, xdp_action::XDP_ABORTED);
    };
    // SAFETY: this CPU's hand-off for this packet.
    let handoff = unsafe { *handoff };
    let Some(slot) = SLOTS.get_ptr(handoff.slot) else {
        return finish(ctx, xdp_action::XDP_ABORTED);
    };
    // SAFETY: userspace-written config; read only.
    let Some(cfg) = (unsafe { GROUPS.get(handoff.group) }) else {
        return finish(ctx, xdp_action::XDP_DROP);
    };
    // SAFETY: the slot's result is stable once complete (until the slot is reused).
    let slot = unsafe { &*slot };
    if handoff.from_parent == 0 && !copy_payload_out(ctx, slot, handoff.payload_len as usize) {
        return finish(ctx, xdp_action::XDP_DROP);
    }
    let action = match handoff.action {
        ACT_BROADCAST | ACT_COMPLETE if cfg.role == ROLE_NIC && cfg.is_dpu() => {
            dpu_result(ctx, cfg, &handoff)
        }
        ACT_BROADCAST | ACT_COMPLETE if cfg.role == ROLE_NIC => nic_result(ctx, cfg, &handoff),
        ACT_UP => {
            if !address_to(ctx, cfg, cfg.parent_mac, cfg.parent_ip)
                || !write_icrc(ctx, frame_len(ctx))
            {
                return finish(ctx, xdp_action::XDP_DROP);
            }
            group_count(cfg.index, |g| g.sent_up += 1);
            redirect_to(cfg.parent_ifindex)
        }
        ACT_REPLY => {
            if !apply_template(ctx, slot, handoff.child as usize)
                || !write_icrc(ctx, frame_len(ctx))
            {
                return finish(ctx, xdp_action::XDP_DROP);
            }
            group_count(cfg.index, |g| g.replies += 1);
            reply_out(ctx, cfg)
        }
        // A result spanning several buffers: a devmap broadcast refuses it, tc sends the
        // copies (`fanout`).
        ACT_BROADCAST if frame_len(ctx) > ctx.data_end() - ctx.data() => {
            let verdict =
                fanout::hand_to_tc(ctx, handoff.exclude_ingress != 0, handoff.from_parent != 0);
            if verdict == xdp_action::XDP_DROP {
                group_count(cfg.index, |g| g.fanout_errors += u64::from(cfg.n_children));
            }
            verdict
        }
        ACT_BROADCAST => {
            let exclude = if handoff.exclude_ingress != 0 {
                BPF_F_EXCLUDE_INGRESS
            } else {
                0
            };
            if any_tx_blocked() {
                count_lost_copies(cfg, exclude != 0, ctx.ingress_ifindex() as u32);
            }
            PORTS
                .redirect(0, u64::from(BPF_F_BROADCAST | exclude))
                .unwrap_or(xdp_action::XDP_DROP)
        }
        _ => xdp_action::XDP_DROP,
    };
    finish(ctx, action)
}

/// Sends a reply back out of the ingress port. A NIC redirects: a veth wakes its peer for
/// `XDP_TX` frames only when the peer runs XDP itself, and a NIC's peer is a plain bridge
/// port. A switch keeps `XDP_TX`: a redirect to a host port would share the kernel's
/// per-device batch with the devmap's broadcast copies, whose egress program the batch
/// applies to all its frames.
#[inline(always)]
fn reply_out(ctx: &XdpContext, cfg: &GroupConfig) -> u32 {
    let ingress = ctx.ingress_ifindex() as u32;
    if cfg.role == ROLE_NIC {
        return redirect_to(ingress);
    }
    count_sent_out(ingress);
    xdp_action::XDP_TX
}

/// Redirects the frame out of `ifindex`, counting it there when the kernel will drop it.
#[inline(always)]
fn redirect_to(ifindex: u32) -> u32 {
    count_sent_out(ifindex);
    // SAFETY: plain helper call.
    unsafe { bpf_redirect(ifindex, 0) as u32 }
}

/// Counts one frame sent out of `ifindex` on its `redirect_errors` when the kernel will
/// drop it there.
#[inline(always)]
fn count_sent_out(ifindex: u32) {
    if any_tx_blocked() {
        count_if_tx_blocked(ifindex);
    }
}

/// Counts, on each child's port that cannot transmit redirected frames, the broadcast copy
/// the kernel skips there (a devmap broadcast leaves such ports out without a trace).
#[inline(always)]
fn count_lost_copies(cfg: &GroupConfig, exclude_ingress: bool, ingress: u32) {
    let mut i = 0;
    while i < MAX_CHILDREN {
        if i < usize::from(cfg.n_children) {
            let port = cfg.children[i].ifindex;
            if !(exclude_ingress && port == ingress) {
                count_if_tx_blocked(port);
            }
        }
        i += 1;
    }
}

/// The devmap egress program body: rewrites one broadcast copy for the child behind the
/// port it leaves on, or drops it when no child of the group sits there.
#[inline(always)]
pub fn egress(ctx: &XdpContext) -> u32 {
    // SAFETY: ctx.ctx is the kernel's xdp_md for this program run.
    let egress_ifindex = unsafe { (*ctx.ctx).egress_ifindex };
    let Some(hdr) = ptr_at::<IncHeader>(ctx, INC_OFFSET) else {
        return xdp_action::XDP_DROP;
    };
    // SAFETY: bounds checked by ptr_at.
    let hdr = unsafe { &*hdr };
    // SAFETY: userspace-written config; read only.
    let Some(cfg) = (unsafe { GROUPS.get(hdr.group()) }) else {
        return xdp_action::XDP_DROP;
    };
    if cfg.is_dpu() {
        return dpu_copy(ctx, cfg, egress_ifindex);
    }
    let mut child = MAX_CHILDREN;
    let mut i = 0;
    while i < MAX_CHILDREN {
        if i < usize::from(cfg.n_children) && cfg.children[i].ifindex == egress_ifindex {
            child = i;
            break;
        }
        i += 1;
    }
    if child == MAX_CHILDREN {
        return xdp_action::XDP_DROP;
    }
    let Some(slot) = SLOTS.get_ptr(slot_of(cfg.index, cfg.window_shift, hdr.req_id)) else {
        return xdp_action::XDP_DROP;
    };
    // A group-lost notice from the parent goes to each child too, addressed as a result
    // would be, but marked as a notice (never as a result). Branch-free: a branch here
    // would double the verifier's walk of the ICRC loop below.
    let Some(flags) = ptr_at::<u8>(ctx, crate::lost::BTH_FLAGS) else {
        return xdp_action::XDP_DROP;
    };
    // SAFETY: bounds checked by ptr_at.
    let before = unsafe { *flags };
    let notice = (before >> 6) & !(before >> 7) & 1;
    // SAFETY: read only; the round's templates are stable once it completed.
    if !apply_template(ctx, unsafe { &*slot }, child) {
        return xdp_action::XDP_DROP;
    }
    let Some(flags) = ptr_at::<u8>(ctx, crate::lost::BTH_FLAGS) else {
        return xdp_action::XDP_DROP;
    };
    // SAFETY: bounds checked by ptr_at.
    unsafe {
        *flags.cast_mut() = (*flags & !(notice * BTH_FLAG_RESULT)) | (notice * BTH_FLAG_LOST);
    }
    if !write_icrc(ctx, frame_len(ctx)) {
        return xdp_action::XDP_DROP;
    }
    let notice = u64::from(notice);
    group_count(cfg.index, |g| {
        g.lost_sent_down += notice;
        g.sent_down += 1 - notice;
    });
    xdp_action::XDP_PASS
}

/// Copies the slot's result over the packet's payload.
#[inline(always)]
fn copy_payload_out(ctx: &XdpContext, slot: &Slot, len: usize) -> bool {
    let Some(len) = helper_len(len, MAX_PAYLOAD_BYTES) else {
        return false;
    };
    let src = slot.data.as_ptr().cast_mut();
    // SAFETY: src holds MAX_PAYLOAD_BYTES >= len bytes; the helper checks the packet side.
    unsafe { bpf_xdp_store_bytes(ctx.ctx, PAYLOAD_OFFSET as u32, src.cast(), len) == 0 }
}

/// Writes the header that delivers the result to child `j` over the packet's.
#[inline(always)]
fn apply_template(ctx: &XdpContext, slot: &Slot, j: usize) -> bool {
    let Some(dst) = ptr_at::<[u8; TEMPLATE_LEN]>(ctx, 0) else {
        return false;
    };
    // SAFETY: bounds checked by ptr_at.
    child_header(slot, j, unsafe { &mut *dst.cast_mut() })
}

/// [`mark_delivery`] on the packet itself.
#[inline(always)]
fn mark_packet_delivery(ctx: &XdpContext) {
    if let Some(f) = ptr_at::<[u8; TEMPLATE_LEN]>(ctx, 0) {
        // SAFETY: bounds checked by ptr_at.
        mark_delivery(unsafe { &mut *f.cast_mut() });
    }
}

/// NIC role: a round is complete here (the packet carries its result). Every member hands
/// the result to its host; the root also sends it, once, to the group's multicast address,
/// where the fabric copies it to every member.
#[inline(always)]
fn nic_result(ctx: &XdpContext, cfg: &GroupConfig, handoff: &Handoff) -> u32 {
    let Some(hdr) = ptr_at::<IncHeader>(ctx, INC_OFFSET) else {
        return xdp_action::XDP_DROP;
    };
    // SAFETY: bounds checked by ptr_at.
    let round = unsafe { (*hdr).req_id };
    if !write_completion(ctx, handoff, completion_stamp(handoff.group, round)) {
        return xdp_action::XDP_DROP;
    }
    group_count(cfg.index, |g| g.completions += 1);
    if cfg.is_root == 0 || handoff.from_parent != 0 || handoff.action == ACT_COMPLETE {
        return xdp_action::XDP_DROP;
    }
    if !address_to(ctx, cfg, cfg.result_mac, cfg.result_ip) {
        return xdp_action::XDP_DROP;
    }
    mark_packet_delivery(ctx);
    if !write_icrc(ctx, frame_len(ctx)) {
        return xdp_action::XDP_DROP;
    }
    group_count(cfg.index, |g| g.sent_down += 1);
    // The NIC's own port (XDP_TX works for posted frames too).
    redirect_to(cfg.parent_ifindex)
}

/// DPU: a round is complete here. The host gets the result as an ordinary RoCEv2 frame on
/// its port; the root also sends it to the group's multicast address, so its copy goes to
/// both ports through the devmap (`dpu_copy` addresses each).
#[inline(always)]
fn dpu_result(ctx: &XdpContext, cfg: &GroupConfig, handoff: &Handoff) -> u32 {
    group_count(cfg.index, |g| g.completions += 1);
    if cfg.is_root != 0 && handoff.from_parent == 0 && handoff.action != ACT_COMPLETE {
        count_sent_out(cfg.host_ifindex);
        count_sent_out(cfg.parent_ifindex);
        return PORTS
            .redirect(0, u64::from(BPF_F_BROADCAST))
            .unwrap_or(xdp_action::XDP_DROP);
    }
    if !to_host(ctx, cfg) {
        return xdp_action::XDP_DROP;
    }
    redirect_to(cfg.host_ifindex)
}

/// DPU root: one copy of a result per port, addressed to the host on its port and to the
/// group's multicast address on the uplink.
#[inline(always)]
fn dpu_copy(ctx: &XdpContext, cfg: &GroupConfig, egress_ifindex: u32) -> u32 {
    let ok = if egress_ifindex == cfg.host_ifindex {
        to_host(ctx, cfg)
    } else if egress_ifindex == cfg.parent_ifindex {
        address_to(ctx, cfg, cfg.result_mac, cfg.result_ip) && {
            mark_packet_delivery(ctx);
            write_icrc(ctx, frame_len(ctx))
        }
    } else {
        false
    };
    if !ok {
        return xdp_action::XDP_DROP;
    }
    group_count(cfg.index, |g| g.sent_down += 1);
    xdp_action::XDP_PASS
}

/// Readdresses a result to the DPU's host, from the DPU (a frame from the host's own address
/// would be a martian to its stack), SE bit set and ICRC valid.
#[inline(always)]
fn to_host(ctx: &XdpContext, cfg: &GroupConfig) -> bool {
    if !readdress(
        ctx,
        (cfg.dpu_mac, cfg.dpu_ip),
        (cfg.host_mac, cfg.host_ip),
        cfg.own_rank,
    ) {
        return false;
    }
    mark_packet_delivery(ctx);
    write_icrc(ctx, frame_len(ctx))
}

/// Copies the packet's payload (the round's result) into the host's completion entry, then
/// stamps it. The stamp is a plain store after the data: on x86 (TSO) the host, which reads
/// the stamp first, never sees it before the data.
#[inline(always)]
fn write_completion(ctx: &XdpContext, handoff: &Handoff, stamp: u32) -> bool {
    let Some(entry) = NIC_COMPLETIONS.get_ptr_mut(handoff.slot) else {
        return false;
    };
    let Some(len) = helper_len(handoff.payload_len as usize, MAX_PAYLOAD_BYTES) else {
        return false;
    };
    // SAFETY: the entry holds MAX_PAYLOAD_BYTES >= len bytes; the helper checks the packet.
    unsafe {
        if bpf_xdp_load_bytes(
            ctx.ctx,
            PAYLOAD_OFFSET as u32,
            (&raw mut (*entry).data).cast(),
            len,
        ) != 0
        {
            return false;
        }
        core::ptr::write_volatile(&raw mut (*entry).len, len);
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::Release);
        core::ptr::write_volatile(&raw mut (*entry).stamp, stamp);
    }
    true
}

/// Readdresses the packet from this switch (or NIC) to `mac`/`ip`.
#[inline(always)]
fn address_to(ctx: &XdpContext, cfg: &GroupConfig, mac: [u8; 6], ip: [u8; 4]) -> bool {
    readdress(ctx, (cfg.own_mac, cfg.own_ip), (mac, ip), cfg.own_rank)
}

/// Rewrites the packet's addresses and `src_rank`, and fixes the IPv4 checksum.
#[inline(always)]
fn readdress(
    ctx: &XdpContext,
    (src_mac, src_ip): ([u8; 6], [u8; 4]),
    (mac, ip): ([u8; 6], [u8; 4]),
    rank: u32,
) -> bool {
    let Some(f) = ptr_at::<[u8; TEMPLATE_LEN]>(ctx, 0) else {
        return false;
    };
    // SAFETY: bounds checked by ptr_at.
    let f = unsafe { &mut *f.cast_mut() };
    f[0..6].copy_from_slice(&mac);
    f[6..12].copy_from_slice(&src_mac);
    f[IP + 12..IP + 16].copy_from_slice(&src_ip);
    f[IP + 16..IP + 20].copy_from_slice(&ip);
    f[INC_OFFSET + 4..INC_OFFSET + 8].copy_from_slice(&rank.to_be_bytes());
    f[IP + 10] = 0;
    f[IP + 11] = 0;
    let mut sum = 0u32;
    let mut i = 0;
    while i < IPV4_LEN {
        sum += u32::from(u16::from_be_bytes([f[IP + i], f[IP + i + 1]]));
        i += 2;
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    let csum = !(sum as u16);
    f[IP + 10..IP + 12].copy_from_slice(&csum.to_be_bytes());
    f[UDP + 6] = 0;
    f[UDP + 7] = 0;
    true
}
