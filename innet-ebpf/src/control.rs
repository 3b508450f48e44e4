//! Handing control frames to the daemon through the `CONTROL_EVENTS` ring buffer.

use aya_ebpf::{
    bindings::{BPF_RB_NO_WAKEUP, xdp_action},
    helpers::{bpf_ktime_get_ns, bpf_xdp_get_buff_len, bpf_xdp_load_bytes},
    programs::XdpContext,
};
use innet_common::{
    control::{CONTROL_FRAME_MAX, ControlEvent},
    proto::MASTER_DPU_SETUP,
    stats::PortStats,
    wire::{ETH_LEN, PAYLOAD_OFFSET},
};

use crate::{
    maps::{CONTROL_EVENTS, CONTROL_OVERFLOW, SWITCH_CONFIG, draw_control_frame},
    parse::{helper_len, ptr_at},
};

/// Offset of `master_num` in the control payload (after `sup_mpi_type` and `fail_cause`).
const MASTER_NUM: usize = 3;

/// Whether a control frame is a host's request to its DPU ([`MASTER_DPU_SETUP`]). Frames
/// with IPv4 options are not: the library never sends them.
#[inline(always)]
pub fn is_dpu_setup(ctx: &XdpContext) -> bool {
    let (Some(vihl), Some(master)) = (
        ptr_at::<u8>(ctx, ETH_LEN),
        ptr_at::<u8>(ctx, PAYLOAD_OFFSET + MASTER_NUM),
    ) else {
        return false;
    };
    // SAFETY: bounds checked by ptr_at.
    unsafe { *vihl == 0x45 && *master == MASTER_DPU_SETUP }
}

/// `None` when no daemon runs (the frame passes on); otherwise the verdict: the frame is
/// queued for the daemon (or the queue is full) and dropped here either way.
#[inline(always)]
pub fn hand_up(ctx: &XdpContext, port: &mut PortStats) -> Option<u32> {
    let cfg = SWITCH_CONFIG.get(0)?;
    if cfg.control_to_daemon == 0 {
        return None;
    }
    // A helper gives the length as a scalar; `data_end - data` here gets folded by LLVM
    // into pointer arithmetic the verifier refuses.
    // SAFETY: plain helper call on this program's context.
    let len = unsafe { bpf_xdp_get_buff_len(ctx.ctx) } as usize;
    let Some(n) = helper_len(len, CONTROL_FRAME_MAX) else {
        port.control_dropped += 1;
        return Some(xdp_action::XDP_DROP);
    };
    // A port past its share queues behind every port within theirs.
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    // Frames past the share wake nobody: the daemon polls for them (`ring::OVERFLOW_POLL`),
    // so a flood costs it no wake-up per frame.
    let within_share = draw_control_frame(ctx.ingress_ifindex() as u32, now);
    let (reserved, wake) = if within_share {
        (CONTROL_EVENTS.reserve_untyped::<ControlEvent>(0), 0)
    } else {
        port.control_over_share += 1;
        (
            CONTROL_OVERFLOW.reserve_untyped::<ControlEvent>(0),
            u64::from(BPF_RB_NO_WAKEUP),
        )
    };
    let Some(mut entry) = reserved else {
        port.control_dropped += 1;
        return Some(xdp_action::XDP_DROP);
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: ev points at reserved ring-buffer memory of size_of::<ControlEvent>().
    let ok = unsafe {
        (*ev).ifindex = ctx.ingress_ifindex() as u32;
        (*ev).len = n;
        bpf_xdp_load_bytes(ctx.ctx, 0, (&raw mut (*ev).frame).cast(), n) == 0
    };
    if ok {
        entry.submit(wake);
        port.control_up += 1;
    } else {
        entry.discard(0);
        port.control_dropped += 1;
    }
    Some(xdp_action::XDP_DROP)
}
