//! Fanning out a multi-buffer result (`innet_fanout`, tc ingress of every switch port).
//!
//! A devmap broadcast refuses a frame that spans several XDP buffers (EOPNOTSUPP): a slot
//! of 8 KiB on a jumbo link is such a frame. So the emit program marks the frame (its
//! destination MAC: `HANDOFF_MAC_PREFIX` and flags) and passes it to the stack, where this
//! program, on the same port, sends one clone per child (`bpf_clone_redirect`), each
//! readdressed like the devmap's egress program readdresses a broadcast copy. The ICRC covers headers and
//! payload: the payload's CRC is computed once and combined with each copy's headers. A
//! result that came down from the parent needs no pass over its payload at all: the CRC is
//! linear, so the payload's part follows from the ICRC the frame came with and its own
//! headers (and a payload damaged on the way keeps an ICRC that says so).

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{__sk_buff, TC_ACT_OK, TC_ACT_SHOT, xdp_action},
    helpers::{bpf_clone_redirect, bpf_loop, bpf_skb_load_bytes, bpf_skb_store_bytes},
    programs::{TcContext, XdpContext},
};
use innet_common::{
    group::{
        GroupConfig, MAX_CHILDREN, Slot, TEMPLATE_LEN, crc32_mul, crc32_shift_lookup, slot_of,
    },
    proto::{BTH_FLAG_LOST, BTH_FLAG_RESULT, MAX_PAYLOAD_BYTES},
    wire::{
        HANDOFF_EXCLUDE_INGRESS, HANDOFF_FROM_PARENT, HANDOFF_HEADERS_LEN, HANDOFF_MAC_PREFIX,
        IncHeader, PAYLOAD_OFFSET, handoff_flags,
    },
};

use crate::{
    crc::{copy_icrc, header_state, tail_state},
    lost::BTH_FLAGS,
    maps::{GROUPS, SCRATCH, SLOTS, group_count},
    parse::{frame_len, helper_len, ptr_at},
    template::child_header,
};

const INC_OFFSET: usize = PAYLOAD_OFFSET - core::mem::size_of::<IncHeader>();

/// Emit side: marks the frame for the tc fan-out (its destination MAC: the hand-off
/// prefix and the flags) and passes it up the stack; the verdict.
#[inline(always)]
pub fn hand_to_tc(ctx: &XdpContext, exclude_ingress: bool, from_parent: bool) -> u32 {
    let Some(dst) = ptr_at::<[u8; 6]>(ctx, 0) else {
        return xdp_action::XDP_DROP;
    };
    let p = &HANDOFF_MAC_PREFIX;
    let flags = (u8::from(exclude_ingress) * HANDOFF_EXCLUDE_INGRESS)
        | (u8::from(from_parent) * HANDOFF_FROM_PARENT);
    // SAFETY: bounds checked by ptr_at; the frame is ours to rewrite (its headers are
    // rewritten per copy by the tc program, and the ICRC leaves Ethernet out).
    unsafe { *dst.cast_mut() = [p[0], p[1], p[2], p[3], p[4], flags] };
    xdp_action::XDP_PASS
}

/// The hand-off flags of a frame the emit program marked, `None` for any other frame
/// ([`handoff_flags`]: the classifier drops such frames from the wire, and every frame
/// reaches the port's XDP program before this one).
#[inline(always)]
fn marked(ctx: &TcContext) -> Option<u8> {
    let mut h = [0u8; HANDOFF_HEADERS_LEN];
    // SAFETY: the buffer is ours and sized as passed; the helper checks the skb side.
    let rc = unsafe {
        bpf_skb_load_bytes(
            ctx.skb.skb.cast(),
            0,
            h.as_mut_ptr().cast(),
            HANDOFF_HEADERS_LEN as u32,
        )
    };
    if rc != 0 {
        return None;
    }
    handoff_flags(&h, frame_len(ctx))
}

