//! Group-lost notices (issue 32). A switch that meets INC data addressed to its own
//! address for a group it does not hold (restarted, collected idle, evicted, deleted) turns
//! the packet around to its sender at once, marked with `BTH_FLAG_LOST` and the result bit
//! clear, instead of letting its kernel drop it: the child then passes it down to its own
//! children (`dataplane`, `emit::egress`), and every leader takes it, like any contribution
//! of its group that comes back unaggregated, for "the group is gone" and sets it up again.
//! Data of a group the daemon saw being set up lately (`SETTING_UP`) is dropped instead: its
//! install here may simply not have happened yet.

use aya_ebpf::{bindings::xdp_action, helpers::bpf_ktime_get_ns, programs::XdpContext};
use innet_common::{
    control::SETTING_UP_NS,
    group::TEMPLATE_LEN,
    proto::{BTH_FLAG_LOST, BTH_FLAG_RESULT, ROCEV2_UDP_PORT},
    wire::{ETH_LEN, IPV4_LEN, UDP_LEN},
};

use crate::{
    crc::write_icrc,
    finish,
    maps::{HANDOFF, SETTING_UP, SWITCH_CONFIG, draw_lost_notice, port_stats},
    parse::{frame_len, ptr_at},
};

const IP: usize = ETH_LEN;
const UDP: usize = ETH_LEN + IPV4_LEN;
/// The BTH flags byte (SE, MigReq, pad count, version).
pub const BTH_FLAGS: usize = UDP + UDP_LEN + 1;

/// Whether a data packet of a group this switch does not hold is addressed to the switch
/// itself (a child's partial result), and is no result nor notice (those are never
/// answered: no notice ever answers a notice).
#[inline(always)]
pub fn addressed_here(ctx: &XdpContext) -> bool {
    let Some(cfg) = SWITCH_CONFIG.get(0) else {
        return false;
    };
    if cfg.own_ip == [0; 4] {
        return false;
    }
    let (Some(dst), Some(flags)) = (
        ptr_at::<[u8; 4]>(ctx, IP + 16),
        ptr_at::<u8>(ctx, BTH_FLAGS),
    ) else {
        return false;
    };
    // SAFETY: bounds checked by ptr_at.
    unsafe { *dst == cfg.own_ip && *flags & (BTH_FLAG_RESULT | BTH_FLAG_LOST) == 0 }
}

/// The program body (tail call `JUMP_LOST`; `HANDOFF.group` names the group).
#[inline(always)]
pub fn run(ctx: &XdpContext) -> u32 {
    let Some(handoff) = HANDOFF.get_ptr(0) else {
        return finish(ctx, xdp_action::XDP_ABORTED);
    };
    // SAFETY: this CPU's hand-off for this packet.
    let group = unsafe { (*handoff).group };
    let Some(stats) = port_stats(ctx.ingress_ifindex() as u32) else {
        return finish(ctx, xdp_action::XDP_DROP);
    };
    // SAFETY: this CPU's counters.
    let stats = unsafe { &mut *stats };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: read only; a stale value only shifts the window by a race's length.
    if let Some(since) = unsafe { SETTING_UP.get(group) } {
        if now.wrapping_sub(*since) < SETTING_UP_NS {
            stats.lost_setting_up += 1;
            return finish(ctx, xdp_action::XDP_DROP);
        }
    }
    if !draw_lost_notice(ctx.ingress_ifindex() as u32, now) {
        stats.lost_notices_limited += 1;
        return finish(ctx, xdp_action::XDP_DROP);
    }
    let Some(f) = ptr_at::<[u8; TEMPLATE_LEN]>(ctx, 0) else {
        return finish(ctx, xdp_action::XDP_DROP);
    };
    // SAFETY: bounds checked by ptr_at.
    let f = unsafe { &mut *f.cast_mut() };
    // Back to the sender: addresses swapped (the IPv4 checksum does not change), to its
    // RoCEv2 port, the result bit clear and the lost bit set.
    let mut i = 0;
    while i < 6 {
        f.swap(i, 6 + i);
        i += 1;
    }
    i = 0;
    while i < 4 {
        f.swap(IP + 12 + i, IP + 16 + i);
        i += 1;
    }
    let port = ROCEV2_UDP_PORT.to_be_bytes();
    (f[UDP], f[UDP + 1], f[UDP + 2], f[UDP + 3]) = (port[0], port[1], port[0], port[1]);
    (f[UDP + 6], f[UDP + 7]) = (0, 0);
    f[BTH_FLAGS] = (f[BTH_FLAGS] & !BTH_FLAG_RESULT) | BTH_FLAG_LOST;
    if !write_icrc(ctx, frame_len(ctx)) {
        return finish(ctx, xdp_action::XDP_DROP);
    }
    stats.lost_notices += 1;
    finish(ctx, xdp_action::XDP_TX)
}