/// The tc program body: frames without a mark pass untouched; a marked result goes to each
/// child as a clone, and the original ends here.
#[inline(always)]
pub fn run(ctx: &TcContext) -> i32 {
    // A marked frame's headers are in the linear part: pull them there before reading.
    // Unmarked frames pass untouched whether the pull worked or not.
    let _ = ctx.pull_data(TEMPLATE_LEN as u32);
    let Some(flags) = marked(ctx) else {
        return TC_ACT_OK;
    };
    // SAFETY: a read of the context the kernel passed in.
    let ingress = unsafe { (*ctx.skb.skb).ingress_ifindex };
    let exclude_ingress = flags & HANDOFF_EXCLUDE_INGRESS != 0;
    let from_parent = flags & HANDOFF_FROM_PARENT != 0;
    let Some(hdr) = ptr_at::<IncHeader>(ctx, INC_OFFSET) else {
        return TC_ACT_SHOT;
    };
    // SAFETY: bounds checked by ptr_at.
    let hdr = unsafe { &*hdr };
    // SAFETY: userspace-written config; read only.
    let Some(cfg) = (unsafe { GROUPS.get(hdr.group()) }) else {
        return TC_ACT_SHOT;
    };
    let (Some(slot), Some(flags)) = (
        SLOTS.get_ptr(slot_of(cfg.index, cfg.window_shift, hdr.req_id)),
        ptr_at::<u8>(ctx, BTH_FLAGS),
    ) else {
        group_count(cfg.index, |g| g.fanout_errors += u64::from(cfg.n_children));
        return TC_ACT_SHOT;
    };
    // A group-lost notice goes down marked as one, never as a result (as in `egress`).
    // SAFETY: bounds checked by ptr_at.
    let before = unsafe { *flags };
    let notice = (before >> 6) & !(before >> 7) & 1;
    let crc = if from_parent {
        forwarded_crc(ctx)
    } else {
        payload_crc(ctx)
    };
    let Some((tail, shift, icrc_off)) = crc else {
        group_count(cfg.index, |g| g.fanout_errors += u64::from(cfg.n_children));
        return TC_ACT_SHOT;
    };
    // SAFETY: read only; the round's templates are stable once it completed.
    let slot = unsafe { &*slot };
    send_copies(
        ctx,
        cfg,
        slot,
        (tail, shift, icrc_off),
        notice,
        exclude_ingress.then_some(ingress),
    );
    TC_ACT_SHOT
}

/// The payload's CRC state, run from zero, the shift that combines it with a header, and
/// the ICRC's offset.
#[inline(always)]
fn payload_crc(ctx: &TcContext) -> Option<(u32, u32, u32)> {
    let len = frame_len(ctx);
    let icrc_off = len.checked_sub(4)?;
    let n = icrc_off.checked_sub(PAYLOAD_OFFSET)?;
    let scratch = SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's scratch buffer.
    let buf = unsafe { &mut (*scratch).bytes };
    // Padding (up to 3 bytes) may follow the payload.
    let loaded = helper_len(n, MAX_PAYLOAD_BYTES + 4)?;
    // SAFETY: buf holds MAX_FRAME >= loaded bytes; the helper checks the skb side.
    let rc = unsafe {
        bpf_skb_load_bytes(
            ctx.skb.skb.cast(),
            PAYLOAD_OFFSET as u32,
            buf.as_mut_ptr().cast(),
            loaded,
        )
    };
    if rc != 0 {
        return None;
    }
    Some((
        tail_state(buf, loaded as usize)?,
        crc32_shift_lookup(loaded)?,
        icrc_off as u32,
    ))
}

/// [`payload_crc`]'s values for the parent's result as it arrived, without a pass over the
/// payload: its ICRC is `!(headers' state · x^8n ⊕ payload's state)`, solved for the
/// payload's state.
#[inline(always)]
fn forwarded_crc(ctx: &TcContext) -> Option<(u32, u32, u32)> {
    let icrc_off = frame_len(ctx).checked_sub(4)?;
    let n = helper_len(icrc_off.checked_sub(PAYLOAD_OFFSET)?, MAX_PAYLOAD_BYTES + 4)?;
    let (mut header, mut icrc) = ([0u8; TEMPLATE_LEN], [0u8; 4]);
    let skb = ctx.skb.skb.cast();
    // SAFETY: the buffers are ours and sized as passed; the helper checks the skb side.
    let loaded = unsafe {
        bpf_skb_load_bytes(skb, 0, header.as_mut_ptr().cast(), TEMPLATE_LEN as u32) == 0
            && bpf_skb_load_bytes(skb, icrc_off as u32, icrc.as_mut_ptr().cast(), 4) == 0
    };
    if !loaded {
        return None;
    }
    let shift = crc32_shift_lookup(n)?;
    let tail = !u32::from_le_bytes(icrc) ^ crc32_mul(shift, header_state(&header));
    Some((tail, shift, icrc_off as u32))
}

/// Sends one readdressed clone of the frame to each child but `skip`'s port, counting each
/// as it goes. One `bpf_loop` callback per child: the verifier walks it once, where an
/// unrolled loop was walked per child (a header CRC and a multiplication each: 650 k of the
/// kernel's 1 M instruction limit).
#[inline(always)]
fn send_copies(
    ctx: &TcContext,
    cfg: &GroupConfig,
    slot: &Slot,
    (tail, shift, icrc_off): (u32, u32, u32),
    notice: u8,
    skip: Option<u32>,
) {
    let mut fanout = Fanout {
        skb: ctx.skb.skb,
        cfg,
        slot,
        crc: (tail, shift, icrc_off),
        notice: u32::from(notice),
        // No port has ifindex 0.
        skip: skip.unwrap_or(0),
    };
    let children = u32::from(cfg.n_children).min(MAX_CHILDREN as u32);
    let callback = send_child as extern "C" fn(u64, *mut c_void) -> i64;
    // SAFETY: the callback's context is `fanout`, alive for the call.
    unsafe {
        bpf_loop(
            children,
            callback as *mut c_void,
            (&raw mut fanout).cast(),
            0,
        )
    };
}

/// What every copy of one fan-out shares ([`send_child`]'s `bpf_loop` context).
#[repr(C)]
struct Fanout {
    skb: *mut __sk_buff,
    cfg: *const GroupConfig,
    slot: *const Slot,
    crc: (u32, u32, u32),
    notice: u32,
    skip: u32,
}

/// Child `i`'s copy of a [`Fanout`], counted on the group.
extern "C" fn send_child(i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `send_copies` passes its Fanout, alive for the loop.
    let f = unsafe { &*ctx.cast::<Fanout>() };
    let i = i as usize;
    if i >= MAX_CHILDREN {
        return 1;
    }
    // SAFETY: map values `send_copies` was given, read only.
    let (cfg, slot) = unsafe { (&*f.cfg, &*f.slot) };
    let port = cfg.children[i].ifindex;
    if port == f.skip {
        return 0;
    }
    let notice = f.notice as u8 & 1;
    let mut header = [0u8; TEMPLATE_LEN];
    let sent = u64::from(send_copy(f.skb, slot, i, &mut header, f.crc, notice, port));
    let notice_count = u64::from(notice);
    group_count(cfg.index, |g| {
        g.lost_sent_down += sent * notice_count;
        g.sent_down += sent * (1 - notice_count);
        g.fanout_errors += 1 - sent;
    });
    0
}

/// Readdresses the frame to child `j` (its header, the result or notice flag, the ICRC)
/// and sends a clone of it out of `port`.
#[inline(always)]
fn send_copy(
    skb: *mut __sk_buff,
    slot: &Slot,
    j: usize,
    header: &mut [u8; TEMPLATE_LEN],
    (tail, shift, icrc_off): (u32, u32, u32),
    notice: u8,
    port: u32,
) -> bool {
    if !child_header(slot, j, header) {
        return false;
    }
    let f = &mut header[BTH_FLAGS];
    *f = (*f & !(notice * BTH_FLAG_RESULT)) | (notice * BTH_FLAG_LOST);
    let icrc = copy_icrc(header, shift, tail).to_le_bytes();
    let skb = skb.cast();
    // SAFETY: the helpers check the skb side; the buffers are ours and sized as passed.
    unsafe {
        bpf_skb_store_bytes(skb, 0, header.as_ptr().cast(), TEMPLATE_LEN as u32, 0) == 0
            && bpf_skb_store_bytes(skb, icrc_off, icrc.as_ptr().cast(), 4, 0) == 0
            && bpf_clone_redirect(skb, port, 0) == 0
    }
}
